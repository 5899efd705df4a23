//! `autopar profile`: measures a backend on this host and writes the rates
//! as a calibration file (`autopar-calibration/1`) for the cost models.

use crate::output;
use anyhow::Result;
use autopar_cost_models::Calibration;
use autopar_ir::DType;
use autopar_runtime::cpu::profile::{profile, ProfileOptions};
use std::path::Path;

/// A backend that can be profiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// This host's CPU through the reference interpreter's kernels.
    Cpu,
    /// GPU 0 through cuBLAS and the CUDA backend's kernels.
    Cuda,
}

/// Profiles `backend` and writes the calibration to `out` as pretty JSON.
/// A missing output folder is reported before measuring.
pub fn run(backend: Backend, out: &Path, options: &ProfileOptions) -> Result<Calibration> {
    output::check_folder(out)?;
    let cal = match backend {
        Backend::Cpu => profile(options)?,
        Backend::Cuda => autopar_runtime::cuda::profile(0, options.quick)
            .map_err(|e| anyhow::anyhow!("profile --backend cuda: {e}"))?,
    };
    let text = serde_json::to_string_pretty(&cal)? + "\n";
    output::write_atomic(out, text.as_bytes())?;
    Ok(cal)
}

/// A few lines for people: the range of matmul rates per dtype, then the
/// streaming, collective and per-op figures, and how many op rates were
/// measured.
pub fn render(cal: &Calibration, out: &Path) -> String {
    let mut s = format!("wrote {}\n{}\n", out.display(), cal.about);
    for dtype in [DType::Bf16, DType::F32, DType::F64] {
        let samples = cal.matmul.measured.iter().filter(|m| m.dtype == dtype);
        let slowest = samples
            .clone()
            .min_by(|a, b| a.flops_per_s.total_cmp(&b.flops_per_s));
        let fastest = samples
            .clone()
            .max_by(|a, b| a.flops_per_s.total_cmp(&b.flops_per_s));
        if let (Some(lo), Some(hi)) = (slowest, fastest) {
            s += &format!(
                "matmul {dtype}: {:.2} GFLOP/s ({}x{}x{}) to {:.2} GFLOP/s ({}x{}x{}) over {} shapes (m x n x k)\n",
                lo.flops_per_s / 1e9,
                lo.m,
                lo.n,
                lo.k,
                hi.flops_per_s / 1e9,
                hi.m,
                hi.n,
                hi.k,
                samples.count(),
            );
        }
    }
    if let Some(bw) = cal.memory.measured_bytes_per_s {
        s += &format!("streaming Add: {:.2} GB/s read + written\n", bw / 1e9);
    }
    if let Some(bw) = cal.network.measured_intra_node_bytes_per_s {
        s += &format!("ring all-reduce: {:.2} GB/s per rank and direction\n", bw / 1e9);
    }
    s += &format!("per-op overhead: {:.2} us\n", cal.kernel_overhead_s * 1e6);
    if !cal.ops.is_empty() {
        let kernels: std::collections::BTreeSet<_> = cal.ops.iter().map(|r| (&r.op, r.dtype)).collect();
        s += &format!(
            "per-op rates: {} kernel and dtype pairs from zoo training graphs ({} size bands)\n",
            kernels.len(),
            cal.ops.len()
        );
    }
    if cal.threads.len() > 1 {
        let list: Vec<String> = cal
            .threads
            .iter()
            .map(|t| format!("{} threads {:.2}x", t.threads, t.slowdown))
            .collect();
        s += &format!("per-thread slowdown with threads at once: {}\n", list.join(", "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_cost_models::calibration::{MatmulSample, OpRate};

    #[test]
    fn render_gives_the_rate_range_per_dtype() {
        let mut cal = Calibration {
            about: "test host".into(),
            kernel_overhead_s: 1.5e-6,
            ..Calibration::default()
        };
        let sample = |m, flops_per_s| MatmulSample {
            m,
            n: m,
            k: 64,
            dtype: DType::F32,
            flops_per_s,
        };
        cal.matmul.measured = vec![sample(32, 2e9), sample(512, 30e9), sample(128, 10e9)];
        cal.memory.measured_bytes_per_s = Some(12.5e9);
        cal.network.measured_intra_node_bytes_per_s = Some(4e9);
        assert_eq!(
            render(&cal, Path::new("cpu.json")),
            "wrote cpu.json\n\
             test host\n\
             matmul f32: 2.00 GFLOP/s (32x32x64) to 30.00 GFLOP/s (512x512x64) over 3 shapes (m x n x k)\n\
             streaming Add: 12.50 GB/s read + written\n\
             ring all-reduce: 4.00 GB/s per rank and direction\n\
             per-op overhead: 1.50 us\n"
        );
        let rate = |op: &str, dtype, at_bytes| OpRate {
            op: op.into(),
            dtype,
            at_bytes: Some(at_bytes),
            bytes_per_s: Some(1e9),
            flops_per_s: None,
        };
        cal.ops = vec![
            rate("Erf", DType::F32, 1e3),
            rate("Erf", DType::F32, 1e6),
            rate("Erf", DType::F64, 1e6),
        ];
        assert!(render(&cal, Path::new("cpu.json"))
            .ends_with("per-op rates: 2 kernel and dtype pairs from zoo training graphs (3 size bands)\n"));
    }
}

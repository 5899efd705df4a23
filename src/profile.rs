//! `autopar profile`: measures a backend on this host and writes the rates
//! as a calibration file (`autopar-calibration/1`) for the cost models.

use crate::output;
use crate::run::rendezvous_wait;
use anyhow::{Context, Result};
use autopar_comm::collective::connect;
use autopar_comm::launch::LaunchEnv;
use autopar_cost_models::Calibration;
use autopar_cpu::profile::{profile, ProfileOptions};
use autopar_cuda as cuda;
use autopar_ir::DType;
use std::path::Path;
use std::time::Duration;

/// How long a launched profile's processes wait for each other's messages.
const PEER_TIMEOUT: Duration = Duration::from_secs(120);

/// A backend that can be profiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// This host's CPU through the reference interpreter's kernels.
    Cpu,
    /// This process's GPU (`LOCAL_RANK`, else 0) through cuBLAS and the
    /// CUDA backend's kernels; under a launcher with a process per GPU,
    /// NCCL bandwidth between the job's GPUs too.
    Cuda,
}

/// Profiles `backend` and writes the calibration to `out` as pretty JSON.
/// A missing output folder is reported before measuring. Under a launcher
/// every process takes part in measuring collectives, and rank 0 alone
/// measures its GPU and writes the file; the others return `None`.
pub fn run(backend: Backend, out: &Path, options: &ProfileOptions) -> Result<Option<Calibration>> {
    output::check_folder(out)?;
    let cal = match backend {
        Backend::Cpu => profile(options)?,
        Backend::Cuda => {
            let fail = |e: cuda::CudaError| anyhow::anyhow!("profile --backend cuda: {e}");
            let launch = LaunchEnv::from_env().context("reading the launcher's environment")?;
            // Fail at once where there is no GPU, before waiting for peers.
            cuda::probe(launch.local_rank).map_err(fail)?;
            let network = match launch.world_size > 1 {
                true => {
                    let endpoint = connect(&launch, rendezvous_wait()?, PEER_TIMEOUT)
                        .context("connecting the launched processes")?;
                    let measured = cuda::profile_network(launch.local_rank, &endpoint, options.quick);
                    if measured.is_err() {
                        endpoint.abort("profiling the network failed");
                    }
                    let measured = measured.map_err(fail)?;
                    endpoint
                        .close(PEER_TIMEOUT)
                        .context("closing the job's connections")?;
                    if launch.rank != 0 {
                        return Ok(None);
                    }
                    Some(measured)
                }
                false => None,
            };
            cuda::profile(launch.local_rank, options.quick, network).map_err(fail)?
        }
    };
    let text = serde_json::to_string_pretty(&cal)? + "\n";
    output::write_atomic(out, text.as_bytes())?;
    Ok(Some(cal))
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
    if let Some(bw) = cal.network.measured_inter_node_bytes_per_s {
        s += &format!(
            "ring all-reduce between nodes: {:.2} GB/s per rank and direction\n",
            bw / 1e9
        );
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
        cal.network.measured_inter_node_bytes_per_s = Some(2.5e9);
        assert_eq!(
            render(&cal, Path::new("cpu.json")),
            "wrote cpu.json\n\
             test host\n\
             matmul f32: 2.00 GFLOP/s (32x32x64) to 30.00 GFLOP/s (512x512x64) over 3 shapes (m x n x k)\n\
             streaming Add: 12.50 GB/s read + written\n\
             ring all-reduce: 4.00 GB/s per rank and direction\n\
             ring all-reduce between nodes: 2.50 GB/s per rank and direction\n\
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

//! `autopar profile --backend cuda`: measures this GPU into the
//! calibration format the cost models read — cuBLAS GEMM rates over a
//! shape grid in bf16 and f32, the streaming bandwidth of an element-wise
//! kernel, and the fixed cost of a kernel launch. Collective bandwidth
//! needs NCCL across several GPUs: a launched job measures it first
//! (`bandwidth.rs`) and hands it in; without one the network stays at the
//! documented defaults (and `about` says so).

use super::module::Kernels;
use super::ops::{grid, launch, linalg, Gpu, IndexCheck};
use super::{device, CudaError, GpuPrecision, NetworkProfile};
use autopar_cost_models::calibration::{MatmulSample, FORMAT};
use autopar_cost_models::Calibration;
use autopar_ir::DType;
use cudarc::cublas::CudaBlas;
use std::sync::Arc;
use std::time::Instant;

/// Seconds per call of `f`: one warm-up, then the fastest of three samples
/// of `calls` calls each, the stream drained before the clock stops.
fn time_per_call(
    gpu: &Gpu,
    calls: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let sync = || {
        gpu.stream
            .synchronize()
            .map_err(|e| CudaError::Driver(e.to_string()))
    };
    f()?;
    sync()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        sync()?;
        best = best.min(start.elapsed().as_secs_f64() / calls as f64);
    }
    Ok(best)
}

fn gpu_for(
    ctx: &Arc<cudarc::driver::CudaContext>,
    kernels: Arc<Kernels>,
    precision: GpuPrecision,
) -> Result<Gpu, CudaError> {
    let stream = ctx.new_stream().map_err(|e| CudaError::Driver(e.to_string()))?;
    let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Driver(format!("cuBLAS: {e}")))?;
    Ok(Gpu {
        indices: IndexCheck::new(&stream)?,
        stream,
        blas,
        kernels,
        precision,
    })
}

/// GEMM FLOP/s of `m×k · k×n` in the gpu's float type.
fn gemm_rate(gpu: &Gpu, (m, n, k): (usize, usize, usize), calls: usize) -> Result<f64, CudaError> {
    let size = gpu.float().size();
    let alloc = |elems: usize| {
        gpu.stream
            .alloc_zeros::<u8>(elems * size)
            .map_err(|e| CudaError::Driver(e.to_string()))
    };
    let (a, b, c) = (alloc(m * k)?, alloc(k * n)?, alloc(m * n)?);
    let ptr = |s: &cudarc::driver::CudaSlice<u8>| cudarc::driver::DevicePtr::device_ptr(s, &gpu.stream).0;
    let shape = linalg::Gemm::plain(m, n, k);
    let (pa, pb, pc) = (ptr(&a), ptr(&b), ptr(&c));
    let t = time_per_call(gpu, calls, || linalg::gemm(gpu, pa, pb, pc, &shape))?;
    Ok(2.0 * (m * n * k) as f64 / t)
}

/// Bytes/s read plus written by a copy kernel over `elems` f32.
fn stream_rate(gpu: &Gpu, elems: usize, calls: usize) -> Result<f64, CudaError> {
    let alloc = || {
        gpu.stream
            .alloc_zeros::<f32>(elems)
            .map_err(|e| CudaError::Driver(e.to_string()))
    };
    let (x, y) = (alloc()?, alloc()?);
    let ptr = |s: &cudarc::driver::CudaSlice<f32>| cudarc::driver::DevicePtr::device_ptr(s, &gpu.stream).0;
    let (px, py, n) = (ptr(&x), ptr(&y), elems as i64);
    let t = time_per_call(gpu, calls, || {
        launch!(gpu, "unary_identity_f32", grid(elems), py, px, n)
    })?;
    Ok(8.0 * elems as f64 / t)
}

/// Measures device `ordinal`. `quick` uses small shapes and few calls
/// (checks the machinery; the numbers are not meaningful).
pub(crate) fn profile(
    ordinal: usize,
    quick: bool,
    network: Option<NetworkProfile>,
) -> Result<Calibration, CudaError> {
    let network = network.unwrap_or_else(|| {
        NetworkProfile::unmeasured(
            "one process; under a launcher with a process per GPU, NCCL all-reduces are measured".into(),
        )
    });
    let info = device::probe(ordinal)?;
    let ctx = device::context(ordinal)?;
    let kernels = Arc::new(Kernels::load(&ctx, info.compute_capability)?);
    let sizes: &[usize] = if quick {
        &[256, 512]
    } else {
        &[512, 1024, 2048, 4096, 8192]
    };
    let calls = if quick { 2 } else { 20 };
    let mut cal =
        Calibration {
            format: FORMAT.into(),
            about: format!(
            "autopar profile --backend cuda on {} (compute capability {}.{}, {:.0} GiB){}: cuBLAS GEMMs, \
             a streaming copy kernel and launch overhead measured; {}",
            info.name,
            info.compute_capability.0,
            info.compute_capability.1,
            info.memory_bytes as f64 / (1u64 << 30) as f64,
            if quick { ", quick mode (numbers not meaningful)" } else { "" },
            network.about,
        ),
            ..Calibration::default()
        };
    for (precision, dtype) in [(GpuPrecision::Bf16, DType::Bf16), (GpuPrecision::F32, DType::F32)] {
        let gpu = gpu_for(&ctx, kernels.clone(), precision)?;
        for &m in sizes {
            for &n in sizes {
                for &k in sizes {
                    if m != n && n != k && m != k {
                        continue;
                    }
                    let flops_per_s = gemm_rate(&gpu, (m, n, k), calls)?;
                    cal.matmul.measured.push(MatmulSample {
                        m,
                        n,
                        k,
                        dtype,
                        flops_per_s: four_digits(flops_per_s),
                    });
                }
            }
        }
    }
    let gpu = gpu_for(&ctx, kernels, GpuPrecision::F32)?;
    let elems = if quick { 1 << 20 } else { 1 << 28 };
    cal.memory.measured_bytes_per_s = Some(four_digits(stream_rate(&gpu, elems, calls)?));
    let launches = if quick { 100 } else { 2000 };
    let tiny = stream_rate(&gpu, 1, launches)?;
    cal.kernel_overhead_s = four_digits(8.0 / tiny);
    cal.network.measured_intra_node_bytes_per_s = network.intra_node_bytes_per_s.map(four_digits);
    cal.network.measured_inter_node_bytes_per_s = network.inter_node_bytes_per_s.map(four_digits);
    Ok(cal)
}

/// `x` to four significant digits (more would be noise).
fn four_digits(x: f64) -> f64 {
    format!("{x:.3e}").parse().unwrap_or(x)
}

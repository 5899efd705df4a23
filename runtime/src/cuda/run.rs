//! Starting a CUDA run: the device, the kernels, one backend per rank.

use super::backend::{CudaBackend, HostNodes};
use super::memory::{self, ElementSize};
use super::module::Kernels;
use super::{device, CudaError, CudaOptions, CudaReport, GpuPrecision};
use crate::cpu::parallel::{train_on, ExecError, StepReport, TrainOptions};
use crate::cpu::Precision;
use crate::lower::{Program, TrainingGraph};
use crate::train::TokenSource;
use autopar_ir::DType;
use std::sync::Arc;

pub(super) fn train(
    t: &TrainingGraph,
    programs: &[Program],
    data: &TokenSource,
    opts: &TrainOptions,
    cuda: &CudaOptions,
    progress: &(dyn Fn(&StepReport) + Sync),
) -> Result<CudaReport, ExecError> {
    let setup = |e: CudaError| ExecError::Backend(format!("CUDA backend: {e}"));
    if opts.precision == Precision::F64 {
        return Err(ExecError::Backend(
            "CUDA backend: f64 is not supported; use --precision f32 or bf16".into(),
        ));
    }
    let info = device::probe(cuda.device).map_err(setup)?;
    let float = match cuda.precision {
        GpuPrecision::F32 => DType::F32,
        GpuPrecision::Bf16 => DType::Bf16,
    };
    let planned = programs
        .iter()
        .map(|p| memory::plan_memory(t, p, ElementSize::Float(float)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ExecError::Backend(format!("planning device memory: {e}")))?;
    let ctx = device::context(cuda.device).map_err(setup)?;
    // Every buffer stays on its own rank's stream, so cudarc's cross-stream
    // events (two per allocation, one per pointer use) are not needed.
    // SAFETY: no buffer is used from a stream other than the one that made it.
    unsafe { ctx.disable_event_tracking() };
    let kernels = Arc::new(Kernels::load(&ctx, info.compute_capability).map_err(setup)?);
    let host_nodes = HostNodes::default();
    let make = |_rank: usize| {
        CudaBackend::new(&ctx, kernels.clone(), cuda.precision, host_nodes.clone()).map_err(|e| e.to_string())
    };
    let report = train_on(t, programs, data, opts, progress, &make)?;
    let host_nodes = host_nodes.lock().map(|m| m.clone()).unwrap_or_default();
    Ok(CudaReport {
        train: report,
        device: info,
        host_nodes,
        planned,
    })
}

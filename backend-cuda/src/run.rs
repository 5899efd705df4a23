//! Starting a CUDA run: the device, the kernels, one backend per rank —
//! every rank of a plan on one GPU, or this process's one rank on its GPU.

use super::backend::{CudaBackend, HostNodes};
use super::meetings::Meetings;
use super::memory::{self, ElementSize, MemoryPlan};
use super::module::Kernels;
use super::nccl::{self, Link};
use super::same_device::SameDevice;
use super::{device, CudaError, CudaOptions, CudaReport, DeviceInfo, GpuPrecision};
use autopar_comm::collective::{Endpoint, Watchdog};
use autopar_exec::train::Data;
use autopar_exec::{train_on, train_rank_on, ExecError, RankResult, StepReport, TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::DType;
use autopar_lower::blocking::{check_blocking, Deadlock, Transfers};
use autopar_lower::{Program, TrainingGraph};
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// The report's collectives of a run without peers.
const ONE_RANK: &str = "none (one rank)";

/// Set to 0 to stage the collectives of ranks that share one GPU through
/// host memory instead of the same-device exchange (to compare, or to rule
/// it out while debugging).
pub const SAME_DEVICE_VAR: &str = "AUTOPAR_SAME_DEVICE";

/// What every rank on this process's GPU shares.
struct Setup {
    info: DeviceInfo,
    ctx: Arc<CudaContext>,
    kernels: Arc<Kernels>,
    planned: Vec<MemoryPlan>,
    host_nodes: HostNodes,
}

impl Setup {
    fn new(
        t: &TrainingGraph,
        programs: &[Program],
        opts: &TrainOptions,
        cuda: &CudaOptions,
    ) -> Result<Setup, ExecError> {
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
        device::reset_pool_peak(&ctx).map_err(setup)?;
        Ok(Setup {
            info,
            ctx,
            kernels,
            planned,
            host_nodes: HostNodes::default(),
        })
    }

    /// A rank's backend: its own stream and cuBLAS handle on the shared device.
    fn backend(&self, cuda: &CudaOptions) -> Result<CudaBackend, CudaError> {
        CudaBackend::new(
            &self.ctx,
            self.kernels.clone(),
            cuda.precision,
            self.host_nodes.clone(),
        )
    }

    /// The run's report; `ranks` are the ranks this process ran.
    fn report(self, train: TrainReport, collectives: String, ranks: &[usize]) -> CudaReport {
        let host_nodes = self.host_nodes.lock().map(|m| m.clone()).unwrap_or_default();
        // A failed reading loses the figure, not the run.
        let measured_peak_bytes = device::pool_peak(&self.ctx).ok().flatten();
        let planned_here_bytes = ranks
            .iter()
            .filter_map(|&r| self.planned.get(r))
            .map(|m| m.arena_bytes + m.persistent.total())
            .sum();
        CudaReport {
            train,
            device: self.info,
            host_nodes,
            planned: self.planned,
            collectives,
            measured_peak_bytes,
            planned_here_bytes,
        }
    }
}

pub(super) fn train(
    t: &TrainingGraph,
    programs: &[Program],
    data: &Data,
    opts: &TrainOptions,
    cuda: &CudaOptions,
    progress: &(dyn Fn(&StepReport) + Sync),
) -> Result<CudaReport, ExecError> {
    let setup = Setup::new(t, programs, opts, cuda)?;
    let exchange = same_device(programs);
    let meetings = exchange
        .as_ref()
        .ok()
        .map(|()| Arc::new(Meetings::new(opts.timeout)));
    let groups = nccl::collective_groups(programs);
    let report = train_on(t, programs, data, opts, progress, &|rank| {
        // The interpreter takes a rank's failure to start as text.
        let backend = setup.backend(cuda).map_err(|e| e.to_string())?;
        Ok(match &meetings {
            Some(meetings) => backend.with_comms(Box::new(SameDevice::new(
                rank,
                meetings.clone(),
                setup.kernels.clone(),
                groups.clone(),
            ))),
            None => backend,
        })
    })?;
    let collectives = match (programs.len(), exchange) {
        (1, _) => ONE_RANK.to_string(),
        (_, Ok(())) => "same-device exchange between the ranks' streams (all-reduces, reduce-scatters and \
                        gathers; transfers host-staged)"
            .to_string(),
        (_, Err(why)) => format!("host-staged (the ranks share one GPU; {why})"),
    };
    let ranks: Vec<usize> = (0..programs.len()).collect();
    Ok(setup.report(report, collectives, &ranks))
}

/// Why the ranks sharing this process's GPU stage their collectives
/// through host memory instead of the same-device exchange.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Staged {
    #[error("one rank")]
    OneRank,
    #[error("{}=0", SAME_DEVICE_VAR)]
    Disabled,
    #[error("under blocking collectives {0}")]
    Deadlock(Deadlock),
}

/// Whether the ranks of `programs`, sharing this process's GPU, run their
/// collectives through the same-device exchange, or why not.
fn same_device(programs: &[Program]) -> Result<(), Staged> {
    if programs.len() == 1 {
        return Err(Staged::OneRank);
    }
    if std::env::var(SAME_DEVICE_VAR).is_ok_and(|v| v.trim() == "0") {
        return Err(Staged::Disabled);
    }
    // Each member's thread waits at every meeting, in program order.
    check_blocking(programs, Transfers::Buffered).map_err(Staged::Deadlock)
}

pub(super) fn train_rank(
    t: &TrainingGraph,
    programs: &[Program],
    endpoint: Endpoint,
    data: &Data,
    opts: &TrainOptions,
    cuda: &CudaOptions,
    progress: &(dyn Fn(&StepReport) + Sync),
) -> Result<RankResult<CudaReport>, ExecError> {
    let rank = endpoint.rank();
    let setup = Setup::new(t, programs, opts, cuda)?;
    let starting = |message| ExecError::Rank {
        rank,
        step: 0,
        index: 0,
        what: "starting the backend".into(),
        message,
    };
    let backend = setup.backend(cuda).map_err(|e| starting(e.to_string()))?;
    // NCCL calls wait on the GPU, out of the fabric's sight: when a rank
    // fails, the watchdog aborts this rank's communicators so it fails too.
    let mut watchdog = None;
    let (backend, collectives) = match nccl::connect(&endpoint, programs, &setup.ctx) {
        Ok(Link::Nccl(nccl)) => {
            let name = nccl.describe();
            let comms = nccl.comms();
            watchdog = Some(Watchdog::spawn(endpoint.clone(), move |by, why| {
                comms.abort(by, &why)
            }));
            (backend.with_comms(Box::new(nccl)), name)
        }
        Ok(Link::Staged(why)) => (backend, format!("host-staged ({why})")),
        Ok(Link::Alone) => (backend, ONE_RANK.to_string()),
        Err(e) => {
            let message = e.to_string();
            endpoint.abort(&message);
            return Err(starting(message));
        }
    };
    let result = train_rank_on(t, programs, endpoint, data, opts, progress, backend);
    drop(watchdog);
    let result = result?;
    Ok(RankResult {
        report: result.report.map(|r| setup.report(r, collectives, &[rank])),
        trace: result.trace,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_lower::{tiny_gpt_programs, Strategy};

    fn programs(s: &Strategy) -> Vec<Program> {
        tiny_gpt_programs(2, s)
    }

    /// Ranks on one GPU use the exchange when there are several and their
    /// programs finish under blocking collectives (interleaved pipelines too:
    /// their transfers stay on the fabric, whose sends never wait).
    #[test]
    fn ranks_on_one_gpu_exchange_on_the_device_when_their_programs_finish() {
        let one = same_device(&programs(&Strategy::new(1, 1, 2, 1, 1)));
        assert_eq!(one, Err(Staged::OneRank));
        assert_eq!(one.unwrap_err().to_string(), "one rank");
        assert_eq!(Staged::Disabled.to_string(), "AUTOPAR_SAME_DEVICE=0");
        let mut hybrid = Strategy::new(2, 2, 2, 1, 4).with_tp(2, true);
        hybrid.zero = 2;
        assert_eq!(same_device(&programs(&hybrid)), Ok(()));
        let mut interleaved = Strategy::new(1, 2, 2, 1, 4);
        interleaved.schedule = autopar_cost_models::Schedule::Interleaved;
        interleaved.chunks = 2;
        assert_eq!(same_device(&programs(&interleaved)), Ok(()));
    }
}

//! The CPU backend: the rank interpreter of `autopar-exec` over host values
//! and the reference kernels ([`CpuBackend`]), its entry points for a run in
//! one process ([`train`], one thread per rank) or one rank per process
//! ([`train_rank`]), and the host profiler (`profile`) that measures this
//! machine as the backend sees it.
//!
//! Architecture invariant: nothing here interprets instructions or
//! implements a collective; the instruction loop is `autopar-exec`'s and the
//! collectives are `autopar-comm`'s, so the CPU and CUDA backends run the
//! same plan the same way.

pub mod allocator;
mod backend;
pub mod profile;
mod runner;

pub use backend::CpuBackend;
pub use runner::CpuRunner;

use autopar_comm::collective::Endpoint;
use autopar_exec::train::Data;
use autopar_exec::{train_on, train_rank_on, ExecError, RankResult, StepReport, TrainOptions, TrainReport};
use autopar_lower::{Program, TrainingGraph};

/// Runs `programs` (one per rank) for `opts.steps` steps from the training
/// graph's initial weights on the CPU, calling `progress` after each step.
pub fn train(
    t: &TrainingGraph,
    programs: &[Program],
    data: &Data,
    opts: &TrainOptions,
    progress: &(dyn Fn(&StepReport) + Sync),
) -> Result<TrainReport, ExecError> {
    let precision = opts.precision;
    train_on(t, programs, data, opts, progress, &|_| {
        Ok(CpuBackend { precision })
    })
}

/// [`train_rank_on`] on the CPU backend.
pub fn train_rank(
    t: &TrainingGraph,
    programs: &[Program],
    endpoint: Endpoint,
    data: &Data,
    opts: &TrainOptions,
    progress: &(dyn Fn(&StepReport) + Sync),
) -> Result<RankResult<TrainReport>, ExecError> {
    let backend = CpuBackend {
        precision: opts.precision,
    };
    train_rank_on(t, programs, endpoint, data, opts, progress, backend)
}

//! The CPU backend as a session's [`Runner`]: every rank a thread of this
//! process, or this process's one rank under a launcher.

use super::{train, train_rank, ExecError, RankResult, StepReport, TrainOptions, TrainReport};
use crate::collective::Endpoint;
use crate::lower::{Program, TrainingGraph};
use crate::session::Runner;
use crate::train::TokenSource;

/// Runs a session on the CPU reference kernels; it adds nothing to the report.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuRunner;

impl Runner for CpuRunner {
    type Details = ();

    fn train_all(
        &self,
        t: &TrainingGraph,
        programs: &[Program],
        data: &TokenSource,
        opts: &TrainOptions,
        progress: &(dyn Fn(&StepReport) + Sync),
    ) -> Result<(TrainReport, ()), ExecError> {
        Ok((train(t, programs, data, opts, progress)?, ()))
    }

    fn train_rank(
        &self,
        t: &TrainingGraph,
        programs: &[Program],
        endpoint: Endpoint,
        data: &TokenSource,
        opts: &TrainOptions,
        progress: &(dyn Fn(&StepReport) + Sync),
    ) -> Result<RankResult<(TrainReport, ())>, ExecError> {
        let mine = train_rank(t, programs, endpoint, data, opts, progress)?;
        Ok(RankResult {
            report: mine.report.map(|r| (r, ())),
            trace: mine.trace,
        })
    }
}

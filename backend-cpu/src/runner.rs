//! The CPU backend as a session's [`Runner`]: every rank a thread of this
//! process, or this process's one rank under a launcher.

use crate::{train, train_rank};
use autopar_comm::collective::Endpoint;
use autopar_exec::session::{Runner, Work};
use autopar_exec::{ExecError, RankResult, TrainReport};

/// Runs a session on the CPU reference kernels; it adds nothing to the report.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuRunner;

impl Runner for CpuRunner {
    type Details = ();

    fn train_all(&self, w: Work<'_>) -> Result<(TrainReport, ()), ExecError> {
        Ok((train(w.training, w.programs, w.data, w.opts, w.progress)?, ()))
    }

    fn train_rank(
        &self,
        w: Work<'_>,
        endpoint: Endpoint,
    ) -> Result<RankResult<(TrainReport, ())>, ExecError> {
        let mine = train_rank(w.training, w.programs, endpoint, w.data, w.opts, w.progress)?;
        Ok(RankResult {
            report: mine.report.map(|r| (r, ())),
            trace: mine.trace,
        })
    }
}

//! The CUDA backend as a session's [`Runner`]: every rank a stream on one
//! GPU, or this process's one rank on GPU `LOCAL_RANK` under a launcher.

use crate::{train, train_rank, CudaOptions, CudaReport};
use autopar_comm::collective::Endpoint;
use autopar_exec::session::{Runner, Work};
use autopar_exec::{ExecError, RankResult, TrainReport};

/// Runs a session on the GPU; the report's details are the whole
/// [`CudaReport`] (device, memory plans and peak, collectives, host nodes).
#[derive(Debug, Clone, Default)]
pub struct CudaRunner(pub CudaOptions);

impl Runner for CudaRunner {
    type Details = CudaReport;

    fn train_all(&self, w: Work<'_>) -> Result<(TrainReport, CudaReport), ExecError> {
        let c = train(w.training, w.programs, w.data, w.opts, &self.0, w.progress)?;
        Ok((c.train.clone(), c))
    }

    fn train_rank(
        &self,
        w: Work<'_>,
        endpoint: Endpoint,
    ) -> Result<RankResult<(TrainReport, CudaReport)>, ExecError> {
        let mine = train_rank(
            w.training, w.programs, endpoint, w.data, w.opts, &self.0, w.progress,
        )?;
        Ok(RankResult {
            report: mine.report.map(|c| (c.train.clone(), c)),
            trace: mine.trace,
        })
    }
}

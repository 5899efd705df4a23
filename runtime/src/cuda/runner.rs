//! The CUDA backend as a session's [`Runner`]: every rank a stream on one
//! GPU, or this process's one rank on GPU `LOCAL_RANK` under a launcher.

use super::{train, train_rank, CudaOptions, CudaReport};
use crate::collective::Endpoint;
use crate::cpu::parallel::{ExecError, RankResult, StepReport, TrainOptions, TrainReport};
use crate::lower::{Program, TrainingGraph};
use crate::session::Runner;
use crate::train::TokenSource;

/// Runs a session on the GPU; the report's details are the whole
/// [`CudaReport`] (device, memory plans and peak, collectives, host nodes).
#[derive(Debug, Clone, Default)]
pub struct CudaRunner(pub CudaOptions);

impl Runner for CudaRunner {
    type Details = CudaReport;

    fn train_all(
        &self,
        t: &TrainingGraph,
        programs: &[Program],
        data: &TokenSource,
        opts: &TrainOptions,
        progress: &(dyn Fn(&StepReport) + Sync),
    ) -> Result<(TrainReport, CudaReport), ExecError> {
        let c = train(t, programs, data, opts, &self.0, progress)?;
        Ok((c.train.clone(), c))
    }

    fn train_rank(
        &self,
        t: &TrainingGraph,
        programs: &[Program],
        endpoint: Endpoint,
        data: &TokenSource,
        opts: &TrainOptions,
        progress: &(dyn Fn(&StepReport) + Sync),
    ) -> Result<RankResult<(TrainReport, CudaReport)>, ExecError> {
        let mine = train_rank(t, programs, endpoint, data, opts, &self.0, progress)?;
        Ok(RankResult {
            report: mine.report.map(|c| (c.train.clone(), c)),
            trace: mine.trace,
        })
    }
}

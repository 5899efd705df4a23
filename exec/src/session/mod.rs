//! A training run of a plan, from the plan and the model graph to a report:
//! the strategy, initial weights, the training graph, the per-rank programs
//! (lowered once: a caller that also simulates the plan replays these same
//! programs, see [`Session::programs`]), data, optimizer, the launched
//! processes' connection, training and the report.
//!
//! The backend comes from the caller as a [`Runner`], so the session names
//! no backend: the CPU backend (`autopar_cpu::CpuRunner`) and the CUDA
//! backend (`autopar_cuda::CudaRunner`) plug in from above, and a run in one
//! process or one rank under a launcher is the session's one choice, made once.

use crate::checkpoint::{self, CheckpointError, Restored, RunRecord, SavePolicy};
use crate::trace::TraceEvent;
use crate::train::{initialize, Data, DataError, InitError, Optimizer};
use crate::{ExecError, RankResult, StepReport, TrainOptions, TrainReport};
use autopar_comm::collective::{connect, Endpoint, MeshError};
use autopar_comm::launch::LaunchEnv;
use autopar_cost_models::host_threads_per_rank;
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{
    for_strategy, lower, LowerError, Objective, Program, Strategy, StrategyError, TrainingError,
    TrainingGraph,
};
use autopar_planner::Plan;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a backend trains: the programs (one per rank) of one training
/// graph, their data and options, and who hears about each step.
#[derive(Clone, Copy)]
pub struct Work<'a> {
    pub training: &'a TrainingGraph,
    pub programs: &'a [Program],
    pub data: &'a Data,
    pub opts: &'a TrainOptions,
    pub progress: &'a (dyn Fn(&StepReport) + Sync),
}

/// A backend that runs a session's programs: every rank in this process,
/// or this process's one rank with its peers in other processes.
pub trait Runner {
    /// What the backend adds to the run's report (the CUDA backend: the
    /// device, its memory plans and how collectives ran; the CPU: nothing).
    type Details;

    /// Runs every rank of `work` in this process.
    fn train_all(&self, work: Work<'_>) -> Result<(TrainReport, Self::Details), ExecError>;

    /// Runs rank `endpoint.rank()` of `work`, reaching the other ranks
    /// through `endpoint`; rank 0 gets the run's report.
    fn train_rank(
        &self,
        work: Work<'_>,
        endpoint: Endpoint,
    ) -> Result<RankResult<(TrainReport, Self::Details)>, ExecError>;
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub steps: usize,
    /// Seeds the initial weights and the synthetic data.
    pub seed: u64,
    pub optimizer: Optimizer,
    /// What to train the model for; `None`: what its inputs and outputs
    /// call for ([`autopar_lower::infer_objective`]).
    pub objective: Option<Objective>,
    /// A tokens.bin file (little-endian uint16) for token objectives, or
    /// arrays of features (`.npy`, `.safetensors`) for the others; `None`
    /// trains on synthetic data (see [`Data::open`]).
    pub data: Option<PathBuf>,
    /// Labels for `.npy` features.
    pub labels: Option<PathBuf>,
    /// What the programs' host values use (also what the simulator prices).
    pub precision: Precision,
    /// Gradient reductions and weight refreshes beside the backward pass.
    pub overlap: bool,
    /// Record every rank's timeline.
    pub trace: bool,
    /// How long launched processes wait for each other to start and connect.
    pub rendezvous_wait: Duration,
    /// How long a rank waits for a peer in a collective or transfer before
    /// declaring it failed; a peer process that sends nothing (not even a
    /// heartbeat) is declared failed after half of it.
    pub timeout: Duration,
    /// Save checkpoints.
    pub save: Option<SavePolicy>,
    /// Start from this checkpoint: its weights, optimizer state and step.
    pub resume: Option<Arc<Restored>>,
    /// Threads each rank splits its large products over; `None`: its share
    /// of this host's cores ([`host_threads_per_rank`] of the ranks here).
    pub threads_per_rank: Option<usize>,
}

/// Why a session could not run.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("lowering the plan")]
    Strategy(#[source] StrategyError),
    #[error("initialising weights")]
    Init(#[source] InitError),
    #[error("building the training graph")]
    Training(#[source] TrainingError),
    #[error("lowering the plan")]
    Lower(#[source] LowerError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("connecting the launched processes")]
    Connect(#[source] MeshError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("checkpoint")]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint cannot continue this run.
    #[error("resuming {dir}: {message}")]
    Resume { dir: String, message: String },
}

/// A plan ready to run: lowered, with its data and options.
pub struct Session {
    plan: Plan,
    strategy: Strategy,
    training: TrainingGraph,
    programs: Vec<Program>,
    data: Data,
    opts: TrainOptions,
    launch: LaunchEnv,
    rendezvous_wait: Duration,
    tokens_per_step: usize,
    save: Option<SavePolicy>,
    /// What every checkpoint records about the run.
    record: RunRecord,
}

/// What a run ended with in this process.
#[derive(Debug, Clone)]
pub struct Outcome<D> {
    /// The run's report: in a one-process run, or on rank 0 of a launched one.
    pub report: Option<SessionReport<D>>,
    /// Under a launcher, this process's rank's own timeline (when traced).
    pub rank_trace: Option<Vec<TraceEvent>>,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct SessionReport<D> {
    /// The objective's mean loss of each step.
    pub losses: Vec<f64>,
    pub step_times_s: Vec<f64>,
    pub per_rank: Vec<RankRun>,
    /// Every rank's timeline, in a one-process traced run.
    pub trace: Vec<TraceEvent>,
    /// What the backend adds.
    pub details: D,
}

/// One rank's traffic, memory and program size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankRun {
    pub rank: usize,
    /// Over the whole run.
    pub bytes_sent: u64,
    pub peak_activation_bytes: u64,
    /// Instructions of its program (one step).
    pub instructions: usize,
}

impl<D> Outcome<D> {
    /// The same outcome with the report's details mapped by `f` (a caller
    /// that picks the backend at run time makes one type of both).
    pub fn map_details<E>(self, f: impl FnOnce(D) -> E) -> Outcome<E> {
        Outcome {
            report: self.report.map(|r| SessionReport {
                losses: r.losses,
                step_times_s: r.step_times_s,
                per_rank: r.per_rank,
                trace: r.trace,
                details: f(r.details),
            }),
            rank_trace: self.rank_trace,
        }
    }
}

impl Session {
    /// Prepares `plan` for `graph` (canonical, blocks detected, weightless
    /// or not: weights are initialised from `opts.seed`) at sequence length
    /// `seq`, for this process's place in `launch`.
    pub fn new(
        plan: Plan,
        mut graph: Graph,
        seq: usize,
        opts: RunOptions,
        launch: LaunchEnv,
    ) -> Result<Session, SessionError> {
        let strategy = Strategy::from_plan(&plan).map_err(SessionError::Strategy)?;
        let model_hash = checkpoint::model_hash(&graph);
        if let Some(r) = &opts.resume {
            resumable(r, &model_hash, &opts)?;
        }
        initialize(&mut graph, opts.seed).map_err(SessionError::Init)?;
        let objective = match opts.objective {
            Some(o) => o,
            None => autopar_lower::infer_objective(&graph).map_err(SessionError::Training)?,
        };
        let training = for_strategy(&graph, &strategy, seq, objective).map_err(SessionError::Training)?;
        let programs = lower(&training, &strategy).map_err(SessionError::Lower)?;
        let data = Data::open(
            &training.task,
            opts.data.as_deref(),
            opts.labels.as_deref(),
            opts.seed,
        )?;
        let mut train = TrainOptions::new(opts.precision, opts.optimizer, opts.steps);
        train.trace = opts.trace;
        train.overlap_comm = opts.overlap;
        train.timeout = opts.timeout;
        let here = match launch.world_size > 1 {
            true => launch.local_world_size,
            false => strategy.world(),
        };
        train.threads_per_rank = opts
            .threads_per_rank
            .unwrap_or_else(|| host_threads_per_rank(here));
        if let Some(r) = &opts.resume {
            train.first_step = r.index.step;
            train.restore = Some(Arc::clone(r));
        }
        let record = RunRecord {
            model: plan.inputs.model.clone(),
            model_hash,
            precision: opts.precision,
            optimizer: opts.optimizer,
            seed: opts.seed,
            plan: serde_json::to_value(&plan).unwrap_or_default(),
        };
        Ok(Session {
            tokens_per_step: strategy.global_batch() * training.task.throughput_unit().0,
            plan,
            strategy,
            training,
            programs,
            data,
            opts: train,
            launch,
            rendezvous_wait: opts.rendezvous_wait,
            save: opts.save,
            record,
        })
    }

    /// The step the run starts at (past a resumed checkpoint's).
    pub fn first_step(&self) -> usize {
        self.opts.first_step
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The programs, one per rank: lowered once, for training and for a
    /// simulation to set next to the measurement.
    pub fn programs(&self) -> &[Program] {
        &self.programs
    }

    /// The training graph every rank runs pieces of.
    pub fn training(&self) -> &TrainingGraph {
        &self.training
    }

    /// The part of the plan lowering read.
    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// The precision of the programs' host values.
    pub fn precision(&self) -> Precision {
        self.opts.precision
    }

    /// Threads each rank splits its large products over.
    pub fn threads_per_rank(&self) -> usize {
        self.opts.threads_per_rank
    }

    /// The data every step reads.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// The options every rank trains with.
    pub fn train_options(&self) -> &TrainOptions {
        &self.opts
    }

    /// What a step's throughput counts (tokens, or samples: see
    /// [`autopar_lower::Task::throughput_unit`]).
    pub fn tokens_per_step(&self) -> usize {
        self.tokens_per_step
    }

    /// Whether this process runs one rank of a launched job.
    pub fn launched(&self) -> bool {
        self.launch.world_size > 1
    }

    /// Trains on `runner`, calling `on_step` after each step (on the one
    /// process, or on rank 0 of a launched run).
    pub fn run<R: Runner>(
        &self,
        runner: &R,
        on_step: &(dyn Fn(&StepReport) + Sync),
    ) -> Result<Outcome<R::Details>, SessionError> {
        let mut opts = self.opts.clone();
        let saver = self.save.clone().map(|policy| {
            let local: Vec<usize> = match self.launched() {
                true => vec![self.launch.rank],
                false => (0..self.programs.len()).collect(),
            };
            // Other processes may still be finishing the step they save.
            let wait = self.opts.timeout.max(self.rendezvous_wait);
            checkpoint::Saver::start(
                policy,
                self.record.clone(),
                &self.training,
                &self.programs,
                local,
                self.opts.first_step,
                self.opts.steps,
                wait,
            )
            .map(Arc::new)
        });
        opts.saver = saver.transpose()?;
        let work = Work {
            training: &self.training,
            programs: &self.programs,
            data: &self.data,
            opts: &opts,
            progress: on_step,
        };
        let (finished, rank_trace) = if self.launched() {
            let endpoint = connect(&self.launch, self.rendezvous_wait, self.opts.timeout)
                .map_err(SessionError::Connect)?;
            let mine = runner.train_rank(work, endpoint)?;
            (mine.report, Some(mine.trace))
        } else {
            (Some(runner.train_all(work)?), None)
        };
        if let Some(saver) = &opts.saver {
            saver.finish()?;
        }
        let report = finished.map(|(train, details)| self.report(train, details));
        Ok(Outcome { report, rank_trace })
    }

    /// The report of a finished run.
    fn report<D>(&self, train: TrainReport, details: D) -> SessionReport<D> {
        SessionReport {
            losses: train.steps.iter().map(|s| s.loss).collect(),
            step_times_s: train.steps.iter().map(|s| s.seconds).collect(),
            per_rank: train
                .ranks
                .iter()
                .zip(&self.programs)
                .map(|(r, p)| RankRun {
                    rank: r.rank,
                    bytes_sent: r.bytes_sent,
                    peak_activation_bytes: r.peak_activation_bytes,
                    instructions: p.instructions.len(),
                })
                .collect(),
            trace: train.trace,
            details,
        }
    }
}

/// Whether checkpoint `r` can continue a run of the model hashed
/// `model_hash` with `opts`: the same model, precision and kind of
/// optimizer, and steps left to run.
fn resumable(r: &Restored, model_hash: &str, opts: &RunOptions) -> Result<(), SessionError> {
    let refuse = |message: String| SessionError::Resume {
        dir: r.dir.display().to_string(),
        message,
    };
    let index = &r.index;
    if index.model_hash != model_hash {
        return Err(refuse(
            "it is of another model (its parameters' names, types or shapes differ)".into(),
        ));
    }
    let precision = checkpoint::dtype_name(opts.precision);
    if index.precision != precision {
        return Err(refuse(format!(
            "it holds {} values; run with --precision {}",
            index.precision,
            index.precision.to_lowercase()
        )));
    }
    if index.optimizer.slot_names() != opts.optimizer.slot_names() {
        return Err(refuse(format!(
            "it holds optimizer state {:?}; this run's optimizer keeps {:?}",
            index.optimizer.slot_names(),
            opts.optimizer.slot_names()
        )));
    }
    if index.step >= opts.steps {
        return Err(refuse(format!(
            "it completed step {}; --steps {} (the total count) leaves nothing to run",
            index.step, opts.steps
        )));
    }
    Ok(())
}

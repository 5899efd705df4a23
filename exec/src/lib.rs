//! Running per-rank programs: one thread per rank, each interpreting its
//! [`Program`] over a [`Backend`] (the reference kernels on the host in
//! `autopar-cpu`; `autopar-cuda` on a GPU), talking to the others through
//! in-process collectives that run the real algorithms and count bytes. A
//! rank that fails or waits too long aborts every rank, so a broken plan
//! ends with an error naming the rank and instruction, never a hang. The
//! training pieces the interpreter runs (optimizer, data, initialization)
//! are in [`train`], its per-instruction time spans in [`trace`].
//!
//! Architecture invariant: nothing here names a device or a kernel; every
//! tensor operation goes through the [`Backend`] trait, which the backend
//! crates implement.

mod backend;
pub mod buckets;
pub mod checkpoint;
mod distributed;
mod overlap;
mod rank;
pub mod session;
mod slices;
pub mod trace;
pub mod train;
mod zero_parts;

pub use backend::{Backend, BackendError, DeviceCollectives, Order};
pub use distributed::{train_rank_on, RankResult};

use crate::train::{Data, Optimizer};
use autopar_comm::collective::{fabric, CommError};
use autopar_ir::interp::Precision;
use autopar_ir::Value;
use autopar_lower::{Instr, Program, TrainingGraph};
use rank::{RankRun, StepDone};
use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How to train.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub steps: usize,
    /// How long a rank waits for a peer before declaring a deadlock.
    pub timeout: Duration,
    /// Keep every parameter's gradient of the first step (for checks).
    pub record_grads: bool,
    /// Test hook: make one rank fail at one instruction.
    pub fault: Option<Fault>,
    /// Record every instruction's time span ([`TrainReport::trace`]).
    pub trace: bool,
    /// Run data-parallel gradient reductions and parameter gathers on a
    /// communication worker beside each rank's compute thread (default);
    /// off, they run inline where the program issues them.
    pub overlap_comm: bool,
    /// The step the run starts at (a resumed run's: the steps its
    /// checkpoint completed); `steps` counts from zero regardless.
    pub first_step: usize,
    /// Weights and optimizer state to start from instead of the graph's.
    pub restore: Option<Arc<checkpoint::Restored>>,
    /// Where and when ranks save checkpoints.
    pub saver: Option<Arc<checkpoint::Saver>>,
    /// Threads each rank splits its large products
    /// (`autopar_ir::op::split_ways`) and its attention
    /// (`autopar_ir::op::attention_ways`) over; 1 runs every kernel on the
    /// rank's own thread.
    pub threads_per_rank: usize,
}

impl TrainOptions {
    /// `steps` steps of `optimizer` in `precision`, 60 s deadlock timeout.
    pub fn new(precision: Precision, optimizer: Optimizer, steps: usize) -> TrainOptions {
        TrainOptions {
            precision,
            optimizer,
            steps,
            timeout: Duration::from_secs(60),
            record_grads: false,
            fault: None,
            trace: false,
            overlap_comm: true,
            first_step: 0,
            restore: None,
            saver: None,
            threads_per_rank: 1,
        }
    }

    /// The steps this run executes.
    pub fn step_range(&self) -> std::ops::Range<usize> {
        self.first_step..self.steps.max(self.first_step)
    }
}

/// An injected failure: `rank` fails when it reaches `instruction` of step `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub rank: usize,
    pub step: usize,
    pub instruction: usize,
}

/// One finished step, summed over ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    pub step: usize,
    /// Mean token cross-entropy over the global batch.
    pub loss: f64,
    /// Wall time of the slowest rank.
    pub seconds: f64,
}

/// What one rank did over the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RankReport {
    pub rank: usize,
    pub bytes_sent: u64,
    /// Largest total size of micro-batch buffers alive at once.
    pub peak_activation_bytes: u64,
    /// Most micro-batches with live buffers at once (pipeline depth in use).
    pub peak_micro_batches: usize,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct TrainReport {
    pub steps: Vec<StepReport>,
    pub ranks: Vec<RankReport>,
    /// First step's summed gradient of each parameter (when recorded).
    pub gradients: BTreeMap<String, Value>,
    /// Every rank's timed instructions and memory samples (when traced).
    pub trace: Vec<crate::trace::TraceEvent>,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("rank {rank}, step {step}, instruction {index} ({what}): {message}")]
    Rank {
        rank: usize,
        step: usize,
        index: usize,
        what: String,
        message: String,
    },
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("{0} programs for {1} ranks")]
    Ranks(usize, usize),
    /// The backend could not start (no device, missing library, ...).
    #[error("{0}")]
    Backend(String),
    /// The run asked for something this way of running does not do.
    #[error("{0}")]
    Unsupported(String),
}

/// `autopar_cpu::train` with each rank's tensors and kernels on the backend that
/// `backend` makes for that rank (called on the rank's own thread).
pub fn train_on<B: Backend>(
    t: &TrainingGraph,
    programs: &[Program],
    data: &Data,
    opts: &TrainOptions,
    progress: &(dyn Fn(&StepReport) + Sync),
    backend: &(dyn Fn(usize) -> Result<B, String> + Sync),
) -> Result<TrainReport, ExecError> {
    let world = programs.len();
    if programs.iter().enumerate().any(|(i, p)| p.rank != i) {
        return Err(ExecError::Ranks(world, world));
    }
    let endpoints = fabric(world, opts.timeout);
    let reporters = loss_reporters(programs);
    let (tx, rx) = mpsc::channel::<StepDone>();
    let shared = Arc::new(t.clone());
    let epoch = Instant::now();
    let results: Vec<Result<rank::RankOutcome, (ExecError, Instant)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = programs
            .iter()
            .zip(endpoints)
            .map(|(program, endpoint)| {
                let tx = tx.clone();
                let t = shared.clone();
                scope.spawn(move || {
                    let dev = match backend(program.rank) {
                        Ok(dev) => dev,
                        Err(message) => {
                            let e = ExecError::Rank {
                                rank: program.rank,
                                step: 0,
                                index: 0,
                                what: "starting the backend".into(),
                                message,
                            };
                            endpoint.abort(&e.to_string());
                            return Err((e, Instant::now()));
                        }
                    };
                    let mut run = RankRun::new(dev, &t, program, endpoint, data, opts, epoch);
                    run.run(&tx).map_err(|e| {
                        run.abort(&e.to_string());
                        (e, Instant::now())
                    })
                })
            })
            .collect();
        drop(tx);
        collect_steps(&rx, reporters, opts.step_range(), progress);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("a rank thread panicked")))
            .collect()
    });
    let mut outcomes = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(o) => outcomes.push(o),
            Err(e) => errors.push(e),
        }
    }
    // The rank that failed first explains the failure; the others were
    // aborted by it, or timed out later waiting for it.
    let aborted = |e: &ExecError| matches!(e, ExecError::Comm(CommError::Aborted { .. }));
    errors.sort_by_key(|(e, at)| (aborted(e), *at));
    if let Some((e, _)) = errors.into_iter().next() {
        return Err(e);
    }
    Ok(summarise(t, outcomes, opts.step_range()))
}

/// How many ranks report a loss each step (the last pipeline stage's).
fn loss_reporters(programs: &[Program]) -> usize {
    programs
        .iter()
        .filter(|p| {
            p.instructions
                .iter()
                .any(|i| matches!(i, Instr::ReportLoss { .. }))
        })
        .count()
}

/// Sums each step's losses as ranks finish it and reports finished steps in
/// order; returns the steps reported.
fn collect_steps(
    rx: &mpsc::Receiver<StepDone>,
    reporters: usize,
    steps: std::ops::Range<usize>,
    progress: &(dyn Fn(&StepReport) + Sync),
) -> Vec<StepReport> {
    let mut reported = Vec::new();
    // Step → (ranks that reported a loss, loss sum, slowest rank's seconds).
    let mut pending: BTreeMap<usize, (usize, f64, f64)> = BTreeMap::new();
    let mut next = steps.start;
    while let Ok(done) = rx.recv() {
        let e = pending.entry(done.step).or_insert((0, 0.0, 0.0));
        if done.reported_loss {
            e.0 += 1;
            e.1 += done.loss;
        }
        e.2 = e.2.max(done.seconds);
        while next < steps.end && reporters > 0 && pending.get(&next).is_some_and(|e| e.0 == reporters) {
            let (_, loss, seconds) = pending[&next];
            let report = StepReport {
                step: next,
                loss,
                seconds,
            };
            progress(&report);
            reported.push(report);
            next += 1;
        }
    }
    reported
}

fn summarise(
    t: &TrainingGraph,
    outcomes: Vec<rank::RankOutcome>,
    steps: std::ops::Range<usize>,
) -> TrainReport {
    let mut reports: Vec<StepReport> = steps
        .map(|step| StepReport {
            step,
            loss: 0.0,
            seconds: 0.0,
        })
        .collect();
    // Parameter → tensor-parallel index → that slice's ZeRO pieces.
    type Pieces = Vec<(Option<autopar_lower::Shard>, Value)>;
    let mut gradients: BTreeMap<String, BTreeMap<usize, Pieces>> = BTreeMap::new();
    let mut ranks = Vec::new();
    let mut events = Vec::new();
    for mut o in outcomes {
        events.append(&mut o.trace);
        for (step, (loss, seconds)) in o.steps.iter().enumerate() {
            reports[step].loss += loss;
            reports[step].seconds = reports[step].seconds.max(*seconds);
        }
        for piece in o.gradients {
            gradients
                .entry(piece.param)
                .or_default()
                .entry(piece.slice)
                .or_default()
                .push((piece.shard, piece.value));
        }
        ranks.push(o.report);
    }
    TrainReport {
        steps: reports,
        ranks,
        trace: events,
        gradients: gradients
            .into_iter()
            .filter_map(|(p, by_tp)| whole_gradient(t, &p, &by_tp).map(|v| (p, v)))
            .collect(),
    }
}

/// A parameter's whole gradient, flattened, from its recorded pieces.
fn whole_gradient(
    t: &TrainingGraph,
    param: &str,
    by_tp: &BTreeMap<usize, Vec<(Option<autopar_lower::Shard>, Value)>>,
) -> Option<Value> {
    let Some(slice) = t.slices.get(param).or_else(|| t.expert_slices.get(param)) else {
        return zero_parts::assemble(by_tp.values().next()?);
    };
    let local = t
        .graph
        .tensors()
        .find(|(_, x)| x.name == param)?
        .1
        .ty
        .shape
        .clone();
    let dims: Vec<usize> = local.0.iter().map(|d| d.fixed().unwrap_or(1)).collect();
    let pieces = by_tp
        .values()
        .map(|p| {
            let mut v = zero_parts::assemble(p)?;
            v.shape = dims.clone();
            Some(v)
        })
        .collect::<Option<Vec<_>>>()?;
    let mut whole = slices::join(&pieces, slice.axis, slice.blocks);
    whole.shape = vec![whole.numel()];
    Some(whole)
}

//! One rank per process: the same rank interpreter, with its peers in other
//! processes (on other GPUs or hosts) reached through a TCP
//! [`Endpoint`](autopar_comm::collective::connect). Every rank sends its step
//! results and totals to rank 0 as uncounted bookkeeping, so rank 0 reports
//! the run as a one-process run would.

use super::rank::{RankRun, StepDone};
use super::{
    collect_steps, loss_reporters, Backend, ExecError, RankReport, StepReport, TrainOptions, TrainReport,
};
use crate::trace::TraceEvent;
use crate::train::Data;
use autopar_comm::collective::{Buffer, CommError, Endpoint};
use autopar_lower::{Program, TrainingGraph};
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Tag of a rank's per-step result sent to rank 0.
const STEP_TAG: &str = "autopar/step";
/// Tag of a rank's totals sent to rank 0 after its last step.
const TOTALS_TAG: &str = "autopar/totals";
/// How many deadlock timeouts a rank waits for its peers to finish a step or
/// the run: bookkeeping waits span whole steps, not one message.
const PATIENCE: u32 = 20;

/// What one rank of a run with a rank per process ends with.
#[derive(Debug, Clone)]
pub struct RankResult<R> {
    /// The whole run's report: on rank 0 only.
    pub report: Option<R>,
    /// This rank's timed instructions and memory samples (when traced),
    /// timed from this process's start of the run.
    pub trace: Vec<TraceEvent>,
}

/// Runs rank `endpoint.rank()` of `programs` in this process on `backend`;
/// the other ranks run in their own processes and are reached through
/// `endpoint`. Rank 0 gets the run's report (each step's loss and slowest
/// rank's time, every rank's bytes and peaks) and calls `progress` after
/// each step. Every rank keeps its own trace; recorded gradients would need
/// every rank's pieces in one place, so this way of running refuses them.
pub fn train_rank_on<B: Backend>(
    t: &TrainingGraph,
    programs: &[Program],
    endpoint: Endpoint,
    data: &Data,
    opts: &TrainOptions,
    progress: &(dyn Fn(&StepReport) + Sync),
    backend: B,
) -> Result<RankResult<TrainReport>, ExecError> {
    let (rank, world) = (endpoint.rank(), endpoint.world());
    if programs.len() != world || programs.iter().enumerate().any(|(i, p)| p.rank != i) {
        return Err(ExecError::Ranks(programs.len(), world));
    }
    if opts.record_grads {
        return Err(ExecError::Unsupported(
            "recording gradients needs every rank in one process; run the plan without a launcher".into(),
        ));
    }
    let patience = opts.timeout * PATIENCE;
    let (tx, rx) = mpsc::channel::<StepDone>();
    let (run, steps) = std::thread::scope(|scope| {
        let steps = if rank == 0 {
            for peer in 1..world {
                let (tx, endpoint) = (tx.clone(), endpoint.clone());
                scope.spawn(move || forward_steps(&endpoint, peer, opts.step_range().len(), patience, &tx));
            }
            let reporters = loss_reporters(programs);
            Some(scope.spawn(move || collect_steps(&rx, reporters, opts.step_range(), progress)))
        } else {
            let endpoint = endpoint.clone();
            scope.spawn(move || {
                for done in rx {
                    if endpoint
                        .notify(0, STEP_TAG, encode_step(&done), "step report")
                        .is_err()
                    {
                        break;
                    }
                }
            });
            None
        };
        let mut run = RankRun::new(
            backend,
            t,
            &programs[rank],
            endpoint.clone(),
            data,
            opts,
            Instant::now(),
        );
        let outcome = run.run(&tx).inspect_err(|e| run.abort(&e.to_string()));
        drop(tx);
        let steps = steps.map(|h| h.join().unwrap_or_else(|_| panic!("the step collector panicked")));
        (outcome, steps)
    });
    let outcome = run?;
    let own = outcome.report;
    let report = match steps {
        Some(steps) => {
            let mut ranks = vec![own];
            for peer in 1..world {
                ranks.push(decode_totals(
                    peer,
                    &patient_recv(&endpoint, peer, TOTALS_TAG, patience)?,
                )?);
            }
            Some(TrainReport {
                steps,
                ranks,
                gradients: BTreeMap::new(),
                trace: Vec::new(),
            })
        }
        None => {
            endpoint.notify(0, TOTALS_TAG, encode_totals(&own), "rank totals")?;
            None
        }
    };
    endpoint.close(patience)?;
    Ok(RankResult {
        report,
        trace: outcome.trace,
    })
}

/// Rank 0: passes `peer`'s step results to the collector as they come.
fn forward_steps(
    endpoint: &Endpoint,
    peer: usize,
    steps: usize,
    patience: Duration,
    tx: &mpsc::Sender<StepDone>,
) {
    for _ in 0..steps {
        let Ok(done) = patient_recv(endpoint, peer, STEP_TAG, patience).and_then(|b| decode_step(peer, &b))
        else {
            return;
        };
        if tx.send(done).is_err() {
            return;
        }
    }
}

/// Receives bookkeeping from `peer`, which may be busy for longer than one
/// deadlock timeout (a whole step): waits up to `patience`, stopping at once
/// if the run is aborted.
fn patient_recv(
    endpoint: &Endpoint,
    peer: usize,
    tag: &str,
    patience: Duration,
) -> Result<Buffer, ExecError> {
    let deadline = Instant::now() + patience;
    loop {
        match endpoint.recv(peer, tag, tag) {
            Err(CommError::Timeout { .. }) if Instant::now() < deadline => continue,
            other => return other.map_err(ExecError::Comm),
        }
    }
}

fn encode_step(done: &StepDone) -> Buffer {
    let reported = if done.reported_loss { 1.0 } else { 0.0 };
    Buffer::F64(vec![done.step as f64, done.loss, reported, done.seconds])
}

fn decode_step(peer: usize, b: &Buffer) -> Result<StepDone, ExecError> {
    match b {
        Buffer::F64(v) if v.len() == 4 => Ok(StepDone {
            step: v[0] as usize,
            loss: v[1],
            reported_loss: v[2] != 0.0,
            seconds: v[3],
        }),
        _ => Err(malformed(peer, "step report")),
    }
}

fn encode_totals(r: &RankReport) -> Buffer {
    // Exact: byte counts stay far below 2^53.
    Buffer::F64(vec![
        r.bytes_sent as f64,
        r.peak_activation_bytes as f64,
        r.peak_micro_batches as f64,
    ])
}

fn decode_totals(peer: usize, b: &Buffer) -> Result<RankReport, ExecError> {
    match b {
        Buffer::F64(v) if v.len() == 3 => Ok(RankReport {
            rank: peer,
            bytes_sent: v[0] as u64,
            peak_activation_bytes: v[1] as u64,
            peak_micro_batches: v[2] as usize,
        }),
        _ => Err(malformed(peer, "rank totals")),
    }
}

fn malformed(peer: usize, what: &str) -> ExecError {
    ExecError::Unsupported(format!(
        "rank {peer} sent a malformed {what}; are all ranks running the same autopar build?"
    ))
}

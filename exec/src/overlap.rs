//! A rank's communication stream: data-parallel gradient reductions and
//! parameter gathers run on a worker thread while the rank's compute thread
//! goes on with the backward pass, as a GPU's communication stream overlaps
//! it. The compute thread waits for a result only where it reads it.
//! [`CommStream::inline`] runs each job where it is issued instead, to
//! measure what the overlap gains (or to rule it out while debugging).
//!
//! Jobs run one at a time in issue order, which is program order on every
//! rank, so the members of a group meet in each collective as they would
//! inline; the collectives are the same algorithms over the same endpoint,
//! so results are bitwise those of running them inline.

use autopar_comm::collective::{Algorithm, Buffer, CommError, Endpoint, Feedback, Half};
use autopar_cost_models::GradCompression;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

/// One collective to run off the compute thread.
pub(super) struct Job {
    pub kind: JobKind,
    pub group: Vec<usize>,
    pub data: Buffer,
    pub tag: String,
    /// The instruction, for errors and the trace.
    pub what: String,
    /// The gradients' `(rows, cols)` views one after another, for PowerSGD.
    pub shapes: Vec<(usize, usize)>,
    /// The bucket's name, under which a lossy compression keeps what a
    /// rank did not send from step to step.
    pub bucket: String,
}

/// Which collective a [`Job`] runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum JobKind {
    /// Compressed as the plan says, if at all.
    AllReduce(Algorithm, Option<GradCompression>),
    ReduceScatter(Option<GradCompression>),
    AllGather,
}

/// A finished job: its result and when it ran.
pub(super) struct Done<T> {
    pub then: T,
    pub result: Result<Buffer, CommError>,
    pub began: Instant,
    pub ended: Instant,
}

/// A job's result and when it ran.
type Outcome = (Result<Buffer, CommError>, Instant, Instant);

/// Where jobs run.
enum Runner {
    /// On a worker thread; results come back in issue order.
    Worker {
        jobs: Option<mpsc::Sender<Job>>,
        results: mpsc::Receiver<Outcome>,
        handle: Option<JoinHandle<()>>,
    },
    /// On the issuing thread, at once.
    Inline {
        endpoint: Endpoint,
        results: VecDeque<Outcome>,
        feedback: Kept,
    },
}

/// The jobs issued whose results were not taken yet, each with `T`: what
/// the compute thread does with the result.
pub(super) struct CommStream<T> {
    rank: usize,
    runner: Runner,
    /// Issued jobs in order, with the parameters they concern.
    pending: VecDeque<(Vec<String>, T)>,
    /// By parameter: its pending jobs (compute reads ask for every weight).
    waiting: HashMap<String, usize>,
}

impl<T> CommStream<T> {
    /// Starts the worker on its own clone of `endpoint`.
    pub fn new(endpoint: Endpoint) -> CommStream<T> {
        let rank = endpoint.rank();
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (reply, results) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            let mut feedback = Kept::new();
            for job in inbox {
                if reply.send(run(&endpoint, job, &mut feedback)).is_err() {
                    break;
                }
            }
        });
        CommStream {
            rank,
            runner: Runner::Worker {
                jobs: Some(jobs),
                results,
                handle: Some(handle),
            },
            pending: VecDeque::new(),
            waiting: HashMap::new(),
        }
    }

    /// A stream that runs each job as it is issued, on the caller's thread.
    pub fn inline(endpoint: Endpoint) -> CommStream<T> {
        CommStream {
            rank: endpoint.rank(),
            runner: Runner::Inline {
                endpoint,
                results: VecDeque::new(),
                feedback: Kept::new(),
            },
            pending: VecDeque::new(),
            waiting: HashMap::new(),
        }
    }

    /// Queues `job` on `params` (a bucket's, or one); `then` comes back
    /// with its result.
    pub fn issue(&mut self, params: Vec<String>, job: Job, then: T) {
        for p in &params {
            *self.waiting.entry(p.clone()).or_insert(0) += 1;
        }
        self.pending.push_back((params, then));
        match &mut self.runner {
            // A worker that stopped leaves the job to fail in `next`.
            Runner::Worker { jobs: Some(jobs), .. } => drop(jobs.send(job)),
            Runner::Worker { jobs: None, .. } => {}
            Runner::Inline {
                endpoint,
                results,
                feedback,
            } => results.push_back(run(endpoint, job, feedback)),
        }
    }

    /// Whether a job for `param` is still pending.
    pub fn is_pending(&self, param: &str) -> bool {
        self.waiting.contains_key(param)
    }

    /// Whether any job is pending.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Waits for the oldest pending job's result (jobs finish in order).
    pub fn next(&mut self) -> Option<Done<T>> {
        let (params, then) = self.pending.pop_front()?;
        for p in params {
            if let Entry::Occupied(mut left) = self.waiting.entry(p) {
                *left.get_mut() -= 1;
                if *left.get() == 0 {
                    left.remove();
                }
            }
        }
        let outcome = match &mut self.runner {
            Runner::Worker { results, .. } => results.recv().ok(),
            Runner::Inline { results, .. } => results.pop_front(),
        };
        let (result, began, ended) = outcome.unwrap_or_else(|| {
            let now = Instant::now();
            (Err(self.worker_gone()), now, now)
        });
        Some(Done {
            then,
            result,
            began,
            ended,
        })
    }

    /// The error a job gets when the worker thread is gone (it panicked).
    fn worker_gone(&self) -> CommError {
        CommError::Aborted {
            rank: self.rank,
            by: self.rank,
            reason: "its communication worker stopped unexpectedly".into(),
            what: "waiting for a gradient or parameter collective".into(),
        }
    }
}

impl<T> Drop for CommStream<T> {
    /// Stops the worker after the jobs already issued.
    fn drop(&mut self) {
        if let Runner::Worker { jobs, handle, .. } = &mut self.runner {
            *jobs = None;
            if let Some(handle) = handle.take() {
                let _ = handle.join();
            }
        }
    }
}

/// Runs `job`, timed. A failed collective aborts the fabric at once, so
/// peers stop waiting.
fn run(endpoint: &Endpoint, job: Job, feedback: &mut Kept) -> Outcome {
    let began = Instant::now();
    let result = collective(endpoint, job, feedback);
    if let Err(e) = &result {
        endpoint.abort(&e.to_string());
    }
    (result, began, Instant::now())
}

/// What a lossy compression kept back, by bucket.
type Kept = HashMap<String, Feedback>;

fn collective(endpoint: &Endpoint, job: Job, feedback: &mut Kept) -> Result<Buffer, CommError> {
    let Job {
        kind,
        group,
        mut data,
        tag,
        what,
        shapes,
        bucket,
    } = job;
    match kind {
        JobKind::AllReduce(algorithm, None) => endpoint
            .all_reduce(&group, &mut data, algorithm, &tag, &what)
            .map(|()| data),
        JobKind::AllReduce(algorithm, Some(c)) => {
            let state = feedback.entry(bucket).or_default();
            match (Half::of(c), c) {
                (Some(wire), _) => endpoint.all_reduce_narrow(&group, &mut data, wire, &tag, &what),
                (None, _) if state.warming(c.warmup()) => {
                    endpoint.all_reduce(&group, &mut data, algorithm, &tag, &what)
                }
                (None, GradCompression::PowerSgd { rank, .. }) => {
                    endpoint.all_reduce_powersgd(&group, &mut data, &shapes, rank, state, &tag, &what)
                }
                (None, _) => {
                    let kept = c.kept(data.len());
                    endpoint.all_reduce_topk(&group, &mut data, kept, state, &tag, &what)
                }
            }
            .map(|()| data)
        }
        JobKind::ReduceScatter(None) => endpoint.reduce_scatter(&group, &data, &tag, &what),
        JobKind::ReduceScatter(Some(c)) => match Half::of(c) {
            Some(wire) => endpoint.reduce_scatter_narrow(&group, &data, wire, &tag, &what),
            // Lowering refuses a lossy compression under ZeRO.
            None => Err(CommError::Unsupported {
                rank: endpoint.rank(),
                what,
                collective: autopar_comm::collective::Collective::ReduceScatter,
                algorithm: Algorithm::Ring,
            }),
        },
        JobKind::AllGather => endpoint.all_gather(&group, &data, &tag, &what),
    }
}

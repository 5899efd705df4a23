//! One rank's interpreter: buffers by name and micro-batch, weights (whole
//! or a ZeRO shard), optimizer state, and the step loop over the program;
//! each instruction family lives in a file of its own.

mod checkpoint;
mod data_parallel;
mod error;
mod execute;
mod optimizer;
mod tensor_parallel;
mod tensors;

use super::backend::{Backend, BackendError, DeviceCollectives};
use super::overlap::CommStream;
use super::slices;
use super::{ExecError, TrainOptions};
use crate::checkpoint::layout;
use crate::trace::{stream_of, Stream, TraceEvent};
use crate::train::Data;
use crate::zero_parts::shard_of;
use autopar_comm::collective::Endpoint;
use autopar_ir::interp::widen;
use autopar_ir::{NodeIndex, TensorId, Value};
use autopar_lower::blocking::continues_transfers;
use autopar_lower::{Buf, Instr, Program, Shard, TrainingGraph};
use checkpoint::restored_weight;
use data_parallel::Landing;
pub(super) use error::{Failure, RankError};
use execute::At;
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::time::Instant;

/// Sent to the driver when a rank finishes a step.
pub(super) struct StepDone {
    pub step: usize,
    pub loss: f64,
    pub reported_loss: bool,
    pub seconds: f64,
}

/// What a rank hands back at the end.
pub(super) struct RankOutcome {
    pub steps: Vec<(f64, f64)>,
    pub report: super::RankReport,
    pub gradients: Vec<GradPiece>,
    pub trace: Vec<TraceEvent>,
}

/// A recorded gradient: of this rank's slice (`slice`: its tensor- or
/// expert-parallel index) and ZeRO shard (`shard`) of a parameter, flattened.
pub(super) struct GradPiece {
    pub param: String,
    pub slice: usize,
    pub shard: Option<Shard>,
    pub value: Value,
}

pub(super) struct RankRun<'a, B: Backend> {
    dev: B,
    t: &'a TrainingGraph,
    program: &'a Program,
    ep: Endpoint,
    data: &'a Data,
    opts: &'a TrainOptions,
    nodes: HashMap<&'a str, NodeIndex>,
    tensors: HashMap<&'a str, TensorId>,
    grad_tensor: HashMap<&'a str, &'a str>,
    weights: HashMap<String, B::Tensor>,
    shards: HashMap<String, Shard>,
    states: HashMap<String, B::State>,
    constants: HashMap<TensorId, B::Tensor>,
    bufs: HashMap<Buf, B::Tensor>,
    grads: HashMap<String, B::Tensor>,
    live_bytes: u64,
    peak_bytes: u64,
    peak_micro_batches: usize,
    /// Live buffers per micro-batch (micro-batches with none are absent).
    mb_buffers: HashMap<usize, usize>,
    gathers: HashMap<String, usize>,
    /// When the run began on every rank (trace times count from it).
    epoch: Instant,
    trace: Vec<TraceEvent>,
    /// Live bytes at the last memory sample.
    traced_bytes: Option<u64>,
    /// Weights as initialised on the host, until [`RankRun::hold_weights`].
    initial: Vec<(String, Value)>,
    /// Gradient reductions and parameter gathers in flight (during `run`).
    comm: Option<CommStream<Landing>>,
    /// Parameters whose gradient or weight a backend collective issued
    /// [`Order::Overlapped`] reads or writes, until the backend joins them.
    on_device: HashSet<String>,
    /// Gradient shards those collectives make, added into the step's
    /// gradient shards once joined.
    landed: Vec<(String, B::Tensor)>,
}

impl<'a, B: Backend> RankRun<'a, B> {
    pub fn new(
        dev: B,
        t: &'a TrainingGraph,
        program: &'a Program,
        ep: Endpoint,
        data: &'a Data,
        opts: &'a TrainOptions,
        epoch: Instant,
    ) -> RankRun<'a, B> {
        let g = &t.graph;
        let tensors: HashMap<&str, TensorId> = g.tensors().map(|(id, t)| (t.name.as_str(), id)).collect();
        let mut initial = Vec::new();
        let mut shards = HashMap::new();
        for slot in &program.params {
            let Some(data) = tensors
                .get(slot.name.as_str())
                .and_then(|&id| g.tensor(id).data.as_ref())
            else {
                continue;
            };
            let mut full = match opts
                .restore
                .as_ref()
                .and_then(|r| restored_weight(t, r, &slot.name))
            {
                Some(saved) => saved.clone(),
                None => widen((**data).clone(), opts.precision),
            };
            if let Some((slice, index, parts)) = slice_of(t, &slot.name, program.coord) {
                full = slices::take(&full, slice.axis, slice.blocks, index, parts);
            }
            let stored = match slot.stored_shard {
                Some(shard) => {
                    shards.insert(slot.name.clone(), shard);
                    shard_of(&full, shard)
                }
                None => full,
            };
            initial.push((slot.name.clone(), stored));
        }
        RankRun {
            dev,
            t,
            program,
            ep,
            data,
            opts,
            nodes: g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect(),
            tensors,
            grad_tensor: t
                .gradients
                .iter()
                .map(|(p, gr)| (p.as_str(), gr.as_str()))
                .collect(),
            weights: HashMap::new(),
            shards,
            states: HashMap::new(),
            constants: HashMap::new(),
            bufs: HashMap::new(),
            grads: HashMap::new(),
            live_bytes: 0,
            peak_bytes: 0,
            peak_micro_batches: 0,
            mb_buffers: HashMap::new(),
            gathers: HashMap::new(),
            epoch,
            trace: Vec::new(),
            traced_bytes: None,
            initial,
            comm: None,
            on_device: HashSet::new(),
            landed: Vec::new(),
        }
    }

    /// Moves the initial weights onto the backend.
    fn hold_weights(&mut self) -> Result<(), ExecError> {
        for (name, v) in std::mem::take(&mut self.initial) {
            let held = self.dev.upload_weight(v).map_err(|e| ExecError::Rank {
                rank: self.program.rank,
                step: 0,
                index: 0,
                what: format!("holding weight '{name}'"),
                message: e.to_string(),
            })?;
            self.weights.insert(name, held);
        }
        Ok(())
    }

    pub fn abort(&self, reason: &str) {
        self.ep.abort(reason);
    }

    pub fn run(&mut self, tx: &mpsc::Sender<StepDone>) -> Result<RankOutcome, ExecError> {
        autopar_ir::op::set_kernel_threads(self.opts.threads_per_rank);
        self.hold_weights()?;
        self.comm = Some(if self.opts.overlap_comm {
            CommStream::new(self.ep.clone())
        } else {
            CommStream::inline(self.ep.clone())
        });
        let outcome = self.steps(tx);
        if let Err(e) = &outcome {
            // Ends the worker's waits at once, here and on every peer.
            self.ep.abort(&e.to_string());
        }
        self.comm = None;
        outcome
    }

    fn steps(&mut self, tx: &mpsc::Sender<StepDone>) -> Result<RankOutcome, ExecError> {
        let mut steps = Vec::new();
        let mut gradients = Vec::new();
        for step in self.opts.step_range() {
            let start = Instant::now();
            let mut loss = 0.0;
            let mut reported = false;
            self.gathers.clear();
            for (index, instr) in self.program.instructions.iter().enumerate() {
                let fail = |message: String| ExecError::Rank {
                    rank: self.program.rank,
                    step,
                    index,
                    what: instr.describe(),
                    message,
                };
                if self
                    .opts
                    .fault
                    .is_some_and(|f| f.rank == self.program.rank && f.step == step && f.instruction == index)
                {
                    return Err(fail(RankError::Injected.to_string()));
                }
                // Only communication names its instruction in errors from peers.
                let what = match stream_of(instr) {
                    Some(Stream::Communication) => {
                        format!("step {step} instruction {index} ({})", instr.describe())
                    }
                    _ => String::new(),
                };
                let began = Instant::now();
                let result = match continues_transfers(instr) {
                    true => Ok(()),
                    false => on_device(&mut self.dev, |d| d.flush_transfers()).map(drop),
                }
                .and_then(|()| self.execute(instr, At { step, what: &what }, &mut gradients));
                // Overlapped collectives are traced when they finish.
                if self.opts.trace && !instr.overlaps_compute() {
                    self.record(instr, step, began);
                }
                match result {
                    Ok(Some(l)) => {
                        loss += l;
                        reported = true;
                    }
                    Ok(None) => {}
                    Err(Failure::Comm(e)) => return Err(ExecError::Comm(e)),
                    Err(Failure::Rank(e)) => return Err(fail(e.to_string())),
                }
            }
            let end = |message: String| ExecError::Rank {
                rank: self.program.rank,
                step,
                index: self.program.instructions.len(),
                what: "end of step".into(),
                message,
            };
            match on_device(&mut self.dev, |d| d.flush_transfers())
                .map(drop)
                .and_then(|()| self.settle_all())
            {
                Ok(()) => {}
                Err(Failure::Comm(e)) => return Err(ExecError::Comm(e)),
                Err(Failure::Rank(e)) => return Err(end(e.to_string())),
            }
            self.dev.synchronize().map_err(|e| ExecError::Rank {
                rank: self.program.rank,
                step,
                index: self.program.instructions.len(),
                what: "end of step".into(),
                message: e.to_string(),
            })?;
            if let Some(saver) = self.opts.saver.clone().filter(|s| s.due(step + 1)) {
                match self.snapshot(&saver, step + 1) {
                    Ok(()) => {}
                    Err(Failure::Comm(e)) => return Err(ExecError::Comm(e)),
                    Err(Failure::Rank(e)) => return Err(end(e.to_string())),
                }
            }
            let seconds = start.elapsed().as_secs_f64();
            steps.push((loss, seconds));
            let _ = tx.send(StepDone {
                step,
                loss,
                reported_loss: reported,
                seconds,
            });
        }
        Ok(RankOutcome {
            steps,
            report: super::RankReport {
                rank: self.program.rank,
                bytes_sent: self.ep.bytes_sent() + self.dev.device_comms().map_or(0, |d| d.bytes_sent()),
                peak_activation_bytes: self.peak_bytes,
                peak_micro_batches: self.peak_micro_batches,
            },
            gradients,
            trace: std::mem::take(&mut self.trace),
        })
    }

    /// Adds `instr`'s span (and the live bytes after it) to the trace.
    fn record(&mut self, instr: &Instr, step: usize, began: Instant) {
        if let Some(stream) = stream_of(instr) {
            self.span(stream, instr.describe(), step, began, Instant::now());
        }
        if self.traced_bytes != Some(self.live_bytes) {
            self.traced_bytes = Some(self.live_bytes);
            self.trace.push(TraceEvent::Memory {
                rank: self.program.rank,
                at_us: Instant::now().duration_since(self.epoch).as_secs_f64() * 1e6,
                bytes: self.live_bytes,
            });
        }
    }

    /// Adds a span of `name` on `stream` to the trace.
    pub(super) fn span(&mut self, stream: Stream, name: String, step: usize, began: Instant, ended: Instant) {
        let at = |t: Instant| t.duration_since(self.epoch).as_secs_f64() * 1e6;
        self.trace.push(TraceEvent::Span {
            rank: self.program.rank,
            stream,
            name,
            step,
            start_us: at(began),
            duration_us: ended.duration_since(began).as_secs_f64() * 1e6,
        });
    }
}

/// How `param` is stored sliced on the rank at `coord`: the slice, the
/// rank's index and the number of slices (tensor- or expert-parallel).
pub(super) fn slice_of(
    t: &TrainingGraph,
    param: &str,
    coord: autopar_lower::Coord,
) -> Option<(autopar_lower::WeightSlice, usize, usize)> {
    let cut = layout::cut_of(t, param)?;
    let slice = autopar_lower::WeightSlice {
        axis: cut.axis,
        blocks: cut.blocks,
    };
    Some((slice, layout::slice_index(t, param, coord), cut.parts))
}

/// Runs `f` on `dev`'s own collectives; `None` where it has none, and the
/// interpreter stages through host memory and the fabric instead.
fn on_device<B: Backend, R>(
    dev: &mut B,
    f: impl FnOnce(&mut dyn DeviceCollectives<B::Tensor>) -> Result<R, BackendError>,
) -> Result<Option<R>, Failure> {
    dev.device_comms().map(f).transpose().map_err(Failure::from)
}

fn missing(param: &str) -> RankError {
    RankError::NotHeld(param.to_string())
}

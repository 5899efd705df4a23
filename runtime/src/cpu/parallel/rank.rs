//! One rank's interpreter: buffers by name and micro-batch, weights (whole
//! or a ZeRO shard), optimizer state, and the instruction loop.

use super::backend::{Backend, Order};
use super::overlap::{CommStream, Done, Job, Op};
use super::slices;
use super::{ExecError, TrainOptions};
use crate::collective::{with_elements, Buffer, Endpoint};
use crate::cpu::{run_dtype, widen};
use crate::lower::blocking::continues_transfers;
use crate::lower::{Buf, Feed, Instr, Program, Shard, TrainingGraph};
use crate::trace::{stream_of, Stream, TraceEvent};
use crate::train::{decays, TokenSource};
use autopar_cost_models::comm::Algorithm;
use autopar_ir::CommKind;
use autopar_ir::{DType, Data, Graph, NodeIndex, Role, TensorId, Value};
use std::collections::{HashMap, HashSet};
use std::sync::{mpsc, Arc};
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
    data: &'a TokenSource,
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
}

/// Where the result of an overlapped collective goes, and how to trace it.
struct Landing {
    param: String,
    into: Slot,
    name: String,
    step: usize,
}

enum Slot {
    /// The parameter's gradient (whole, or a ZeRO shard of this shape).
    Grad { dtype: DType, shape: Vec<usize> },
    /// The parameter's weight, gathered whole (padding dropped).
    Weight { dtype: DType, shape: Vec<usize> },
}

impl<'a, B: Backend> RankRun<'a, B> {
    pub fn new(
        dev: B,
        t: &'a TrainingGraph,
        program: &'a Program,
        ep: Endpoint,
        data: &'a TokenSource,
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
            let mut full = widen((**data).clone(), opts.precision);
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
        }
    }

    /// Moves the initial weights onto the backend.
    fn hold_weights(&mut self) -> Result<(), ExecError> {
        for (name, v) in std::mem::take(&mut self.initial) {
            let held = self.dev.upload_weight(v).map_err(|message| ExecError::Rank {
                rank: self.program.rank,
                step: 0,
                index: 0,
                what: format!("holding weight '{name}'"),
                message,
            })?;
            self.weights.insert(name, held);
        }
        Ok(())
    }

    pub fn abort(&self, reason: &str) {
        self.ep.abort(reason);
    }

    pub fn run(&mut self, tx: &mpsc::Sender<StepDone>) -> Result<RankOutcome, ExecError> {
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
        for step in 0..self.opts.steps {
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
                    return Err(fail("injected failure (test hook)".into()));
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
                    false => self.dev.flush_transfers().map_err(Failure::Other),
                }
                .and_then(|()| self.execute(instr, step, &what, &mut gradients));
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
                    Err(Failure::Other(m)) => return Err(fail(m)),
                }
            }
            let end = |message: String| ExecError::Rank {
                rank: self.program.rank,
                step,
                index: self.program.instructions.len(),
                what: "end of step".into(),
                message,
            };
            match self
                .dev
                .flush_transfers()
                .map_err(Failure::Other)
                .and_then(|()| self.settle_all())
            {
                Ok(()) => {}
                Err(Failure::Comm(e)) => return Err(ExecError::Comm(e)),
                Err(Failure::Other(m)) => return Err(end(m)),
            }
            self.dev.synchronize().map_err(|message| ExecError::Rank {
                rank: self.program.rank,
                step,
                index: self.program.instructions.len(),
                what: "end of step".into(),
                message,
            })?;
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
                bytes_sent: self.ep.bytes_sent() + self.dev.bytes_sent(),
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
    fn span(&mut self, stream: Stream, name: String, step: usize, began: Instant, ended: Instant) {
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

    /// Hands a collective on `param`'s gradient or weight to the
    /// communication stream.
    fn overlap(&mut self, param: &str, job: Job, into: Slot, instr: &Instr, step: usize) {
        let then = Landing {
            param: param.to_string(),
            into,
            name: instr.describe(),
            step,
        };
        if let Some(comm) = &mut self.comm {
            comm.issue(param, job, then);
        }
    }

    /// Waits for the collectives in flight on `param` and stores their results.
    fn settle(&mut self, param: &str) -> Result<(), Failure> {
        while self.comm.as_ref().is_some_and(|c| c.is_pending(param)) {
            self.finish_next()?;
        }
        if self.on_device.contains(param) {
            self.join_device()?;
        }
        Ok(())
    }

    /// Waits for every collective in flight (at the end of a step).
    fn settle_all(&mut self) -> Result<(), Failure> {
        while self.comm.as_ref().is_some_and(|c| !c.is_idle()) {
            self.finish_next()?;
        }
        self.join_device()
    }

    /// Orders what comes next behind the backend's overlapped collectives.
    fn join_device(&mut self) -> Result<(), Failure> {
        self.on_device.clear();
        self.dev.join_collectives().map_err(Failure::Other)
    }

    /// How gradient reductions and the ZeRO weight refresh run on the
    /// backend: beside the computation unless overlap is switched off.
    fn order(&self) -> Order {
        match self.opts.overlap_comm {
            true => Order::Overlapped,
            false => Order::Inline,
        }
    }

    fn finish_next(&mut self) -> Result<(), Failure> {
        let Some(Done {
            then,
            result,
            began,
            ended,
        }) = self.comm.as_mut().and_then(CommStream::next)
        else {
            return Ok(());
        };
        let got = result?;
        if self.opts.trace {
            self.span(Stream::Gradients, then.name.clone(), then.step, began, ended);
        }
        match then.into {
            Slot::Grad { dtype, shape } => {
                let v = from_buffer(got, dtype, shape)?;
                self.set_grad(&then.param, v)
            }
            Slot::Weight { dtype, shape } => {
                let full = unpad(got, dtype, shape)?;
                let held = self.dev.upload(full).map_err(Failure::Other)?;
                self.weights.insert(then.param, held);
                Ok(())
            }
        }
    }

    fn execute(
        &mut self,
        instr: &Instr,
        step: usize,
        what: &str,
        grads_out: &mut Vec<GradPiece>,
    ) -> Result<Option<f64>, Failure> {
        let tag = |s: &str| format!("s{step}/{s}");
        for param in instr.params() {
            self.settle(param)?;
        }
        match instr {
            Instr::Load { buf, feed, rows } => {
                let v = self.load(&buf.tensor, *feed, *rows, step)?;
                self.put_host(buf.clone(), v)?;
            }
            Instr::Compute { node, micro_batch } => self.compute(node, *micro_batch)?,
            Instr::Collective {
                node,
                micro_batch,
                kind,
                axis,
                group,
            } => {
                let t = tag(&format!("tp/{node}/{micro_batch}"));
                self.collective(node, *micro_batch, *kind, *axis, group, &t, what)?;
            }
            Instr::Send { buf, to } => {
                let x = self.get(buf)?;
                if !self.dev.send(&x, *to).map_err(Failure::Other)? {
                    let v = self.host(&x)?;
                    self.ep.send(*to, &tag(&buf.to_string()), to_buffer(&v), what)?;
                }
            }
            Instr::Recv { buf, from } => {
                let (dtype, shape) = self.ty(&buf.tensor)?;
                match self.dev.recv(*from, dtype, &shape).map_err(Failure::Other)? {
                    Some(x) => self.put(buf.clone(), x),
                    None => {
                        let got = self.ep.recv(*from, &tag(&buf.to_string()), what)?;
                        let v = from_buffer(got, dtype, shape)?;
                        self.put_host(buf.clone(), v)?;
                    }
                }
            }
            Instr::Free { buf } => {
                if let Some(v) = self.bufs.remove(buf) {
                    if let Some(mb) = buf.micro_batch {
                        self.live_bytes -= self.dev.bytes(&v);
                        if let Some(n) = self.mb_buffers.get_mut(&mb) {
                            *n -= 1;
                            if *n == 0 {
                                self.mb_buffers.remove(&mb);
                            }
                        }
                    }
                }
            }
            Instr::AccumulateGrad { param, micro_batch } => {
                let name = self.grad_tensor.get(param.as_str()).copied().unwrap_or_default();
                let g = self.get(&Buf::of(name, *micro_batch))?;
                match self.grads.get_mut(param) {
                    Some(acc) => self.dev.accumulate(acc, &g).map_err(Failure::Other)?,
                    None => {
                        let copy = self.dev.duplicate(&g).map_err(Failure::Other)?;
                        self.grads.insert(param.clone(), copy);
                    }
                }
            }
            Instr::AllReduceGrad {
                param,
                group,
                reduction,
            } => {
                if self.all_reduce_grad_on_device(param, group)? {
                    self.on_device.insert(param.clone());
                    return Ok(None);
                }
                let grad = self.take_grad_host(param)?;
                let into = Slot::Grad {
                    dtype: grad.dtype,
                    shape: grad.shape.clone(),
                };
                let job = Job {
                    op: Op::AllReduce(*reduction),
                    group: group.clone(),
                    data: into_buffer(grad),
                    tag: tag(&format!("ar/{param}")),
                    what: what.to_string(),
                };
                self.overlap(param, job, into, instr, step);
            }
            Instr::SumTiedGrads { key, params, group } => {
                let first = self.grad(&params[0])?.clone();
                let mut sum = self.dev.duplicate(&first).map_err(Failure::Other)?;
                for p in &params[1..] {
                    let g = self.grad(p)?.clone();
                    self.dev.accumulate(&mut sum, &g).map_err(Failure::Other)?;
                }
                if group.len() > 1
                    && !self
                        .dev
                        .all_reduce(&mut sum, group, Order::Inline)
                        .map_err(Failure::Other)?
                {
                    let host = self.host(&sum)?;
                    let mut b = to_buffer(&host);
                    self.ep
                        .all_reduce(group, &mut b, Algorithm::Ring, &tag(&format!("tied/{key}")), what)?;
                    let v = from_buffer(b, host.dtype, host.shape.clone())?;
                    sum = self.dev.upload(v).map_err(Failure::Other)?;
                }
                for p in params {
                    let copy = self.dev.duplicate(&sum).map_err(Failure::Other)?;
                    self.grads.insert(p.clone(), copy);
                }
            }
            Instr::ReduceScatterGrad { param, group } => {
                if self.reduce_scatter_grad_on_device(param, group)? {
                    self.on_device.insert(param.clone());
                    return Ok(None);
                }
                let grad = self.take_grad_host(param)?;
                let into = Slot::Grad {
                    dtype: grad.dtype,
                    shape: vec![grad.numel().div_ceil(group.len())],
                };
                let job = Job {
                    op: Op::ReduceScatter,
                    group: group.clone(),
                    data: padded(grad, group.len()),
                    tag: tag(&format!("rs/{param}")),
                    what: what.to_string(),
                };
                self.overlap(param, job, into, instr, step);
            }
            Instr::OptimizerStep { param, shard } => self.step(param, *shard, step, grads_out)?,
            Instr::AllGatherParam { param, group } => {
                let order = self.order();
                let w = self.weights.get_mut(param).ok_or_else(|| missing(param))?;
                if self
                    .dev
                    .all_gather_parts(w, group, order)
                    .map_err(Failure::Other)?
                {
                    self.on_device.insert(param.clone());
                    return Ok(None);
                }
                let w = self.weight_host(param)?;
                let shard = Shard {
                    index: group.iter().position(|&r| r == self.program.rank).unwrap_or(0),
                    parts: group.len(),
                };
                let job = Job {
                    op: Op::AllGather,
                    group: group.clone(),
                    data: to_buffer(&shard_of(&w, shard)),
                    tag: tag(&format!("ag/{param}")),
                    what: what.to_string(),
                };
                let into = Slot::Weight {
                    dtype: w.dtype,
                    shape: w.shape.clone(),
                };
                self.overlap(param, job, into, instr, step);
            }
            Instr::GatherParam { param, group } => {
                let k = self.gathers.entry(param.clone()).or_insert(0);
                *k += 1;
                let t = tag(&format!("gather/{param}/{k}"));
                let part = self.weights.get(param).ok_or_else(|| missing(param))?.clone();
                let (_, shape) = self.ty(param)?;
                if let Some(full) = self
                    .dev
                    .all_gather(&part, group, &shape)
                    .map_err(Failure::Other)?
                {
                    self.bufs.insert(Buf::step(param), full);
                    return Ok(None);
                }
                let w = self.weight_host(param)?;
                let all = self.ep.all_gather(group, &to_buffer(&w), &t, what)?;
                let (dtype, shape) = self.ty(param)?;
                let full = unpad(all, run_dtype(dtype, self.opts.precision), shape)?;
                let held = self.dev.upload(full).map_err(Failure::Other)?;
                self.bufs.insert(Buf::step(param), held);
            }
            Instr::SendParam { param, to } => {
                let w = self.weights.get(param).ok_or_else(|| missing(param))?.clone();
                if !self.dev.send(&w, *to).map_err(Failure::Other)? {
                    let w = self.host(&w)?;
                    self.ep
                        .send(*to, &tag(&format!("param/{param}")), to_buffer(&w), what)?;
                }
            }
            Instr::RecvParam { param, from } => {
                let w = self.weight_host(param)?;
                let held = match self.dev.recv(*from, w.dtype, &w.shape).map_err(Failure::Other)? {
                    Some(x) => x,
                    None => {
                        let got = self.ep.recv(*from, &tag(&format!("param/{param}")), what)?;
                        let v = from_buffer(got, w.dtype, w.shape.clone())?;
                        self.dev.upload(v).map_err(Failure::Other)?
                    }
                };
                self.weights.insert(param.clone(), held);
            }
            Instr::ReportLoss { buf } => {
                let v = self.host(&self.get(buf)?)?;
                return Ok(Some(v.to_f64_vec().first().copied().unwrap_or(0.0)));
            }
        }
        Ok(None)
    }

    fn ty(&self, tensor: &str) -> Result<(DType, Vec<usize>), Failure> {
        let id = self
            .tensors
            .get(tensor)
            .ok_or_else(|| Failure::Other(format!("no tensor '{tensor}' in the training graph")))?;
        let t = self.t.graph.tensor(*id);
        let dims =
            t.ty.shape
                .resolve(&self.t.graph.bindings)
                .ok_or_else(|| Failure::Other(format!("tensor '{tensor}' has unbound dims")))?;
        Ok((run_dtype(t.ty.dtype, self.opts.precision), dims))
    }

    /// A backend tensor as a host value.
    fn host(&mut self, x: &B::Tensor) -> Result<Arc<Value>, Failure> {
        self.dev.download(x).map_err(Failure::Other)
    }

    /// Holds host value `v` as buffer `buf`.
    fn put_host(&mut self, buf: Buf, v: Value) -> Result<(), Failure> {
        let x = self.dev.upload(v).map_err(Failure::Other)?;
        self.put(buf, x);
        Ok(())
    }

    fn put(&mut self, buf: Buf, x: B::Tensor) {
        if buf.micro_batch.is_some() {
            self.live_bytes += self.dev.bytes(&x);
            self.peak_bytes = self.peak_bytes.max(self.live_bytes);
        }
        if let Some(mb) = buf.micro_batch {
            *self.mb_buffers.entry(mb).or_insert(0) += 1;
            self.peak_micro_batches = self.peak_micro_batches.max(self.mb_buffers.len());
        }
        self.bufs.insert(buf, x);
    }

    fn get(&self, buf: &Buf) -> Result<B::Tensor, Failure> {
        self.bufs.get(buf).cloned().ok_or_else(|| {
            Failure::Other(format!(
                "buffer {buf} is not here (freed, never received or never computed)"
            ))
        })
    }

    fn grad(&self, param: &str) -> Result<&B::Tensor, Failure> {
        self.grads
            .get(param)
            .ok_or_else(|| Failure::Other(format!("no gradient of '{param}' was accumulated")))
    }

    /// Takes `param`'s gradient out for a collective whose result replaces
    /// it, as a host value this rank owns: no copy when nothing else holds
    /// it (until the result lands, readers of the parameter wait).
    fn take_grad_host(&mut self, param: &str) -> Result<Value, Failure> {
        self.grad(param)?;
        let g = self.grads.remove(param).expect("checked above");
        let host = self.host(&g)?;
        drop(g);
        Ok(Arc::try_unwrap(host).unwrap_or_else(|shared| (*shared).clone()))
    }

    /// Sums `param`'s gradient over `group` with the backend's own
    /// collectives, in place; false where the backend has none.
    fn all_reduce_grad_on_device(&mut self, param: &str, group: &[usize]) -> Result<bool, Failure> {
        self.grad(param)?;
        let order = self.order();
        let g = self.grads.get_mut(param).expect("checked above");
        self.dev.all_reduce(g, group, order).map_err(Failure::Other)
    }

    /// Replaces `param`'s gradient by this rank's part of its sum over
    /// `group`, with the backend's own collectives; false where it has none.
    fn reduce_scatter_grad_on_device(&mut self, param: &str, group: &[usize]) -> Result<bool, Failure> {
        let grad = self.grad(param)?.clone();
        match self
            .dev
            .reduce_scatter(&grad, group, self.order())
            .map_err(Failure::Other)?
        {
            Some(part) => {
                self.grads.insert(param.to_string(), part);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn weight_host(&mut self, param: &str) -> Result<Arc<Value>, Failure> {
        let w = self.weights.get(param).ok_or_else(|| missing(param))?.clone();
        self.host(&w)
    }

    /// Replaces `param`'s gradient by host value `v` (after a collective).
    fn set_grad(&mut self, param: &str, v: Value) -> Result<(), Failure> {
        let x = self.dev.upload(v).map_err(Failure::Other)?;
        self.grads.insert(param.to_string(), x);
        Ok(())
    }

    fn compute(&mut self, node: &str, mb: usize) -> Result<(), Failure> {
        let g: &Graph = &self.t.graph;
        let idx = *self
            .nodes
            .get(node)
            .ok_or_else(|| Failure::Other(format!("no node '{node}'")))?;
        let n = g.node(idx);
        let mut args: Vec<Option<B::Tensor>> = Vec::with_capacity(n.inputs.len());
        for input in &n.inputs {
            let Some(x) = *input else {
                args.push(None);
                continue;
            };
            args.push(Some(self.input(x, mb)?));
        }
        let refs: Vec<Option<&B::Tensor>> = args.iter().map(|a| a.as_ref()).collect();
        let outs = self.dev.eval(node, &n.op, &refs).map_err(Failure::Other)?;
        let names: Vec<String> = n.outputs.iter().map(|&o| g.tensor(o).name.clone()).collect();
        for (name, x) in names.iter().zip(outs) {
            self.put(Buf::of(name, mb), x);
        }
        Ok(())
    }

    /// The tensor node input `x` reads for micro-batch `mb`.
    fn input(&mut self, x: TensorId, mb: usize) -> Result<B::Tensor, Failure> {
        let g: &Graph = &self.t.graph;
        let tensor = g.tensor(x);
        Ok(match tensor.role {
            Role::Constant => match self.constants.get(&x) {
                Some(v) => v.clone(),
                None => {
                    let data = tensor
                        .data
                        .as_ref()
                        .ok_or_else(|| Failure::Other(format!("constant '{}' has no data", tensor.name)))?;
                    let v = widen((**data).clone(), self.opts.precision);
                    let held = self.dev.upload(v).map_err(Failure::Other)?;
                    self.constants.insert(x, held.clone());
                    held
                }
            },
            Role::Parameter => match self.bufs.get(&Buf::step(&tensor.name)) {
                Some(v) => v.clone(),
                None => match self.weights.get(&tensor.name) {
                    Some(w) if !self.shards.contains_key(&tensor.name) => w.clone(),
                    _ => {
                        return Err(Failure::Other(format!(
                            "parameter '{}' is not held whole here",
                            tensor.name
                        )))
                    }
                },
            },
            _ => self.get(&Buf::of(&tensor.name, mb))?,
        })
    }

    /// A tensor-parallel communication node.
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &mut self,
        node: &str,
        mb: usize,
        kind: CommKind,
        axis: usize,
        group: &[usize],
        tag: &str,
        what: &str,
    ) -> Result<(), Failure> {
        let g: &Graph = &self.t.graph;
        let idx = *self
            .nodes
            .get(node)
            .ok_or_else(|| Failure::Other(format!("no node '{node}'")))?;
        let (input, output) = (g.node(idx).inputs[0], g.node(idx).outputs[0]);
        let out_name = g.tensor(output).name.clone();
        let input = input.ok_or_else(|| Failure::Other(format!("'{node}' has no input")))?;
        let held = self.input(input, mb)?;
        if kind == CommKind::Copy {
            let y = self.dev.duplicate(&held).map_err(Failure::Other)?;
            self.put(Buf::of(&out_name, mb), y);
            return Ok(());
        }
        let on_device = match kind {
            CommKind::AllReduce => {
                // The backend copies the input before summing in place if
                // it is shared, as it is here: the input stays readable.
                let mut y = held.clone();
                let summed = self.dev.all_reduce(&mut y, group, Order::Inline);
                summed.map(|done| done.then_some(y))
            }
            CommKind::AllGather | CommKind::GatherForCompute => self.dev.gather_along(&held, group, axis),
            CommKind::ReduceScatter => self.dev.reduce_scatter_along(&held, group, axis),
            CommKind::Copy | CommKind::Slice => Ok(None),
        };
        if let Some(y) = on_device.map_err(Failure::Other)? {
            self.put(Buf::of(&out_name, mb), y);
            return Ok(());
        }
        let x = self.host(&held)?;
        let parts = group.len();
        let pos = group.iter().position(|&r| r == self.program.rank).unwrap_or(0);
        let y = match kind {
            CommKind::Copy => unreachable!("handled above"),
            CommKind::Slice => slices::take(&x, axis, 1, pos, parts),
            CommKind::AllReduce => {
                let mut b = to_buffer(&x);
                self.ep.all_reduce(group, &mut b, Algorithm::Ring, tag, what)?;
                from_buffer(b, x.dtype, x.shape.clone())?
            }
            CommKind::AllGather | CommKind::GatherForCompute => {
                let all = self.ep.all_gather(group, &to_buffer(&x), tag, what)?;
                let pieces = all
                    .split_even(parts)
                    .ok_or_else(|| Failure::Other("gathered pieces differ in size".into()))?
                    .into_iter()
                    .map(|b| from_buffer(b, x.dtype, x.shape.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                slices::join(&pieces, axis, 1)
            }
            CommKind::ReduceScatter => {
                let pieces: Vec<Buffer> = (0..parts)
                    .map(|r| to_buffer(&slices::take(&x, axis, 1, r, parts)))
                    .collect();
                let flat = Buffer::concat(&pieces)
                    .ok_or_else(|| Failure::Other("nothing to reduce-scatter".into()))?;
                let mine = self.ep.reduce_scatter(group, &flat, tag, what)?;
                let mut shape = x.shape.clone();
                shape[axis] /= parts;
                from_buffer(mine, x.dtype, shape)?
            }
        };
        self.put_host(Buf::of(&out_name, mb), y)
    }

    fn load(&self, tensor: &str, feed: Feed, rows: (usize, usize), step: usize) -> Result<Value, Failure> {
        let (dtype, shape) = self.ty(tensor)?;
        let seq = self.t.seq;
        let count: usize = shape.iter().product();
        let tokens = |shift: usize| -> Result<Vec<i64>, Failure> {
            let mut out = Vec::with_capacity(count);
            for row in rows.0..rows.1 {
                let s = self
                    .data
                    .sequence(step as u64, row, seq)
                    .map_err(|e| Failure::Other(e.to_string()))?;
                out.extend_from_slice(&s[shift..shift + seq]);
            }
            Ok(out)
        };
        let ints =
            |v: Vec<i64>| Value::ints(dtype, shape.clone(), v).map_err(|e| Failure::Other(e.to_string()));
        match feed {
            Feed::Tokens => ints(tokens(0)?),
            Feed::Targets => ints(tokens(1)?),
            Feed::Ones => ints(vec![1; count]),
            Feed::Zeros => ints(vec![0; count]),
            Feed::Positions => ints((0..count).map(|i| (i % seq) as i64).collect()),
            Feed::Seed => {
                let v =
                    Value::f32(shape.clone(), vec![1.0; count]).map_err(|e| Failure::Other(e.to_string()))?;
                Ok(widen(v, self.opts.precision))
            }
        }
    }

    /// The optimizer update of `param` (or of this rank's shard of it).
    fn step(
        &mut self,
        param: &str,
        shard: Option<Shard>,
        step: usize,
        grads_out: &mut Vec<GradPiece>,
    ) -> Result<(), Failure> {
        let grad = self
            .grads
            .remove(param)
            .ok_or_else(|| Failure::Other(format!("no gradient of '{param}'")))?;
        let weight_numel = self
            .weights
            .get(param)
            .map(|w| self.dev.numel(w))
            .ok_or_else(|| missing(param))?;
        let rank = self.t.graph.tensor(self.tensors[param]).ty.shape.rank();
        let numel = if self.shards.contains_key(param) {
            grad_numel(&self.t.graph, self.tensors[param])
        } else {
            weight_numel
        };
        let full_grad = self.dev.numel(&grad) == numel && shard.is_some();
        let (start, len) = match shard {
            None => (0, numel),
            Some(s) => {
                let chunk = numel.div_ceil(s.parts);
                let start = (s.index * chunk).min(numel);
                (start, (numel - start).min(chunk))
            }
        };
        let optimizer = if decays(rank) {
            self.opts.optimizer
        } else {
            self.opts.optimizer.without_decay()
        };
        if !self.states.contains_key(param) {
            let state = self.dev.new_state(&optimizer, len).map_err(Failure::Other)?;
            self.states.insert(param.to_string(), state);
        }
        let gstart = if full_grad { start } else { 0 };
        let wstart = if self.shards.contains_key(param) { 0 } else { start };
        let n = (step + 1) as u64;
        let (Some(state), Some(weight)) = (self.states.get_mut(param), self.weights.get_mut(param)) else {
            return Err(missing(param));
        };
        self.dev
            .update(
                &optimizer,
                state,
                n,
                weight,
                wstart..wstart + len,
                &grad,
                gstart..gstart + len,
            )
            .map_err(|e| Failure::Other(format!("'{param}': {e}")))?;
        if self.opts.record_grads && step == 0 {
            let grad = self.host(&grad)?;
            let recorded = if full_grad {
                slice(&grad, start, len)
            } else {
                slice(&grad, 0, len)
            };
            grads_out.push(GradPiece {
                param: param.to_string(),
                slice: slice_of(self.t, param, self.program.coord).map_or(0, |s| s.1),
                shard,
                value: recorded,
            });
        }
        Ok(())
    }
}

/// A failure inside one instruction: a communication error (already names
/// rank and instruction) or anything else (named by the caller).
pub(super) enum Failure {
    Comm(crate::collective::CommError),
    Other(String),
}

impl From<crate::collective::CommError> for Failure {
    fn from(e: crate::collective::CommError) -> Failure {
        Failure::Comm(e)
    }
}

/// How `param` is stored sliced on the rank at `coord`: the slice, the
/// rank's index and the number of slices (tensor- or expert-parallel).
pub(super) fn slice_of(
    t: &TrainingGraph,
    param: &str,
    coord: crate::lower::Coord,
) -> Option<(crate::lower::WeightSlice, usize, usize)> {
    if let Some(s) = t.slices.get(param) {
        return Some((*s, coord.tp, t.tp));
    }
    t.expert_slices.get(param).map(|s| (*s, coord.dp % t.ep, t.ep))
}

fn missing(param: &str) -> Failure {
    Failure::Other(format!("parameter '{param}' is not held by this rank"))
}

fn grad_numel(g: &Graph, id: TensorId) -> usize {
    g.tensor(id)
        .ty
        .shape
        .0
        .iter()
        .map(|d| d.fixed().unwrap_or(1))
        .product()
}

fn to_buffer(v: &Value) -> Buffer {
    match &v.data {
        Data::F32(x) => Buffer::F32(x.clone()),
        Data::F64(x) => Buffer::F64(x.clone()),
        // Integer and boolean tensors (masks, ids) travel as f64: exact below 2^53.
        Data::I64(x) => Buffer::F64(x.iter().map(|&i| i as f64).collect()),
        Data::Bool(x) => Buffer::F64(x.iter().map(|&b| f64::from(u8::from(b))).collect()),
        Data::Str(_) => Buffer::F64(Vec::new()),
    }
}

fn from_buffer(b: Buffer, dtype: DType, shape: Vec<usize>) -> Result<Value, Failure> {
    let data = match (b, dtype) {
        (Buffer::F32(x), DType::F32) => Data::F32(x),
        (Buffer::F64(x), DType::F64) => Data::F64(x),
        (Buffer::F64(x), DType::Bool) => Data::Bool(x.iter().map(|&v| v != 0.0).collect()),
        (Buffer::F64(x), d) if !d.is_float() => Data::I64(x.iter().map(|&v| v as i64).collect()),
        (b, d) => {
            return Err(Failure::Other(format!(
                "received {} data for a {d} tensor",
                b.dtype_name()
            )))
        }
    };
    Value::new(dtype, shape, data).map_err(|e| Failure::Other(e.to_string()))
}

/// The value's elements as a buffer, moved (floats) or converted.
fn into_buffer(v: Value) -> Buffer {
    match v.data {
        Data::F32(x) => Buffer::F32(x),
        Data::F64(x) => Buffer::F64(x),
        data => to_buffer(&Value { data, ..v }),
    }
}

/// The flattened value padded with zeros to `len` elements.
fn padded_to(v: Value, len: usize) -> Buffer {
    let mut b = into_buffer(v);
    with_elements!(&mut b, x => x.resize(len, 0.0));
    b
}

/// The flattened value padded with zeros to a multiple of `parts`.
fn padded(v: Value, parts: usize) -> Buffer {
    let len = v.numel().div_ceil(parts) * parts;
    padded_to(v, len)
}

/// Part `shard.index` of the flattened value padded to a multiple of
/// `shard.parts`.
fn shard_of(v: &Value, shard: Shard) -> Value {
    let chunk = v.numel().div_ceil(shard.parts);
    let start = (shard.index * chunk).min(v.numel());
    let piece = padded_to(slice(v, start, chunk.min(v.numel() - start)), chunk);
    from_buffer(piece, v.dtype, vec![chunk]).unwrap_or_else(|_| v.clone())
}

/// The first `numel(shape)` elements of a gathered, padded buffer.
fn unpad(b: Buffer, dtype: DType, shape: Vec<usize>) -> Result<Value, Failure> {
    let n: usize = shape.iter().product();
    let b = match b {
        Buffer::F32(mut x) => {
            x.truncate(n);
            Buffer::F32(x)
        }
        Buffer::F64(mut x) => {
            x.truncate(n);
            Buffer::F64(x)
        }
    };
    from_buffer(b, dtype, shape)
}

fn slice(v: &Value, start: usize, len: usize) -> Value {
    let data = match &v.data {
        Data::F32(x) => Data::F32(x[start..start + len].to_vec()),
        Data::F64(x) => Data::F64(x[start..start + len].to_vec()),
        other => other.clone(),
    };
    Value {
        dtype: v.dtype,
        shape: vec![len],
        data,
    }
}

/// Rebuilds a full gradient from one rank's whole copy or from every rank's shard.
pub(super) fn assemble(pieces: &[(Option<Shard>, Value)]) -> Option<Value> {
    if let Some((_, whole)) = pieces.iter().find(|(s, _)| s.is_none()) {
        return Some(whole.clone());
    }
    let mut sorted: Vec<&(Option<Shard>, Value)> = pieces.iter().collect();
    sorted.sort_by_key(|(s, _)| s.map(|s| s.index));
    let parts = sorted.first()?.0?.parts;
    // Several replicas (pipeline copies) may report the same shard: keep one per index.
    sorted.dedup_by_key(|(s, _)| s.map(|s| s.index));
    if sorted.len() != parts {
        return None;
    }
    let buffers: Vec<Buffer> = sorted.iter().map(|(_, v)| to_buffer(v)).collect();
    let b = Buffer::concat(&buffers)?;
    let n = b.len();
    from_buffer(b, sorted[0].1.dtype, vec![n]).ok()
}

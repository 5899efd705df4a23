//! A rank's tensors: buffers by name and micro-batch (with the live
//! bytes they hold), gradients, weights, and the nodes computed from them.

use super::{missing, Failure, RankError, RankRun};
use crate::backend::Backend;
use autopar_ir::interp::{run_dtype, widen};
use autopar_ir::{DType, Graph, Role, TensorId, Value};
use autopar_lower::{Buf, Feed};
use std::sync::Arc;

impl<B: Backend> RankRun<'_, B> {
    pub(super) fn ty(&self, tensor: &str) -> Result<(DType, Vec<usize>), Failure> {
        let id = self
            .tensors
            .get(tensor)
            .ok_or_else(|| RankError::NoTensor(tensor.to_string()))?;
        let t = self.t.graph.tensor(*id);
        let dims =
            t.ty.shape
                .resolve(&self.t.graph.bindings)
                .ok_or_else(|| RankError::UnboundDims(tensor.to_string()))?;
        Ok((run_dtype(t.ty.dtype, self.opts.precision), dims))
    }

    /// A backend tensor as a host value.
    pub(super) fn host(&mut self, x: &B::Tensor) -> Result<Arc<Value>, Failure> {
        self.dev.download(x).map_err(Failure::from)
    }

    /// Holds host value `v` as buffer `buf`.
    pub(super) fn put_host(&mut self, buf: Buf, v: Value) -> Result<(), Failure> {
        let x = self.dev.upload(v)?;
        self.put(buf, x);
        Ok(())
    }

    pub(super) fn put(&mut self, buf: Buf, x: B::Tensor) {
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

    pub(super) fn get(&self, buf: &Buf) -> Result<B::Tensor, Failure> {
        let held = self.bufs.get(buf).cloned();
        held.ok_or_else(|| RankError::NoBuffer(buf.clone()).into())
    }

    pub(super) fn grad(&self, param: &str) -> Result<&B::Tensor, Failure> {
        self.grads
            .get(param)
            .ok_or_else(|| RankError::NotAccumulated(param.to_string()).into())
    }

    pub(super) fn weight_host(&mut self, param: &str) -> Result<Arc<Value>, Failure> {
        let w = self.weights.get(param).ok_or_else(|| missing(param))?.clone();
        self.host(&w)
    }

    /// Replaces `param`'s gradient by host value `v` (after a collective).
    pub(super) fn set_grad(&mut self, param: &str, v: Value) -> Result<(), Failure> {
        let x = self.dev.upload(v)?;
        self.grads.insert(param.to_string(), x);
        Ok(())
    }

    pub(super) fn compute(&mut self, node: &str, mb: usize) -> Result<(), Failure> {
        let g: &Graph = &self.t.graph;
        let idx = *self
            .nodes
            .get(node)
            .ok_or_else(|| RankError::NoNode(node.to_string()))?;
        let n = g.node(idx);
        let mut args: Vec<Option<B::Tensor>> = Vec::with_capacity(n.inputs.len());
        for input in &n.inputs {
            let Some(x) = *input else {
                args.push(None);
                continue;
            };
            args.push(Some(self.input(x, mb)?));
        }
        // An identity's output is its input, shared ([`Op::passes_input`]).
        // Every weight's gradient is named by one.
        if let (true, [Some(_)], [out]) = (n.op.passes_input(), args.as_slice(), n.outputs.as_slice()) {
            let name = g.tensor(*out).name.clone();
            let x = args.pop().flatten().expect("matched above");
            self.put(Buf::of(&name, mb), x);
            return Ok(());
        }
        let refs: Vec<Option<&B::Tensor>> = args.iter().map(|a| a.as_ref()).collect();
        let outs = self.dev.eval(node, &n.op, &refs)?;
        let names: Vec<String> = n.outputs.iter().map(|&o| g.tensor(o).name.clone()).collect();
        for (name, x) in names.iter().zip(outs) {
            self.put(Buf::of(name, mb), x);
        }
        Ok(())
    }

    /// The tensor node input `x` reads for micro-batch `mb` (a gathered
    /// weight once its gather has landed).
    pub(super) fn input(&mut self, x: TensorId, mb: usize) -> Result<B::Tensor, Failure> {
        let t = self.t;
        let tensor = t.graph.tensor(x);
        if tensor.role == Role::Parameter {
            self.settle(&tensor.name)?;
        }
        Ok(match tensor.role {
            Role::Constant => match self.constants.get(&x) {
                Some(v) => v.clone(),
                None => {
                    let data = tensor
                        .data
                        .as_ref()
                        .ok_or_else(|| RankError::NoData(tensor.name.clone()))?;
                    let v = widen((**data).clone(), self.opts.precision);
                    let held = self.dev.upload(v)?;
                    self.constants.insert(x, held.clone());
                    held
                }
            },
            Role::Parameter => match self.bufs.get(&Buf::step(&tensor.name)) {
                Some(v) => v.clone(),
                None => match self.weights.get(&tensor.name) {
                    Some(w) if !self.shards.contains_key(&tensor.name) => w.clone(),
                    _ => return Err(RankError::NotWhole(tensor.name.clone()).into()),
                },
            },
            _ => self.get(&Buf::of(&tensor.name, mb))?,
        })
    }

    /// The value of data input `tensor` (fed with `feed`) for rows
    /// `rows.0..rows.1` of step `step`'s global batch.
    pub(super) fn load(
        &self,
        tensor: &str,
        feed: Feed,
        rows: (usize, usize),
        step: usize,
    ) -> Result<Value, Failure> {
        let (dtype, shape) = self.ty(tensor)?;
        let v = self
            .data
            .batch(&self.t.task, feed, tensor, dtype, &shape, rows, step as u64)?;
        Ok(v)
    }
}

//! The instruction loop's dispatch, and the instructions that move or
//! combine buffers: transfers, frees, gradient accumulation and the sum of
//! tied weights' gradients.

use super::data_parallel::GradSum;
use super::{missing, on_device, Failure, GradPiece, RankRun};
use crate::backend::{Backend, Order};
use autopar_comm::collective::values::{from_buffer, to_buffer};
use autopar_cost_models::comm::Algorithm;
use autopar_lower::program::Payload;
use autopar_lower::{Buf, Instr};

/// Where an instruction runs: its step, and how errors from peers name it.
#[derive(Clone, Copy)]
pub(super) struct At<'s> {
    pub step: usize,
    /// The instruction, for communication errors (empty for the rest).
    pub what: &'s str,
}

impl At<'_> {
    /// The fabric's message tag of `name` in this step.
    pub fn tag(&self, name: &str) -> String {
        format!("s{}/{name}", self.step)
    }
}

impl<B: Backend> RankRun<'_, B> {
    pub(super) fn execute(
        &mut self,
        instr: &Instr,
        at: At<'_>,
        grads_out: &mut Vec<GradPiece>,
    ) -> Result<Option<f64>, Failure> {
        for param in instr.params() {
            self.settle(param)?;
        }
        match instr {
            Instr::Load { buf, feed, rows } => {
                let v = self.load(&buf.tensor, *feed, *rows, at.step)?;
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
                let t = at.tag(&format!("tp/{node}/{micro_batch}"));
                self.collective(node, *micro_batch, *kind, *axis, group, &t, at.what)?;
            }
            Instr::Send { .. } | Instr::SendParam { .. } | Instr::Recv { .. } | Instr::RecvParam { .. } => {
                if let Some(t) = instr.transfer() {
                    match t.send {
                        true => self.send(t.payload, t.peer, at)?,
                        false => self.recv(t.payload, t.peer, at)?,
                    }
                }
            }
            Instr::Free { buf } => {
                // A gathered weight may still be on its way.
                if buf.micro_batch.is_none() {
                    self.settle(&buf.tensor)?;
                }
                self.free(buf)
            }
            Instr::AccumulateGrad { param, micro_batch } => self.accumulate(param, *micro_batch)?,
            Instr::AllReduceGrad {
                params,
                group,
                reduction,
                ..
            } => self.reduce_grads(instr, params, group, GradSum::AllReduce(*reduction), at)?,
            Instr::SumTiedGrads { key, params, group } => self.sum_tied(key, params, group, at)?,
            Instr::ReduceScatterGrad {
                params,
                group,
                micro_batch,
                ..
            } => self.reduce_grads(instr, params, group, GradSum::ReduceScatter(*micro_batch), at)?,
            Instr::OptimizerStep { param, shard } => self.step(param, *shard, at.step, grads_out)?,
            Instr::AllGatherParams { params, group } => self.all_gather_params(instr, params, group, at)?,
            Instr::GatherParam { param, group } => self.gather_param(instr, param, group, at)?,
            Instr::ReportLoss { buf } => {
                let v = self.host(&self.get(buf)?)?;
                return Ok(Some(v.to_f64_vec().first().copied().unwrap_or(0.0)));
            }
        }
        Ok(None)
    }

    /// The fabric's name of a transfer's payload.
    fn wire_name(payload: Payload<'_>) -> String {
        match payload {
            Payload::Buf(buf) => buf.to_string(),
            Payload::Param(param) => format!("param/{param}"),
        }
    }

    /// Sends a pipeline buffer or a shared weight to rank `to`.
    fn send(&mut self, payload: Payload<'_>, to: usize, at: At<'_>) -> Result<(), Failure> {
        let x = match payload {
            Payload::Buf(buf) => self.get(buf)?,
            Payload::Param(param) => self.weights.get(param).ok_or_else(|| missing(param))?.clone(),
        };
        if !on_device(&mut self.dev, |d| d.send(&x, to))?.unwrap_or(false) {
            let v = self.host(&x)?;
            let tag = at.tag(&Self::wire_name(payload));
            self.ep.send(to, &tag, to_buffer(&v), at.what)?;
        }
        Ok(())
    }

    /// Receives a pipeline buffer or a shared weight from rank `from`.
    fn recv(&mut self, payload: Payload<'_>, from: usize, at: At<'_>) -> Result<(), Failure> {
        let (dtype, shape) = match payload {
            Payload::Buf(buf) => self.ty(&buf.tensor)?,
            Payload::Param(param) => {
                let w = self.weight_host(param)?;
                (w.dtype, w.shape.clone())
            }
        };
        let x = match on_device(&mut self.dev, |d| d.recv(from, dtype, &shape))?.flatten() {
            Some(x) => x,
            None => {
                let got = self.ep.recv(from, &at.tag(&Self::wire_name(payload)), at.what)?;
                let v = from_buffer(got, dtype, shape)?;
                self.dev.upload(v)?
            }
        };
        match payload {
            Payload::Buf(buf) => self.put(buf.clone(), x),
            Payload::Param(param) => {
                self.weights.insert(param.to_string(), x);
            }
        }
        Ok(())
    }

    fn free(&mut self, buf: &Buf) {
        let Some(v) = self.bufs.remove(buf) else {
            return;
        };
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

    /// Adds micro-batch `mb`'s gradient of `param` into the step's.
    fn accumulate(&mut self, param: &str, mb: usize) -> Result<(), Failure> {
        let name = self.grad_tensor.get(param).copied().unwrap_or_default();
        let g = self.get(&Buf::of(name, mb))?;
        match self.grads.get_mut(param) {
            Some(acc) => self.dev.accumulate(acc, &g)?,
            None => {
                let copy = self.dev.duplicate(&g)?;
                self.grads.insert(param.to_string(), copy);
            }
        }
        Ok(())
    }

    /// Sums the gradients of a tied weight's copies here and over `group`,
    /// and gives every copy the sum.
    fn sum_tied(&mut self, key: &str, params: &[String], group: &[usize], at: At<'_>) -> Result<(), Failure> {
        let first = self.grad(&params[0])?.clone();
        let mut sum = self.dev.duplicate(&first)?;
        for p in &params[1..] {
            let g = self.grad(p)?.clone();
            self.dev.accumulate(&mut sum, &g)?;
        }
        if group.len() > 1
            && !on_device(&mut self.dev, |d| d.all_reduce(&mut sum, group, Order::Inline))?.unwrap_or(false)
        {
            let host = self.host(&sum)?;
            let mut b = to_buffer(&host);
            let tag = at.tag(&format!("tied/{key}"));
            self.ep
                .all_reduce(group, &mut b, Algorithm::Ring, &tag, at.what)?;
            let v = from_buffer(b, host.dtype, host.shape.clone())?;
            sum = self.dev.upload(v)?;
        }
        for p in params {
            let copy = self.dev.duplicate(&sum)?;
            self.grads.insert(p.clone(), copy);
        }
        Ok(())
    }
}

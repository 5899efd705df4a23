//! Data-parallel traffic: gradient reductions and the ZeRO weight
//! gathers, on the backend's own collectives where it has them, else
//! staged through host memory on the rank's communication stream (beside
//! the computation unless overlap is off), with the readers of a parameter
//! waiting for what is in flight on it.

use super::execute::At;
use super::{missing, on_device, Failure, RankRun};
use crate::backend::{Backend, Order};
use crate::overlap::{CommStream, Done, Job, JobKind};
use crate::trace::Stream;
use crate::zero_parts::shard_of;
use autopar_comm::collective::values::{from_buffer, into_buffer, padded, to_buffer, unpad};
use autopar_cost_models::comm::Algorithm;
use autopar_ir::interp::run_dtype;
use autopar_ir::{DType, Value};
use autopar_lower::{Buf, Instr, Shard};
use std::sync::Arc;

/// Where the result of an overlapped collective goes, and how to trace it.
pub(super) struct Landing {
    param: String,
    into: Slot,
    name: String,
    step: usize,
}

/// How a gradient is summed over its data-parallel group.
#[derive(Debug, Clone, Copy)]
pub(super) enum GradSum {
    /// Whole, with this algorithm.
    AllReduce(Algorithm),
    /// Keeping only this rank's shard of the sum (ZeRO-2/3).
    ReduceScatter,
}

enum Slot {
    /// The parameter's gradient (whole, or a ZeRO shard of this shape).
    Grad { dtype: DType, shape: Vec<usize> },
    /// The parameter's weight, gathered whole (padding dropped).
    Weight { dtype: DType, shape: Vec<usize> },
}

impl<B: Backend> RankRun<'_, B> {
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
    pub(super) fn settle(&mut self, param: &str) -> Result<(), Failure> {
        while self.comm.as_ref().is_some_and(|c| c.is_pending(param)) {
            self.finish_next()?;
        }
        if self.on_device.contains(param) {
            self.join_device()?;
        }
        Ok(())
    }

    /// Waits for every collective in flight (at the end of a step).
    pub(super) fn settle_all(&mut self) -> Result<(), Failure> {
        while self.comm.as_ref().is_some_and(|c| !c.is_idle()) {
            self.finish_next()?;
        }
        self.join_device()
    }

    /// Orders what comes next behind the backend's overlapped collectives.
    fn join_device(&mut self) -> Result<(), Failure> {
        self.on_device.clear();
        on_device(&mut self.dev, |d| d.join())?;
        Ok(())
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
                let held = self.dev.upload(full)?;
                self.weights.insert(then.param, held);
                Ok(())
            }
        }
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
        Ok(on_device(&mut self.dev, |d| d.all_reduce(g, group, order))?.unwrap_or(false))
    }

    /// Replaces `param`'s gradient by this rank's part of its sum over
    /// `group`, with the backend's own collectives; false where it has none.
    fn reduce_scatter_grad_on_device(&mut self, param: &str, group: &[usize]) -> Result<bool, Failure> {
        let grad = self.grad(param)?.clone();
        let order = self.order();
        match on_device(&mut self.dev, |d| d.reduce_scatter(&grad, group, order))?.flatten() {
            Some(part) => {
                self.grads.insert(param.to_string(), part);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Sums `param`'s gradient over `group` (data parallel), whole or
    /// keeping this rank's shard as `sum` says.
    pub(super) fn reduce_grad(
        &mut self,
        instr: &Instr,
        param: &str,
        group: &[usize],
        sum: GradSum,
        at: At<'_>,
    ) -> Result<(), Failure> {
        let done = match sum {
            GradSum::AllReduce(_) => self.all_reduce_grad_on_device(param, group)?,
            GradSum::ReduceScatter => self.reduce_scatter_grad_on_device(param, group)?,
        };
        if done {
            self.on_device.insert(param.to_string());
            return Ok(());
        }
        let grad = self.take_grad_host(param)?;
        let dtype = grad.dtype;
        let (kind, shape, data, name) = match sum {
            GradSum::AllReduce(algorithm) => {
                let shape = grad.shape.clone();
                (JobKind::AllReduce(algorithm), shape, into_buffer(grad), "ar")
            }
            GradSum::ReduceScatter => {
                let shape = vec![grad.numel().div_ceil(group.len())];
                (JobKind::ReduceScatter, shape, padded(grad, group.len()), "rs")
            }
        };
        let job = Job {
            kind,
            group: group.to_vec(),
            data,
            tag: at.tag(&format!("{name}/{param}")),
            what: at.what.to_string(),
        };
        self.overlap(param, job, Slot::Grad { dtype, shape }, instr, at.step);
        Ok(())
    }

    /// Rebuilds the whole `param` from every member's updated part (ZeRO-1/2).
    pub(super) fn all_gather_param(
        &mut self,
        instr: &Instr,
        param: &str,
        group: &[usize],
        at: At<'_>,
    ) -> Result<(), Failure> {
        let order = self.order();
        let w = self.weights.get_mut(param).ok_or_else(|| missing(param))?;
        if on_device(&mut self.dev, |d| d.all_gather_parts(w, group, order))?.unwrap_or(false) {
            self.on_device.insert(param.to_string());
            return Ok(());
        }
        let w = self.weight_host(param)?;
        let shard = Shard {
            index: group.iter().position(|&r| r == self.program.rank).unwrap_or(0),
            parts: group.len(),
        };
        let job = Job {
            kind: JobKind::AllGather,
            group: group.to_vec(),
            data: to_buffer(&shard_of(&w, shard)),
            tag: at.tag(&format!("ag/{param}")),
            what: at.what.to_string(),
        };
        let into = Slot::Weight {
            dtype: w.dtype,
            shape: w.shape.clone(),
        };
        self.overlap(param, job, into, instr, at.step);
        Ok(())
    }

    /// Gathers the whole `param` from its shards into a per-step buffer (ZeRO-3).
    pub(super) fn gather_param(&mut self, param: &str, group: &[usize], at: At<'_>) -> Result<(), Failure> {
        let k = self.gathers.entry(param.to_string()).or_insert(0);
        *k += 1;
        let t = at.tag(&format!("gather/{param}/{k}"));
        let part = self.weights.get(param).ok_or_else(|| missing(param))?.clone();
        let (_, shape) = self.ty(param)?;
        if let Some(full) = on_device(&mut self.dev, |d| d.all_gather(&part, group, &shape))?.flatten() {
            self.bufs.insert(Buf::step(param), full);
            return Ok(());
        }
        let w = self.weight_host(param)?;
        let all = self.ep.all_gather(group, &to_buffer(&w), &t, at.what)?;
        let (dtype, shape) = self.ty(param)?;
        let full = unpad(all, run_dtype(dtype, self.opts.precision), shape)?;
        let held = self.dev.upload(full)?;
        self.bufs.insert(Buf::step(param), held);
        Ok(())
    }
}

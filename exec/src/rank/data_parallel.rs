//! Data-parallel traffic: gradient reductions (a bucket of gradients
//! per collective, [`crate::buckets`]) and the ZeRO weight gathers, on the backend's own collectives where it has them, else
//! staged through host memory on the rank's communication stream (beside
//! the computation unless overlap is off), with the readers of a parameter
//! waiting for what is in flight on it.

use super::execute::At;
use super::{missing, on_device, Failure, RankError, RankRun};
use crate::backend::{Backend, Order};
use crate::buckets;
use crate::overlap::{CommStream, Done, Job, JobKind};
use crate::trace::Stream;
use crate::zero_parts::shard_of;
use autopar_comm::collective::values::{to_buffer, unpad};
use autopar_comm::collective::Buffer;
use autopar_cost_models::comm::Algorithm;
use autopar_ir::{DType, Value};
use autopar_lower::{Buf, Instr, Shard};
use std::sync::Arc;

/// Where the result of an overlapped collective goes, and how to trace it.
pub(super) struct Landing {
    into: Slot,
    name: String,
    step: usize,
}

/// How a bucket of gradients is summed over its data-parallel group.
#[derive(Debug, Clone, Copy)]
pub(super) enum GradSum {
    /// Whole, with this algorithm: the step's gradients are replaced by their sums.
    AllReduce(Algorithm),
    /// Adding this rank's shard of each sum into the parameter's gradient
    /// shard: of the step's gradients (`None`), or of one micro-batch's
    /// gradient buffers (ZeRO-2/3).
    ReduceScatter(Option<usize>),
}

enum Slot {
    /// A bucket's gradients, whole, of these shapes (in the bucket's order).
    Grads {
        dtype: DType,
        members: Vec<(String, Vec<usize>)>,
    },
    /// This rank's shard of each gradient of a bucket, of these lengths,
    /// added into the parameter's gradient shard.
    Shards {
        dtype: DType,
        members: Vec<(String, usize)>,
    },
    /// A bucket's weights gathered whole from `parts` members' shards of
    /// each, of these shapes and shard lengths (padding dropped), stored
    /// as the weights (ZeRO-1/2's refresh).
    Refreshed {
        dtype: DType,
        parts: usize,
        members: Vec<(String, Vec<usize>, usize)>,
    },
    /// The parameter's weight gathered whole (padding dropped) into the
    /// step's copy (ZeRO-3).
    Gathered {
        param: String,
        dtype: DType,
        shape: Vec<usize>,
    },
}

impl<B: Backend> RankRun<'_, B> {
    /// Hands a collective on `params`' gradients or weight to the
    /// communication stream.
    fn overlap(&mut self, params: Vec<String>, job: Job, into: Slot, instr: &Instr, step: usize) {
        let then = Landing {
            into,
            name: instr.describe(),
            step,
        };
        if let Some(comm) = &mut self.comm {
            comm.issue(params, job, then);
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

    /// Orders what comes next behind the backend's overlapped collectives,
    /// and adds the gradient shards they made into the step's.
    fn join_device(&mut self) -> Result<(), Failure> {
        self.on_device.clear();
        on_device(&mut self.dev, |d| d.join())?;
        for (param, shard) in std::mem::take(&mut self.landed) {
            self.add_grad(&param, shard)?;
        }
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
            Slot::Grads { dtype, members } => {
                let shapes: Vec<Vec<usize>> = members.iter().map(|(_, shape)| shape.clone()).collect();
                for ((param, _), v) in members.iter().zip(buckets::split(got, dtype, &shapes)?) {
                    self.set_grad(param, v)?;
                }
                Ok(())
            }
            Slot::Shards { dtype, members } => {
                let shapes: Vec<Vec<usize>> = members.iter().map(|&(_, len)| vec![len]).collect();
                for ((param, _), v) in members.iter().zip(buckets::split(got, dtype, &shapes)?) {
                    let shard = self.dev.upload(v)?;
                    self.add_grad(param, shard)?;
                }
                Ok(())
            }
            Slot::Refreshed {
                dtype,
                parts,
                members,
            } => {
                let lens: Vec<usize> = members.iter().map(|&(_, _, len)| len).collect();
                for ((param, shape, _), whole) in members
                    .into_iter()
                    .zip(buckets::ungather(got, dtype, parts, &lens)?)
                {
                    let held = self.dev.upload(unpad(whole, dtype, shape)?)?;
                    self.weights.insert(param, held);
                }
                Ok(())
            }
            Slot::Gathered { param, dtype, shape } => {
                let held = self.dev.upload(unpad(got, dtype, shape)?)?;
                self.bufs.insert(Buf::step(&param), held);
                Ok(())
            }
        }
    }

    /// Adds `shard` into `param`'s gradient shard (the first one starts it).
    fn add_grad(&mut self, param: &str, shard: B::Tensor) -> Result<(), Failure> {
        match self.grads.get_mut(param) {
            Some(acc) => self.dev.accumulate(acc, &shard)?,
            None => {
                self.grads.insert(param.to_string(), shard);
            }
        }
        Ok(())
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

    /// Micro-batch `mb`'s gradient buffer of `param`.
    fn micro_batch_grad(&self, param: &str, mb: usize) -> Result<B::Tensor, Failure> {
        let name = self.grad_tensor.get(param).copied().unwrap_or_default();
        self.get(&Buf::of(name, mb))
    }

    /// Sums a bucket with the backend's own collectives; false where the
    /// backend has none (nothing has changed then).
    fn reduce_on_device(
        &mut self,
        params: &[String],
        group: &[usize],
        sum: GradSum,
    ) -> Result<bool, Failure> {
        let order = self.order();
        match sum {
            GradSum::AllReduce(_) => {
                // Out of the map, so the backend sums them in place.
                let mut xs = Vec::with_capacity(params.len());
                for p in params {
                    self.grad(p)?;
                    xs.push(self.grads.remove(p).expect("checked above"));
                }
                let done = on_device(&mut self.dev, |d| d.all_reduce_bucket(&mut xs, group, order));
                for (p, x) in params.iter().zip(xs) {
                    self.grads.insert(p.clone(), x);
                }
                Ok(done?.unwrap_or(false))
            }
            GradSum::ReduceScatter(mb) => {
                let xs = params
                    .iter()
                    .map(|p| match mb {
                        Some(mb) => self.micro_batch_grad(p, mb),
                        None => self.grad(p).cloned(),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let Some(shards) =
                    on_device(&mut self.dev, |d| d.reduce_scatter_bucket(&xs, group, order))?.flatten()
                else {
                    return Ok(false);
                };
                // They land in the step's gradient shards at the next join.
                for (p, shard) in params.iter().zip(shards) {
                    if mb.is_none() {
                        self.grads.remove(p);
                    }
                    self.landed.push((p.clone(), shard));
                }
                Ok(true)
            }
        }
    }

    /// Sums a bucket of gradients over `group` (data parallel) as one
    /// collective, whole or keeping this rank's shards as `sum` says.
    pub(super) fn reduce_grads(
        &mut self,
        instr: &Instr,
        params: &[String],
        group: &[usize],
        sum: GradSum,
        at: At<'_>,
    ) -> Result<(), Failure> {
        // A compressed reduction runs on the host's collectives, which
        // send 16-bit values (the backends' own collectives do not yet).
        let narrow = instr.compression();
        if narrow.is_none() && self.reduce_on_device(params, group, sum)? {
            self.on_device.extend(params.iter().cloned());
            return Ok(());
        }
        let mut values = Vec::with_capacity(params.len());
        for p in params {
            values.push(match sum {
                GradSum::ReduceScatter(Some(mb)) => {
                    let x = self.micro_batch_grad(p, mb)?;
                    (*self.host(&x)?).clone()
                }
                GradSum::AllReduce(_) | GradSum::ReduceScatter(None) => self.take_grad_host(p)?,
            });
        }
        let dtype = values.first().ok_or(RankError::NothingToScatter)?.dtype;
        let n = group.len();
        // Each gradient as a matrix: its first dim by the rest.
        let shapes = values
            .iter()
            .map(|v| {
                let rows = v.shape.first().copied().unwrap_or(1).max(1);
                (rows, v.numel() / rows)
            })
            .collect();
        let (kind, data, into, name) = match sum {
            GradSum::AllReduce(algorithm) => {
                let members = params.iter().cloned().zip(values.iter().map(|v| v.shape.clone()));
                let into = Slot::Grads {
                    dtype,
                    members: members.collect(),
                };
                (
                    JobKind::AllReduce(algorithm, narrow),
                    buckets::concat(values)?,
                    into,
                    "ar",
                )
            }
            GradSum::ReduceScatter(_) => {
                let members = params
                    .iter()
                    .cloned()
                    .zip(values.iter().map(|v| v.numel().div_ceil(n)));
                let into = Slot::Shards {
                    dtype,
                    members: members.collect(),
                };
                (
                    JobKind::ReduceScatter(narrow),
                    buckets::interleave(values, n)?,
                    into,
                    "rs",
                )
            }
        };
        let first = &params[0];
        let wire = match sum {
            GradSum::ReduceScatter(Some(mb)) => format!("{name}/{first}/mb{mb}"),
            GradSum::AllReduce(_) | GradSum::ReduceScatter(None) => format!("{name}/{first}"),
        };
        let job = Job {
            kind,
            group: group.to_vec(),
            data,
            tag: at.tag(&wire),
            what: at.what.to_string(),
            shapes,
            bucket: wire,
        };
        self.overlap(params.to_vec(), job, into, instr, at.step);
        Ok(())
    }

    /// Rebuilds every weight of a bucket from each member's updated part
    /// (ZeRO-1/2): on the backend's own collectives, weight by weight, where
    /// it has them, else as one collective on the communication stream.
    pub(super) fn all_gather_params(
        &mut self,
        instr: &Instr,
        params: &[String],
        group: &[usize],
        at: At<'_>,
    ) -> Result<(), Failure> {
        let order = self.order();
        let mut on_host = Vec::new();
        for param in params {
            let w = self.weights.get_mut(param).ok_or_else(|| missing(param))?;
            if on_device(&mut self.dev, |d| d.all_gather_parts(w, group, order))?.unwrap_or(false) {
                self.on_device.insert(param.clone());
            } else {
                on_host.push(param.clone());
            }
        }
        let Some(first) = on_host.first().cloned() else {
            return Ok(());
        };
        let shard = Shard {
            index: group.iter().position(|&r| r == self.program.rank).unwrap_or(0),
            parts: group.len(),
        };
        let (mut parts, mut members) = (Vec::new(), Vec::new());
        for param in &on_host {
            let w = self.weight_host(param)?;
            let part = shard_of(&w, shard);
            members.push((param.clone(), w.shape.clone(), part.numel()));
            parts.push(part);
        }
        let dtype = parts.first().map_or(DType::F32, |p| p.dtype);
        let job = all_gather(group, buckets::concat(parts)?, at.tag(&format!("ag/{first}")), at);
        let into = Slot::Refreshed {
            dtype,
            parts: group.len(),
            members,
        };
        self.overlap(on_host, job, into, instr, at.step);
        Ok(())
    }

    /// Gathers the whole `param` from its shards into a per-step buffer
    /// (ZeRO-3): on the backend's collectives in order, else on the
    /// communication stream, where the program's prefetch lets it run
    /// beside the computation until a node reads it.
    pub(super) fn gather_param(
        &mut self,
        instr: &Instr,
        param: &str,
        group: &[usize],
        at: At<'_>,
    ) -> Result<(), Failure> {
        let k = self.gathers.entry(param.to_string()).or_insert(0);
        *k += 1;
        let tag = at.tag(&format!("gather/{param}/{k}"));
        let part = self.weights.get(param).ok_or_else(|| missing(param))?.clone();
        let (dtype, shape) = self.ty(param)?;
        let order = self.order();
        if let Some(full) = on_device(&mut self.dev, |d| d.all_gather(&part, group, &shape, order))?.flatten()
        {
            self.bufs.insert(Buf::step(param), full);
            self.on_device.insert(param.to_string());
            return Ok(());
        }
        let w = self.weight_host(param)?;
        let job = all_gather(group, to_buffer(&w), tag, at);
        let into = Slot::Gathered {
            param: param.to_string(),
            dtype,
            shape,
        };
        self.overlap(vec![param.to_string()], job, into, instr, at.step);
        Ok(())
    }
}

/// The job gathering every member's `part` over `group`.
fn all_gather(group: &[usize], part: Buffer, tag: String, at: At<'_>) -> Job {
    Job {
        kind: JobKind::AllGather,
        group: group.to_vec(),
        data: part,
        tag,
        what: at.what.to_string(),
        shapes: Vec::new(),
        bucket: String::new(),
    }
}

//! Data-parallel traffic of one pipeline stage as lowering issues it and the
//! backends run it: one collective at a time on a communication lane beside
//! the compute stream, so a collective hides only under compute that runs
//! beside it, and only what that compute cannot cover is exposed.
//!
//! - Gradients are reduced in buckets ([`crate::comm::buckets`]), each
//!   issued when the backward pass has completed it: ZeRO-0/1 once per step,
//!   in the last micro-batch's backward pass (under the interleaved schedule
//!   each chunk's own, chunk by chunk as the pipeline drains); ZeRO-2/3 in
//!   every micro-batch's, and what the draining backward passes alone
//!   cannot cover is exposed.
//!   The last bucket always follows the backward pass.
//! - ZeRO-1/2 all-gather the updated weights after the optimizer step, in
//!   buckets as the gradients are reduced, with nothing beside them (or,
//!   priced for Megatron-Core's `--overlap-param-gather`, beside the next
//!   step's first forward pass).
//! - ZeRO-3 gathers each parameter tensor before the unit that uses it,
//!   `zero3_prefetch` layers ahead within a forward or backward pass, and
//!   reduce-scatters its gradients after the unit's backward pass.
//! - A tied embedding's gradients are summed between the first and last
//!   stage after the pipeline.
//!
//! Every collective pays its own latency: a bucket once, a ZeRO-3 gather once.

use super::UnitTime;
use crate::comm::{self, Algorithm, BucketFill, Collective, CommError, Span};
use crate::config::{Schedule, TrainingConfig};
use crate::pipeline::{self, Stage};
use crate::workload::{ParamShard, Unit, Workload};
use crate::{Cluster, GradWire};

/// One unit's parameter tensors on one rank, for data-parallel traffic.
#[derive(Debug, Clone, Default)]
struct UnitParams {
    /// Gradient bytes of each dense and each expert tensor.
    dense: Vec<f64>,
    expert: Vec<f64>,
    /// Per dense tensor: a weight tied between the parts before and after
    /// the layers, whose gradient is reduced only after the pipeline (once
    /// its copies' gradients are summed).
    tied: Vec<bool>,
    /// One all-gather of every tensor, each its own collective (ZeRO-3's gathers).
    gathers: f64,
}

impl UnitParams {
    fn of<'a>(
        params: impl Iterator<Item = (bool, &'a ParamShard)>,
        net: &Net,
    ) -> Result<UnitParams, CommError> {
        let mut u = UnitParams::default();
        for (tied, p) in params {
            let bytes = p.elements * p.dtype.size_bits() as f64 / 8.0;
            let span = if p.expert { net.expert_data } else { net.data };
            u.gathers += comm::time(net.cluster, span, Collective::AllGather, Algorithm::Ring, bytes)?;
            match p.expert {
                true => u.expert.push(bytes),
                false => {
                    u.dense.push(bytes);
                    u.tied.push(tied);
                }
            }
        }
        Ok(u)
    }

    fn bytes(&self) -> (f64, f64) {
        (self.dense.iter().sum(), self.expert.iter().sum())
    }
}

/// Where the data-parallel groups sit, on the achievable link rates.
pub(super) struct Net<'a> {
    pub cluster: &'a Cluster,
    pub data: Span,
    pub expert_data: Span,
    /// The first and the last stage's rank of one replica.
    pub ends: Span,
}

/// The stage's parameters in the order the backward pass completes them.
struct StageParams<'a> {
    units: Vec<(&'a UnitParams, usize)>,
}

impl StageParams<'_> {
    /// Collectives and bytes of one bucketed reduction of every dense (or
    /// expert) gradient ([`BucketFill`], the rule lowering buckets by).
    fn buckets(&self, expert: bool, cap: f64) -> (usize, f64) {
        let sizes = || {
            self.units.iter().flat_map(move |&(u, times)| {
                let list = if expert { &u.expert } else { &u.dense };
                (0..times).flat_map(move |_| list.iter())
            })
        };
        (comm::buckets(sizes(), cap), sizes().sum())
    }
}

/// The data-parallel traffic of a workload on a mesh, priced per unit once.
pub(super) struct Traffic {
    pre: UnitParams,
    layer: UnitParams,
    post: UnitParams,
    /// The post-layers part less the weights it shares with the pre-layers part.
    post_unshared: UnitParams,
    /// Bytes of the weights the first and last stage share (a tied embedding).
    tied_bytes: f64,
    cluster: Cluster,
    data: Span,
    expert_data: Span,
    ends: Span,
}

impl Traffic {
    pub(super) fn new(w: &Workload, net: &Net) -> Result<Traffic, CommError> {
        let tied = |id: &usize| w.pre.params.contains_key(id) && w.post.params.contains_key(id);
        let unit = |u: &Unit| UnitParams::of(u.params.iter().map(|(id, p)| (tied(id), p)), net);
        let unshared = w
            .post
            .params
            .iter()
            .filter(|(id, _)| !w.pre.params.contains_key(id))
            .map(|(_, p)| (false, p));
        let post_unshared = UnitParams::of(unshared, net)?;
        let post = unit(&w.post)?;
        let (all, _) = post.bytes();
        let (unshared_bytes, _) = post_unshared.bytes();
        Ok(Traffic {
            pre: unit(&w.pre)?,
            layer: unit(&w.layer)?,
            post,
            post_unshared,
            tied_bytes: all - unshared_bytes,
            cluster: net.cluster.clone(),
            data: net.data,
            expert_data: net.expert_data,
            ends: net.ends,
        })
    }

    /// `stage`'s parts in the order the backward pass completes them: the
    /// part after the layers, the layer (`stage.layers` times), the part
    /// before; each with its index into `[pre, layer, post]` arrays and its
    /// repeats.
    fn stage_units(&self, stage: &Stage) -> Vec<(&UnitParams, usize, usize)> {
        let mut units = Vec::with_capacity(3);
        if stage.last {
            let post = if stage.first {
                &self.post_unshared
            } else {
                &self.post
            };
            units.push((post, 2, 1));
        }
        units.push((&self.layer, 1, stage.layers));
        if stage.first {
            units.push((&self.pre, 0, 1));
        }
        units
    }

    /// The units of model chunk `c` of `stage` split into `v` chunks (the
    /// interleaved schedule's), in forward order, each with its index into
    /// `[pre, layer, post]`: the part before the layers in the first chunk,
    /// the part after in the last.
    fn chunk_units(&self, stage: &Stage, v: usize, c: usize) -> Vec<(&UnitParams, usize)> {
        let layers = stage.layers / v + usize::from(c < stage.layers % v);
        let mut units = Vec::with_capacity(layers + 2);
        if stage.first && c == 0 {
            units.push((&self.pre, 0));
        }
        units.extend((0..layers).map(|_| (&self.layer, 1)));
        if stage.last && c + 1 == v {
            let post = if stage.first {
                &self.post_unshared
            } else {
                &self.post
            };
            units.push((post, 2));
        }
        units
    }

    fn stage_params(&self, stage: &Stage) -> StageParams<'_> {
        let units = self
            .stage_units(stage)
            .into_iter()
            .map(|(u, _, n)| (u, n))
            .collect();
        StageParams { units }
    }

    /// Parameter tensors `stage` holds (each stepped by its own kernel).
    pub(super) fn tensors(&self, stage: &Stage) -> usize {
        let params = self.stage_params(stage);
        params
            .units
            .iter()
            .map(|&(u, n)| n * (u.dense.len() + u.expert.len()))
            .sum()
    }

    fn time(&self, span: Span, c: Collective, a: Algorithm, bytes: f64) -> Result<f64, CommError> {
        comm::time(&self.cluster, span, c, a, bytes)
    }

    /// Seconds of one bucket of `bytes` of weights' gradients sent as
    /// `wire` says over `span`: its collectives one after another, the
    /// bytes shared among them, and the compression's own work.
    fn bucket(&self, span: Span, wire: GradWire, bytes: f64) -> Result<f64, CommError> {
        let calls = wire.calls.max(1) as f64;
        let each = bytes * wire.ratio(span.ranks()) / calls;
        let work = bytes * wire.work_per_byte;
        Ok(calls * self.time(span, wire.collective, wire.algorithm, each)? + work)
    }

    /// Seconds of the bucketed reduction of every gradient of `stage`, its
    /// collectives one after another: an all-reduce (ZeRO-0, by `cfg`'s
    /// algorithm and in its narrower type) or a reduce-scatter (ZeRO-1 to 3).
    fn reduction(&self, cfg: &TrainingConfig, stage: &Stage, wire: GradWire) -> Result<f64, CommError> {
        self.bucketed(cfg, stage, wire)
    }

    /// Seconds of ZeRO-1/2's refresh of `stage`'s weights after the
    /// optimizer step: all-gathers in buckets, as the reduction's.
    fn refresh(&self, cfg: &TrainingConfig, stage: &Stage) -> Result<f64, CommError> {
        self.bucketed(
            cfg,
            stage,
            GradWire::plain(Collective::AllGather, Algorithm::Ring),
        )
    }

    /// Seconds of `collective` over every tensor of `stage` (`ratio` of its
    /// bytes) in buckets of `cfg`'s cap per data-parallel group, one after
    /// another.
    fn bucketed(&self, cfg: &TrainingConfig, stage: &Stage, wire: GradWire) -> Result<f64, CommError> {
        let params = self.stage_params(stage);
        let cap = cfg.grad_reduce.bucket_bytes() as f64;
        let mut seconds = 0.0;
        for (expert, span) in [(false, self.data), (true, self.expert_data)] {
            let (count, bytes) = params.buckets(expert, cap);
            if count == 0 || span.ranks() <= 1 {
                continue;
            }
            seconds += count as f64 * self.bucket(span, wire, bytes / count as f64)?;
        }
        Ok(seconds)
    }

    /// Exposed data-parallel seconds of `stage` after its pipeline work:
    /// the reduction's tail behind the last backward pass (ZeRO-0/1/2; the
    /// whole reduction without overlap), ZeRO-2's reduce-scatters of earlier
    /// micro-batches beyond the micro-batch of compute beside them, ZeRO-1/2's
    /// weight refresh, and the tied embedding's gradient sum.
    pub(super) fn after_pipeline(
        &self,
        cfg: &TrainingConfig,
        stage: &Stage,
        times: [&UnitTime; 3],
        wire: GradWire,
    ) -> Result<f64, CommError> {
        let mut exposed = 0.0;
        if cfg.zero < 3 {
            exposed += self.reduction_tail(cfg, stage, times, wire)?;
            if cfg.zero == 2 {
                let reduce = self.reduction(cfg, stage, wire)?;
                let pass = |backward: bool| -> f64 {
                    self.stage_units(stage)
                        .iter()
                        .map(|&(_, i, n)| {
                            n as f64
                                * if backward {
                                    times[i].backward
                                } else {
                                    times[i].forward
                                }
                        })
                        .sum()
                };
                let (forward, backward) = (pass(false), pass(true));
                // The pipeline drains with backward passes alone: as many
                // as it filled with forward passes, each with only itself
                // beside the reduction of the one before. In the steady
                // state a forward and a backward pass run beside it.
                let m = cfg.micro_batches();
                let one = match cfg.schedule {
                    Schedule::Interleaved => 1.0 / cfg.virtual_stages.max(1) as f64,
                    _ => 1.0,
                };
                let filled = pipeline::in_flight(cfg.schedule, stage.index, cfg.pp, cfg.virtual_stages, m);
                let draining = (filled - one).clamp(0.0, (m - 1) as f64);
                let steady = (m - 1) as f64 - draining;
                exposed +=
                    draining * (reduce - backward).max(0.0) + steady * (reduce - forward - backward).max(0.0);
            }
            if cfg.zero >= 1 && self.data.ranks() > 1 {
                let refresh = self.refresh(cfg, stage)?;
                exposed += match cfg.overlap_param_gather {
                    true => self.refresh_beside_forward(cfg, stage, times, refresh),
                    false => refresh,
                };
            }
        }
        if cfg.pp > 1 && (stage.first || stage.last) && self.tied_bytes > 0.0 {
            exposed += self.time(self.ends, Collective::AllReduce, Algorithm::Ring, self.tied_bytes)?;
        }
        Ok(exposed)
    }

    /// Exposed seconds of ZeRO-1/2's weight refresh (`refresh` seconds in
    /// all) run beside the next step's first forward passes: each unit's
    /// share gathered one unit ahead of the unit computing, the first
    /// waited for (Megatron-Core's `--overlap-param-gather`). The
    /// interleaved schedule fills the pipeline chunk by chunk, each for a
    /// group of micro-batches, so a chunk's weights are gathered while the
    /// chunks before it run.
    fn refresh_beside_forward(
        &self,
        cfg: &TrainingConfig,
        stage: &Stage,
        times: [&UnitTime; 3],
        refresh: f64,
    ) -> f64 {
        let bytes = |u: &UnitParams| {
            let (d, e) = u.bytes();
            d + e
        };
        let (v, group) = self.chunking(cfg);
        let chunks: Vec<_> = (0..v).map(|c| self.chunk_units(stage, v, c)).collect();
        let total: f64 = chunks.iter().flatten().map(|&(u, _)| bytes(u)).sum();
        if total <= 0.0 {
            return 0.0;
        }
        let mut steps = Vec::new();
        for chunk in &chunks {
            let pass: f64 = chunk.iter().map(|&(_, i)| times[i].forward).sum();
            steps.extend(chunk.iter().map(|&(u, i)| Step {
                gather: refresh * bytes(u) / total,
                compute: times[i].forward,
                reduce: 0.0,
            }));
            if v > 1 {
                steps.push(Step {
                    gather: 0.0,
                    compute: (group - 1) as f64 * pass,
                    reduce: 0.0,
                });
            }
        }
        lane_exposed(&[&steps], 1)
    }

    /// Model chunks per stage under `cfg`'s schedule, and how many
    /// micro-batches run through a chunk in a row while the interleaved
    /// schedule fills or drains the pipeline (up to `pp`).
    fn chunking(&self, cfg: &TrainingConfig) -> (usize, usize) {
        let v = match cfg.schedule {
            Schedule::Interleaved => cfg.virtual_stages.max(1),
            _ => 1,
        };
        (v, cfg.pp.min(cfg.micro_batches()).max(1))
    }

    /// Exposed seconds of the reduction after the last micro-batch's
    /// backward pass on `stage` (ZeRO-0/1/2), replayed on one lane: each
    /// unit's gradients complete when its backward pass ends and join the
    /// open bucket of their group, a full bucket is issued at once, the open
    /// ones when the backward pass ends, and tied weights' after it. Without
    /// overlap everything waits for the backward pass.
    fn reduction_tail(
        &self,
        cfg: &TrainingConfig,
        stage: &Stage,
        times: [&UnitTime; 3],
        wire: GradWire,
    ) -> Result<f64, CommError> {
        let cap = cfg.grad_reduce.bucket_bytes() as f64;
        let spans = [self.data, self.expert_data];
        let one = |group: usize, bytes: f64| -> Result<f64, CommError> {
            match spans[group].ranks() > 1 && bytes > 0.0 {
                true => self.bucket(spans[group], wire, bytes),
                false => Ok(0.0),
            }
        };
        // Per group (dense, expert): the open bucket and its bytes; each
        // bucket closed with when it is issued (`None`: when the backward
        // pass ends) and its group and bytes.
        let mut fills = [BucketFill::new(cap), BucketFill::new(cap)];
        let mut held = [0.0f64; 2];
        let mut issued: Vec<(Option<f64>, usize, f64)> = Vec::new();
        let mut clock = 0.0f64;
        let mut late = Vec::new();
        // Each chunk's gradients complete in its last backward pass. The
        // interleaved schedule drains chunk by chunk, the last first, each
        // in a group of up to `pp` micro-batches: a chunk's earlier passes
        // in its group run after the chunks before it have completed.
        let (v, group) = self.chunking(cfg);
        let mut units = Vec::new();
        for (k, c) in (0..v).rev().enumerate() {
            let mut chunk = self.chunk_units(stage, v, c);
            chunk.reverse();
            if k > 0 {
                let pass: f64 = chunk.iter().map(|&(_, i)| times[i].backward).sum();
                units.push((None, (group - 1) as f64 * pass));
            }
            units.extend(chunk.into_iter().map(|(u, i)| (Some(u), times[i].backward)));
        }
        for (params, backward) in units {
            clock += backward;
            let Some(params) = params else { continue };
            {
                let at = cfg.overlap_grad_reduce.then_some(clock);
                let dense = params.dense.iter().zip(&params.tied);
                let tensors = dense
                    .map(|(&b, &tied)| (0, b, tied))
                    .chain(params.expert.iter().map(|&b| (1, b, false)));
                for (group, bytes, tied) in tensors {
                    if tied {
                        late.push(bytes);
                        continue;
                    }
                    held[group] += bytes;
                    if fills[group].add(bytes) {
                        issued.push((at, group, std::mem::take(&mut held[group])));
                    }
                }
            }
        }
        for (group, bytes) in held.into_iter().enumerate().filter(|&(_, b)| b > 0.0) {
            issued.push((None, group, bytes));
        }
        let mut tied_fill = BucketFill::new(cap);
        let mut tied_held = 0.0;
        for bytes in late {
            tied_held += bytes;
            if tied_fill.add(bytes) {
                issued.push((None, 0, std::mem::take(&mut tied_held)));
            }
        }
        if tied_held > 0.0 {
            issued.push((None, 0, tied_held));
        }
        let mut lane = 0.0f64;
        for (at, group, bytes) in issued {
            lane = lane.max(at.unwrap_or(clock)) + one(group, bytes)?;
        }
        Ok((lane - clock).max(0.0))
    }

    /// Bytes a rank of `stage` sends per step in data-parallel traffic:
    /// ZeRO-0 all-reduces once; ZeRO-1 reduce-scatters once and ZeRO-2 once
    /// per micro-batch, both then all-gather the weights; ZeRO-3 gathers
    /// twice and reduce-scatters once per micro-batch; plus the tied sum.
    /// Gradients go as `wire` says (compressed, or f32 main gradients);
    /// weights go as they are.
    pub(super) fn sent(&self, cfg: &TrainingConfig, stage: &Stage, wire: GradWire) -> Result<f64, CommError> {
        let params = self.stage_params(stage);
        let m = cfg.micro_batches() as f64;
        let mut total = 0.0;
        for (expert, span) in [(false, self.data), (true, self.expert_data)] {
            let (_, bytes) = params.buckets(expert, f64::INFINITY);
            let n = span.ranks();
            let one = |c: Collective, a: Algorithm| comm::bytes_sent(c, a, n, bytes).map(|b| b[0]);
            let ring = Algorithm::Ring;
            let grads = comm::bytes_sent(wire.collective, wire.algorithm, n, bytes * wire.ratio(n))?[0];
            total += match cfg.zero {
                0 => grads,
                1 => grads + one(Collective::AllGather, ring)?,
                2 => m * grads + one(Collective::AllGather, ring)?,
                _ => m * (2.0 * one(Collective::AllGather, ring)? + grads),
            };
        }
        if cfg.pp > 1 && (stage.first || stage.last) && self.tied_bytes > 0.0 {
            total += comm::bytes_sent(Collective::AllReduce, Algorithm::Ring, 2, self.tied_bytes)?[0];
        }
        Ok(total)
    }

    /// ZeRO-3's exposed seconds per micro-batch on `stage`: the units run
    /// forward then backward on the compute stream; before each, its
    /// parameters are gathered (issued when the unit before it starts), and
    /// after each backward unit its gradients' reduce-scatter is issued.
    pub(super) fn zero3_exposed(
        &self,
        cfg: &TrainingConfig,
        stage: &Stage,
        times: [&UnitTime; 3],
    ) -> Result<f64, CommError> {
        if cfg.zero != 3 || self.data.ranks() <= 1 {
            return Ok(0.0);
        }
        let reduction = self.reduction(
            cfg,
            stage,
            GradWire::plain(Collective::ReduceScatter, Algorithm::Ring),
        )?;
        let params = self.stage_params(stage);
        let total_bytes: f64 = params
            .units
            .iter()
            .map(|&(u, n)| {
                let (d, e) = u.bytes();
                (d + e) * n as f64
            })
            .sum();
        let rs = |u: &UnitParams| {
            let (d, e) = u.bytes();
            match total_bytes > 0.0 {
                true => reduction * (d + e) / total_bytes,
                false => 0.0,
            }
        };
        let step = |u: &UnitParams, t: &UnitTime, backward: bool| match backward {
            false => Step {
                gather: u.gathers,
                compute: t.forward,
                reduce: 0.0,
            },
            true => Step {
                gather: u.gathers,
                compute: t.backward,
                reduce: rs(u),
            },
        };
        // One task per model chunk (interleaved schedules run several per
        // stage), each gathering for itself: forward in order, backward in
        // reverse, the part before the layers in the first chunk, the part
        // after in the last.
        let v = cfg.virtual_stages.max(1);
        let task = |c: usize, backward: bool| {
            let mut steps: Vec<Step> = self
                .chunk_units(stage, v, c)
                .into_iter()
                .map(|(u, i)| step(u, times[i], backward))
                .collect();
            if backward {
                steps.reverse();
            }
            steps
        };
        let mut tasks: Vec<Vec<Step>> = (0..v).map(|c| task(c, false)).collect();
        tasks.extend((0..v).rev().map(|c| task(c, true)));
        let tasks: Vec<&[Step]> = tasks.iter().map(Vec::as_slice).collect();
        Ok(lane_exposed(&tasks, cfg.zero3_prefetch))
    }
}

/// One unit's turn on the compute stream with its ZeRO-3 traffic.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// Gathering its parameters, before it can start.
    gather: f64,
    compute: f64,
    /// Reducing its gradients, issued when it ends.
    reduce: f64,
}

/// Seconds the compute stream waits, or the lane runs past it, when the
/// `tasks` (a forward, then a backward pass) run their steps in order with
/// their collectives one at a time on one lane. As lowering emits them, a
/// task gathers its first step's weights and the `prefetch` steps after it
/// at its start (the first waits), then at each step's start those of the
/// step `prefetch` ahead; with `prefetch` 0 each step's gather is issued
/// when it starts. A step's reduction is issued when it ends.
fn lane_exposed(tasks: &[&[Step]], prefetch: usize) -> f64 {
    let (mut lane, mut clock, mut busy) = (0.0f64, 0.0f64, 0.0);
    for steps in tasks {
        let mut ready = vec![0.0f64; steps.len()];
        let issue = |lane: &mut f64, ready: &mut [f64], at: f64, i: usize| {
            if let Some(s) = steps.get(i) {
                *lane = lane.max(at) + s.gather;
                ready[i] = *lane;
            }
        };
        for i in 0..prefetch {
            issue(&mut lane, &mut ready, clock, i);
        }
        for (i, s) in steps.iter().enumerate() {
            issue(&mut lane, &mut ready, clock, i + prefetch);
            let start = clock.max(ready[i]);
            clock = start + s.compute;
            busy += s.compute;
            if s.reduce > 0.0 {
                lane = lane.max(clock) + s.reduce;
            }
        }
    }
    clock.max(lane) - busy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(gather: f64, compute: f64, reduce: f64) -> Step {
        Step {
            gather,
            compute,
            reduce,
        }
    }

    #[test]
    fn prefetched_gathers_shorter_than_compute_expose_only_the_first() {
        let steps = vec![step(1.0, 3.0, 0.0); 4];
        assert_eq!(lane_exposed(&[&steps], 1), 1.0);
        assert_eq!(lane_exposed(&[&steps], 2), 1.0);
    }

    #[test]
    fn gathers_not_prefetched_are_all_exposed() {
        let steps = vec![step(1.0, 3.0, 0.0); 4];
        assert_eq!(lane_exposed(&[&steps], 0), 4.0);
    }

    #[test]
    fn each_task_waits_for_its_first_gather() {
        let steps = vec![step(1.0, 3.0, 0.0); 4];
        assert_eq!(lane_exposed(&[&steps, &steps], 1), 2.0);
    }

    #[test]
    fn gathers_longer_than_compute_pace_the_stream() {
        // Each gather takes 2, each step 1: the first waits 2, then each
        // next one waits 1 more.
        let steps = vec![step(2.0, 1.0, 0.0); 3];
        assert_eq!(lane_exposed(&[&steps], 1), 2.0 + 1.0 + 1.0);
    }

    #[test]
    fn reductions_hide_under_later_steps_but_the_last() {
        let steps = [step(0.0, 4.0, 1.0), step(0.0, 4.0, 1.0)];
        assert_eq!(lane_exposed(&[&steps], 1), 1.0);
        // Without prefetch a gather queues behind the reduction before it:
        // the second step waits 3 for the reduction and 1 for its gather.
        let steps = [step(0.0, 1.0, 3.0), step(1.0, 4.0, 0.0)];
        assert_eq!(lane_exposed(&[&steps], 0), 4.0);
    }

    /// A layer of two 1 MB gradients and a tied 2 MB embedding, on a
    /// stage holding everything, over 8 ranks of one node.
    fn traffic() -> Traffic {
        let cluster = Cluster::preset("dgx-h100").unwrap().with_gpus(8).unwrap();
        let span = Span {
            per_node: 8,
            nodes: 1,
        };
        let unit = |dense: Vec<f64>, tied: Vec<bool>| UnitParams {
            dense,
            expert: vec![],
            tied,
            gathers: 0.0,
        };
        Traffic {
            pre: unit(vec![2e6], vec![true]),
            layer: unit(vec![1e6, 1e6], vec![false, false]),
            post: unit(vec![2e6], vec![true]),
            post_unshared: unit(vec![], vec![]),
            tied_bytes: 2e6,
            cluster,
            data: span,
            expert_data: span,
            ends: span,
        }
    }

    fn config(bucket_mib: u32, overlap: bool) -> TrainingConfig {
        TrainingConfig {
            dp: 8,
            overlap_grad_reduce: overlap,
            grad_reduce: crate::GradReduce {
                bucket_mib,
                ..Default::default()
            },
            ..TrainingConfig::default()
        }
    }

    /// Seconds of a ring all-reduce of `bytes` over `t`'s data-parallel group.
    fn all_reduce(t: &Traffic, bytes: f64) -> f64 {
        t.time(t.data, Collective::AllReduce, Algorithm::Ring, bytes)
            .unwrap()
    }

    fn one_stage(layers: usize, index: usize, pp: usize) -> Stage {
        Stage {
            index,
            layers,
            first: index == 0,
            last: index + 1 == pp,
            recompute: crate::Recompute::None,
        }
    }

    #[test]
    fn zero2_reductions_pile_up_while_the_pipeline_drains() {
        let t = traffic();
        let none = UnitTime::default();
        // Eight micro-batches of 4 layers of 1 s forward and 1 s backward,
        // 8 MB of gradients each (a middle stage: nothing tied).
        let layer = UnitTime {
            forward: 1.0,
            backward: 1.0,
            ..UnitTime::default()
        };
        let cfg = |pp: usize| TrainingConfig {
            zero: 2,
            pp,
            global_batch: 64,
            ..config(25, true)
        };
        let exposed = |pp: usize, index: usize, ratio: f64| {
            let c = cfg(pp);
            let stage = Stage {
                first: false,
                last: false,
                ..one_stage(4, index, pp)
            };
            let times = [&none, &layer, &none];
            let wire = GradWire::scaled(Collective::ReduceScatter, Algorithm::Ring, ratio);
            let tail = t.reduction_tail(&c, &stage, times, wire).unwrap();
            let refresh = t.refresh(&c, &stage).unwrap();
            t.after_pipeline(&c, &stage, times, wire).unwrap() - tail - refresh
        };
        let reduce = |ratio: f64| {
            t.time(t.data, Collective::ReduceScatter, Algorithm::Ring, 8e6 * ratio)
                .unwrap()
        };
        // Scaled so one micro-batch's reduction takes 6 s: more than its
        // backward pass (4 s), less than a forward and a backward (8 s).
        // (Latency plus bytes over bandwidth: affine in the ratio.)
        let ratio = (6.0 - reduce(0.0)) / (reduce(1.0) - reduce(0.0));
        assert!((reduce(ratio) - 6.0).abs() < 1e-9);
        // No pipeline: every reduction but the last hides beside the next
        // micro-batch's passes.
        assert!(exposed(1, 0, ratio).abs() < 1e-9);
        // The first of four stages drains three backward passes alone,
        // each leaving 2 s of the reduction before it; the last stage none.
        assert!((exposed(4, 0, ratio) - 3.0 * 2.0).abs() < 1e-9);
        assert!(exposed(4, 3, ratio).abs() < 1e-9);
    }

    const ALL_REDUCE: GradWire = GradWire::plain(Collective::AllReduce, Algorithm::Ring);

    /// A unit whose backward pass takes `seconds` and nothing else.
    fn backward_only(seconds: f64) -> UnitTime {
        UnitTime {
            backward: seconds,
            ..UnitTime::default()
        }
    }

    #[test]
    fn an_interleaved_stage_reduces_its_last_chunk_while_the_first_drains() {
        let t = traffic();
        let stage = one_stage(4, 0, 1);
        let (layer, none) = (backward_only(1.0), UnitTime::default());
        let ar = |bytes: f64| all_reduce(&t, bytes);
        // Each 1 MB gradient takes 0.75 s to reduce; the tied 2 MB one `tied`.
        let ratio = (0.75 - ar(0.0)) / (ar(1e6) - ar(0.0));
        let tied = ar(2e6 * ratio);
        let tail = |schedule: Schedule, virtual_stages: usize| {
            let cfg = TrainingConfig {
                pp: 4,
                global_batch: 64,
                schedule,
                virtual_stages,
                ..config(0, true)
            };
            let wire = GradWire::scaled(Collective::AllReduce, Algorithm::Ring, ratio);
            t.reduction_tail(&cfg, &stage, [&none, &layer, &none], wire)
                .unwrap()
        };
        // One pass: eight reductions issued two per second from 1 s on
        // end at 7 s, 3 s after the pass; then the tied one.
        let one = tail(Schedule::OneFOneB, 1);
        assert!((one - (3.0 + tied)).abs() < 1e-9, "{one}");
        // Two chunks in groups of 4: the last chunk's four reductions run
        // while the first chunk's three earlier passes drain (6 s); its
        // own four end 2 s after the stage does.
        let two = tail(Schedule::Interleaved, 2);
        assert!((two - (2.0 + tied)).abs() < 1e-9, "{two}");
    }

    #[test]
    fn the_weight_gather_beside_the_forward_pass_waits_only_where_it_is_ahead() {
        let t = traffic();
        let stage = one_stage(4, 0, 1);
        let second = UnitTime {
            forward: 1.0,
            backward: 2.0,
            ..UnitTime::default()
        };
        let none = UnitTime::default();
        // 10 MB in forward order: the embedding's 2 MB, then 2 MB per
        // layer, each gathered while the unit before it runs.
        let quick = t.refresh_beside_forward(&config(25, true), &stage, [&second, &second, &none], 1.0);
        assert!((quick - 0.2).abs() < 1e-9, "{quick}");
        // Gathers of 1.5 s per unit outrun the units' 1 s: each layer waits.
        let slow = t.refresh_beside_forward(&config(25, true), &stage, [&second, &second, &none], 7.5);
        assert!((slow - (1.5 + 4.0 * 0.5)).abs() < 1e-9, "{slow}");
    }

    #[test]
    fn buckets_hide_under_the_backward_pass_but_what_follows_it() {
        let t = traffic();
        let stage = one_stage(4, 0, 1);
        let (layer, none) = (backward_only(1.0), UnitTime::default());
        let ar = |bytes: f64| all_reduce(&t, bytes);
        // One collective per tensor: each layer's two hide under the next
        // layer's second of backward; the last layer's and the tied
        // embedding's follow the backward pass.
        let tail = t
            .reduction_tail(&config(0, true), &stage, [&none, &layer, &none], ALL_REDUCE)
            .unwrap();
        assert!((tail - (2.0 * ar(1e6) + ar(2e6))).abs() < 1e-12, "{tail}");
        // Without overlap, all of it: 8 layer tensors and the embedding.
        let all = t
            .reduction_tail(&config(0, false), &stage, [&none, &layer, &none], ALL_REDUCE)
            .unwrap();
        assert!((all - (8.0 * ar(1e6) + ar(2e6))).abs() < 1e-12, "{all}");
        // One bucket for everything but the tied weight: it waits for the end.
        let one = t
            .reduction_tail(&config(25, true), &stage, [&none, &layer, &none], ALL_REDUCE)
            .unwrap();
        assert!((one - (ar(8e6) + ar(2e6))).abs() < 1e-12, "{one}");
    }
}

//! Memory model: what one GPU of a pipeline stage holds at its peak —
//! weights, gradients and Adam state under ZeRO 0-3 (mixed precision keeps
//! an f32 master copy of 16-bit weights), the activations its schedule keeps
//! in flight under a recomputation policy, and communication buffers.

use crate::config::{Recompute, TrainingConfig};
use crate::pipeline::{self, Stage};
use crate::workload::{ParamShard, Workload};
use autopar_ir::DType;
use serde::Serialize;
use std::collections::BTreeMap;

/// Bytes one GPU holds at its peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MemoryBreakdown {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    /// Point-to-point and ZeRO-3 gather buffers.
    pub communication: f64,
    pub total: f64,
}

/// Bytes per parameter of the Adam state: an f32 master copy when weights
/// are narrower than f32, plus two f32 moments.
pub fn optimizer_bytes_per_param(weight: DType) -> f64 {
    let master = if weight.size_bits() < 32 { 4.0 } else { 0.0 };
    master + 8.0
}

/// Weights, gradients (in the weights' type) and optimizer state of
/// `params`, sharded by ZeRO `stage` over `dp` data-parallel ranks (`dp`
/// divided by `ep` for expert weights, whose replicas are fewer).
pub fn model_state(params: &BTreeMap<usize, ParamShard>, zero: u8, dp: usize, ep: usize) -> (f64, f64, f64) {
    let (mut weights, mut grads, mut optimizer) = (0.0, 0.0, 0.0);
    for p in params.values() {
        let replicas = if p.expert { dp / ep.max(1) } else { dp }.max(1) as f64;
        let shard = |from_stage: u8| if zero >= from_stage { replicas } else { 1.0 };
        let bytes = p.dtype.size_bits() as f64 / 8.0;
        weights += p.elements * bytes / shard(3);
        grads += p.elements * bytes / shard(2);
        optimizer += p.elements * optimizer_bytes_per_param(p.dtype) / shard(1);
    }
    (weights, grads, optimizer)
}

/// The parameters stage `stage` holds: its layers and, on the end stages,
/// the parts before and after them (a weight tied between both counted once).
pub fn stage_params(w: &Workload, stage: &Stage) -> BTreeMap<usize, ParamShard> {
    let mut params = BTreeMap::new();
    if stage.first {
        params.extend(w.pre.params.clone());
    }
    if stage.last {
        params.extend(w.post.params.clone());
    }
    // Layers repeat the representative's tensors: scale them into one entry each.
    for (&id, p) in &w.layer.params {
        params.insert(
            id,
            ParamShard {
                elements: p.elements * stage.layers as f64,
                ..*p
            },
        );
    }
    params
}

/// Activation bytes one micro-batch keeps for one layer under `policy`.
pub fn layer_activations(w: &Workload, policy: Recompute, sp: bool, tp: usize) -> f64 {
    match policy {
        Recompute::None => w.layer.saved_bytes,
        Recompute::Selective => w.layer.saved_bytes - w.layer.selective_bytes,
        Recompute::Full => checkpoint_bytes(w, sp, tp),
    }
}

/// A layer's checkpointed input under full recomputation.
fn checkpoint_bytes(w: &Workload, sp: bool, tp: usize) -> f64 {
    if sp {
        w.boundary_bytes / tp as f64
    } else {
        w.boundary_bytes
    }
}

/// Peak memory of one GPU on `stage`.
pub fn stage_memory(w: &Workload, cfg: &TrainingConfig, stage: &Stage) -> MemoryBreakdown {
    let (weights, gradients, optimizer) =
        model_state(&stage_params(w, stage), cfg.zero, cfg.dp * cfg.cp, cfg.ep);
    let in_flight = pipeline::in_flight(
        cfg.schedule,
        stage.index,
        cfg.pp,
        cfg.virtual_stages,
        cfg.micro_batches(),
    );
    let mut per_micro_batch = stage.layers as f64 * layer_activations(w, cfg.recompute, cfg.sp, cfg.tp);
    if stage.first {
        per_micro_batch += w.pre.saved_bytes;
    }
    if stage.last {
        per_micro_batch += w.post.saved_bytes;
    }
    let mut activations = in_flight * per_micro_batch;
    if stage.layers > 0 {
        // The layer being recomputed holds what it redoes during its backward.
        activations += match cfg.recompute {
            Recompute::None => 0.0,
            Recompute::Selective => w.layer.selective_bytes,
            Recompute::Full => w.layer.saved_bytes,
        };
    }
    if stage.last {
        // The outputs (logits) and their gradient while the loss runs.
        activations += 2.0 * w.output_bytes;
    }
    let mut communication = 0.0;
    if cfg.pp > 1 {
        // A send and a receive buffer for the stage boundary.
        communication += 2.0 * checkpoint_bytes(w, cfg.sp, cfg.tp);
    }
    let shards = cfg.dp * cfg.cp;
    if cfg.zero == 3 && shards > 1 {
        communication += zero3_gather_bytes(w, stage) * (1.0 - 1.0 / shards as f64);
    }
    MemoryBreakdown {
        weights,
        gradients,
        optimizer,
        activations,
        communication,
        total: weights + gradients + optimizer + activations + communication,
    }
}

/// Full weights ZeRO-3 holds gathered at once on `stage`: the layer in use
/// and the next one prefetched, or the part before or after the layers when
/// that is larger (an embedding table). Each gathered weight's own shard is
/// already counted, so the caller scales by `1 − 1/shards`.
fn zero3_gather_bytes(w: &Workload, stage: &Stage) -> f64 {
    let bytes = |params: &BTreeMap<usize, ParamShard>| -> f64 {
        params
            .values()
            .map(|p| p.elements * p.dtype.size_bits() as f64 / 8.0)
            .sum()
    };
    let layers = bytes(&w.layer.params) * stage.layers.min(2) as f64;
    let pre = if stage.first { bytes(&w.pre.params) } else { 0.0 };
    let post = if stage.last { bytes(&w.post.params) } else { 0.0 };
    layers.max(pre).max(post).min(bytes(&stage_params(w, stage)))
}

/// The stage with the highest peak, and its breakdown.
pub fn peak_memory(w: &Workload, cfg: &TrainingConfig, stages: &[Stage]) -> (usize, MemoryBreakdown) {
    stages
        .iter()
        .map(|s| (s.index, stage_memory(w, cfg, s)))
        .max_by(|a, b| a.1.total.total_cmp(&b.1.total))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: f64, expert: bool) -> BTreeMap<usize, ParamShard> {
        BTreeMap::from([(
            0,
            ParamShard {
                elements: n,
                dtype: DType::Bf16,
                expert,
            },
        )])
    }

    #[test]
    fn mixed_precision_adam_is_sixteen_bytes_per_parameter() {
        // ZeRO paper: 2 (bf16 weights) + 2 (bf16 grads) + 12 (f32 master, m, v).
        let (w, g, o) = model_state(&params(1e9, false), 0, 8, 1);
        assert_eq!((w, g, o), (2e9, 2e9, 12e9));
        assert_eq!(optimizer_bytes_per_param(DType::F32), 8.0);
    }

    #[test]
    fn zero_stages_shard_state_progressively() {
        let p = params(1e9, false);
        let total = |z| {
            let (w, g, o) = model_state(&p, z, 8, 1);
            w + g + o
        };
        assert_eq!(total(0), 16e9);
        assert_eq!(total(1), 2e9 + 2e9 + 12e9 / 8.0);
        assert_eq!(total(2), 2e9 + 2e9 / 8.0 + 12e9 / 8.0);
        assert_eq!(total(3), 16e9 / 8.0);
    }

    #[test]
    fn expert_state_shards_over_fewer_replicas() {
        let (_, _, o) = model_state(&params(1e9, true), 1, 8, 4);
        assert_eq!(o, 12e9 / 2.0);
    }
}

//! Memory model: what one GPU of a pipeline stage holds at its peak —
//! weights, gradients and Adam state under ZeRO 0-3 (mixed precision keeps
//! an f32 master copy of 16-bit weights), the activations its schedule keeps
//! in flight under its recomputation policy, and communication buffers.

use crate::config::{Recompute, TrainingConfig};
use crate::pipeline::{self, Stage};
use crate::workload::{ParamShard, Workload};
use autopar_ir::DType;
use serde::Serialize;

/// Bytes one GPU holds at its peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct MemoryBreakdown {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    /// Point-to-point and ZeRO-3 gather buffers.
    pub communication: f64,
    pub total: f64,
}

impl MemoryBreakdown {
    /// The parts with names for people, in a fixed order (without the total).
    pub fn parts(&self) -> [(&'static str, f64); 5] {
        [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer),
            ("activations", self.activations),
            ("comm buffers", self.communication),
        ]
    }
}

/// Bytes per parameter of the Adam state: an f32 master copy when weights
/// are narrower than f32, plus two f32 moments.
pub fn optimizer_bytes_per_param(weight: DType) -> f64 {
    let master = if weight.size_bits() < 32 { 4.0 } else { 0.0 };
    master + 8.0
}

/// Weight bytes and Adam-state bytes of some parameters on one rank, split
/// into dense weights and MoE expert weights (which have fewer replicas).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ParamBytes {
    pub dense: f64,
    pub dense_state: f64,
    pub expert: f64,
    pub expert_state: f64,
}

impl ParamBytes {
    /// Totals of `params`.
    pub fn of<'a>(params: impl IntoIterator<Item = &'a ParamShard>) -> ParamBytes {
        let mut t = ParamBytes::default();
        for p in params {
            let bytes = p.elements * p.dtype.size_bits() as f64 / 8.0;
            let state = p.elements * optimizer_bytes_per_param(p.dtype);
            if p.expert {
                t.expert += bytes;
                t.expert_state += state;
            } else {
                t.dense += bytes;
                t.dense_state += state;
            }
        }
        t
    }

    /// `self + k · other`.
    pub fn plus(self, other: ParamBytes, k: f64) -> ParamBytes {
        ParamBytes {
            dense: self.dense + k * other.dense,
            dense_state: self.dense_state + k * other.dense_state,
            expert: self.expert + k * other.expert,
            expert_state: self.expert_state + k * other.expert_state,
        }
    }

    /// Weight bytes, dense and expert together.
    pub fn weights(&self) -> f64 {
        self.dense + self.expert
    }
}

/// The parameter totals of a workload's parts, from which any stage's follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartParams {
    pub pre: ParamBytes,
    pub layer: ParamBytes,
    pub post: ParamBytes,
    /// The post-layers part less the weights it shares with the pre-layers
    /// part (a tied embedding), for a stage that holds both.
    pub post_unshared: ParamBytes,
}

impl PartParams {
    /// Totals of `w`'s parts.
    pub fn of(w: &Workload) -> PartParams {
        let unshared: Vec<&ParamShard> = w
            .post
            .params
            .iter()
            .filter(|(id, _)| !w.pre.params.contains_key(id))
            .map(|(_, p)| p)
            .collect();
        PartParams {
            pre: ParamBytes::of(w.pre.params.values()),
            layer: ParamBytes::of(w.layer.params.values()),
            post: ParamBytes::of(w.post.params.values()),
            post_unshared: ParamBytes::of(unshared),
        }
    }

    /// What `stage` holds: its layers and, on the end stages, the parts
    /// before and after them (a weight tied between both counted once).
    pub fn stage(&self, stage: &Stage) -> ParamBytes {
        let mut t = ParamBytes::default().plus(self.layer, stage.layers as f64);
        if stage.first {
            t = t.plus(self.pre, 1.0);
        }
        if stage.last {
            let post = if stage.first {
                self.post_unshared
            } else {
                self.post
            };
            t = t.plus(post, 1.0);
        }
        t
    }
}

/// Weights, gradients (`grads_per_weight` bytes per weight byte: 1 in the
/// weights' type) and optimizer state of `params`, sharded by ZeRO `stage`
/// over `dp` data-parallel ranks (`dp` divided by `ep` for expert weights,
/// whose replicas are fewer).
pub fn model_state(
    params: &ParamBytes,
    zero: u8,
    dp: usize,
    ep: usize,
    grads_per_weight: f64,
) -> (f64, f64, f64) {
    let replicas = |expert: bool| if expert { dp / ep.max(1) } else { dp }.max(1) as f64;
    let shard = |from_stage: u8, expert: bool| if zero >= from_stage { replicas(expert) } else { 1.0 };
    let weights = params.dense / shard(3, false) + params.expert / shard(3, true);
    let grads = grads_per_weight * (params.dense / shard(2, false) + params.expert / shard(2, true));
    let optimizer = params.dense_state / shard(1, false) + params.expert_state / shard(1, true);
    (weights, grads, optimizer)
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
pub fn stage_memory(
    w: &Workload,
    parts: &PartParams,
    cfg: &TrainingConfig,
    stage: &Stage,
) -> MemoryBreakdown {
    let params = parts.stage(stage);
    let grads_per_weight = cfg.grad_reduce.held_per_weight_byte(w.compute_dtype);
    let (weights, gradients, optimizer) =
        model_state(&params, cfg.zero, cfg.dp * cfg.cp, cfg.ep, grads_per_weight);
    let in_flight = pipeline::in_flight(
        cfg.schedule,
        stage.index,
        cfg.pp,
        cfg.virtual_stages,
        cfg.micro_batches(),
    );
    let mut per_micro_batch = stage.layers as f64 * layer_activations(w, stage.recompute, cfg.sp, cfg.tp);
    if stage.first {
        per_micro_batch += w.pre.saved_bytes;
    }
    if stage.last {
        per_micro_batch += w.post.saved_bytes;
    }
    let mut activations = in_flight * per_micro_batch;
    if stage.layers > 0 {
        // The layer being recomputed holds what it redoes during its
        // backward pass, and the inputs it gathers again.
        activations += w.layer.regathered_bytes
            + match stage.recompute {
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
        communication += zero3_gather_bytes(parts, stage) * (1.0 - 1.0 / shards as f64);
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
fn zero3_gather_bytes(parts: &PartParams, stage: &Stage) -> f64 {
    let layers = parts.layer.weights() * stage.layers.min(2) as f64;
    let pre = if stage.first { parts.pre.weights() } else { 0.0 };
    let post = if stage.last { parts.post.weights() } else { 0.0 };
    layers.max(pre).max(post).min(parts.stage(stage).weights())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n: f64, expert: bool) -> ParamBytes {
        ParamBytes::of(&[ParamShard {
            elements: n,
            rows: 1.0,
            dtype: DType::Bf16,
            expert,
        }])
    }

    #[test]
    fn mixed_precision_adam_is_sixteen_bytes_per_parameter() {
        // ZeRO paper: 2 (bf16 weights) + 2 (bf16 grads) + 12 (f32 master, m, v).
        let (w, g, o) = model_state(&params(1e9, false), 0, 8, 1, 1.0);
        assert_eq!((w, g, o), (2e9, 2e9, 12e9));
        assert_eq!(optimizer_bytes_per_param(DType::F32), 8.0);
    }

    #[test]
    fn f32_main_grads_take_four_bytes_per_parameter() {
        // Megatron-LM with bf16: 2 (weights) + 4 (f32 main grads) + 12.
        let f32_grads = crate::GradReduce {
            f32_main_grads: true,
            ..Default::default()
        };
        let per_weight = f32_grads.held_per_weight_byte(DType::Bf16);
        let (w, g, o) = model_state(&params(1e9, false), 0, 8, 1, per_weight);
        assert_eq!((w, g, o), (2e9, 4e9, 12e9));
        // f32 weights' gradients are f32 already.
        assert_eq!(f32_grads.held_per_weight_byte(DType::F32), 1.0);
        // Compression narrows what is sent, not what is held.
        let compressed = crate::GradReduce {
            compression: Some(crate::GradCompression::Bf16),
            ..f32_grads
        };
        assert_eq!(compressed.held_per_weight_byte(DType::Bf16), 2.0);
        assert_eq!(compressed.sent_per_weight_byte(DType::Bf16), 1.0);
        assert_eq!(f32_grads.sent_per_weight_byte(DType::Bf16), 2.0);
    }

    #[test]
    fn zero_stages_shard_state_progressively() {
        let p = params(1e9, false);
        let total = |z| {
            let (w, g, o) = model_state(&p, z, 8, 1, 1.0);
            w + g + o
        };
        assert_eq!(total(0), 16e9);
        assert_eq!(total(1), 2e9 + 2e9 + 12e9 / 8.0);
        assert_eq!(total(2), 2e9 + 2e9 / 8.0 + 12e9 / 8.0);
        assert_eq!(total(3), 16e9 / 8.0);
    }

    #[test]
    fn expert_state_shards_over_fewer_replicas() {
        let (_, _, o) = model_state(&params(1e9, true), 1, 8, 4, 1.0);
        assert_eq!(o, 12e9 / 2.0);
    }

    #[test]
    fn a_tied_weight_is_held_once_on_a_single_stage() {
        let table = ParamShard {
            elements: 100.0,
            rows: 10.0,
            dtype: DType::F32,
            expert: false,
        };
        let w = ParamBytes::of([&table]);
        let parts = PartParams {
            pre: w,
            layer: ParamBytes::default(),
            post: w,
            post_unshared: ParamBytes::default(),
        };
        let only = Stage {
            index: 0,
            layers: 0,
            first: true,
            last: true,
            recompute: Recompute::None,
        };
        assert_eq!(parts.stage(&only).dense, 400.0);
        let last = Stage { first: false, ..only };
        assert_eq!(parts.stage(&last).dense, 400.0);
    }
}

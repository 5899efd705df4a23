//! Published training runs the cost model is checked against, each table
//! with the FLOP formula its authors counted by and how they trained:
//! Megatron-LM's weak-scaling GPT runs on Selene (Narayanan et al., SC'21,
//! Table 1; the development set) and Megatron-Core's on H100s (the
//! Megatron-LM README's model table).

use crate::config::{Recompute, Schedule, TrainingConfig};
use crate::workload::{AttentionKernel, Sharding, WorkloadOptions};
use autopar_ir::Loss;

const SC21: &str = include_str!("../../fixtures/megatron_sc21_table1.json");
const MCORE_H100: &str = include_str!("../../fixtures/megatron_core_h100.json");

/// How every run of a table trained, and how its FLOPs are counted.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Setting {
    /// The cluster preset the runs map to.
    pub cluster: String,
    pub seq: usize,
    pub vocab: usize,
    /// The layers' FLOPs per `B·s·l·h²`: 96 counts the recomputed forward
    /// pass (SC'21's hardware FLOPs), 72 does not (model FLOPs, MFU).
    pub layer_flops: f64,
    pub attention: AttentionKernel,
    pub dropout: bool,
    pub recompute: Recompute,
    pub zero: u8,
    pub sequence_parallel: bool,
    /// Tensor-parallel communication overlapped with the GEMMs
    /// (Megatron-Core's `--tp-comm-overlap`).
    pub tp_comm_overlap: bool,
    /// The input embedding and the output layer share one weight.
    #[serde(default = "yes")]
    pub tied_embeddings: bool,
    /// Samples per micro-batch, where the table states it; otherwise one
    /// micro-batch per step without a pipeline (nothing to accumulate
    /// over) and micro-batches of one sample with one.
    #[serde(default)]
    pub micro_batch: Option<usize>,
    /// Megatron-Core's data-parallel overlaps: the gradients' reduction
    /// in buckets beside the last backward pass (`--overlap-grad-reduce`)
    /// and the weights' gather beside the next forward pass
    /// (`--overlap-param-gather`).
    #[serde(default)]
    pub overlap_grad_reduce: bool,
    #[serde(default)]
    pub overlap_param_gather: bool,
    /// Gradients accumulated and reduced in f32 (Megatron-LM's default
    /// for bf16 weights).
    #[serde(default)]
    pub f32_main_grads: bool,
    /// Gradient buckets of Megatron-Core's default size, `max(40M, 1M·dp)`
    /// parameters, instead of PyTorch DDP's 25 MiB.
    #[serde(default)]
    pub megatron_buckets: bool,
    /// The loss as Megatron-LM computes it by default: the logits cast to
    /// f32 and its vocabulary-parallel cross-entropy's in-place passes.
    #[serde(default)]
    pub f32_cross_entropy: bool,
}

fn yes() -> bool {
    true
}

/// One published run.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct PublishedRun {
    pub params_b: f64,
    pub heads: usize,
    pub hidden: usize,
    pub layers: usize,
    pub tp: usize,
    pub pp: usize,
    pub gpus: usize,
    /// Global batch in sequences.
    pub batch: usize,
    /// Achieved TFLOP/s per GPU, counted as the table's setting says.
    pub tflops_per_gpu: f64,
    /// The table's setting (filled in from the table).
    #[serde(skip_deserializing, default = "Setting::placeholder")]
    pub setting: Setting,
}

#[derive(serde::Deserialize)]
struct Table {
    setting: Setting,
    rows: Vec<PublishedRun>,
}

fn table(json: &str) -> Vec<PublishedRun> {
    let Ok(t) = serde_json::from_str::<Table>(json) else {
        return Vec::new();
    };
    t.rows
        .into_iter()
        .map(|r| PublishedRun {
            setting: t.setting.clone(),
            ..r
        })
        .collect()
}

/// The ten runs of SC'21 Table 1 (A100s), smallest first.
pub fn megatron_sc21() -> Vec<PublishedRun> {
    table(SC21)
}

/// The nine runs of Megatron-Core's H100 model table, smallest first.
pub fn megatron_core_h100() -> Vec<PublishedRun> {
    table(MCORE_H100)
}

impl Setting {
    fn placeholder() -> Setting {
        Setting {
            cluster: String::new(),
            seq: 0,
            vocab: 0,
            layer_flops: 0.0,
            attention: AttentionKernel::Fused,
            dropout: false,
            recompute: Recompute::None,
            zero: 0,
            sequence_parallel: false,
            tp_comm_overlap: false,
            tied_embeddings: true,
            micro_batch: None,
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            f32_main_grads: false,
            megatron_buckets: false,
            f32_cross_entropy: false,
        }
    }
}

impl PublishedRun {
    /// The model as a zoo spec.
    pub fn model_spec(&self) -> String {
        format!(
            "gpt:layers={},hidden={},heads={},vocab={},seq={},dtype=bf16{}",
            self.layers,
            self.hidden,
            self.heads,
            self.setting.vocab,
            self.setting.seq,
            if self.setting.tied_embeddings {
                ""
            } else {
                ",tied=false"
            }
        )
    }

    fn dp(&self) -> usize {
        self.gpus / (self.tp * self.pp)
    }

    /// Samples per micro-batch: the table's, or by [`Setting::micro_batch`]'s rule.
    pub fn micro_batch(&self) -> usize {
        match (self.setting.micro_batch, self.pp) {
            (Some(b), _) => b,
            (None, 1) => (self.batch / self.dp()).max(1),
            (None, _) => 1,
        }
    }

    /// The published step time: the table's FLOPs per iteration,
    /// `F·B·s·l·h²·(1 + s/(6h)) + 6·B·s·h·V` with `F` its layer factor
    /// (SC'21 writes it `96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`), over the
    /// achieved rate of all GPUs.
    pub fn step_time_s(&self) -> f64 {
        let (b, s, l, h) = (
            self.batch as f64,
            self.setting.seq as f64,
            self.layers as f64,
            self.hidden as f64,
        );
        let v = self.setting.vocab as f64;
        let flops =
            self.setting.layer_flops * b * s * l * h * h * (1.0 + s / (6.0 * h)) + 6.0 * b * s * h * v;
        flops / (self.tflops_per_gpu * 1e12 * self.gpus as f64)
    }

    /// How the runs trained, for pricing: the micro-batch, the table's kernels.
    pub fn workload_options(&self) -> WorkloadOptions {
        let sp = self.setting.sequence_parallel && self.tp > 1;
        WorkloadOptions {
            micro_batch: Some(self.micro_batch()),
            seq: None,
            sharding: Sharding {
                tp: self.tp,
                sp,
                cp: 1,
                ep: 1,
            },
            attention: self.setting.attention,
            dropout: self.setting.dropout,
            moe_capacity_factor: None,
            loss: Loss::CrossEntropy,
        }
    }

    /// The published configuration: the table's recomputation, ZeRO stage,
    /// overlaps and gradient handling, the interleaved schedule with the
    /// default chunk count where there is a pipeline.
    pub fn config(&self) -> TrainingConfig {
        let interleaved = self.pp > 1;
        let s = &self.setting;
        let dp = self.dp();
        let bucket_mib = match s.megatron_buckets {
            // Parameters per bucket, counted in the bf16 weights' bytes
            // the estimate buckets by.
            true => ((40e6f64.max(1e6 * dp as f64) * 2.0) / (1u64 << 20) as f64).round() as u32,
            false => crate::config::DEFAULT_BUCKET_MIB,
        };
        TrainingConfig {
            dp,
            tp: self.tp,
            pp: self.pp,
            sp: s.sequence_parallel && self.tp > 1,
            zero: s.zero,
            virtual_stages: if interleaved {
                TrainingConfig::default_virtual_stages(self.layers, self.pp)
            } else {
                1
            },
            recompute: s.recompute,
            schedule: if interleaved {
                Schedule::Interleaved
            } else {
                Schedule::OneFOneB
            },
            global_batch: self.batch,
            attention: s.attention,
            dropout: s.dropout,
            micro_batch: self.micro_batch(),
            tp_comm_overlap: s.tp_comm_overlap,
            overlap_grad_reduce: s.overlap_grad_reduce,
            overlap_param_gather: s.overlap_param_gather,
            f32_cross_entropy: s.f32_cross_entropy,
            grad_reduce: crate::GradReduce {
                f32_main_grads: s.f32_main_grads,
                bucket_mib,
                ..Default::default()
            },
            ..TrainingConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_ten_runs_with_the_published_formula() {
        let runs = megatron_sc21();
        assert_eq!(runs.len(), 10);
        let first = &runs[0];
        assert_eq!((first.layers, first.hidden, first.gpus), (24, 2304, 32));
        // 1.7B on 32 GPUs at 137 TFLOP/s: 3.53 s per step of 512 sequences.
        assert!(
            (first.step_time_s() - 3.528).abs() < 1e-3,
            "{}",
            first.step_time_s()
        );
        assert_eq!(runs[9].config().virtual_stages, 2);
        assert_eq!(runs[0].config().dp, 32);
        // SC'21 states micro-batches of one sample and tied embeddings.
        assert_eq!(runs[0].micro_batch(), 1);
        assert!(!runs[0].model_spec().contains("tied"));
    }

    #[test]
    fn the_h100_table_has_nine_runs_at_their_mfu() {
        let runs = megatron_core_h100();
        assert_eq!(runs.len(), 9);
        assert!(runs.iter().all(|r| r.gpus == 48 * r.tp * r.pp));
        // 1.7B on 48 GPUs at 408.8 TFLOP/s: 8.87e15 model FLOPs per step of 192
        // sequences of 4,096 tokens, 0.452 s.
        let first = &runs[0];
        assert!(
            (first.step_time_s() - 0.4519).abs() < 1e-3,
            "{}",
            first.step_time_s()
        );
        let cfg = runs[4].config();
        assert_eq!(
            (cfg.dp, cfg.zero, cfg.sp, cfg.tp_comm_overlap),
            (48, 1, true, true)
        );
        // Megatron-Core's data-parallel handling: both overlaps, f32
        // gradients, buckets of max(40M, 1M·48) = 48M bf16 weights.
        assert!(cfg.overlap_grad_reduce && cfg.overlap_param_gather);
        assert!(cfg.grad_reduce.f32_main_grads && cfg.f32_cross_entropy);
        assert_eq!(cfg.grad_reduce.bucket_mib, 92);
        // Untied embeddings: 1.7B parameters at h 2048 count the vocabulary twice.
        assert!(first.model_spec().ends_with(",tied=false"));
        // Unstated micro-batches: one per step without a pipeline (192 / 48),
        // single samples with one.
        assert_eq!((first.micro_batch(), first.config().micro_batch), (4, 4));
        assert_eq!(cfg.micro_batch, 1);
        // As the backends here run it: none of Megatron-Core's extras.
        let here = cfg.runnable();
        assert!(!here.tp_comm_overlap && !here.overlap_param_gather);
        assert!(!here.grad_reduce.f32_main_grads && !here.f32_cross_entropy);
        assert_eq!(here.grad_reduce.bucket_mib, 92);
    }
}

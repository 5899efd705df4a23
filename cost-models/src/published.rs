//! Published training runs the cost model is checked against: Megatron-LM's
//! weak-scaling GPT runs on Selene (Narayanan et al., SC'21, Table 1), with
//! the paper's FLOP formula and the configuration the authors used.

use crate::config::{Recompute, Schedule, TrainingConfig};
use crate::workload::{AttentionKernel, Sharding, WorkloadOptions};

/// Sequence length and vocabulary of every run.
pub const SEQ: usize = 2048;
pub const VOCAB: usize = 51200;

/// The cluster preset the runs map to.
pub const CLUSTER: &str = "dgx-a100-80g";

const TABLE: &str = include_str!("../../fixtures/megatron_sc21_table1.json");

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
    /// Achieved TFLOP/s per GPU (recomputation counted).
    pub tflops_per_gpu: f64,
}

#[derive(serde::Deserialize)]
struct Table {
    rows: Vec<PublishedRun>,
}

/// The ten runs of SC'21 Table 1, smallest first.
pub fn megatron_sc21() -> Vec<PublishedRun> {
    serde_json::from_str::<Table>(TABLE)
        .map(|t| t.rows)
        .unwrap_or_default()
}

impl PublishedRun {
    /// The model as a zoo spec.
    pub fn model_spec(&self) -> String {
        format!(
            "gpt:layers={},hidden={},heads={},vocab={VOCAB},seq={SEQ},dtype=bf16",
            self.layers, self.hidden, self.heads
        )
    }

    /// The published step time: the paper's FLOPs per iteration,
    /// `96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`, over the achieved rate of all GPUs.
    pub fn step_time_s(&self) -> f64 {
        let (b, s, l, h) = (
            self.batch as f64,
            SEQ as f64,
            self.layers as f64,
            self.hidden as f64,
        );
        let flops = 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + VOCAB as f64 / (16.0 * l * h));
        flops / (self.tflops_per_gpu * 1e12 * self.gpus as f64)
    }

    /// How the runs trained: dropout and attention computed unfused (2021,
    /// before fused attention kernels), micro-batch 1.
    pub fn workload_options(&self) -> WorkloadOptions {
        WorkloadOptions {
            micro_batch: Some(1),
            seq: None,
            sharding: Sharding {
                tp: self.tp,
                sp: false,
                cp: 1,
                ep: 1,
            },
            attention: AttentionKernel::Unfused,
            dropout: true,
        }
    }

    /// The published configuration: full recomputation, the interleaved
    /// schedule with the default chunk count where there is a pipeline, no
    /// ZeRO, gradients reduced after the last micro-batch.
    pub fn config(&self) -> TrainingConfig {
        let interleaved = self.pp > 1;
        TrainingConfig {
            dp: self.gpus / (self.tp * self.pp),
            tp: self.tp,
            pp: self.pp,
            virtual_stages: if interleaved {
                TrainingConfig::default_virtual_stages(self.layers, self.pp)
            } else {
                1
            },
            recompute: Recompute::Full,
            schedule: if interleaved {
                Schedule::Interleaved
            } else {
                Schedule::OneFOneB
            },
            global_batch: self.batch,
            attention: AttentionKernel::Unfused,
            dropout: true,
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
    }
}

//! The per-op sharding a plan runs sends what the layout the search chose
//! its configuration with sends: on a GPT layer under tensor and sequence
//! parallelism the integer program finds Megatron-LM's layout, and
//! lowering's moves for it (a gather for column-parallel products whose
//! backward is a reduce-scatter, [`autopar_ir::op::sharding::read_moves`])
//! are priced as that layout is.

use autopar_cost_models::workload::Unit;
use autopar_cost_models::{
    estimate, Calibration, Cluster, Sharding, TrainingConfig, Workload, WorkloadOptions,
};
use autopar_import::ModelSpec;
use autopar_planner::{assemble::planned_workload, layer_sharding};
use std::collections::BTreeMap;

/// Bytes a unit sends per micro-batch, by (forward, backward) collective.
fn sent(unit: &Unit) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    for c in &unit.comms {
        for (pass, collective) in [("forward", c.forward), ("backward", c.backward)] {
            if let Some(collective) = collective {
                *by.entry(format!("{pass} {collective:?}")).or_insert(0.0) += c.bytes;
            }
        }
    }
    by
}

#[test]
fn a_planned_gpt_layer_sends_what_megatrons_layout_sends() {
    let graph = "gpt:layers=2,hidden=2560,heads=32,vocab=51200,seq=2048,dtype=bf16"
        .parse::<ModelSpec>()
        .unwrap()
        .build()
        .unwrap();
    let cluster = Cluster::preset("dgx-a100-80g").unwrap().with_gpus(8).unwrap();
    let calibration = Calibration::default();
    for sp in [false, true] {
        let cfg = TrainingConfig {
            tp: 8,
            sp,
            micro_batch: 1,
            global_batch: 1,
            seq: Some(2048),
            ..TrainingConfig::default()
        };
        let sharding = layer_sharding::for_config(&graph, &cluster, &calibration, &cfg, Some(2048)).unwrap();
        let planned = planned_workload(&graph, &cfg, &sharding).unwrap();
        let opts = WorkloadOptions {
            micro_batch: Some(1),
            seq: Some(2048),
            sharding: Sharding {
                tp: 8,
                sp,
                cp: 1,
                ep: 1,
            },
            ..WorkloadOptions::default()
        };
        let layout = Workload::build(&graph, &opts).unwrap();
        let kinds = sent(&planned.layer);
        assert_eq!(kinds, sent(&layout.layer), "sp {sp}");
        assert_eq!(kinds.contains_key("backward ReduceScatter"), sp, "{kinds:?}");
        // Without sequence parallelism the collectives are the same ones;
        // with it, the plan all-reduces each norm's weight gradients on
        // their own (as lowering emits them) where the layout prices one
        // bucket, so only their latency differs.
        let (p, l) = (
            estimate(&planned, &cluster, &calibration, &cfg)
                .unwrap()
                .breakdown
                .tp_comm_s,
            estimate(&layout, &cluster, &calibration, &cfg)
                .unwrap()
                .breakdown
                .tp_comm_s,
        );
        if !sp {
            assert!(
                (p - l).abs() <= 1e-12 * l,
                "planned {p} s against the layout's {l} s"
            );
        }
    }
}

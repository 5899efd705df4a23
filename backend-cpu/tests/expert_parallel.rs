//! Expert parallelism sends what the planner prices: each token row
//! travels only to the rank of its chosen expert and back (an all-to-all
//! each way, forward and backward), plus the counts. Routing decides how
//! many rows a rank sends, but when every rank routes alike (identical
//! rows: a token file exactly one row long), the group sends
//! `ep − 1` rank-loads in all, whatever the routing: the mean over the
//! group equals the estimate's even routing, to the byte. Under a
//! capacity factor every expert's block travels whole (drop and pad): the
//! bytes are fixed. Both exporters' Mixtral train under expert
//! parallelism with one rank's losses.

use autopar_cost_models::{estimate, Calibration, Cluster, Sharding, TrainingConfig, Workload};
use autopar_cpu::train;
use autopar_exec::train::{Data, Optimizer, TokenSource};
use autopar_exec::TrainOptions;
use autopar_ir::interp::Precision;
use autopar_lower::{for_strategy, lower, Objective, Strategy};
use std::time::Duration;

mod common;

const SEQ: usize = 8;
const VOCAB: usize = 64;
const STEPS: usize = 3;

fn moe() -> autopar_ir::Graph {
    let spec = format!("moe:layers=2,hidden=32,ffn=48,heads=4,experts=4,top_k=2,vocab={VOCAB},seq={SEQ}");
    let mut g = autopar_import::zoo::build(&spec).unwrap();
    autopar_exec::train::initialize(&mut g, 5).unwrap();
    g
}

/// Mean bytes a rank sends per step, by the run and by the estimate.
fn measured_and_estimated(dp: usize, ep: usize, cp: usize, cf: Option<f64>) -> (f64, f64) {
    let g = moe();
    let mut s = Strategy::new(dp, 1, 2, 1, 2).with_cp(cp);
    s.ep = ep;
    s.capacity_factor = cf;
    let t = for_strategy(&g, &s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, &s).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("row.bin");
    let row: Vec<u8> = (0..=SEQ as u16).flat_map(|t| (3 * t + 1).to_le_bytes()).collect();
    std::fs::write(&path, row).unwrap();
    let data: Data = TokenSource::open(&path, VOCAB, SEQ, 3).unwrap().into();
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(3e-3), STEPS);
    opts.timeout = Duration::from_secs(60);
    let report = train(&t, &programs, &data, &opts, &|_| {}).unwrap();
    let sent: u64 = report.ranks.iter().map(|r| r.bytes_sent).sum();
    let measured = sent as f64 / report.ranks.len() as f64 / STEPS as f64;

    let mut w_opts = common::workload_options(SEQ, 1, false);
    w_opts.micro_batch = Some(1);
    w_opts.sharding = Sharding {
        ep,
        cp,
        ..w_opts.sharding
    };
    w_opts.moe_capacity_factor = cf;
    let w = Workload::build(&g, &w_opts).unwrap();
    let cluster = Cluster::preset("cpu").and_then(|c| c.with_gpus(dp * cp)).unwrap();
    let cfg = TrainingConfig {
        dp,
        ep,
        cp,
        micro_batch: 1,
        global_batch: 2 * dp,
        moe_capacity_factor: cf,
        ..TrainingConfig::default()
    };
    let estimated = estimate(&w, &cluster, &Calibration::default(), &cfg)
        .unwrap()
        .comm_bytes_per_gpu;
    (measured, estimated)
}

#[test]
fn dispatch_bytes_per_rank_are_the_estimates() {
    // Dropless, and dropping and padding at two capacity factors; with
    // context parallelism, each rank dispatches its own chunk's tokens.
    for (dp, ep, cp, cf) in [
        (2, 2, 1, None),
        (4, 4, 1, None),
        (4, 2, 1, None),
        (2, 2, 2, None),
        (2, 2, 1, Some(1.0)),
        (4, 4, 1, Some(0.5)),
    ] {
        let (measured, estimated) = measured_and_estimated(dp, ep, cp, cf);
        let what = format!("dp {dp} ep {ep} cp {cp} cf {cf:?}");
        eprintln!("{what}: {measured} bytes per rank per step, the estimate {estimated}");
        assert!(
            (measured - estimated).abs() <= 1e-9 * estimated,
            "{what}: {measured} bytes per rank per step, the estimate counts {estimated}"
        );
    }
}

/// Mixtral as both exporters write it (dynamo: `Expand`, `GatherND`,
/// `Split`; legacy: `Tile`, `Gather`, `Slice`s) is recognised as experts,
/// and dp 2 · ep 2 trains the losses of one rank, in f64.
#[test]
fn both_exports_of_mixtral_train_expert_parallel_with_one_ranks_losses() {
    for file in ["mixtral-tiny.dynamo.onnx", "mixtral-tiny.ts.onnx"] {
        let g = common::fixture(file);
        assert_eq!(g.op_histogram().get("MoeExperts"), Some(&2), "{file}");
        let losses = |dp: usize, ep: usize| -> Vec<f64> {
            let mut s = Strategy::new(dp, 1, g.blocks.len(), common::MICRO_BATCH, 2 / dp);
            s.ep = ep;
            let t = for_strategy(&g, &s, 16, Objective::Lm).unwrap();
            let programs = lower(&t, &s).unwrap();
            let opts = TrainOptions::new(Precision::F64, Optimizer::adamw(1e-3), STEPS);
            let data: Data = TokenSource::synthetic(1000, 3).into();
            let report = train(&t, &programs, &data, &opts, &|_| {}).unwrap();
            report.steps.iter().map(|s| s.loss).collect()
        };
        let (one, split) = (losses(1, 1), losses(2, 2));
        for (a, b) in one.iter().zip(&split) {
            assert!(((a - b) / a).abs() <= 1e-9, "{file}: {one:?} vs {split:?}");
        }
    }
}

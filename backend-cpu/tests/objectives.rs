//! Parallel = single for every training objective: data, pipeline, tensor
//! and (for mlm) context parallelism train to one rank's losses, in f64,
//! because every objective's loss divides by the global batch's terms
//! (samples, target tokens, masked tokens) and every rank draws its rows
//! from `(seed, step, row)`.

mod common;

use autopar_exec::train::{Data, Optimizer};
use autopar_exec::TrainOptions;
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{for_strategy, lower, Objective, Strategy};
use common::{fixture, planned, Ask, MICRO_BATCH};

const SEQ: usize = 16;
const STEPS: usize = 2;

/// The losses of `STEPS` steps of `g` trained for `objective` under `s`
/// on synthetic data of the objective's kind.
fn losses(g: &Graph, objective: Objective, s: &Strategy) -> Vec<f64> {
    let t = for_strategy(g, s, SEQ, objective).unwrap_or_else(|e| panic!("{objective}: {e}"));
    let programs = lower(&t, s).unwrap();
    let data = Data::open(&t.task, None, None, 5).unwrap();
    let mut opts = TrainOptions::new(Precision::F64, Optimizer::adamw(1e-2), STEPS);
    opts.timeout = std::time::Duration::from_secs(60);
    let report = autopar_cpu::train(&t, &programs, &data, &opts, &|_| {}).unwrap();
    report.steps.iter().map(|s| s.loss).collect()
}

/// `(label, strategy)` over the same global batch as one rank running
/// `micro_batches` micro-batches. Tensor parallelism runs the per-op
/// sharding the planner's integer program picks, as a plan does.
fn strategies(g: &Graph, pipeline: bool, tensor: bool, context: bool) -> Vec<(&'static str, Strategy)> {
    let layers = g.blocks.len();
    let mut all = vec![("dp 2", Strategy::new(2, 1, layers, MICRO_BATCH, 2))];
    if pipeline {
        all.push(("pp 2", Strategy::new(1, 2, layers, MICRO_BATCH, 4)));
    }
    if tensor {
        let sharded = |sp| planned(g, 2, sp, SEQ, Ask::Pinned(&[]));
        all.push((
            "tp 2",
            Strategy::new(1, 1, layers, MICRO_BATCH, 4)
                .with_tp(2, false)
                .with_sharding(sharded(false)),
        ));
        all.push((
            "dp 2 · tp 2 (sp)",
            Strategy::new(2, 1, layers, MICRO_BATCH, 2)
                .with_tp(2, true)
                .with_sharding(sharded(true)),
        ));
    }
    if context {
        all.push(("cp 2", Strategy::new(1, 1, layers, MICRO_BATCH, 4).with_cp(2)));
    }
    all
}

#[test]
fn every_objective_trains_in_parallel_to_one_ranks_losses() {
    let mlp = fixture("mlp.ts.onnx");
    let bart = fixture("bart.ts.onnx");
    let bert = fixture("bert-tiny.dynamo.onnx");
    let cases = [
        // The MLP has no repeated layers to pipeline.
        (
            &mlp,
            "mlp.ts",
            Objective::Classify,
            strategies(&mlp, false, true, false),
        ),
        (
            &mlp,
            "mlp.ts",
            Objective::Regress,
            strategies(&mlp, false, true, false),
        ),
        (
            &bart,
            "bart.ts",
            Objective::Seq2Seq,
            strategies(&bart, true, true, false),
        ),
        (
            &bert,
            "bert-tiny.dynamo",
            Objective::Mlm,
            strategies(&bert, true, true, true),
        ),
    ];
    for (g, name, objective, strategies) in cases {
        let one = losses(g, objective, &Strategy::new(1, 1, g.blocks.len(), MICRO_BATCH, 4));
        assert!(
            one.iter().all(|l| l.is_finite() && *l > 0.0),
            "{name} {objective}: {one:?}"
        );
        for (label, s) in strategies {
            let many = losses(g, objective, &s);
            for (a, b) in one.iter().zip(&many) {
                assert!(
                    ((a - b) / a).abs() <= 1e-9,
                    "{name} {objective} {label}: {many:?}, one rank {one:?}"
                );
            }
        }
    }
}

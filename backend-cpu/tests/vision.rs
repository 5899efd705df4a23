//! The development set's image classifiers (a CNN and a ViT) train under a
//! forced tensor-parallel plan — the planner's per-op sharding, which splits
//! the convolutions by filters or channels — under pipeline and data
//! parallelism, to one rank's losses in f64.

mod common;

use autopar_cost_models::{Workload, WorkloadOptions};
use autopar_exec::train::{Data, Optimizer};
use autopar_exec::TrainOptions;
use autopar_ir::interp::Precision;
use autopar_ir::{Graph, Op};
use autopar_lower::{for_strategy, lower, Objective, Strategy};
use autopar_planner::spec::OpSharding;
use common::{fixture, lowered_bytes, planned, priced_bytes, workload_options, Ask, MICRO_BATCH};
use std::collections::BTreeMap;

const STEPS: usize = 2;

/// The losses of `STEPS` classification steps of `g` under `s`.
fn losses(g: &Graph, s: &Strategy) -> (Vec<f64>, u64) {
    let t = for_strategy(g, s, 1, Objective::Classify).unwrap();
    let programs = lower(&t, s).unwrap();
    let data = Data::open(&t.task, None, None, 5).unwrap();
    let mut opts = TrainOptions::new(Precision::F64, Optimizer::adamw(1e-2), STEPS);
    opts.timeout = std::time::Duration::from_secs(60);
    let report = autopar_cpu::train(&t, &programs, &data, &opts, &|_| {}).unwrap();
    let losses = report.steps.iter().map(|s| s.loss).collect();
    (losses, report.ranks[0].bytes_sent)
}

/// The planner's choice for the convolutions in `sharding` (by node).
fn conv_strategies<'a>(g: &Graph, sharding: &'a [OpSharding]) -> Vec<&'a str> {
    sharding
        .iter()
        .filter(|o| {
            g.node_indices()
                .any(|i| g.node(i).name == o.node && matches!(g.node(i).op, Op::Conv { .. }))
        })
        .map(|o| o.strategy.as_str())
        .collect()
}

#[test]
fn image_classifiers_train_in_parallel_to_one_ranks_losses() {
    for file in ["convnet3.ts.onnx", "vit.dynamo.onnx"] {
        let g = fixture(&format!("../hf-models/{file}"));
        let layers = g.blocks.len();
        let (one, _) = losses(&g, &Strategy::new(1, 1, layers, MICRO_BATCH, 2));
        assert!(one.iter().all(|l| l.is_finite() && *l > 0.0), "{file}: {one:?}");
        let sharding = planned(&g, 2, false, 1, Ask::LeastMemory);
        let convs = conv_strategies(&g, &sharding);
        assert!(
            !convs.is_empty() && convs.iter().all(|s| *s != "replicate"),
            "{file}: {convs:?}"
        );
        println!("{file}: {layers} layers, convolutions {convs:?}, one rank {one:?}");
        let mut cases = vec![
            ("dp 2", Strategy::new(2, 1, layers, MICRO_BATCH, 1)),
            (
                "tp 2 (planned)",
                Strategy::new(1, 1, layers, MICRO_BATCH, 2)
                    .with_tp(2, false)
                    .with_sharding(sharding),
            ),
        ];
        if layers >= 2 {
            cases.push(("pp 2", Strategy::new(1, 2, layers, MICRO_BATCH, 2)));
        }
        for (label, s) in cases {
            let (many, sent) = losses(&g, &s);
            assert!(sent > 0, "{file} {label}: nothing sent");
            println!("  {label}: {many:?}, rank 0 sent {sent} B");
            for (a, b) in one.iter().zip(&many) {
                assert!(
                    ((a - b) / a).abs() <= 1e-9,
                    "{file} {label}: {many:?}, one rank {one:?}"
                );
            }
        }
    }
}

/// What the cost model prices for the planner's per-op sharding of the
/// classifiers at tp 2 is what the lowered programs send.
#[test]
fn priced_tensor_parallel_bytes_are_what_the_classifiers_send() {
    for file in ["convnet3.ts.onnx", "vit.dynamo.onnx"] {
        let g = fixture(&format!("../hf-models/{file}"));
        for (how, ask) in [("cheapest", Ask::Pinned(&[])), ("least memory", Ask::LeastMemory)] {
            let sharding = planned(&g, 2, false, 1, ask);
            let names: BTreeMap<String, String> = sharding
                .iter()
                .map(|o| (o.node.clone(), o.strategy.clone()))
                .collect();
            // An image has no sequence: the model's own dims stand.
            let opts = WorkloadOptions {
                seq: None,
                ..workload_options(1, 2, false)
            };
            let w = Workload::build_planned(&g, &opts, &names).unwrap();
            let priced = priced_bytes(&w, 2);
            let s = Strategy::new(1, 1, g.blocks.len(), MICRO_BATCH, 2)
                .with_tp(2, false)
                .with_sharding(sharding);
            let t = for_strategy(&g, &s, 1, Objective::Classify).unwrap();
            let programs = lower(&t, &s).unwrap();
            let sent: f64 = lowered_bytes(&t, &programs[0], 2).values().sum();
            assert!(
                (sent - priced).abs() <= 1e-9 * priced.max(1.0),
                "{file} {how}: sent {sent}, priced {priced}"
            );
        }
    }
}

//! The development set's image classifiers (a CNN and a ViT) train under a
//! forced tensor-parallel plan — the planner's per-op sharding, which splits
//! the convolutions by filters or channels — under pipeline and data
//! parallelism, to one rank's losses in f64.

mod common;

use autopar_cost_models::{Workload, WorkloadOptions};
use autopar_exec::train::initialize;
use autopar_exec::train::{Data, Optimizer};
use autopar_exec::TrainOptions;
use autopar_ir::interp::Precision;
use autopar_ir::{
    DType, Dim, Graph, InferInput, Op, PoolKind, ReduceKind, Role, Shape, TensorId, TensorType, Value, Window,
};
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

/// What the cost model prices for the planner's per-op sharding at tp 2 is
/// what the lowered programs send: the classifiers as the planner shards
/// them, and the small CNN with its convolutions split by input channels
/// and by groups.
#[test]
fn priced_tensor_parallel_bytes_are_what_the_classifiers_send() {
    let pins = [("conv1", "channels"), ("conv2", "groups")];
    let mut cases = vec![];
    for file in ["convnet3.ts.onnx", "vit.dynamo.onnx"] {
        let g = fixture(&format!("../hf-models/{file}"));
        cases.push((file, g.clone(), Ask::Pinned(&[])));
        cases.push((file, g, Ask::LeastMemory));
    }
    cases.push(("small cnn", small_cnn(), Ask::Pinned(&pins)));
    for (name, g, ask) in cases {
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
            "{name} {names:?}: sent {sent}, priced {priced}"
        );
    }
}

/// Adds `op` over `inputs` to `g`, its outputs typed by its own inference.
fn add(g: &mut Graph, name: &str, op: Op, inputs: &[TensorId]) -> TensorId {
    let types: Vec<TensorType> = inputs.iter().map(|&t| g.tensor(t).ty.clone()).collect();
    let values: Vec<Option<Value>> = inputs
        .iter()
        .map(|&t| g.tensor(t).data.as_deref().cloned())
        .collect();
    let infer: Vec<Option<InferInput>> = types
        .iter()
        .zip(&values)
        .map(|(ty, v)| {
            Some(InferInput {
                ty,
                value: v.as_ref(),
            })
        })
        .collect();
    let out = op.infer(&infer).unwrap().remove(0);
    let y = g.add_tensor(format!("{name}.out"), out, Role::Activation, None);
    g.add_node(name, op, inputs.iter().map(|&t| Some(t)).collect(), vec![y])
        .unwrap();
    y
}

fn param(g: &mut Graph, name: &str, dims: &[usize]) -> TensorId {
    let ty = TensorType {
        dtype: DType::F32,
        shape: Shape::fixed(dims),
    };
    g.add_tensor(name, ty, Role::Parameter, None)
}

/// A CNN whose first convolution has no bias and whose second is
/// depthwise: `x[2, 4, 6, 6]` → conv → relu → depthwise conv → max pool →
/// mean over positions → linear → 3 classes.
fn small_cnn() -> Graph {
    let mut g = Graph::new("small cnn");
    let ty = TensorType {
        dtype: DType::F32,
        shape: Shape(vec![Dim::Fixed(2), Dim::Fixed(4), Dim::Fixed(6), Dim::Fixed(6)]),
    };
    let x = g.add_tensor("x", ty, Role::Input, None);
    g.inputs.push(x);
    let padded = Window {
        strides: vec![1, 1],
        pads: vec![1; 4],
        dilations: vec![1, 1],
    };
    let w1 = param(&mut g, "w1", &[4, 4, 3, 3]);
    let c1 = add(
        &mut g,
        "conv1",
        Op::Conv {
            window: padded.clone(),
            groups: 1,
        },
        &[x, w1],
    );
    let r = add(
        &mut g,
        "relu",
        Op::Unary {
            func: autopar_ir::UnaryOp::Relu,
        },
        &[c1],
    );
    let (w2, b2) = (param(&mut g, "w2", &[4, 1, 3, 3]), param(&mut g, "b2", &[4]));
    let c2 = add(
        &mut g,
        "conv2",
        Op::Conv {
            window: padded,
            groups: 4,
        },
        &[r, w2, b2],
    );
    let pool = Op::Pool {
        kind: PoolKind::Max,
        kernel: vec![2, 2],
        window: Window {
            strides: vec![2, 2],
            pads: vec![0; 4],
            dilations: vec![1, 1],
        },
        ceil_mode: false,
    };
    let p = add(&mut g, "pool", pool, &[c2]);
    let axes = g.add_constant("axes", Value::i64(vec![2], vec![2, 3]).unwrap());
    let mean = Op::Reduce {
        kind: ReduceKind::Mean,
        axes: None,
        keepdims: false,
        noop_with_empty_axes: false,
    };
    let m = add(&mut g, "mean", mean, &[p, axes]);
    let (w3, b3) = (param(&mut g, "w3", &[4, 3]), param(&mut g, "b3", &[3]));
    let logits = add(&mut g, "head", Op::Linear, &[m, w3, b3]);
    g.outputs.push(logits);
    initialize(&mut g, 11).unwrap();
    g
}

/// The rules the planner does not pick for the fixtures run too: a
/// convolution split by input channels (partial sums) and a depthwise one
/// split by whole groups.
#[test]
fn convolutions_split_by_channels_and_by_groups_train_to_one_ranks_losses() {
    let g = small_cnn();
    let (one, _) = losses(&g, &Strategy::new(1, 1, 0, MICRO_BATCH, 2));
    let pins = [("conv1", "channels"), ("conv2", "groups")];
    let sharding = planned(&g, 2, false, 1, Ask::Pinned(&pins));
    assert_eq!(conv_strategies(&g, &sharding), vec!["channels", "groups"]);
    let s = Strategy::new(1, 1, 0, MICRO_BATCH, 2)
        .with_tp(2, false)
        .with_sharding(sharding);
    let (many, sent) = losses(&g, &s);
    assert!(sent > 0);
    for (a, b) in one.iter().zip(&many) {
        assert!(((a - b) / a).abs() <= 1e-9, "{many:?}, one rank {one:?}");
    }
}

//! Context parallelism trains like one rank: every fixture and zoo model,
//! its sequence split over two context-parallel ranks under each ZeRO
//! stage, gives one rank's loss and gradients.

mod common;

use autopar_exec::train::{initialize, Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::CommKind;
use autopar_ir::Graph;
use autopar_lower::{for_strategy, lower, Instr, Objective, Strategy};
use common::{fixture, lowered_bytes, planned, priced_bytes, workload_options, Ask, MICRO_BATCH};

fn zoo(spec: &str) -> Graph {
    let mut g = autopar_import::zoo::build(spec).unwrap();
    initialize(&mut g, 7).unwrap();
    g
}

fn run(g: &Graph, s: &Strategy, seq: usize, vocab: usize) -> Result<TrainReport, String> {
    let t = for_strategy(g, s, seq, Objective::Lm).map_err(|e| e.to_string())?;
    let programs = lower(&t, s).map_err(|e| e.to_string())?;
    let mut opts = TrainOptions::new(Precision::F64, Optimizer::sgd(0.1), 1);
    opts.record_grads = true;
    autopar_cpu::train(
        &t,
        &programs,
        &TokenSource::synthetic(vocab, 3).into(),
        &opts,
        &|_| {},
    )
    .map_err(|e| e.to_string())
}

/// Relative difference of `b`'s step from `a`'s: the loss, and the worst
/// gradient against the largest gradient entry.
fn gap(a: &TrainReport, b: &TrainReport) -> f64 {
    let (la, lb) = (a.steps[0].loss, b.steps[0].loss);
    let max = a
        .gradients
        .values()
        .flat_map(|g| g.to_f64_vec())
        .fold(0.0, |m: f64, x| m.max(x.abs()));
    let mut worst = ((la - lb) / la).abs();
    for (p, ga) in &a.gradients {
        let Some(gb) = b.gradients.get(p) else {
            return f64::INFINITY;
        };
        let diff = ga
            .to_f64_vec()
            .iter()
            .zip(gb.to_f64_vec())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        worst = worst.max(diff / max);
    }
    worst
}

#[test]
fn context_parallel_runs_train_like_one_rank() {
    let mut cases: Vec<(&str, Graph, usize, usize)> = vec![
        (
            "zoo gpt",
            zoo("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16"),
            16,
            64,
        ),
        (
            "zoo llama",
            zoo("llama:layers=2,hidden=32,ffn=64,heads=4,kv_heads=2,vocab=64,seq=16"),
            16,
            64,
        ),
        (
            "zoo moe",
            zoo("moe:layers=2,hidden=32,ffn=64,heads=4,kv_heads=2,experts=4,top_k=2,vocab=64,seq=16"),
            16,
            64,
        ),
        (
            "zoo bert",
            zoo("bert:layers=2,hidden=32,heads=4,vocab=64,seq=16"),
            16,
            64,
        ),
    ];
    for file in [
        "gpt2-tiny.ts.onnx",
        "gpt2-tiny.dynamo.onnx",
        "llama-tiny.ts.onnx",
        "llama-tiny.dynamo.onnx",
        "bert-tiny.ts.onnx",
        "bert-tiny.dynamo.onnx",
        "mixtral-tiny.dynamo.onnx",
    ] {
        cases.push((file, fixture(file), 16, 1000));
    }
    let mut table = Vec::new();
    let mut wrong = Vec::new();
    for (name, g, seq, vocab) in &cases {
        let layers = g.blocks.len();
        let one = run(g, &Strategy::new(1, 1, layers, MICRO_BATCH, 2), *seq, *vocab).unwrap();
        for zero in 0..=3u8 {
            let mut s = Strategy::new(1, 1, layers, MICRO_BATCH, 2).with_cp(2);
            s.zero = zero;
            let cell = match run(g, &s, *seq, *vocab) {
                Ok(r) => {
                    let e = gap(&one, &r);
                    if e > 1e-9 {
                        wrong.push(format!("{name} ZeRO {zero}: off by {e:.2e}"));
                    }
                    format!("{e:.1e}")
                }
                Err(e) => {
                    wrong.push(format!("{name} ZeRO {zero}: {e}"));
                    "error".to_string()
                }
            };
            table.push(format!("{name} | ZeRO {zero} | {cell}"));
        }
    }
    eprintln!("{}", table.join("\n"));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Context parallelism inside tensor parallelism (as Megatron-Core runs
/// them): the tensor-parallel rewrite, then each rank's tokens split over
/// the context-parallel group; one rank's loss and gradients.
#[test]
fn context_and_tensor_parallelism_combine() {
    for (name, g, vocab) in [
        (
            "zoo gpt",
            zoo("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16"),
            64,
        ),
        (
            "zoo llama",
            zoo("llama:layers=2,hidden=32,ffn=64,heads=4,kv_heads=2,vocab=64,seq=16"),
            64,
        ),
        ("gpt2-tiny.ts.onnx", fixture("gpt2-tiny.ts.onnx"), 1000),
        ("llama-tiny.dynamo.onnx", fixture("llama-tiny.dynamo.onnx"), 1000),
    ] {
        let layers = g.blocks.len();
        let one = run(&g, &Strategy::new(1, 1, layers, MICRO_BATCH, 2), 16, vocab).unwrap();
        let s = Strategy::new(1, 1, layers, MICRO_BATCH, 2)
            .with_tp(2, false)
            .with_cp(2);
        let r = run(&g, &s, 16, vocab).unwrap_or_else(|e| panic!("{name}: {e}"));
        let e = gap(&one, &r);
        assert!(e <= 1e-9, "{name}: tp 2 × cp 2 off by {e:.2e}");
        // The only sequence the context-parallel ranks gather is attention's
        // keys and values: the vocabulary-parallel loss runs on each rank's
        // tokens (its maxima and sums reduce along the vocabulary).
        let t = for_strategy(&g, &s, 16, Objective::Lm).unwrap();
        let programs = lower(&t, &s).unwrap();
        let gathered: Vec<&str> = programs[0]
            .instructions
            .iter()
            .filter_map(|i| match i {
                Instr::Collective {
                    node,
                    kind: CommKind::AllGather,
                    ..
                } if node.starts_with("cp/") => Some(node.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            gathered.is_empty(),
            "{name}: gathers the sequence at {gathered:?}"
        );
    }
}

/// A plan's per-op sharding with context parallelism: the planner's program
/// at tp 2 for the least parameter memory (which splits norms and residuals
/// along the sequence inside each context-parallel chunk), then the chunks
/// over cp 2; one rank's loss and gradients.
#[test]
fn a_planned_sharding_combines_with_context_parallelism() {
    let g = zoo("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16");
    let ops = planned(&g, 2, false, 16, Ask::LeastMemory);
    let seq_split = ops.iter().any(|o| o.strategy == "dim1");
    assert!(
        seq_split,
        "the program no longer splits anything along the sequence here"
    );
    let layers = g.blocks.len();
    let one = run(&g, &Strategy::new(1, 1, layers, MICRO_BATCH, 2), 16, 64).unwrap();
    let s = Strategy::new(1, 1, layers, MICRO_BATCH, 2)
        .with_tp(2, false)
        .with_cp(2)
        .with_sharding(ops);
    let r = run(&g, &s, 16, 64).unwrap();
    let e = gap(&one, &r);
    assert!(e <= 1e-9, "off by {e:.2e}");
}

/// Under context parallelism a weight read whole by work split along the
/// tokens (the attention's projections pinned to `dim1`) has its gradient
/// all-reduced whole on the tensor-parallel group, while activations move
/// the rank's share of the tokens: the tensor-parallel bytes one rank sends
/// per micro-batch are what the cost model prices, and the run still
/// trains like one rank.
#[test]
fn priced_tensor_parallel_bytes_under_context_parallelism_are_what_runs() {
    let g = zoo("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16");
    let pins = [("h.0.attn.qkv", "dim1"), ("h.0.attn.proj", "dim1")];
    let ops = planned(&g, 2, false, 16, Ask::Pinned(&pins));
    let names: std::collections::BTreeMap<String, String> =
        ops.iter().map(|o| (o.node.clone(), o.strategy.clone())).collect();
    let mut opts = workload_options(16, 2, false);
    opts.sharding.cp = 2;
    let w = autopar_cost_models::Workload::build_planned(&g, &opts, &names).unwrap();
    let priced = priced_bytes(&w, 2);
    let layers = g.blocks.len();
    let s = Strategy::new(1, 1, layers, MICRO_BATCH, 2)
        .with_tp(2, false)
        .with_cp(2)
        .with_sharding(ops);
    let t = for_strategy(&g, &s, 16, Objective::Lm).unwrap();
    let programs = lower(&t, &s).unwrap();
    let sent: f64 = lowered_bytes(&t, &programs[0], 2).values().sum();
    assert!(
        (sent - priced).abs() <= 1e-9 * priced,
        "programs send {sent} bytes per rank on the tensor-parallel group, the cost model prices {priced}"
    );
    let one = run(&g, &Strategy::new(1, 1, layers, MICRO_BATCH, 2), 16, 64).unwrap();
    let e = gap(&one, &run(&g, &s, 16, 64).unwrap());
    assert!(e <= 1e-9, "off by {e:.2e}");
}

/// Context-parallel attention stays causal: each layer's attention is told
/// its queries' positions (the rank's slice of the balanced order, not an
/// explicit mask over every key, so a fused kernel skips the hidden keys),
/// and those positions, made from constants alone, are made again for the
/// backward pass rather than kept.
#[test]
fn context_parallel_attention_is_causal_at_the_ranks_positions() {
    let g = zoo("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16");
    let s = Strategy::new(1, 1, g.blocks.len(), MICRO_BATCH, 2).with_cp(2);
    let t = for_strategy(&g, &s, 16, Objective::Lm).unwrap();
    let graph = &t.graph;
    let mut positions = std::collections::HashMap::new();
    for n in graph.node_indices().map(|i| graph.node(i)) {
        if !matches!(n.op, autopar_ir::Op::Attention { .. }) || n.name.starts_with("grad/") {
            continue;
        }
        assert!(
            matches!(n.op, autopar_ir::Op::Attention { causal: true, .. }),
            "{}: {:?}",
            n.name,
            n.op
        );
        let at = n.inputs.get(4).copied().flatten().expect("query positions");
        let made = graph.node(graph.producer(at).expect("computed"));
        let order = graph.tensor(made.inputs[0].expect("the order"));
        assert_eq!(order.role, autopar_ir::Role::Constant, "{}", made.name);
        let want: Vec<i64> = [0..4, 12..16, 4..8, 8..12].into_iter().flatten().collect();
        assert_eq!(order.data.as_ref().unwrap().as_i64(), Some(&want[..]));
        positions.insert(made.name.clone(), graph.tensor(at).name.clone());
    }
    assert_eq!(positions.len(), g.blocks.len(), "one set of positions per layer");
    let programs = lower(&t, &s).unwrap();
    let checked: usize = programs
        .iter()
        .map(|p| common::made_again_for_the_backward_pass(p, &positions, "positions"))
        .sum();
    assert!(checked >= 2 * g.blocks.len(), "{checked} positions checked");
}

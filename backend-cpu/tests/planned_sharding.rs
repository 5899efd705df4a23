//! The plan's per-op sharding is what runs: lowering executes the strategy
//! the planner's integer program chose for every op (looked up in the same
//! sharding rules it priced), the losses and gradients equal one rank's,
//! and editing one op's sharding in the plan changes the traffic but not
//! the losses.

mod common;

use autopar_cost_models::Workload;
use autopar_exec::train::{Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{for_strategy, lower, Objective, Strategy};
use autopar_planner::spec::{DimSpec, OpSharding};
use common::{fixture, lowered_bytes, planned, priced_bytes, workload_options, zoo_gpt, Ask, MICRO_BATCH};
use std::collections::BTreeMap;

/// A model, its sequence length, vocabulary and the tensor-parallel
/// degrees its heads allow.
struct Case {
    name: &'static str,
    graph: Graph,
    seq: usize,
    vocab: usize,
    tps: &'static [usize],
}

fn cases() -> Vec<Case> {
    let mut all = vec![Case {
        name: "zoo gpt",
        graph: zoo_gpt(),
        seq: 8,
        vocab: 64,
        tps: &[2, 4],
    }];
    for (file, tps) in [
        ("gpt2-tiny.ts.onnx", &[2, 4][..]),
        ("gpt2-tiny.dynamo.onnx", &[2, 4]),
        ("llama-tiny.ts.onnx", &[2]),
        ("llama-tiny.dynamo.onnx", &[2]),
        ("bert-tiny.ts.onnx", &[2]),
        ("bert-tiny.dynamo.onnx", &[2]),
        ("mixtral-tiny.dynamo.onnx", &[2]),
        ("mixtral-tiny.ts.onnx", &[2]),
    ] {
        all.push(Case {
            name: file,
            graph: fixture(file),
            seq: 16,
            vocab: 1000,
            tps,
        });
    }
    // Falcon's multi-query attention: four query heads, one key/value head
    // (before the MoE models, which stay last).
    let at = all.len() - 2;
    all.insert(
        at,
        Case {
            name: "falcon.ts.onnx",
            graph: fixture("../hf-models/falcon.ts.onnx"),
            seq: 16,
            vocab: 512,
            tps: &[2],
        },
    );
    // Falcon's grouped-query layout (Falcon-40B's): query, key and value
    // fused per key/value group, two groups.
    all.insert(
        at + 1,
        Case {
            name: "falcon-gqa.ts.onnx",
            graph: fixture("../hf-models/falcon-gqa.ts.onnx"),
            seq: 16,
            vocab: 512,
            tps: &[2],
        },
    );
    all
}

fn strategy(g: &Graph, tp: usize, sp: bool, sharding: Vec<OpSharding>) -> Strategy {
    Strategy::new(1, 1, g.blocks.len(), MICRO_BATCH, 2)
        .with_tp(tp, sp)
        .with_sharding(sharding)
}

fn run(g: &Graph, s: &Strategy, seq: usize, vocab: usize) -> TrainReport {
    let t = for_strategy(g, s, seq, Objective::Lm).unwrap();
    let programs = lower(&t, s).unwrap();
    let mut opts = TrainOptions::new(Precision::F64, Optimizer::sgd(0.1), 1);
    opts.record_grads = true;
    autopar_cpu::train(
        &t,
        &programs,
        &TokenSource::synthetic(vocab, 3).into(),
        &opts,
        &|_| {},
    )
    .unwrap()
}

fn single(c: &Case) -> TrainReport {
    let s = Strategy::new(1, 1, c.graph.blocks.len(), MICRO_BATCH, 2);
    run(&c.graph, &s, c.seq, c.vocab)
}

/// `b`'s step equals `a`'s in f64: the loss and every gradient to 1e-9 of
/// the largest gradient.
fn assert_same_step(a: &TrainReport, b: &TrainReport, what: &str) {
    let (la, lb) = (a.steps[0].loss, b.steps[0].loss);
    assert!(((la - lb) / la).abs() <= 1e-9, "{what}: loss {la} vs {lb}");
    let max = a
        .gradients
        .values()
        .flat_map(|g| g.to_f64_vec())
        .fold(0.0, |m: f64, x| m.max(x.abs()));
    // A tensor-parallel run keeps a tied weight's two copies where one
    // rank keeps one weight: each copy's gradient is the tied weight's.
    assert!(a.gradients.keys().all(|p| b.gradients.contains_key(p)), "{what}");
    for (p, gb) in &b.gradients {
        let original = p.strip_suffix(".tied").unwrap_or(p);
        let Some(ga) = a.gradients.get(original) else {
            panic!("{what}: {p} has no counterpart");
        };
        let (x, y) = (gb.to_f64_vec(), ga.to_f64_vec());
        assert_eq!(x.len(), y.len(), "{what}: {p}");
        let diff = x.iter().zip(&y).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(diff <= 1e-9 * max, "{what}: gradient of {p} off by {diff}");
    }
}

fn sharded_ops(sharding: &[OpSharding]) -> usize {
    sharding.iter().filter(|o| o.strategy != "replicate").count()
}

#[test]
fn the_planners_sharding_runs_with_one_ranks_losses() {
    for c in cases() {
        let one = single(&c);
        for &tp in c.tps {
            for sp in [false, true] {
                let what = format!("{} tp {tp} sp {sp}", c.name);
                let sharding = planned(&c.graph, tp, sp, c.seq, Ask::LeastMemory);
                assert!(sharded_ops(&sharding) > 0, "{what}: nothing sharded");
                let r = run(&c.graph, &strategy(&c.graph, tp, sp, sharding), c.seq, c.vocab);
                assert!(r.ranks[0].bytes_sent > 0, "{what}");
                assert_same_step(&one, &r, &what);
            }
        }
    }
}

/// Megatron-LM's layout, pinned on the zoo GPT's linears and embedding:
/// column- then row-parallel (a row-parallel bias is added once, after the
/// sum), a vocabulary-parallel embedding; the program fills in the rest,
/// and under sequence parallelism keeps the residual stream on sequence
/// slices between layers.
const MEGATRON: &[(&str, &str)] = &[
    ("wte", "vocab"),
    ("h.0.attn.qkv", "column"),
    ("h.0.attn.proj", "row"),
    ("h.0.mlp.fc", "column"),
    ("h.0.mlp.proj", "row"),
];

#[test]
fn megatrons_layout_runs_as_the_plans_choice() {
    let c = cases().remove(0);
    let one = single(&c);
    for &tp in c.tps {
        for sp in [false, true] {
            let sharding = planned(&c.graph, tp, sp, c.seq, Ask::Pinned(MEGATRON));
            // Under sequence parallelism some of the layer runs on sequence slices.
            let seq_split = |o: &&OpSharding| {
                let specs = o.inputs.iter().flatten().chain(&o.outputs);
                specs
                    .into_iter()
                    .any(|t| t.dims.len() == 3 && t.dims[1] != DimSpec::Replicate)
            };
            assert_eq!(sharding.iter().any(|o| seq_split(&o)), sp, "tp {tp} sp {sp}");
            let r = run(&c.graph, &strategy(&c.graph, tp, sp, sharding), c.seq, c.vocab);
            assert_same_step(&one, &r, &format!("megatron tp {tp} sp {sp}"));
        }
    }
}

#[test]
fn a_graph_without_detected_layers_runs_its_sharding() {
    let mut g = fixture("gpt2-tiny.ts.onnx");
    g.blocks.clear();
    let c = Case {
        name: "gpt2 without layers",
        graph: g,
        seq: 16,
        vocab: 1000,
        tps: &[2],
    };
    let sharding = planned(&c.graph, 2, false, c.seq, Ask::LeastMemory);
    assert!(sharded_ops(&sharding) > 10);
    let r = run(&c.graph, &strategy(&c.graph, 2, false, sharding), c.seq, c.vocab);
    assert_same_step(&single(&c), &r, c.name);
}

/// `sharding` with node `node`'s entry edited in its JSON, as a user
/// edits a plan file: `strategy` renamed and the layouts rewritten.
fn edited(sharding: &[OpSharding], node: &str, edit: impl Fn(&mut serde_json::Value)) -> Vec<OpSharding> {
    let mut json = serde_json::to_value(sharding).unwrap();
    let entry = json
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|e| e["node"] == node)
        .unwrap_or_else(|| panic!("no entry for {node}"));
    edit(entry);
    serde_json::from_value(json).unwrap()
}

/// Every dim of a tensor spec replicated, no pending sum.
fn replicate(spec: &mut serde_json::Value) {
    if spec.is_null() {
        return;
    }
    for d in spec["dims"].as_array_mut().unwrap() {
        *d = serde_json::json!("Replicate");
    }
    spec.as_object_mut().unwrap().remove("partial");
}

/// Dim `dim` (from the end when negative) of a tensor spec sharded over `tp`.
fn shard(spec: &mut serde_json::Value, dim: i64) {
    replicate(spec);
    let dims = spec["dims"].as_array_mut().unwrap();
    let d = if dim < 0 { dims.len() as i64 + dim } else { dim } as usize;
    dims[d] = serde_json::json!({ "Shard": "tp" });
}

#[test]
fn editing_one_ops_sharding_changes_the_traffic_not_the_losses() {
    let c = cases().remove(0);
    let one = single(&c);
    let base = planned(&c.graph, 2, false, c.seq, Ask::Pinned(MEGATRON));
    let sent = |sharding: Vec<OpSharding>, what: &str| {
        let r = run(&c.graph, &strategy(&c.graph, 2, false, sharding), c.seq, c.vocab);
        assert_same_step(&one, &r, what);
        r.ranks[0].bytes_sent
    };
    let megatron = sent(base.clone(), "megatron");
    // The MLP's first linear replicated: its input is no longer copied in
    // (no all-reduce of its gradient), and the GELU slices its output.
    let whole_fc = edited(&base, "h.0.mlp.fc", |e| {
        e["strategy"] = "replicate".into();
        e["inputs"].as_array_mut().unwrap().iter_mut().for_each(replicate);
        e["outputs"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .for_each(replicate);
    });
    let replicated = sent(whole_fc, "h.0.mlp.fc replicated");
    assert_ne!(replicated, megatron, "replicating a linear changes nothing sent");
    // The MLP's first linear row- instead of column-parallel: it reads its
    // input split (a free slice) and leaves a pending sum that the GELU,
    // reading its input split, reduce-scatters.
    let row_fc = edited(&base, "h.0.mlp.fc", |e| {
        e["strategy"] = "row".into();
        let inputs = e["inputs"].as_array_mut().unwrap();
        shard(&mut inputs[0], -1);
        shard(&mut inputs[1], 0);
        replicate(&mut inputs[2]);
        let out = &mut e["outputs"][0];
        replicate(out);
        out["partial"] = "tp".into();
    });
    let row = sent(row_fc, "h.0.mlp.fc row-parallel");
    assert_ne!(
        row, megatron,
        "a row-parallel linear sends what a column one does"
    );
    assert_ne!(row, replicated);
}

#[test]
fn a_bad_edit_is_refused_naming_the_node() {
    let c = cases().remove(0);
    let base = planned(&c.graph, 2, false, c.seq, Ask::Pinned(MEGATRON));
    let lowered = |sharding: Vec<OpSharding>| {
        let s = strategy(&c.graph, 2, false, sharding);
        for_strategy(&c.graph, &s, c.seq, Objective::Lm)
            .map(drop)
            .unwrap_err()
            .to_string()
    };
    let err = lowered(edited(&base, "h.0.mlp.fc", |e| e["strategy"] = "diagonal".into()));
    assert!(
        err.contains("'h.0.mlp.fc'") && err.contains("no strategy 'diagonal'") && err.contains("column, row"),
        "{err}"
    );
    // Renamed without rewriting the layouts: the plan contradicts itself.
    let err = lowered(edited(&base, "h.0.mlp.fc", |e| e["strategy"] = "row".into()));
    assert!(
        err.contains("'h.0.mlp.fc'") && err.contains("input 0") && err.contains("strategy 'row'"),
        "{err}"
    );
    let err = lowered(edited(&base, "h.0.mlp.fc", |e| e["node"] = "h.0.mlp.gone".into()));
    assert!(
        err.contains("'h.0.mlp.gone'") && err.contains("does not have"),
        "{err}"
    );
}

#[test]
fn experts_split_by_expert_or_by_width_run_with_one_ranks_losses() {
    let moe: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.name.starts_with("mixtral"))
        .collect();
    assert_eq!(moe.len(), 2, "both exports");
    for c in moe {
        experts_split_run_with_one_ranks_losses(&c);
    }
}

fn experts_split_run_with_one_ranks_losses(c: &Case) {
    let one = single(c);
    let experts: Vec<String> = c.graph.blocks[0]
        .nodes
        .iter()
        .filter(|n| {
            let idx = c
                .graph
                .node_indices()
                .find(|&i| &c.graph.node(i).name == *n)
                .unwrap();
            c.graph.node(idx).op.name() == "MoeExperts"
        })
        .cloned()
        .collect();
    assert!(!experts.is_empty());
    for how in ["expert", "ffn"] {
        let pins: Vec<(&str, &str)> = experts.iter().map(|n| (n.as_str(), how)).collect();
        let sharding = planned(&c.graph, 2, false, c.seq, Ask::Pinned(&pins));
        let r = run(&c.graph, &strategy(&c.graph, 2, false, sharding), c.seq, c.vocab);
        assert_same_step(&one, &r, &format!("experts by {how}"));
    }
}

/// The pin on the plan's path: for every fixture at tp 2 and 4 (where its
/// dims split), with and without sequence parallelism, under the sharding
/// the program picks with and without a memory limit, the tensor-parallel
/// bytes one rank sends per micro-batch in the lowered programs are what
/// the cost model prices for the same per-op sharding.
#[test]
fn priced_tensor_parallel_bytes_are_what_the_planned_programs_send() {
    let (mut equal, mut wrong) = (0, Vec::new());
    for (name, model, seq, max_tp) in common::models() {
        for tp in [2, 4].into_iter().filter(|&tp| tp <= max_tp) {
            for sp in [false, true] {
                for (how, ask) in [("cheapest", Ask::Pinned(&[])), ("least memory", Ask::LeastMemory)] {
                    let sharding = planned(&model, tp, sp, seq, ask);
                    let names: BTreeMap<String, String> = sharding
                        .iter()
                        .map(|o| (o.node.clone(), o.strategy.clone()))
                        .collect();
                    let opts = workload_options(seq, tp, sp);
                    let w = Workload::build_planned(&model, &opts, &names).unwrap();
                    let priced = priced_bytes(&w, tp);
                    let s = strategy(&model, tp, sp, sharding);
                    let t = for_strategy(&model, &s, seq, Objective::Lm).unwrap();
                    let programs = lower(&t, &s).unwrap();
                    let sent: f64 = lowered_bytes(&t, &programs[0], tp).values().sum();
                    if (sent - priced).abs() <= 1e-9 * priced.max(1.0) {
                        equal += 1;
                    } else {
                        wrong.push(format!(
                            "{name} tp {tp} sp {sp} {how}: programs send {sent} bytes per rank, the cost model prices {priced}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} agree; these differ:\n{}",
        equal,
        wrong.join("\n")
    );
}

/// Falcon's multi-query attention split by query heads, its one key/value
/// head read whole: the losses and gradients equal one rank's and the
/// bytes are what the cost model prices. (Falcon fuses query, key and
/// value into one product split afterwards, so the split heads are sliced
/// from its replicated output.)
#[test]
fn multi_query_attention_splits_its_query_heads() {
    let c = cases().into_iter().find(|c| c.name == "falcon.ts.onnx").unwrap();
    let attention = c
        .graph
        .node_indices()
        .map(|i| c.graph.node(i))
        .find(|n| matches!(n.op, autopar_ir::Op::Attention { .. }))
        .unwrap()
        .name
        .clone();
    let pins = [(attention.as_str(), "query heads")];
    let sharding = planned(&c.graph, 2, false, c.seq, Ask::Pinned(&pins));
    let names: BTreeMap<String, String> = sharding
        .iter()
        .map(|o| (o.node.clone(), o.strategy.clone()))
        .collect();
    assert_eq!(names[&attention], "query heads");
    sends_what_is_priced_and_steps_as_one_rank(&c, &names, sharding, "falcon query heads");
}

/// `c` at tp 2 under `sharding` (`names`: node → strategy): rank 0's
/// lowered tensor-parallel bytes are the cost model's, and the step is one
/// rank's.
fn sends_what_is_priced_and_steps_as_one_rank(
    c: &Case,
    names: &BTreeMap<String, String>,
    sharding: Vec<OpSharding>,
    what: &str,
) {
    let w = Workload::build_planned(&c.graph, &workload_options(c.seq, 2, false), names).unwrap();
    let s = strategy(&c.graph, 2, false, sharding);
    let t = for_strategy(&c.graph, &s, c.seq, Objective::Lm).unwrap();
    let programs = lower(&t, &s).unwrap();
    let sent: f64 = lowered_bytes(&t, &programs[0], 2).values().sum();
    let priced = priced_bytes(&w, 2);
    assert!(
        (sent - priced).abs() <= 1e-9 * priced,
        "{what}: sent {sent}, priced {priced}"
    );
    assert_same_step(&single(c), &run(&c.graph, &s, c.seq, c.vocab), what);
}

/// Falcon's grouped-query layout fuses each key/value group's queries,
/// key and value into one product, viewed `[.., groups, q + 2, d]`: the
/// engine splits that product by columns, which are whole groups, and
/// every view, slice and head after it by the group axis, as Megatron-LM
/// splits a fused QKV; the step equals one rank's and the bytes are what
/// the cost model prices.
#[test]
fn grouped_query_falcon_splits_its_fused_projection_by_groups() {
    let c = cases()
        .into_iter()
        .find(|c| c.name == "falcon-gqa.ts.onnx")
        .unwrap();
    let g = &c.graph;
    // The fused product: the Linear whose output is viewed as 5-D groups.
    let fused = g
        .node_indices()
        .map(|i| g.node(i))
        .find(|n| {
            matches!(n.op, autopar_ir::Op::Linear)
                && g.consumers(n.outputs[0]).iter().any(|&u| {
                    let view = g.node(u);
                    matches!(view.op, autopar_ir::Op::Reshape { .. })
                        && g.tensor(view.outputs[0]).ty.shape.rank() == 5
                })
        })
        .unwrap()
        .name
        .clone();
    let sharding = planned(g, 2, false, c.seq, Ask::LeastMemory);
    let names: BTreeMap<String, String> = sharding
        .iter()
        .map(|o| (o.node.clone(), o.strategy.clone()))
        .collect();
    assert_eq!(names[&fused], "column", "{names:?}");
    let attention = g
        .node_indices()
        .map(|i| g.node(i))
        .find(|n| matches!(n.op, autopar_ir::Op::Attention { .. }))
        .unwrap();
    assert_eq!(names[&attention.name], "heads");
    sends_what_is_priced_and_steps_as_one_rank(&c, &names, sharding, "falcon groups");
}

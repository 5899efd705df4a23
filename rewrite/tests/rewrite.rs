//! Canonicalisation on the exported fixtures: both exports of a model agree
//! on their compute ops, graphs shrink, attention is found everywhere, and
//! the rewritten graphs compute onnxruntime's reference outputs.

use autopar_import::onnx::{load_model, read_tensor_file};
use autopar_ir::{Graph, Value};
use autopar_rewrite::{canonicalize, compute_histogram, RewriteReport};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures");

fn model_path(stem: &str) -> PathBuf {
    Path::new(FIXTURES).join("models").join(format!("{stem}.onnx"))
}

fn canonical(stem: &str) -> (Graph, Graph, RewriteReport) {
    let g = load_model(&model_path(stem)).unwrap_or_else(|e| panic!("{stem}: {e}"));
    let (c, report) = canonicalize(&g).unwrap_or_else(|e| panic!("{stem}: {e}"));
    eprintln!(
        "{stem}: {} -> {} nodes, {} iterations, {} ({} e-nodes), compute ops {:?}, all ops after {:?}",
        report.nodes_before,
        report.nodes_after,
        report.iterations,
        report.stop_reason,
        report.egraph_nodes,
        compute_histogram(&c),
        report.ops_after
    );
    (g, c, report)
}

fn check_shrinks_and_finds_attention(stem: &str, original: &Graph, c: &Graph, report: &RewriteReport) {
    assert_eq!(report.stop_reason, "Saturated", "{stem}");
    assert!(c.node_count() < original.node_count(), "{stem}: {report:?}");
    assert!(
        compute_histogram(c).get("Attention").is_some_and(|&n| n > 0),
        "{stem}: no Attention"
    );
    c.validate().unwrap();
}

#[test]
fn both_exports_of_each_model_agree_on_compute_ops() {
    for (ts, dynamo) in [
        ("gpt2-tiny.ts", "gpt2-tiny.dynamo"),
        ("llama-tiny.ts", "llama-tiny.dynamo"),
        ("bert-tiny.ts", "bert-tiny.dynamo"),
        ("gpt2-full.ts.weightless", "gpt2-full.dynamo.weightless"),
    ] {
        let (g1, c1, r1) = canonical(ts);
        let (g2, c2, r2) = canonical(dynamo);
        check_shrinks_and_finds_attention(ts, &g1, &c1, &r1);
        check_shrinks_and_finds_attention(dynamo, &g2, &c2, &r2);
        assert_eq!(compute_histogram(&c1), compute_histogram(&c2), "{ts} vs {dynamo}");
        // Nothing primitive is left among the compute ops.
        for name in ["MatMul", "Gemm"] {
            assert!(!compute_histogram(&c1).contains_key(name), "{ts}: {name} left");
        }
    }
}

#[test]
fn mixtral_routing_and_attention_are_recognised() {
    let mut histograms = vec![];
    for stem in ["mixtral-tiny.dynamo", "mixtral-tiny.ts"] {
        let (g, c, r) = canonical(stem);
        check_shrinks_and_finds_attention(stem, &g, &c, &r);
        let h = compute_histogram(&c);
        assert!(
            h.contains_key("MoeRouter") && h.contains_key("MoeExperts"),
            "{stem}: {h:?}"
        );
        histograms.push(h);
    }
    assert_eq!(histograms[0], histograms[1], "both exports compute alike");
}

/// Runs `graph` on `feeds` (by graph-input order) with each op's reference
/// kernel, in topological order.
fn evaluate(graph: &Graph, feeds: &[Value]) -> Vec<Value> {
    let mut values: HashMap<u32, Value> = HashMap::new();
    for (t, tensor) in graph.tensors() {
        if let Some(d) = &tensor.data {
            values.insert(t.0, (**d).clone());
        }
    }
    for (t, v) in graph.inputs.iter().zip(feeds) {
        values.insert(t.0, v.clone());
    }
    for idx in graph.topo_order().unwrap() {
        let node = graph.node(idx);
        let inputs: Vec<Option<&Value>> = node
            .inputs
            .iter()
            .map(|t| t.and_then(|t| values.get(&t.0)))
            .collect();
        let outs = node
            .op
            .eval(&inputs)
            .unwrap_or_else(|e| panic!("node '{}': {e}", node.name));
        for (&t, v) in node.outputs.iter().zip(outs) {
            values.insert(t.0, v);
        }
    }
    graph.outputs.iter().map(|t| values[&t.0].clone()).collect()
}

fn read_numbered(dir: &Path, prefix: &str) -> Vec<Value> {
    (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.pb")))
        .take_while(|p| p.exists())
        .map(|p| read_tensor_file(&p).unwrap().1)
        .collect()
}

#[test]
fn rewritten_graphs_reproduce_reference_outputs() {
    for stem in [
        "gpt2-tiny.ts",
        "gpt2-tiny.dynamo",
        "llama-tiny.ts",
        "llama-tiny.dynamo",
        "bert-tiny.ts",
        "bert-tiny.dynamo",
        "mixtral-tiny.dynamo",
        "mixtral-tiny.ts",
    ] {
        let (_, c, _) = canonical(stem);
        let dir = Path::new(FIXTURES)
            .join("reference")
            .join(stem)
            .join("test_data_set_0");
        let inputs = read_numbered(&dir, "input");
        let expected = read_numbered(&dir, "output");
        let got = evaluate(&c, &inputs);
        let (want, got) = (&expected[0], &got[0]);
        assert_eq!(want.shape, got.shape, "{stem}");
        let (w, g) = (want.to_f64_vec(), got.to_f64_vec());
        let worst = w
            .iter()
            .zip(&g)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1.0))
            .fold(0.0, f64::max);
        eprintln!("{stem}: max relative error {worst:.2e}");
        assert!(worst <= 1e-4, "{stem}: max relative error {worst}");
    }
}

/// Decoders' attention is recognised as causal from the exported mask; BERT's
/// bidirectional attention is not.
#[test]
fn causal_flag_follows_the_exported_mask() {
    let causal_flags = |stem: &str| -> Vec<bool> {
        let (_, c, _) = canonical(stem);
        c.node_indices()
            .filter_map(|n| match c.node(n).op {
                autopar_ir::Op::Attention { causal, .. } => Some(causal),
                _ => None,
            })
            .collect()
    };
    for stem in [
        "gpt2-tiny.ts",
        "gpt2-tiny.dynamo",
        "llama-tiny.ts",
        "llama-tiny.dynamo",
        "mixtral-tiny.dynamo",
        "mixtral-tiny.ts",
    ] {
        assert_eq!(causal_flags(stem), vec![true, true], "{stem}");
    }
    for stem in ["bert-tiny.ts", "bert-tiny.dynamo"] {
        assert_eq!(causal_flags(stem), vec![false, false], "{stem}");
    }
}

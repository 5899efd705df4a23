//! How a zoo GPT is split: Megatron's layer layout and the vocabulary-parallel ends.

use super::*;

fn comm_counts(g: &Graph) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for i in g.node_indices() {
        if let Op::Comm { kind, .. } = g.node(i).op {
            *counts.entry(format!("{kind:?}")).or_insert(0) += 1;
        }
    }
    counts
}

fn gpt(layers: usize) -> Graph {
    gpt_with(layers, "")
}

fn gpt_with(layers: usize, extra: &str) -> Graph {
    let spec = format!("gpt:layers={layers},hidden=32,heads=4,vocab=64,seq=8{extra}");
    let mut g = autopar_import::zoo::build(&spec).unwrap();
    g.bindings.insert("batch".into(), 2);
    g.bindings.insert("seq".into(), 8);
    g
}

#[test]
fn a_gpt_layer_is_split_like_megatron() {
    let one = shard(&gpt(1), 2, false).unwrap();
    let two = shard(&gpt(2), 2, false).unwrap();
    let per_layer = |kind: &str| comm_counts(&two.graph)[kind] - comm_counts(&one.graph)[kind];
    // Two all-reduces forward (attention and MLP outputs) and two copies
    // (their backward all-reduces) per layer.
    assert_eq!(per_layer("AllReduce"), 2);
    assert_eq!(per_layer("Copy"), 2);
    let s = &one.slices;
    assert_eq!(s["h.0.attn.qkv.weight"], WeightSlice { axis: 1, blocks: 3 });
    assert_eq!(s["h.0.attn.proj.weight"], WeightSlice { axis: 0, blocks: 1 });
    assert_eq!(s["h.0.mlp.fc.weight"], WeightSlice { axis: 1, blocks: 1 });
    assert_eq!(s["h.0.mlp.proj.weight"], WeightSlice { axis: 0, blocks: 1 });
    assert!(!s.contains_key("h.0.ln_1.weight"));
}

#[test]
fn sequence_parallelism_swaps_all_reduces_for_scatter_and_gather() {
    let one = shard(&gpt(1), 2, true).unwrap();
    let two = shard(&gpt(2), 2, true).unwrap();
    let per_layer = |kind: &str| {
        comm_counts(&two.graph).get(kind).copied().unwrap_or(0)
            - comm_counts(&one.graph).get(kind).copied().unwrap_or(0)
    };
    assert_eq!(per_layer("ReduceScatter"), 2);
    assert_eq!(per_layer("GatherForCompute"), 2);
    assert_eq!(per_layer("AllReduce"), 0);
}

#[test]
fn embeddings_are_vocabulary_parallel_and_summed_once() {
    // Untied: a table read twice is sliced by a comm op instead (training
    // gives a tied head its own copy first).
    let untied = gpt_with(1, ",tied=false");
    let one = shard(&untied, 2, false).unwrap();
    let rows = WeightSlice { axis: 0, blocks: 1 };
    assert_eq!(one.slices["wte.weight"], rows);
    assert_eq!(one.slices["wpe.weight"], rows);
    let g = &one.graph;
    let reduced: Vec<String> = g
        .node_indices()
        .filter(|&i| {
            matches!(
                g.node(i).op,
                Op::Comm {
                    kind: CommKind::AllReduce,
                    ..
                }
            )
        })
        .map(|i| g.tensor(g.node(i).inputs[0].unwrap()).name.clone())
        .filter(|name| !name.ends_with(".share"))
        .collect();
    // The token and position rows' shares are added, then summed once.
    assert_eq!(reduced, ["embed.add"]);
    // Under sequence parallelism the sum is reduce-scattered along the sequence.
    let sp = shard(&untied, 2, true).unwrap();
    let scattered = sp.graph.node_indices().any(|i| {
        let n = sp.graph.node(i);
        matches!(
            n.op,
            Op::Comm {
                kind: CommKind::ReduceScatter,
                axis: 1,
                ..
            }
        ) && sp.graph.tensor(n.inputs[0].unwrap()).name == "embed.add"
    });
    assert!(scattered);
}

//! The sharding ILP on zoo transformer layers and fixture graphs: it finds
//! Megatron-LM's layout by itself, is never worse than hand-made layouts,
//! respects a memory limit, and solves whole small models.

use autopar_cost_models::comm::{self, Algorithm, Collective, Span};
use autopar_cost_models::{Calibration, Cluster};
use autopar_import::ModelSpec;
use autopar_ir::{Bindings, Graph, NodeIndex};
use autopar_planner::sharding::{solve, solve_pinned, ShardingError, ShardingProblem, ShardingSolution};
use autopar_planner::spec::DimSpec;
use std::collections::{BTreeMap, HashMap};

const GPT: &str = "gpt:layers=2,hidden=2048,heads=16,vocab=1000,seq=512,dtype=bf16";
const LLAMA: &str = "llama:layers=2,hidden=2048,heads=16,kv_heads=8,ffn=5632,vocab=1000,seq=512,dtype=bf16";
/// Small enough that row-parallel attention output does not pay at tp = 4.
const SMALL_GPT: &str = "gpt:layers=2,hidden=768,heads=12,vocab=1000,seq=512,dtype=bf16";

/// A graph, the nodes to shard and where, at micro-batch 2.
struct Setup {
    graph: Graph,
    nodes: Vec<NodeIndex>,
    bindings: Bindings,
    cluster: Cluster,
    calibration: Calibration,
}

impl Setup {
    /// The first layer of a zoo model.
    fn layer(spec: &str) -> Setup {
        let graph = spec.parse::<ModelSpec>().unwrap().build().unwrap();
        let by_name: HashMap<&str, NodeIndex> = graph
            .node_indices()
            .map(|n| (graph.node(n).name.as_str(), n))
            .collect();
        let nodes = graph.blocks[0]
            .nodes
            .iter()
            .map(|n| by_name[n.as_str()])
            .collect();
        Setup::new(graph, nodes, [("batch".to_string(), 2)].into())
    }

    /// Every node of a fixture model, canonicalised.
    fn fixture(file: &str) -> Setup {
        let path = format!("{}/../fixtures/models/{file}", env!("CARGO_MANIFEST_DIR"));
        let model = autopar_import::onnx::load_model(std::path::Path::new(&path)).unwrap();
        let mut graph = autopar_rewrite::canonicalize(&model).unwrap().0;
        graph.blocks = autopar_rewrite::detect_blocks(&graph).unwrap();
        let nodes = graph.topo_order().unwrap();
        Setup::new(graph, nodes, Bindings::new())
    }

    fn new(graph: Graph, nodes: Vec<NodeIndex>, bindings: Bindings) -> Setup {
        Setup {
            graph,
            nodes,
            bindings,
            cluster: Cluster::preset("dgx-h100").unwrap().with_gpus(8).unwrap(),
            calibration: Calibration::default(),
        }
    }

    fn problem(&self, tp: usize) -> ShardingProblem<'_> {
        ShardingProblem {
            graph: &self.graph,
            bindings: &self.bindings,
            nodes: &self.nodes,
            tp,
            cluster: &self.cluster,
            calibration: &self.calibration,
            memory_limit_bytes: None,
            sequence_parallel: false,
            context_parallel: 1,
        }
    }

    /// Every node of the set pinned by `pick` (node name, op name) where it returns a strategy.
    fn pinned(&self, tp: usize, pick: impl Fn(&str, &str) -> Option<&'static str>) -> ShardingSolution {
        let pins: BTreeMap<String, String> = self
            .nodes
            .iter()
            .filter_map(|&n| {
                let node = self.graph.node(n);
                pick(&node.name, &node.op.name()).map(|s| (node.name.clone(), s.to_string()))
            })
            .collect();
        solve_pinned(&self.problem(tp), &pins).unwrap()
    }

    /// Seconds of one ring all-reduce of `bytes` over ranks `0..tp` at calibrated link rates.
    fn all_reduce(&self, tp: usize, bytes: f64) -> f64 {
        self.collective(tp, Collective::AllReduce, bytes)
    }

    /// Seconds of one ring `collective` of `bytes` over ranks `0..tp` at calibrated link rates.
    fn collective(&self, tp: usize, collective: Collective, bytes: f64) -> f64 {
        let effective = Cluster {
            intra_node: self.calibration.effective_link(self.cluster.intra_node, true),
            inter_node: self.calibration.effective_link(self.cluster.inter_node, false),
            ..self.cluster.clone()
        };
        let ranks: Vec<usize> = (0..tp).collect();
        let span = Span::of(&effective, &ranks).unwrap();
        comm::time(&effective, span, collective, Algorithm::Ring, bytes).unwrap()
    }
}

fn strategy<'s>(s: &'s ShardingSolution, suffix: &str) -> &'s str {
    let op = s.ops.iter().find(|o| o.node.ends_with(suffix));
    &op.unwrap_or_else(|| panic!("no node *{suffix}")).strategy
}

fn total(s: &ShardingSolution) -> f64 {
    s.compute_s + s.comm_s
}

/// Megatron-LM's choices for the ops it decides; views and element-wise
/// ops are left to follow.
fn megatron(name: &str, op: &str) -> Option<&'static str> {
    const COLUMN: [&str; 7] = ["qkv", "fc", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"];
    let last = name.rsplit('.').next().unwrap_or(name);
    match op {
        "Linear" if COLUMN.contains(&last) => Some("column"),
        "Linear" => Some("row"),
        "Attention" | "RotaryEmbedding" => Some("heads"),
        "LayerNorm" | "RmsNorm" | "Add" => Some("replicate"),
        _ => None,
    }
}

/// Bytes of the `[batch, seq, hidden]` activation of a layer (bf16, micro-batch 2).
fn activation_bytes(hidden: usize) -> f64 {
    (2 * 512 * hidden * 2) as f64
}

#[test]
fn a_gpt_layer_is_sharded_like_megatron() {
    let setup = Setup::layer(GPT);
    for tp in [2, 4] {
        let s = solve(&setup.problem(tp)).unwrap();
        let picked: Vec<&str> = [
            "attn.qkv",
            "mlp.fc",
            "attn.proj",
            "mlp.proj",
            "attn.core",
            "ln_1",
            "ln_2",
        ]
        .iter()
        .map(|n| strategy(&s, n))
        .collect();
        assert_eq!(
            picked,
            [
                "column",
                "column",
                "row",
                "row",
                "heads",
                "replicate",
                "replicate"
            ],
            "tp {tp}"
        );
        // Two all-reduces forward (after each row product) and two backward
        // (the gradients of the column products' inputs).
        let four = 4.0 * setup.all_reduce(tp, activation_bytes(2048));
        assert!(
            (s.comm_s - four).abs() < 1e-9 * four,
            "tp {tp}: {} vs {four}",
            s.comm_s
        );
    }
}

#[test]
fn a_llama_layer_is_sharded_like_megatron() {
    let setup = Setup::layer(LLAMA);
    for tp in [2, 4, 8] {
        let s = solve(&setup.problem(tp)).unwrap();
        for (node, expected) in [
            ("q_proj", "column"),
            ("k_proj", "column"),
            ("v_proj", "column"),
            ("gate_proj", "column"),
            ("up_proj", "column"),
            ("o_proj", "row"),
            ("down_proj", "row"),
            ("self_attn.core", "heads"),
            ("q_rope", "heads"),
        ] {
            assert_eq!(strategy(&s, node), expected, "tp {tp}: {node}");
        }
        // The three column products reading the normalised input share one
        // backward all-reduce of its gradient. (Reduce-scattering the
        // attention's sum into a batch-split norm would need the residual
        // as a pending sum, which lowering cannot make.)
        let four = 4.0 * setup.all_reduce(tp, activation_bytes(2048));
        assert_eq!(strategy(&s, "input_layernorm"), "replicate");
        assert_eq!(strategy(&s, "post_attention_layernorm"), "replicate");
        assert!(
            (s.comm_s - four).abs() < 1e-9 * four,
            "tp {tp}: {} vs {four}",
            s.comm_s
        );
    }
}

/// Under context parallelism a rank holds `1/cp` of the tokens: the program
/// prices activations at that share and weights whole, so a long sequence
/// split 16 ways is sharded as its 16th would be on its own — Megatron's
/// layout, not the projections on a data split with their weights
/// replicated (whose gradients are all-reduced whole every micro-batch)
/// that the full sequence's activations would make look cheaper.
#[test]
fn context_parallelism_prices_the_ranks_share_of_the_tokens() {
    const LONG: &str =
        "llama:layers=2,hidden=2048,heads=16,kv_heads=8,ffn=5632,vocab=1000,seq=8192,dtype=bf16";
    let long = Setup::layer(LONG);
    let whole = solve(&long.problem(2)).unwrap();
    assert_ne!(
        strategy(&whole, "q_proj"),
        "column",
        "the full sequence no longer makes a data split look cheaper; pick a longer one"
    );
    let mut split = long.problem(2);
    split.context_parallel = 16;
    let split = solve(&split).unwrap();
    // LLAMA is the same layer at 8192 / 16 = 512 tokens.
    let share = solve(&Setup::layer(LLAMA).problem(2)).unwrap();
    for node in [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "down_proj",
        "self_attn.core",
    ] {
        assert_eq!(strategy(&split, node), strategy(&share, node), "{node}");
    }
    assert_eq!(strategy(&split, "q_proj"), "column");
    assert!(
        (split.comm_s - share.comm_s).abs() < 1e-9 * share.comm_s,
        "{} vs {}",
        split.comm_s,
        share.comm_s
    );
}

/// With sequence parallelism the layer's input and output stay split along
/// the sequence: the program runs both norms and residuals on sequence
/// slices, gathers before the column products and reduce-scatters after
/// the row products (Megatron-LM's sequence parallelism), moving the bytes
/// of four all-reduces in eight collectives (twice the latency) plus the
/// norms' small weight gradients.
#[test]
fn sequence_parallelism_keeps_norms_on_sequence_slices() {
    let setup = Setup::layer(LLAMA);
    for tp in [2, 4, 8] {
        let mut p = setup.problem(tp);
        p.sequence_parallel = true;
        let s = solve(&p).unwrap();
        for (node, expected) in [
            ("input_layernorm", "dim1"),
            ("post_attention_layernorm", "dim1"),
            ("q_proj", "column"),
            ("o_proj", "row"),
            ("down_proj", "row"),
        ] {
            assert_eq!(strategy(&s, node), expected, "tp {tp}: {node}");
        }
        let act = activation_bytes(2048);
        let eight = 4.0
            * (setup.collective(tp, Collective::ReduceScatter, act)
                + setup.collective(tp, Collective::AllGather, act));
        let norm_grads = 2.0 * setup.all_reduce(tp, 2.0 * 2048.0);
        assert!(
            (s.comm_s - eight - norm_grads).abs() < 1e-9 * eight,
            "tp {tp}: {} vs {eight} + {norm_grads}",
            s.comm_s
        );
    }
}

#[test]
fn one_rank_replicates_everything() {
    let setup = Setup::layer(LLAMA);
    let s = solve(&setup.problem(1)).unwrap();
    assert!(s.ops.iter().all(|o| o.strategy == "replicate"));
    assert_eq!((s.comm_s, s.variables), (0.0, 0));
    assert!(s.ops.iter().flat_map(|o| &o.outputs).all(|t| t.partial.is_none()));
}

#[test]
fn never_worse_than_replicated_or_megatron() {
    for spec in [GPT, LLAMA, SMALL_GPT] {
        let setup = Setup::layer(spec);
        for tp in [2, 4] {
            let best = solve(&setup.problem(tp)).unwrap();
            let replicated = setup.pinned(tp, |_, _| Some("replicate"));
            let megatron = setup.pinned(tp, megatron);
            assert_eq!(replicated.comm_s, 0.0);
            let slack = 1e-12;
            assert!(total(&best) <= total(&replicated) + slack, "{spec} tp {tp}");
            assert!(total(&best) <= total(&megatron) + slack, "{spec} tp {tp}");
            assert!(megatron.param_bytes_per_rank < replicated.param_bytes_per_rank);
        }
    }
    // With hidden 768 at four ranks, gathering the attention heads and
    // running the output projection whole beats a row product and its
    // all-reduce: the program finds it.
    let setup = Setup::layer(SMALL_GPT);
    let best = solve(&setup.problem(4)).unwrap();
    assert_eq!(strategy(&best, "attn.proj"), "replicate");
    assert!(total(&best) < total(&setup.pinned(4, megatron)));
}

#[test]
fn a_memory_limit_shards_more_and_an_impossible_one_is_an_error() {
    let setup = Setup::layer(SMALL_GPT);
    let mut p = setup.problem(4);
    let free = solve(&p).unwrap();
    p.memory_limit_bytes = Some(1.0);
    let Err(ShardingError::Infeasible { limit, min }) = solve(&p) else {
        panic!("a 1-byte limit must be infeasible");
    };
    assert_eq!(limit, 1.0);
    assert!(
        min < free.param_bytes_per_rank,
        "{min} vs {}",
        free.param_bytes_per_rank
    );
    p.memory_limit_bytes = Some(min);
    let tight = solve(&p).unwrap();
    assert!(tight.param_bytes_per_rank <= min * (1.0 + 1e-12));
    assert!(total(&tight) >= total(&free));
    // The output projection's weights must be split now.
    assert!(matches!(strategy(&tight, "attn.proj"), "column" | "row"));
    p.memory_limit_bytes = Some(0.99 * min);
    let message = solve(&p).unwrap_err().to_string();
    assert!(
        message.contains("parameter memory limit") && message.contains(&format!("{min:.0}")),
        "{message}"
    );
}

#[test]
fn the_same_input_gives_the_same_answer() {
    let setup = Setup::layer(LLAMA);
    assert_eq!(
        solve(&setup.problem(4)).unwrap(),
        solve(&setup.problem(4)).unwrap()
    );
}

#[test]
fn whole_small_fixtures_solve_with_valid_specs() {
    for file in [
        "gpt2-tiny.dynamo.onnx",
        "llama-tiny.dynamo.onnx",
        "bert-tiny.dynamo.onnx",
        "mixtral-tiny.dynamo.onnx",
    ] {
        let setup = Setup::fixture(file);
        let names: HashMap<&str, NodeIndex> = setup
            .graph
            .node_indices()
            .map(|n| (setup.graph.node(n).name.as_str(), n))
            .collect();
        for tp in [2, 4] {
            let s = solve(&setup.problem(tp)).unwrap_or_else(|e| panic!("{file} tp {tp}: {e}"));
            assert_eq!(s.ops.len(), setup.nodes.len());
            assert!(s.comm_s.is_finite() && s.compute_s > 0.0, "{file}");
            for op in &s.ops {
                let node = setup.graph.node(names[op.node.as_str()]);
                let tensors = node.inputs.iter().flatten().chain(&node.outputs);
                let specs = op.inputs.iter().flatten().chain(&op.outputs);
                for (&t, spec) in tensors.zip(specs) {
                    let dims = setup.graph.tensor(t).ty.shape.as_fixed().unwrap();
                    assert_eq!(spec.dims.len(), dims.len(), "{file}: {}", op.node);
                    for (d, s) in dims.iter().zip(&spec.dims) {
                        assert!(
                            *s == DimSpec::Replicate || d % tp == 0,
                            "{file}: {} {spec:?}",
                            op.node
                        );
                    }
                }
            }
        }
    }
}

/// A tied embedding's two readers, before and after the layers, are solved
/// in one program: they read the table as one slice (lowering then stores
/// both copies as that slice), as Megatron-LM's vocabulary-parallel
/// embedding and output layer do, where reading it differently would store
/// it whole and gather its gradient every micro-batch.
#[test]
fn a_tied_embedding_is_read_as_one_slice_before_and_after_the_layers() {
    use autopar_cost_models::TrainingConfig;
    use autopar_planner::layer_sharding;
    let spec = "gpt:layers=2,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=bf16";
    let graph = spec.parse::<ModelSpec>().unwrap().build().unwrap();
    let cluster = Cluster::preset("dgx-a100-80g").unwrap().with_gpus(8).unwrap();
    for tp in [2, 4, 8] {
        let cfg = TrainingConfig {
            tp,
            sp: true,
            ..TrainingConfig::default()
        };
        let ops = layer_sharding::for_config(&graph, &cluster, &Calibration::default(), &cfg, None).unwrap();
        let reads: Vec<_> = ops
            .iter()
            .filter_map(|o| {
                let spec = o.inputs.iter().flatten().find(|t| t.tensor == "wte.weight")?;
                Some((o.node.clone(), spec.dims.clone()))
            })
            .collect();
        assert_eq!(reads.len(), 2, "tp {tp}: {reads:?}");
        assert_eq!(reads[0].1, reads[1].1, "tp {tp}: {reads:?}");
        assert!(
            reads[0].1.iter().any(|d| matches!(d, DimSpec::Shard(_))),
            "tp {tp}: {reads:?}"
        );
    }
}

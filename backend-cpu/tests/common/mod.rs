//! What the tensor-parallel tests share: the fixture models, and the bytes
//! one rank sends on its tensor-parallel group per micro-batch, counted in
//! the lowered programs and priced by the cost model's workload.

#![allow(dead_code)] // Each test file uses its own part.

use autopar_cost_models::comm::{bytes_sent, of_comm, priced_by_output, Algorithm};
use autopar_cost_models::workload::{Group, Unit};
use autopar_cost_models::{AttentionKernel, Calibration, Cluster, Sharding, Workload, WorkloadOptions};
use autopar_exec::train::initialize;
use autopar_ir::Graph;
use autopar_lower::{Instr, Program, TrainingGraph};
use autopar_planner::layer_sharding;
use autopar_planner::sharding::{self, ShardingError, ShardingProblem};
use autopar_planner::spec::OpSharding;
use std::collections::{BTreeMap, HashMap, HashSet};

pub const MICRO_BATCH: usize = 2;

/// A bundled ONNX fixture, canonicalised, its layers detected.
pub fn fixture(file: &str) -> Graph {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/models/").to_string() + file;
    let g = autopar_import::onnx::load_model(std::path::Path::new(&path)).unwrap();
    let (mut g, _) = autopar_rewrite::canonicalize(&g).unwrap();
    g.blocks = autopar_rewrite::detect_blocks(&g).unwrap();
    g
}

/// A two-layer zoo GPT with initialised weights.
pub fn zoo_gpt() -> Graph {
    let mut g = autopar_import::zoo::build("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8").unwrap();
    initialize(&mut g, 7).unwrap();
    g
}

/// The models of the pins: `(name, graph, sequence length, largest tp)`.
/// The largest tensor-parallel degree is what their attention heads allow
/// (BERT has two heads, the Llama and Mixtral exports two key/value heads);
/// the workload knows heads only from canonical `Attention` ops, which
/// these exports do not all have, so the fixtures' configs say it here.
pub fn models() -> Vec<(&'static str, Graph, usize, usize)> {
    let mut m = vec![("zoo gpt", zoo_gpt(), 8, 4)];
    for (file, max_tp) in [
        ("gpt2-tiny.ts.onnx", 4),
        ("gpt2-tiny.dynamo.onnx", 4),
        ("llama-tiny.ts.onnx", 2),
        ("llama-tiny.dynamo.onnx", 2),
        ("bert-tiny.ts.onnx", 2),
        ("bert-tiny.dynamo.onnx", 2),
        ("mixtral-tiny.dynamo.onnx", 2),
        ("mixtral-tiny.ts.onnx", 2),
    ] {
        m.push((file, fixture(file), 16, max_tp));
    }
    m
}

/// Bytes rank 0 sends on its tensor-parallel group per micro-batch, by
/// the node's name (the buffer convention of `autopar_cost_models::comm`:
/// the whole tensor, the gathered output, the scattered input).
pub fn lowered_bytes(t: &TrainingGraph, program: &Program, tp: usize) -> HashMap<String, f64> {
    let g = &t.graph;
    let nodes: HashMap<&str, _> = g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect();
    let mut bytes = HashMap::new();
    let mut micro_batches = std::collections::BTreeSet::new();
    for instr in &program.instructions {
        let Instr::Collective {
            node,
            kind,
            micro_batch,
            ..
        } = instr
        else {
            continue;
        };
        micro_batches.insert(*micro_batch);
        let Some(c) = of_comm(*kind) else { continue };
        let n = g.node(nodes[node.as_str()]);
        if !matches!(
            n.op,
            autopar_ir::Op::Comm {
                group: autopar_ir::CommGroup::Tensor,
                ..
            }
        ) {
            continue;
        }
        let buffer = match priced_by_output(*kind) {
            true => n.outputs[0],
            false => n.inputs[0].unwrap(),
        };
        let ty = &g.tensor(buffer).ty;
        let numel: usize = ty.shape.0.iter().map(|d| d.fixed().unwrap()).product();
        let size = (numel * ty.dtype.size_bits() / 8) as f64;
        *bytes.entry(node.clone()).or_insert(0.0) += bytes_sent(c, Algorithm::Ring, tp, size).unwrap()[0];
    }
    let micro_batches = micro_batches.len().max(1) as f64;
    bytes.values_mut().for_each(|b| *b /= micro_batches);
    bytes
}

/// Tensor-parallel bytes one rank sends per micro-batch, as workload `w`
/// prices them: the part before the layers, every layer, the part after.
pub fn priced_bytes(w: &Workload, tp: usize) -> f64 {
    let unit = |u: &Unit| -> f64 {
        u.comms
            .iter()
            .filter(|c| c.group == Group::Tensor)
            .flat_map(|c| {
                // A regathered input's gather runs again in the backward pass.
                let again = c.forward.filter(|_| c.regathered);
                [c.forward, c.backward, again]
                    .into_iter()
                    .flatten()
                    .map(|k| (k, c.bytes))
            })
            .map(|(k, b)| bytes_sent(k, Algorithm::Ring, tp, b).unwrap()[0])
            .sum()
    };
    unit(&w.pre) + w.layers as f64 * unit(&w.layer) + unit(&w.post)
}

/// What to price for a micro-batch of [`MICRO_BATCH`] rows of `seq` tokens
/// on a `tp`-way group (sequence-parallel when `sp`).
pub fn workload_options(seq: usize, tp: usize, sp: bool) -> WorkloadOptions {
    WorkloadOptions {
        micro_batch: Some(MICRO_BATCH),
        seq: Some(seq),
        sharding: Sharding { tp, sp, cp: 1, ep: 1 },
        attention: AttentionKernel::Fused,
        dropout: false,
        moe_capacity_factor: None,
        loss: Default::default(),
    }
}

/// How the integer program is asked to shard.
pub enum Ask<'a> {
    /// Parameters in the least memory per rank: every weight it can shard
    /// is sharded (without a limit these tiny models stay replicated).
    LeastMemory,
    /// The cheapest layout with these nodes pinned to these strategies.
    Pinned(&'a [(&'a str, &'a str)]),
}

/// The per-op sharding the planner's integer program chooses for `g` at
/// `tp`, over the node sets a plan records (the parts before and after the
/// layers, and the first layer; or every node when `g` has no layers).
pub fn planned(g: &Graph, tp: usize, sp: bool, seq: usize, ask: Ask) -> Vec<OpSharding> {
    let cluster = Cluster::preset("dgx-h100").unwrap().with_gpus(8).unwrap();
    let calibration = Calibration::default();
    let bindings = layer_sharding::bindings(g, MICRO_BATCH, Some(seq));
    let mut ops = Vec::new();
    for nodes in layer_sharding::node_sets(g).unwrap() {
        let mut p = ShardingProblem {
            graph: g,
            bindings: &bindings,
            nodes: &nodes,
            tp,
            cluster: &cluster,
            calibration: &calibration,
            memory_limit_bytes: None,
            sequence_parallel: sp,
            context_parallel: 1,
        };
        let solved = match ask {
            Ask::LeastMemory => {
                p.memory_limit_bytes = Some(0.0);
                let Err(ShardingError::Infeasible { min, .. }) = sharding::solve(&p) else {
                    panic!("no memory floor")
                };
                p.memory_limit_bytes = Some(min * 1.000001);
                sharding::solve(&p)
            }
            Ask::Pinned(pins) => {
                let names: HashSet<&str> = nodes.iter().map(|&i| g.node(i).name.as_str()).collect();
                let pins: BTreeMap<String, String> = pins
                    .iter()
                    .filter(|(n, _)| names.contains(n))
                    .map(|(n, s)| (n.to_string(), s.to_string()))
                    .collect();
                sharding::solve_pinned(&p, &pins)
            }
        };
        ops.extend(solved.unwrap().ops);
    }
    ops
}

/// Checks that every output of the nodes `picked` chooses (by name, to
/// their output tensor's name) is made twice per micro-batch in `program`
/// (forward, then again for the backward pass) and that the forward's is
/// freed before the second is made; returns how many were checked.
pub fn made_again_for_the_backward_pass(
    program: &Program,
    picked: &HashMap<String, String>,
    what: &str,
) -> usize {
    let mut made: HashMap<(String, usize), Vec<usize>> = HashMap::new();
    let mut freed: HashMap<(String, usize), Vec<usize>> = HashMap::new();
    for (at, instr) in program.instructions.iter().enumerate() {
        match instr {
            Instr::Collective {
                node, micro_batch, ..
            }
            | Instr::Compute { node, micro_batch } => {
                if let Some(out) = picked.get(node.as_str()) {
                    made.entry((out.clone(), *micro_batch)).or_default().push(at);
                }
            }
            Instr::Free { buf } => {
                if let Some(mb) = buf.micro_batch {
                    freed.entry((buf.tensor.clone(), mb)).or_default().push(at);
                }
            }
            _ => {}
        }
    }
    for (key, at) in &made {
        assert_eq!(at.len(), 2, "{what} {key:?}: made at {at:?}");
        let frees = &freed[key];
        assert!(frees[0] < at[1], "{what} {key:?}: kept from {at:?} to {frees:?}");
    }
    made.len()
}

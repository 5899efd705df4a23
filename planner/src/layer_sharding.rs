//! Per-op sharding for a chosen configuration: the integer program of
//! [`crate::sharding`] over the parts before and after the layers (one
//! program: a tied embedding's two readers choose together) and over the
//! first layer (every layer repeats it), each solved on its own so that
//! every layer boundary, the first layer's input and the last one's output
//! included, crosses in the same layout (replicated, or split along the
//! sequence under sequence parallelism), at the plan's micro-batch,
//! sequence and tensor-parallel degree.

use crate::sharding::{self, ShardingError, ShardingProblem};
use crate::spec::OpSharding;
use autopar_cost_models::{Calibration, Cluster, TrainingConfig};
use autopar_ir::layers::outside_layers;
use autopar_ir::{Bindings, Dim, Graph, GraphError, NodeIndex};
use std::collections::{HashMap, HashSet};

/// The node sets a plan's per-op sharding covers, in topological order:
/// the parts before and after the layers, then the first layer; a graph
/// without layers is one set.
pub fn node_sets(graph: &Graph) -> Result<Vec<Vec<NodeIndex>>, GraphError> {
    let order = graph.topo_order()?;
    let Some(first) = graph.blocks.first() else {
        return Ok(vec![order]);
    };
    let first: HashSet<&str> = first.nodes.iter().map(String::as_str).collect();
    let (pre, post) = outside_layers(graph);
    let pick = |keep: &dyn Fn(NodeIndex) -> bool| order.iter().copied().filter(|&i| keep(i)).collect();
    Ok(vec![
        pick(&|i| pre.contains(&i) || post.contains(&i)),
        pick(&|i| first.contains(graph.node(i).name.as_str())),
    ])
}

/// The per-op sharding of `graph` under `cfg` on `cluster` (sized).
pub fn for_config(
    graph: &Graph,
    cluster: &Cluster,
    calibration: &Calibration,
    cfg: &TrainingConfig,
    seq: Option<usize>,
) -> Result<Vec<OpSharding>, ShardingError> {
    let bindings = bindings(graph, cfg.micro_batch, seq);
    let mut ops = Vec::new();
    for nodes in node_sets(graph)? {
        let problem = ShardingProblem {
            graph,
            bindings: &bindings,
            nodes: &nodes,
            tp: cfg.tp,
            cluster,
            calibration,
            memory_limit_bytes: None,
            sequence_parallel: cfg.sp,
            context_parallel: cfg.cp,
        };
        ops.extend(sharding::solve(&problem)?.ops);
    }
    // Recorded as plans list them: the part before the layers, the first
    // layer, the part after; each in topological order.
    let (pre, post) = outside_layers(graph);
    let place: HashMap<&str, (u8, usize)> = graph
        .topo_order()?
        .into_iter()
        .enumerate()
        .map(|(i, idx)| {
            let part = match (pre.contains(&idx), post.contains(&idx)) {
                (true, _) => 0,
                (_, true) => 2,
                _ => 1,
            };
            (graph.node(idx).name.as_str(), (part, i))
        })
        .collect();
    ops.sort_by_key(|o| place.get(o.node.as_str()).copied().unwrap_or((3, 0)));
    Ok(ops)
}

/// The graph's bindings with `batch` the micro-batch and `seq` the
/// sequence, where the graph has those symbols.
pub fn bindings(graph: &Graph, micro_batch: usize, seq: Option<usize>) -> Bindings {
    let has_symbol = |name: &str| {
        graph
            .tensors()
            .any(|(_, t)| t.ty.shape.0.iter().any(|d| matches!(d, Dim::Sym(s) if s == name)))
    };
    let mut bindings = graph.bindings.clone();
    if has_symbol("batch") {
        bindings.insert("batch".into(), micro_batch);
    }
    if let Some(seq) = seq.filter(|_| has_symbol("seq")) {
        bindings.insert("seq".into(), seq);
    }
    bindings
}

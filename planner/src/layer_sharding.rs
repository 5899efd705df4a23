//! Per-op sharding for a chosen configuration: the integer program of
//! [`crate::sharding`] over the part before the layers, the first layer (every
//! layer repeats it) and the part after, at the plan's micro-batch, sequence
//! and tensor-parallel degree.

use crate::sharding::{self, ShardingError, ShardingProblem};
use crate::spec::OpSharding;
use autopar_cost_models::{Calibration, Cluster, TrainingConfig};
use autopar_ir::{Dim, Graph};
use std::collections::HashSet;

/// The per-op sharding of `graph` under `cfg` on `cluster` (sized).
pub fn for_config(
    graph: &Graph,
    cluster: &Cluster,
    calibration: &Calibration,
    cfg: &TrainingConfig,
    seq: Option<usize>,
) -> Result<Vec<OpSharding>, ShardingError> {
    let repeats: HashSet<&str> = graph
        .blocks
        .iter()
        .skip(1)
        .flat_map(|b| b.nodes.iter().map(String::as_str))
        .collect();
    let nodes: Vec<_> = graph
        .topo_order()?
        .into_iter()
        .filter(|&idx| !repeats.contains(graph.node(idx).name.as_str()))
        .collect();
    let has_symbol = |name: &str| {
        graph
            .tensors()
            .any(|(_, t)| t.ty.shape.0.iter().any(|d| matches!(d, Dim::Sym(s) if s == name)))
    };
    let mut bindings = graph.bindings.clone();
    if has_symbol("batch") {
        bindings.insert("batch".into(), cfg.micro_batch);
    }
    if let Some(seq) = seq.filter(|_| has_symbol("seq")) {
        bindings.insert("seq".into(), seq);
    }
    let problem = ShardingProblem {
        graph,
        bindings: &bindings,
        nodes: &nodes,
        tp: cfg.tp,
        cluster,
        calibration,
        memory_limit_bytes: None,
    };
    Ok(sharding::solve(&problem)?.ops)
}

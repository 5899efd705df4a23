//! Canonicalising rewrites with egg: exporter-specific primitive chains
//! (PyTorch's TorchScript and dynamo ONNX exporters spell the same layer
//! differently) become the canonical ops the planner shards — `Linear`,
//! `Attention`, `LayerNorm`/`RmsNorm`, `Gelu`/`Silu`, `Embedding`,
//! `MoeRouter` — so that both exports of one model plan the same.
//!
//! The graph becomes one e-graph (`convert`), rules (`rules`) add the
//! canonical forms beside the originals, and extraction picks the cheapest
//! graph, where canonical ops are cheap. A graph pass (`experts`) then fuses
//! exported expert MLPs into `MoeExperts`. The rewritten graph computes the
//! same outputs; it is re-typed through `Op::infer` and validated.

mod analysis;
mod causal;
mod convert;
mod experts;
mod lang;
mod rules;

use autopar_ir::op::OpClass;
use autopar_ir::{Graph, GraphError};
use egg::{Runner, SimpleScheduler, StopReason};
use std::collections::BTreeMap;
use std::time::Duration;

/// Runner limits: generous for transformer graphs of a few thousand nodes.
const ITER_LIMIT: usize = 30;
const NODE_LIMIT: usize = 200_000;
const TIME_LIMIT: Duration = Duration::from_secs(30);

/// What canonicalisation did, for logs and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct RewriteReport {
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Op histograms ([`Graph::op_histogram`]) before and after.
    pub ops_before: BTreeMap<String, usize>,
    pub ops_after: BTreeMap<String, usize>,
    /// Why egg stopped (`Saturated` unless a limit was hit).
    pub stop_reason: String,
    pub iterations: usize,
    /// E-graph size when egg stopped.
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    /// How often each rule fired, summed over iterations.
    pub rules_applied: BTreeMap<String, usize>,
}

/// Why a graph could not be canonicalised.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RewriteError {
    #[error("rewrite: {0}")]
    Graph(#[from] GraphError),
    #[error("rewrite rule '{rule}' is malformed: {message}")]
    Rule { rule: String, message: String },
    #[error("rewrite: e-class {class} has no op to extract")]
    Extraction { class: usize },
    #[error("rewrite: graph output '{tensor}' has no value after extraction")]
    MissingOutput { tensor: String },
}

/// Rewrites `graph` into canonical ops. The result computes the same
/// outputs from the same inputs and passes [`Graph::validate`].
pub fn canonicalize(graph: &Graph) -> Result<(Graph, RewriteReport), RewriteError> {
    let rules = rules::all()?;
    let mut imported = convert::import(graph)?;
    let egraph = std::mem::take(&mut imported.egraph);
    let runner = Runner::default()
        .with_scheduler(SimpleScheduler)
        .with_iter_limit(ITER_LIMIT)
        .with_node_limit(NODE_LIMIT)
        .with_time_limit(TIME_LIMIT)
        .with_egraph(egraph)
        .run(&rules);
    let stop_reason = match &runner.stop_reason {
        Some(StopReason::Saturated) => "Saturated".to_string(),
        Some(StopReason::IterationLimit(n)) => format!("IterationLimit({n})"),
        Some(StopReason::NodeLimit(n)) => format!("NodeLimit({n})"),
        Some(StopReason::TimeLimit(t)) => format!("TimeLimit({t:.1}s)"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "None".to_string(),
    };
    let mut rules_applied = BTreeMap::new();
    for it in &runner.iterations {
        for (name, n) in &it.applied {
            *rules_applied.entry(name.to_string()).or_default() += n;
        }
    }
    let iterations = runner.iterations.len();
    imported.egraph = runner.egraph;
    let mut out = convert::extract(&imported, graph)?;
    causal::mark_causal(&mut out);
    experts::fuse_experts(&mut out)?;
    out.validate()?;
    let report = RewriteReport {
        nodes_before: graph.node_count(),
        nodes_after: out.node_count(),
        ops_before: graph.op_histogram(),
        ops_after: out.op_histogram(),
        stop_reason,
        iterations,
        egraph_nodes: imported.egraph.total_number_of_nodes(),
        egraph_classes: imported.egraph.number_of_classes(),
        rules_applied,
    };
    Ok((out, report))
}

/// The classes whose ops a planner shards: what canonicalisation must make
/// agree between exports of one model.
pub const COMPUTE_CLASSES: [OpClass; 6] = [
    OpClass::Linear,
    OpClass::Attention,
    OpClass::Norm,
    OpClass::Activation,
    OpClass::Embedding,
    OpClass::MoeRouting,
];

/// Count of nodes per op name, restricted to [`COMPUTE_CLASSES`].
pub fn compute_histogram(graph: &Graph) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for n in graph.node_indices() {
        let op = &graph.node(n).op;
        if COMPUTE_CLASSES.contains(&op.class()) {
            *h.entry(op.name()).or_default() += 1;
        }
    }
    h
}

#[cfg(test)]
mod tests;

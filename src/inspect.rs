//! `autopar inspect`: what a model is — parameters, FLOPs per training step at
//! the bound batch/sequence, its ops before and after canonicalisation, and
//! its repeated layers.

use crate::limits;
use crate::model::{self, Source};
use anyhow::Result;
use autopar_ir::{graph_cost, Bindings, Graph, Role};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Everything `inspect` reports; `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct InspectReport {
    pub model: String,
    pub source: Source,
    /// Trainable parameter elements (float parameters the graph uses).
    pub parameters: u64,
    /// Elements of all float initializers with a known shape (weightless ones included).
    pub float_initializer_elements: u64,
    /// True when parameter shapes are known but their data is not.
    pub weightless: bool,
    pub bindings: Bindings,
    pub flops_per_step: Flops,
    pub nodes: NodeCounts,
    pub op_histogram: Histograms,
    pub layers: Layers,
}

/// FLOPs of one training step (forward + backward) at `bindings`.
#[derive(Debug, Clone, Serialize)]
pub struct Flops {
    pub forward: f64,
    pub backward: f64,
    pub total: f64,
}

/// Node counts before and after canonicalisation.
#[derive(Debug, Clone, Serialize)]
pub struct NodeCounts {
    pub before_rewrite: usize,
    pub after_rewrite: usize,
}

/// Op histograms (op name → count) before and after canonicalisation.
#[derive(Debug, Clone, Serialize)]
pub struct Histograms {
    pub before_rewrite: BTreeMap<String, usize>,
    pub after_rewrite: BTreeMap<String, usize>,
}

/// Repeated blocks found in the canonical graph.
#[derive(Debug, Clone, Serialize)]
pub struct Layers {
    pub count: usize,
    pub nodes_per_layer: usize,
    /// Name of the first node of the first layer, to locate it.
    pub first_node: Option<String>,
}

/// Builds the report for `model` with optional batch/seq overrides.
pub fn report(model_arg: &str, batch: Option<usize>, seq: Option<usize>) -> Result<InspectReport> {
    limits::size_opt("--batch", batch, limits::MAX_GLOBAL_BATCH, "MAX_GLOBAL_BATCH")?;
    limits::seq(seq)?;
    let m = model::load_with(
        model_arg,
        model::Axes {
            batch,
            seq,
            ..Default::default()
        },
    )?;
    let canonical = model::canonical(&m)?;
    let bindings = model::bindings(&m.graph, batch, seq);
    let cost = graph_cost(&canonical, &bindings)?;
    let params = m.graph.float_parameter_elements(&bindings);
    Ok(InspectReport {
        model: model_arg.to_string(),
        source: m.source,
        parameters: params,
        float_initializer_elements: params,
        weightless: is_weightless(&m.graph),
        bindings,
        flops_per_step: Flops {
            forward: cost.forward_flops,
            backward: cost.backward_flops,
            total: cost.forward_flops + cost.backward_flops,
        },
        nodes: NodeCounts {
            before_rewrite: m.graph.node_count(),
            after_rewrite: canonical.node_count(),
        },
        op_histogram: Histograms {
            before_rewrite: m.graph.op_histogram(),
            after_rewrite: canonical.op_histogram(),
        },
        layers: Layers {
            count: canonical.blocks.len(),
            nodes_per_layer: canonical.blocks.first().map_or(0, |b| b.nodes.len()),
            first_node: canonical.blocks.first().and_then(|b| b.nodes.first().cloned()),
        },
    })
}

fn is_weightless(graph: &Graph) -> bool {
    graph
        .tensors()
        .any(|(_, t)| t.role == Role::Parameter && t.data.is_none())
}

/// Formats a count with a metric suffix (1.2M, 3.4G).
pub fn human(n: f64) -> String {
    const UNITS: [(f64, &str); 5] = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    UNITS.iter().find(|(scale, _)| n.abs() >= *scale).map_or_else(
        || format!("{n}"),
        |(scale, unit)| format!("{:.2}{unit}", n / scale),
    )
}

/// Renders the report for people.
pub fn render(r: &InspectReport) -> String {
    let mut s = String::new();
    let bindings: Vec<String> = r.bindings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(s, "model        {} ({:?})", r.model, r.source);
    let _ = writeln!(
        s,
        "parameters   {} ({}){}",
        r.parameters,
        human(r.parameters as f64),
        if r.weightless { ", weightless" } else { "" }
    );
    let _ = writeln!(s, "float initializer elements {}", r.float_initializer_elements);
    let _ = writeln!(
        s,
        "FLOPs/step   {} (forward {}, backward {}) at {}",
        human(r.flops_per_step.total),
        human(r.flops_per_step.forward),
        human(r.flops_per_step.backward),
        if bindings.is_empty() {
            "static shapes".to_string()
        } else {
            bindings.join(", ")
        }
    );
    let _ = writeln!(
        s,
        "nodes        {} before rewriting, {} after",
        r.nodes.before_rewrite, r.nodes.after_rewrite
    );
    let _ = writeln!(
        s,
        "layers       {} × {} nodes{}",
        r.layers.count,
        r.layers.nodes_per_layer,
        r.layers
            .first_node
            .as_ref()
            .map(|n| format!(" (first: {n})"))
            .unwrap_or_default()
    );
    let _ = writeln!(s, "ops          {:<24} {:>8} {:>8}", "", "before", "after");
    let names: std::collections::BTreeSet<&String> = r
        .op_histogram
        .before_rewrite
        .keys()
        .chain(r.op_histogram.after_rewrite.keys())
        .collect();
    for name in names {
        let get = |h: &BTreeMap<String, usize>| h.get(name).copied().unwrap_or(0);
        let _ = writeln!(
            s,
            "             {:<24} {:>8} {:>8}",
            name,
            get(&r.op_histogram.before_rewrite),
            get(&r.op_histogram.after_rewrite)
        );
    }
    s
}

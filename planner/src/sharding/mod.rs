//! Intra-operator sharding on one mesh axis (`tp`), Alpa style: every op
//! has a few sharding strategies (declared beside the op, in its family's
//! `shard.rs` in `autopar-ir`, read through [`autopar_ir::op::sharding`],
//! the same rules the cost model prices and lowering runs), moving a tensor between the
//! layouts its producer writes and its consumers read costs collectives
//! (forward, and the conjugate one on its gradient backward), and an integer
//! program picks one strategy per op minimising compute plus communication
//! under a parameter-memory limit.
//!
//! Nothing is Megatron-specific: on a transformer layer the program finds
//! Megatron-LM's column-then-row layout (two all-reduces forward, two
//! backward) because it is the cheapest, where
//! `autopar_cost_models::workload::layout` hard-codes it.
//!
//! Boundary conventions: a tensor entering the node set from another op
//! arrives replicated and its gradient must go back replicated; one leaving
//! it to another op must be replicated (under sequence parallelism an
//! activation carrying a gradient crosses split along the sequence instead); graph outputs may stay sharded (a
//! sharded loss, as Megatron's vocabulary-parallel cross-entropy), but not
//! partial. Parameters, constants and graph inputs are laid out as each
//! consumer reads them; a parameter's bytes count once, at its first
//! consumer's layout. Ops computed only from weights and constants (a
//! transposed tied embedding) run once per step, not per micro-batch, so
//! their kernels cost nothing here; a weight prepared outside the node set
//! is read as stored. The all-reduce of a replicated weight's gradient under
//! a data split is charged in full, as for a single micro-batch per step.

mod build;
mod ilp;
mod reshard;

use crate::spec::{DimSpec, OpSharding, TensorSpec};
use autopar_ir::op::sharding::{self as rules, UnboundDims};
use autopar_ir::{Bindings, Graph, NodeIndex, TensorId};
pub use rules::{Layout, Strategy};
use std::collections::BTreeMap;

/// The mesh axis name used in the specs.
pub const AXIS: &str = "tp";

/// What to shard and where.
#[derive(Debug, Clone, Copy)]
pub struct ShardingProblem<'a> {
    /// A canonical graph.
    pub graph: &'a Graph,
    /// Values of symbolic dims (`batch` = the micro-batch, `seq`); the
    /// graph's own bindings fill in the rest.
    pub bindings: &'a Bindings,
    /// The ops to shard (one layer, the part before or after the layers,
    /// or a whole small graph).
    pub nodes: &'a [NodeIndex],
    /// Ranks on the `tp` mesh axis.
    pub tp: usize,
    /// Sequence parallelism: activations cross the edge of the node set
    /// (the layer boundaries) split along the sequence (dim 1) instead of
    /// replicated, so the program can keep norms and residuals on
    /// sequence slices between the tensor-parallel regions.
    pub sequence_parallel: bool,
    /// Context-parallel degree: each rank holds `1/cp` of the tokens, so a
    /// tensor computed from the inputs moves, and a node on them computes,
    /// a `1/cp` share of its full size; weights move whole.
    pub context_parallel: usize,
    /// The cluster (sized); the `tp` group is ranks `0..tp`.
    pub cluster: &'a autopar_cost_models::Cluster,
    pub calibration: &'a autopar_cost_models::Calibration,
    /// Bytes per rank allowed for parameters with their gradients and Adam
    /// state (`memory::optimizer_bytes_per_param`).
    pub memory_limit_bytes: Option<f64>,
}

/// The chosen sharding and what it costs per micro-batch on one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardingSolution {
    /// One entry per node, in the problem's order.
    pub ops: Vec<OpSharding>,
    /// Forward plus backward kernel time, seconds.
    pub compute_s: f64,
    /// Forward plus backward collective time, seconds.
    pub comm_s: f64,
    /// Parameter, gradient and optimizer-state bytes per rank.
    pub param_bytes_per_rank: f64,
    /// Variables of the integer programs solved (0 when none was needed).
    pub variables: usize,
}

/// Why no sharding could be found; names the node, tensor or limit at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShardingError {
    #[error("the tp axis needs at least one rank")]
    NoRanks,
    #[error("tp = {tp} needs more GPUs than the cluster's {gpus}")]
    TooFewGpus { tp: usize, gpus: usize },
    #[error("node #{index} is not in the graph")]
    MissingNode { index: usize },
    #[error("node '{node}' is listed twice")]
    DuplicateNode { node: String },
    #[error("node '{node}': tensor '{tensor}' has shape {shape} with an unbound symbol (bind it)")]
    Unbound {
        node: String,
        tensor: String,
        shape: String,
    },
    #[error("node '{node}': cannot pin strategy '{strategy}': {reason}")]
    Pin {
        node: String,
        strategy: String,
        reason: String,
    },
    #[error(
        "parameter memory limit of {limit:.0} bytes per rank is below the smallest achievable, {min:.0} bytes"
    )]
    Infeasible { limit: f64, min: f64 },
    #[error(transparent)]
    Graph(#[from] autopar_ir::GraphError),
    #[error("plan sharding of node '{node}': {message}")]
    Plan { node: String, message: String },
    #[error("pricing: {0}")]
    Pricing(String),
    #[error("integer program: {0}")]
    Solver(String),
}

impl From<UnboundDims> for ShardingError {
    fn from(e: UnboundDims) -> Self {
        ShardingError::Unbound {
            node: e.node,
            tensor: e.tensor,
            shape: e.shape,
        }
    }
}

/// The cheapest sharding of `p.nodes`.
pub fn solve(p: &ShardingProblem) -> Result<ShardingSolution, ShardingError> {
    solve_pinned(p, &BTreeMap::new())
}

/// The cheapest sharding with some nodes pinned to named strategies (node
/// name → strategy name), to price a hand-made layout such as Megatron's
/// or all-`replicate` under the same model.
pub fn solve_pinned(
    p: &ShardingProblem,
    pins: &BTreeMap<String, String>,
) -> Result<ShardingSolution, ShardingError> {
    let built = build::build(p, pins)?;
    if let Some(limit) = p.memory_limit_bytes {
        let min: f64 = built
            .model
            .choices
            .iter()
            .map(|c| c.mem.iter().copied().fold(f64::INFINITY, f64::min))
            .sum();
        if min > limit {
            return Err(ShardingError::Infeasible { limit, min });
        }
    }
    let picks = ilp::solve(&built.model, p.memory_limit_bytes).map_err(ShardingError::Solver)?;
    let (total, param_bytes_per_rank) = built.model.total(&picks.options);
    let compute_s: f64 = built.compute.iter().zip(&picks.options).map(|(c, &k)| c[k]).sum();
    let ops = p
        .nodes
        .iter()
        .zip(&built.strategies)
        .zip(&picks.options)
        .map(|((&idx, strategies), &k)| op_sharding(p.graph, idx, &strategies[k]))
        .collect();
    Ok(ShardingSolution {
        ops,
        compute_s,
        comm_s: (total - compute_s).max(0.0),
        param_bytes_per_rank,
        variables: picks.variables,
    })
}

/// The strategy a plan names for node `idx` of `graph` (bound), looked up
/// among the node's rules on `tp` ranks and checked against the layouts
/// the plan records for it. Lowering runs what this returns, so a plan's
/// per-op sharding and the program that runs it cannot disagree, and an
/// edited plan is refused if it names a strategy the rules do not have or
/// layouts that strategy does not read and write.
pub fn planned_strategy(
    graph: &Graph,
    idx: NodeIndex,
    tp: usize,
    planned: &OpSharding,
) -> Result<Strategy, ShardingError> {
    let node = graph.node(idx);
    let fail = |message: String| ShardingError::Plan {
        node: planned.node.clone(),
        message,
    };
    let s = named_strategy(graph, idx, tp, &planned.strategy)?;
    if planned.inputs.len() != node.inputs.len() || planned.outputs.len() != node.outputs.len() {
        return Err(fail(format!(
            "the plan lists {} inputs and {} outputs, the node has {} and {}",
            planned.inputs.len(),
            planned.outputs.len(),
            node.inputs.len(),
            node.outputs.len()
        )));
    }
    let check = |what: &str, slot: usize, spec: &TensorSpec, rule: Layout| {
        let layout = layout_of(spec).map_err(|m| fail(format!("{what} {slot}: {m}")))?;
        if layout == rule {
            return Ok(());
        }
        Err(fail(format!(
            "{what} {slot} is laid out as {layout:?} in the plan, but strategy '{}' uses {rule:?}",
            s.name
        )))
    };
    for (slot, spec) in planned.inputs.iter().enumerate() {
        if let Some(spec) = spec {
            check("input", slot, spec, s.reads(slot).0)?;
        }
    }
    for (slot, spec) in planned.outputs.iter().enumerate() {
        let rule = s.outputs.get(slot).copied().unwrap_or(Layout::Replicate);
        check("output", slot, spec, rule)?;
    }
    Ok(s.clone())
}

/// The strategy called `name` among node `idx`'s rules on `tp` ranks (its
/// layouts follow the node's own operands: a later layer's copy of a
/// planned node runs the strategy of the same name).
pub fn named_strategy(
    graph: &Graph,
    idx: NodeIndex,
    tp: usize,
    name: &str,
) -> Result<Strategy, ShardingError> {
    let node = graph.node(idx);
    let view = rules::node_view(graph, &graph.bindings, idx, tp)?;
    match rules::strategy_named(&node.op, &view, name) {
        Some(s) => Ok(s),
        None => {
            let all = rules::strategies(&node.op, &view);
            let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
            Err(ShardingError::Plan {
                node: node.name.clone(),
                message: format!(
                    "{} has no strategy '{name}' on {tp} ranks (it has {})",
                    node.op.name(),
                    names.join(", ")
                ),
            })
        }
    }
}

/// The layout a spec describes on the one mesh axis [`AXIS`].
fn layout_of(spec: &TensorSpec) -> Result<Layout, String> {
    let mut sharded = spec.dims.iter().enumerate().filter_map(|(d, s)| match s {
        DimSpec::Replicate => None,
        DimSpec::Shard(axis) => Some((d, axis.as_str())),
    });
    let first = sharded.next();
    if sharded.next().is_some() {
        return Err(format!("'{}' is sharded on more than one dim", spec.tensor));
    }
    match (first, spec.partial.as_deref()) {
        (Some((_, axis)), _) | (None, Some(axis)) if axis != AXIS => Err(format!(
            "'{}' uses mesh axis '{axis}'; per-op sharding is over '{AXIS}'",
            spec.tensor
        )),
        (Some(_), Some(_)) => Err(format!("'{}' is both sharded and a pending sum", spec.tensor)),
        (Some((d, _)), None) => Ok(Layout::Shard(d)),
        (None, Some(_)) => Ok(Layout::Partial),
        (None, None) => Ok(Layout::Replicate),
    }
}

/// The spec of tensor `t` in `layout`.
fn spec(graph: &Graph, t: TensorId, layout: Layout) -> TensorSpec {
    let tensor = graph.tensor(t);
    let mut dims = vec![DimSpec::Replicate; tensor.ty.shape.rank()];
    let mut partial = None;
    match layout {
        Layout::Replicate => {}
        Layout::Shard(d) => {
            if let Some(dim) = dims.get_mut(d) {
                *dim = DimSpec::Shard(AXIS.into());
            }
        }
        Layout::Partial => partial = Some(AXIS.to_string()),
    }
    TensorSpec {
        tensor: tensor.name.clone(),
        dims,
        partial,
    }
}

fn op_sharding(graph: &Graph, idx: NodeIndex, s: &Strategy) -> OpSharding {
    let node = graph.node(idx);
    let layout_in = |slot: usize| s.inputs.get(slot).copied().flatten().unwrap_or(Layout::Replicate);
    let layout_out = |slot: usize| s.outputs.get(slot).copied().unwrap_or(Layout::Replicate);
    OpSharding {
        node: node.name.clone(),
        op: node.op.name(),
        strategy: s.name.clone(),
        inputs: node
            .inputs
            .iter()
            .enumerate()
            .map(|(slot, t)| t.map(|t| spec(graph, t, layout_in(slot))))
            .collect(),
        outputs: node
            .outputs
            .iter()
            .enumerate()
            .map(|(slot, &t)| spec(graph, t, layout_out(slot)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_cost_models::comm::{self, Algorithm, Collective, Span};
    use autopar_cost_models::{Calibration, Cluster};
    use autopar_ir::{DType, Op, Role, Shape, TensorType, UnaryOp};

    /// `x[4, 8] → Linear(w[8, 16]) → y → Relu → z`, `z` the graph output.
    fn tiny() -> (Graph, [NodeIndex; 2]) {
        let mut g = Graph::new("tiny");
        let ty = |d: &[usize]| TensorType {
            dtype: DType::F32,
            shape: Shape::fixed(d),
        };
        let x = g.add_tensor("x", ty(&[4, 8]), Role::Input, None);
        let w = g.add_tensor("w", ty(&[8, 16]), Role::Parameter, None);
        let y = g.add_tensor("y", ty(&[4, 16]), Role::Activation, None);
        let z = g.add_tensor("z", ty(&[4, 16]), Role::Activation, None);
        let lin = g
            .add_node("lin", Op::Linear, vec![Some(x), Some(w), None], vec![y])
            .unwrap();
        let relu = Op::Unary { func: UnaryOp::Relu };
        let act = g.add_node("act", relu, vec![Some(y)], vec![z]).unwrap();
        (g.inputs, g.outputs) = (vec![x], vec![z]);
        (g, [lin, act])
    }

    struct Env {
        cluster: Cluster,
        calibration: Calibration,
        bindings: Bindings,
    }

    fn env() -> Env {
        Env {
            cluster: Cluster::preset("dgx-h100").unwrap().with_gpus(8).unwrap(),
            calibration: Calibration::default(),
            bindings: Bindings::new(),
        }
    }

    fn problem<'a>(e: &'a Env, g: &'a Graph, nodes: &'a [NodeIndex], tp: usize) -> ShardingProblem<'a> {
        ShardingProblem {
            graph: g,
            bindings: &e.bindings,
            nodes,
            tp,
            cluster: &e.cluster,
            calibration: &e.calibration,
            memory_limit_bytes: None,
            sequence_parallel: false,
            context_parallel: 1,
        }
    }

    fn pins(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter().map(|(n, s)| (n.to_string(), s.to_string())).collect()
    }

    #[test]
    fn an_activation_leaving_the_set_is_gathered_but_a_graph_output_may_stay_sharded() {
        let (g, [lin, act]) = tiny();
        let e = env();
        let column = pins(&[("lin", "column")]);
        let alone = solve_pinned(&problem(&e, &g, &[lin], 2), &column).unwrap();
        let effective = Cluster {
            intra_node: e.calibration.effective_link(e.cluster.intra_node, true),
            ..e.cluster.clone()
        };
        let span = Span::of(&effective, &[0, 1]).unwrap();
        let gather = comm::time(
            &effective,
            span,
            Collective::AllGather,
            Algorithm::Ring,
            4.0 * 16.0 * 4.0,
        );
        assert!((alone.comm_s - gather.unwrap()).abs() < 1e-15, "{}", alone.comm_s);
        let both = solve_pinned(&problem(&e, &g, &[lin, act], 2), &column).unwrap();
        assert_eq!((both.ops[1].strategy.as_str(), both.comm_s), ("dim1", 0.0));
        let spec = &both.ops[1].outputs[0];
        assert_eq!(spec.dims, [DimSpec::Replicate, DimSpec::Shard(AXIS.into())]);
        assert_eq!((spec.tensor.as_str(), spec.partial.as_deref()), ("z", None));
    }

    #[test]
    fn parameter_memory_is_budgeted() {
        let (g, nodes) = tiny();
        let e = env();
        // 128 f32 weights at 16 bytes each (weight, gradient, two moments).
        let mut p = problem(&e, &g, &nodes, 2);
        p.memory_limit_bytes = Some(1500.0);
        let s = solve(&p).unwrap();
        assert_eq!(s.param_bytes_per_rank, 1024.0);
        assert!(
            matches!(s.ops[0].strategy.as_str(), "column" | "row"),
            "{:?}",
            s.ops[0]
        );
        p.memory_limit_bytes = Some(1000.0);
        let err = solve(&p).unwrap_err();
        assert_eq!(
            err,
            ShardingError::Infeasible {
                limit: 1000.0,
                min: 1024.0
            }
        );
        assert!(err.to_string().contains("1000 bytes per rank"), "{err}");
    }

    #[test]
    fn bad_problems_are_errors_naming_what_is_wrong() {
        let (mut g, nodes) = tiny();
        let e = env();
        let err =
            |p: &ShardingProblem, pin: &[(&str, &str)]| solve_pinned(p, &pins(pin)).unwrap_err().to_string();
        assert!(err(&problem(&e, &g, &nodes, 0), &[]).contains("at least one rank"));
        assert!(err(&problem(&e, &g, &nodes, 16), &[]).contains("cluster's 8"));
        let twice = [nodes[0], nodes[0]];
        assert!(err(&problem(&e, &g, &twice, 2), &[]).contains("'lin' is listed twice"));
        let pin = err(&problem(&e, &g, &nodes, 2), &[("lin", "diagonal")]);
        assert!(
            pin.contains("'lin'") && pin.contains("replicate, column, row"),
            "{pin}"
        );
        assert!(err(&problem(&e, &g, &nodes[..1], 2), &[("act", "dim0")]).contains("not among"));
        let t = g.node(nodes[0]).outputs[0];
        g.tensor_mut(t).ty.shape = Shape(vec![autopar_ir::Dim::Sym("batch".into()), 16.into()]);
        let unbound = err(&problem(&e, &g, &nodes, 2), &[]);
        assert!(unbound.contains("'lin'") && unbound.contains("'y'"), "{unbound}");
        g.remove_node(nodes[1]);
        assert!(err(&problem(&e, &g, &nodes, 2), &[]).contains("not in the graph"));
    }
}

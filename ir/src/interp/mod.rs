//! The CPU reference interpreter: runs a graph's nodes in topological order
//! with each op's reference kernel, in `f32` (as exported) or in `f64` (every
//! float32 tensor widened, for checking gradients and rounding).
//!
//! It is the oracle every other backend is checked against, so it favours
//! plain, obviously-correct execution: values are freed after their last use
//! and every result is checked against the shape and dtype the graph recorded.
//! It sits in `ir`, next to `Op::eval`, so that autodiff's checks, the cost
//! models' predictor and every backend share this one copy.

mod compare;

pub use compare::{compare, Comparison};

use crate::{DType, Data, Graph, GraphError, NodeIndex, Op, OpError, Role, TensorId, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Arithmetic precision of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Float tensors keep their own types (the model as exported).
    #[default]
    F32,
    /// Every `f32` tensor, parameter and cast target is widened to `f64`.
    F64,
}

/// Why a run failed; messages name the tensor or node.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("no value was given for graph input '{0}'")]
    MissingInput(String),
    #[error("input '{name}': expected {expected}, got {got}")]
    InputMismatch {
        name: String,
        expected: String,
        got: String,
    },
    #[error("'{0}' is not a graph input")]
    UnknownInput(String),
    #[error("tensor '{0}' has no data (weightless import): the graph can be planned but not executed")]
    Weightless(String),
    #[error("node '{node}': {source}")]
    Node { node: String, source: OpError },
    #[error("node '{node}': output {slot} is {got} but the graph records {expected}")]
    OutputMismatch {
        node: String,
        slot: usize,
        expected: String,
        got: String,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Runs `graph` on `feeds` (graph input name → value) and returns the graph
/// outputs in order.
pub fn run(
    graph: &Graph,
    feeds: &BTreeMap<String, Value>,
    precision: Precision,
) -> Result<Vec<Value>, RunError> {
    run_with(graph, feeds, precision, |_, op, args| op.eval(args))
}

/// [`run`] with `eval` computing each node from its op (as widened for
/// `precision`) and input values: the profiler times every kernel of a real
/// graph on the values a run gives it this way.
pub fn run_with(
    graph: &Graph,
    feeds: &BTreeMap<String, Value>,
    precision: Precision,
    mut eval: impl FnMut(NodeIndex, &Op, &[Option<&Value>]) -> Result<Vec<Value>, OpError>,
) -> Result<Vec<Value>, RunError> {
    let order = graph.topo_order()?;
    let mut remaining_uses = vec![0usize; graph.tensors().count()];
    for &idx in &order {
        for t in graph.node(idx).inputs.iter().flatten() {
            remaining_uses[t.index()] += 1;
        }
    }
    for t in &graph.outputs {
        remaining_uses[t.index()] += 1;
    }
    let mut values: Vec<Option<Arc<Value>>> = vec![None; remaining_uses.len()];
    bind_inputs(graph, feeds, precision, &mut values)?;
    for (id, tensor) in graph.tensors() {
        if matches!(tensor.role, Role::Parameter | Role::Constant) && remaining_uses[id.index()] > 0 {
            let data = tensor
                .data
                .as_ref()
                .ok_or_else(|| RunError::Weightless(tensor.name.clone()))?;
            values[id.index()] = Some(widen_shared(data, precision));
        }
    }
    for idx in order {
        let node = graph.node(idx);
        let op = widen_op(&node.op, precision);
        let args: Vec<Option<&Value>> = node
            .inputs
            .iter()
            .map(|t| t.map(|t| values[t.index()].as_deref().expect("inputs are computed first")))
            .collect();
        let results = eval(idx, &op, &args).map_err(|source| RunError::Node {
            node: node.name.clone(),
            source,
        })?;
        for (slot, (&t, v)) in node.outputs.iter().zip(results).enumerate() {
            check_output(graph, t, &v, precision).map_err(|(expected, got)| RunError::OutputMismatch {
                node: node.name.clone(),
                slot,
                expected,
                got,
            })?;
            values[t.index()] = Some(Arc::new(v));
        }
        for t in node.inputs.iter().flatten() {
            remaining_uses[t.index()] -= 1;
            if remaining_uses[t.index()] == 0 {
                values[t.index()] = None;
            }
        }
    }
    Ok(graph
        .outputs
        .iter()
        .map(|t| {
            let v = values[t.index()].as_ref().expect("outputs are computed");
            Arc::unwrap_or_clone(v.clone())
        })
        .collect())
}

fn bind_inputs(
    graph: &Graph,
    feeds: &BTreeMap<String, Value>,
    precision: Precision,
    values: &mut [Option<Arc<Value>>],
) -> Result<(), RunError> {
    for name in feeds.keys() {
        if !graph.inputs.iter().any(|&t| graph.tensor(t).name == *name) {
            return Err(RunError::UnknownInput(name.clone()));
        }
    }
    for &t in &graph.inputs {
        let tensor = graph.tensor(t);
        let value = feeds
            .get(&tensor.name)
            .ok_or_else(|| RunError::MissingInput(tensor.name.clone()))?;
        let bindings = &graph.bindings;
        let shape_ok = match tensor.ty.shape.resolve(bindings) {
            Some(dims) => dims == value.shape,
            None => tensor.ty.shape.rank() == value.shape.len(),
        };
        if value.dtype != tensor.ty.dtype || !shape_ok {
            return Err(RunError::InputMismatch {
                name: tensor.name.clone(),
                expected: format!("{}{}", tensor.ty.dtype, tensor.ty.shape),
                got: format!("{}{:?}", value.dtype, value.shape),
            });
        }
        values[t.index()] = Some(Arc::new(widen(value.clone(), precision)));
    }
    Ok(())
}

/// The dtype a tensor of `dtype` has in a run at `precision`.
/// `pub` (with the `widen*` helpers below) because the rank interpreter and
/// the per-node predictor, in crates above `ir`, widen the same way.
pub fn run_dtype(dtype: DType, precision: Precision) -> DType {
    match (precision, dtype) {
        (Precision::F64, DType::F32) => DType::F64,
        _ => dtype,
    }
}

/// `v` as it is held in a run at `precision`.
pub fn widen(v: Value, precision: Precision) -> Value {
    if run_dtype(v.dtype, precision) == v.dtype {
        return v;
    }
    let data = match v.data {
        Data::F32(x) => Data::F64(x.into_iter().map(f64::from).collect()),
        other => other,
    };
    Value {
        dtype: DType::F64,
        shape: v.shape,
        data,
    }
}

/// [`widen`] of a shared value, cloning only when it changes.
fn widen_shared(v: &Arc<Value>, precision: Precision) -> Arc<Value> {
    if run_dtype(v.dtype, precision) == v.dtype {
        v.clone()
    } else {
        Arc::new(widen((**v).clone(), precision))
    }
}

/// Ops whose attributes name an output float type produce `f64` in an
/// `f64` run.
pub fn widen_op(op: &Op, precision: Precision) -> std::borrow::Cow<'_, Op> {
    match op {
        Op::Cast {
            to,
            saturate,
            round_mode,
        } if run_dtype(*to, precision) != *to => std::borrow::Cow::Owned(Op::Cast {
            to: run_dtype(*to, precision),
            saturate: *saturate,
            round_mode: *round_mode,
        }),
        Op::ConstantOfShape { value: Some(s) } if run_dtype(s.dtype, precision) != s.dtype => {
            let mut s = *s;
            s.dtype = run_dtype(s.dtype, precision);
            std::borrow::Cow::Owned(Op::ConstantOfShape { value: Some(s) })
        }
        _ => std::borrow::Cow::Borrowed(op),
    }
}

fn check_output(graph: &Graph, t: TensorId, v: &Value, precision: Precision) -> Result<(), (String, String)> {
    let ty = &graph.tensor(t).ty;
    let dtype = run_dtype(ty.dtype, precision);
    let shape_ok = match ty.shape.resolve(&graph.bindings) {
        Some(dims) => dims == v.shape,
        None => ty.shape.rank() == v.shape.len(),
    };
    if v.dtype == dtype && shape_ok {
        Ok(())
    } else {
        Err((
            format!("{dtype}{}", ty.shape),
            format!("{}{:?}", v.dtype, v.shape),
        ))
    }
}

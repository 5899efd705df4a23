//! The losses added on the model's output, as graph nodes named `loss/…`:
//! a cross-entropy over the output's last dim (tokens' vocabulary or
//! classes; weighted by the masked positions for mlm) and a squared error.
//! Each is a sum divided by a constant count, the global batch's terms, so
//! the micro-batches' losses add up to the global mean. A cross-entropy's
//! log-softmax and pick are what tensor parallelism turns into the
//! vocabulary-parallel cross-entropy.

use autopar_ir::{
    BinaryOp, DType, Graph, GraphError, Op, ReduceKind, Role, Shape, TensorId, TensorType, Value,
};

/// `−Σ weights · log_softmax(logits)[targets] / count`, the log-softmax
/// over the last dim; `targets` has the logits' shape without it, and
/// `weights` (where given) the logits' shape with it 1.
pub(super) fn cross_entropy(
    g: &mut Graph,
    logits: TensorId,
    targets: TensorId,
    weights: Option<TensorId>,
    count: usize,
) -> Result<TensorId, GraphError> {
    let lt = g.tensor(logits).ty.clone();
    let dtype = lt.dtype;
    let rank = lt.shape.rank();
    let log_probs = node(
        g,
        "log_softmax",
        Op::LogSoftmax { axis: -1 },
        vec![logits],
        lt.clone(),
    )?;
    let mut picked_dims = lt.shape.0.clone();
    picked_dims[rank - 1] = autopar_ir::Dim::Fixed(1);
    let picked_shape = Shape(picked_dims);
    // Reshape's 0 keeps the targets' own dim: `[d0, …, 1]`.
    let mut keep = vec![0; rank];
    keep[rank - 1] = 1;
    let shape_const = g.add_constant(
        "loss/index_shape",
        Value::i64(vec![rank], keep).expect("one entry per dim"),
    );
    let index = node(
        g,
        "targets",
        Op::Reshape { allowzero: false },
        vec![targets, shape_const],
        TensorType {
            dtype: DType::I64,
            shape: picked_shape.clone(),
        },
    )?;
    let picked_ty = TensorType {
        dtype,
        shape: picked_shape,
    };
    let mut picked = node(
        g,
        "picked",
        Op::GatherElements { axis: -1 },
        vec![log_probs, index],
        picked_ty.clone(),
    )?;
    if let Some(w) = weights {
        let mul = Op::Binary { func: BinaryOp::Mul };
        picked = node(g, "weighted", mul, vec![picked, w], picked_ty)?;
    }
    mean(g, picked, -(count as f64))
}

/// `Σ (output − values)² / count`.
pub(super) fn squared_error(
    g: &mut Graph,
    output: TensorId,
    values: TensorId,
    count: usize,
) -> Result<TensorId, GraphError> {
    let ty = g.tensor(output).ty.clone();
    let sub = Op::Binary { func: BinaryOp::Sub };
    let error = node(g, "error", sub, vec![output, values], ty.clone())?;
    let mul = Op::Binary { func: BinaryOp::Mul };
    let squared = node(g, "squared", mul, vec![error, error], ty)?;
    mean(g, squared, count as f64)
}

/// `Σ terms / denominator`, a scalar named `loss/mean`.
fn mean(g: &mut Graph, terms: TensorId, denominator: f64) -> Result<TensorId, GraphError> {
    let dtype = g.tensor(terms).ty.dtype;
    let scalar = TensorType {
        dtype,
        shape: Shape(vec![]),
    };
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: None,
        keepdims: false,
        noop_with_empty_axes: false,
    };
    let total = node(g, "sum", sum, vec![terms], scalar.clone())?;
    let count = g.add_constant(
        "loss/count",
        Value::f32(vec![], vec![denominator as f32]).expect("scalar"),
    );
    let count = match dtype {
        DType::F32 => count,
        _ => node(g, "count_cast", Op::cast(dtype), vec![count], scalar.clone())?,
    };
    let div = Op::Binary { func: BinaryOp::Div };
    node(g, "mean", div, vec![total, count], scalar)
}

/// Adds node `loss/{name}` and its one output, of the same name.
fn node(
    g: &mut Graph,
    name: &str,
    op: Op,
    inputs: Vec<TensorId>,
    ty: TensorType,
) -> Result<TensorId, GraphError> {
    let out = g.add_tensor(format!("loss/{name}"), ty, Role::Activation, None);
    g.add_node(
        format!("loss/{name}"),
        op,
        inputs.into_iter().map(Some).collect(),
        vec![out],
    )?;
    Ok(out)
}

//! Indexing: `Gather`, `GatherElements`, `GatherNd` (ONNX semantics,
//! negative indices count from the end) and the canonical `Embedding`
//! (a row lookup, evaluated as `Gather` on axis 0).

use super::context::{invalid, norm_axis, tensor, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::take;
use super::numeric::map_data;
use super::{Op, OpError, TensorType};
use crate::{Dim, Value};

pub(crate) mod backward;
mod grad;
mod kernel;
pub(super) mod shard;
use kernel::{eval_gather, eval_gather_elements, eval_gather_nd};

/// An index into an axis of length `n`, negative counting from the end.
fn resolve(op: &str, i: i64, n: usize) -> Result<usize, OpError> {
    let j = if i < 0 { i + n as i64 } else { i };
    usize::try_from(j)
        .ok()
        .filter(|&j| j < n)
        .ok_or_else(|| invalid(op, format!("index {i} is out of range for an axis of {n}")))
}

fn gathered(x: &Value, shape: Vec<usize>, idx: &[usize]) -> Value {
    Value {
        dtype: x.dtype,
        shape,
        data: map_data!(&x.data, d => take(d, idx)),
    }
}

fn index_values<'a>(cx: &EvalCtx<'a>, i: usize) -> Result<&'a [i64], OpError> {
    cx.input(i)?
        .as_i64()
        .ok_or_else(|| invalid(cx.op, format!("input {i} must be an integer tensor")))
}

/// `Gather(data, indices)`: `data[..axis] + indices + data[axis+1..]`.
pub(super) fn infer_gather(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let ind = cx.int(1)?;
    let a = norm_axis(cx.op, axis, data.shape.rank())?;
    let d = &data.shape.0;
    let dims = d[..a]
        .iter()
        .chain(&ind.shape.0)
        .chain(&d[a + 1..])
        .cloned()
        .collect();
    Ok(vec![tensor(data.dtype, dims)])
}

/// `GatherElements(data, indices)`: same rank, output shaped like `indices`.
pub(super) fn infer_gather_elements(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let ind = cx.int(1)?;
    if ind.shape.rank() != data.shape.rank() {
        return Err(invalid(
            cx.op,
            format!("indices {} and data {} differ in rank", ind.shape, data.shape),
        ));
    }
    norm_axis(cx.op, axis, data.shape.rank())?;
    Ok(vec![tensor(data.dtype, ind.shape.0.clone())])
}

/// `GatherNd(data, indices)` with `batch_dims`: output
/// `indices[..-1] + data[batch_dims + m..]` where `m = indices[-1]`.
pub(super) fn infer_gather_nd(cx: &InferCtx, batch_dims: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let ind = cx.int(1)?;
    let (r, q) = (data.shape.rank(), ind.shape.rank());
    let b = usize::try_from(batch_dims).map_err(|_| invalid(cx.op, "batch_dims must be non-negative"))?;
    let m = match ind.shape.0.last() {
        Some(Dim::Fixed(m)) => *m,
        Some(Dim::Sym(_)) => return Err(invalid(cx.op, "the index tuple length must be fixed")),
        None => return Err(invalid(cx.op, "indices must have rank ≥ 1")),
    };
    if b >= q || b >= r || b + m > r {
        return Err(invalid(
            cx.op,
            format!(
                "indices {} do not fit data {} with batch_dims {b}",
                ind.shape, data.shape
            ),
        ));
    }
    let dims = ind.shape.0[..q - 1]
        .iter()
        .chain(&data.shape.0[b + m..])
        .cloned()
        .collect();
    Ok(vec![tensor(data.dtype, dims)])
}

/// `Embedding(table[vocab, hidden], ids)` → `ids.shape + [hidden]`.
pub(super) fn infer_embedding(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let table = cx.rank(0, 2)?;
    let ids = cx.int(1)?;
    let mut dims = ids.shape.0.clone();
    dims.push(table[1].clone());
    Ok(vec![tensor(cx.ty(0)?.dtype, dims)])
}

/// Shape inference of the indexing ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Gather { axis } => infer_gather(cx, *axis),
        Op::GatherElements { axis } => infer_gather_elements(cx, *axis),
        Op::GatherNd { batch_dims } => infer_gather_nd(cx, *batch_dims),
        Op::Embedding => infer_embedding(cx),
        Op::GatherGrad { .. } | Op::GatherElementsGrad { .. } | Op::GatherNdGrad { .. } => {
            grad::infer(cx, op)
        }
        other => Err(not_in_family(cx.op, other, "indexing")),
    }
}

/// Forward and backward FLOPs of the indexing ops.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        // Lookups: bytes only.
        Op::Gather { .. } | Op::GatherElements { .. } | Op::GatherNd { .. } | Op::Embedding => (0.0, 0.0),
        Op::GatherGrad { .. } | Op::GatherElementsGrad { .. } | Op::GatherNdGrad { .. } => {
            grad::flops(inputs.first().copied().flatten())
        }
        other => misrouted(other, "indexing"),
    }
}

/// Reference kernels of the indexing ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Gather { axis } => eval_gather(cx, *axis),
        Op::GatherElements { axis } => eval_gather_elements(cx, *axis),
        Op::GatherNd { batch_dims } => eval_gather_nd(cx, *batch_dims),
        Op::Embedding => eval_gather(cx, 0),
        Op::GatherGrad { .. } | Op::GatherElementsGrad { .. } | Op::GatherNdGrad { .. } => grad::eval(cx, op),
        other => Err(not_in_family(cx.op, other, "indexing")),
    }
}

#[cfg(test)]
mod tests;

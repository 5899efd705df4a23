//! Generators: `Shape`, `Size`, `ConstantOfShape`, `Range`. Their outputs
//! depend on input shapes or constant values, never on input data.

use super::context::{int_values, invalid, tensor, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::{Op, OpError, ScalarValue, TensorType};
use crate::{DType, Dim, Value};

mod kernel;
pub(super) mod shard;
use kernel::{eval_constant_of_shape, eval_range, eval_shape, eval_size};

/// `start..end` of `Shape`, clamped to `0..=rank` after negative wrap-around.
fn shape_range(start: i64, end: Option<i64>, rank: usize) -> (usize, usize) {
    let r = rank as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
    (s, e.max(s))
}

/// `Shape(x)` → `i64[end - start]`.
pub(super) fn infer_shape(cx: &InferCtx, start: i64, end: Option<i64>) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let (s, e) = shape_range(start, end, cx.ty(0)?.shape.rank());
    Ok(vec![tensor(DType::I64, vec![Dim::Fixed(e - s)])])
}

/// `Size(x)` → scalar i64.
pub(super) fn infer_size(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    cx.ty(0)?;
    Ok(vec![tensor(DType::I64, vec![])])
}

/// `ConstantOfShape(shape)`: the shape must be a known 1-D integer tensor.
pub(super) fn infer_constant_of_shape(
    cx: &InferCtx,
    value: Option<ScalarValue>,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    cx.int(0)?;
    let dims = cx
        .ints(0)?
        .iter()
        .map(|&d| usize::try_from(d).map(Dim::Fixed))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| invalid(cx.op, "negative dim in the shape"))?;
    Ok(vec![tensor(value.map_or(DType::F32, |v| v.dtype), dims)])
}

/// `Range(start, limit, delta)`: one-element operands of one numeric type.
pub(super) fn infer_range(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 3)?;
    let dtype = cx.ty(0)?.dtype;
    for i in 0..3 {
        cx.same_dtype(0, i)?;
        let n = cx.ty(i)?.shape.as_fixed().map(|s| s.iter().product::<usize>());
        if n != Some(1) {
            return Err(invalid(cx.op, format!("input {i} must hold one element")));
        }
    }
    if dtype == DType::Bool {
        return Err(invalid(cx.op, "bool operands are not supported"));
    }
    let values = (0..3)
        .map(|i| {
            cx.input(i)?.value.ok_or_else(|| OpError::NotConstant {
                op: cx.op.to_string(),
                input: i,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let n = range_len(cx.op, values[0], values[1], values[2])?;
    Ok(vec![tensor(dtype, vec![Dim::Fixed(n)])])
}

fn first(op: &str, v: &Value) -> Result<f64, OpError> {
    v.to_f64_vec()
        .first()
        .copied()
        .ok_or_else(|| invalid(op, "empty operand"))
}

fn first_int(op: &str, v: &Value, i: usize) -> Result<i64, OpError> {
    int_values(op, v, i)?
        .first()
        .copied()
        .ok_or_else(|| invalid(op, "empty operand"))
}

/// Number of elements: `max(ceil((limit - start) / delta), 0)`.
fn range_len(op: &str, start: &Value, limit: &Value, delta: &Value) -> Result<usize, OpError> {
    if start.dtype.is_int() {
        let (s, l, d) = (
            first_int(op, start, 0)? as i128,
            first_int(op, limit, 1)? as i128,
            first_int(op, delta, 2)? as i128,
        );
        if d == 0 {
            return Err(invalid(op, "delta is zero"));
        }
        let span = l - s;
        let n = if (span > 0) == (d > 0) && span != 0 {
            (span + d - d.signum()) / d
        } else {
            0
        };
        return usize::try_from(n).map_err(|_| invalid(op, "range too long"));
    }
    let (s, l, d) = (first(op, start)?, first(op, limit)?, first(op, delta)?);
    let n = ((l - s) / d).ceil();
    if !n.is_finite() {
        return Err(invalid(op, "range length is not finite"));
    }
    Ok(n.max(0.0) as usize)
}

/// Shape inference of the generator ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Shape { start, end } => infer_shape(cx, *start, *end),
        Op::Size => infer_size(cx),
        Op::ConstantOfShape { value } => infer_constant_of_shape(cx, *value),
        Op::Range => infer_range(cx),
        other => Err(not_in_family(cx.op, other, "generator")),
    }
}

/// Forward and backward FLOPs of the generator ops.
pub(super) fn flops_op(op: &Op, _inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        // Metadata and fills: bytes only.
        Op::Shape { .. } | Op::Size | Op::ConstantOfShape { .. } | Op::Range => (0.0, 0.0),
        other => misrouted(other, "generator"),
    }
}

/// Reference kernels of the generator ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Shape { start, end } => eval_shape(cx, *start, *end),
        Op::Size => eval_size(cx),
        Op::ConstantOfShape { value } => eval_constant_of_shape(cx, *value),
        Op::Range => eval_range(cx),
        other => Err(not_in_family(cx.op, other, "generator")),
    }
}

#[cfg(test)]
mod tests;

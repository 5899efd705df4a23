//! Reductions: `Reduce{Sum,Mean,Max,Min,Prod}` (axes from the attribute or,
//! opset 18, the second input), `ArgMax`, `TopK`, `CumSum`. Float sums
//! accumulate in `f64`; integer ones wrap to the logical type.

use super::context::{invalid, norm_axes, norm_axis, scalar_int, tensor, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::numel;
use super::numeric::{int_cmp, int_limits};
use super::{Op, OpError, ReduceKind, TensorType};
use crate::{DType, Dim, Value};
use std::cmp::Ordering;

pub(crate) mod backward;
mod kernel;
pub(super) mod shard;
use kernel::{eval_argmax, eval_cumsum, eval_reduce, eval_topk, fold};

/// The reduced axes from the attribute or the `axes` input values, or `None`
/// when the reduction is the identity (`noop_with_empty_axes`, no axes).
fn reduce_axes(
    op: &str,
    attr: Option<&[i64]>,
    input: Option<Vec<i64>>,
    rank: usize,
    noop: bool,
) -> Result<Option<Vec<usize>>, OpError> {
    let axes = match attr {
        Some(a) => a.to_vec(),
        None => input.unwrap_or_default(),
    };
    if axes.is_empty() {
        return Ok(if noop { None } else { Some((0..rank).collect()) });
    }
    norm_axes(op, &axes, rank).map(Some)
}

fn keep_or_drop(dims: &[Dim], axes: &[usize], keepdims: bool) -> Vec<Dim> {
    dims.iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Fixed(1)),
            (true, false) => None,
        })
        .collect()
}

/// `Reduce(x, axes?)`.
pub(super) fn infer_reduce(
    cx: &InferCtx,
    kind: ReduceKind,
    attr: Option<&[i64]>,
    keepdims: bool,
    noop: bool,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool && !matches!(kind, ReduceKind::Max | ReduceKind::Min) {
        return Err(invalid(cx.op, "bool input is not supported"));
    }
    if cx.opt(1).is_some() {
        cx.int(1)?;
    }
    let input = if attr.is_none() { cx.opt_ints(1)? } else { None };
    Ok(match reduce_axes(cx.op, attr, input, x.shape.rank(), noop)? {
        None => vec![x.clone()],
        Some(axes) => vec![tensor(x.dtype, keep_or_drop(&x.shape.0, &axes, keepdims))],
    })
}

/// A float reduction's start and step, in f64 (a NaN wins max and min).
fn float_step(kind: ReduceKind) -> (f64, fn(f64, f64) -> f64) {
    match kind {
        ReduceKind::Sum | ReduceKind::Mean => (0.0, |a, v| a + v),
        ReduceKind::Prod => (1.0, |a, v| a * v),
        ReduceKind::Max => (f64::NEG_INFINITY, |a, v| if v > a || v.is_nan() { v } else { a }),
        ReduceKind::Min => (f64::INFINITY, |a, v| if v < a || v.is_nan() { v } else { a }),
    }
}

/// Folded values made the reduction's results: a mean divides by `count`.
fn float_results(kind: ReduceKind, folded: Vec<f64>, count: f64) -> Vec<f64> {
    match kind {
        ReduceKind::Mean => folded.into_iter().map(|s| s / count).collect(),
        _ => folded,
    }
}

fn float_reduce(kind: ReduceKind, x: &[f64], map: &[usize], outn: usize, count: f64) -> Vec<f64> {
    let (init, step) = float_step(kind);
    float_results(kind, fold(x, map, outn, init, step), count)
}

fn int_reduce(kind: ReduceKind, dtype: DType, x: &[i64], map: &[usize], outn: usize, count: i64) -> Vec<i64> {
    let (lo, hi) = int_limits(dtype);
    let pick = |want: Ordering| move |a: i64, v: i64| if int_cmp(dtype, v, a) == want { v } else { a };
    match kind {
        ReduceKind::Sum => fold(x, map, outn, 0, i64::wrapping_add),
        ReduceKind::Mean => fold(x, map, outn, 0, i64::wrapping_add)
            .into_iter()
            .map(|s| {
                if dtype == DType::U64 {
                    ((s as u64) / count.max(1) as u64) as i64
                } else {
                    s / count.max(1)
                }
            })
            .collect(),
        ReduceKind::Prod => fold(x, map, outn, 1, i64::wrapping_mul),
        ReduceKind::Max => fold(x, map, outn, lo, pick(Ordering::Greater)),
        ReduceKind::Min => fold(x, map, outn, hi, pick(Ordering::Less)),
    }
}

/// `ArgMax(x)` → i64 indices along `axis`.
pub(super) fn infer_argmax(cx: &InferCtx, axis: i64, keepdims: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        return Err(invalid(cx.op, "bool input is not supported"));
    }
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    Ok(vec![tensor(DType::I64, keep_or_drop(&x.shape.0, &[a], keepdims))])
}

/// `TopK(x, k)` → `(values, i64 indices)` with `k` along `axis`.
pub(super) fn infer_topk(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    let k = scalar_int(cx.op, &cx.ints(1)?, 1)?;
    let k = usize::try_from(k).map_err(|_| invalid(cx.op, format!("k = {k} is negative")))?;
    if x.shape.0[a].fixed().is_some_and(|n| k > n) {
        return Err(invalid(
            cx.op,
            format!("k = {k} exceeds axis length {}", x.shape.0[a]),
        ));
    }
    let mut dims = x.shape.0.clone();
    dims[a] = Dim::Fixed(k);
    Ok(vec![tensor(x.dtype, dims.clone()), tensor(DType::I64, dims)])
}

/// `CumSum(x, axis)`: same type and shape as `x`.
pub(super) fn infer_cumsum(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        return Err(invalid(cx.op, "bool input is not supported"));
    }
    cx.int(1)?;
    Ok(vec![x.clone()])
}

/// FLOPs of a reduction-like op: one per input element; backward the same
/// for float reductions and cumulative sums, none for index outputs.
pub(super) fn flops(x: Option<&TensorType>, differentiable: bool) -> (f64, f64) {
    let f = x.map_or(0.0, numel);
    (
        f,
        if differentiable && x.is_some_and(|t| t.dtype.is_float()) {
            f
        } else {
            0.0
        },
    )
}

/// Shape inference of the reduction ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes,
        } => infer_reduce(cx, *kind, axes.as_deref(), *keepdims, *noop_with_empty_axes),
        Op::ArgMax { axis, keepdims, .. } => infer_argmax(cx, *axis, *keepdims),
        Op::TopK { axis, .. } => infer_topk(cx, *axis),
        Op::CumSum { .. } => infer_cumsum(cx),
        other => Err(not_in_family(cx.op, other, "reduction")),
    }
}

/// Forward and backward FLOPs of the reduction ops.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    let x = inputs.first().copied().flatten();
    match op {
        Op::Reduce { .. } | Op::CumSum { .. } => flops(x, true),
        Op::ArgMax { .. } | Op::TopK { .. } => flops(x, false),
        other => misrouted(other, "reduction"),
    }
}

/// Reference kernels of the reduction ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Reduce {
            kind,
            axes,
            noop_with_empty_axes,
            ..
        } => eval_reduce(cx, *kind, axes.as_deref(), *noop_with_empty_axes),
        Op::ArgMax {
            axis,
            select_last_index,
            ..
        } => eval_argmax(cx, *axis, *select_last_index),
        Op::TopK { axis, largest, .. } => eval_topk(cx, *axis, *largest),
        Op::CumSum { exclusive, reverse } => eval_cumsum(cx, *exclusive, *reverse),
        other => Err(not_in_family(cx.op, other, "reduction")),
    }
}

#[cfg(test)]
mod tests;

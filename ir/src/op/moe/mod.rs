//! Mixture-of-experts ops: `MoeRouter` (softmax → top-k → renormalise, as in
//! Mixtral), `MoeExperts` (per-token weighted sum of expert MLPs) and the
//! integer bookkeeping of expert parallelism's dispatch (`MoeSort`,
//! `MoeSlots`). The expert products go through the `gemm` crate, one
//! gathered batch per expert.

use super::context::{invalid, tensor, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::{dim, numel};
use super::{Op, OpError, TensorType};
use crate::{DType, Dim, Value};

mod grad;
use super::adjoint::float_outputs;
pub(crate) mod backward;
mod kernel;
pub(super) mod shard;
pub(super) use kernel::top_indices;
use kernel::{eval_experts, eval_router, eval_slots, eval_sort};

/// `MoeRouter(logits[..., e])` → `(weights[..., k], indices[..., k] i64)`.
pub(super) fn infer_router(cx: &InferCtx, top_k: usize) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.float(0)?;
    let Some((experts, lead)) = x.shape.0.split_last() else {
        return Err(invalid(cx.op, "logits must have an experts dim"));
    };
    if top_k == 0 || experts.fixed().is_some_and(|e| top_k > e) {
        return Err(invalid(cx.op, format!("top_k {top_k} must be in 1..={experts}")));
    }
    let mut dims = lead.to_vec();
    dims.push(Dim::Fixed(top_k));
    Ok(vec![tensor(x.dtype, dims.clone()), tensor(DType::I64, dims)])
}

/// `MoeExperts(x[..., h], weights[..., k], indices[..., k], w_in[e,h,f],
/// w_out[e,f,h], w_gate[e,h,f]?)` → `[..., h]`.
pub(super) fn infer_experts(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(5, 6)?;
    let x = cx.float(0)?;
    for i in [1, 3, 4] {
        cx.same_dtype(0, i)?;
    }
    cx.int(2)?;
    let rank = x.shape.rank();
    if rank == 0 {
        return Err(invalid(cx.op, "input must have a hidden dim"));
    }
    let (w, ids) = (cx.rank(1, rank)?, cx.rank(2, rank)?);
    let (win, wout) = (cx.rank(3, 3)?, cx.rank(4, 3)?);
    let xd = &x.shape.0;
    let mismatch = |a: &Dim, b: &Dim| matches!((a, b), (Dim::Fixed(p), Dim::Fixed(q)) if p != q);
    let bad = (0..rank - 1).any(|i| mismatch(&xd[i], &w[i]) || mismatch(&xd[i], &ids[i]))
        || mismatch(&w[rank - 1], &ids[rank - 1])
        || mismatch(&xd[rank - 1], &win[1])
        || mismatch(&xd[rank - 1], &wout[2])
        || mismatch(&win[2], &wout[1])
        || mismatch(&win[0], &wout[0]);
    if bad {
        return Err(invalid(
            cx.op,
            "input, routing and expert weight shapes do not agree",
        ));
    }
    if cx.opt(5).is_some() {
        cx.same_dtype(0, 5)?;
        let gate = cx.rank(5, 3)?;
        if (0..3).any(|i| mismatch(&gate[i], &win[i])) {
            return Err(invalid(cx.op, "gate weights must have the shape of w_in"));
        }
    }
    Ok(vec![x.clone()])
}

/// `MoeSort(indices[..., k])` → `(order[n·k], position[n·k], counts[experts])`.
fn infer_sort(cx: &InferCtx, experts: usize, capacity: Option<usize>) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let ids = cx.int(0)?;
    if experts == 0 || ids.shape.rank() == 0 || capacity == Some(0) {
        return Err(invalid(
            cx.op,
            "needs experts, a routing dim and a capacity of at least one",
        ));
    }
    let n = ids.shape.0.iter().map(Dim::fixed).product::<Option<usize>>();
    let rows = n.map_or(Dim::Sym("assignments".into()), Dim::Fixed);
    let sorted = capacity.map_or(rows.clone(), |c| Dim::Fixed(experts * c));
    Ok(vec![
        tensor(DType::I64, vec![sorted]),
        tensor(DType::I64, vec![rows]),
        tensor(DType::I64, vec![Dim::Fixed(experts)]),
    ])
}

/// `MoeSlots(counts[parts, local])` → `[parts·rows]`.
fn infer_slots(cx: &InferCtx, rows: usize) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let counts = cx.rank(0, 2)?;
    cx.int(0)?;
    let parts = counts[0]
        .fixed()
        .ok_or_else(|| invalid(cx.op, "counts need a fixed rank dim"))?;
    Ok(vec![tensor(DType::I64, vec![Dim::Fixed(parts * rows)])])
}

/// FLOPs of the routed expert MLPs: each of `tokens·k` assignments (one
/// row in `sources` of a dispatch's padded blocks) runs two (three when
/// gated) `h×f` products; backward doubles the products.
pub(super) fn experts_flops(inputs: &[Option<&TensorType>], sources: usize) -> (f64, f64) {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(x), Some(ids), Some(win)) = (get(0), get(2), get(3)) else {
        return (0.0, 0.0);
    };
    let assignments = numel(ids) / sources.max(1) as f64;
    let (h, f) = (dim(win, 1), dim(win, 2));
    let products = if get(5).is_some() { 3.0 } else { 2.0 };
    let mm = assignments * products * 2.0 * h * f;
    let ew = assignments * f * 4.0 + numel(x) * 2.0 / sources.max(1) as f64;
    (mm + ew, 2.0 * mm + ew)
}

/// Shape inference of the mixture-of-experts ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::MoeRouter { top_k } => infer_router(cx, *top_k),
        Op::MoeExperts { .. } => infer_experts(cx),
        Op::MoeExpertsGrad { gated, .. } => grad::infer(cx, *gated),
        Op::MoeSort { experts, capacity } => infer_sort(cx, *experts, *capacity),
        Op::MoeSlots { rows } => infer_slots(cx, *rows),
        other => Err(not_in_family(cx.op, other, "mixture-of-experts")),
    }
}

/// Forward and backward FLOPs of the mixture-of-experts ops.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        // The router is a softmax over the experts (the top-k is free).
        Op::MoeRouter { .. } => {
            super::norm::flops(super::norm::NormKind::Softmax, inputs.first().copied().flatten())
        }
        Op::MoeExperts { sources, .. } => experts_flops(inputs, *sources),
        Op::MoeExpertsGrad { sources, .. } => (grad::flops(inputs, *sources), 0.0),
        // Integer bookkeeping: a counting sort, no floating-point work.
        Op::MoeSort { .. } | Op::MoeSlots { .. } => (0.0, 0.0),
        other => misrouted(other, "mixture-of-experts"),
    }
}

/// Reference kernels of the mixture-of-experts ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::MoeRouter { top_k } => eval_router(cx, *top_k),
        Op::MoeExperts { activation, .. } => eval_experts(cx, *activation),
        Op::MoeSort { experts, capacity } => eval_sort(cx, *experts, *capacity),
        Op::MoeSlots { rows } => eval_slots(cx, *rows),
        Op::MoeExpertsGrad { activation, .. } => float_outputs(
            cx,
            || grad::kernel::<f32>(cx, *activation),
            || grad::kernel::<f64>(cx, *activation),
        ),
        other => Err(not_in_family(cx.op, other, "mixture-of-experts")),
    }
}

#[cfg(test)]
mod tests;

//! `Attention` (ONNX Attention-23 for 4-D inputs) and `RotaryEmbedding`
//! (ONNX RotaryEmbedding-23).
//!
//! Attention masking follows the ONNX reference: a bool mask keeps `true`, a
//! float mask is added, a mask shorter than the key length is padded with
//! "masked", `causal` hides keys `j > i` (upper-left aligned, no cache
//! offset), and a query row whose bias masks every key outputs zeros.
//!
//! A causal `Attention` may take the positions of its queries (input 4,
//! `i64[sq]`): query `i` then sees key `j` iff `j ≤ positions[i]`. That is
//! how a context-parallel rank runs its share of the queries, which are not
//! one run of the sequence once the chunks are balanced, against every key
//! in sequence order, with the hidden keys still skipped (the flash kernel's
//! tiles) rather than masked one by one.

use super::broadcast::broadcast_shapes;
use super::context::{invalid, tensor, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::{dim, numel};
use super::{Op, OpError, TensorType};
use crate::{DType, Dim, Shape, Value};

mod grad;
use super::adjoint::float_outputs;
pub(crate) mod backward;
mod kernel;
pub(super) mod shard;
use kernel::{eval_attention, eval_rotary};

/// FLOPs per attention score for the masked softmax.
const SCORE_SOFTMAX_FLOPS: f64 = 5.0;
/// FLOPs per rotated element (two products and a sum per output).
const ROTARY_FLOPS: f64 = 3.0;

fn agree(cx: &InferCtx, what: &str, a: &Dim, b: &Dim) -> Result<(), OpError> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) if x != y => {
            Err(invalid(cx.op, format!("{what} differ ({a} vs {b})")))
        }
        (Dim::Sym(x), Dim::Sym(y)) if x != y => Err(invalid(cx.op, format!("{what} differ ({a} vs {b})"))),
        _ => Ok(()),
    }
}

/// `Attention(q[b,hq,sq,d], k[b,hk,sk,d], v[b,hk,sk,dv], mask?, positions?)`
/// → `[b,hq,sq,dv]`.
pub(super) fn infer_attention(cx: &InferCtx, causal: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 5)?;
    let q_ty = cx.float(0)?;
    cx.same_dtype(0, 1)?;
    cx.same_dtype(0, 2)?;
    let (q, k, v) = (cx.rank(0, 4)?, cx.rank(1, 4)?, cx.rank(2, 4)?);
    agree(cx, "batch sizes", &q[0], &k[0])?;
    agree(cx, "batch sizes", &q[0], &v[0])?;
    agree(cx, "key and value heads", &k[1], &v[1])?;
    agree(cx, "key and value lengths", &k[2], &v[2])?;
    agree(cx, "query and key head sizes", &q[3], &k[3])?;
    if let (Some(hq), Some(hk)) = (q[1].fixed(), k[1].fixed()) {
        if hk == 0 || hq % hk != 0 {
            return Err(invalid(
                cx.op,
                format!("{hq} query heads are not a multiple of {hk} key heads"),
            ));
        }
    }
    if let Some(m) = cx.opt(3) {
        if m.ty.dtype != DType::Bool && m.ty.dtype != q_ty.dtype {
            return Err(invalid(
                cx.op,
                format!("mask must be bool or {}, got {}", q_ty.dtype, m.ty.dtype),
            ));
        }
        let md = &m.ty.shape.0;
        let Some((m_last, m_lead)) = md.split_last().filter(|_| md.len() <= 4) else {
            return Err(invalid(
                cx.op,
                format!("mask must have rank 1 to 4, got {}", m.ty.shape),
            ));
        };
        if let (Some(ml), Some(sk)) = (m_last.fixed(), k[2].fixed()) {
            if ml > sk {
                return Err(invalid(
                    cx.op,
                    format!("mask covers {ml} keys but there are {sk}"),
                ));
            }
        }
        let lead = Shape(vec![q[0].clone(), q[1].clone(), q[2].clone()]);
        broadcast_shapes(cx.op, &[&lead, &Shape(m_lead.to_vec())])
            .and_then(|s| if s == lead { Ok(s) } else { Err(invalid(cx.op, "")) })
            .map_err(|_| {
                invalid(
                    cx.op,
                    format!("mask shape {} does not broadcast to the scores", m.ty.shape),
                )
            })?;
    }
    if cx.opt(4).is_some() {
        if !causal {
            return Err(invalid(
                cx.op,
                "query positions (input 4) need a causal attention",
            ));
        }
        cx.int(4)?;
        let p = cx.rank(4, 1)?;
        agree(cx, "query positions and queries", &p[0], &q[2])?;
    }
    Ok(vec![tensor(
        q_ty.dtype,
        vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()],
    )])
}

/// FLOPs of attention: `2·b·hq·sq·sk·(d + dv)` for QKᵀ and PV plus the
/// softmax. A causal mask does not halve the count (it is the model's
/// FLOPs, as MFU counts them): the reference kernel computes the full score
/// matrix; the cost model's kernels say what a fused kernel skips. Backward
/// doubles the products.
pub(super) fn attention_flops(inputs: &[Option<&TensorType>]) -> (f64, f64) {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (get(0), get(1), get(2)) else {
        return (0.0, 0.0);
    };
    let scores = dim(q, 0) * dim(q, 1) * dim(q, 2) * dim(k, 2);
    let mm = 2.0 * scores * (dim(q, 3) + dim(v, 3));
    let sm = SCORE_SOFTMAX_FLOPS * scores;
    (mm + sm, 2.0 * mm + sm)
}

/// Geometry of a rotary embedding: heads, head size, rotated width.
struct Rotary {
    heads: usize,
    head: usize,
    rot: usize,
}

/// `RotaryEmbedding(x, cos, sin, position_ids?)`: same type as `x`.
pub(super) fn infer_rotary(
    cx: &InferCtx,
    rotary_dim: usize,
    num_heads: usize,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 4)?;
    let x = cx.float(0)?;
    cx.same_dtype(0, 1)?;
    cx.same_dtype(0, 2)?;
    let xd = &x.shape.0;
    let head = match xd.len() {
        4 => xd[3].fixed(),
        3 if num_heads == 0 => return Err(invalid(cx.op, "3-D input needs num_heads")),
        3 => match xd[2].fixed() {
            Some(h) if h % num_heads != 0 => {
                return Err(invalid(
                    cx.op,
                    format!("hidden size {h} is not a multiple of {num_heads} heads"),
                ))
            }
            h => h.map(|h| h / num_heads),
        },
        _ => {
            return Err(invalid(
                cx.op,
                format!("input must be 3-D or 4-D, got {}", x.shape),
            ))
        }
    };
    let cache_rank = if cx.opt(3).is_some() {
        cx.int(3)?;
        cx.rank(3, 2)?;
        2
    } else {
        3
    };
    let (cos, sin) = (cx.rank(1, cache_rank)?, cx.rank(2, cache_rank)?);
    if let Some(head) = head {
        let rot = if rotary_dim == 0 { head } else { rotary_dim };
        if rot > head || rot % 2 != 0 {
            return Err(invalid(
                cx.op,
                format!("rotary dim {rot} must be even and at most the head size {head}"),
            ));
        }
        for c in [cos, sin] {
            if c[cache_rank - 1].fixed().is_some_and(|w| w != rot / 2) {
                return Err(invalid(
                    cx.op,
                    format!(
                        "cache width {} is not rotary dim / 2 = {}",
                        c[cache_rank - 1],
                        rot / 2
                    ),
                ));
            }
        }
    }
    Ok(vec![x.clone()])
}

/// FLOPs of a rotary embedding over `x`; backward is the inverse rotation.
pub(super) fn rotary_flops(x: Option<&TensorType>) -> (f64, f64) {
    let f = x.map_or(0.0, numel) * ROTARY_FLOPS;
    (f, f)
}

/// Shape inference of the attention ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Attention { causal, .. } => infer_attention(cx, *causal),
        Op::RotaryEmbedding {
            rotary_dim,
            num_heads,
            ..
        } => infer_rotary(cx, *rotary_dim, *num_heads),
        Op::AttentionGrad {
            causal, mask_grad, ..
        } => grad::infer(cx, *causal, *mask_grad),
        other => Err(not_in_family(cx.op, other, "attention")),
    }
}

/// Forward and backward FLOPs of the attention ops.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        Op::Attention { .. } => attention_flops(inputs),
        Op::RotaryEmbedding { .. } => rotary_flops(inputs.first().copied().flatten()),
        Op::AttentionGrad { .. } => (grad::flops(inputs), 0.0),
        other => misrouted(other, "attention"),
    }
}

/// Reference kernels of the attention ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Attention { scale, causal } => eval_attention(cx, *scale, *causal),
        Op::RotaryEmbedding {
            interleaved,
            rotary_dim,
            num_heads,
        } => eval_rotary(cx, *interleaved, *rotary_dim, *num_heads),
        Op::AttentionGrad {
            scale,
            causal,
            mask_grad,
        } => float_outputs(
            cx,
            || grad::kernel::<f32>(cx, *scale, *causal, *mask_grad),
            || grad::kernel::<f64>(cx, *scale, *causal, *mask_grad),
        ),
        other => Err(not_in_family(cx.op, other, "attention")),
    }
}

#[cfg(test)]
mod tests;

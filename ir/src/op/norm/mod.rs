//! Softmax and normalisation: `Softmax`, `LogSoftmax` (one axis, opset 13),
//! `LayerNorm` (ONNX LayerNormalization, output 0 only) and `RmsNorm`
//! (ONNX RMSNormalization). Statistics are computed in the storage precision
//! (`f32` for `f16`/`bf16`, matching ONNX's default `stash_type`).

use super::broadcast::broadcast_shapes;
use super::context::{invalid, norm_axis, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::numel;
use super::{Op, OpError, TensorType};
use crate::{Shape, Value};

mod grad;
mod softmax_grad;
use super::adjoint::float_outputs;
pub(crate) mod backward;
mod kernel;
pub(super) mod shard;
use kernel::{eval_norm, eval_softmax};

/// FLOPs per element: softmax (max, subtract, exp, sum, divide).
const SOFTMAX_FLOPS: f64 = 5.0;
/// FLOPs per element: layer norm (mean, centre, square, sum, scale, shift…).
const LAYER_NORM_FLOPS: f64 = 8.0;
/// FLOPs per element: RMS norm (square, sum, scale, multiply).
const RMS_NORM_FLOPS: f64 = 6.0;

/// `Softmax`/`LogSoftmax`: float input of rank ≥ 1, same type out.
pub(super) fn infer_softmax(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.float(0)?;
    norm_axis(cx.op, axis, x.shape.rank())?;
    Ok(vec![x.clone()])
}

/// `LayerNorm(x, scale, bias?)` / `RmsNorm(x, scale)`: scale and bias
/// broadcast to the normalised dims `axis..`.
pub(super) fn infer_norm(cx: &InferCtx, axis: i64, with_bias: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, if with_bias { 3 } else { 2 })?;
    let x = cx.float(0)?;
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    let normalized = Shape(x.shape.0[a..].to_vec());
    for i in 1..cx.inputs.len() {
        let Some(p) = cx.opt(i) else { continue };
        cx.same_dtype(0, i)?;
        if broadcast_shapes(cx.op, &[&normalized, &p.ty.shape])? != normalized {
            return Err(invalid(
                cx.op,
                format!(
                    "input {i} shape {} does not broadcast to {normalized}",
                    p.ty.shape
                ),
            ));
        }
    }
    Ok(vec![x.clone()])
}

/// Which normalisation is being priced.
#[derive(Clone, Copy)]
pub(super) enum NormKind {
    Softmax,
    Layer,
    Rms,
}

/// FLOPs of a softmax/normalisation over `x`; backward about the forward.
pub(super) fn flops(kind: NormKind, x: Option<&TensorType>) -> (f64, f64) {
    let per = match kind {
        NormKind::Softmax => SOFTMAX_FLOPS,
        NormKind::Layer => LAYER_NORM_FLOPS,
        NormKind::Rms => RMS_NORM_FLOPS,
    };
    let f = x.map_or(0.0, numel) * per;
    (f, f)
}

/// Shape inference of the normalisation ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => infer_softmax(cx, *axis),
        Op::LayerNorm { axis, .. } => infer_norm(cx, *axis, true),
        Op::RmsNorm { axis, .. } => infer_norm(cx, *axis, false),
        Op::NormGrad { axis, .. } => grad::infer(cx, *axis),
        Op::SoftmaxGrad { axis, .. } => softmax_grad::infer(cx, *axis),
        other => Err(not_in_family(cx.op, other, "normalisation")),
    }
}

/// Forward and backward FLOPs of the normalisation ops.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    let x = inputs.first().copied().flatten();
    match op {
        Op::Softmax { .. } | Op::LogSoftmax { .. } => flops(NormKind::Softmax, x),
        Op::LayerNorm { .. } => flops(NormKind::Layer, x),
        Op::RmsNorm { .. } => flops(NormKind::Rms, x),
        Op::NormGrad { .. } => (grad::flops(x), 0.0),
        Op::SoftmaxGrad { .. } => (softmax_grad::flops(x), 0.0),
        other => misrouted(other, "normalisation"),
    }
}

/// Reference kernels of the normalisation ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Softmax { axis } => eval_softmax(cx, *axis, false),
        Op::LogSoftmax { axis } => eval_softmax(cx, *axis, true),
        Op::LayerNorm { axis, epsilon } => eval_norm(cx, *axis, *epsilon, true),
        Op::RmsNorm { axis, epsilon } => eval_norm(cx, *axis, *epsilon, false),
        Op::NormGrad {
            axis,
            epsilon,
            centre,
        } => float_outputs(
            cx,
            || grad::kernel::<f32>(cx, *axis, *epsilon, *centre),
            || grad::kernel::<f64>(cx, *axis, *epsilon, *centre),
        ),
        Op::SoftmaxGrad { axis, log } => float_outputs(
            cx,
            || softmax_grad::kernel::<f32>(cx, *axis, *log),
            || softmax_grad::kernel::<f64>(cx, *axis, *log),
        ),
        other => Err(not_in_family(cx.op, other, "normalisation")),
    }
}

#[cfg(test)]
mod tests;

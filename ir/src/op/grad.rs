//! Adjoints of the fused ops, which backward passes emit: `AttentionGrad`
//! (of `Attention`), `MoeExpertsGrad` (of `MoeExperts`), `NormGrad` (of
//! `LayerNorm` and `RmsNorm`), `ActivationGrad` (of `Gelu` and `Silu`) and
//! `SoftmaxGrad` (of `Softmax` and `LogSoftmax`). Composing these gradients from primitive ops
//! would materialise the full score matrix or every token's expert
//! activations, or pass over the activations a dozen times; a fused adjoint
//! recomputes what it needs per head, expert or row from the forward
//! inputs, as the forward kernel does, and returns the gradients at once.
//!
//! The adjoints are not themselves differentiable (no second order), so
//! their cost has no backward part.

mod activation;
mod attention;
mod moe;
mod norm;
mod softmax;

use super::define::{misrouted, not_in_family};
use super::kernel_util::{finish, invalid, EvalCtx, InferCtx};
use super::{Op, OpError, TensorType};
use crate::{Data, Dim, Value};

/// Output types of an adjoint op.
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::AttentionGrad { mask_grad, .. } => attention::infer(cx, *mask_grad),
        Op::MoeExpertsGrad { gated, .. } => moe::infer(cx, *gated),
        Op::NormGrad { axis, .. } => norm::infer(cx, *axis),
        Op::ActivationGrad { .. } => activation::infer(cx),
        Op::SoftmaxGrad { axis, .. } => softmax::infer(cx, *axis),
        other => Err(not_in_family(cx.op, other, "adjoint")),
    }
}

/// Reference kernel of an adjoint op.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::AttentionGrad {
            scale,
            causal,
            mask_grad,
        } => float_outputs(
            cx,
            || attention::kernel::<f32>(cx, *scale, *causal, *mask_grad),
            || attention::kernel::<f64>(cx, *scale, *causal, *mask_grad),
        ),
        Op::MoeExpertsGrad { activation, .. } => float_outputs(
            cx,
            || moe::kernel::<f32>(cx, *activation),
            || moe::kernel::<f64>(cx, *activation),
        ),
        Op::NormGrad {
            axis,
            epsilon,
            centre,
        } => float_outputs(
            cx,
            || norm::kernel::<f32>(cx, *axis, *epsilon, *centre),
            || norm::kernel::<f64>(cx, *axis, *epsilon, *centre),
        ),
        Op::ActivationGrad { activation } => float_outputs(
            cx,
            || activation::kernel::<f32>(cx, *activation),
            || activation::kernel::<f64>(cx, *activation),
        ),
        Op::SoftmaxGrad { axis, log } => float_outputs(
            cx,
            || softmax::kernel::<f32>(cx, *axis, *log),
            || softmax::kernel::<f64>(cx, *axis, *log),
        ),
        other => Err(not_in_family(cx.op, other, "adjoint")),
    }
}

/// FLOPs of an adjoint op (its forward; it has no backward).
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        Op::AttentionGrad { .. } => (attention::flops(inputs), 0.0),
        Op::MoeExpertsGrad { .. } => (moe::flops(inputs), 0.0),
        Op::NormGrad { .. } => (norm::flops(inputs.first().copied().flatten()), 0.0),
        Op::ActivationGrad { .. } => (activation::flops(inputs.first().copied().flatten()), 0.0),
        Op::SoftmaxGrad { .. } => (softmax::flops(inputs.first().copied().flatten()), 0.0),
        other => misrouted(other, "adjoint"),
    }
}

/// Checks that input `i` (an output gradient) has the type `want` of the
/// forward output it is the gradient of.
fn check_grad_like(cx: &InferCtx, i: usize, want: &TensorType) -> Result<(), OpError> {
    let got = cx.float(i)?;
    let differ = |a: &Dim, b: &Dim| matches!((a, b), (Dim::Fixed(p), Dim::Fixed(q)) if p != q);
    if got.dtype != want.dtype
        || got.shape.rank() != want.shape.rank()
        || got.shape.0.iter().zip(&want.shape.0).any(|(a, b)| differ(a, b))
    {
        return Err(invalid(
            cx.op,
            format!(
                "output gradient (input {i}) is {}{} but the forward output is {}{}",
                got.dtype, got.shape, want.dtype, want.shape
            ),
        ));
    }
    Ok(())
}

/// Runs a multi-output kernel at the storage class of input 0 and wraps its
/// outputs with the inferred output types.
fn float_outputs(
    cx: &EvalCtx,
    f32_kernel: impl FnOnce() -> Result<Vec<Vec<f32>>, OpError>,
    f64_kernel: impl FnOnce() -> Result<Vec<Vec<f64>>, OpError>,
) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data: Vec<Data> = match &x.data {
        Data::F32(_) => f32_kernel()?.into_iter().map(Data::F32).collect(),
        Data::F64(_) => f64_kernel()?.into_iter().map(Data::F64).collect(),
        _ => {
            return Err(invalid(
                cx.op,
                format!("expects a floating-point input, got {}", x.dtype),
            ))
        }
    };
    data.into_iter()
        .enumerate()
        .map(|(i, d)| Ok(finish(cx.out_dtype(i), cx.out_shape(i)?, d)))
        .collect()
}

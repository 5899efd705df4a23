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
//! their cost has no backward part. Each lives in its forward op's family
//! folder (`<family>/grad.rs`); this module holds what they share.

use super::context::{finish, invalid, EvalCtx, InferCtx};
use super::{OpError, TensorType};
use crate::{Data, Dim, Value};

/// Checks that input `i` (an output gradient) has the type `want` of the
/// forward output it is the gradient of.
pub(super) fn check_grad_like(cx: &InferCtx, i: usize, want: &TensorType) -> Result<(), OpError> {
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
pub(super) fn float_outputs(
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

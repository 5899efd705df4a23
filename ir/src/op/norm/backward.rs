//! Backward rules: softmax and normalisation, through fused adjoints.
//!
//! - `Softmax`/`LogSoftmax`: `SoftmaxGrad` from the forward output `y`:
//!   `dx = y · (g − Σ g·y)` or `dx = g − exp(y) · Σ g` (sums over the axis).
//! - `LayerNorm`/`RmsNorm`: the fused adjoint `NormGrad` recomputes the
//!   statistics and gives `dx` and `g · x̂`; `dscale = Σ g · x̂` and
//!   `dbias = Σ g` over the dims they broadcast along.
//!
//! Like the forward kernels, `f16`/`bf16` inputs are computed in `f32` (the
//! stash type) and the gradients rounded back.

use crate::autodiff::{AutodiffError, Ctx};
use crate::{Node, Op, TensorId};

/// Input gradients of a softmax or normalisation op.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let Some((mut out, g)) = Ctx::seed(node, grads) else {
        return Ok(Ctx::no_grads(node));
    };
    let want = |i: usize| wants.get(i).copied().unwrap_or(false);
    match node.op {
        Op::Softmax { axis } if want(0) => out[0] = Some(softmax_grad(ctx, node, g, axis, false)?),
        Op::LogSoftmax { axis } if want(0) => out[0] = Some(softmax_grad(ctx, node, g, axis, true)?),
        Op::Softmax { .. } | Op::LogSoftmax { .. } => {}
        Op::LayerNorm { axis, epsilon } | Op::RmsNorm { axis, epsilon } => {
            let centre = matches!(node.op, Op::LayerNorm { .. });
            let op = Op::NormGrad {
                axis,
                epsilon,
                centre,
            };
            out = norm_grads(ctx, node, g, op, wants)?;
        }
        ref other => return Err(ctx.unsupported(&format!("(second order through {})", other.name()))),
    }
    Ok(out)
}

/// `Softmax` (`log = false`) or `LogSoftmax` gradient along `axis`.
fn softmax_grad(
    ctx: &mut Ctx,
    node: &Node,
    g: TensorId,
    axis: i64,
    log: bool,
) -> Result<TensorId, AutodiffError> {
    let y = Ctx::output(node)?;
    ctx.emit1(Op::SoftmaxGrad { axis, log }, &[y, g])
}

/// `LayerNorm` or `RmsNorm` gradients for `(x, scale, bias?)` through the
/// adjoint `NormGrad` op `adjoint`.
fn norm_grads(
    ctx: &mut Ctx,
    node: &Node,
    g: TensorId,
    adjoint: Op,
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let mut out = Ctx::no_grads(node);
    let x = Ctx::input(node, 0)?;
    let scale = Ctx::input(node, 1)?;
    let want = |i: usize| wants.get(i).copied().unwrap_or(false);
    if let Some(bias) = node.inputs.get(2).copied().flatten().filter(|_| want(2)) {
        let stash = ctx.ty(x).dtype.stash_type();
        let gs = ctx.cast_to(g, stash)?;
        out[2] = Some(param_grad(ctx, gs, bias)?);
    }
    if !want(0) && !want(1) {
        return Ok(out);
    }
    let grads = ctx.emit(adjoint, &[Some(x), Some(scale), Some(g)])?;
    if want(0) {
        out[0] = Some(grads[0]);
    }
    if want(1) {
        out[1] = Some(param_grad(ctx, grads[1], scale)?);
    }
    Ok(out)
}

/// `t` (shaped like `x`, in the stash type) summed down to the shape of
/// the broadcast parameter `param` and cast to its type.
fn param_grad(ctx: &mut Ctx, t: TensorId, param: TensorId) -> Result<TensorId, AutodiffError> {
    let target = ctx.ty(param).clone();
    let summed = ctx.sum_to(t, &target)?;
    ctx.cast_to(summed, target.dtype)
}

#[cfg(test)]
mod tests {
    use crate::autodiff::testing::{check_op, random};
    use crate::Op;

    const TOL: f64 = 1e-6;

    #[test]
    fn softmax_and_log_softmax_over_any_axis() {
        let x = random(&[2, 3, 4], 1);
        for axis in [-1, 0, 1] {
            check_op(&Op::Softmax { axis }, &[Some(x.clone())], TOL);
            check_op(&Op::LogSoftmax { axis }, &[Some(x.clone())], TOL);
        }
    }

    #[test]
    fn layer_norm_over_the_last_dim_with_and_without_bias() {
        let op = Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        };
        let (x, scale, bias) = (random(&[2, 3, 4], 2), random(&[4], 3), random(&[4], 4));
        check_op(&op, &[Some(x.clone()), Some(scale.clone()), Some(bias)], TOL);
        check_op(&op, &[Some(x), Some(scale)], TOL);
    }

    #[test]
    fn layer_norm_over_the_last_two_dims_with_broadcast_parameters() {
        let op = Op::LayerNorm {
            axis: 1,
            epsilon: 1e-3,
        };
        let x = random(&[2, 3, 4], 5);
        check_op(
            &op,
            &[
                Some(x.clone()),
                Some(random(&[3, 4], 6)),
                Some(random(&[3, 4], 7)),
            ],
            TOL,
        );
        // Scale along the last dim only, a one-element bias.
        check_op(&op, &[Some(x), Some(random(&[4], 8)), Some(random(&[1], 9))], TOL);
    }

    #[test]
    fn rms_norm_over_one_and_two_dims() {
        let x = random(&[2, 3, 4], 10);
        for (axis, scale) in [(-1, vec![4]), (-2, vec![3, 4]), (1, vec![4])] {
            let op = Op::RmsNorm { axis, epsilon: 1e-6 };
            check_op(&op, &[Some(x.clone()), Some(random(&scale, 11))], TOL);
        }
    }
}

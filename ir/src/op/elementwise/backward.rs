//! Backward rules: elementwise ops. Each input's gradient is the output
//! gradient times the local derivative, summed back to the input's shape
//! (numpy broadcasting). Derivatives are built from the forward node's
//! inputs and output with ordinary elementwise ops, except `Gelu` and
//! `Silu`, whose adjoint is the fused `ActivationGrad`.
//!
//! Kinks take PyTorch's choices: `Abs` uses `sign(x)` (zero at zero), `Relu`
//! passes the gradient where `x > 0`, `Max`/`Min` split it evenly among tied
//! inputs, `Clip` passes it to `x` where `min ≤ x ≤ max`. Piecewise-constant
//! ops (`Floor`, `Ceil`, `Sign`), comparisons and logic give no gradient.

mod binary;

use crate::autodiff::{AutodiffError, Ctx};
use crate::{Activation, BinaryOp, GeluApprox, Node, Op, ReduceKind, TensorId, UnaryOp};
use binary::binary_grads;
use std::f64::consts::PI;

/// Input gradients of an elementwise op.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let Some((mut out, g)) = Ctx::seed(node, grads) else {
        return Ok(Ctx::no_grads(node));
    };
    match &node.op {
        Op::Binary { func } => return binary_grads(ctx, node, *func, g, wants),
        Op::Where => return where_grads(ctx, node, g, wants),
        Op::Clip => return clip_grads(ctx, node, g, wants),
        Op::ActivationGrad { .. } => return Err(ctx.unsupported("(second order through ActivationGrad)")),
        _ => {}
    }
    let x = Ctx::input(node, 0)?;
    let y = Ctx::output(node)?;
    out[0] = match &node.op {
        Op::Unary { func } => unary_grad(ctx, *func, x, y, g)?,
        Op::Cast { .. } => cast_grad(ctx, x, g)?,
        Op::Silu => Some(activation_grad(ctx, Activation::Silu, x, g)?),
        Op::Gelu { approximate } => {
            let activation = match approximate {
                GeluApprox::None => Activation::Gelu,
                GeluApprox::Tanh => Activation::GeluTanh,
            };
            Some(activation_grad(ctx, activation, x, g)?)
        }
        other => return Err(ctx.unsupported(&format!("(not an elementwise op: {})", other.name()))),
    };
    Ok(out)
}

/// `func(x)`.
pub(super) fn unary(ctx: &mut Ctx, func: UnaryOp, x: TensorId) -> Result<TensorId, AutodiffError> {
    ctx.emit1(Op::Unary { func }, &[x])
}

/// A scalar constant of `t`'s dtype.
pub(super) fn scalar_like(ctx: &mut Ctx, t: TensorId, v: f64) -> TensorId {
    let dtype = ctx.ty(t).dtype;
    ctx.scalar(dtype, v)
}

/// `x · v` for a scalar `v`.
pub(super) fn scale(ctx: &mut Ctx, x: TensorId, v: f64) -> Result<TensorId, AutodiffError> {
    let s = scalar_like(ctx, x, v);
    ctx.binary(BinaryOp::Mul, x, s)
}

/// `g · local`: the chain rule for a pointwise derivative.
fn chain(ctx: &mut Ctx, g: TensorId, local: TensorId) -> Result<TensorId, AutodiffError> {
    ctx.binary(BinaryOp::Mul, g, local)
}

/// Gradient of `Unary { func }` at `x` with output `y`; `None` for
/// piecewise-constant functions.
fn unary_grad(
    ctx: &mut Ctx,
    func: UnaryOp,
    x: TensorId,
    y: TensorId,
    g: TensorId,
) -> Result<Option<TensorId>, AutodiffError> {
    use UnaryOp::*;
    if !ctx.ty(x).dtype.is_float() {
        return Ok(None);
    }
    let grad = match func {
        Identity => g,
        Neg => unary(ctx, Neg, g)?,
        Abs => {
            let s = unary(ctx, Sign, x)?;
            chain(ctx, g, s)?
        }
        // d√x = 1 / (2√x).
        Sqrt => {
            let half = scale(ctx, g, 0.5)?;
            ctx.binary(BinaryOp::Div, half, y)?
        }
        // d(1/x) = −1/x² = −y².
        Reciprocal => {
            let y2 = ctx.binary(BinaryOp::Mul, y, y)?;
            let gy2 = chain(ctx, g, y2)?;
            unary(ctx, Neg, gy2)?
        }
        Exp => chain(ctx, g, y)?,
        Log => ctx.binary(BinaryOp::Div, g, x)?,
        // d tanh = 1 − y².
        Tanh => {
            let y2 = ctx.binary(BinaryOp::Mul, y, y)?;
            let one = scalar_like(ctx, y, 1.0);
            let d = ctx.binary(BinaryOp::Sub, one, y2)?;
            chain(ctx, g, d)?
        }
        // d erf = 2/√π · exp(−x²).
        Erf => {
            let d = gaussian(ctx, x, 1.0, 2.0 / PI.sqrt())?;
            chain(ctx, g, d)?
        }
        // dσ = y · (1 − y).
        Sigmoid => {
            let one = scalar_like(ctx, y, 1.0);
            let rest = ctx.binary(BinaryOp::Sub, one, y)?;
            let d = ctx.binary(BinaryOp::Mul, y, rest)?;
            chain(ctx, g, d)?
        }
        Sin => {
            let c = unary(ctx, Cos, x)?;
            chain(ctx, g, c)?
        }
        Cos => {
            let s = unary(ctx, Sin, x)?;
            let gs = chain(ctx, g, s)?;
            unary(ctx, Neg, gs)?
        }
        Relu => {
            let zero = scalar_like(ctx, x, 0.0);
            let pos = ctx.binary(BinaryOp::Greater, x, zero)?;
            ctx.emit1(Op::Where, &[pos, g, zero])?
        }
        Floor | Ceil | Sign | Not => return Ok(None),
    };
    Ok(Some(grad))
}

/// `c · exp(−k · x²)`: the Gaussian factor of the erf and GELU derivatives.
fn gaussian(ctx: &mut Ctx, x: TensorId, k: f64, c: f64) -> Result<TensorId, AutodiffError> {
    let x2 = ctx.binary(BinaryOp::Mul, x, x)?;
    let arg = scale(ctx, x2, -k)?;
    let e = unary(ctx, UnaryOp::Exp, arg)?;
    scale(ctx, e, c)
}

/// `Where(c, x, y)`: the gradient goes to `x` where `c`, to `y` elsewhere.
fn where_grads(
    ctx: &mut Ctx,
    node: &Node,
    g: TensorId,
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let c = Ctx::input(node, 0)?;
    let zero = scalar_like(ctx, g, 0.0);
    let mut out = Ctx::no_grads(node);
    for (slot, picked) in [(1, true), (2, false)] {
        let x = Ctx::input(node, slot)?;
        if !wants.get(slot).copied().unwrap_or(false) || !ctx.ty(x).dtype.is_float() {
            continue;
        }
        let (a, b) = if picked { (g, zero) } else { (zero, g) };
        let masked = ctx.emit1(Op::Where, &[c, a, b])?;
        let target = ctx.ty(x).clone();
        out[slot] = Some(ctx.sum_to(masked, &target)?);
    }
    Ok(out)
}

/// `Cast`: the gradient cast back to the input's float type; none for
/// integer or bool inputs.
fn cast_grad(ctx: &mut Ctx, x: TensorId, g: TensorId) -> Result<Option<TensorId>, AutodiffError> {
    let dtype = ctx.ty(x).dtype;
    if !dtype.is_float() {
        return Ok(None);
    }
    ctx.cast_to(g, dtype).map(Some)
}

/// `Clip(x, min?, max?)`: the output is `x` where `min ≤ x ≤ max`, else
/// `min` where `x < min ≤ max`, else `max` (the forward clamps to `min`
/// first, then to `max`). Each gets the gradient where it is the output;
/// the bounds' gradients are summed to their one element.
fn clip_grads(
    ctx: &mut Ctx,
    node: &Node,
    g: TensorId,
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let x = Ctx::input(node, 0)?;
    let lo = node.inputs.get(1).copied().flatten();
    let hi = node.inputs.get(2).copied().flatten();
    let mut out = Ctx::no_grads(node);
    if !ctx.ty(x).dtype.is_float() {
        return Ok(out);
    }
    let above_lo = lo
        .map(|l| ctx.binary(BinaryOp::GreaterOrEqual, x, l))
        .transpose()?;
    let below_hi = hi.map(|h| ctx.binary(BinaryOp::LessOrEqual, x, h)).transpose()?;
    let in_range = match (above_lo, below_hi) {
        (Some(a), Some(b)) => Some(ctx.binary(BinaryOp::And, a, b)?),
        (a, b) => a.or(b),
    };
    let Some(in_range) = in_range else {
        out[0] = Some(g);
        return Ok(out);
    };
    let zero = scalar_like(ctx, g, 0.0);
    let masked = |ctx: &mut Ctx, mask: TensorId| ctx.emit1(Op::Where, &[mask, g, zero]);
    if wants.first().copied().unwrap_or(false) {
        out[0] = Some(masked(ctx, in_range)?);
    }
    // x < min, and min is the result there unless min > max.
    let at_lo = match (lo, above_lo) {
        (Some(l), Some(above)) => {
            let below = unary(ctx, UnaryOp::Not, above)?;
            Some(match hi {
                Some(h) => {
                    let ordered = ctx.binary(BinaryOp::LessOrEqual, l, h)?;
                    ctx.binary(BinaryOp::And, below, ordered)?
                }
                None => below,
            })
        }
        _ => None,
    };
    if let (Some(l), Some(at_lo)) = (lo, at_lo) {
        if wants.get(1).copied().unwrap_or(false) {
            let m = masked(ctx, at_lo)?;
            out[1] = Some(sum_to_bound(ctx, m, l)?);
        }
    }
    if let Some(h) = hi.filter(|_| wants.get(2).copied().unwrap_or(false)) {
        let taken = match at_lo {
            Some(at_lo) => ctx.binary(BinaryOp::Or, in_range, at_lo)?,
            None => in_range,
        };
        let at_hi = unary(ctx, UnaryOp::Not, taken)?;
        let m = masked(ctx, at_hi)?;
        out[2] = Some(sum_to_bound(ctx, m, h)?);
    }
    Ok(out)
}

/// `g` summed over every element and shaped like the one-element `bound`.
fn sum_to_bound(ctx: &mut Ctx, g: TensorId, bound: TensorId) -> Result<TensorId, AutodiffError> {
    let total = ctx.emit1(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: None,
            keepdims: false,
            noop_with_empty_axes: false,
        },
        &[g],
    )?;
    let shape = ctx.ty(bound).shape.clone();
    ctx.reshape_like(total, &shape)
}

/// `g · act'(x)` through the fused adjoint.
fn activation_grad(
    ctx: &mut Ctx,
    activation: Activation,
    x: TensorId,
    g: TensorId,
) -> Result<TensorId, AutodiffError> {
    ctx.emit1(Op::ActivationGrad { activation }, &[x, g])
}

#[cfg(test)]
mod tests {
    use crate::autodiff::differentiate;
    use crate::autodiff::testing::{check_op, random};
    use crate::{DType, GeluApprox, Graph, Op, Role, Shape, TensorType, UnaryOp, Value};
    use std::sync::Arc;

    const TOL: f64 = 1e-6;

    pub(super) fn f64s(shape: &[usize], data: &[f64]) -> Value {
        Value::f64(shape.to_vec(), data.to_vec()).unwrap()
    }

    /// Random values in [0.5, 1.5): inside every function's domain.
    pub(super) fn positive(shape: &[usize], seed: u64) -> Value {
        let v = random(shape, seed);
        f64s(
            shape,
            &v.to_f64_vec().iter().map(|x| x.abs() + 0.5).collect::<Vec<_>>(),
        )
    }

    #[test]
    fn unary_functions() {
        use UnaryOp::*;
        for func in [Neg, Abs, Tanh, Erf, Sigmoid, Sin, Cos, Relu, Identity, Exp] {
            check_op(&Op::Unary { func }, &[Some(random(&[2, 3], 1))], TOL);
        }
        for func in [Sqrt, Reciprocal, Log] {
            check_op(&Op::Unary { func }, &[Some(positive(&[2, 3], 2))], TOL);
        }
    }

    #[test]
    fn piecewise_constant_functions_give_no_gradient() {
        for func in [UnaryOp::Floor, UnaryOp::Ceil, UnaryOp::Sign] {
            let mut g = Graph::new("floor");
            let ty = TensorType {
                dtype: DType::F64,
                shape: Shape::fixed(&[3]),
            };
            let x = g.add_tensor("x", ty.clone(), Role::Parameter, Some(Arc::new(random(&[3], 3))));
            let y = g.add_tensor("y", ty, Role::Activation, None);
            g.add_node("op", Op::Unary { func }, vec![Some(x)], vec![y])
                .unwrap();
            g.outputs = vec![y];
            assert!(differentiate(&g).unwrap().gradients.is_empty(), "{func:?}");
        }
    }

    #[test]
    fn where_routes_by_the_condition() {
        let cond = Value::new(DType::Bool, vec![2, 1], crate::Data::Bool(vec![true, false])).unwrap();
        let (x, y) = (random(&[2, 3], 10), random(&[3], 11));
        check_op(&Op::Where, &[Some(cond.clone()), Some(x.clone()), Some(y)], TOL);
        check_op(&Op::Where, &[Some(cond), Some(x), Some(f64s(&[], &[0.25]))], TOL);
    }

    #[test]
    fn cast_between_float_types() {
        // An f64 run widens the f32 input, so the cast is exact.
        let x = Value::f32(vec![4], vec![0.5, -1.25, 2.0, 0.125]).unwrap();
        check_op(&Op::cast(DType::F64), &[Some(x)], TOL);
    }

    #[test]
    fn clip_with_both_bounds_one_bound_and_crossed_bounds() {
        let x = f64s(&[2, 4], &[-0.9, -0.5, -0.1, 0.0, 0.2, 0.45, 0.7, 1.1]);
        let (lo, hi) = (f64s(&[], &[-0.3]), f64s(&[1], &[0.5]));
        check_op(
            &Op::Clip,
            &[Some(x.clone()), Some(lo.clone()), Some(hi.clone())],
            TOL,
        );
        check_op(&Op::Clip, &[Some(x.clone()), Some(lo.clone()), None], TOL);
        check_op(&Op::Clip, &[Some(x.clone()), None, Some(hi.clone())], TOL);
        check_op(&Op::Clip, &[Some(x.clone()), Some(hi), Some(lo)], TOL);
        check_op(&Op::Clip, &[Some(x)], TOL);
    }

    #[test]
    fn silu_and_both_gelus() {
        let x = f64s(&[2, 4], &[-3.0, -1.2, -0.4, 0.1, 0.6, 1.3, 2.5, 4.0]);
        check_op(&Op::Silu, &[Some(x.clone())], TOL);
        for approximate in [GeluApprox::None, GeluApprox::Tanh] {
            check_op(&Op::Gelu { approximate }, &[Some(x.clone())], TOL);
        }
    }
}

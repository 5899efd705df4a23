//! Backward rules of `Binary`: arithmetic (variadic `Add`/`Mul`), `Div`,
//! `Pow` (both operands), `Mod`/`Fmod`, and `Max`/`Min` (variadic, ties
//! split evenly).
//! Comparisons and logic give no gradient. Local gradients have the
//! broadcast output's shape and are summed back to each input's.

use super::{chain, scalar_like, unary};
use crate::autodiff::{AutodiffError, Ctx};
use crate::{BinaryOp, DType, Data, Node, Op, TensorId, UnaryOp, Value};

/// Gradients of `Binary { func }` (variadic for Add, Mul, Max, Min).
pub(super) fn binary_grads(
    ctx: &mut Ctx,
    node: &Node,
    func: BinaryOp,
    g: TensorId,
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let xs = (0..node.inputs.len())
        .map(|i| Ctx::input(node, i))
        .collect::<Result<Vec<_>, _>>()?;
    let y = Ctx::output(node)?;
    let want = |i: usize| wants.get(i).copied().unwrap_or(false) && ctx.ty(xs[i]).dtype.is_float();
    let wanted: Vec<bool> = (0..xs.len()).map(want).collect();
    let mut local: Vec<Option<TensorId>> = vec![None; xs.len()];
    match func {
        BinaryOp::Add => local.iter_mut().for_each(|l| *l = Some(g)),
        BinaryOp::Sub => {
            local[0] = Some(g);
            if wanted[1] {
                local[1] = Some(unary(ctx, UnaryOp::Neg, g)?);
            }
        }
        BinaryOp::Mul => {
            for i in (0..xs.len()).filter(|&i| wanted[i]) {
                let mut acc = g;
                for (j, &x) in xs.iter().enumerate() {
                    if j != i {
                        acc = ctx.binary(BinaryOp::Mul, acc, x)?;
                    }
                }
                local[i] = Some(acc);
            }
        }
        // a / b: ∂a = g / b, ∂b = −g·a/b² = −(g/b)·y.
        BinaryOp::Div => {
            let ga = ctx.binary(BinaryOp::Div, g, xs[1])?;
            local[0] = Some(ga);
            if wanted[1] {
                let gay = ctx.binary(BinaryOp::Mul, ga, y)?;
                local[1] = Some(unary(ctx, UnaryOp::Neg, gay)?);
            }
        }
        BinaryOp::Pow => {
            let (a, b) = (xs[0], xs[1]);
            if wanted[0] {
                // An exponent that gets no gradient is fixed: fold its value.
                let fixed = if wanted[1] { None } else { ctx.value(b).cloned() };
                local[0] = Some(pow_base_grad(ctx, a, b, fixed, g)?);
            }
            if wanted[1] {
                local[1] = Some(pow_exponent_grad(ctx, a, b, y, g)?);
            }
        }
        // r = a − b·q with q = ⌊a/b⌋ (Mod) or trunc(a/b) (Fmod), piecewise
        // constant: ∂a = g, ∂b = −g·q, where q = (a − r)/b is recomputed
        // from the inputs (the op's saved tensors, as for Div).
        BinaryOp::Mod | BinaryOp::Fmod => {
            local[0] = Some(g);
            if wanted[1] {
                let r = ctx.binary(func, xs[0], xs[1])?;
                let whole = ctx.binary(BinaryOp::Sub, xs[0], r)?;
                let q = ctx.binary(BinaryOp::Div, whole, xs[1])?;
                let gq = ctx.binary(BinaryOp::Mul, g, q)?;
                local[1] = Some(unary(ctx, UnaryOp::Neg, gq)?);
            }
        }
        BinaryOp::Max | BinaryOp::Min => extremum_grads(ctx, &xs, y, g, &wanted, &mut local)?,
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::Equal
        | BinaryOp::Less
        | BinaryOp::LessOrEqual
        | BinaryOp::Greater
        | BinaryOp::GreaterOrEqual => {}
    }
    let mut out = vec![None; xs.len()];
    for (i, l) in local.into_iter().enumerate() {
        if let (Some(l), true) = (l, wanted[i]) {
            let target = ctx.ty(xs[i]).clone();
            let l = ctx.cast_to(l, target.dtype)?;
            out[i] = Some(ctx.sum_to(l, &target)?);
        }
    }
    Ok(out)
}

/// A constant of float `dtype` and `shape` holding `data`.
fn float_constant(
    ctx: &mut Ctx,
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<f64>,
) -> Result<TensorId, AutodiffError> {
    let data = match dtype {
        DType::F64 => Data::F64(data),
        _ => Data::F32(data.into_iter().map(|v| v as f32).collect()),
    };
    let value = Value::new(dtype, shape, data).map_err(|e| ctx.unsupported(&format!("(constant: {e})")))?;
    Ok(ctx.constant(value))
}

/// `∂(aᵇ)/∂a = b · aᵇ⁻¹`, zero where `b = 0` (PyTorch's convention, which
/// also avoids `0 · 0⁻¹`). A `fixed` exponent value is folded into constants.
fn pow_base_grad(
    ctx: &mut Ctx,
    a: TensorId,
    b: TensorId,
    fixed: Option<Value>,
    g: TensorId,
) -> Result<TensorId, AutodiffError> {
    let dtype = ctx.ty(a).dtype;
    let (e, e_minus_1, has_zero) = match fixed {
        Some(v) => {
            let data = v.to_f64_vec();
            let has_zero = data.contains(&0.0);
            let minus: Vec<f64> = data.iter().map(|x| x - 1.0).collect();
            let e = float_constant(ctx, dtype, v.shape.clone(), data)?;
            let m = float_constant(ctx, dtype, v.shape, minus)?;
            (e, m, has_zero)
        }
        None => {
            let e = ctx.cast_to(b, dtype)?;
            let one = ctx.scalar(dtype, 1.0);
            let m = ctx.binary(BinaryOp::Sub, e, one)?;
            (e, m, true)
        }
    };
    let p = ctx.binary(BinaryOp::Pow, a, e_minus_1)?;
    let mut d = ctx.binary(BinaryOp::Mul, e, p)?;
    if has_zero {
        let zero = ctx.scalar(dtype, 0.0);
        let is_zero = ctx.binary(BinaryOp::Equal, e, zero)?;
        d = ctx.emit1(Op::Where, &[is_zero, zero, d])?;
    }
    chain(ctx, g, d)
}

/// `∂(aᵇ)/∂b = aᵇ · ln a`, zero where `a = 0` and `b ≥ 0` (PyTorch's
/// convention: the limit there, instead of `0 · −∞`).
fn pow_exponent_grad(
    ctx: &mut Ctx,
    a: TensorId,
    b: TensorId,
    y: TensorId,
    g: TensorId,
) -> Result<TensorId, AutodiffError> {
    let ln = unary(ctx, UnaryOp::Log, a)?;
    let d = ctx.binary(BinaryOp::Mul, y, ln)?;
    let zero_a = scalar_like(ctx, a, 0.0);
    let zero_b = scalar_like(ctx, b, 0.0);
    let a0 = ctx.binary(BinaryOp::Equal, a, zero_a)?;
    let b_nonneg = ctx.binary(BinaryOp::GreaterOrEqual, b, zero_b)?;
    let limit = ctx.binary(BinaryOp::And, a0, b_nonneg)?;
    let d = ctx.emit1(Op::Where, &[limit, zero_a, d])?;
    chain(ctx, g, d)
}

/// `Max`/`Min` of several inputs: the gradient goes to the inputs equal to
/// the result, split evenly among ties.
fn extremum_grads(
    ctx: &mut Ctx,
    xs: &[TensorId],
    y: TensorId,
    g: TensorId,
    wanted: &[bool],
    local: &mut [Option<TensorId>],
) -> Result<(), AutodiffError> {
    if xs.len() == 1 {
        local[0] = Some(g);
        return Ok(());
    }
    let dtype = ctx.ty(g).dtype;
    let mut masks = Vec::with_capacity(xs.len());
    for &x in xs {
        let eq = ctx.binary(BinaryOp::Equal, x, y)?;
        masks.push(ctx.cast_to(eq, dtype)?);
    }
    let mut count = masks[0];
    for &m in &masks[1..] {
        count = ctx.binary(BinaryOp::Add, count, m)?;
    }
    let share = ctx.binary(BinaryOp::Div, g, count)?;
    for (i, &m) in masks.iter().enumerate().filter(|&(i, _)| wanted[i]) {
        local[i] = Some(ctx.binary(BinaryOp::Mul, share, m)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{f64s, positive};
    use crate::autodiff::testing::{check_op, random};
    use crate::{BinaryOp, Op, Value};

    const TOL: f64 = 1e-6;

    #[test]
    fn arithmetic_with_broadcasting() {
        let shapes: [(&[usize], &[usize]); 4] = [
            (&[2, 3], &[2, 3]),
            (&[2, 3], &[3]),
            (&[2, 1], &[1, 3]),
            (&[], &[2, 3]),
        ];
        for func in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Max,
            BinaryOp::Min,
        ] {
            for (i, (a, b)) in shapes.iter().enumerate() {
                let seed = 10 * i as u64;
                check_op(
                    &Op::Binary { func },
                    &[Some(random(a, seed)), Some(positive(b, seed + 1))],
                    TOL,
                );
            }
        }
    }

    #[test]
    fn remainders_of_both_operands() {
        // Quotients away from whole numbers, where the remainder jumps.
        let a = f64s(&[6], &[2.3, -1.7, 5.1, -4.4, 0.9, 3.3]);
        let b = f64s(&[6], &[0.7, 1.1, -1.3, 0.6, -0.8, 2.0]);
        for func in [BinaryOp::Mod, BinaryOp::Fmod] {
            check_op(&Op::Binary { func }, &[Some(a.clone()), Some(b.clone())], TOL);
        }
    }

    #[test]
    fn variadic_sum_product_and_max() {
        let xs = [random(&[2, 3], 4), random(&[3], 5), random(&[2, 1], 6)];
        for func in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min] {
            check_op(&Op::Binary { func }, &xs.clone().map(Some), TOL);
            check_op(&Op::Binary { func }, &[Some(xs[0].clone())], TOL);
        }
    }

    #[test]
    fn max_and_min_split_ties_evenly() {
        // Central differences at a two-way tie see half the gradient each.
        let a = f64s(&[3], &[0.5, 0.2, -0.1]);
        let b = f64s(&[3], &[0.5, 0.1, -0.1]);
        for func in [BinaryOp::Max, BinaryOp::Min] {
            check_op(&Op::Binary { func }, &[Some(a.clone()), Some(b.clone())], TOL);
        }
    }

    #[test]
    fn pow_of_both_operands_and_of_a_constant_exponent() {
        let op = Op::Binary { func: BinaryOp::Pow };
        check_op(&op, &[Some(positive(&[2, 3], 7)), Some(random(&[3], 8))], TOL);
        check_op(
            &op,
            &[
                Some(random(&[2, 3], 9)),
                Some(Value::i64(vec![], vec![3]).unwrap()),
            ],
            TOL,
        );
        check_op(
            &op,
            &[
                Some(random(&[2, 3], 9)),
                Some(Value::i64(vec![3], vec![2, 0, 1]).unwrap()),
            ],
            TOL,
        );
    }
}

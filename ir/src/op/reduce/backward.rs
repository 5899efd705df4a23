//! Backward rules: reductions. `Sum` and `Mean` broadcast the output
//! gradient back over the reduced axes (`Mean` divides it by the count);
//! `Max`/`Min` send it to the positions equal to the result, split evenly
//! among ties (as PyTorch's `amax`/`amin` do); `CumSum`'s gradient is the
//! cumulative sum of the output gradient in the opposite direction. `Prod`
//! is not supported (its gradient needs care at zeros).

use crate::autodiff::{AutodiffError, Ctx};
use crate::{BinaryOp, Node, Op, ReduceKind, TensorId};

/// Input gradients of a reduction.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let Some((mut out, g)) = Ctx::seed(node, grads) else {
        return Ok(Ctx::no_grads(node));
    };
    let x = Ctx::input(node, 0)?;
    if !wants.first().copied().unwrap_or(false) || !ctx.ty(x).dtype.is_float() {
        return Ok(out);
    }
    out[0] = Some(match &node.op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes,
        } => match reduced_axes(ctx, node, axes.as_deref(), *noop_with_empty_axes)? {
            Some(axes) => reduce_grad(ctx, node, *kind, &axes, *keepdims, g)?,
            None => g,
        },
        Op::CumSum { exclusive, reverse } => {
            let axis = Ctx::input(node, 1)?;
            let op = Op::CumSum {
                exclusive: *exclusive,
                reverse: !*reverse,
            };
            ctx.emit1(op, &[g, axis])?
        }
        other => return Err(ctx.unsupported(&format!("(not a reduction: {})", other.name()))),
    });
    Ok(out)
}

/// `kind` of `x` over `axes`, as a new node.
pub(super) fn reduce(
    ctx: &mut Ctx,
    kind: ReduceKind,
    x: TensorId,
    axes: &[i64],
    keepdims: bool,
) -> Result<TensorId, AutodiffError> {
    let op = Op::Reduce {
        kind,
        axes: Some(axes.to_vec()),
        keepdims,
        noop_with_empty_axes: false,
    };
    ctx.emit1(op, &[x])
}

/// The reduced axes of a `Reduce` node, normalised to `0..rank` and sorted,
/// from the attribute or the constant `axes` input; `None` when the node is
/// the identity (no axes and `noop_with_empty_axes`).
fn reduced_axes(
    ctx: &Ctx,
    node: &Node,
    attr: Option<&[i64]>,
    noop: bool,
) -> Result<Option<Vec<usize>>, AutodiffError> {
    let rank = ctx.ty(Ctx::input(node, 0)?).shape.rank();
    let axes: Vec<i64> = match (attr, node.inputs.get(1).copied().flatten()) {
        (Some(a), _) => a.to_vec(),
        (None, None) => vec![],
        (None, Some(t)) => match ctx.value(t).and_then(|v| v.as_i64()) {
            Some(a) => a.to_vec(),
            None => return Err(ctx.unsupported("with axes that are not an integer constant")),
        },
    };
    if axes.is_empty() {
        return Ok(if noop { None } else { Some((0..rank).collect()) });
    }
    let mut out = Vec::with_capacity(axes.len());
    for a in axes {
        let n = if a < 0 { a + rank as i64 } else { a };
        if !(0..rank as i64).contains(&n) {
            return Err(ctx.unsupported(&format!("with axis {a} out of range for rank {rank}")));
        }
        out.push(n as usize);
    }
    out.sort_unstable();
    out.dedup();
    Ok(Some(out))
}

/// The gradient of `Reduce{kind}` over `axes` (normalised) of the node's
/// input, from its output gradient `g`.
fn reduce_grad(
    ctx: &mut Ctx,
    node: &Node,
    kind: ReduceKind,
    axes: &[usize],
    keepdims: bool,
    g: TensorId,
) -> Result<TensorId, AutodiffError> {
    let x = Ctx::input(node, 0)?;
    let x_ty = ctx.ty(x).clone();
    let Some(dims) = x_ty.shape.as_fixed() else {
        return Err(ctx.unsupported("on symbolic shapes"));
    };
    // The output with the reduced dims kept as ones, so it broadcasts to x.
    let kept: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let kept_shape = crate::Shape::fixed(&kept);
    let unreduce = |ctx: &mut Ctx, t: TensorId| {
        if keepdims {
            Ok(t)
        } else {
            ctx.reshape_like(t, &kept_shape)
        }
    };
    let gk = unreduce(ctx, g)?;
    let expand = |ctx: &mut Ctx, t: TensorId| {
        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let shape = ctx.ints(&shape);
        ctx.emit1(Op::Expand, &[t, shape])
    };
    match kind {
        ReduceKind::Sum => expand(ctx, gk),
        ReduceKind::Mean => {
            let count: usize = axes.iter().map(|&a| dims[a]).product();
            let c = ctx.scalar(ctx.ty(g).dtype, count as f64);
            let share = ctx.binary(BinaryOp::Div, gk, c)?;
            expand(ctx, share)
        }
        ReduceKind::Max | ReduceKind::Min => {
            let yk = unreduce(ctx, Ctx::output(node)?)?;
            let eq = ctx.binary(BinaryOp::Equal, x, yk)?;
            let mask = ctx.cast_to(eq, x_ty.dtype)?;
            let axes: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
            let ties = reduce(ctx, ReduceKind::Sum, mask, &axes, true)?;
            let share = ctx.binary(BinaryOp::Div, gk, ties)?;
            ctx.binary(BinaryOp::Mul, mask, share)
        }
        ReduceKind::Prod => Err(ctx.unsupported("(ReduceProd has no backward rule yet)")),
    }
}

#[cfg(test)]
mod tests {
    use crate::autodiff::testing::{check_op, random};
    use crate::{Op, ReduceKind, Value};

    const TOL: f64 = 1e-6;

    fn op(kind: ReduceKind, axes: Option<Vec<i64>>, keepdims: bool) -> Op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes: false,
        }
    }

    #[test]
    fn sum_and_mean_over_attribute_axes() {
        let x = random(&[2, 3, 4], 1);
        for kind in [ReduceKind::Sum, ReduceKind::Mean] {
            for keepdims in [true, false] {
                for axes in [vec![1], vec![-1], vec![0, 2], vec![-3, 1]] {
                    check_op(&op(kind, Some(axes), keepdims), &[Some(x.clone())], TOL);
                }
            }
        }
    }

    #[test]
    fn axes_from_the_input_and_all_axes() {
        let x = random(&[3, 4], 2);
        let axes = Value::i64(vec![1], vec![-2]).unwrap();
        for keepdims in [true, false] {
            check_op(
                &op(ReduceKind::Mean, None, keepdims),
                &[Some(x.clone()), Some(axes.clone())],
                TOL,
            );
            // No axes: every axis is reduced.
            check_op(&op(ReduceKind::Sum, None, keepdims), &[Some(x.clone())], TOL);
        }
    }

    #[test]
    fn empty_axes_with_noop_is_the_identity() {
        let noop = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: None,
            keepdims: false,
            noop_with_empty_axes: true,
        };
        check_op(&noop, &[Some(random(&[2, 3], 3))], TOL);
    }

    #[test]
    fn max_and_min_route_to_the_extremum_splitting_ties() {
        // Row 0 has a two-way tie for the max (central differences see half
        // the gradient on each), row 1 one for the min.
        let x = Value::f64(vec![2, 3], vec![0.5, -0.2, 0.5, -0.7, 0.3, -0.7]).unwrap();
        for kind in [ReduceKind::Max, ReduceKind::Min] {
            for keepdims in [true, false] {
                check_op(&op(kind, Some(vec![-1]), keepdims), &[Some(x.clone())], TOL);
            }
            check_op(
                &op(kind, Some(vec![0, 2]), false),
                &[Some(random(&[2, 3, 4], 4))],
                TOL,
            );
        }
    }

    #[test]
    fn cumsum_in_every_direction() {
        let x = random(&[2, 5], 5);
        let axis = Value::i64(vec![], vec![-1]).unwrap();
        for exclusive in [false, true] {
            for reverse in [false, true] {
                let op = Op::CumSum { exclusive, reverse };
                check_op(&op, &[Some(x.clone()), Some(axis.clone())], TOL);
            }
        }
        let axis0 = Value::i64(vec![1], vec![0]).unwrap();
        check_op(
            &Op::CumSum {
                exclusive: false,
                reverse: false,
            },
            &[Some(x), Some(axis0)],
            TOL,
        );
    }
}

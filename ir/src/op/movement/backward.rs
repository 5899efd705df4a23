//! Backward rules: movement ops. Each moves the gradient back the way the
//! forward moved the data: views reshape it back, `Transpose` applies the
//! inverse permutation, `Expand` sums over the broadcast dims, `Concat` and
//! `Split` swap roles, `Slice` pads the gradient with zeros to the input's
//! extent and `Trilu` masks it with the same triangle.

use crate::autodiff::{AutodiffError, Ctx};
use crate::{Node, Op, ScalarValue, TensorId, TensorType, Value};

/// Input gradients of a movement op.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let mut out = Ctx::no_grads(node);
    if let Op::Split { axis, .. } = node.op {
        out[0] = Some(split(ctx, node, grads, axis)?);
        return Ok(out);
    }
    let Some(g) = grads.first().copied().flatten() else {
        return Ok(out);
    };
    if let Op::Concat { axis } = node.op {
        return concat(ctx, node, g, axis, wants);
    }
    let x = Ctx::input(node, 0)?;
    let x_ty = ctx.ty(x).clone();
    out[0] = Some(match &node.op {
        Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } => {
            ctx.reshape_like(g, &x_ty.shape)?
        }
        Op::Transpose { perm } => {
            let perm = perm.as_ref().map(|p| inverse(ctx, p)).transpose()?;
            ctx.emit1(Op::Transpose { perm }, &[g])?
        }
        Op::Expand => ctx.sum_to(g, &x_ty)?,
        Op::Trilu { upper } => {
            let k = node.inputs.get(1).copied().flatten();
            ctx.emit(Op::Trilu { upper: *upper }, &[Some(g), k])?[0]
        }
        Op::Slice => slice(ctx, node, g, &x_ty)?,
        other => return Err(ctx.unsupported(&format!("(not a movement op: {})", other.name()))),
    });
    Ok(out)
}

/// The permutation undoing `perm`.
fn inverse(ctx: &Ctx, perm: &[usize]) -> Result<Vec<usize>, AutodiffError> {
    let mut inv = vec![usize::MAX; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        match inv.get_mut(p) {
            Some(slot) if *slot == usize::MAX => *slot = i,
            _ => return Err(ctx.unsupported(&format!("with invalid permutation {perm:?}"))),
        }
    }
    Ok(inv)
}

/// Fixed dims of `ty` (all fixed after `differentiate` binds symbols).
fn fixed(ctx: &Ctx, ty: &TensorType) -> Result<Vec<usize>, AutodiffError> {
    ty.shape
        .as_fixed()
        .ok_or_else(|| ctx.unsupported(&format!("on symbolic shape {}", ty.shape)))
}

/// `axis` in `0..rank`.
fn norm_axis(ctx: &Ctx, axis: i64, rank: usize) -> Result<usize, AutodiffError> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| ctx.unsupported(&format!("with axis {axis} out of range for rank {rank}")))
}

/// A shape constant.
fn dims_const(ctx: &mut Ctx, dims: &[usize]) -> TensorId {
    ctx.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>())
}

/// A zero tensor of `dtype[dims]`.
fn zeros(ctx: &mut Ctx, dtype: crate::DType, dims: &[usize]) -> Result<TensorId, AutodiffError> {
    let shape = dims_const(ctx, dims);
    let value = Some(ScalarValue { dtype, value: 0.0 });
    ctx.emit1(Op::ConstantOfShape { value }, &[shape])
}

/// `Concat`: the gradient split back into the inputs' extents.
fn concat(
    ctx: &mut Ctx,
    node: &Node,
    g: TensorId,
    axis: i64,
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    if node.inputs.len() == 1 {
        return Ok(vec![Some(g)]);
    }
    let rank = ctx.ty(g).shape.rank();
    let a = norm_axis(ctx, axis, rank)?;
    let mut sizes = Vec::with_capacity(node.inputs.len());
    for i in 0..node.inputs.len() {
        let t = Ctx::input(node, i)?;
        let ty = ctx.ty(t).clone();
        sizes.push(fixed(ctx, &ty)?[a] as i64);
    }
    let op = Op::Split {
        axis,
        split: Some(sizes),
        outputs: node.inputs.len(),
    };
    let pieces = ctx.emit(op, &[Some(g)])?;
    Ok(pieces
        .into_iter()
        .zip(wants)
        .map(|(p, &w)| w.then_some(p))
        .collect())
}

/// `Split`: the outputs' gradients concatenated, zeros standing in for
/// outputs that have none.
fn split(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    axis: i64,
) -> Result<TensorId, AutodiffError> {
    let mut parts = Vec::with_capacity(node.outputs.len());
    for (&out, g) in node.outputs.iter().zip(grads) {
        parts.push(match g {
            Some(g) => *g,
            None => {
                let ty = ctx.ty(out).clone();
                let dims = fixed(ctx, &ty)?;
                zeros(ctx, ty.dtype, &dims)?
            }
        });
    }
    match parts.as_slice() {
        [one] => Ok(*one),
        _ => ctx.emit1(Op::Concat { axis }, &parts),
    }
}

/// The integers of constant input `i` (`None` when absent).
fn const_ints(ctx: &Ctx, node: &Node, i: usize) -> Result<Option<Vec<i64>>, AutodiffError> {
    let Some(t) = node.inputs.get(i).copied().flatten() else {
        return Ok(None);
    };
    ctx.value(t)
        .and_then(Value::as_i64)
        .map(|v| Some(v.to_vec()))
        .ok_or_else(|| ctx.unsupported(&format!("with non-constant input {i}")))
}

/// `Slice`: zeros of the input's shape with the gradient where the slice
/// read. Axis by axis, a unit step pads the gradient with zero blocks
/// (`Concat`); other steps scatter it to the positions read (`GatherGrad`).
fn slice(ctx: &mut Ctx, node: &Node, g: TensorId, x: &TensorType) -> Result<TensorId, AutodiffError> {
    let dims = fixed(ctx, x)?;
    let (Some(starts), Some(ends)) = (const_ints(ctx, node, 1)?, const_ints(ctx, node, 2)?) else {
        return Err(ctx.unsupported("without starts and ends"));
    };
    let n = starts.len();
    let axes = const_ints(ctx, node, 3)?.unwrap_or_else(|| (0..n as i64).collect());
    let steps = const_ints(ctx, node, 4)?.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err(ctx.unsupported("with starts, ends, axes and steps of different lengths"));
    }
    let mut out = g;
    for i in 0..n {
        let axis = norm_axis(ctx, axes[i], dims.len())?;
        let read = positions(ctx, node, dims[axis], starts[i], ends[i], steps[i])?;
        out = unslice_axis(ctx, out, axis, dims[axis], &read, steps[i])?;
    }
    Ok(out)
}

/// The positions `starts..ends` by `step` reads from an axis of `len`,
/// by running the forward `Slice` kernel on `0..len` (so clamping and
/// negative starts/ends are exactly the forward's).
fn positions(
    ctx: &Ctx,
    node: &Node,
    len: usize,
    start: i64,
    end: i64,
    step: i64,
) -> Result<Vec<i64>, AutodiffError> {
    let one = |v: i64| Value::i64(vec![1], vec![v]);
    let values = [
        Value::i64(vec![len], (0..len as i64).collect()),
        one(start),
        one(end),
        one(0),
        one(step),
    ];
    let values: Vec<Value> = values
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| ctx.unsupported(&format!("({e})")))?;
    let inputs: Vec<Option<&Value>> = values.iter().map(Some).collect();
    let out = Op::Slice.eval(&inputs).map_err(|source| AutodiffError::Op {
        node: node.name.clone(),
        source,
    })?;
    Ok(out
        .first()
        .and_then(Value::as_i64)
        .map(<[i64]>::to_vec)
        .unwrap_or_default())
}

/// `g`, whose `axis` holds the elements at `read` of an axis of `len`,
/// spread back to that axis with zeros elsewhere.
fn unslice_axis(
    ctx: &mut Ctx,
    g: TensorId,
    axis: usize,
    len: usize,
    read: &[i64],
    step: i64,
) -> Result<TensorId, AutodiffError> {
    let ty = ctx.ty(g).clone();
    let mut dims = fixed(ctx, &ty)?;
    if step != 1 && read.len() > 1 {
        dims[axis] = len;
        let idx = ctx.constant(
            Value::i64(vec![read.len()], read.to_vec()).map_err(|e| ctx.unsupported(&format!("({e})")))?,
        );
        let shape = dims_const(ctx, &dims);
        return ctx.emit1(Op::GatherGrad { axis: axis as i64 }, &[g, idx, shape]);
    }
    let before = read.first().map_or(len, |&p| p as usize);
    let after = len
        .checked_sub(before + read.len())
        .ok_or_else(|| ctx.unsupported(&format!("reading {read:?} from an axis of {len}")))?;
    let mut parts = Vec::with_capacity(3);
    for (size, piece) in [(before, None), (read.len(), Some(g)), (after, None)] {
        if size == 0 {
            continue;
        }
        parts.push(match piece {
            Some(g) => g,
            None => {
                dims[axis] = size;
                zeros(ctx, ty.dtype, &dims)?
            }
        });
    }
    match parts.as_slice() {
        [] => Ok(g),
        [one] => Ok(*one),
        _ => ctx.emit1(Op::Concat { axis: axis as i64 }, &parts),
    }
}

#[cfg(test)]
mod tests {
    use crate::autodiff::testing::{check_op, random, run};
    use crate::autodiff::{differentiate, gradients_by_name};
    use crate::{Graph, Op, Role, Shape, TensorType, Value};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn ints(v: &[i64]) -> Option<Value> {
        Some(Value::i64(vec![v.len()], v.to_vec()).unwrap())
    }

    #[test]
    fn views_reshape_back() {
        let x = random(&[2, 3, 2], 1);
        let reshape = Op::Reshape { allowzero: false };
        check_op(&reshape, &[Some(x.clone()), ints(&[-1, 4])], 1e-6);
        check_op(&Op::Flatten { axis: 1 }, &[Some(x.clone())], 1e-6);
        let y = random(&[2, 1, 3], 2);
        check_op(&Op::Squeeze { axes: None }, &[Some(y.clone()), ints(&[-2])], 1e-6);
        check_op(
            &Op::Unsqueeze {
                axes: Some(vec![0, -1]),
            },
            &[Some(y)],
            1e-6,
        );
    }

    #[test]
    fn transpose_inverts_the_permutation() {
        let x = random(&[2, 3, 4], 3);
        check_op(
            &Op::Transpose {
                perm: Some(vec![2, 0, 1]),
            },
            &[Some(x.clone())],
            1e-6,
        );
        check_op(&Op::Transpose { perm: None }, &[Some(x)], 1e-6);
    }

    #[test]
    fn expand_sums_over_broadcast_dims() {
        check_op(&Op::Expand, &[Some(random(&[3, 1], 4)), ints(&[2, 3, 4])], 1e-6);
        check_op(
            &Op::Expand,
            &[Some(random(&[2, 1, 3], 5)), ints(&[1, 4, 1])],
            1e-6,
        );
    }

    #[test]
    fn concat_and_split_of_unequal_sizes() {
        let parts = [random(&[2, 1], 6), random(&[2, 3], 7), random(&[2, 2], 8)];
        check_op(&Op::Concat { axis: -1 }, &parts.clone().map(Some), 1e-6);
        check_op(&Op::Concat { axis: 1 }, &[Some(parts[1].clone())], 1e-6);
        let x = random(&[2, 6], 9);
        let given = Op::Split {
            axis: 1,
            split: Some(vec![1, 3, 2]),
            outputs: 3,
        };
        check_op(&given, &[Some(x.clone())], 1e-6);
        let by_input = Op::Split {
            axis: -2,
            split: None,
            outputs: 2,
        };
        check_op(&by_input, &[Some(x.clone()), ints(&[0, 2])], 1e-6);
        let equal = Op::Split {
            axis: 1,
            split: None,
            outputs: 4,
        };
        check_op(&equal, &[Some(x)], 1e-6);
    }

    #[test]
    fn split_outputs_without_gradient_count_as_zeros() {
        // y0, y1 = Split(x); only y1 is an output: x.grad = [0, C].
        let mut g = Graph::new("split");
        let ty = |d: &[usize]| TensorType {
            dtype: crate::DType::F64,
            shape: Shape::fixed(d),
        };
        let x = Value::f64(vec![3], vec![1.0, 2.0, 3.0]).unwrap();
        let x = g.add_tensor("x", ty(&[3]), Role::Parameter, Some(Arc::new(x)));
        let y0 = g.add_tensor("y0", ty(&[1]), Role::Activation, None);
        let y1 = g.add_tensor("y1", ty(&[2]), Role::Activation, None);
        let op = Op::Split {
            axis: 0,
            split: Some(vec![1, 2]),
            outputs: 2,
        };
        g.add_node("split", op, vec![Some(x)], vec![y0, y1]).unwrap();
        g.outputs = vec![y1];
        let d = differentiate(&g).unwrap();
        let feeds = BTreeMap::from([(
            d.cotangents[0].1.clone(),
            Value::f64(vec![2], vec![5.0, 7.0]).unwrap(),
        )]);
        let outs = run(&d.graph, &feeds);
        let grads = gradients_by_name(&d, &outs);
        assert_eq!(grads["x"].to_f64_vec(), vec![0.0, 5.0, 7.0]);
    }

    fn slice_inputs(
        x: &Value,
        starts: &[i64],
        ends: &[i64],
        axes: &[i64],
        steps: Option<&[i64]>,
    ) -> Vec<Option<Value>> {
        let mut v = vec![Some(x.clone()), ints(starts), ints(ends), ints(axes)];
        v.extend(steps.map(ints));
        v
    }

    #[test]
    fn slices_with_negative_bounds_axes_and_steps() {
        let x = random(&[4, 5, 3], 10);
        for (starts, ends, axes, steps) in [
            (&[-3, 1][..], &[-1, 100][..], &[-2, 0][..], None),
            (&[0][..], &[i64::MAX][..], &[1][..], None),
            (&[1, 0][..], &[5, 2][..], &[1, 2][..], Some(&[2, 1][..])),
            (&[-1][..], &[i64::MIN][..], &[0][..], Some(&[-1][..])),
            (&[4, -1][..], &[0, -4][..], &[1, 0][..], Some(&[-3, -2][..])),
            (&[2][..], &[3][..], &[-1][..], Some(&[5][..])),
        ] {
            check_op(&Op::Slice, &slice_inputs(&x, starts, ends, axes, steps), 1e-6);
        }
    }

    #[test]
    fn empty_slice_gives_zero_gradient() {
        // The loss does not depend on x at all here; differentiate still
        // builds a (zero) gradient through the empty slice.
        let x = random(&[2, 3], 11);
        check_op(&Op::Slice, &slice_inputs(&x, &[2], &[1], &[1], None), 1e-6);
    }

    #[test]
    fn trilu_masks_the_gradient() {
        let x = random(&[2, 3, 4], 12);
        check_op(&Op::Trilu { upper: true }, &[Some(x.clone())], 1e-6);
        let k = Some(Value::i64(vec![], vec![-1]).unwrap());
        check_op(&Op::Trilu { upper: false }, &[Some(x), k], 1e-6);
    }
}

//! Backward rules: indexing ops. A gather's data gradient is its adjoint
//! scatter-add ([`Op::gather_adjoint`]: `GatherGrad`, `GatherElementsGrad`,
//! `GatherNdGrad`), which accumulates repeated indices; `TopK`'s values are
//! a `GatherElements` of its input at its indices output. The scatter-adds'
//! own gradient is their forward gather. Indices get no gradient.

use crate::autodiff::{AutodiffError, Ctx};
use crate::{Node, Op, TensorId};

/// Input gradients of an indexing op.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let mut out = Ctx::no_grads(node);
    let (Some(g), Some(true)) = (grads.first().copied().flatten(), wants.first().copied()) else {
        return Ok(out);
    };
    let (Some(data), Some(indices)) = (input(node, 0), input(node, 1)) else {
        return Err(ctx.unsupported("without its data and indices inputs"));
    };
    out[0] = Some(if let Op::TopK { axis, .. } = node.op {
        let picked = node.outputs.get(1).copied();
        let picked = picked.ok_or_else(|| ctx.unsupported("without its indices output"))?;
        scatter(ctx, Op::GatherElementsGrad { axis }, g, picked, data)?
    } else if let Some(adjoint) = node.op.gather_adjoint() {
        scatter(ctx, adjoint, g, indices, data)?
    } else if let Some(gather) = node.op.forward_gather() {
        ctx.emit1(gather, &[g, indices])?
    } else {
        return Err(ctx.unsupported("(not an indexing op)"));
    });
    Ok(out)
}

/// Input `i` of `node`, when present.
fn input(node: &Node, i: usize) -> Option<TensorId> {
    node.inputs.get(i).copied().flatten()
}

/// `adjoint(g, indices, shape(data))`: `g` added into zeros shaped like `data`.
fn scatter(
    ctx: &mut Ctx,
    adjoint: Op,
    g: TensorId,
    indices: TensorId,
    data: TensorId,
) -> Result<TensorId, AutodiffError> {
    let shape = &ctx.ty(data).shape;
    let dims = shape
        .as_fixed()
        .ok_or_else(|| ctx.unsupported(&format!("on symbolic shape {shape}")))?;
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let shape = ctx.ints(&dims);
    ctx.emit1(adjoint, &[g, indices, shape])
}

#[cfg(test)]
mod tests {
    use crate::autodiff::testing::{check_op, random};
    use crate::{Op, Value};

    fn ids(shape: &[usize], v: &[i64]) -> Option<Value> {
        Some(Value::i64(shape.to_vec(), v.to_vec()).unwrap())
    }

    #[test]
    fn gather_along_each_axis_with_repeated_and_negative_indices() {
        let x = random(&[3, 4, 2], 1);
        check_op(
            &Op::Gather { axis: 0 },
            &[Some(x.clone()), ids(&[2, 2], &[2, -1, 0, 2])],
            1e-6,
        );
        check_op(
            &Op::Gather { axis: 1 },
            &[Some(x.clone()), ids(&[3], &[-4, 3, 0])],
            1e-6,
        );
        check_op(
            &Op::Gather { axis: -1 },
            &[Some(x.clone()), ids(&[], &[-1])],
            1e-6,
        );
        check_op(&Op::Gather { axis: 2 }, &[Some(x), ids(&[2, 1], &[1, 1])], 1e-6);
    }

    #[test]
    fn embedding_with_repeated_ids() {
        let table = random(&[5, 3], 2);
        check_op(
            &Op::Embedding,
            &[Some(table), ids(&[2, 3], &[4, 1, 4, 0, 4, 1])],
            1e-6,
        );
    }

    #[test]
    fn gather_elements_along_each_axis() {
        let x = random(&[3, 4], 3);
        check_op(
            &Op::GatherElements { axis: 0 },
            &[Some(x.clone()), ids(&[2, 4], &[0, -1, 2, 2, 0, 1, -3, 2])],
            1e-6,
        );
        check_op(
            &Op::GatherElements { axis: -1 },
            &[Some(x), ids(&[3, 3], &[3, 3, 0, -1, 1, 2, 0, 0, 0])],
            1e-6,
        );
    }

    #[test]
    fn gather_nd_with_batch_dims_0_and_1() {
        let x = random(&[2, 3, 2], 4);
        check_op(
            &Op::GatherNd { batch_dims: 0 },
            &[Some(x.clone()), ids(&[3, 2], &[1, 2, -1, 2, 0, 0])],
            1e-6,
        );
        check_op(
            &Op::GatherNd { batch_dims: 0 },
            &[Some(x.clone()), ids(&[2, 1], &[1, 1])],
            1e-6,
        );
        check_op(
            &Op::GatherNd { batch_dims: 1 },
            &[Some(x), ids(&[2, 2, 1], &[2, 2, 0, -1])],
            1e-6,
        );
    }

    #[test]
    fn topk_largest_and_smallest_along_an_axis() {
        let x = random(&[3, 5], 5);
        for (axis, largest, k) in [(-1, true, 3), (1, false, 2), (0, true, 2), (0, false, 1)] {
            let op = Op::TopK {
                axis,
                largest,
                sorted: true,
            };
            check_op(&op, &[Some(x.clone()), ids(&[1], &[k])], 1e-6);
        }
    }

    #[test]
    fn scatter_adds_differentiate_to_their_gathers() {
        let shape = |d: &[i64]| ids(&[d.len()], d);
        check_op(
            &Op::GatherGrad { axis: 1 },
            &[Some(random(&[2, 3], 6)), ids(&[3], &[0, -1, 0]), shape(&[2, 4])],
            1e-6,
        );
        check_op(
            &Op::GatherElementsGrad { axis: 0 },
            &[
                Some(random(&[2, 2], 7)),
                ids(&[2, 2], &[1, 0, 1, 1]),
                shape(&[3, 2]),
            ],
            1e-6,
        );
        check_op(
            &Op::GatherNdGrad { batch_dims: 1 },
            &[Some(random(&[2, 2], 8)), ids(&[2, 1], &[1, 0]), shape(&[2, 3, 2])],
            1e-6,
        );
    }
}

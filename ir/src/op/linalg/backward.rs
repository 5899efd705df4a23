//! Backward rules: matrix products. With `Y = A·B`, `dA = dY·Bᵀ` and
//! `dB = Aᵀ·dY`; `MatMul` promotes 1-D operands to matrices first and sums
//! the gradients over broadcast batch dims, `Gemm` folds `alpha` and the
//! transposes into `Gemm`s, and `Linear` flattens its leading dims so the
//! weight gradient is one product.

use crate::autodiff::{AutodiffError, Ctx};
use crate::{BinaryOp, Node, Op, TensorId};

/// Input gradients of a matrix product.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let Some(dy) = grads.first().copied().flatten() else {
        return Ok(Ctx::no_grads(node));
    };
    match node.op {
        Op::MatMul => matmul(ctx, node, dy, wants),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => gemm(ctx, node, dy, wants, alpha, beta, (trans_a, trans_b)),
        Op::Linear => linear(ctx, node, dy, wants),
        ref other => Err(ctx.unsupported(&format!("(not a matrix product: {})", other.name()))),
    }
}

/// `x` reshaped to `dims`.
fn reshape(ctx: &mut Ctx, x: TensorId, dims: &[usize]) -> Result<TensorId, AutodiffError> {
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let shape = ctx.ints(&dims);
    ctx.emit1(Op::Reshape { allowzero: false }, &[x, shape])
}

/// `x` with its last two dims swapped.
fn transpose_last(ctx: &mut Ctx, x: TensorId) -> Result<TensorId, AutodiffError> {
    let rank = ctx.ty(x).shape.rank();
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 2, rank - 1);
    ctx.emit1(Op::Transpose { perm: Some(perm) }, &[x])
}

/// `alpha · op(a) · op(b)` of 2-D operands.
fn gemm2(
    ctx: &mut Ctx,
    alpha: f64,
    a: TensorId,
    trans_a: bool,
    b: TensorId,
    trans_b: bool,
) -> Result<TensorId, AutodiffError> {
    let op = Op::Gemm {
        alpha,
        beta: 0.0,
        trans_a,
        trans_b,
    };
    ctx.emit1(op, &[a, b])
}

fn mul(ctx: &mut Ctx, a: TensorId, b: TensorId) -> Result<TensorId, AutodiffError> {
    ctx.emit1(Op::Binary { func: BinaryOp::Mul }, &[a, b])
}

/// `MatMul(a, b)`: 1-D operands are promoted (`[k]` → `[1, k]` for `a`,
/// `[k, 1]` for `b`) and `dy` reshaped to match; batch dims that were
/// broadcast are summed away with `sum_to`. Against a 2-D `b` (a weight),
/// both gradients are one product each over the flattened rows.
fn matmul(
    ctx: &mut Ctx,
    node: &Node,
    dy: TensorId,
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let (a, b) = (Ctx::input(node, 0)?, Ctx::input(node, 1)?);
    let (a_dims, b_dims, y_dims) = (ctx.dims(a)?, ctx.dims(b)?, ctx.dims(dy)?);
    if a_dims.len() == 1 && b_dims.len() == 1 {
        // A dot product: dy is a scalar.
        let da = Ctx::wanted(wants, 0).then(|| mul(ctx, dy, b)).transpose()?;
        let db = Ctx::wanted(wants, 1).then(|| mul(ctx, dy, a)).transpose()?;
        return Ok(vec![da, db]);
    }
    let mut dy2 = y_dims.clone();
    let a2 = if a_dims.len() == 1 {
        dy2.insert(dy2.len() - 1, 1);
        reshape(ctx, a, &[1, a_dims[0]])?
    } else {
        a
    };
    let b2 = if b_dims.len() == 1 {
        dy2.push(1);
        reshape(ctx, b, &[b_dims[0], 1])?
    } else {
        b
    };
    let dy2 = if dy2 == y_dims {
        dy
    } else {
        reshape(ctx, dy, &dy2)?
    };
    let (a2_dims, b2_dims) = (ctx.dims(a2)?, ctx.dims(b2)?);
    // Against a 2-D `b` (a weight), both gradients are products over the
    // flattened rows, which read their transposed operand in place.
    let flat_dy = match b2_dims.len() == 2 && (Ctx::wanted(wants, 0) || Ctx::wanted(wants, 1)) {
        true => {
            let rows = a2_dims.iter().product::<usize>() / b2_dims[0].max(1);
            Some((rows, shaped(ctx, dy2, &[rows, b2_dims[1]])?))
        }
        false => None,
    };
    let da = if Ctx::wanted(wants, 0) {
        let g = match flat_dy {
            Some((_, flat_dy)) => input_grad(ctx, flat_dy, b2, &a2_dims)?,
            None => {
                let bt = transpose_last(ctx, b2)?;
                let g = ctx.emit1(Op::MatMul, &[dy2, bt])?;
                let a2_ty = ctx.ty(a2).clone();
                ctx.sum_to(g, &a2_ty)?
            }
        };
        Some(if a_dims.len() == 1 {
            reshape(ctx, g, &a_dims)?
        } else {
            g
        })
    } else {
        None
    };
    let db = if Ctx::wanted(wants, 1) {
        let g = match flat_dy {
            Some((rows, flat_dy)) => {
                let flat_a = shaped(ctx, a2, &[rows, b2_dims[0]])?;
                gemm2(ctx, 1.0, flat_a, true, flat_dy, false)?
            }
            None => {
                let at = transpose_last(ctx, a2)?;
                let g = ctx.emit1(Op::MatMul, &[at, dy2])?;
                let b2_ty = ctx.ty(b2).clone();
                ctx.sum_to(g, &b2_ty)?
            }
        };
        Some(if b_dims.len() == 1 {
            reshape(ctx, g, &b_dims)?
        } else {
            g
        })
    } else {
        None
    };
    Ok(vec![da, db])
}

/// `Gemm(a, b, c?)`: `Y = alpha·op(A)·op(B) + beta·C`. With `op(A)` of
/// shape `[m, k]`, `d op(A) = alpha·dY·op(B)ᵀ` and `d op(B) =
/// alpha·op(A)ᵀ·dY`; a stored transpose takes the transposed product.
fn gemm(
    ctx: &mut Ctx,
    node: &Node,
    dy: TensorId,
    wants: &[bool],
    alpha: f64,
    beta: f64,
    (trans_a, trans_b): (bool, bool),
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let (a, b) = (Ctx::input(node, 0)?, Ctx::input(node, 1)?);
    let mut out = Ctx::no_grads(node);
    if Ctx::wanted(wants, 0) {
        out[0] = Some(if trans_a {
            gemm2(ctx, alpha, b, trans_b, dy, true)?
        } else {
            gemm2(ctx, alpha, dy, false, b, !trans_b)?
        });
    }
    if Ctx::wanted(wants, 1) {
        out[1] = Some(if trans_b {
            gemm2(ctx, alpha, dy, true, a, trans_a)?
        } else {
            gemm2(ctx, alpha, a, !trans_a, dy, false)?
        });
    }
    if Ctx::wanted(wants, 2) {
        let c = Ctx::input(node, 2)?;
        let scaled = if beta == 1.0 {
            dy
        } else {
            let dtype = ctx.ty(dy).dtype;
            let s = ctx.scalar(dtype, beta);
            mul(ctx, dy, s)?
        };
        let c_ty = ctx.ty(c).clone();
        out[2] = Some(ctx.sum_to(scaled, &c_ty)?);
    }
    Ok(out)
}

/// `Linear(x[..., in], weight[in, out], bias[out]?)`: `dx = dY·weightᵀ`,
/// `dweight = xᵀ·dY` over the flattened leading dims, `dbias = Σ dY`.
fn linear(
    ctx: &mut Ctx,
    node: &Node,
    dy: TensorId,
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let (x, w) = (Ctx::input(node, 0)?, Ctx::input(node, 1)?);
    let mut out = Ctx::no_grads(node);
    let (x_dims, w_dims) = (ctx.dims(x)?, ctx.dims(w)?);
    let rows = x_dims.iter().product::<usize>() / w_dims[0].max(1);
    if Ctx::wanted(wants, 0) || Ctx::wanted(wants, 1) {
        let flat_dy = shaped(ctx, dy, &[rows, w_dims[1]])?;
        if Ctx::wanted(wants, 0) {
            out[0] = Some(input_grad(ctx, flat_dy, w, &x_dims)?);
        }
        if Ctx::wanted(wants, 1) {
            let flat_x = shaped(ctx, x, &[rows, w_dims[0]])?;
            out[1] = Some(gemm2(ctx, 1.0, flat_x, true, flat_dy, false)?);
        }
    }
    if Ctx::wanted(wants, 2) {
        let bias = Ctx::input(node, 2)?;
        let bias_ty = ctx.ty(bias).clone();
        out[2] = Some(ctx.sum_to(dy, &bias_ty)?);
    }
    Ok(out)
}

/// `x` shaped `dims`, reshaped only when it is not that already.
fn shaped(ctx: &mut Ctx, x: TensorId, dims: &[usize]) -> Result<TensorId, AutodiffError> {
    match ctx.dims(x)? == dims {
        true => Ok(x),
        false => reshape(ctx, x, dims),
    }
}

/// The gradient of a product's batched input against a 2-D `w`, from the
/// output gradient flattened to rows: `flat_dy·wᵀ` as one `Gemm` that
/// reads `w` transposed in place (no transpose of the weight is written),
/// reshaped to the input's `dims`.
fn input_grad(
    ctx: &mut Ctx,
    flat_dy: TensorId,
    w: TensorId,
    dims: &[usize],
) -> Result<TensorId, AutodiffError> {
    let g = gemm2(ctx, 1.0, flat_dy, false, w, true)?;
    shaped(ctx, g, dims)
}

#[cfg(test)]
mod tests {
    use crate::autodiff::differentiate;
    use crate::autodiff::testing::{check_op, one_op, random};
    use crate::Op;

    fn matmul(a: &[usize], b: &[usize]) {
        check_op(&Op::MatMul, &[Some(random(a, 1)), Some(random(b, 2))], 1e-6);
    }

    #[test]
    fn matmul_plain_batched_and_broadcast() {
        matmul(&[3, 4], &[4, 2]);
        matmul(&[2, 3, 4], &[2, 4, 5]);
        // A weight shared by a batch, a batch shared by one matrix, and
        // batch dims broadcast against each other.
        matmul(&[2, 3, 4], &[4, 5]);
        matmul(&[3, 4], &[2, 4, 5]);
        matmul(&[2, 1, 3, 4], &[3, 4, 2]);
    }

    /// A product against a 2-D weight reads the weight (and the input)
    /// transposed in place in its gradients: no transpose is written, as
    /// the cost models price the backward pass.
    #[test]
    fn weight_gradients_write_no_transpose() {
        let (x, w, b) = (random(&[2, 3, 4], 1), random(&[4, 5], 2), random(&[5], 3));
        let cases = [
            (Op::MatMul, vec![Some(x.clone()), Some(w.clone())]),
            (Op::MatMul, vec![Some(random(&[3, 4], 4)), Some(w.clone())]),
            (Op::Linear, vec![Some(x), Some(w), Some(b)]),
        ];
        for (op, inputs) in cases {
            let d = differentiate(&one_op(&op, &inputs, &[])).expect("differentiates");
            let ops: Vec<String> = d
                .graph
                .node_indices()
                .map(|i| d.graph.node(i).op.name())
                .collect();
            assert!(!ops.iter().any(|o| o == "Transpose"), "{}: {ops:?}", op.name());
            assert_eq!(
                ops.iter().filter(|o| *o == "Gemm").count(),
                2,
                "{}: {ops:?}",
                op.name()
            );
            check_op(&op, &inputs, 1e-6);
        }
    }

    #[test]
    fn matmul_vectors_are_promoted() {
        matmul(&[4], &[4]);
        matmul(&[4], &[4, 3]);
        matmul(&[4], &[2, 4, 3]);
        matmul(&[3, 4], &[4]);
        matmul(&[2, 3, 4], &[4]);
    }

    #[test]
    fn gemm_transposes_scale_and_bias() {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let op = Op::Gemm {
                alpha: 0.7,
                beta: 1.3,
                trans_a,
                trans_b,
            };
            let a = if trans_a { [4, 3] } else { [3, 4] };
            let b = if trans_b { [2, 4] } else { [4, 2] };
            let inputs = [Some(random(&a, 1)), Some(random(&b, 2)), Some(random(&[1, 2], 3))];
            check_op(&op, &inputs, 1e-6);
            check_op(&op, &inputs[..2], 1e-6);
        }
        let plain = Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: false,
        };
        check_op(
            &plain,
            &[
                Some(random(&[3, 4], 1)),
                Some(random(&[4, 2], 2)),
                Some(random(&[3, 2], 3)),
            ],
            1e-6,
        );
    }

    #[test]
    fn linear_with_and_without_bias() {
        let (x, w, b) = (random(&[2, 3, 4], 1), random(&[4, 5], 2), random(&[5], 3));
        check_op(&Op::Linear, &[Some(x.clone()), Some(w.clone()), Some(b)], 1e-6);
        check_op(&Op::Linear, &[Some(x), Some(w.clone())], 1e-6);
        check_op(&Op::Linear, &[Some(random(&[3, 4], 4)), Some(w.clone())], 1e-6);
        check_op(&Op::Linear, &[Some(random(&[4], 5)), Some(w)], 1e-6);
    }
}

//! Backward rules: convolutions emit their fused adjoint `ConvGrad` (input
//! and weight gradients in one pass over the windows) and sum the output
//! gradient over batch and positions for the bias; pools emit `PoolGrad`.

use crate::autodiff::{AutodiffError, Ctx};
use crate::{Node, Op, ReduceKind, TensorId};

/// Input gradients of `Conv`, `ConvTranspose` or `Pool`.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let Some((mut out, dy)) = Ctx::seed(node, grads) else {
        return Ok(Ctx::no_grads(node));
    };
    let (x, w) = (Ctx::input(node, 0)?, node.inputs.get(1).copied().flatten());
    match &node.op {
        Op::Conv { window, groups } | Op::ConvTranspose { window, groups, .. } => {
            let w = w.ok_or_else(|| ctx.unsupported("without a weight"))?;
            if Ctx::wanted(wants, 0) || Ctx::wanted(wants, 1) {
                let op = Op::ConvGrad {
                    window: window.clone(),
                    groups: *groups,
                    transpose: matches!(node.op, Op::ConvTranspose { .. }),
                };
                let adjoint = ctx.emit(op, &[Some(x), Some(w), Some(dy)])?;
                for (slot, g) in adjoint.into_iter().enumerate() {
                    out[slot] = Ctx::wanted(wants, slot).then_some(g);
                }
            }
            if Ctx::wanted(wants, 2) {
                out[2] = Some(bias(ctx, dy)?);
            }
        }
        Op::Pool {
            kind, kernel, window, ..
        } if Ctx::wanted(wants, 0) => {
            let op = Op::PoolGrad {
                kind: *kind,
                kernel: kernel.clone(),
                window: window.clone(),
            };
            out[0] = Some(ctx.emit1(op, &[x, dy])?);
        }
        Op::Pool { .. } => {}
        other => return Err(ctx.unsupported(&format!("(second order through {})", other.name()))),
    }
    Ok(out)
}

/// The bias gradient: `dy[n, m, positions...]` summed over all but `m`.
fn bias(ctx: &mut Ctx, dy: TensorId) -> Result<TensorId, AutodiffError> {
    let rank = ctx.dims(dy)?.len() as i64;
    let axes: Vec<i64> = std::iter::once(0).chain(2..rank).collect();
    let axes = ctx.ints(&axes);
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: None,
        keepdims: false,
        noop_with_empty_axes: false,
    };
    ctx.emit1(sum, &[dy, axes])
}

#[cfg(test)]
mod tests {
    use crate::autodiff::testing::{check_op, random};
    use crate::op::conv::{PoolKind, Window};
    use crate::Op;

    fn window(strides: &[usize], pads: &[usize], dilations: &[usize]) -> Window {
        Window {
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: dilations.to_vec(),
        }
    }

    #[test]
    fn convolutions_1d_2d_3d_grouped_strided_dilated() {
        let cases: [(Window, usize, &[usize], &[usize]); 4] = [
            (window(&[2], &[1, 0], &[2]), 1, &[2, 4, 9], &[3, 4, 3]),
            (
                window(&[1, 2], &[1, 1, 0, 1], &[1, 1]),
                2,
                &[2, 4, 5, 6],
                &[6, 2, 3, 2],
            ),
            // Depthwise: a group per channel.
            (
                window(&[1, 1], &[1, 1, 1, 1], &[1, 1]),
                3,
                &[1, 3, 4, 4],
                &[3, 1, 3, 3],
            ),
            (
                window(&[1, 2, 1], &[0, 1, 0, 0, 0, 1], &[1, 1, 2]),
                1,
                &[1, 2, 3, 4, 5],
                &[2, 2, 2, 2, 2],
            ),
        ];
        for (window, groups, x, w) in cases {
            let bias = random(&[w[0]], 3);
            let op = Op::Conv {
                window: window.clone(),
                groups,
            };
            check_op(&op, &[Some(random(x, 1)), Some(random(w, 2)), Some(bias)], 1e-6);
        }
    }

    /// A window, the groups, `x`'s and `w`'s shapes and the output padding.
    type TransposeCase<'a> = (Window, usize, &'a [usize], &'a [usize], Vec<usize>);

    #[test]
    fn transposed_convolutions() {
        // x [n, c, d...], w [c, m/groups, k...].
        let cases: [TransposeCase; 3] = [
            (window(&[2], &[1, 0], &[1]), 1, &[2, 3, 4], &[3, 2, 3], vec![1]),
            (
                window(&[2, 1], &[0, 1, 1, 0], &[1, 2]),
                2,
                &[1, 4, 3, 3],
                &[4, 1, 2, 2],
                vec![0, 0],
            ),
            (
                window(&[1, 1], &[0, 0, 0, 0], &[1, 1]),
                1,
                &[1, 2, 2, 3],
                &[2, 3, 2, 2],
                vec![0, 0],
            ),
        ];
        for (window, groups, x, w, output_padding) in cases {
            let m = w[1] * groups;
            let op = Op::ConvTranspose {
                window,
                groups,
                output_padding,
            };
            let inputs = [Some(random(x, 1)), Some(random(w, 2)), Some(random(&[m], 3))];
            check_op(&op, &inputs, 1e-6);
        }
    }

    #[test]
    fn pools() {
        let x = random(&[2, 2, 5, 6], 1);
        for kind in [
            PoolKind::Max,
            PoolKind::Average {
                count_include_pad: false,
            },
            PoolKind::Average {
                count_include_pad: true,
            },
        ] {
            for ceil_mode in [false, true] {
                let op = Op::Pool {
                    kind,
                    kernel: vec![3, 2],
                    window: window(&[2, 2], &[1, 0, 1, 1], &[1, 1]),
                    ceil_mode,
                };
                check_op(&op, &[Some(x.clone())], 1e-6);
            }
        }
    }
}

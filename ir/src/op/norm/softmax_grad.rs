//! `SoftmaxGrad(y, dout)` → `dx`: the adjoint of `Softmax` (`log = false`)
//! and `LogSoftmax` along one axis, from the forward output `y`:
//! `dx = y·(dout − Σ dout·y)` and `dx = dout − exp(y)·Σ dout` (sums along
//! the axis). One pass per row where the composed form takes four over the
//! whole tensor, which for a language model's loss is the logits, the
//! largest activation of the step.

use super::super::adjoint::check_grad_like;
use super::super::context::{norm_axis, EvalCtx, InferCtx};
use super::super::geometry::{numel, Rows};
use super::super::norm::infer_softmax;
use super::super::numeric::{lane_sum, lane_sum_slice, vectorized, Real};
use super::super::threads::rows_in_runs;
use super::super::{OpError, TensorType};

/// FLOPs per element: the row sum, and the product and difference (plus
/// `exp` for log-softmax).
const SOFTMAX_GRAD_FLOPS: f64 = 4.0;

/// Type of `dx`: `y`'s, after checking `dout` against it.
pub(super) fn infer(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let forward = [cx.opt(0)];
    let out = infer_softmax(
        &InferCtx {
            op: cx.op,
            inputs: &forward,
        },
        axis,
    )?;
    check_grad_like(cx, 1, &out[0])?;
    Ok(out)
}

/// Reference kernel: `[dx]`.
pub(super) fn kernel<T: Real>(cx: &EvalCtx, axis: i64, log: bool) -> Result<Vec<Vec<T>>, OpError> {
    let y_val = cx.input(0)?;
    let (y, dout) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?);
    let rows = Rows::along(&y_val.shape, norm_axis(cx.op, axis, y_val.shape.len())?);
    if rows.inner == 1 {
        // The last axis: contiguous rows, the same sums in the same order,
        // in runs of rows over the rank's threads.
        let n = rows.n.max(1);
        let dx = rows_in_runs(y.len() / n, n, cx.row_ways, |r, dx| {
            let part = r.start * n..r.end * n;
            vectorized(|| last_axis_rows(dx, &y[part.clone()], &dout[part], n, log));
        });
        return Ok(vec![dx]);
    }
    let mut dx = vec![T::zero(); y.len()];
    let mut idx = Vec::with_capacity(rows.n);
    for base in rows.starts() {
        idx.clear();
        idx.extend((0..rows.n).map(|j| base + j * rows.inner));
        if log {
            let total = lane_sum(idx.iter().map(|&i| dout[i]));
            for &i in &idx {
                dx[i] = dout[i] - y[i].exp_v() * total;
            }
        } else {
            let total = lane_sum(idx.iter().map(|&i| dout[i] * y[i]));
            for &i in &idx {
                dx[i] = y[i] * (dout[i] - total);
            }
        }
    }
    Ok(vec![dx])
}

/// `dx` of contiguous rows of `n` elements, the row sums in lanes as the
/// strided path takes them ([`lane_sum_slice`]).
#[inline(always)]
fn last_axis_rows<T: Real>(dx: &mut [T], y: &[T], dout: &[T], n: usize, log: bool) {
    for ((dx, y), dout) in dx.chunks_mut(n).zip(y.chunks(n)).zip(dout.chunks(n)) {
        if log {
            let total = lane_sum_slice(dout);
            for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dout) {
                *d = g - y.exp_v() * total;
            }
        } else {
            // The products first (a pass that vectorizes), then their sum.
            for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dout) {
                *d = g * y;
            }
            let total = lane_sum_slice(dx);
            for ((d, &y), &g) in dx.iter_mut().zip(y).zip(dout) {
                *d = y * (g - total);
            }
        }
    }
}

/// FLOPs of `SoftmaxGrad` over `y`.
pub(super) fn flops(y: Option<&TensorType>) -> f64 {
    y.map_or(0.0, numel) * SOFTMAX_GRAD_FLOPS
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::{assert_close, assert_op_err, eval, f32s, infer, ty};
    use super::super::super::Op;
    use crate::DType;

    #[test]
    fn softmax_and_log_softmax_gradients_by_hand() {
        // Softmax output [0.25, 0.75] along axis 0 of a [2, 1] tensor.
        let y = f32s(&[2, 1], &[0.25, 0.75]);
        let dout = f32s(&[2, 1], &[1.0, 3.0]);
        let softmax = Op::SoftmaxGrad { axis: 0, log: false };
        // Σ dout·y = 2.5: dx = [0.25·(1 − 2.5), 0.75·(3 − 2.5)].
        let got = eval(&softmax, &[&y, &dout]).unwrap()[0].to_f64_vec();
        assert_close(&got, &[-0.375, 0.375], 1e-7);
        // Log-softmax output ln[0.25, 0.75]: dx = dout − p·Σ dout = [1 − 1, 3 − 3].
        let log_y = f32s(&[1, 2], &[0.25f32.ln(), 0.75f32.ln()]);
        let dout = f32s(&[1, 2], &[1.0, 3.0]);
        let log = Op::SoftmaxGrad { axis: -1, log: true };
        let got = eval(&log, &[&log_y, &dout]).unwrap()[0].to_f64_vec();
        assert_close(&got, &[0.0, 0.0], 1e-6);
        let t = ty(DType::F32, "b 8");
        assert_eq!(infer(&log, &[t.clone(), t.clone()]).unwrap(), vec![t.clone()]);
        assert_op_err(
            infer(&log, &[t, ty(DType::F32, "b 4")]),
            "SoftmaxGrad",
            "output gradient (input 1) is f32[b, 4] but the forward output is f32[b, 8]",
        );
    }
}

//! Reference kernels of softmax and the normalisations, row by row, in
//! runs of rows over the rank's threads (`threads::row_split`).

use super::super::broadcast::source_index;
use super::super::context::{finish, norm_axis, EvalCtx};
use super::super::geometry::{prod, Rows};
use super::super::numeric::{
    float_kernel, lane_max, lane_max_slice, lane_sum, lane_sum_by, lane_sum_slice, vectorized, Real,
};
use super::super::threads::rows_in_runs;
use super::super::OpError;
use crate::Value;

/// Softmax (or log-softmax) of `x` along rows, written into a new buffer;
/// along the last axis in `ways` runs of rows over the rank's threads.
fn softmax_rows<T: Real>(x: &[T], rows: &Rows, log: bool, ways: usize) -> Vec<T> {
    if rows.inner == 1 {
        // The last axis: whole rows in place, no index per element.
        let n = rows.n.max(1);
        return rows_in_runs(x.len() / n, n, ways, |r, out| {
            out.copy_from_slice(&x[r.start * n..r.end * n]);
            vectorized(|| {
                let mut exps = Vec::new();
                for row in out.chunks_mut(n) {
                    softmax_row(row, log, &mut exps);
                }
            });
        });
    }
    let mut out = vec![T::zero(); x.len()];
    let mut idx = Vec::with_capacity(rows.n);
    for base in rows.starts() {
        idx.clear();
        idx.extend((0..rows.n).map(|j| base + j * rows.inner));
        let max = lane_max(idx.iter().map(|&i| x[i]));
        for &i in &idx {
            out[i] = (x[i] - max).exp_v();
        }
        let sum = lane_sum(idx.iter().map(|&i| out[i]));
        if log {
            let lse = sum.ln();
            for &i in &idx {
                out[i] = x[i] - max - lse;
            }
        } else {
            for &i in &idx {
                out[i] = out[i] / sum;
            }
        }
    }
    out
}

/// Softmax (or log-softmax) of one contiguous row, in place, with the same
/// operations in the same order as the strided path. The exponentials are
/// a pass of their own (into `exps` for log-softmax), and the maximum and
/// the sum are taken in lanes ([`lane_max_slice`], [`lane_sum_slice`]):
/// every pass vectorizes.
#[inline(always)]
fn softmax_row<T: Real>(row: &mut [T], log: bool, exps: &mut Vec<T>) {
    let max = lane_max_slice(row);
    if log {
        exps.clear();
        exps.extend_from_slice(row);
        for e in exps.iter_mut() {
            *e = (*e - max).exp_v();
        }
        let lse = lane_sum_slice(exps).ln();
        for v in row.iter_mut() {
            *v = *v - max - lse;
        }
    } else {
        for v in row.iter_mut() {
            *v = (*v - max).exp_v();
        }
        let sum = lane_sum_slice(row);
        for v in row.iter_mut() {
            *v = *v / sum;
        }
    }
}

/// Reference kernel for `Softmax` and `LogSoftmax`.
pub(super) fn eval_softmax(cx: &EvalCtx, axis: i64, log: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let rows = Rows::along(&x.shape, norm_axis(cx.op, axis, x.shape.len())?);
    let data = float_kernel!(cx.op, x, T => softmax_rows(cx.floats::<T>(0)?, &rows, log, cx.row_ways));
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

/// A normalised row's `(mean, 1/√(var + ε))`, the mean zero for RMS
/// (`centre = false`), the sums in lanes ([`lane_sum_slice`]); the
/// backward pass recomputes them the same way.
#[inline(always)]
pub(super) fn row_stats<T: Real>(row: &[T], centre: bool, epsilon: f64) -> (T, T) {
    let count = T::lit(row.len().max(1) as f64);
    let mean = if centre {
        lane_sum_slice(row) / count
    } else {
        T::zero()
    };
    let var = lane_sum_by(row, |v| (v - mean) * (v - mean)) / count;
    (mean, T::one() / (var + T::lit(epsilon)).sqrt())
}

fn norm_kernel<T: Real>(cx: &EvalCtx, axis: usize, epsilon: f64, centre: bool) -> Result<Vec<T>, OpError> {
    let x_val = cx.input(0)?;
    let x = cx.floats::<T>(0)?;
    let normalized = &x_val.shape[axis..];
    let n = prod(normalized);
    let param = |i: usize| -> Result<Option<Vec<T>>, OpError> {
        match cx.opt(i) {
            None => Ok(None),
            Some(v) => {
                let d = cx.floats::<T>(i)?;
                Ok(Some(
                    source_index(&v.shape, normalized)
                        .into_iter()
                        .map(|j| d[j])
                        .collect(),
                ))
            }
        }
    };
    let scale = param(1)?.unwrap_or_default();
    let bias = if centre { param(2)? } else { None };
    let n = n.max(1);
    Ok(rows_in_runs(x.len() / n, n, cx.row_ways, |r, out| {
        let rows = x[r.start * n..r.end * n].chunks(n);
        vectorized(|| {
            for (row, y) in rows.zip(out.chunks_mut(n)) {
                let (mean, inv) = row_stats(row, centre, epsilon);
                for ((o, &v), &s) in y.iter_mut().zip(row).zip(&scale) {
                    *o = (v - mean) * inv * s;
                }
                if let Some(b) = &bias {
                    for (o, &b) in y.iter_mut().zip(b) {
                        *o += b;
                    }
                }
            }
        })
    }))
}

/// Reference kernel for `LayerNorm` (`centre = true`) and `RmsNorm`.
pub(super) fn eval_norm(cx: &EvalCtx, axis: i64, epsilon: f64, centre: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let a = norm_axis(cx.op, axis, x.shape.len())?;
    let data = float_kernel!(cx.op, x, T => norm_kernel::<T>(cx, a, epsilon, centre)?);
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

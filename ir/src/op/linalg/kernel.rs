//! Reference kernels of the products, through the bounds-checked GEMM.

use super::super::broadcast::broadcast_to;
use super::super::context::{finish, EvalCtx};
use super::super::gemm::{gemm_threaded, Mat};
use super::super::geometry::prod;
use super::super::numeric::{float_kernel, Real};
use super::super::OpError;
use super::{batched, joins_batches, matmul_int, Batched};
use crate::{Data, Value};

fn matmul_float<T: Real>(op: &str, a: &[T], b: &[T], g: &Batched) -> Result<Vec<T>, OpError> {
    let mut c = vec![T::zero(); g.a_offsets.len() * g.m * g.n];
    if joins_batches(g) {
        // One product of every matrix's rows ([`super::matmul_rows`]).
        let am = Mat::row_major(a, 0, g.k, false);
        let bm = Mat::row_major(b, g.b_offsets[0], g.n, false);
        let rows = g.m * g.a_offsets.len();
        gemm_threaded(op, rows, g.k, g.n, T::one(), am, bm, T::zero(), &mut c, 0)?;
        return Ok(c);
    }
    for (i, (&ao, &bo)) in g.a_offsets.iter().zip(&g.b_offsets).enumerate() {
        let am = Mat::row_major(a, ao, g.k, false);
        let bm = Mat::row_major(b, bo, g.n, false);
        gemm_threaded(
            op,
            g.m,
            g.k,
            g.n,
            T::one(),
            am,
            bm,
            T::zero(),
            &mut c,
            i * g.m * g.n,
        )?;
    }
    Ok(c)
}

/// Reference kernel for `MatMul`.
pub(super) fn eval_matmul(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let g = batched(&a.shape, &b.shape);
    let data = match (&a.data, &b.data) {
        (Data::I64(x), Data::I64(y)) => Data::I64(matmul_int(x, y, &g)),
        _ => float_kernel!(cx.op, a, T => matmul_float::<T>(cx.op, cx.floats(0)?, cx.floats(1)?, &g)?),
    };
    Ok(vec![finish(cx.out_dtype(0), cx.out_shape(0)?, data)])
}

/// `C` broadcast to `[rows, cols]` and scaled, as the accumulator of a
/// product: a bias row is copied row by row ([`broadcast_to`]), and a
/// scale of 1 (exact) is not applied.
fn bias_init<T: Real>(c: Option<(&[T], &[usize])>, rows: usize, cols: usize, beta: T) -> Vec<T> {
    match c {
        Some((data, shape)) if beta != T::zero() => {
            let mut out = broadcast_to(data, shape, &[rows, cols]);
            if beta != T::one() {
                out.iter_mut().for_each(|x| *x *= beta);
            }
            out
        }
        _ => vec![T::zero(); rows * cols],
    }
}

fn gemm_float<T: Real>(cx: &EvalCtx, alpha: f64, beta: f64, ta: bool, tb: bool) -> Result<Vec<T>, OpError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let n = if tb { b.shape[0] } else { b.shape[1] };
    let c = match cx.opt(2) {
        Some(v) => Some((cx.floats::<T>(2)?, &v.shape[..])),
        None => None,
    };
    let mut out = bias_init(c, m, n, T::lit(beta));
    let am = Mat::row_major(cx.floats::<T>(0)?, 0, a.shape[1], ta);
    let bm = Mat::row_major(cx.floats::<T>(1)?, 0, b.shape[1], tb);
    gemm_threaded(cx.op, m, k, n, T::lit(alpha), am, bm, T::one(), &mut out, 0)?;
    Ok(out)
}

/// Reference kernel for `Gemm`.
pub(super) fn eval_gemm(
    cx: &EvalCtx,
    alpha: f64,
    beta: f64,
    ta: bool,
    tb: bool,
) -> Result<Vec<Value>, OpError> {
    let a = cx.input(0)?;
    let data = float_kernel!(cx.op, a, T => gemm_float::<T>(cx, alpha, beta, ta, tb)?);
    Ok(vec![finish(a.dtype, cx.out_shape(0)?, data)])
}

fn linear_float<T: Real>(cx: &EvalCtx) -> Result<Vec<T>, OpError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let (k, n) = (w.shape[0], w.shape[1]);
    let rows = prod(&x.shape[..x.shape.len().saturating_sub(1)]);
    let bias = match cx.opt(2) {
        Some(b) => Some((cx.floats::<T>(2)?, &b.shape[..])),
        None => None,
    };
    let mut out = bias_init(bias, rows, n, T::one());
    let xm = Mat::row_major(cx.floats::<T>(0)?, 0, k, false);
    let wm = Mat::row_major(cx.floats::<T>(1)?, 0, n, false);
    gemm_threaded(cx.op, rows, k, n, T::one(), xm, wm, T::one(), &mut out, 0)?;
    Ok(out)
}

/// Reference kernel for `Linear`.
pub(super) fn eval_linear(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data = float_kernel!(cx.op, x, T => linear_float::<T>(cx)?);
    Ok(vec![finish(x.dtype, cx.out_shape(0)?, data)])
}

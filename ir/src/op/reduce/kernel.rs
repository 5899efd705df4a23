//! Reference kernels of the reductions, arg-max, top-k and cumulative sums.

use super::super::broadcast::strided_index;
use super::super::context::{finish, int_values, invalid, norm_axis, scalar_int, unsupported, EvalCtx};
use super::super::geometry::{strides, Rows};
use super::super::moe::top_indices;
use super::super::numeric::{float_kernel, int_cmp, vectorized, Real};
use super::super::{OpError, ReduceKind};
use super::{float_reduce, float_results, float_step, int_reduce, reduce_axes};
use crate::{DType, Data, Value};
use std::cmp::Ordering;

pub(super) fn fold<T: Copy, A: Copy>(
    x: &[T],
    map: &[usize],
    outn: usize,
    init: A,
    f: impl Fn(A, T) -> A,
) -> Vec<A> {
    let mut acc = vec![init; outn];
    for (&v, &o) in x.iter().zip(map) {
        acc[o] = f(acc[o], v);
    }
    acc
}

/// Reference kernel for `Reduce`.
pub(super) fn eval_reduce(
    cx: &EvalCtx,
    kind: ReduceKind,
    attr: Option<&[i64]>,
    noop: bool,
) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let input = match (attr, cx.opt(1)) {
        (None, Some(a)) => Some(int_values(cx.op, a, 1)?),
        _ => None,
    };
    let Some(axes) = reduce_axes(cx.op, attr, input, x.shape.len(), noop)? else {
        return Ok(vec![x.clone()]);
    };
    let out_shape = cx.out_shape(0)?;
    let outn: usize = out_shape.iter().product();
    let kept_dims = (0..x.shape.len()).filter(|i| !axes.contains(i)).count();
    if (0..kept_dims).all(|i| !axes.contains(&i)) && outn > 0 && x.numel() > 0 {
        // Each output reduces one contiguous run, in order.
        let data = match &x.data {
            Data::F32(d) => Some(Data::F32(float_reduce_runs(kind, d, outn))),
            Data::F64(d) => Some(Data::F64(float_reduce_runs(kind, d, outn))),
            _ => None,
        };
        if let Some(data) = data {
            return Ok(vec![finish(x.dtype, out_shape, data)]);
        }
    }
    let leading = axes.len();
    if (0..leading).all(|i| axes.contains(&i)) && outn > 0 && x.numel() > 0 {
        // The leading dims reduced (a bias's gradient): whole rows folded
        // into one row of accumulators, in order.
        let data = match &x.data {
            Data::F32(d) => Some(Data::F32(float_reduce_rows(kind, d, outn))),
            Data::F64(d) => Some(Data::F64(float_reduce_rows(kind, d, outn))),
            _ => None,
        };
        if let Some(data) = data {
            return Ok(vec![finish(x.dtype, out_shape, data)]);
        }
    }
    // Map every input element to its output slot: reduced dims get stride 0.
    let kept: Vec<usize> = (0..x.shape.len())
        .map(|i| if axes.contains(&i) { 1 } else { x.shape[i] })
        .collect();
    let st: Vec<isize> = strides(&kept)
        .into_iter()
        .enumerate()
        .map(|(i, s)| if axes.contains(&i) { 0 } else { s as isize })
        .collect();
    let map = strided_index(&x.shape, &st, 0);
    let count = x.numel() / outn.max(1);
    let data = match &x.data {
        Data::I64(d) => Data::I64(int_reduce(kind, x.dtype, d, &map, outn, count as i64)),
        Data::Bool(d) => {
            let any = kind == ReduceKind::Max;
            Data::Bool(fold(
                d,
                &map,
                outn,
                !any,
                |a, v| if any { a || v } else { a && v },
            ))
        }
        _ => {
            let r = float_reduce(kind, &x.to_f64_vec(), &map, outn, count as f64);
            float_kernel!(cx.op, x, T => r.iter().map(|&v| T::lit(v)).collect())
        }
    };
    Ok(vec![finish(x.dtype, out_shape, data)])
}

/// [`float_reduce`] of `x` in `outn` equal contiguous runs (the reduced
/// axes are the trailing ones): the same f64 steps in the same order as
/// the general fold, so the same bits, without an index per element.
fn float_reduce_runs<T: Real>(kind: ReduceKind, x: &[T], outn: usize) -> Vec<T> {
    let count = x.len() / outn;
    let (init, step) = float_step(kind);
    let folded = x
        .chunks(count)
        .map(|run| {
            run.iter()
                .fold(init, |a, &v| step(a, v.to_f64().unwrap_or(f64::NAN)))
        })
        .collect();
    float_results(kind, folded, count as f64)
        .into_iter()
        .map(T::lit)
        .collect()
}

/// [`float_reduce`] of `x` over its leading dims into `outn` outputs:
/// each row of `outn` elements is folded into the accumulators in turn,
/// the same f64 steps in the same order as the general fold, so the same
/// bits, without an index per element or an f64 copy of `x`.
fn float_reduce_rows<T: Real>(kind: ReduceKind, x: &[T], outn: usize) -> Vec<T> {
    let (init, step) = float_step(kind);
    let mut acc = vec![init; outn];
    let to = |v: T| v.to_f64().unwrap_or(f64::NAN);
    for row in x.chunks(outn) {
        match kind {
            // The step a sum takes, inlined: the columns are independent,
            // so the loop vectorizes across them.
            ReduceKind::Sum | ReduceKind::Mean => vectorized(|| {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += to(v);
                }
            }),
            _ => {
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a = step(*a, to(v));
                }
            }
        }
    }
    float_results(kind, acc, (x.len() / outn) as f64)
        .into_iter()
        .map(T::lit)
        .collect()
}

/// Index of the maximum of each row; ties go to the first (or last) index.
fn argmax_rows<T: Copy>(x: &[T], rows: &Rows, last: bool, cmp: impl Fn(T, T) -> Ordering) -> Vec<i64> {
    rows.starts()
        .map(|base| {
            let mut best = 0;
            for j in 1..rows.n {
                let o = cmp(x[base + j * rows.inner], x[base + best * rows.inner]);
                if o == Ordering::Greater || (last && o == Ordering::Equal) {
                    best = j;
                }
            }
            best as i64
        })
        .collect()
}

/// Reference kernel for `ArgMax`.
pub(super) fn eval_argmax(cx: &EvalCtx, axis: i64, last: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let rows = Rows::along(&x.shape, norm_axis(cx.op, axis, x.shape.len())?);
    if rows.n == 0 {
        return Err(invalid(cx.op, "cannot take the argmax of an empty axis"));
    }
    let fcmp = |a: f64, b: f64| a.partial_cmp(&b).unwrap_or(Ordering::Less);
    let idx = match &x.data {
        Data::I64(d) => argmax_rows(d, &rows, last, |a, b| int_cmp(x.dtype, a, b)),
        Data::F32(d) => argmax_rows(d, &rows, last, |a, b| fcmp(a as f64, b as f64)),
        Data::F64(d) => argmax_rows(d, &rows, last, fcmp),
        Data::Bool(d) => argmax_rows(d, &rows, last, |a, b| a.cmp(&b)),
        Data::Str(_) => return Err(unsupported(cx.op, "string input")),
    };
    Ok(vec![Value {
        dtype: DType::I64,
        shape: cx.out_shape(0)?,
        data: Data::I64(idx),
    }])
}

fn topk_rows<T: Copy + Default>(
    x: &[T],
    rows: &Rows,
    k: usize,
    cmp: impl Fn(&T, &T) -> Ordering,
) -> (Vec<T>, Vec<i64>) {
    let total = rows.outer * rows.inner * k;
    let (mut vals, mut ids) = (vec![T::default(); total], vec![0i64; total]);
    let mut row = Vec::with_capacity(rows.n);
    for (r, base) in rows.starts().enumerate() {
        row.clear();
        row.extend((0..rows.n).map(|j| x[base + j * rows.inner]));
        for (j, i) in top_indices(&row, k, &cmp).into_iter().enumerate() {
            let at = rows.at(r, j, k);
            vals[at] = row[i];
            ids[at] = i as i64;
        }
    }
    (vals, ids)
}

/// Reference kernel for `TopK`: sorted output, ties keep the lower index.
pub(super) fn eval_topk(cx: &EvalCtx, axis: i64, largest: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let rows = Rows::along(&x.shape, norm_axis(cx.op, axis, x.shape.len())?);
    let k = cx
        .out_shape(1)?
        .get(norm_axis(cx.op, axis, x.shape.len())?)
        .copied()
        .unwrap_or(0);
    let dir = |o: Ordering| if largest { o.reverse() } else { o };
    let fcmp = |a: f64, b: f64| dir(a.partial_cmp(&b).unwrap_or(Ordering::Equal));
    let (vals, ids) = match &x.data {
        Data::I64(d) => {
            let (v, i) = topk_rows(d, &rows, k, |a, b| dir(int_cmp(x.dtype, *a, *b)));
            (Data::I64(v), i)
        }
        Data::F32(d) => {
            let (v, i) = topk_rows(d, &rows, k, |a, b| fcmp(*a as f64, *b as f64));
            (Data::F32(v), i)
        }
        Data::F64(d) => {
            let (v, i) = topk_rows(d, &rows, k, |a, b| fcmp(*a, *b));
            (Data::F64(v), i)
        }
        Data::Bool(d) => {
            let (v, i) = topk_rows(d, &rows, k, |a, b| dir(a.cmp(b)));
            (Data::Bool(v), i)
        }
        Data::Str(_) => return Err(unsupported(cx.op, "string input")),
    };
    let shape = cx.out_shape(0)?;
    Ok(vec![
        finish(x.dtype, shape.clone(), vals),
        Value {
            dtype: DType::I64,
            shape,
            data: Data::I64(ids),
        },
    ])
}

fn cumsum_rows<T: Copy>(
    x: &[T],
    rows: &Rows,
    exclusive: bool,
    reverse: bool,
    zero: T,
    add: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut out = vec![zero; x.len()];
    for base in rows.starts() {
        let mut acc = zero;
        for step in 0..rows.n {
            let j = if reverse { rows.n - 1 - step } else { step };
            let i = base + j * rows.inner;
            if exclusive {
                out[i] = acc;
                acc = add(acc, x[i]);
            } else {
                acc = add(acc, x[i]);
                out[i] = acc;
            }
        }
    }
    out
}

/// Reference kernel for `CumSum`.
pub(super) fn eval_cumsum(cx: &EvalCtx, exclusive: bool, reverse: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let axis = scalar_int(cx.op, &int_values(cx.op, cx.input(1)?, 1)?, 1)?;
    let rows = Rows::along(&x.shape, norm_axis(cx.op, axis, x.shape.len())?);
    let data = match &x.data {
        Data::I64(d) => Data::I64(cumsum_rows(d, &rows, exclusive, reverse, 0, i64::wrapping_add)),
        _ => {
            float_kernel!(cx.op, x, T => cumsum_rows(cx.floats::<T>(0)?, &rows, exclusive, reverse, T::lit(0.0), |a, b| a + b))
        }
    };
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

//! Reductions: `Reduce{Sum,Mean,Max,Min,Prod}` (axes from the attribute or,
//! opset 18, the second input), `ArgMax`, `TopK`, `CumSum`. Float sums
//! accumulate in `f64`; integer ones wrap to the logical type.

use super::broadcast::strided_index;
use super::kernel_util::{
    finish, float_kernel, int_cmp, int_limits, int_values, invalid, norm_axes, norm_axis, numel, scalar_int,
    strides, tensor, unsupported, EvalCtx, InferCtx, Real, Rows,
};
use super::moe::top_indices;
use super::{OpError, ReduceKind, TensorType};
use crate::{DType, Data, Dim, Value};
use std::cmp::Ordering;

/// The reduced axes from the attribute or the `axes` input values, or `None`
/// when the reduction is the identity (`noop_with_empty_axes`, no axes).
fn reduce_axes(
    op: &str,
    attr: Option<&[i64]>,
    input: Option<Vec<i64>>,
    rank: usize,
    noop: bool,
) -> Result<Option<Vec<usize>>, OpError> {
    let axes = match attr {
        Some(a) => a.to_vec(),
        None => input.unwrap_or_default(),
    };
    if axes.is_empty() {
        return Ok(if noop { None } else { Some((0..rank).collect()) });
    }
    norm_axes(op, &axes, rank).map(Some)
}

fn keep_or_drop(dims: &[Dim], axes: &[usize], keepdims: bool) -> Vec<Dim> {
    dims.iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Fixed(1)),
            (true, false) => None,
        })
        .collect()
}

/// `Reduce(x, axes?)`.
pub(super) fn infer_reduce(
    cx: &InferCtx,
    kind: ReduceKind,
    attr: Option<&[i64]>,
    keepdims: bool,
    noop: bool,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool && !matches!(kind, ReduceKind::Max | ReduceKind::Min) {
        return Err(invalid(cx.op, "bool input is not supported"));
    }
    if cx.opt(1).is_some() {
        cx.int(1)?;
    }
    let input = if attr.is_none() { cx.opt_ints(1)? } else { None };
    Ok(match reduce_axes(cx.op, attr, input, x.shape.rank(), noop)? {
        None => vec![x.clone()],
        Some(axes) => vec![tensor(x.dtype, keep_or_drop(&x.shape.0, &axes, keepdims))],
    })
}

fn fold<T: Copy, A: Copy>(x: &[T], map: &[usize], outn: usize, init: A, f: impl Fn(A, T) -> A) -> Vec<A> {
    let mut acc = vec![init; outn];
    for (&v, &o) in x.iter().zip(map) {
        acc[o] = f(acc[o], v);
    }
    acc
}

fn float_reduce(kind: ReduceKind, x: &[f64], map: &[usize], outn: usize, count: f64) -> Vec<f64> {
    match kind {
        ReduceKind::Sum => fold(x, map, outn, 0.0, |a, v| a + v),
        ReduceKind::Mean => fold(x, map, outn, 0.0, |a, v| a + v)
            .into_iter()
            .map(|s| s / count)
            .collect(),
        ReduceKind::Prod => fold(x, map, outn, 1.0, |a, v| a * v),
        ReduceKind::Max => fold(x, map, outn, f64::NEG_INFINITY, |a, v| {
            if v > a || v.is_nan() {
                v
            } else {
                a
            }
        }),
        ReduceKind::Min => fold(x, map, outn, f64::INFINITY, |a, v| {
            if v < a || v.is_nan() {
                v
            } else {
                a
            }
        }),
    }
}

fn int_reduce(kind: ReduceKind, dtype: DType, x: &[i64], map: &[usize], outn: usize, count: i64) -> Vec<i64> {
    let (lo, hi) = int_limits(dtype);
    let pick = |want: Ordering| move |a: i64, v: i64| if int_cmp(dtype, v, a) == want { v } else { a };
    match kind {
        ReduceKind::Sum => fold(x, map, outn, 0, i64::wrapping_add),
        ReduceKind::Mean => fold(x, map, outn, 0, i64::wrapping_add)
            .into_iter()
            .map(|s| {
                if dtype == DType::U64 {
                    ((s as u64) / count.max(1) as u64) as i64
                } else {
                    s / count.max(1)
                }
            })
            .collect(),
        ReduceKind::Prod => fold(x, map, outn, 1, i64::wrapping_mul),
        ReduceKind::Max => fold(x, map, outn, lo, pick(Ordering::Greater)),
        ReduceKind::Min => fold(x, map, outn, hi, pick(Ordering::Less)),
    }
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

/// `ArgMax(x)` → i64 indices along `axis`.
pub(super) fn infer_argmax(cx: &InferCtx, axis: i64, keepdims: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        return Err(invalid(cx.op, "bool input is not supported"));
    }
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    Ok(vec![tensor(DType::I64, keep_or_drop(&x.shape.0, &[a], keepdims))])
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

/// `TopK(x, k)` → `(values, i64 indices)` with `k` along `axis`.
pub(super) fn infer_topk(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    let k = scalar_int(cx.op, &cx.ints(1)?, 1)?;
    let k = usize::try_from(k).map_err(|_| invalid(cx.op, format!("k = {k} is negative")))?;
    if x.shape.0[a].fixed().is_some_and(|n| k > n) {
        return Err(invalid(
            cx.op,
            format!("k = {k} exceeds axis length {}", x.shape.0[a]),
        ));
    }
    let mut dims = x.shape.0.clone();
    dims[a] = Dim::Fixed(k);
    Ok(vec![tensor(x.dtype, dims.clone()), tensor(DType::I64, dims)])
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

/// `CumSum(x, axis)`: same type and shape as `x`.
pub(super) fn infer_cumsum(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        return Err(invalid(cx.op, "bool input is not supported"));
    }
    cx.int(1)?;
    Ok(vec![x.clone()])
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

/// FLOPs of a reduction-like op: one per input element; backward the same
/// for float reductions and cumulative sums, none for index outputs.
pub(super) fn flops(x: Option<&TensorType>, differentiable: bool) -> (f64, f64) {
    let f = x.map_or(0.0, numel);
    (
        f,
        if differentiable && x.is_some_and(|t| t.dtype.is_float()) {
            f
        } else {
            0.0
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    fn reduce(kind: ReduceKind, axes: Option<Vec<i64>>, keepdims: bool) -> Op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes: false,
        }
    }

    #[test]
    fn reduce_with_attribute_and_input_axes() {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            eval1(&reduce(ReduceKind::Sum, Some(vec![1]), true), &[&x]),
            (vec![2, 1], vec![6.0, 15.0])
        );
        assert_eq!(
            eval1(&reduce(ReduceKind::Mean, Some(vec![-2]), false), &[&x]),
            (vec![3], vec![2.5, 3.5, 4.5])
        );
        let axes = i64s(&[1], &[0]);
        assert_eq!(
            eval1(&reduce(ReduceKind::Max, None, false), &[&x, &axes]),
            (vec![3], vec![4.0, 5.0, 6.0])
        );
        assert_eq!(
            eval1(&reduce(ReduceKind::Prod, None, false), &[&x]),
            (vec![], vec![720.0])
        );
        let noop = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: None,
            keepdims: true,
            noop_with_empty_axes: true,
        };
        let empty = i64s(&[0], &[]);
        assert_eq!(eval1(&noop, &[&x, &empty]).1, x.to_f64_vec());
    }

    #[test]
    fn reduce_inference_needs_constant_axes() {
        let op = reduce(ReduceKind::Sum, None, true);
        let r = infer(&op, &[ty(DType::F32, "b s 8"), ty(DType::I64, "1")]);
        assert!(matches!(r, Err(OpError::NotConstant { input: 1, .. })));
        let r = infer_with(
            &op,
            &[
                (ty(DType::F32, "b s 8"), None),
                (ty(DType::I64, "1"), Some(i64s(&[1], &[-1]))),
            ],
        );
        assert_eq!(r.unwrap()[0], ty(DType::F32, "b s 1"));
        assert_op_err(
            infer(
                &reduce(ReduceKind::Sum, Some(vec![3]), true),
                &[ty(DType::F32, "b s 8")],
            ),
            "ReduceSum",
            "axis 3 is out of range for rank 3",
        );
    }

    #[test]
    fn reduce_empty_sets_ints_and_bools() {
        let e = f32s(&[2, 0], &[]);
        assert_eq!(
            eval1(&reduce(ReduceKind::Sum, Some(vec![1]), false), &[&e]).1,
            vec![0.0, 0.0]
        );
        assert_eq!(
            eval1(&reduce(ReduceKind::Max, Some(vec![1]), false), &[&e]).1,
            vec![f64::NEG_INFINITY; 2]
        );
        let i = ints(DType::I8, &[2], &[100, 100]);
        assert_eq!(eval1(&reduce(ReduceKind::Sum, None, false), &[&i]).1, vec![-56.0]);
        let b = bools(&[2], &[false, true]);
        assert_eq!(
            eval(&reduce(ReduceKind::Max, None, false), &[&b]).unwrap()[0].data,
            Data::Bool(vec![true])
        );
    }

    #[test]
    fn argmax_ties() {
        let x = f32s(&[2, 3], &[1.0, 3.0, 3.0, 5.0, 0.0, 5.0]);
        let op = |select_last_index| Op::ArgMax {
            axis: -1,
            keepdims: true,
            select_last_index,
        };
        assert_eq!(eval1(&op(false), &[&x]), (vec![2, 1], vec![1.0, 0.0]));
        assert_eq!(eval1(&op(true), &[&x]).1, vec![2.0, 2.0]);
    }

    #[test]
    fn topk_sorted_with_stable_ties() {
        let x = f32s(&[2, 4], &[1.0, 3.0, 3.0, 2.0, 4.0, 1.0, 2.0, 1.0]);
        let k = i64s(&[1], &[2]);
        let op = |largest| Op::TopK {
            axis: -1,
            largest,
            sorted: true,
        };
        let out = eval(&op(true), &[&x, &k]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![3.0, 3.0, 4.0, 2.0]);
        assert_eq!(out[1].as_i64().unwrap(), &[1, 2, 0, 2]);
        let out = eval(&op(false), &[&x, &k]).unwrap();
        assert_eq!(out[1].as_i64().unwrap(), &[0, 3, 1, 3]);
        let col = eval(
            &Op::TopK {
                axis: 0,
                largest: true,
                sorted: true,
            },
            &[&x, &i64s(&[1], &[1])],
        )
        .unwrap();
        assert_eq!(col[0].to_f64_vec(), vec![4.0, 3.0, 3.0, 2.0]);
        let u = ints(DType::U64, &[2], &[1, -1]);
        let top = eval(&op(true), &[&u, &i64s(&[1], &[1])]).unwrap();
        assert_eq!(top[1].as_i64().unwrap(), &[1]);
        assert!(matches!(
            infer(&op(true), &[ty(DType::F32, "b 8"), ty(DType::I64, "1")]),
            Err(OpError::NotConstant { .. })
        ));
    }

    #[test]
    fn cumsum_variants() {
        let x = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let axis = i64s(&[], &[0]);
        let op = |exclusive, reverse| Op::CumSum { exclusive, reverse };
        assert_eq!(
            eval1(&op(false, false), &[&x, &axis]).1,
            vec![1.0, 3.0, 6.0, 10.0]
        );
        assert_eq!(eval1(&op(true, false), &[&x, &axis]).1, vec![0.0, 1.0, 3.0, 6.0]);
        assert_eq!(eval1(&op(false, true), &[&x, &axis]).1, vec![10.0, 9.0, 7.0, 4.0]);
        assert_eq!(eval1(&op(true, true), &[&x, &axis]).1, vec![9.0, 7.0, 4.0, 0.0]);
        let m = ints(DType::I32, &[2, 2], &[1, 2, 3, 4]);
        assert_eq!(
            eval1(&op(false, false), &[&m, &i64s(&[], &[-1])]).1,
            vec![1.0, 3.0, 3.0, 7.0]
        );
    }
}

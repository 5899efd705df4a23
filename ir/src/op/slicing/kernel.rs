//! Reference kernels of concatenation, splitting, slicing and triangles.

use super::super::broadcast::strided_index;
use super::super::context::{int_values, invalid, norm_axis, scalar_int, EvalCtx};
use super::super::geometry::{prod, strides, take};
use super::super::numeric::map_data;
use super::super::OpError;
use super::{narrow, slice_params};
use crate::{Data, Value};

fn concat_parts<T: Clone>(parts: &[(&[T], usize)], outer: usize) -> Vec<T> {
    let total = parts.iter().map(|(d, _)| d.len()).sum();
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for (d, chunk) in parts {
            out.extend_from_slice(&d[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

/// Reference kernel for `Concat`.
pub(super) fn eval_concat(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let vals = (0..cx.inputs.len())
        .map(|i| cx.input(i))
        .collect::<Result<Vec<_>, _>>()?;
    let first = vals[0];
    let a = norm_axis(cx.op, axis, first.shape.len())?;
    let outer = prod(&first.shape[..a]);
    let chunk = |v: &Value| prod(&v.shape[a..]);
    macro_rules! parts {
        ($variant:ident) => {{
            let parts = vals
                .iter()
                .map(|v| match &v.data {
                    Data::$variant(d) => Ok((&d[..], chunk(v))),
                    _ => Err(invalid(cx.op, "inputs differ in type")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Data::$variant(concat_parts(&parts, outer))
        }};
    }
    let data = match &first.data {
        Data::F32(_) => parts!(F32),
        Data::F64(_) => parts!(F64),
        Data::I64(_) => parts!(I64),
        Data::Bool(_) => parts!(Bool),
        Data::Str(_) => parts!(Str),
    };
    Ok(vec![Value {
        dtype: first.dtype,
        shape: cx.out_shape(0)?,
        data,
    }])
}

/// Reference kernel for `Split`.
pub(super) fn eval_split(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let a = norm_axis(cx.op, axis, x.shape.len())?;
    let mut start = 0;
    let mut out = Vec::with_capacity(cx.out.len());
    for i in 0..cx.out.len() {
        let len = cx.out_shape(i)?[a];
        out.push(narrow(x, a, start, len));
        start += len;
    }
    Ok(out)
}

/// Reference kernel for `Slice`.
pub(super) fn eval_slice(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let ints = |i: usize| cx.opt(i).map(|v| int_values(cx.op, v, i)).transpose();
    let fixed: Vec<Option<usize>> = x.shape.iter().map(|&d| Some(d)).collect();
    let (starts, ends) = (ints(1)?.unwrap_or_default(), ints(2)?.unwrap_or_default());
    let params = slice_params(cx.op, &fixed, &starts, &ends, ints(3)?, ints(4)?)?;
    let st = strides(&x.shape);
    let mut shape = x.shape.clone();
    let mut step_st: Vec<isize> = st.iter().map(|&s| s as isize).collect();
    let mut offset = 0isize;
    for s in params.into_iter().flatten() {
        shape[s.axis] = s.len;
        step_st[s.axis] = st[s.axis] as isize * s.step as isize;
        if s.len > 0 {
            offset += st[s.axis] as isize * s.start as isize;
        }
    }
    let idx = strided_index(&shape, &step_st, offset);
    Ok(vec![Value {
        dtype: x.dtype,
        shape,
        data: map_data!(&x.data, d => take(d, &idx)),
    }])
}

/// Reference kernel for `Trilu`: keeps `j - i ≥ k` (upper) or `j - i ≤ k`
/// (lower) in every trailing matrix, zeroing the rest.
pub(super) fn eval_trilu(cx: &EvalCtx, upper: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let k = match cx.opt(1) {
        Some(v) => scalar_int(cx.op, &int_values(cx.op, v, 1)?, 1)?,
        None => 0,
    };
    let r = x.shape.len();
    let (n, m) = (x.shape[r - 2] as i64, x.shape[r - 1] as i64);
    let keep = |flat: usize| {
        let within = flat as i64 % (n * m).max(1);
        let (i, j) = (within / m.max(1), within % m.max(1));
        if upper {
            j - i >= k
        } else {
            j - i <= k
        }
    };
    fn zero_out<T: Clone + Default>(d: &[T], keep: impl Fn(usize) -> bool) -> Vec<T> {
        d.iter()
            .enumerate()
            .map(|(i, v)| if keep(i) { v.clone() } else { T::default() })
            .collect()
    }
    Ok(vec![Value {
        dtype: x.dtype,
        shape: x.shape.clone(),
        data: map_data!(&x.data, d => zero_out(d, keep)),
    }])
}

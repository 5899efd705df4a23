//! Reference kernels of shape queries and generators.

use super::super::context::{finish, invalid, EvalCtx};
use super::super::elementwise::cast_value;
use super::super::numeric::map_data;
use super::super::{OpError, ScalarValue};
use super::{first, first_int, shape_range};
use crate::{DType, Data, Value};

/// Reference kernel for `Shape`.
pub(super) fn eval_shape(cx: &EvalCtx, start: i64, end: Option<i64>) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let (s, e) = shape_range(start, end, x.shape.len());
    let dims = x.shape[s..e].iter().map(|&d| d as i64).collect();
    Ok(vec![Value {
        dtype: DType::I64,
        shape: vec![e - s],
        data: Data::I64(dims),
    }])
}

/// Reference kernel for `Size`.
pub(super) fn eval_size(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    Ok(vec![Value::scalar_i64(cx.input(0)?.numel() as i64)])
}

/// Reference kernel for `ConstantOfShape`.
pub(super) fn eval_constant_of_shape(
    cx: &EvalCtx,
    value: Option<ScalarValue>,
) -> Result<Vec<Value>, OpError> {
    let v = value.map_or(0.0, |v| v.value);
    let one = cast_value(
        cx.op,
        &Value::f64(vec![], vec![v]).map_err(|e| invalid(cx.op, e.to_string()))?,
        cx.out_dtype(0),
    )?;
    let shape = cx.out_shape(0)?;
    let n = shape.iter().product::<usize>();
    Ok(vec![Value {
        dtype: one.dtype,
        shape,
        data: map_data!(&one.data, d => std::iter::repeat_n(&d[0], n).cloned().collect()),
    }])
}

/// Reference kernel for `Range`.
pub(super) fn eval_range(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let (start, delta) = (cx.input(0)?, cx.input(2)?);
    let dtype = start.dtype;
    let n = cx.out_shape(0)?.first().copied().unwrap_or(0);
    let data = if dtype.is_int() {
        let (s, d) = (first_int(cx.op, start, 0)?, first_int(cx.op, delta, 2)?);
        Data::I64((0..n as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect())
    } else {
        let (s, d) = (first(cx.op, start)?, first(cx.op, delta)?);
        let v = Value::f64(vec![n], (0..n).map(|i| s + i as f64 * d).collect())
            .map_err(|e| invalid(cx.op, e.to_string()))?;
        cast_value(cx.op, &v, dtype)?.data
    };
    Ok(vec![finish(dtype, vec![n], data)])
}

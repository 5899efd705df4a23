//! Generators: `Shape`, `Size`, `ConstantOfShape`, `Range`. Their outputs
//! depend on input shapes or constant values, never on input data.

use super::elementwise::cast_value;
use super::kernel_util::{finish, int_values, invalid, map_data, tensor, EvalCtx, InferCtx};
use super::{OpError, ScalarValue, TensorType};
use crate::{DType, Data, Dim, Value};

/// `start..end` of `Shape`, clamped to `0..=rank` after negative wrap-around.
fn shape_range(start: i64, end: Option<i64>, rank: usize) -> (usize, usize) {
    let r = rank as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
    (s, e.max(s))
}

/// `Shape(x)` → `i64[end - start]`.
pub(super) fn infer_shape(cx: &InferCtx, start: i64, end: Option<i64>) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let (s, e) = shape_range(start, end, cx.ty(0)?.shape.rank());
    Ok(vec![tensor(DType::I64, vec![Dim::Fixed(e - s)])])
}

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

/// `Size(x)` → scalar i64.
pub(super) fn infer_size(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    cx.ty(0)?;
    Ok(vec![tensor(DType::I64, vec![])])
}

/// Reference kernel for `Size`.
pub(super) fn eval_size(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    Ok(vec![Value::scalar_i64(cx.input(0)?.numel() as i64)])
}

/// `ConstantOfShape(shape)`: the shape must be a known 1-D integer tensor.
pub(super) fn infer_constant_of_shape(
    cx: &InferCtx,
    value: Option<ScalarValue>,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    cx.int(0)?;
    let dims = cx
        .ints(0)?
        .iter()
        .map(|&d| usize::try_from(d).map(Dim::Fixed))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| invalid(cx.op, "negative dim in the shape"))?;
    Ok(vec![tensor(value.map_or(DType::F32, |v| v.dtype), dims)])
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

/// `Range(start, limit, delta)`: one-element operands of one numeric type.
pub(super) fn infer_range(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 3)?;
    let dtype = cx.ty(0)?.dtype;
    for i in 0..3 {
        cx.same_dtype(0, i)?;
        let n = cx.ty(i)?.shape.as_fixed().map(|s| s.iter().product::<usize>());
        if n != Some(1) {
            return Err(invalid(cx.op, format!("input {i} must hold one element")));
        }
    }
    if dtype == DType::Bool {
        return Err(invalid(cx.op, "bool operands are not supported"));
    }
    let values = (0..3)
        .map(|i| {
            cx.input(i)?.value.ok_or_else(|| OpError::NotConstant {
                op: cx.op.to_string(),
                input: i,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let n = range_len(cx.op, values[0], values[1], values[2])?;
    Ok(vec![tensor(dtype, vec![Dim::Fixed(n)])])
}

fn first(op: &str, v: &Value) -> Result<f64, OpError> {
    v.to_f64_vec()
        .first()
        .copied()
        .ok_or_else(|| invalid(op, "empty operand"))
}

fn first_int(op: &str, v: &Value, i: usize) -> Result<i64, OpError> {
    int_values(op, v, i)?
        .first()
        .copied()
        .ok_or_else(|| invalid(op, "empty operand"))
}

/// Number of elements: `max(ceil((limit - start) / delta), 0)`.
fn range_len(op: &str, start: &Value, limit: &Value, delta: &Value) -> Result<usize, OpError> {
    if start.dtype.is_int() {
        let (s, l, d) = (
            first_int(op, start, 0)? as i128,
            first_int(op, limit, 1)? as i128,
            first_int(op, delta, 2)? as i128,
        );
        if d == 0 {
            return Err(invalid(op, "delta is zero"));
        }
        let span = l - s;
        let n = if (span > 0) == (d > 0) && span != 0 {
            (span + d - d.signum()) / d
        } else {
            0
        };
        return usize::try_from(n).map_err(|_| invalid(op, "range too long"));
    }
    let (s, l, d) = (first(op, start)?, first(op, limit)?, first(op, delta)?);
    let n = ((l - s) / d).ceil();
    if !n.is_finite() {
        return Err(invalid(op, "range length is not finite"));
    }
    Ok(n.max(0.0) as usize)
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    #[test]
    fn shape_with_clamped_range() {
        let x = f32s(&[2, 3, 4], &[0.0; 24]);
        let sh = |start, end| {
            eval(&Op::Shape { start, end }, &[&x]).unwrap()[0]
                .as_i64()
                .unwrap()
                .to_vec()
        };
        assert_eq!(sh(0, None), vec![2, 3, 4]);
        assert_eq!(sh(-1, None), vec![4]);
        assert_eq!(sh(1, Some(-1)), vec![3]);
        assert_eq!(sh(-10, Some(10)), vec![2, 3, 4]);
        assert_eq!(sh(2, Some(1)), Vec::<i64>::new());
        let t = infer(&Op::Shape { start: 1, end: None }, &[ty(DType::F32, "b s 8")]).unwrap();
        assert_eq!(t[0], ty(DType::I64, "2"));
        assert_eq!(eval(&Op::Size, &[&x]).unwrap()[0], Value::scalar_i64(24));
    }

    #[test]
    fn constant_of_shape() {
        let shape = i64s(&[2], &[2, 1]);
        let op = Op::ConstantOfShape {
            value: Some(ScalarValue {
                dtype: DType::I32,
                value: 7.0,
            }),
        };
        let out = eval(&op, &[&shape]).unwrap();
        assert_eq!(
            (
                out[0].dtype,
                out[0].shape.clone(),
                out[0].as_i64().unwrap().to_vec()
            ),
            (DType::I32, vec![2, 1], vec![7, 7])
        );
        let scalar = eval(&Op::ConstantOfShape { value: None }, &[&i64s(&[0], &[])]).unwrap();
        assert_eq!(scalar[0], Value::f32(vec![], vec![0.0]).unwrap());
        assert!(matches!(
            infer(&Op::ConstantOfShape { value: None }, &[ty(DType::I64, "2")]),
            Err(OpError::NotConstant { input: 0, .. })
        ));
    }

    #[test]
    fn range_for_ints_and_floats() {
        let i = |v| ints(DType::I32, &[], &[v]);
        assert_eq!(
            eval1(&Op::Range, &[&i(10), &i(4), &i(-3)]),
            (vec![2], vec![10.0, 7.0])
        );
        let f = |v| f32s(&[], &[v]);
        assert_eq!(eval1(&Op::Range, &[&f(1.0), &f(2.0), &f(0.3)]).0, vec![4]);
        let h = |v| Value::new(DType::F16, vec![], Data::F32(vec![v])).unwrap();
        let out = eval(&Op::Range, &[&h(0.0), &h(0.5), &h(0.1)]).unwrap();
        assert_eq!(out[0].dtype, DType::F16);
        assert_eq!(out[0].to_f64_vec()[1], half::f16::from_f64(0.1).to_f64());
        assert_op_err(eval(&Op::Range, &[&i(0), &i(4), &i(0)]), "Range", "delta is zero");
        assert!(matches!(
            infer(
                &Op::Range,
                &[ty(DType::I64, ""), ty(DType::I64, ""), ty(DType::I64, "")]
            ),
            Err(OpError::NotConstant { .. })
        ));
    }
}

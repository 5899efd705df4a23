//! Softmax and normalisation: `Softmax`, `LogSoftmax` (one axis, opset 13),
//! `LayerNorm` (ONNX LayerNormalization, output 0 only) and `RmsNorm`
//! (ONNX RMSNormalization). Statistics are computed in the storage precision
//! (`f32` for `f16`/`bf16`, matching ONNX's default `stash_type`).

use super::broadcast::{broadcast_shapes, source_index};
use super::kernel_util::{
    finish, float_kernel, invalid, norm_axis, numel, prod, EvalCtx, InferCtx, Real, Rows,
};
use super::{OpError, TensorType};
use crate::{Shape, Value};

/// FLOPs per element: softmax (max, subtract, exp, sum, divide).
const SOFTMAX_FLOPS: f64 = 5.0;
/// FLOPs per element: layer norm (mean, centre, square, sum, scale, shift…).
const LAYER_NORM_FLOPS: f64 = 8.0;
/// FLOPs per element: RMS norm (square, sum, scale, multiply).
const RMS_NORM_FLOPS: f64 = 6.0;

/// `Softmax`/`LogSoftmax`: float input of rank ≥ 1, same type out.
pub(super) fn infer_softmax(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.float(0)?;
    norm_axis(cx.op, axis, x.shape.rank())?;
    Ok(vec![x.clone()])
}

/// Softmax (or log-softmax) of `x` along rows, written into a new buffer.
fn softmax_rows<T: Real>(x: &[T], rows: &Rows, log: bool) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    let mut idx = Vec::with_capacity(rows.n);
    for base in rows.starts() {
        idx.clear();
        idx.extend((0..rows.n).map(|j| base + j * rows.inner));
        let max = idx
            .iter()
            .fold(T::neg_infinity(), |m, &i| if x[i] > m { x[i] } else { m });
        let mut sum = T::zero();
        for &i in &idx {
            let e = (x[i] - max).exp();
            out[i] = e;
            sum += e;
        }
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

/// Reference kernel for `Softmax` and `LogSoftmax`.
pub(super) fn eval_softmax(cx: &EvalCtx, axis: i64, log: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let rows = Rows::along(&x.shape, norm_axis(cx.op, axis, x.shape.len())?);
    let data = float_kernel!(cx.op, x, T => softmax_rows(cx.floats::<T>(0)?, &rows, log));
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

/// `LayerNorm(x, scale, bias?)` / `RmsNorm(x, scale)`: scale and bias
/// broadcast to the normalised dims `axis..`.
pub(super) fn infer_norm(cx: &InferCtx, axis: i64, with_bias: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, if with_bias { 3 } else { 2 })?;
    let x = cx.float(0)?;
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    let normalized = Shape(x.shape.0[a..].to_vec());
    for i in 1..cx.inputs.len() {
        let Some(p) = cx.opt(i) else { continue };
        cx.same_dtype(0, i)?;
        if broadcast_shapes(cx.op, &[&normalized, &p.ty.shape])? != normalized {
            return Err(invalid(
                cx.op,
                format!(
                    "input {i} shape {} does not broadcast to {normalized}",
                    p.ty.shape
                ),
            ));
        }
    }
    Ok(vec![x.clone()])
}

/// A normalised row's `(mean, 1/√(var + ε))`, the mean zero for RMS
/// (`centre = false`); the backward pass recomputes them the same way.
pub(super) fn row_stats<T: Real>(row: &[T], centre: bool, epsilon: f64) -> (T, T) {
    let count = T::lit(row.len().max(1) as f64);
    let mean = if centre {
        row.iter().copied().sum::<T>() / count
    } else {
        T::zero()
    };
    let var = row.iter().map(|&v| (v - mean) * (v - mean)).sum::<T>() / count;
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
    let mut out = vec![T::zero(); x.len()];
    for (row, y) in x.chunks(n.max(1)).zip(out.chunks_mut(n.max(1))) {
        let (mean, inv) = row_stats(row, centre, epsilon);
        for (j, (o, &v)) in y.iter_mut().zip(row).enumerate() {
            *o = (v - mean) * inv * scale[j];
            if let Some(b) = &bias {
                *o += b[j];
            }
        }
    }
    Ok(out)
}

/// Reference kernel for `LayerNorm` (`centre = true`) and `RmsNorm`.
pub(super) fn eval_norm(cx: &EvalCtx, axis: i64, epsilon: f64, centre: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let a = norm_axis(cx.op, axis, x.shape.len())?;
    let data = float_kernel!(cx.op, x, T => norm_kernel::<T>(cx, a, epsilon, centre)?);
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

/// Which normalisation is being priced.
#[derive(Clone, Copy)]
pub(super) enum NormKind {
    Softmax,
    Layer,
    Rms,
}

/// FLOPs of a softmax/normalisation over `x`; backward about the forward.
pub(super) fn flops(kind: NormKind, x: Option<&TensorType>) -> (f64, f64) {
    let per = match kind {
        NormKind::Softmax => SOFTMAX_FLOPS,
        NormKind::Layer => LAYER_NORM_FLOPS,
        NormKind::Rms => RMS_NORM_FLOPS,
    };
    let f = x.map_or(0.0, numel) * per;
    (f, f)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;
    use crate::DType;

    #[test]
    fn softmax_and_log_softmax() {
        let x = f32s(&[1, 3], &[1.0, 2.0, 3.0]);
        assert_close(
            &eval1(&Op::Softmax { axis: -1 }, &[&x]).1,
            &[0.090031, 0.244728, 0.665241],
            1e-6,
        );
        assert_close(
            &eval1(&Op::LogSoftmax { axis: 1 }, &[&x]).1,
            &[-2.407606, -1.407606, -0.407606],
            1e-6,
        );
        let y = f32s(&[2, 2], &[0.0, 1.0, 0.0, 1.0]);
        assert_close(
            &eval1(&Op::Softmax { axis: 0 }, &[&y]).1,
            &[0.5, 0.5, 0.5, 0.5],
            1e-7,
        );
        assert_op_err(
            infer(&Op::Softmax { axis: 2 }, &[ty(DType::F32, "b s")]),
            "Softmax",
            "axis 2 is out of range for rank 2",
        );
    }

    #[test]
    fn layer_norm_over_trailing_dims() {
        let op = Op::LayerNorm {
            axis: -1,
            epsilon: 0.0,
        };
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 2.0, 2.0, 2.0]);
        let scale = f32s(&[3], &[1.0, 1.0, 2.0]);
        let bias = f32s(&[3], &[0.0, 1.0, 0.0]);
        let out = eval1(&op, &[&x, &scale, &bias]).1;
        assert_close(&out[..3], &[-1.224745, 1.0, 2.449490], 1e-5);
        assert!(out[3].is_nan(), "zero variance with epsilon 0 divides by zero");
        let no_bias = eval1(
            &Op::LayerNorm {
                axis: 0,
                epsilon: 1e-5,
            },
            &[&x, &f32s(&[], &[1.0])],
        )
        .1;
        assert_close(&no_bias[3..], &[0.0, 0.0, 0.0], 1e-6);
        let sym = infer(&op, &[ty(DType::F32, "b s 8"), ty(DType::F32, "8")]).unwrap();
        assert_eq!(sym[0], ty(DType::F32, "b s 8"));
        assert_op_err(
            infer(&op, &[ty(DType::F32, "b s 8"), ty(DType::F32, "4")]),
            "LayerNorm",
            "shapes [8] and [4] do not broadcast",
        );
    }

    #[test]
    fn rms_norm() {
        let op = Op::RmsNorm {
            axis: -1,
            epsilon: 0.0,
        };
        let x = f32s(&[1, 2], &[3.0, 4.0]);
        let scale = f32s(&[2], &[1.0, 2.0]);
        assert_close(&eval1(&op, &[&x, &scale]).1, &[0.848528, 2.262742], 1e-5);
        assert!(matches!(
            infer(&op, &[ty(DType::F32, "2")]),
            Err(OpError::Arity { .. })
        ));
    }
}

//! `NormGrad(x, scale, dout)` → `(dx, dout·x̂)`: the adjoint of `LayerNorm`
//! (`centre`) and `RmsNorm` with respect to `x`, plus the product whose sums
//! over the broadcast dims are the scale's gradient. Per row of the
//! normalised dims, with the statistics recomputed as the forward kernel
//! computes them (`x̂ = (x − mean)·inv`, `inv = 1/√(var + ε)`, no mean for
//! RMS) and `ĝ = dout·scale`:
//! `dx = inv·(ĝ − x̂·mean(ĝ·x̂) − mean(ĝ))` (no `mean(ĝ)` term for RMS).
//! One op instead of the dozen elementwise ops and reductions the formula
//! composes into, each a pass over the activations.

use super::super::adjoint::check_grad_like;
use super::super::broadcast::source_index;
use super::super::context::{norm_axis, EvalCtx, InferCtx};
use super::super::geometry::{numel, prod};
use super::super::norm::infer_norm;
use super::super::numeric::{lane_dot, lane_sum_slice, vectorized, Real};
use super::super::threads::in_group_runs;
use super::super::{OpError, TensorType};
use super::kernel::row_stats;

/// FLOPs per element: statistics, `x̂`, `ĝ`, two row means and `dx`.
const NORM_GRAD_FLOPS: f64 = 14.0;

/// Types of `(dx, dout·x̂)`: `x`'s, and `x`'s shape in the stash type, after
/// checking `(x, scale)` as the forward op does and `dout` against `x`.
pub(super) fn infer(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 3)?;
    let forward = [cx.opt(0), cx.opt(1)];
    let out = infer_norm(
        &InferCtx {
            op: cx.op,
            inputs: &forward,
        },
        axis,
        false,
    )?;
    check_grad_like(cx, 2, &out[0])?;
    let x = out[0].clone();
    let product = TensorType {
        dtype: x.dtype.stash_type(),
        shape: x.shape.clone(),
    };
    Ok(vec![x, product])
}

/// Reference kernel: `[dx, dout·x̂]`.
pub(super) fn kernel<T: Real>(
    cx: &EvalCtx,
    axis: i64,
    epsilon: f64,
    centre: bool,
) -> Result<Vec<Vec<T>>, OpError> {
    let x_val = cx.input(0)?;
    let (x, dout) = (cx.floats::<T>(0)?, cx.floats::<T>(2)?);
    let normalized = &x_val.shape[norm_axis(cx.op, axis, x_val.shape.len())?..];
    let n = prod(normalized).max(1);
    let scale_val = cx.input(1)?;
    let scale_data = cx.floats::<T>(1)?;
    let scale: Vec<T> = source_index(&scale_val.shape, normalized)
        .into_iter()
        .map(|j| scale_data[j])
        .collect();
    let count = T::lit(n as f64);
    let rows = x.len() / n;
    let mut dx = vec![T::zero(); x.len()];
    let mut product = vec![T::zero(); x.len()];
    // Runs of rows over the rank's threads, each with its own scratch rows.
    in_group_runs(
        rows,
        cx.row_ways,
        vec![&mut dx[..], &mut product[..]],
        &[n, n],
        |r, mut outs| {
            let [dx, product] = &mut outs[..] else {
                unreachable!("two outputs")
            };
            let part = r.start * n..r.end * n;
            let (x, dout) = (&x[part.clone()], &dout[part]);
            let mut xhat = vec![T::zero(); n];
            let mut gh = vec![T::zero(); n];
            let rows = x
                .chunks(n)
                .zip(dout.chunks(n))
                .zip(dx.chunks_mut(n).zip(product.chunks_mut(n)));
            vectorized(|| {
                for ((row, drow), (dxr, pr)) in rows {
                    let (mean, inv) = row_stats(row, centre, epsilon);
                    for j in 0..row.len() {
                        xhat[j] = (row[j] - mean) * inv;
                        gh[j] = drow[j] * scale[j];
                        pr[j] = drow[j] * xhat[j];
                    }
                    // The row sums in lanes ([`lane_dot`], [`lane_sum_slice`]).
                    let proj = lane_dot(&gh, &xhat) / count;
                    let mean_gh = if centre {
                        lane_sum_slice(&gh) / count
                    } else {
                        T::zero()
                    };
                    for j in 0..row.len() {
                        dxr[j] = inv * ((gh[j] - xhat[j] * proj) - mean_gh);
                    }
                }
            });
            Ok(())
        },
    )?;
    Ok(vec![dx, product])
}

/// FLOPs of `NormGrad` over `x`.
pub(super) fn flops(x: Option<&TensorType>) -> f64 {
    x.map_or(0.0, numel) * NORM_GRAD_FLOPS
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::*;
    use super::super::super::Op;
    use crate::{DType, Value};

    fn f64s(shape: &[usize], data: &[f64]) -> Value {
        Value::f64(shape.to_vec(), data.to_vec()).unwrap()
    }

    #[test]
    fn layer_norm_gradient_of_one_row_by_hand() {
        // x = [1, 2, 3]: mean 2, var 2/3; scale 1 and dout = [1, 0, 0], so
        // ĝ = dout and mean(ĝ) = 1/3.
        let op = Op::NormGrad {
            axis: -1,
            epsilon: 0.0,
            centre: true,
        };
        let x = f64s(&[1, 3], &[1.0, 2.0, 3.0]);
        let scale = f64s(&[3], &[1.0, 1.0, 1.0]);
        let dout = f64s(&[1, 3], &[1.0, 0.0, 0.0]);
        let outs = eval(&op, &[&x, &scale, &dout]).unwrap();
        // x̂ = [-r, 0, r] with r = √1.5; mean(ĝ·x̂) = -r/3; dx = r·(ĝ − x̂·mean(ĝ·x̂) − 1/3).
        let (r, third) = (1.5f64.sqrt(), 1.0 / 3.0);
        let proj = -r * third;
        let want_dx = [
            r * (1.0 - (-r) * proj - third),
            r * (0.0 - 0.0 - third),
            r * (0.0 - r * proj - third),
        ];
        assert_close(&outs[0].to_f64_vec(), &want_dx, 1e-12);
        assert_close(&outs[1].to_f64_vec(), &[-r, 0.0, 0.0], 1e-12);
        // The gradients of a row sum to zero (a shift of x changes nothing).
        assert!(want_dx.iter().sum::<f64>().abs() < 1e-12);
    }

    #[test]
    fn types_follow_x_with_the_product_in_the_stash_type() {
        let op = Op::NormGrad {
            axis: -1,
            epsilon: 1e-5,
            centre: false,
        };
        let x = ty(DType::Bf16, "b 8");
        let out = infer(&op, &[x.clone(), ty(DType::Bf16, "8"), x.clone()]).unwrap();
        assert_eq!(out[0], x);
        assert_eq!(out[1].dtype, DType::F32);
        let wrong = infer(&op, &[x.clone(), ty(DType::Bf16, "8"), ty(DType::Bf16, "b 4")]);
        assert!(wrong.unwrap_err().to_string().contains("output gradient"));
        assert_op_err(
            infer(&op, &[x.clone(), ty(DType::Bf16, "3"), x]),
            "NormGrad",
            "shapes [8] and [3] do not broadcast",
        );
    }
}

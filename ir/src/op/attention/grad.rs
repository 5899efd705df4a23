//! `AttentionGrad(q, k, v, dout, mask?, positions?)` → `(dq, dk, dv, dmask?)`: the adjoint of
//! `Attention`, with the forward's exact masking (it reuses the forward's
//! bias and softmax). Per (batch, query head), with `P` the probabilities:
//! `dV += Pᵀ·dO`, `dS = P ⊙ (dO·Vᵀ − rowsum(P ⊙ dO·Vᵀ))`,
//! `dQ = scale·dS·K`, `dK += scale·dSᵀ·Q`; grouped query heads accumulate
//! into their shared key/value head. Masked scores and fully masked rows
//! have `P = 0`, hence no gradient. A float mask is added to the scores, so
//! its gradient is `dS`, summed where the mask was broadcast.

use super::super::adjoint::check_grad_like;
use super::super::attention::infer_attention;
use super::super::context::{invalid, EvalCtx, InferCtx};
use super::super::gemm::{gemm, Mat};
use super::super::geometry::dim;
use super::super::numeric::Real;
use super::super::{OpError, TensorType};
use super::kernel::{head_bias, masked_softmax, query_positions, MaskView};

/// FLOPs per score: the softmax recomputed and `dS` from `dP`.
const SCORE_FLOPS: f64 = 8.0;

/// Types of `(dq, dk, dv, dmask?)`: those of `(q, k, v, mask?)`, after
/// checking the forward inputs as `Attention` does and `dout` against its
/// output; `mask_grad` needs a float mask.
pub(super) fn infer(cx: &InferCtx, causal: bool, mask_grad: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(4, 6)?;
    let forward = [cx.opt(0), cx.opt(1), cx.opt(2), cx.opt(4), cx.opt(5)];
    let n = (3..5).rev().find(|&i| forward[i].is_some()).map_or(3, |i| i + 1);
    let out = infer_attention(
        &InferCtx {
            op: cx.op,
            inputs: &forward[..n],
        },
        causal,
    )?;
    check_grad_like(cx, 3, &out[0])?;
    let mut types = vec![cx.ty(0)?.clone(), cx.ty(1)?.clone(), cx.ty(2)?.clone()];
    if mask_grad {
        let mask = cx.opt(4).filter(|m| m.ty.dtype.is_float());
        let mask = mask.ok_or_else(|| invalid(cx.op, "mask_grad needs a float mask (input 4)"))?;
        types.push(mask.ty.clone());
    }
    Ok(types)
}

/// Adds the score gradients `ds[sq, sk]` of one (batch, head) to the
/// gradient of the mask element each score read.
fn add_mask_grad<T: Real>(mask: &MaskView, dmask: &mut [T], ds: &[T], (bi, hi): (usize, usize), sk: usize) {
    let st = &mask.strides;
    let base = bi as isize * st[0] + hi as isize * st[1];
    for (i, row) in ds.chunks(sk.max(1)).enumerate() {
        for (j, &g) in row.iter().enumerate().take(mask.len) {
            dmask[(base + i as isize * st[2] + j as isize * st[3]) as usize] += g;
        }
    }
}

/// Reference kernel: `[dq, dk, dv, dmask?]`.
pub(super) fn kernel<T: Real>(
    cx: &EvalCtx,
    scale: Option<f64>,
    causal: bool,
    mask_grad: bool,
) -> Result<Vec<Vec<T>>, OpError> {
    let (q, k, v) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?, cx.floats::<T>(2)?);
    let dout = cx.floats::<T>(3)?;
    let [b, hq, sq, d] = cx.input(0)?.shape[..] else {
        return Err(invalid(cx.op, "query must be 4-D"));
    };
    let (hk, sk) = (cx.input(1)?.shape[1], cx.input(1)?.shape[2]);
    let dv = cx.input(2)?.shape[3];
    let group = (hq / hk.max(1)).max(1);
    let scale = T::lit(scale.unwrap_or(1.0 / (d as f64).sqrt()));
    let mask = cx.opt(4).map(|m| MaskView::new(m, b, hq, sq));
    let positions = query_positions(cx, 5, sq)?;
    let (mut dq, mut dk, mut dvs) = (
        vec![T::zero(); q.len()],
        vec![T::zero(); k.len()],
        vec![T::zero(); v.len()],
    );
    let mut p = vec![T::zero(); sq * sk];
    let mut ds = vec![T::zero(); sq * sk];
    let mut dmask = match (&mask, mask_grad) {
        (Some(m), true) => Some(vec![T::zero(); m.value.data.len()]),
        _ => None,
    };
    let row = sk.max(1);
    for bi in 0..b {
        for hi in 0..hq {
            let (qo, oo) = ((bi * hq + hi) * sq * d, (bi * hq + hi) * sq * dv);
            let kh = bi * hk + hi / group;
            let (ko, vo) = (kh * sk * d, kh * sk * dv);
            let (qm, km) = (Mat::row_major(q, qo, d, false), Mat::row_major(k, ko, d, false));
            let om = Mat::row_major(dout, oo, dv, false);
            gemm(
                cx.op,
                sq,
                d,
                sk,
                scale,
                qm,
                Mat::row_major(k, ko, d, true),
                T::zero(),
                &mut p,
                0,
            )?;
            let (bias, masked) =
                head_bias::<T>(mask.as_ref(), bi, hi, (sq, sk), causal, positions.as_deref());
            for (i, r) in p.chunks_mut(row).enumerate() {
                masked_softmax(r, &bias[i * sk..(i + 1) * sk], masked[i]);
            }
            let pt = Mat::row_major(&p[..], 0, sk, true);
            gemm(cx.op, sk, sq, dv, T::one(), pt, om, T::one(), &mut dvs, vo)?;
            let vt = Mat::row_major(v, vo, dv, true);
            gemm(cx.op, sq, dv, sk, T::one(), om, vt, T::zero(), &mut ds, 0)?;
            for (pr, dr) in p.chunks(row).zip(ds.chunks_mut(row)) {
                let dot: T = pr.iter().zip(dr.iter()).map(|(&a, &g)| a * g).sum();
                for (g, &a) in dr.iter_mut().zip(pr) {
                    *g = a * (*g - dot);
                }
            }
            if let (Some(m), Some(dm)) = (&mask, &mut dmask) {
                add_mask_grad(m, dm, &ds, (bi, hi), sk);
            }
            let dsm = Mat::row_major(&ds[..], 0, sk, false);
            gemm(cx.op, sq, sk, d, scale, dsm, km, T::zero(), &mut dq, qo)?;
            let dst = Mat::row_major(&ds[..], 0, sk, true);
            gemm(cx.op, sk, sq, d, scale, dst, qm, T::one(), &mut dk, ko)?;
        }
    }
    Ok([dq, dk, dvs].into_iter().chain(dmask).collect())
}

/// FLOPs: `QKᵀ` recomputed, then `dV`, `dP`, `dQ` and `dK`, two FLOPs per
/// multiply-add each, plus the per-score softmax work.
pub(super) fn flops(inputs: &[Option<&TensorType>]) -> f64 {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (get(0), get(1), get(2)) else {
        return 0.0;
    };
    let scores = dim(q, 0) * dim(q, 1) * dim(q, 2) * dim(k, 2);
    2.0 * scores * (3.0 * dim(q, 3) + 2.0 * dim(v, 3)) + SCORE_FLOPS * scores
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::*;
    use super::super::super::Op;
    use crate::{DType, Value};

    fn grad(causal: bool) -> Op {
        Op::AttentionGrad {
            scale: None,
            causal,
            mask_grad: false,
        }
    }

    #[test]
    fn infers_the_input_types_and_checks_dout() {
        let t = |s| ty(DType::F32, s);
        let out = infer(
            &grad(true),
            &[t("b 4 s 8"), t("b 2 t 8"), t("b 2 t 16"), t("b 4 s 16")],
        )
        .unwrap();
        assert_eq!(out, vec![t("b 4 s 8"), t("b 2 t 8"), t("b 2 t 16")]);
        let mask = ty(DType::Bool, "s t");
        let with_mask = [t("b 4 s 8"), t("b 2 t 8"), t("b 2 t 16"), t("b 4 s 16"), mask];
        assert!(infer(&grad(false), &with_mask).is_ok());
        // A mask gradient needs a float mask, and has its type.
        let mask_grad = Op::AttentionGrad {
            scale: None,
            causal: false,
            mask_grad: true,
        };
        assert_op_err(
            infer(&mask_grad, &with_mask),
            "AttentionGrad",
            "mask_grad needs a float mask (input 4)",
        );
        let mut float_mask = with_mask.to_vec();
        float_mask[4] = t("1 t");
        assert_eq!(infer(&mask_grad, &float_mask).unwrap()[3], t("1 t"));
        assert_op_err(
            infer(
                &grad(false),
                &[t("b 4 s 8"), t("b 2 t 8"), t("b 2 t 16"), t("b 4 s 8")],
            ),
            "AttentionGrad",
            "output gradient (input 3) is f32[b, 4, s, 8] but the forward output is f32[b, 4, s, 16]",
        );
        assert_op_err(
            infer(
                &grad(false),
                &[t("b 3 s 8"), t("b 2 t 8"), t("b 2 t 8"), t("b 3 s 8")],
            ),
            "AttentionGrad",
            "3 query heads are not a multiple of 2 key heads",
        );
    }

    #[test]
    fn one_query_two_keys() {
        // q = [0], k = [[0], [0]]: P = [½, ½]; v = [1, 3], dO = 1 →
        // dV = [½, ½], dP = [1, 3], dS = ½·([1, 3] − 2) = [−½, ½],
        // dQ = dS·K = 0, dK = dSᵀ·q = 0 (scale 1).
        let q = f32s(&[1, 1, 1, 1], &[0.0]);
        let k = f32s(&[1, 1, 2, 1], &[0.0, 0.0]);
        let v = f32s(&[1, 1, 2, 1], &[1.0, 3.0]);
        let dout = f32s(&[1, 1, 1, 1], &[1.0]);
        let op = Op::AttentionGrad {
            scale: Some(1.0),
            causal: false,
            mask_grad: false,
        };
        let out = eval(&op, &[&q, &k, &v, &dout]).unwrap();
        assert_close(&out[0].to_f64_vec(), &[0.0], 1e-7);
        assert_close(&out[1].to_f64_vec(), &[0.0, 0.0], 1e-7);
        assert_close(&out[2].to_f64_vec(), &[0.5, 0.5], 1e-7);
        // q = [1], k = [[1], [0]] with scale 1: dQ = dS·K = dS[0] and
        // dK = dS·q, where dS sums to zero.
        let q1 = f32s(&[1, 1, 1, 1], &[1.0]);
        let k1 = f32s(&[1, 1, 2, 1], &[1.0, 0.0]);
        let out = eval(&op, &[&q1, &k1, &v, &dout]).unwrap();
        let p0 = 1.0 / (1.0 + (-1.0f64).exp());
        let ds0 = p0 * (1.0 - (p0 + 3.0 * (1.0 - p0)));
        assert_close(&out[0].to_f64_vec(), &[ds0], 1e-6);
        assert_close(&out[1].to_f64_vec(), &[ds0, -ds0], 1e-6);
    }

    #[test]
    fn float_mask_gradient_sums_over_broadcast_queries() {
        // Two queries like the one above, each with dS = [−½, ½]; the
        // mask [2] is shared by both, so its gradient is their sum.
        let q = f32s(&[1, 1, 2, 1], &[0.0, 0.0]);
        let k = f32s(&[1, 1, 2, 1], &[0.0, 0.0]);
        let v = f32s(&[1, 1, 2, 1], &[1.0, 3.0]);
        let dout = f32s(&[1, 1, 2, 1], &[1.0, 1.0]);
        let mask = f32s(&[2], &[0.0, 0.0]);
        let op = Op::AttentionGrad {
            scale: Some(1.0),
            causal: false,
            mask_grad: true,
        };
        let out = eval(&op, &[&q, &k, &v, &dout, &mask]).unwrap();
        assert_eq!(out.len(), 4);
        assert_close(&out[3].to_f64_vec(), &[-1.0, 1.0], 1e-7);
    }

    #[test]
    fn masked_rows_and_grouped_heads() {
        // Causal: query 0 sees key 0 only (P = [1, 0]), so dV[1] gets
        // nothing from it; a bool mask hiding every key zeroes everything.
        let q = Value::f64(vec![1, 2, 2, 1], vec![0.5, -0.5, 1.0, 2.0]).unwrap();
        let k = Value::f64(vec![1, 1, 2, 1], vec![0.3, 0.7]).unwrap();
        let v = Value::f64(vec![1, 1, 2, 1], vec![1.0, 2.0]).unwrap();
        let dout = Value::f64(vec![1, 2, 2, 1], vec![1.0, 0.0, 1.0, 0.0]).unwrap();
        let out = eval(&grad(true), &[&q, &k, &v, &dout]).unwrap();
        // Only query row 0 of both heads has a gradient, and it sees key 0.
        assert_close(&out[2].to_f64_vec(), &[2.0, 0.0], 1e-12);
        assert_close(&out[0].to_f64_vec(), &[0.0; 4], 1e-12);
        let none = bools(&[1], &[false]);
        let out = eval(&grad(false), &[&q, &k, &v, &dout, &none]).unwrap();
        assert!(out.iter().all(|o| o.to_f64_vec().iter().all(|&x| x == 0.0)));
        assert_eq!(out[0].dtype, DType::F64);
    }

    #[test]
    fn cost_counts_five_products() {
        let (q, o) = (ty(DType::F32, "2 4 8 16"), ty(DType::F32, "2 4 8 16"));
        let c = grad(true).cost(&[Some(&q), Some(&q), Some(&q), Some(&o)], &[&q, &q, &q]);
        let scores = 2.0 * 4.0 * 8.0 * 8.0;
        assert_eq!(c.forward_flops, 2.0 * scores * 5.0 * 16.0 + 8.0 * scores);
        assert_eq!(c.backward_flops, 0.0);
    }
}

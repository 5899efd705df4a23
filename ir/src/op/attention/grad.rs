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
use super::super::numeric::{vectorized, Real};
use super::super::threads::{attention_ways, in_group_runs, kernel_threads};
use super::super::{OpError, TensorType};
use super::kernel::{
    block_probabilities, blocks, head_bias, key_limits, query_positions, Block, MaskView, ROW_BLOCK,
};

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

/// Adds the score gradients `ds` of one (batch, head)'s block of query
/// rows from `i0` (`kn` to a row) to the gradient of the mask element each
/// score read.
fn add_mask_grad<T: Real>(
    mask: &MaskView,
    dmask: &mut [T],
    ds: &[T],
    (bi, hi, i0): (usize, usize, usize),
    kn: usize,
) {
    let st = &mask.strides;
    let base = bi as isize * st[0] + hi as isize * st[1];
    for (i, row) in ds.chunks(kn).enumerate() {
        for (j, &g) in row.iter().enumerate().take(mask.len) {
            dmask[(base + (i0 + i) as isize * st[2] + j as isize * st[3]) as usize] += g;
        }
    }
}

/// What every group of the adjoint reads: the forward's inputs and
/// geometry, `dout`, and which keys each query row sees.
struct Inputs<'a, T> {
    op: &'a str,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    dout: &'a [T],
    /// `[b, hq, sq, d]`, key/value heads, keys and value width.
    dims: ([usize; 4], usize, usize, usize),
    scale: T,
    mask: Option<MaskView<'a>>,
    limits: Vec<usize>,
}

/// Reference kernel: `[dq, dk, dv, dmask?]`, per (batch, query head) and
/// block of query rows as the forward pass runs ([`ROW_BLOCK`]), over the
/// keys the rows may see; the (batch, key/value head) groups split over
/// this thread's [`kernel_threads`] ([`attention_ways`]).
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
    let mask = cx.opt(4).map(|m| MaskView::new(m, b, hq, sq));
    let positions = query_positions(cx, 5, sq)?;
    let limits = key_limits(
        (sq, sk),
        causal,
        positions.as_deref(),
        mask.as_ref().map(|m| m.len),
    );
    let (mut dq, mut dk, mut dvs) = (
        vec![T::zero(); q.len()],
        vec![T::zero(); k.len()],
        vec![T::zero(); v.len()],
    );
    let mut dmask = match (&mask, mask_grad) {
        (Some(m), true) => Some(vec![T::zero(); m.value.data.len()]),
        _ => None,
    };
    let x = Inputs {
        op: cx.op,
        q,
        k,
        v,
        dout,
        dims: ([b, hq, sq, d], hk, sk, dv),
        scale: T::lit(scale.unwrap_or(1.0 / (d as f64).sqrt())),
        mask,
        limits,
    };
    let group = (hq / hk.max(1)).max(1);
    let outputs = vec![&mut dq[..], &mut dk[..], &mut dvs[..]];
    let (qs, ks) = (&cx.input(0)?.shape, &cx.input(1)?.shape);
    let ways = attention_ways(qs, ks, dmask.is_some(), kernel_threads());
    match &mut dmask {
        // One way (`attention_ways`): every group adds to the mask's gradient.
        Some(dm) => group_run(&x, 0..b * hk, outputs, Some(dm))?,
        None => {
            let per_group = [group * sq * d, sk * d, sk * dv];
            in_group_runs(b * hk, ways, outputs, &per_group, |run, outs| {
                group_run(&x, run, outs, None)
            })?;
        }
    }
    Ok([dq, dk, dvs].into_iter().chain(dmask).collect())
}

/// The adjoint of the (batch, key/value head) groups `run`, into their
/// parts of `[dq, dk, dv]` (and of the whole mask gradient when given).
fn group_run<T: Real>(
    x: &Inputs<T>,
    run: std::ops::Range<usize>,
    mut outs: Vec<&mut [T]>,
    mut dmask: Option<&mut [T]>,
) -> Result<(), OpError> {
    let ([_, hq, sq, d], hk, sk, dv) = x.dims;
    let group = (hq / hk.max(1)).max(1);
    let (op, scale) = (x.op, x.scale);
    let block = ROW_BLOCK.min(sq) * sk;
    let (mut p, mut ds) = (vec![T::zero(); block], vec![T::zero(); block]);
    let [dq, dk, dvs] = &mut outs[..] else {
        return Err(invalid(
            op,
            "internal error: attention's adjoint needs three outputs",
        ));
    };
    for (n, g) in run.enumerate() {
        let (bi, kh) = (g / hk, g % hk);
        let (ko, vo) = (g * sk * d, g * sk * dv);
        let (dko, dvo) = (n * sk * d, n * sk * dv);
        for j in 0..group {
            let (hi, head) = (kh * group + j, g * group + j);
            let bias = x.mask.as_ref().map(|m| head_bias::<T>(m, bi, hi, sk, &x.limits));
            for block in blocks(&x.limits) {
                let Block { i0, rows, kn, .. } = block;
                let (qo, oo) = ((head * sq + i0) * d, (head * sq + i0) * dv);
                let dqo = ((n * group + j) * sq + i0) * d;
                let (p, ds) = (&mut p[..rows * kn], &mut ds[..rows * kn]);
                let qm = Mat::row_major(x.q, qo, d, false);
                let om = Mat::row_major(x.dout, oo, dv, false);
                let kt = Mat::row_major(x.k, ko, d, true);
                block_probabilities(op, &block, (qm, kt), d, scale, bias.as_deref(), sk, p)?;
                let pt = Mat::row_major(&p[..], 0, kn, true);
                gemm(op, kn, rows, dv, T::one(), pt, om, T::one(), dvs, dvo)?;
                let vt = Mat::row_major(x.v, vo, dv, true);
                gemm(op, rows, dv, kn, T::one(), om, vt, T::zero(), ds, 0)?;
                vectorized(|| {
                    for (pr, dr) in p.chunks(kn).zip(ds.chunks_mut(kn)) {
                        let dot = pr
                            .iter()
                            .zip(dr.iter())
                            .fold(T::zero(), |acc, (&a, &g)| acc + a * g);
                        for (g, &a) in dr.iter_mut().zip(pr) {
                            *g = a * (*g - dot);
                        }
                    }
                });
                if let (Some(m), Some(dm)) = (&x.mask, dmask.as_deref_mut()) {
                    add_mask_grad(m, dm, ds, (bi, hi, i0), kn);
                }
                let dsm = Mat::row_major(&ds[..], 0, kn, false);
                let km = Mat::row_major(x.k, ko, d, false);
                gemm(op, rows, kn, d, scale, dsm, km, T::zero(), dq, dqo)?;
                let dst = Mat::row_major(&ds[..], 0, kn, true);
                gemm(op, kn, rows, d, scale, dst, qm, T::one(), dk, dko)?;
            }
        }
    }
    Ok(())
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

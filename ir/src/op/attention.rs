//! `Attention` (ONNX Attention-23 for 4-D inputs) and `RotaryEmbedding`
//! (ONNX RotaryEmbedding-23).
//!
//! Attention masking follows the ONNX reference: a bool mask keeps `true`, a
//! float mask is added, a mask shorter than the key length is padded with
//! "masked", `causal` hides keys `j > i` (upper-left aligned, no cache
//! offset), and a query row whose bias masks every key outputs zeros.

use super::broadcast::{broadcast_shapes, broadcast_strides};
use super::kernel_util::{
    dim, finish, float_kernel, gemm, invalid, numel, tensor, EvalCtx, InferCtx, Mat, Real,
};
use super::{OpError, TensorType};
use crate::{DType, Data, Dim, Shape, Value};

/// FLOPs per attention score for the masked softmax.
const SCORE_SOFTMAX_FLOPS: f64 = 5.0;
/// FLOPs per rotated element (two products and a sum per output).
const ROTARY_FLOPS: f64 = 3.0;

fn agree(cx: &InferCtx, what: &str, a: &Dim, b: &Dim) -> Result<(), OpError> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) if x != y => {
            Err(invalid(cx.op, format!("{what} differ ({a} vs {b})")))
        }
        (Dim::Sym(x), Dim::Sym(y)) if x != y => Err(invalid(cx.op, format!("{what} differ ({a} vs {b})"))),
        _ => Ok(()),
    }
}

/// `Attention(q[b,hq,sq,d], k[b,hk,sk,d], v[b,hk,sk,dv], mask?)` → `[b,hq,sq,dv]`.
pub(super) fn infer_attention(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 4)?;
    let q_ty = cx.float(0)?;
    cx.same_dtype(0, 1)?;
    cx.same_dtype(0, 2)?;
    let (q, k, v) = (cx.rank(0, 4)?, cx.rank(1, 4)?, cx.rank(2, 4)?);
    agree(cx, "batch sizes", &q[0], &k[0])?;
    agree(cx, "batch sizes", &q[0], &v[0])?;
    agree(cx, "key and value heads", &k[1], &v[1])?;
    agree(cx, "key and value lengths", &k[2], &v[2])?;
    agree(cx, "query and key head sizes", &q[3], &k[3])?;
    if let (Some(hq), Some(hk)) = (q[1].fixed(), k[1].fixed()) {
        if hk == 0 || hq % hk != 0 {
            return Err(invalid(
                cx.op,
                format!("{hq} query heads are not a multiple of {hk} key heads"),
            ));
        }
    }
    if let Some(m) = cx.opt(3) {
        if m.ty.dtype != DType::Bool && m.ty.dtype != q_ty.dtype {
            return Err(invalid(
                cx.op,
                format!("mask must be bool or {}, got {}", q_ty.dtype, m.ty.dtype),
            ));
        }
        let md = &m.ty.shape.0;
        let Some((m_last, m_lead)) = md.split_last().filter(|_| md.len() <= 4) else {
            return Err(invalid(
                cx.op,
                format!("mask must have rank 1 to 4, got {}", m.ty.shape),
            ));
        };
        if let (Some(ml), Some(sk)) = (m_last.fixed(), k[2].fixed()) {
            if ml > sk {
                return Err(invalid(
                    cx.op,
                    format!("mask covers {ml} keys but there are {sk}"),
                ));
            }
        }
        let lead = Shape(vec![q[0].clone(), q[1].clone(), q[2].clone()]);
        broadcast_shapes(cx.op, &[&lead, &Shape(m_lead.to_vec())])
            .and_then(|s| if s == lead { Ok(s) } else { Err(invalid(cx.op, "")) })
            .map_err(|_| {
                invalid(
                    cx.op,
                    format!("mask shape {} does not broadcast to the scores", m.ty.shape),
                )
            })?;
    }
    Ok(vec![tensor(
        q_ty.dtype,
        vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()],
    )])
}

/// A mask input seen through strides broadcasting it to `[b, hq, sq, len]`.
pub(super) struct MaskView<'a> {
    pub(super) value: &'a Value,
    /// Keys the mask covers; later keys are masked.
    pub(super) len: usize,
    /// Strides of `[b, hq, sq, len]` into the mask (0 where broadcast).
    pub(super) strides: Vec<isize>,
}

impl<'a> MaskView<'a> {
    /// The view of `mask` over the scores of `b` batches, `hq` heads and
    /// `sq` queries (shared with the backward kernel).
    pub(super) fn new(mask: &'a Value, b: usize, hq: usize, sq: usize) -> Self {
        let len = mask.shape.last().copied().unwrap_or(1);
        MaskView {
            value: mask,
            len,
            strides: broadcast_strides(&mask.shape, &[b, hq, sq, len]),
        }
    }
}

/// The additive mask of one (batch, head) pair as a `[sq, sk]` row-major
/// buffer (`-inf` for masked), and whether each query row is fully masked.
pub(super) fn head_bias<T: Real>(
    mask: Option<&MaskView>,
    b: usize,
    h: usize,
    sq: usize,
    sk: usize,
    causal: bool,
) -> (Vec<T>, Vec<bool>) {
    let mut bias = vec![T::zero(); sq * sk];
    if let Some(m) = mask {
        let st = &m.strides;
        let base = b as isize * st[0] + h as isize * st[1];
        for i in 0..sq {
            for j in 0..sk {
                let at = || (base + i as isize * st[2] + j as isize * st[3]) as usize;
                bias[i * sk + j] = match &m.value.data {
                    _ if j >= m.len => T::neg_infinity(),
                    Data::Bool(d) if d[at()] => T::zero(),
                    Data::Bool(_) => T::neg_infinity(),
                    _ => T::slice(m.value).map_or(T::zero(), |d| d[at()]),
                };
            }
        }
    }
    if causal {
        for i in 0..sq {
            for j in (i + 1).min(sk)..sk {
                bias[i * sk + j] = T::neg_infinity();
            }
        }
    }
    let masked = bias
        .chunks(sk.max(1))
        .map(|row| sk > 0 && row.iter().all(|&x| x == T::neg_infinity()))
        .collect();
    (bias, masked)
}

fn attention_kernel<T: Real>(cx: &EvalCtx, scale: Option<f64>, causal: bool) -> Result<Vec<T>, OpError> {
    let (qv, kv) = (cx.input(0)?, cx.input(1)?);
    let (q, k, v) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?, cx.floats::<T>(2)?);
    let [b, hq, sq, d] = qv.shape[..] else {
        return Err(invalid(cx.op, "query must be 4-D"));
    };
    let (hk, sk) = (kv.shape[1], kv.shape[2]);
    let dv = cx.input(2)?.shape[3];
    let group = hq / hk.max(1);
    let scale = T::lit(scale.unwrap_or(1.0 / (d as f64).sqrt()));
    let mask = cx.opt(3).map(|m| MaskView::new(m, b, hq, sq));
    let mut out = vec![T::zero(); b * hq * sq * dv];
    let mut scores = vec![T::zero(); sq * sk];
    for bi in 0..b {
        for hi in 0..hq {
            let kh = bi * hk + hi / group.max(1);
            let qm = Mat::row_major(q, (bi * hq + hi) * sq * d, d, false);
            let km = Mat::row_major(k, kh * sk * d, d, true);
            gemm(cx.op, sq, d, sk, scale, qm, km, T::zero(), &mut scores, 0)?;
            let (bias, masked) = head_bias::<T>(mask.as_ref(), bi, hi, sq, sk, causal);
            for (i, row) in scores.chunks_mut(sk.max(1)).enumerate() {
                masked_softmax(row, &bias[i * sk..(i + 1) * sk], masked[i]);
            }
            let pm = Mat::row_major(&scores[..], 0, sk, false);
            let vm = Mat::row_major(v, kh * sk * dv, dv, false);
            gemm(
                cx.op,
                sq,
                sk,
                dv,
                T::one(),
                pm,
                vm,
                T::zero(),
                &mut out,
                (bi * hq + hi) * sq * dv,
            )?;
        }
    }
    Ok(out)
}

/// Softmax of `row + bias` in place; a fully masked row becomes zeros.
pub(super) fn masked_softmax<T: Real>(row: &mut [T], bias: &[T], masked: bool) {
    if masked {
        row.fill(T::zero());
        return;
    }
    for (x, &b) in row.iter_mut().zip(bias) {
        *x += b;
    }
    let max = row
        .iter()
        .fold(T::neg_infinity(), |m, &x| if x > m { x } else { m });
    let max = if max == T::neg_infinity() { T::zero() } else { max };
    let mut sum = T::zero();
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let sum = if sum == T::zero() { T::one() } else { sum };
    for x in row.iter_mut() {
        *x = *x / sum;
    }
}

/// Reference kernel for `Attention`.
pub(super) fn eval_attention(cx: &EvalCtx, scale: Option<f64>, causal: bool) -> Result<Vec<Value>, OpError> {
    let q = cx.input(0)?;
    let data = float_kernel!(cx.op, q, T => attention_kernel::<T>(cx, scale, causal)?);
    Ok(vec![finish(q.dtype, cx.out_shape(0)?, data)])
}

/// FLOPs of attention: `2·b·hq·sq·sk·(d + dv)` for QKᵀ and PV plus the
/// softmax. A causal mask does not halve the count: the reference kernel and
/// the cost model both compute the full score matrix. Backward doubles the
/// products.
pub(super) fn attention_flops(inputs: &[Option<&TensorType>]) -> (f64, f64) {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (get(0), get(1), get(2)) else {
        return (0.0, 0.0);
    };
    let scores = dim(q, 0) * dim(q, 1) * dim(q, 2) * dim(k, 2);
    let mm = 2.0 * scores * (dim(q, 3) + dim(v, 3));
    let sm = SCORE_SOFTMAX_FLOPS * scores;
    (mm + sm, 2.0 * mm + sm)
}

/// Geometry of a rotary embedding: heads, head size, rotated width.
struct Rotary {
    heads: usize,
    head: usize,
    rot: usize,
}

/// `RotaryEmbedding(x, cos, sin, position_ids?)`: same type as `x`.
pub(super) fn infer_rotary(
    cx: &InferCtx,
    rotary_dim: usize,
    num_heads: usize,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 4)?;
    let x = cx.float(0)?;
    cx.same_dtype(0, 1)?;
    cx.same_dtype(0, 2)?;
    let xd = &x.shape.0;
    let head = match xd.len() {
        4 => xd[3].fixed(),
        3 if num_heads == 0 => return Err(invalid(cx.op, "3-D input needs num_heads")),
        3 => match xd[2].fixed() {
            Some(h) if h % num_heads != 0 => {
                return Err(invalid(
                    cx.op,
                    format!("hidden size {h} is not a multiple of {num_heads} heads"),
                ))
            }
            h => h.map(|h| h / num_heads),
        },
        _ => {
            return Err(invalid(
                cx.op,
                format!("input must be 3-D or 4-D, got {}", x.shape),
            ))
        }
    };
    let cache_rank = if cx.opt(3).is_some() {
        cx.int(3)?;
        cx.rank(3, 2)?;
        2
    } else {
        3
    };
    let (cos, sin) = (cx.rank(1, cache_rank)?, cx.rank(2, cache_rank)?);
    if let Some(head) = head {
        let rot = if rotary_dim == 0 { head } else { rotary_dim };
        if rot > head || rot % 2 != 0 {
            return Err(invalid(
                cx.op,
                format!("rotary dim {rot} must be even and at most the head size {head}"),
            ));
        }
        for c in [cos, sin] {
            if c[cache_rank - 1].fixed().is_some_and(|w| w != rot / 2) {
                return Err(invalid(
                    cx.op,
                    format!(
                        "cache width {} is not rotary dim / 2 = {}",
                        c[cache_rank - 1],
                        rot / 2
                    ),
                ));
            }
        }
    }
    Ok(vec![x.clone()])
}

fn rotary_kernel<T: Real>(cx: &EvalCtx, interleaved: bool, g: &Rotary) -> Result<Vec<T>, OpError> {
    let xv = cx.input(0)?;
    let (x, cos, sin) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?, cx.floats::<T>(2)?);
    let four_d = xv.shape.len() == 4;
    let (b, s) = if four_d {
        (xv.shape[0], xv.shape[2])
    } else {
        (xv.shape[0], xv.shape[1])
    };
    let half = g.rot / 2;
    let ids = match cx.opt(3) {
        Some(p) => {
            if p.shape != [b, s] {
                return Err(invalid(
                    cx.op,
                    format!("position_ids shape {:?} is not [{b}, {s}]", p.shape),
                ));
            }
            Some(p.as_i64().unwrap_or_default())
        }
        None => None,
    };
    if cx.input(1)?.shape != cx.input(2)?.shape {
        return Err(invalid(cx.op, "cos and sin caches differ in shape"));
    }
    let cache_rows = cx.input(1)?.shape[0];
    if ids.is_none() && cx.input(1)?.shape[..2] != [b, s] {
        return Err(invalid(
            cx.op,
            format!(
                "cache shape {:?} does not start with [{b}, {s}]",
                cx.input(1)?.shape
            ),
        ));
    }
    let mut out = x.to_vec();
    for bi in 0..b {
        for si in 0..s {
            let row = match ids {
                Some(ids) => {
                    let p = ids[bi * s + si];
                    usize::try_from(p)
                        .ok()
                        .filter(|&p| p < cache_rows)
                        .ok_or_else(|| {
                            invalid(
                                cx.op,
                                format!("position id {p} is outside the cache of {cache_rows}"),
                            )
                        })?
                }
                None => bi * s + si,
            };
            let (c, sn) = (
                &cos[row * half..(row + 1) * half],
                &sin[row * half..(row + 1) * half],
            );
            for h in 0..g.heads {
                let off = if four_d {
                    ((bi * g.heads + h) * s + si) * g.head
                } else {
                    ((bi * s + si) * g.heads + h) * g.head
                };
                for j in 0..half {
                    let (i1, i2) = if interleaved {
                        (off + 2 * j, off + 2 * j + 1)
                    } else {
                        (off + j, off + half + j)
                    };
                    let (x1, x2) = (x[i1], x[i2]);
                    out[i1] = c[j] * x1 - sn[j] * x2;
                    out[i2] = sn[j] * x1 + c[j] * x2;
                }
            }
        }
    }
    Ok(out)
}

/// Reference kernel for `RotaryEmbedding`.
pub(super) fn eval_rotary(
    cx: &EvalCtx,
    interleaved: bool,
    rotary_dim: usize,
    num_heads: usize,
) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let (heads, head) = match x.shape[..] {
        [_, h, _, d] => (h, d),
        [_, _, hidden] => (num_heads, hidden / num_heads.max(1)),
        _ => return Err(invalid(cx.op, "input must be 3-D or 4-D")),
    };
    let rot = if rotary_dim == 0 { head } else { rotary_dim };
    let g = Rotary { heads, head, rot };
    let data = float_kernel!(cx.op, x, T => rotary_kernel::<T>(cx, interleaved, &g)?);
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

/// FLOPs of a rotary embedding over `x`; backward is the inverse rotation.
pub(super) fn rotary_flops(x: Option<&TensorType>) -> (f64, f64) {
    let f = x.map_or(0.0, numel) * ROTARY_FLOPS;
    (f, f)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    fn attn(causal: bool) -> Op {
        Op::Attention { scale: None, causal }
    }

    #[test]
    fn single_query_default_scale() {
        let q = f32s(&[1, 1, 1, 2], &[1.0, 0.0]);
        let k = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
        let v = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
        // scores [1/√2, 0] → softmax [0.66976, 0.33024].
        assert_close(&eval1(&attn(false), &[&q, &k, &v]).1, &[0.669762, 0.330238], 1e-6);
    }

    #[test]
    fn causal_and_bool_masks() {
        let q = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 1.0, 0.0]);
        let k = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
        let v = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let out = eval1(&attn(true), &[&q, &k, &v]).1;
        assert_close(&out[..2], &[1.0, 2.0], 1e-6);
        // Keep only key 1 for query 0; mask everything for query 1 → zeros.
        let mask = bools(&[2, 2], &[false, true, false, false]);
        assert_close(
            &eval1(&attn(false), &[&q, &k, &v, &mask]).1,
            &[3.0, 4.0, 0.0, 0.0],
            1e-6,
        );
        // A float mask shorter than the key length: missing keys are masked.
        let short = f32s(&[1], &[0.0]);
        assert_close(
            &eval1(&attn(false), &[&q, &k, &v, &short]).1,
            &[1.0, 2.0, 1.0, 2.0],
            1e-6,
        );
    }

    #[test]
    fn grouped_query_heads_share_kv() {
        let q = f32s(&[1, 2, 1, 1], &[1.0, 1.0]);
        let k = f32s(&[1, 1, 2, 1], &[0.0, 0.0]);
        let v = f32s(&[1, 1, 2, 1], &[2.0, 4.0]);
        assert_close(&eval1(&attn(false), &[&q, &k, &v]).1, &[3.0, 3.0], 1e-6);
    }

    #[test]
    fn attention_inference() {
        let t = |s| ty(DType::F32, s);
        let out = infer(&attn(true), &[t("b 4 s 8"), t("b 2 t 8"), t("b 2 t 16")]).unwrap();
        assert_eq!(out[0], t("b 4 s 16"));
        assert_op_err(
            infer(&attn(true), &[t("b 3 s 8"), t("b 2 t 8"), t("b 2 t 8")]),
            "Attention",
            "3 query heads are not a multiple of 2 key heads",
        );
        assert_op_err(
            infer(&attn(true), &[t("b 2 s 8"), t("b 2 t 4"), t("b 2 t 8")]),
            "Attention",
            "query and key head sizes differ (8 vs 4)",
        );
        let mask = ty(DType::Bool, "s t");
        assert!(infer(&attn(false), &[t("b 2 s 8"), t("b 2 t 8"), t("b 2 t 8"), mask]).is_ok());
        let bad = ty(DType::I64, "s t");
        assert_op_err(
            infer(&attn(false), &[t("b 2 s 8"), t("b 2 t 8"), t("b 2 t 8"), bad]),
            "Attention",
            "mask must be bool or f32, got i64",
        );
    }

    #[test]
    fn attention_cost_counts_full_scores() {
        let (q, o) = (ty(DType::F32, "2 4 8 16"), ty(DType::F32, "2 4 8 16"));
        let c = attn(true).cost(&[Some(&q), Some(&q), Some(&q)], &[&o]);
        let scores = 2.0 * 4.0 * 8.0 * 8.0;
        assert_eq!(c.forward_flops, 4.0 * scores * 16.0 + 5.0 * scores);
    }

    fn rope(interleaved: bool, num_heads: usize) -> Op {
        Op::RotaryEmbedding {
            interleaved,
            rotary_dim: 0,
            num_heads,
        }
    }

    #[test]
    fn rotary_halves_and_interleaved() {
        let x = f32s(&[1, 1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let cos = f32s(&[2, 2], &[9.0, 9.0, 0.0, 1.0]);
        let sin = f32s(&[2, 2], &[9.0, 9.0, 1.0, 0.0]);
        let pos = i64s(&[1, 1], &[1]);
        assert_eq!(
            eval1(&rope(false, 0), &[&x, &cos, &sin, &pos]).1,
            vec![-3.0, 2.0, 1.0, 4.0]
        );
        assert_eq!(
            eval1(&rope(true, 0), &[&x, &cos, &sin, &pos]).1,
            vec![-2.0, 1.0, 3.0, 4.0]
        );
        let x3 = f32s(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(
            eval1(&rope(false, 1), &[&x3, &cos, &sin, &pos]).1,
            vec![-3.0, 2.0, 1.0, 4.0]
        );
        let far = i64s(&[1, 1], &[2]);
        assert_op_err(
            eval(&rope(false, 0), &[&x, &cos, &sin, &far]),
            "RotaryEmbedding",
            "position id 2 is outside the cache of 2",
        );
        assert_op_err(
            infer(
                &rope(false, 0),
                &[
                    ty(DType::F32, "b 3 8"),
                    ty(DType::F32, "p 4"),
                    ty(DType::F32, "p 4"),
                ],
            ),
            "RotaryEmbedding",
            "3-D input needs num_heads",
        );
    }
}

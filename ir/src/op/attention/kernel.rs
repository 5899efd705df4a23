//! Reference kernels of attention (per head, with the mask broadcast) and rotary embeddings.

use super::super::broadcast::broadcast_strides;
use super::super::context::{finish, invalid, EvalCtx};
use super::super::gemm::{gemm, Mat};
use super::super::numeric::{float_kernel, Real};
use super::super::OpError;
use super::Rotary;
use crate::{Data, Value};

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

/// The query positions of input `at` (a causal attention's), checked
/// against the `sq` queries; `None` without them (query `i` at position `i`).
pub(super) fn query_positions(cx: &EvalCtx, at: usize, sq: usize) -> Result<Option<Vec<i64>>, OpError> {
    let Some(p) = cx.opt(at) else {
        return Ok(None);
    };
    let ids = p
        .as_i64()
        .filter(|ids| ids.len() == sq)
        .ok_or_else(|| invalid(cx.op, format!("query positions must be {sq} integers")))?;
    Ok(Some(ids.to_vec()))
}

/// The additive mask of one (batch, head) pair as a `[sq, sk]` row-major
/// buffer (`-inf` for masked), and whether each query row is fully masked.
/// `causal` hides the keys after each query's position (`positions[i]`, or
/// `i` without them).
pub(super) fn head_bias<T: Real>(
    mask: Option<&MaskView>,
    b: usize,
    h: usize,
    (sq, sk): (usize, usize),
    causal: bool,
    positions: Option<&[i64]>,
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
            let at = positions.map_or(i as i64, |p| p[i]);
            let first_hidden = usize::try_from(at.saturating_add(1)).unwrap_or(0).min(sk);
            for j in first_hidden..sk {
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
    let positions = query_positions(cx, 4, sq)?;
    let mut out = vec![T::zero(); b * hq * sq * dv];
    let mut scores = vec![T::zero(); sq * sk];
    for bi in 0..b {
        for hi in 0..hq {
            let kh = bi * hk + hi / group.max(1);
            let qm = Mat::row_major(q, (bi * hq + hi) * sq * d, d, false);
            let km = Mat::row_major(k, kh * sk * d, d, true);
            gemm(cx.op, sq, d, sk, scale, qm, km, T::zero(), &mut scores, 0)?;
            let (bias, masked) =
                head_bias::<T>(mask.as_ref(), bi, hi, (sq, sk), causal, positions.as_deref());
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

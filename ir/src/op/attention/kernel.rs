//! Reference kernels of attention (per head, with the mask broadcast) and rotary embeddings.

use super::super::broadcast::broadcast_strides;
use super::super::context::{finish, invalid, EvalCtx};
use super::super::gemm::{gemm, Mat};
use super::super::numeric::{float_kernel, vectorized, Real};
use super::super::threads::{attention_ways, in_group_runs, kernel_threads};
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

/// Query rows an attention kernel handles at once: a causal head's block
/// of rows reads only the keys its last row may see, so the products skip
/// most of the hidden upper triangle (a fifth to a half of the work).
pub(super) const ROW_BLOCK: usize = 64;

/// How many leading keys each of `sq` query rows may see among `sk`:
/// `causal` hides the keys after the query's position (`positions[i]`, or
/// `i` without them), and a mask covering `mask_len` keys hides the rest.
/// Keys past a row's limit get probability zero and no gradient.
pub(super) fn key_limits(
    (sq, sk): (usize, usize),
    causal: bool,
    positions: Option<&[i64]>,
    mask_len: Option<usize>,
) -> Vec<usize> {
    (0..sq)
        .map(|i| {
            let seen = match causal {
                true => {
                    let at = positions.map_or(i as i64, |p| p[i]);
                    usize::try_from(at.saturating_add(1)).unwrap_or(0).min(sk)
                }
                false => sk,
            };
            seen.min(mask_len.unwrap_or(sk))
        })
        .collect()
}

/// The additive mask of one (batch, head) pair over the keys each row may
/// see (`limits`), as a `[sq, sk]` row-major buffer: zero where kept,
/// `-inf` where hidden (entries past a row's limit are not read).
pub(super) fn head_bias<T: Real>(m: &MaskView, b: usize, h: usize, sk: usize, limits: &[usize]) -> Vec<T> {
    let mut bias = vec![T::zero(); limits.len() * sk];
    let st = &m.strides;
    let base = b as isize * st[0] + h as isize * st[1];
    for (i, &limit) in limits.iter().enumerate() {
        for j in 0..limit {
            let at = (base + i as isize * st[2] + j as isize * st[3]) as usize;
            bias[i * sk + j] = match &m.value.data {
                Data::Bool(d) if d[at] => T::zero(),
                Data::Bool(_) => T::neg_infinity(),
                _ => T::slice(m.value).map_or(T::zero(), |d| d[at]),
            };
        }
    }
    bias
}

/// A block of up to [`ROW_BLOCK`] query rows from `i0`, the keys each
/// may see (`limits`) and the most of them (`kn`, a row of its scores).
pub(super) struct Block<'a> {
    pub(super) i0: usize,
    pub(super) rows: usize,
    pub(super) kn: usize,
    pub(super) limits: &'a [usize],
}

/// The blocks of query rows, in order, that see at least one key (the
/// rows of the others have no output and no gradient).
pub(super) fn blocks(limits: &[usize]) -> impl Iterator<Item = Block<'_>> {
    limits.chunks(ROW_BLOCK).enumerate().filter_map(|(n, lim)| {
        let kn = lim.iter().copied().max().unwrap_or(0);
        (kn > 0).then_some(Block {
            i0: n * ROW_BLOCK,
            rows: lim.len(),
            kn,
            limits: lim,
        })
    })
}

/// The probabilities of `block` into `p` (`rows × kn`): `scale·Q·Kᵀ` of
/// its query rows `q` against the keys `kt` (transposed) they may see,
/// plus the head's mask `bias` (`[sq, sk]`), soft-maxed.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_probabilities<T: Real>(
    op: &str,
    block: &Block,
    (q, kt): (Mat<T>, Mat<T>),
    d: usize,
    scale: T,
    bias: Option<&[T]>,
    sk: usize,
    p: &mut [T],
) -> Result<(), OpError> {
    let Block { i0, rows, kn, limits } = *block;
    gemm(op, rows, d, kn, scale, q, kt, T::zero(), p, 0)?;
    probabilities(p, kn, limits, bias.map(|b| &b[i0 * sk..]), sk);
    Ok(())
}

/// Turns a block of scores (`kn` to a row; row `i` sees `limits[i]` keys,
/// plus `bias[i·sk..]` where there is a mask) into probabilities in place:
/// zero past each row's limit, and a row that sees no key all zeros.
fn probabilities<T: Real>(s: &mut [T], kn: usize, limits: &[usize], bias: Option<&[T]>, sk: usize) {
    vectorized(|| {
        for (i, row) in s.chunks_mut(kn).enumerate() {
            let (live, dead) = row.split_at_mut(limits[i]);
            dead.fill(T::zero());
            if let Some(b) = bias {
                for (x, &b) in live.iter_mut().zip(&b[i * sk..]) {
                    *x += b;
                }
            }
            let max = live
                .iter()
                .fold(T::neg_infinity(), |m, &x| if x > m { x } else { m });
            if max == T::neg_infinity() {
                live.fill(T::zero());
                continue;
            }
            for x in live.iter_mut() {
                *x = (*x - max).exp_v();
            }
            let sum = live.iter().fold(T::zero(), |acc, &x| acc + x);
            for x in live.iter_mut() {
                *x = *x / sum;
            }
        }
    })
}

/// The forward pass, per (batch, query head) and block of query rows:
/// `P = softmax(scale·Q·Kᵀ + mask)` over the keys the rows may see, then
/// `O = P·V`; the (batch, key/value head) groups split over this thread's
/// [`kernel_threads`] ([`attention_ways`]).
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
    let limits = key_limits(
        (sq, sk),
        causal,
        positions.as_deref(),
        mask.as_ref().map(|m| m.len),
    );
    let mut out = vec![T::zero(); b * hq * sq * dv];
    let ways = attention_ways(&qv.shape, &kv.shape, false, kernel_threads());
    let per_group = [group * sq * dv];
    in_group_runs(b * hk, ways, vec![&mut out[..]], &per_group, |run, mut outs| {
        let out = &mut *outs[0];
        let mut scores = vec![T::zero(); ROW_BLOCK.min(sq) * sk];
        for (n, g) in run.clone().enumerate() {
            let (bi, kh) = (g / hk, g % hk);
            for j in 0..group {
                let (hi, head) = (kh * group + j, g * group + j);
                let bias = mask.as_ref().map(|m| head_bias::<T>(m, bi, hi, sk, &limits));
                for block in blocks(&limits) {
                    let Block { i0, rows, kn, .. } = block;
                    let p = &mut scores[..rows * kn];
                    let qm = Mat::row_major(q, (head * sq + i0) * d, d, false);
                    let kt = Mat::row_major(k, g * sk * d, d, true);
                    block_probabilities(cx.op, &block, (qm, kt), d, scale, bias.as_deref(), sk, p)?;
                    let pm = Mat::row_major(&p[..], 0, kn, false);
                    let vm = Mat::row_major(v, g * sk * dv, dv, false);
                    let at = ((n * group + j) * sq + i0) * dv;
                    gemm(cx.op, rows, kn, dv, T::one(), pm, vm, T::zero(), out, at)?;
                }
            }
        }
        Ok(())
    })?;
    Ok(out)
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

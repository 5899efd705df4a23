//! Reference kernels of MoE routing and the fused experts.

use super::super::context::{finish, invalid, EvalCtx};
use super::super::elementwise::activate;
use super::super::gemm::{gemm, Mat};
use super::super::geometry::prod;
use super::super::numeric::{float_kernel, Real};
use super::super::{Activation, OpError};
use crate::Value;

/// Indices of the `k` largest (or smallest) entries, ties to the lower index.
pub(crate) fn top_indices<T: Copy>(
    row: &[T],
    k: usize,
    order: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    // A stable sort keeps equal values in index order.
    idx.sort_by(|&a, &b| order(&row[a], &row[b]));
    idx.truncate(k);
    idx
}

fn router_kernel<T: Real>(logits: &[T], experts: usize, k: usize) -> (Vec<T>, Vec<i64>) {
    let rows = logits.len() / experts.max(1);
    let (mut w, mut ids) = (Vec::with_capacity(rows * k), Vec::with_capacity(rows * k));
    for row in logits.chunks(experts.max(1)) {
        let max = row
            .iter()
            .fold(T::neg_infinity(), |m, &x| if x > m { x } else { m });
        let p: Vec<T> = row.iter().map(|&x| (x - max).exp()).collect();
        let top = top_indices(&p, k, |a, b| {
            b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal)
        });
        let total = top.iter().map(|&i| p[i]).sum::<T>();
        for &i in &top {
            w.push(p[i] / total);
            ids.push(i as i64);
        }
    }
    (w, ids)
}

/// Reference kernel for `MoeRouter`. The softmax normaliser cancels in the
/// renormalisation, so only `exp(x - max)` is computed.
pub(super) fn eval_router(cx: &EvalCtx, top_k: usize) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let experts = x.shape.last().copied().unwrap_or(1);
    let ids;
    let w = float_kernel!(cx.op, x, T => {
        let (w, i) = router_kernel(cx.floats::<T>(0)?, experts, top_k);
        ids = i;
        w
    });
    Ok(vec![
        finish(x.dtype, cx.out_shape(0)?, w),
        Value::i64(cx.out_shape(1)?, ids).map_err(|e| invalid(cx.op, e.to_string()))?,
    ])
}

fn experts_kernel<T: Real>(cx: &EvalCtx, act: Activation) -> Result<Vec<T>, OpError> {
    let (xv, idv, winv) = (cx.input(0)?, cx.input(2)?, cx.input(3)?);
    let (x, w) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?);
    let (w_in, w_out) = (cx.floats::<T>(3)?, cx.floats::<T>(4)?);
    let gate = match cx.opt(5) {
        Some(_) => Some(cx.floats::<T>(5)?),
        None => None,
    };
    let ids = idv.as_i64().unwrap_or_default();
    let (e, h, f) = (winv.shape[0], winv.shape[1], winv.shape[2]);
    let k = idv.shape.last().copied().unwrap_or(1).max(1);
    let tokens = prod(&xv.shape) / h.max(1);
    // Tokens routed to each expert, with their weights.
    let routed: Vec<Vec<(usize, T)>> = super::grad::assignments(cx.op, ids, e)?
        .into_iter()
        .map(|slots| slots.into_iter().map(|s| (s / k, w[s])).collect())
        .collect();
    let mut out = vec![T::zero(); tokens * h];
    for (ex, list) in routed.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
        let n = list.len();
        let xs: Vec<T> = list
            .iter()
            .flat_map(|&(t, _)| x[t * h..(t + 1) * h].iter().copied())
            .collect();
        let xm = Mat::row_major(&xs[..], 0, h, false);
        let mut hid = vec![T::zero(); n * f];
        gemm(
            cx.op,
            n,
            h,
            f,
            T::one(),
            xm,
            Mat::row_major(w_in, ex * h * f, f, false),
            T::zero(),
            &mut hid,
            0,
        )?;
        match gate {
            Some(g) => {
                let mut gv = vec![T::zero(); n * f];
                gemm(
                    cx.op,
                    n,
                    h,
                    f,
                    T::one(),
                    xm,
                    Mat::row_major(g, ex * h * f, f, false),
                    T::zero(),
                    &mut gv,
                    0,
                )?;
                for (a, &gi) in hid.iter_mut().zip(&gv) {
                    *a *= activate(act, gi);
                }
            }
            None => hid.iter_mut().for_each(|a| *a = activate(act, *a)),
        }
        let mut y = vec![T::zero(); n * h];
        let hm = Mat::row_major(&hid[..], 0, f, false);
        gemm(
            cx.op,
            n,
            f,
            h,
            T::one(),
            hm,
            Mat::row_major(w_out, ex * f * h, h, false),
            T::zero(),
            &mut y,
            0,
        )?;
        for (&(t, wt), yr) in list.iter().zip(y.chunks(h.max(1))) {
            for (o, &v) in out[t * h..(t + 1) * h].iter_mut().zip(yr) {
                *o += wt * v;
            }
        }
    }
    Ok(out)
}

/// Reference kernel for `MoeExperts`.
pub(super) fn eval_experts(cx: &EvalCtx, act: Activation) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data = float_kernel!(cx.op, x, T => experts_kernel::<T>(cx, act)?);
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

fn ints(cx: &EvalCtx, i: usize) -> Result<Vec<i64>, OpError> {
    cx.input(i)?
        .as_i64()
        .map(<[i64]>::to_vec)
        .ok_or_else(|| invalid(cx.op, format!("input {i} must be integers")))
}

fn i64_value(cx: &EvalCtx, out: usize, data: Vec<i64>) -> Result<Value, OpError> {
    Value::i64(cx.out_shape(out)?, data).map_err(|e| invalid(cx.op, e.to_string()))
}

/// Reference kernel for `MoeSort`: a stable counting sort of the
/// assignments by expert, into blocks of `capacity` rows when given.
pub(super) fn eval_sort(
    cx: &EvalCtx,
    experts: usize,
    capacity: Option<usize>,
) -> Result<Vec<Value>, OpError> {
    let ids = ints(cx, 0)?;
    let k = cx.input(0)?.shape.last().copied().unwrap_or(1).max(1);
    let mut counts = vec![0usize; experts];
    for &id in &ids {
        let e = usize::try_from(id)
            .ok()
            .filter(|&e| e < experts)
            .ok_or_else(|| invalid(cx.op, format!("expert index {id} is outside 0..{experts}")))?;
        counts[e] += 1;
    }
    // Where each expert's rows start, and how many it keeps.
    let (starts, kept): (Vec<usize>, Vec<usize>) = match capacity {
        Some(c) => (
            (0..experts).map(|e| e * c).collect(),
            counts.iter().map(|&n| n.min(c)).collect(),
        ),
        None => {
            let starts = counts
                .iter()
                .scan(0usize, |start, &c| Some(std::mem::replace(start, *start + c)))
                .collect();
            (starts, counts.clone())
        }
    };
    let rows = capacity.map_or(ids.len(), |c| experts * c);
    let (mut order, mut position) = (vec![0i64; rows], vec![-1i64; ids.len()]);
    let mut taken = vec![0usize; experts];
    for (slot, &id) in ids.iter().enumerate() {
        let e = id as usize;
        if taken[e] < kept[e] {
            let row = starts[e] + taken[e];
            order[row] = (slot / k) as i64;
            position[slot] = row as i64;
            taken[e] += 1;
        }
    }
    let counts = kept.into_iter().map(|n| n as i64).collect();
    Ok(vec![
        i64_value(cx, 0, order)?,
        i64_value(cx, 1, position)?,
        i64_value(cx, 2, counts)?,
    ])
}

/// Reference kernel for `MoeSlots`: each block's rows numbered by local
/// expert, the padding after them −1.
pub(super) fn eval_slots(cx: &EvalCtx, rows: usize) -> Result<Vec<Value>, OpError> {
    let counts = ints(cx, 0)?;
    let local = cx.input(0)?.shape.get(1).copied().unwrap_or(1).max(1);
    let mut ids = Vec::with_capacity(counts.len() / local * rows);
    for block in counts.chunks(local) {
        let start = ids.len();
        for (e, &c) in block.iter().enumerate() {
            ids.extend(std::iter::repeat_n(e as i64, c.max(0) as usize));
        }
        if ids.len() - start > rows {
            return Err(invalid(
                cx.op,
                format!("a block of {} rows overflows {rows}", ids.len() - start),
            ));
        }
        ids.resize(start + rows, -1);
    }
    Ok(vec![i64_value(cx, 0, ids)?])
}

//! Reference kernels of the gathers.

use super::super::broadcast::strided_index;
use super::super::context::{invalid, norm_axis, EvalCtx};
use super::super::geometry::{prod, strides};
use super::super::OpError;
use super::{gathered, index_values, resolve};
use crate::Value;

/// Reference kernel for `Gather` (and `Embedding` with `axis = 0`).
pub(super) fn eval_gather(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let ids = index_values(cx, 1)?;
    let a = norm_axis(cx.op, axis, x.shape.len())?;
    let (outer, n, inner) = (prod(&x.shape[..a]), x.shape[a], prod(&x.shape[a + 1..]));
    let rows = ids
        .iter()
        .map(|&i| resolve(cx.op, i, n))
        .collect::<Result<Vec<_>, _>>()?;
    let mut idx = Vec::with_capacity(outer * rows.len() * inner);
    for o in 0..outer {
        for &r in &rows {
            let base = (o * n + r) * inner;
            idx.extend(base..base + inner);
        }
    }
    Ok(vec![gathered(x, cx.out_shape(0)?, &idx)])
}

/// Reference kernel for `GatherElements`.
pub(super) fn eval_gather_elements(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let ids = index_values(cx, 1)?;
    let a = norm_axis(cx.op, axis, x.shape.len())?;
    if ind
        .shape
        .iter()
        .zip(&x.shape)
        .enumerate()
        .any(|(i, (&p, &q))| i != a && p > q)
    {
        return Err(invalid(
            cx.op,
            format!("indices {:?} exceed data {:?}", ind.shape, x.shape),
        ));
    }
    let st = strides(&x.shape);
    let mut base_st: Vec<isize> = st.iter().map(|&s| s as isize).collect();
    base_st[a] = 0;
    let base = strided_index(&ind.shape, &base_st, 0);
    let idx = base
        .iter()
        .zip(ids)
        .map(|(&b, &i)| Ok(b + resolve(cx.op, i, x.shape[a])? * st[a]))
        .collect::<Result<Vec<_>, OpError>>()?;
    Ok(vec![gathered(x, ind.shape.clone(), &idx)])
}

/// Reference kernel for `GatherNd`.
pub(super) fn eval_gather_nd(cx: &EvalCtx, batch_dims: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let ids = index_values(cx, 1)?;
    let b = batch_dims as usize;
    if ind.shape[..b] != x.shape[..b] {
        return Err(invalid(
            cx.op,
            format!("batch dims of {:?} and {:?} differ", ind.shape, x.shape),
        ));
    }
    let m = ind.shape.last().copied().unwrap_or(0);
    let batches = prod(&x.shape[..b]);
    let batch_size = prod(&x.shape[b..]);
    let slice = prod(&x.shape[b + m..]);
    let st = strides(&x.shape[b..]);
    let tuples_per_batch = prod(&ind.shape[b..ind.shape.len() - 1]);
    let tuples = batches * tuples_per_batch;
    let mut idx = Vec::with_capacity(tuples * slice);
    for t in 0..tuples {
        let mut off = (t / tuples_per_batch.max(1)) * batch_size;
        for (j, &i) in ids[t * m..(t + 1) * m].iter().enumerate() {
            off += resolve(cx.op, i, x.shape[b + j])? * st[j];
        }
        idx.extend(off..off + slice);
    }
    Ok(vec![gathered(x, cx.out_shape(0)?, &idx)])
}

//! Reference kernels of the gathers.

use super::super::broadcast::strided_index;
use super::super::context::{invalid, norm_axis, EvalCtx};
use super::super::geometry::{prod, strides};
use super::super::{Op, OpError};
use super::{gathered, index_values, resolve};
use crate::Value;

/// Where each output element of gather `op` (of data shaped `shape`, by
/// the indices `ids` shaped `ind_shape`) reads: what its scatter-add adds
/// into.
pub(super) fn positions(
    op: &Op,
    shape: &[usize],
    ind_shape: &[usize],
    ids: &[i64],
) -> Result<Vec<usize>, OpError> {
    let name = op.name();
    match *op {
        Op::Gather { axis } => gather_positions(&name, axis, shape, ids),
        Op::Embedding => gather_positions(&name, 0, shape, ids),
        Op::GatherElements { axis } => elements_positions(&name, axis, shape, ind_shape, ids),
        Op::GatherNd { batch_dims } => nd_positions(&name, batch_dims, shape, ind_shape, ids),
        _ => Err(invalid(&name, "internal error: not a gather")),
    }
}

/// Reference kernel for `Gather` (and `Embedding` with `axis = 0`).
pub(super) fn eval_gather(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let idx = gather_positions(cx.op, axis, &x.shape, index_values(cx, 1)?)?;
    Ok(vec![gathered(x, cx.out_shape(0)?, &idx)])
}

/// Where each output element of a `Gather` along `axis` of data shaped
/// `shape` reads, by the indices `ids`.
pub(super) fn gather_positions(
    op: &str,
    axis: i64,
    shape: &[usize],
    ids: &[i64],
) -> Result<Vec<usize>, OpError> {
    let a = norm_axis(op, axis, shape.len())?;
    let (outer, n, inner) = (prod(&shape[..a]), shape[a], prod(&shape[a + 1..]));
    let rows = ids
        .iter()
        .map(|&i| resolve(op, i, n))
        .collect::<Result<Vec<_>, _>>()?;
    let mut idx = Vec::with_capacity(outer * rows.len() * inner);
    for o in 0..outer {
        for &r in &rows {
            let base = (o * n + r) * inner;
            idx.extend(base..base + inner);
        }
    }
    Ok(idx)
}

/// Reference kernel for `GatherElements`.
pub(super) fn eval_gather_elements(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let idx = elements_positions(cx.op, axis, &x.shape, &ind.shape, index_values(cx, 1)?)?;
    Ok(vec![gathered(x, ind.shape.clone(), &idx)])
}

/// Where each output element of a `GatherElements` along `axis` of data
/// shaped `shape` reads, by the indices `ids` shaped `ind_shape`.
pub(super) fn elements_positions(
    op: &str,
    axis: i64,
    shape: &[usize],
    ind_shape: &[usize],
    ids: &[i64],
) -> Result<Vec<usize>, OpError> {
    let a = norm_axis(op, axis, shape.len())?;
    if ind_shape
        .iter()
        .zip(shape)
        .enumerate()
        .any(|(i, (&p, &q))| i != a && p > q)
    {
        return Err(invalid(
            op,
            format!("indices {ind_shape:?} exceed data {shape:?}"),
        ));
    }
    let st = strides(shape);
    let mut base_st: Vec<isize> = st.iter().map(|&s| s as isize).collect();
    base_st[a] = 0;
    let base = strided_index(ind_shape, &base_st, 0);
    base.iter()
        .zip(ids)
        .map(|(&b, &i)| Ok(b + resolve(op, i, shape[a])? * st[a]))
        .collect()
}

/// Reference kernel for `GatherNd`.
pub(super) fn eval_gather_nd(cx: &EvalCtx, batch_dims: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let ind = cx.input(1)?;
    let idx = nd_positions(cx.op, batch_dims, &x.shape, &ind.shape, index_values(cx, 1)?)?;
    Ok(vec![gathered(x, cx.out_shape(0)?, &idx)])
}

/// Where each output element of a `GatherNd` with `batch_dims` of data
/// shaped `shape` reads, by the index tuples `ids` shaped `ind_shape`.
pub(super) fn nd_positions(
    op: &str,
    batch_dims: i64,
    shape: &[usize],
    ind_shape: &[usize],
    ids: &[i64],
) -> Result<Vec<usize>, OpError> {
    let b = batch_dims as usize;
    if ind_shape[..b] != shape[..b] {
        return Err(invalid(
            op,
            format!("batch dims of {ind_shape:?} and {shape:?} differ"),
        ));
    }
    let m = ind_shape.last().copied().unwrap_or(0);
    let batches = prod(&shape[..b]);
    let batch_size = prod(&shape[b..]);
    let slice = prod(&shape[b + m..]);
    let st = strides(&shape[b..]);
    let tuples_per_batch = prod(&ind_shape[b..ind_shape.len() - 1]);
    let tuples = batches * tuples_per_batch;
    let mut idx = Vec::with_capacity(tuples * slice);
    for t in 0..tuples {
        let mut off = (t / tuples_per_batch.max(1)) * batch_size;
        for (j, &i) in ids[t * m..(t + 1) * m].iter().enumerate() {
            off += resolve(op, i, shape[b + j])? * st[j];
        }
        idx.extend(off..off + slice);
    }
    Ok(idx)
}

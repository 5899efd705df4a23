//! Indexing: `Gather`, `GatherElements`, `GatherNd` (ONNX semantics,
//! negative indices count from the end) and the canonical `Embedding`
//! (a row lookup, evaluated as `Gather` on axis 0).

use super::broadcast::strided_index;
use super::kernel_util::{invalid, map_data, norm_axis, prod, strides, take, tensor, EvalCtx, InferCtx};
use super::{OpError, TensorType};
use crate::{Dim, Value};

/// An index into an axis of length `n`, negative counting from the end.
fn resolve(op: &str, i: i64, n: usize) -> Result<usize, OpError> {
    let j = if i < 0 { i + n as i64 } else { i };
    usize::try_from(j)
        .ok()
        .filter(|&j| j < n)
        .ok_or_else(|| invalid(op, format!("index {i} is out of range for an axis of {n}")))
}

fn gathered(x: &Value, shape: Vec<usize>, idx: &[usize]) -> Value {
    Value {
        dtype: x.dtype,
        shape,
        data: map_data!(&x.data, d => take(d, idx)),
    }
}

fn index_values<'a>(cx: &EvalCtx<'a>, i: usize) -> Result<&'a [i64], OpError> {
    cx.input(i)?
        .as_i64()
        .ok_or_else(|| invalid(cx.op, format!("input {i} must be an integer tensor")))
}

/// `Gather(data, indices)`: `data[..axis] + indices + data[axis+1..]`.
pub(super) fn infer_gather(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let ind = cx.int(1)?;
    let a = norm_axis(cx.op, axis, data.shape.rank())?;
    let d = &data.shape.0;
    let dims = d[..a]
        .iter()
        .chain(&ind.shape.0)
        .chain(&d[a + 1..])
        .cloned()
        .collect();
    Ok(vec![tensor(data.dtype, dims)])
}

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

/// `GatherElements(data, indices)`: same rank, output shaped like `indices`.
pub(super) fn infer_gather_elements(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let ind = cx.int(1)?;
    if ind.shape.rank() != data.shape.rank() {
        return Err(invalid(
            cx.op,
            format!("indices {} and data {} differ in rank", ind.shape, data.shape),
        ));
    }
    norm_axis(cx.op, axis, data.shape.rank())?;
    Ok(vec![tensor(data.dtype, ind.shape.0.clone())])
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

/// `GatherNd(data, indices)` with `batch_dims`: output
/// `indices[..-1] + data[batch_dims + m..]` where `m = indices[-1]`.
pub(super) fn infer_gather_nd(cx: &InferCtx, batch_dims: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let data = cx.ty(0)?;
    let ind = cx.int(1)?;
    let (r, q) = (data.shape.rank(), ind.shape.rank());
    let b = usize::try_from(batch_dims).map_err(|_| invalid(cx.op, "batch_dims must be non-negative"))?;
    let m = match ind.shape.0.last() {
        Some(Dim::Fixed(m)) => *m,
        Some(Dim::Sym(_)) => return Err(invalid(cx.op, "the index tuple length must be fixed")),
        None => return Err(invalid(cx.op, "indices must have rank ≥ 1")),
    };
    if b >= q || b >= r || b + m > r {
        return Err(invalid(
            cx.op,
            format!(
                "indices {} do not fit data {} with batch_dims {b}",
                ind.shape, data.shape
            ),
        ));
    }
    let dims = ind.shape.0[..q - 1]
        .iter()
        .chain(&data.shape.0[b + m..])
        .cloned()
        .collect();
    Ok(vec![tensor(data.dtype, dims)])
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

/// `Embedding(table[vocab, hidden], ids)` → `ids.shape + [hidden]`.
pub(super) fn infer_embedding(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let table = cx.rank(0, 2)?;
    let ids = cx.int(1)?;
    let mut dims = ids.shape.0.clone();
    dims.push(table[1].clone());
    Ok(vec![tensor(cx.ty(0)?.dtype, dims)])
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use crate::DType;

    #[test]
    fn gather_rows_and_columns_with_negative_indices() {
        let x = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let ids = i64s(&[2, 1], &[2, -3]);
        assert_eq!(
            eval1(&Op::Gather { axis: 0 }, &[&x, &ids]),
            (vec![2, 1, 2], vec![5.0, 6.0, 1.0, 2.0])
        );
        let col = i64s(&[], &[-1]);
        assert_eq!(
            eval1(&Op::Gather { axis: 1 }, &[&x, &col]),
            (vec![3], vec![2.0, 4.0, 6.0])
        );
        assert_op_err(
            eval(&Op::Gather { axis: 0 }, &[&x, &i64s(&[1], &[3])]),
            "Gather",
            "index 3 is out of range for an axis of 3",
        );
        let t = infer(
            &Op::Gather { axis: 0 },
            &[ty(DType::F32, "v 8"), ty(DType::I64, "b s")],
        )
        .unwrap();
        assert_eq!(t[0], ty(DType::F32, "b s 8"));
    }

    #[test]
    fn gather_elements() {
        let x = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let ids = i64s(&[2, 2], &[0, 0, 1, -2]);
        assert_eq!(
            eval1(&Op::GatherElements { axis: 1 }, &[&x, &ids]).1,
            vec![1.0, 1.0, 4.0, 3.0]
        );
        let rows = i64s(&[1, 2], &[1, 0]);
        assert_eq!(
            eval1(&Op::GatherElements { axis: 0 }, &[&x, &rows]).1,
            vec![3.0, 2.0]
        );
    }

    #[test]
    fn gather_nd_with_batch_dims() {
        let x = ints(DType::I32, &[2, 2], &[0, 1, 2, 3]);
        let ids = i64s(&[2, 2], &[0, 0, 1, 1]);
        assert_eq!(
            eval1(&Op::GatherNd { batch_dims: 0 }, &[&x, &ids]),
            (vec![2], vec![0.0, 3.0])
        );
        let rows = i64s(&[2, 1], &[1, 0]);
        assert_eq!(
            eval1(&Op::GatherNd { batch_dims: 0 }, &[&x, &rows]),
            (vec![2, 2], vec![2.0, 3.0, 0.0, 1.0])
        );
        let x3 = ints(DType::I32, &[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
        let b = i64s(&[2, 1], &[1, 0]);
        assert_eq!(
            eval1(&Op::GatherNd { batch_dims: 1 }, &[&x3, &b]),
            (vec![2, 2], vec![2.0, 3.0, 4.0, 5.0])
        );
        assert_op_err(
            infer(
                &Op::GatherNd { batch_dims: 0 },
                &[ty(DType::F32, "2"), ty(DType::I64, "1 2")],
            ),
            "GatherNd",
            "indices [1, 2] do not fit data [2] with batch_dims 0",
        );
    }

    #[test]
    fn embedding_lookup() {
        let table = f32s(&[3, 2], &[0.0, 0.1, 1.0, 1.1, 2.0, 2.1]);
        let ids = i64s(&[1, 2], &[2, 0]);
        assert_eq!(
            eval1(&Op::Embedding, &[&table, &ids]),
            (
                vec![1, 2, 2],
                [2.0f32, 2.1, 0.0, 0.1].iter().map(|&v| v as f64).collect()
            )
        );
        let t = infer(
            &Op::Embedding,
            &[ty(DType::F32, "50257 768"), ty(DType::I64, "b s")],
        )
        .unwrap();
        assert_eq!(t[0], ty(DType::F32, "b s 768"));
        assert_op_err(
            infer(
                &Op::Embedding,
                &[ty(DType::F32, "50257 768"), ty(DType::F32, "b s")],
            ),
            "Embedding",
            "input 1 must be an integer tensor, got f32",
        );
    }
}

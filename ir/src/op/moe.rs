//! Mixture-of-experts ops: `MoeRouter` (softmax → top-k → renormalise, as in
//! Mixtral) and `MoeExperts` (per-token weighted sum of expert MLPs). The
//! expert products go through `matrixmultiply`, one gathered batch per expert.

use super::elementwise::activate;
use super::kernel_util::{
    dim, finish, float_kernel, gemm, invalid, numel, prod, tensor, EvalCtx, InferCtx, Mat, Real,
};
use super::{Activation, OpError, TensorType};
use crate::{DType, Dim, Value};

/// `MoeRouter(logits[..., e])` → `(weights[..., k], indices[..., k] i64)`.
pub(super) fn infer_router(cx: &InferCtx, top_k: usize) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.float(0)?;
    let Some((experts, lead)) = x.shape.0.split_last() else {
        return Err(invalid(cx.op, "logits must have an experts dim"));
    };
    if top_k == 0 || experts.fixed().is_some_and(|e| top_k > e) {
        return Err(invalid(cx.op, format!("top_k {top_k} must be in 1..={experts}")));
    }
    let mut dims = lead.to_vec();
    dims.push(Dim::Fixed(top_k));
    Ok(vec![tensor(x.dtype, dims.clone()), tensor(DType::I64, dims)])
}

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

/// `MoeExperts(x[..., h], weights[..., k], indices[..., k], w_in[e,h,f],
/// w_out[e,f,h], w_gate[e,h,f]?)` → `[..., h]`.
pub(super) fn infer_experts(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(5, 6)?;
    let x = cx.float(0)?;
    for i in [1, 3, 4] {
        cx.same_dtype(0, i)?;
    }
    cx.int(2)?;
    let rank = x.shape.rank();
    if rank == 0 {
        return Err(invalid(cx.op, "input must have a hidden dim"));
    }
    let (w, ids) = (cx.rank(1, rank)?, cx.rank(2, rank)?);
    let (win, wout) = (cx.rank(3, 3)?, cx.rank(4, 3)?);
    let xd = &x.shape.0;
    let mismatch = |a: &Dim, b: &Dim| matches!((a, b), (Dim::Fixed(p), Dim::Fixed(q)) if p != q);
    let bad = (0..rank - 1).any(|i| mismatch(&xd[i], &w[i]) || mismatch(&xd[i], &ids[i]))
        || mismatch(&w[rank - 1], &ids[rank - 1])
        || mismatch(&xd[rank - 1], &win[1])
        || mismatch(&xd[rank - 1], &wout[2])
        || mismatch(&win[2], &wout[1])
        || mismatch(&win[0], &wout[0]);
    if bad {
        return Err(invalid(
            cx.op,
            "input, routing and expert weight shapes do not agree",
        ));
    }
    if cx.opt(5).is_some() {
        cx.same_dtype(0, 5)?;
        let gate = cx.rank(5, 3)?;
        if (0..3).any(|i| mismatch(&gate[i], &win[i])) {
            return Err(invalid(cx.op, "gate weights must have the shape of w_in"));
        }
    }
    Ok(vec![x.clone()])
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
    let k = idv.shape.last().copied().unwrap_or(1);
    let tokens = prod(&xv.shape) / h.max(1);
    // Tokens routed to each expert, with their weights.
    let mut routed: Vec<Vec<(usize, T)>> = vec![Vec::new(); e];
    for (slot, &id) in ids.iter().enumerate() {
        let ex = usize::try_from(id)
            .ok()
            .filter(|&ex| ex < e)
            .ok_or_else(|| invalid(cx.op, format!("expert index {id} is outside 0..{e}")))?;
        routed[ex].push((slot / k.max(1), w[slot]));
    }
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

/// FLOPs of the routed expert MLPs: each of `tokens·k` assignments runs two
/// (three when gated) `h×f` products; backward doubles the products.
pub(super) fn experts_flops(inputs: &[Option<&TensorType>]) -> (f64, f64) {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(x), Some(ids), Some(win)) = (get(0), get(2), get(3)) else {
        return (0.0, 0.0);
    };
    let assignments = numel(ids);
    let (h, f) = (dim(win, 1), dim(win, 2));
    let products = if get(5).is_some() { 3.0 } else { 2.0 };
    let mm = assignments * products * 2.0 * h * f;
    let ew = assignments * f * 4.0 + numel(x) * 2.0;
    (mm + ew, 2.0 * mm + ew)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    #[test]
    fn router_picks_top_k_and_renormalises() {
        let logits = f32s(&[1, 3], &[1.0, 3.0, 2.0]);
        let out = eval(&Op::MoeRouter { top_k: 2 }, &[&logits]).unwrap();
        assert_close(&out[0].to_f64_vec(), &[0.731059, 0.268941], 1e-6);
        assert_eq!(out[1].as_i64().unwrap(), &[1, 2]);
        let types = infer(&Op::MoeRouter { top_k: 2 }, &[ty(DType::F32, "t 8")]).unwrap();
        assert_eq!(types, vec![ty(DType::F32, "t 2"), ty(DType::I64, "t 2")]);
        assert_op_err(
            infer(&Op::MoeRouter { top_k: 9 }, &[ty(DType::F32, "t 8")]),
            "MoeRouter",
            "top_k 9 must be in 1..=8",
        );
    }

    #[test]
    fn experts_weighted_sum() {
        let op = Op::MoeExperts {
            activation: Activation::Relu,
        };
        let x = f32s(&[1, 1], &[3.0]);
        let w = f32s(&[1, 2], &[0.5, 0.25]);
        let ids = i64s(&[1, 2], &[0, 1]);
        let w_in = f32s(&[2, 1, 1], &[1.0, 2.0]);
        let w_out = f32s(&[2, 1, 1], &[1.0, 10.0]);
        // 0.5·relu(3·1)·1 + 0.25·relu(3·2)·10
        assert_eq!(eval1(&op, &[&x, &w, &ids, &w_in, &w_out]).1, vec![16.5]);
        let gate = f32s(&[2, 1, 1], &[0.0, -1.0]);
        // Gated: relu(x·gate) ⊙ (x·w_in) → both experts give zero.
        assert_eq!(eval1(&op, &[&x, &w, &ids, &w_in, &w_out, &gate]).1, vec![0.0]);
        let bad = i64s(&[1, 2], &[0, 2]);
        assert_op_err(
            eval(&op, &[&x, &w, &bad, &w_in, &w_out]),
            "MoeExperts",
            "expert index 2 is outside 0..2",
        );
    }
}

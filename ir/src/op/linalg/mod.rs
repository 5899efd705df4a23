//! Matrix products: `MatMul` (numpy semantics), `Gemm`, and the canonical
//! `Linear`. Float products go through the `gemm` crate; integer `MatMul`
//! uses a plain wrapping loop.

use super::broadcast::{broadcast_shapes, source_index};
use super::context::{invalid, tensor, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::{dim, numel};
use super::{Op, OpError, TensorType};
use crate::{DType, Dim, Shape, Value};

pub(crate) mod backward;
mod kernel;
pub(super) mod shard;
use kernel::{eval_gemm, eval_linear, eval_matmul};

/// True unless two contraction dims are provably different.
fn dims_agree(a: &Dim, b: &Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x == y,
        (Dim::Sym(x), Dim::Sym(y)) => x == y,
        _ => true,
    }
}

fn check_contraction(cx: &InferCtx, a: &Dim, b: &Dim) -> Result<(), OpError> {
    if !dims_agree(a, b) {
        return Err(invalid(cx.op, format!("contraction dims differ ({a} vs {b})")));
    }
    Ok(())
}

/// `MatMul`: batch dims broadcast, a 1-D operand is promoted to a matrix and
/// its dim dropped from the result.
pub(super) fn infer_matmul(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    cx.same_dtype(0, 1)?;
    let (a, b) = (cx.ty(0)?, cx.ty(1)?);
    if a.dtype == DType::Bool {
        return Err(invalid(cx.op, "bool inputs are not supported"));
    }
    let (ra, rb) = (a.shape.rank(), b.shape.rank());
    if ra == 0 || rb == 0 {
        return Err(invalid(cx.op, "scalar operands are not allowed"));
    }
    let ad = &a.shape.0;
    let bd = &b.shape.0;
    let ka = &ad[ra - 1];
    let kb = if rb == 1 { &bd[0] } else { &bd[rb - 2] };
    check_contraction(cx, ka, kb)?;
    let a_batch = Shape(ad[..ra.saturating_sub(2)].to_vec());
    let b_batch = Shape(bd[..rb.saturating_sub(2)].to_vec());
    let mut out = broadcast_shapes(cx.op, &[&a_batch, &b_batch])?.0;
    if ra > 1 {
        out.push(ad[ra - 2].clone());
    }
    if rb > 1 {
        out.push(bd[rb - 1].clone());
    }
    Ok(vec![tensor(a.dtype, out)])
}

/// Rows of each product a `MatMul` of `a` by `b` (shapes) runs: a batch
/// of matrices times one matrix they share runs as one product of all
/// their rows when every row rounds as it would in its own matrix's
/// product (`threads::rows_group_alike`), and the shared matrix is packed
/// once; otherwise each matrix is its own product. The kernel runs it and the cost models price it.
pub fn matmul_rows(a: &[usize], b: &[usize]) -> usize {
    let g = batched(a, b);
    if joins_batches(&g) {
        g.m * g.a_offsets.len()
    } else {
        g.m
    }
}

/// Whether the batch of `g` runs as one product ([`matmul_rows`]): one
/// `B` for every matrix, `A`'s matrices stored one after another, and
/// rows that round alike however they are grouped.
fn joins_batches(g: &Batched) -> bool {
    g.a_offsets.len() > 1
        && super::threads::rows_group_alike(g.n)
        && g.b_offsets.iter().all(|&o| o == g.b_offsets[0])
        && g.a_offsets.iter().enumerate().all(|(i, &o)| o == i * g.m * g.k)
}

/// Operand geometry of a (possibly batched) matrix product.
struct Batched {
    m: usize,
    k: usize,
    n: usize,
    /// For every output matrix, the first element of its A and B operands.
    a_offsets: Vec<usize>,
    b_offsets: Vec<usize>,
}

fn batched(ash: &[usize], bsh: &[usize]) -> Batched {
    let (ra, rb) = (ash.len(), bsh.len());
    let (m, k) = if ra == 1 {
        (1, ash[0])
    } else {
        (ash[ra - 2], ash[ra - 1])
    };
    let n = if rb == 1 { 1 } else { bsh[rb - 1] };
    let a_batch = &ash[..ra.saturating_sub(2)];
    let b_batch = &bsh[..rb.saturating_sub(2)];
    let rank = a_batch.len().max(b_batch.len());
    let out_batch: Vec<usize> = (0..rank)
        .map(|i| {
            let get = |s: &[usize]| (i + s.len()).checked_sub(rank).map_or(1, |j| s[j]);
            get(a_batch).max(get(b_batch))
        })
        .collect();
    let scale = |v: Vec<usize>, size: usize| v.into_iter().map(|i| i * size).collect();
    Batched {
        m,
        k,
        n,
        a_offsets: scale(source_index(a_batch, &out_batch), m * k),
        b_offsets: scale(source_index(b_batch, &out_batch), k * n),
    }
}

fn matmul_int(a: &[i64], b: &[i64], g: &Batched) -> Vec<i64> {
    let mut c = vec![0i64; g.a_offsets.len() * g.m * g.n];
    for (bi, (&ao, &bo)) in g.a_offsets.iter().zip(&g.b_offsets).enumerate() {
        let co = bi * g.m * g.n;
        for i in 0..g.m {
            for l in 0..g.k {
                let x = a[ao + i * g.k + l];
                for j in 0..g.n {
                    let y = b[bo + l * g.n + j];
                    c[co + i * g.n + j] = c[co + i * g.n + j].wrapping_add(x.wrapping_mul(y));
                }
            }
        }
    }
    c
}

/// `Gemm(a, b, c?)`: 2-D float operands; `c` broadcasts to `[m, n]`.
pub(super) fn infer_gemm(cx: &InferCtx, trans_a: bool, trans_b: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 3)?;
    let a = cx.float(0)?;
    cx.same_dtype(0, 1)?;
    let (ad, bd) = (cx.rank(0, 2)?, cx.rank(1, 2)?);
    let (m, ka) = if trans_a {
        (&ad[1], &ad[0])
    } else {
        (&ad[0], &ad[1])
    };
    let (kb, n) = if trans_b {
        (&bd[1], &bd[0])
    } else {
        (&bd[0], &bd[1])
    };
    check_contraction(cx, ka, kb)?;
    let out = Shape(vec![m.clone(), n.clone()]);
    if let Some(c) = cx.opt(2) {
        cx.same_dtype(0, 2)?;
        if c.ty.shape.rank() > 2 || broadcast_shapes(cx.op, &[&out, &c.ty.shape])? != out {
            return Err(invalid(
                cx.op,
                format!("bias shape {} does not broadcast to {out}", c.ty.shape),
            ));
        }
    }
    Ok(vec![TensorType {
        dtype: a.dtype,
        shape: out,
    }])
}

/// `Linear(x[..., in], weight[in, out], bias[out]?)` → `[..., out]`.
pub(super) fn infer_linear(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 3)?;
    let x = cx.float(0)?;
    cx.same_dtype(0, 1)?;
    let w = cx.rank(1, 2)?;
    let Some((last, lead)) = x.shape.0.split_last() else {
        return Err(invalid(cx.op, "input must have at least one dim"));
    };
    check_contraction(cx, last, &w[0])?;
    if cx.opt(2).is_some() {
        cx.same_dtype(0, 2)?;
        let b = cx.rank(2, 1)?;
        if !dims_agree(&b[0], &w[1]) {
            return Err(invalid(
                cx.op,
                format!("bias length {} differs from {} outputs", b[0], w[1]),
            ));
        }
    }
    let mut out = lead.to_vec();
    out.push(w[1].clone());
    Ok(vec![tensor(x.dtype, out)])
}

/// FLOPs of a product with contraction length `k` producing `out`, plus
/// `extra` element-wise FLOPs per output (bias, scaling). Backward computes
/// both operand gradients: twice the product.
pub(super) fn product_flops(out: &TensorType, k: f64, extra: f64) -> (f64, f64) {
    let mm = 2.0 * numel(out) * k;
    let ew = extra * numel(out);
    (mm + ew, 2.0 * mm + ew)
}

/// Contraction length of a `MatMul`/`Linear` (last dim of the first input)
/// or `Gemm` (honouring `trans_a`).
pub(super) fn contraction(a: Option<&TensorType>, trans_a: bool) -> f64 {
    match a {
        Some(t) if trans_a => dim(t, 0),
        Some(t) => dim(t, t.shape.rank().saturating_sub(1)),
        None => 0.0,
    }
}

/// Shape inference of the linear-algebra ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::MatMul => infer_matmul(cx),
        Op::Gemm { trans_a, trans_b, .. } => infer_gemm(cx, *trans_a, *trans_b),
        Op::Linear => infer_linear(cx),
        other => Err(not_in_family(cx.op, other, "linear-algebra")),
    }
}

/// Forward and backward FLOPs of the linear-algebra ops.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], outputs: &[&TensorType]) -> (f64, f64) {
    let input = |i: usize| inputs.get(i).copied().flatten();
    let Some(out) = outputs.first().copied() else {
        return (0.0, 0.0);
    };
    match op {
        Op::MatMul => product_flops(out, contraction(input(0), false), 0.0),
        Op::Linear => {
            let bias = if input(2).is_some() { 1.0 } else { 0.0 };
            product_flops(out, contraction(input(0), false), bias)
        }
        Op::Gemm { trans_a, .. } => {
            let extra = if input(2).is_some() { 2.0 } else { 1.0 };
            product_flops(out, contraction(input(0), *trans_a), extra)
        }
        other => misrouted(other, "linear-algebra"),
    }
}

/// Reference kernels of the linear-algebra ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::MatMul => eval_matmul(cx),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => eval_gemm(cx, *alpha, *beta, *trans_a, *trans_b),
        Op::Linear => eval_linear(cx),
        other => Err(not_in_family(cx.op, other, "linear-algebra")),
    }
}

#[cfg(test)]
mod tests;

//! Matrix products: `MatMul` (numpy semantics), `Gemm`, and the canonical
//! `Linear`. Float products go through `matrixmultiply`; integer `MatMul`
//! uses a plain wrapping loop.

use super::broadcast::{broadcast_shapes, source_index};
use super::kernel_util::{
    dim, finish, float_kernel, gemm, invalid, numel, prod, tensor, EvalCtx, InferCtx, Mat, Real,
};
use super::{OpError, TensorType};
use crate::{DType, Data, Dim, Shape, Value};

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

fn matmul_float<T: Real>(op: &str, a: &[T], b: &[T], g: &Batched) -> Result<Vec<T>, OpError> {
    let mut c = vec![T::zero(); g.a_offsets.len() * g.m * g.n];
    for (i, (&ao, &bo)) in g.a_offsets.iter().zip(&g.b_offsets).enumerate() {
        let am = Mat::row_major(a, ao, g.k, false);
        let bm = Mat::row_major(b, bo, g.n, false);
        gemm(
            op,
            g.m,
            g.k,
            g.n,
            T::one(),
            am,
            bm,
            T::zero(),
            &mut c,
            i * g.m * g.n,
        )?;
    }
    Ok(c)
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

/// Reference kernel for `MatMul`.
pub(super) fn eval_matmul(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let g = batched(&a.shape, &b.shape);
    let data = match (&a.data, &b.data) {
        (Data::I64(x), Data::I64(y)) => Data::I64(matmul_int(x, y, &g)),
        _ => float_kernel!(cx.op, a, T => matmul_float::<T>(cx.op, cx.floats(0)?, cx.floats(1)?, &g)?),
    };
    Ok(vec![finish(cx.out_dtype(0), cx.out_shape(0)?, data)])
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

/// `C` broadcast to `[rows, cols]` and scaled, as the accumulator of a product.
fn bias_init<T: Real>(c: Option<(&[T], &[usize])>, rows: usize, cols: usize, beta: T) -> Vec<T> {
    match c {
        Some((data, shape)) if beta != T::zero() => source_index(shape, &[rows, cols])
            .into_iter()
            .map(|i| data[i] * beta)
            .collect(),
        _ => vec![T::zero(); rows * cols],
    }
}

fn gemm_float<T: Real>(cx: &EvalCtx, alpha: f64, beta: f64, ta: bool, tb: bool) -> Result<Vec<T>, OpError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let n = if tb { b.shape[0] } else { b.shape[1] };
    let c = match cx.opt(2) {
        Some(v) => Some((cx.floats::<T>(2)?, &v.shape[..])),
        None => None,
    };
    let mut out = bias_init(c, m, n, T::lit(beta));
    let am = Mat::row_major(cx.floats::<T>(0)?, 0, a.shape[1], ta);
    let bm = Mat::row_major(cx.floats::<T>(1)?, 0, b.shape[1], tb);
    gemm(cx.op, m, k, n, T::lit(alpha), am, bm, T::one(), &mut out, 0)?;
    Ok(out)
}

/// Reference kernel for `Gemm`.
pub(super) fn eval_gemm(
    cx: &EvalCtx,
    alpha: f64,
    beta: f64,
    ta: bool,
    tb: bool,
) -> Result<Vec<Value>, OpError> {
    let a = cx.input(0)?;
    let data = float_kernel!(cx.op, a, T => gemm_float::<T>(cx, alpha, beta, ta, tb)?);
    Ok(vec![finish(a.dtype, cx.out_shape(0)?, data)])
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

fn linear_float<T: Real>(cx: &EvalCtx) -> Result<Vec<T>, OpError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let (k, n) = (w.shape[0], w.shape[1]);
    let rows = prod(&x.shape[..x.shape.len().saturating_sub(1)]);
    let bias = match cx.opt(2) {
        Some(b) => Some((cx.floats::<T>(2)?, &b.shape[..])),
        None => None,
    };
    let mut out = bias_init(bias, rows, n, T::one());
    let xm = Mat::row_major(cx.floats::<T>(0)?, 0, k, false);
    let wm = Mat::row_major(cx.floats::<T>(1)?, 0, n, false);
    gemm(cx.op, rows, k, n, T::one(), xm, wm, T::one(), &mut out, 0)?;
    Ok(out)
}

/// Reference kernel for `Linear`.
pub(super) fn eval_linear(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data = float_kernel!(cx.op, x, T => linear_float::<T>(cx)?);
    Ok(vec![finish(x.dtype, cx.out_shape(0)?, data)])
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    #[test]
    fn matmul_2d() {
        let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = f32s(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        assert_eq!(
            eval1(&Op::MatMul, &[&a, &b]),
            (vec![2, 2], vec![58.0, 64.0, 139.0, 154.0])
        );
    }

    #[test]
    fn matmul_batch_broadcast_and_1d_promotion() {
        // a: [2,1,2,2] (two identity-scaled matrices), b: [3,2,2].
        let a = f32s(&[2, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]);
        let b = f32s(&[3, 2, 2], &(0..12).map(|i| i as f32).collect::<Vec<_>>());
        let (shape, out) = eval1(&Op::MatMul, &[&a, &b]);
        assert_eq!(shape, vec![2, 3, 2, 2]);
        assert_eq!(&out[..4], &[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(&out[20..], &[16.0, 18.0, 20.0, 22.0]);
        let v = f32s(&[3], &[1.0, 1.0, 1.0]);
        let m = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(eval1(&Op::MatMul, &[&v, &m]), (vec![2], vec![9.0, 12.0]));
        let mt = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(eval1(&Op::MatMul, &[&mt, &v]), (vec![2], vec![6.0, 15.0]));
        assert_eq!(eval1(&Op::MatMul, &[&v, &v]), (vec![], vec![3.0]));
    }

    #[test]
    fn matmul_integers_and_f64() {
        let a = ints(DType::I32, &[1, 2], &[2, 3]);
        let b = ints(DType::I32, &[2, 1], &[4, 5]);
        assert_eq!(eval1(&Op::MatMul, &[&a, &b]).1, vec![23.0]);
        let a = Value::f64(vec![1, 2], vec![0.5, 0.25]).unwrap();
        let b = Value::f64(vec![2, 1], vec![2.0, 4.0]).unwrap();
        let out = eval(&Op::MatMul, &[&a, &b]).unwrap();
        assert_eq!((out[0].dtype, out[0].to_f64_vec()), (DType::F64, vec![2.0]));
    }

    #[test]
    fn matmul_symbolic_inference_and_errors() {
        let out = infer(&Op::MatMul, &[ty(DType::F32, "b s 64"), ty(DType::F32, "64 128")]).unwrap();
        assert_eq!(out[0], ty(DType::F32, "b s 128"));
        let out = infer(
            &Op::MatMul,
            &[ty(DType::F32, "b h s d"), ty(DType::F32, "b h d t")],
        )
        .unwrap();
        assert_eq!(out[0], ty(DType::F32, "b h s t"));
        assert_op_err(
            infer(&Op::MatMul, &[ty(DType::F32, "2 3"), ty(DType::F32, "4 5")]),
            "MatMul",
            "contraction dims differ (3 vs 4)",
        );
        assert_op_err(
            infer(&Op::MatMul, &[ty(DType::F32, ""), ty(DType::F32, "4 5")]),
            "MatMul",
            "scalar operands are not allowed",
        );
    }

    #[test]
    fn gemm_transposes_scales_and_broadcasts_bias() {
        let op = Op::Gemm {
            alpha: 2.0,
            beta: 0.5,
            trans_a: true,
            trans_b: true,
        };
        let a = f32s(&[2, 1], &[1.0, 2.0]); // aᵀ = [[1, 2]]
        let b = f32s(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]); // bᵀ columns
        let c = f32s(&[3], &[2.0, 4.0, 6.0]);
        assert_eq!(eval1(&op, &[&a, &b, &c]), (vec![1, 3], vec![3.0, 6.0, 9.0]));
        let plain = Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: false,
        };
        assert_op_err(
            infer(
                &plain,
                &[ty(DType::F32, "2 3"), ty(DType::F32, "3 4"), ty(DType::F32, "3")],
            ),
            "Gemm",
            "shapes [2, 4] and [3] do not broadcast",
        );
        assert_eq!(
            infer(
                &plain,
                &[
                    ty(DType::F32, "m 3"),
                    ty(DType::F32, "3 4"),
                    ty(DType::F32, "1 4")
                ]
            )
            .unwrap()[0],
            ty(DType::F32, "m 4")
        );
    }

    #[test]
    fn linear_with_bias() {
        let out = infer(
            &Op::Linear,
            &[
                ty(DType::F32, "b s 4"),
                ty(DType::F32, "4 8"),
                ty(DType::F32, "8"),
            ],
        )
        .unwrap();
        assert_eq!(out[0], ty(DType::F32, "b s 8"));
        let x = f32s(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let w = f32s(&[2, 1], &[1.0, 10.0]);
        let bias = f32s(&[1], &[0.5]);
        assert_eq!(
            eval1(&Op::Linear, &[&x, &w, &bias]),
            (vec![1, 2, 1], vec![21.5, 43.5])
        );
        assert_op_err(
            infer(&Op::Linear, &[ty(DType::F32, "b 5"), ty(DType::F32, "4 8")]),
            "Linear",
            "contraction dims differ (5 vs 4)",
        );
    }

    #[test]
    fn product_costs() {
        let (a, b, o) = (
            ty(DType::F32, "2 3"),
            ty(DType::F32, "3 4"),
            ty(DType::F32, "2 4"),
        );
        let c = Op::MatMul.cost(&[Some(&a), Some(&b)], &[&o]);
        assert_eq!((c.forward_flops, c.backward_flops), (48.0, 96.0));
        assert_eq!((c.bytes_read, c.bytes_written), (72.0, 32.0));
    }
}

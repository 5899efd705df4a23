//! Element-wise ops: `Unary`, `Binary` (numpy broadcasting), `Where`, `Cast`,
//! `Clip`, `Silu`, `Gelu`. Float math runs in the storage precision (`f32`
//! for `f16`/`bf16`, rounded on output); integers in `i64` wrapped to their
//! logical type, `u64` compared and divided as unsigned.

use super::broadcast::{broadcast_shapes, source_index, zip_broadcast};
use super::kernel_util::{
    finish, float_kernel, int_cmp, invalid, numel, unsupported, zip_data, EvalCtx, InferCtx, Real,
};
use super::{Activation, BinaryOp, GeluApprox, OpError, TensorType, UnaryOp};
use crate::{lowp, DType, Data, RoundMode, Shape, Value};
use std::cmp::Ordering;

/// FLOPs per element charged for GELU (erf or tanh polynomial and products).
const GELU_FLOPS: f64 = 8.0;
/// FLOPs per element charged for SiLU (exp, add, divide, multiply).
const SILU_FLOPS: f64 = 4.0;

fn same_shape_out(cx: &InferCtx, dtype: DType) -> Result<Vec<TensorType>, OpError> {
    Ok(vec![TensorType {
        dtype,
        shape: cx.ty(0)?.shape.clone(),
    }])
}

/// `Unary`: one input, same type out; `Not` takes bools, the math functions
/// floats, `Neg`/`Abs`/`Sign`/`Relu` any number, `Identity` anything.
pub(super) fn infer_unary(cx: &InferCtx, func: UnaryOp) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let dt = cx.ty(0)?.dtype;
    let ok = match func {
        UnaryOp::Not => dt == DType::Bool,
        UnaryOp::Identity => true,
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Relu => dt != DType::Bool,
        _ => dt.is_float(),
    };
    if !ok {
        return Err(invalid(cx.op, format!("input type {dt} is not supported")));
    }
    same_shape_out(cx, dt)
}

fn sigmoid<T: Real>(x: T) -> T {
    if x >= T::zero() {
        T::one() / (T::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::one() + e)
    }
}

fn unary_float<T: Real>(func: UnaryOp, x: T) -> T {
    match func {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Reciprocal => x.recip(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Erf => x.erf(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Relu if x < T::zero() => T::zero(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Sign if x > T::zero() => T::one(),
        UnaryOp::Sign if x < T::zero() => -T::one(),
        // Relu ≥ 0, Sign of 0/NaN, Identity; `Not` is rejected by inference.
        UnaryOp::Relu | UnaryOp::Sign | UnaryOp::Identity | UnaryOp::Not => x,
    }
}

fn unary_int(func: UnaryOp, dtype: DType, x: i64) -> i64 {
    let unsigned = matches!(dtype, DType::U8 | DType::U16 | DType::U32 | DType::U64);
    match func {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs if !unsigned => x.wrapping_abs(),
        UnaryOp::Sign if unsigned => (x != 0) as i64,
        UnaryOp::Sign => x.signum(),
        UnaryOp::Relu if !unsigned => x.max(0),
        _ => x,
    }
}

/// Reference kernel for `Unary`.
pub(super) fn eval_unary(cx: &EvalCtx, func: UnaryOp) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data = match &x.data {
        Data::F32(d) => Data::F32(d.iter().map(|&v| unary_float(func, v)).collect()),
        Data::F64(d) => Data::F64(d.iter().map(|&v| unary_float(func, v)).collect()),
        Data::I64(d) => Data::I64(d.iter().map(|&v| unary_int(func, x.dtype, v)).collect()),
        Data::Bool(d) => Data::Bool(d.iter().map(|&v| v ^ (func == UnaryOp::Not)).collect()),
        Data::Str(_) => return Err(unsupported(cx.op, "string input")),
    };
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

fn is_comparison(func: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(func, Equal | Less | LessOrEqual | Greater | GreaterOrEqual)
}

fn is_logic(func: BinaryOp) -> bool {
    matches!(func, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
}

/// True for the ops that also accept more than two inputs (ONNX `Sum`,
/// `Max`, `Min` are variadic and map onto these).
fn is_variadic(func: BinaryOp) -> bool {
    matches!(
        func,
        BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min
    )
}

/// `Binary`: broadcast shapes; comparisons give bool, `Pow` the base's type,
/// everything else the (shared) input type.
pub(super) fn infer_binary(cx: &InferCtx, func: BinaryOp) -> Result<Vec<TensorType>, OpError> {
    if is_variadic(func) {
        cx.arity(1, usize::MAX)?;
    } else {
        cx.arity(2, 2)?;
    }
    let types = (0..cx.inputs.len())
        .map(|i| cx.ty(i))
        .collect::<Result<Vec<_>, _>>()?;
    let a = types[0].dtype;
    if func != BinaryOp::Pow {
        for i in 1..types.len() {
            cx.same_dtype(0, i)?;
        }
    } else if types[1].dtype == DType::Bool || a == DType::Bool {
        return Err(invalid(cx.op, "bool operands are not supported"));
    }
    let dtype_ok = if is_logic(func) {
        a == DType::Bool
    } else {
        is_comparison(func) || a != DType::Bool
    };
    if !dtype_ok {
        return Err(invalid(cx.op, format!("input type {a} is not supported")));
    }
    let shapes: Vec<&Shape> = types.iter().map(|t| &t.shape).collect();
    let shape = broadcast_shapes(cx.op, &shapes)?;
    let dtype = if is_comparison(func) { DType::Bool } else { a };
    Ok(vec![TensorType { dtype, shape }])
}

fn compare(func: BinaryOp, ord: Option<Ordering>) -> bool {
    use Ordering::*;
    match func {
        BinaryOp::Equal => ord == Some(Equal),
        BinaryOp::Less => ord == Some(Less),
        BinaryOp::LessOrEqual => matches!(ord, Some(Less | Equal)),
        BinaryOp::Greater => ord == Some(Greater),
        _ => matches!(ord, Some(Greater | Equal)),
    }
}

fn float_arith<T: Real>(func: BinaryOp, x: T, y: T) -> T {
    match func {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Pow => x.powf(y),
        _ if x.is_nan() || y.is_nan() => T::nan(),
        BinaryOp::Max => x.max(y),
        _ => x.min(y),
    }
}

fn int_pow(base: i64, exp: i64) -> i64 {
    match u32::try_from(exp) {
        Ok(e) => base.wrapping_pow(e),
        // Negative exponent: what C's `pow` gives, truncated.
        Err(_) => (base as f64).powf(exp as f64) as i64,
    }
}

fn int_arith(op: &str, func: BinaryOp, dtype: DType, x: i64, y: i64) -> Result<i64, OpError> {
    Ok(match func {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Div if y == 0 => return Err(invalid(op, "integer division by zero")),
        BinaryOp::Div if dtype == DType::U64 => ((x as u64) / (y as u64)) as i64,
        BinaryOp::Div => x.wrapping_div(y),
        BinaryOp::Pow => int_pow(x, y),
        BinaryOp::Max if int_cmp(dtype, x, y) == Ordering::Less => y,
        BinaryOp::Min if int_cmp(dtype, x, y) == Ordering::Greater => y,
        _ => x,
    })
}

fn bool_logic(func: BinaryOp, x: bool, y: bool) -> bool {
    match func {
        BinaryOp::And => x && y,
        BinaryOp::Or => x || y,
        _ => x ^ y,
    }
}

/// `Pow` with mixed operand types: the exponent is brought to the base's
/// storage class; an integer base with a float exponent computes in `f64` and
/// truncates, as onnxruntime's `std::pow` path does.
fn pow_mixed(op: &str, a: &Value, b: &Value, out: &[usize]) -> Result<Data, OpError> {
    let e = b.to_f64_vec();
    let (sh, bsh) = (&a.shape[..], &b.shape[..]);
    Ok(match (&a.data, &b.data) {
        (Data::F32(x), _) => {
            let e: Vec<f32> = e.iter().map(|&v| v as f32).collect();
            Data::F32(zip_broadcast((x, sh), (&e, bsh), out, f32::powf))
        }
        (Data::F64(x), _) => Data::F64(zip_broadcast((x, sh), (&e, bsh), out, f64::powf)),
        (Data::I64(x), Data::I64(y)) => Data::I64(zip_broadcast((x, sh), (y, bsh), out, int_pow)),
        (Data::I64(x), _) => Data::I64(zip_broadcast((x, sh), (&e, bsh), out, |x, y| {
            (x as f64).powf(y) as i64
        })),
        (Data::Bool(_), _) => return Err(invalid(op, "bool base is not supported")),
        (Data::Str(_), _) => return Err(unsupported(op, "string base")),
    })
}

/// One broadcast application of `func` to two values.
fn binary2(op: &str, func: BinaryOp, a: &Value, b: &Value) -> Result<Value, OpError> {
    let out_shape = broadcast_shapes(op, &[&Shape::fixed(&a.shape), &Shape::fixed(&b.shape)])?
        .as_fixed()
        .unwrap_or_default();
    let out = &out_shape[..];
    let (sa, sb) = (&a.shape[..], &b.shape[..]);
    let dtype = if is_comparison(func) { DType::Bool } else { a.dtype };
    let mixed = a.dtype != b.dtype;
    let data = if func == BinaryOp::Pow && mixed {
        pow_mixed(op, a, b, out)?
    } else if is_comparison(func) {
        let cmp = |o| compare(func, o);
        let bools = match (&a.data, &b.data) {
            (Data::F32(x), Data::F32(y)) => {
                zip_broadcast((x, sa), (y, sb), out, |x, y| cmp(x.partial_cmp(&y)))
            }
            (Data::F64(x), Data::F64(y)) => {
                zip_broadcast((x, sa), (y, sb), out, |x, y| cmp(x.partial_cmp(&y)))
            }
            (Data::I64(x), Data::I64(y)) => {
                zip_broadcast((x, sa), (y, sb), out, |x, y| cmp(Some(int_cmp(a.dtype, x, y))))
            }
            (Data::Bool(x), Data::Bool(y)) => {
                zip_broadcast((x, sa), (y, sb), out, |x, y| cmp(x.partial_cmp(&y)))
            }
            (Data::Str(x), Data::Str(y)) => {
                let (ix, iy) = (source_index(sa, out), source_index(sb, out));
                ix.iter()
                    .zip(&iy)
                    .map(|(&i, &j)| cmp(Some(x[i].cmp(&y[j]))))
                    .collect()
            }
            _ => {
                return Err(invalid(
                    op,
                    format!("inputs differ in type ({} vs {})", a.dtype, b.dtype),
                ))
            }
        };
        Data::Bool(bools)
    } else {
        match (&a.data, &b.data) {
            (Data::I64(x), Data::I64(y)) => {
                let r = zip_broadcast((x, sa), (y, sb), out, |x, y| int_arith(op, func, a.dtype, x, y));
                Data::I64(r.into_iter().collect::<Result<_, _>>()?)
            }
            (Data::F32(x), Data::F32(y)) => Data::F32(zip_broadcast((x, sa), (y, sb), out, |x, y| {
                float_arith(func, x, y)
            })),
            (Data::F64(x), Data::F64(y)) => Data::F64(zip_broadcast((x, sa), (y, sb), out, |x, y| {
                float_arith(func, x, y)
            })),
            (Data::Bool(x), Data::Bool(y)) => Data::Bool(zip_broadcast((x, sa), (y, sb), out, |x, y| {
                bool_logic(func, x, y)
            })),
            _ => {
                return Err(invalid(
                    op,
                    format!("inputs differ in type ({} vs {})", a.dtype, b.dtype),
                ))
            }
        }
    };
    Ok(finish(dtype, out_shape, data))
}

/// Reference kernel for `Binary` (folding left over variadic inputs).
pub(super) fn eval_binary(cx: &EvalCtx, func: BinaryOp) -> Result<Vec<Value>, OpError> {
    let first = cx.input(0)?;
    if cx.inputs.len() == 1 {
        // A single-input Sum/Max/Min is the identity.
        return Ok(vec![first.clone()]);
    }
    let mut acc = binary2(cx.op, func, first, cx.input(1)?)?;
    for i in 2..cx.inputs.len() {
        acc = binary2(cx.op, func, &acc, cx.input(i)?)?;
    }
    Ok(vec![acc])
}

/// `Where(cond, x, y)`: bool condition, `x`/`y` of one type, all broadcast.
pub(super) fn infer_where(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 3)?;
    if cx.ty(0)?.dtype != DType::Bool {
        return Err(invalid(cx.op, "condition must be bool"));
    }
    cx.same_dtype(1, 2)?;
    let shapes = [&cx.ty(0)?.shape, &cx.ty(1)?.shape, &cx.ty(2)?.shape];
    Ok(vec![TensorType {
        dtype: cx.ty(1)?.dtype,
        shape: broadcast_shapes(cx.op, &shapes)?,
    }])
}

/// Reference kernel for `Where`.
pub(super) fn eval_where(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let (c, x, y) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let out = cx.out_shape(0)?;
    let Data::Bool(cond) = &c.data else {
        return Err(invalid(cx.op, "condition must be bool"));
    };
    let (ic, ix, iy) = (
        source_index(&c.shape, &out),
        source_index(&x.shape, &out),
        source_index(&y.shape, &out),
    );
    let data = zip_data!(cx.op, x, y, (a, b) => ic.iter().zip(&ix).zip(&iy)
        .map(|((&k, &i), &j)| if cond[k] { a[i] } else { b[j] })
        .collect());
    Ok(vec![finish(x.dtype, out, data)])
}

/// `Cast`: same shape, type `to`; strings are neither read nor written.
pub(super) fn infer_cast(cx: &InferCtx, to: DType) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    if to == DType::String {
        return Err(unsupported(cx.op, "casting to string"));
    }
    same_shape_out(cx, to)
}

/// Float → integer as ONNX's reference (numpy on x86) converts: truncation
/// toward zero; NaN, ±inf and values beyond `i64` give `i64::MIN` (the
/// hardware's "integer indefinite"), which wraps to 0 in every narrower type.
fn float_to_int(x: f64) -> i64 {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    if (-LIMIT..LIMIT).contains(&x) {
        x as i64
    } else {
        i64::MIN
    }
}

/// [`cast_with`] with ONNX's default attributes (saturating, round up).
pub(crate) fn cast_value(op: &str, v: &Value, to: DType) -> Result<Value, OpError> {
    cast_with(op, v, to, true, RoundMode::default())
}

/// Converts a value to `to` with ONNX Cast rules: floats round to nearest
/// (`f16`/`bf16`/float8 directly from `f64`; float8 overflow clamps when
/// `saturate`, else becomes inf/NaN, see [`lowp`]), float→int truncates
/// toward zero and then wraps, int→int wraps, anything→bool is `≠ 0`.
/// Strings are refused.
pub(crate) fn cast_with(
    op: &str,
    v: &Value,
    to: DType,
    saturate: bool,
    round_mode: RoundMode,
) -> Result<Value, OpError> {
    if v.dtype == DType::String || to == DType::String {
        return Err(unsupported(op, format!("casting {} to {to}", v.dtype)));
    }
    let data = match (&v.data, to) {
        (Data::I64(d), t) if t.is_int() => Data::I64(d.clone()),
        (_, DType::Bool) => Data::Bool(v.to_f64_vec().into_iter().map(|x| x != 0.0).collect()),
        (_, DType::F64) => Data::F64(v.to_f64_vec()),
        (_, DType::F32) => Data::F32(v.to_f64_vec().into_iter().map(|x| x as f32).collect()),
        (_, DType::F16) => Data::F32(
            v.to_f64_vec()
                .into_iter()
                .map(|x| half::f16::from_f64(x).to_f32())
                .collect(),
        ),
        (_, DType::Bf16) => Data::F32(
            v.to_f64_vec()
                .into_iter()
                .map(|x| half::bf16::from_f64(x).to_f32())
                .collect(),
        ),
        (_, t) if t.is_lowp_float() => Data::F32(
            v.to_f64_vec()
                .into_iter()
                .map(|x| lowp::cast(t, x, saturate, round_mode))
                .collect(),
        ),
        (_, DType::U64) => Data::I64(
            v.to_f64_vec()
                .into_iter()
                .map(|x| {
                    if (0.0..18_446_744_073_709_551_616.0).contains(&x) {
                        x as u64 as i64
                    } else {
                        float_to_int(x)
                    }
                })
                .collect(),
        ),
        _ => Data::I64(v.to_f64_vec().into_iter().map(float_to_int).collect()),
    };
    Ok(finish(to, v.shape.clone(), data))
}

/// Reference kernel for `Cast`.
pub(super) fn eval_cast(
    cx: &EvalCtx,
    to: DType,
    saturate: bool,
    round_mode: RoundMode,
) -> Result<Vec<Value>, OpError> {
    Ok(vec![cast_with(cx.op, cx.input(0)?, to, saturate, round_mode)?])
}

/// `Clip(x, min?, max?)`: bounds are one-element tensors of `x`'s type.
pub(super) fn infer_clip(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 3)?;
    let x = cx.ty(0)?;
    if x.dtype == DType::Bool {
        return Err(invalid(cx.op, "bool input is not supported"));
    }
    for i in 1..3 {
        if let Some(b) = cx.opt(i) {
            cx.same_dtype(0, i)?;
            if b.ty.shape.as_fixed().map(|s| s.iter().product::<usize>()) != Some(1) {
                return Err(invalid(
                    cx.op,
                    format!("bound {i} must hold one element, got shape {}", b.ty.shape),
                ));
            }
        }
    }
    same_shape_out(cx, x.dtype)
}

fn clip_by<T: Copy>(d: &[T], lo: Option<T>, hi: Option<T>, less: impl Fn(T, T) -> bool) -> Vec<T> {
    d.iter()
        .map(|&x| {
            let x = match lo {
                Some(l) if less(x, l) => l,
                _ => x,
            };
            match hi {
                Some(h) if less(h, x) => h,
                _ => x,
            }
        })
        .collect()
}

/// Reference kernel for `Clip`; a NaN stays NaN, `min > max` gives `max`.
pub(super) fn eval_clip(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let bound = |i: usize| cx.opt(i);
    let data = match &x.data {
        Data::I64(d) => {
            let b = |i| bound(i).and_then(|v: &Value| v.as_i64().and_then(|s| s.first().copied()));
            Data::I64(clip_by(d, b(1), b(2), |p, q| {
                int_cmp(x.dtype, p, q) == Ordering::Less
            }))
        }
        _ => float_kernel!(cx.op, x, T => {
            let b = |i| bound(i).and_then(|v: &Value| T::slice(v).and_then(|s| s.first().copied()));
            clip_by(cx.floats::<T>(0)?, b(1), b(2), |p, q| p < q)
        }),
    };
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

/// `Silu`/`Gelu`: float input, same type out.
pub(super) fn infer_activation(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let t = cx.float(0)?;
    same_shape_out(cx, t.dtype)
}

/// An activation function applied to one element (shared with MoE experts).
pub(crate) fn activate<T: Real>(act: Activation, x: T) -> T {
    let half = T::lit(0.5);
    match act {
        Activation::Silu => x * sigmoid(x),
        Activation::Relu if x < T::zero() => T::zero(),
        Activation::Relu => x,
        Activation::Gelu => half * x * (T::one() + (x * T::lit(std::f64::consts::FRAC_1_SQRT_2)).erf()),
        Activation::GeluTanh => {
            let c = T::lit((2.0 / std::f64::consts::PI).sqrt());
            half * x * (T::one() + (c * (x + T::lit(0.044715) * x * x * x)).tanh())
        }
    }
}

/// The `Activation` that `Silu`/`Gelu` compute.
pub(super) fn activation_of(gelu: Option<GeluApprox>) -> Activation {
    match gelu {
        None => Activation::Silu,
        Some(GeluApprox::None) => Activation::Gelu,
        Some(GeluApprox::Tanh) => Activation::GeluTanh,
    }
}

/// Reference kernel for `Silu` and `Gelu`.
pub(super) fn eval_activation(cx: &EvalCtx, act: Activation) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data = float_kernel!(cx.op, x, T => cx.floats::<T>(0)?.iter().map(|&v| activate(act, v)).collect());
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

/// Forward and backward FLOPs of an element-wise op: one per output element
/// per input combined (GELU and SiLU cost more); the backward pass is about
/// the forward's cost, and zero for ops without float gradients.
pub(super) fn flops(kind: ElementwiseKind, inputs: usize, out: &TensorType) -> (f64, f64) {
    let n = numel(out);
    let fwd = match kind {
        ElementwiseKind::Plain => n * inputs.saturating_sub(1).max(1) as f64,
        ElementwiseKind::Gelu => n * GELU_FLOPS,
        ElementwiseKind::Silu => n * SILU_FLOPS,
    };
    let bwd = if out.dtype.is_float() { fwd } else { 0.0 };
    (fwd, bwd)
}

/// How an element-wise op is priced; see [`flops`].
#[derive(Clone, Copy)]
pub(super) enum ElementwiseKind {
    Plain,
    Gelu,
    Silu,
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    fn bin(func: BinaryOp) -> Op {
        Op::Binary { func }
    }

    #[test]
    fn add_broadcasts_column_against_row() {
        let a = f32s(&[2, 1], &[1.0, 2.0]);
        let b = f32s(&[3], &[10.0, 20.0, 30.0]);
        assert_eq!(
            eval1(&bin(BinaryOp::Add), &[&a, &b]),
            (vec![2, 3], vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0])
        );
    }

    #[test]
    fn symbolic_broadcast_inference() {
        let out = infer(
            &bin(BinaryOp::Mul),
            &[ty(DType::F32, "b s 64"), ty(DType::F32, "64")],
        )
        .unwrap();
        assert_eq!(out[0], ty(DType::F32, "b s 64"));
        let cmp = infer(
            &bin(BinaryOp::Less),
            &[ty(DType::I64, "b 1"), ty(DType::I64, "s 1")],
        );
        assert_op_err(
            cmp,
            "Less",
            "broadcasting different symbolic dims ([b, 1] and [s, 1]) is not supported",
        );
        let cmp = infer(
            &bin(BinaryOp::Less),
            &[ty(DType::I64, "b 1"), ty(DType::I64, "1 4")],
        )
        .unwrap();
        assert_eq!(cmp[0], ty(DType::Bool, "b 4"));
    }

    #[test]
    fn type_errors() {
        assert_op_err(
            infer(&bin(BinaryOp::Add), &[ty(DType::F32, "2"), ty(DType::I64, "2")]),
            "Add",
            "inputs 0 and 1 differ in type (f32 vs i64)",
        );
        assert_op_err(
            infer(&Op::Unary { func: UnaryOp::Not }, &[ty(DType::F32, "2")]),
            "Not",
            "input type f32 is not supported",
        );
        assert_op_err(
            infer(&Op::Unary { func: UnaryOp::Exp }, &[ty(DType::I32, "2")]),
            "Exp",
            "input type i32 is not supported",
        );
        assert!(matches!(
            infer(&bin(BinaryOp::Sub), &[ty(DType::F32, "2")]),
            Err(OpError::Arity { .. })
        ));
    }

    #[test]
    fn integer_division_truncates_and_rejects_zero() {
        let a = ints(DType::I32, &[2], &[-7, 7]);
        let b = ints(DType::I32, &[2], &[2, -2]);
        assert_eq!(eval1(&bin(BinaryOp::Div), &[&a, &b]).1, vec![-3.0, -3.0]);
        let z = ints(DType::I32, &[1], &[0]);
        assert_op_err(
            eval(&bin(BinaryOp::Div), &[&a, &z]),
            "Div",
            "integer division by zero",
        );
    }

    #[test]
    fn integers_wrap_and_u64_compares_unsigned() {
        let a = ints(DType::U8, &[1], &[250]);
        let b = ints(DType::U8, &[1], &[10]);
        assert_eq!(eval1(&bin(BinaryOp::Add), &[&a, &b]).1, vec![4.0]);
        let big = ints(DType::U64, &[1], &[-1]); // u64::MAX
        let one = ints(DType::U64, &[1], &[1]);
        let gt = eval(&bin(BinaryOp::Greater), &[&big, &one]).unwrap();
        assert_eq!(gt[0].data, Data::Bool(vec![true]));
        let max = eval(&bin(BinaryOp::Max), &[&big, &one]).unwrap();
        assert_eq!(max[0].as_i64().unwrap(), &[-1]);
    }

    #[test]
    fn pow_with_mixed_types() {
        let base = f32s(&[2], &[2.0, 3.0]);
        let e = i64s(&[1], &[2]);
        let out = eval(&bin(BinaryOp::Pow), &[&base, &e]).unwrap();
        assert_eq!((out[0].dtype, out[0].to_f64_vec()), (DType::F32, vec![4.0, 9.0]));
        let ib = ints(DType::I32, &[2], &[2, 3]);
        let half = f32s(&[1], &[0.5]);
        assert_eq!(eval1(&bin(BinaryOp::Pow), &[&ib, &half]).1, vec![1.0, 1.0]);
        let ie = ints(DType::I32, &[2], &[3, -1]);
        assert_eq!(eval1(&bin(BinaryOp::Pow), &[&ib, &ie]).1, vec![8.0, 0.0]);
    }

    #[test]
    fn variadic_max_folds_left() {
        let (a, b, c) = (
            f32s(&[2], &[1.0, 5.0]),
            f32s(&[2], &[3.0, 2.0]),
            f32s(&[1], &[4.0]),
        );
        assert_eq!(eval1(&bin(BinaryOp::Max), &[&a, &b, &c]).1, vec![4.0, 5.0]);
    }

    #[test]
    fn half_precision_results_are_rounded() {
        let a = Value::new(DType::F16, vec![1], Data::F32(vec![1.0])).unwrap();
        let b = Value::new(DType::F16, vec![1], Data::F32(vec![0.0004])).unwrap();
        let out = eval(&bin(BinaryOp::Add), &[&a, &b]).unwrap();
        assert_eq!((out[0].dtype, out[0].to_f64_vec()), (DType::F16, vec![1.0]));
    }

    #[test]
    fn unary_functions() {
        let x = f32s(&[3], &[-1.0, 0.0, 2.0]);
        let run = |func| eval1(&Op::Unary { func }, &[&x]).1;
        assert_eq!(run(UnaryOp::Relu), vec![0.0, 0.0, 2.0]);
        assert_eq!(run(UnaryOp::Sign), vec![-1.0, 0.0, 1.0]);
        assert_close(&run(UnaryOp::Sigmoid), &[0.268941, 0.5, 0.880797], 1e-6);
        assert_close(&run(UnaryOp::Erf), &[-0.842701, 0.0, 0.995322], 1e-6);
        let i = ints(DType::I8, &[2], &[-128, 5]);
        assert_eq!(
            eval1(&Op::Unary { func: UnaryOp::Neg }, &[&i]).1,
            vec![-128.0, -5.0]
        );
        let b = bools(&[2], &[true, false]);
        assert_eq!(
            eval(&Op::Unary { func: UnaryOp::Not }, &[&b]).unwrap()[0].data,
            Data::Bool(vec![false, true])
        );
    }

    #[test]
    fn where_broadcasts_all_three() {
        let c = bools(&[2, 1], &[true, false]);
        let x = f32s(&[2], &[1.0, 2.0]);
        let y = f32s(&[], &[0.0]);
        assert_eq!(
            eval1(&Op::Where, &[&c, &x, &y]),
            (vec![2, 2], vec![1.0, 2.0, 0.0, 0.0])
        );
        assert_op_err(
            infer(
                &Op::Where,
                &[ty(DType::F32, "2"), ty(DType::F32, "2"), ty(DType::F32, "2")],
            ),
            "Where",
            "condition must be bool",
        );
    }

    #[test]
    fn cast_rules() {
        let x = f32s(&[4], &[1.7, -1.7, 300.0, 0.0]);
        let to = |to| eval(&Op::cast(to), &[&x]).unwrap().remove(0);
        assert_eq!(to(DType::I32).as_i64().unwrap(), &[1, -1, 300, 0]);
        assert_eq!(to(DType::U8).as_i64().unwrap(), &[1, 255, 44, 0]);
        assert_eq!(to(DType::Bool).data, Data::Bool(vec![true, true, true, false]));
        let h = f32s(&[1], &[1.0001]);
        assert_eq!(eval1(&Op::cast(DType::F16), &[&h]).1, vec![1.0]);
        let d = Value::f64(vec![1], vec![1.0 + 1.0 / 256.0]).unwrap();
        assert_eq!(eval1(&Op::cast(DType::Bf16), &[&d]).1, vec![1.0]);
        let b = bools(&[2], &[true, false]);
        assert_eq!(eval1(&Op::cast(DType::F64), &[&b]).1, vec![1.0, 0.0]);
        let big = ints(DType::I64, &[1], &[-1]);
        assert_eq!(
            eval(&Op::cast(DType::U64), &[&big]).unwrap()[0].to_f64_vec(),
            vec![u64::MAX as f64]
        );
    }

    #[test]
    fn cast_to_low_precision_types() {
        let x = f32s(&[5], &[0.48, 1e6, f32::NAN, -17.0, f32::INFINITY]);
        let to = |to, saturate| {
            let op = Op::Cast {
                to,
                saturate,
                round_mode: RoundMode::Up,
            };
            eval1(&op, &[&x]).1
        };
        let sat = to(DType::F8E4M3Fn, true);
        assert_eq!((sat[0], sat[1], sat[3], sat[4]), (0.46875, 448.0, -16.0, 448.0));
        assert!(sat[2].is_nan());
        let e5m2 = to(DType::F8E5M2, false);
        assert_eq!((e5m2[1], e5m2[4]), (f64::INFINITY, f64::INFINITY));
        assert!(to(DType::F8E4M3Fnuz, false)[1].is_nan());
        // int4 truncates then wraps (-17 → -1); NaN/inf give 0.
        let i4 = eval(&Op::cast(DType::I4), &[&x]).unwrap().remove(0);
        assert_eq!(i4.as_i64().unwrap(), &[0, 0, 0, -1, 0]);
        let u2 = eval(&Op::cast(DType::U2), &[&ints(DType::I8, &[3], &[-1, 4, 6])]).unwrap();
        assert_eq!(u2[0].as_i64().unwrap(), &[3, 0, 2]);
        let e8 = |round_mode| {
            let op = Op::Cast {
                to: DType::F8E8M0,
                saturate: true,
                round_mode,
            };
            eval1(&op, &[&f32s(&[1], &[1.6])]).1
        };
        assert_eq!((e8(RoundMode::Up), e8(RoundMode::Down)), (vec![2.0], vec![1.0]));
    }

    #[test]
    fn strings_compare_equal_and_nothing_else() {
        let s =
            |v: &[&str]| Value::strings(vec![v.len()], v.iter().map(|x| x.to_string()).collect()).unwrap();
        let (a, b) = (s(&["x", "y", "z"]), s(&["y"]));
        let out = eval(&bin(BinaryOp::Equal), &[&a, &b]).unwrap();
        assert_eq!(out[0].data, Data::Bool(vec![false, true, false]));
        let unsupported = |r: Result<Vec<Value>, OpError>| matches!(r, Err(OpError::Unsupported { .. }));
        assert!(unsupported(eval(&bin(BinaryOp::Less), &[&a, &b])));
        for op in [
            Op::cast(DType::F32),
            Op::Unary {
                func: UnaryOp::Identity,
            },
        ] {
            assert!(unsupported(eval(&op, &[&a])), "{op:?}");
        }
        assert!(unsupported(eval(
            &Op::cast(DType::String),
            &[&f32s(&[1], &[1.0])]
        )));
    }

    #[test]
    fn clip_bounds() {
        let x = f32s(&[4], &[-2.0, 0.5, 3.0, f32::NAN]);
        let (lo, hi) = (f32s(&[], &[0.0]), f32s(&[], &[1.0]));
        let out = eval1(&Op::Clip, &[&x, &lo, &hi]).1;
        assert_eq!(&out[..3], &[0.0, 0.5, 1.0]);
        assert!(out[3].is_nan());
        let only_max = Op::Clip.eval(&[Some(&x), None, Some(&hi)]).unwrap();
        assert_eq!(&only_max[0].to_f64_vec()[..3], &[-2.0, 0.5, 1.0]);
        let i = ints(DType::I8, &[3], &[-100, 5, 100]);
        let (a, b) = (ints(DType::I8, &[], &[10]), ints(DType::I8, &[], &[0]));
        assert_eq!(
            eval1(&Op::Clip, &[&i, &a, &b]).1,
            vec![0.0, 0.0, 0.0],
            "min > max gives max"
        );
    }

    #[test]
    fn activations() {
        let x = f32s(&[2], &[1.0, -1.0]);
        let gelu = |approximate| eval1(&Op::Gelu { approximate }, &[&x]).1;
        assert_close(&gelu(GeluApprox::None), &[0.841345, -0.158655], 1e-6);
        assert_close(&gelu(GeluApprox::Tanh), &[0.841192, -0.158808], 1e-6);
        assert_close(&eval1(&Op::Silu, &[&x]).1, &[0.731059, -0.268941], 1e-6);
    }

    #[test]
    fn elementwise_cost() {
        let t = ty(DType::F32, "2 3");
        let c = Op::Binary { func: BinaryOp::Add }.cost(&[Some(&t), Some(&t)], &[&t]);
        assert_eq!(
            (c.forward_flops, c.backward_flops, c.bytes_read, c.bytes_written),
            (6.0, 6.0, 48.0, 24.0)
        );
        let b = ty(DType::Bool, "2 3");
        let c = Op::Binary { func: BinaryOp::Less }.cost(&[Some(&t), Some(&t)], &[&b]);
        assert_eq!(c.backward_flops, 0.0);
    }
}

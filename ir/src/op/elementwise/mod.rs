//! Element-wise ops: `Unary`, `Binary` (numpy broadcasting), `Where`, `Cast`,
//! `Clip`, `Silu`, `Gelu`. Float math runs in the storage precision (`f32`
//! for `f16`/`bf16`, rounded on output); integers in `i64` wrapped to their
//! logical type, `u64` compared and divided as unsigned.

use super::broadcast::{broadcast_shapes, source_index, zip_broadcast};
use super::context::{finish, invalid, unsupported, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::numel;
use super::numeric::int_cmp;
use super::{Activation, BinaryOp, GeluApprox, Op, OpError, TensorType, UnaryOp};
use crate::{lowp, DType, Data, RoundMode, Shape, Value};
use std::cmp::Ordering;

pub(super) mod grad;
use super::adjoint::float_outputs;
pub(crate) mod backward;
mod kernel;
pub(super) mod shard;
pub(super) use kernel::activate;
use kernel::{eval_activation, eval_binary, eval_cast, eval_clip, eval_unary, eval_where, float_binary};

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
        BinaryOp::Mod | BinaryOp::Fmod if y == 0 => return Err(invalid(op, "integer modulo by zero")),
        BinaryOp::Mod | BinaryOp::Fmod if dtype == DType::U64 => ((x as u64) % (y as u64)) as i64,
        BinaryOp::Fmod => x.wrapping_rem(y),
        BinaryOp::Mod => {
            let r = x.wrapping_rem(y);
            if r != 0 && (r < 0) != (y < 0) {
                r + y
            } else {
                r
            }
        }
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
            (Data::F32(x), Data::F32(y)) => Data::F32(float_binary(func, (x, sa), (y, sb), out)),
            (Data::F64(x), Data::F64(y)) => Data::F64(float_binary(func, (x, sa), (y, sb), out)),
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

/// `Silu`/`Gelu`: float input, same type out.
pub(super) fn infer_activation(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let t = cx.float(0)?;
    same_shape_out(cx, t.dtype)
}

/// The `Activation` that `Silu`/`Gelu` compute.
pub(super) fn activation_of(gelu: Option<GeluApprox>) -> Activation {
    match gelu {
        None => Activation::Silu,
        Some(GeluApprox::None) => Activation::Gelu,
        Some(GeluApprox::Tanh) => Activation::GeluTanh,
    }
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

/// Shape inference of the element-wise ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Unary { func } => infer_unary(cx, *func),
        Op::Binary { func } => infer_binary(cx, *func),
        Op::Where => infer_where(cx),
        Op::Cast { to, .. } => infer_cast(cx, *to),
        Op::Clip => infer_clip(cx),
        Op::Silu | Op::Gelu { .. } => infer_activation(cx),
        Op::ActivationGrad { .. } => grad::infer(cx),
        other => Err(not_in_family(cx.op, other, "element-wise")),
    }
}

/// Forward and backward FLOPs of the element-wise ops.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], outputs: &[&TensorType]) -> (f64, f64) {
    let priced = |kind| {
        outputs
            .first()
            .map_or((0.0, 0.0), |o| flops(kind, inputs.len(), o))
    };
    match op {
        Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast { .. } | Op::Clip => {
            priced(ElementwiseKind::Plain)
        }
        Op::Silu => priced(ElementwiseKind::Silu),
        Op::Gelu { .. } => priced(ElementwiseKind::Gelu),
        Op::ActivationGrad { .. } => (grad::flops(inputs.first().copied().flatten()), 0.0),
        other => misrouted(other, "element-wise"),
    }
}

/// Reference kernels of the element-wise ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Unary { func } => eval_unary(cx, *func),
        Op::Binary { func } => eval_binary(cx, *func),
        Op::Where => eval_where(cx),
        Op::Cast {
            to,
            saturate,
            round_mode,
        } => eval_cast(cx, *to, *saturate, *round_mode),
        Op::Clip => eval_clip(cx),
        Op::Silu => eval_activation(cx, activation_of(None)),
        Op::Gelu { approximate } => eval_activation(cx, activation_of(Some(*approximate))),
        Op::ActivationGrad { activation } => float_outputs(
            cx,
            || grad::kernel::<f32>(cx, *activation),
            || grad::kernel::<f64>(cx, *activation),
        ),
        other => Err(not_in_family(cx.op, other, "element-wise")),
    }
}

#[cfg(test)]
mod tests;

//! Reference kernels of the element-wise ops: float math in the storage
//! precision, integers wrapped to their logical type.

use super::super::broadcast::{source_index, zip_broadcast};
use super::super::context::{finish, invalid, unsupported, EvalCtx};
use super::super::numeric::{float_kernel, int_cmp, map_v, vectorized, zip_data, Real};
use super::super::{Activation, BinaryOp, OpError, UnaryOp};
use super::{binary2, cast_with, unary_int};
use crate::{DType, Data, RoundMode, Value};
use std::cmp::Ordering;

/// `1 / (1 + e⁻ˣ)`, without a branch (a sign-dependent one mispredicts
/// on activations): `e⁻ˣ` overflows to `inf` only where the result is 0.
#[inline(always)]
pub(crate) fn sigmoid<T: Real>(x: T) -> T {
    T::one() / (T::one() + (-x).exp_v())
}

/// One float element of `func` (inlined, so a loop over a known `func`
/// keeps only its arm).
#[inline(always)]
fn unary_float<T: Real>(func: UnaryOp, x: T) -> T {
    match func {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Reciprocal => x.recip(),
        UnaryOp::Exp => x.exp_v(),
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

/// `func` over `d` in `ways` runs over the rank's threads ([`map_v`]): the
/// ops that vectorize dispatched once, to a loop in code built for AVX2
/// where the CPU has it; the rest (libm calls) element by element. The
/// same bits either way.
fn float_unary<T: Real>(func: UnaryOp, d: &[T], ways: usize) -> Vec<T> {
    macro_rules! by_func {
        ($($f:ident),*) => {
            match func {
                $(UnaryOp::$f => map_v(d, ways, |x| unary_float(UnaryOp::$f, x)),)*
                other => map_v(d, ways, |x| unary_float(other, x)),
            }
        };
    }
    by_func!(Neg, Abs, Sqrt, Reciprocal, Exp, Sigmoid, Relu, Floor, Ceil, Identity)
}

/// `func` over two float inputs broadcast to `out`: the arithmetic that
/// vectorizes dispatched once, to loops in code built for AVX2 where the
/// CPU has it ([`vectorized`]). The same bits either way. It runs on the
/// rank's own thread: memory, not arithmetic, bounds it.
pub(super) fn float_binary<T: Real>(
    func: BinaryOp,
    a: (&[T], &[usize]),
    b: (&[T], &[usize]),
    out: &[usize],
) -> Vec<T> {
    macro_rules! by_func {
        ($($f:ident),*) => {
            match func {
                $(BinaryOp::$f => vectorized(|| zip_broadcast(a, b, out, |x, y| float_arith(BinaryOp::$f, x, y))),)*
                other => zip_broadcast(a, b, out, |x, y| float_arith(other, x, y)),
            }
        };
    }
    by_func!(Add, Sub, Mul, Div, Max, Min)
}

/// Reference kernel for `Unary`.
pub(super) fn eval_unary(cx: &EvalCtx, func: UnaryOp) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data = match &x.data {
        Data::F32(d) => Data::F32(float_unary(func, d, cx.row_ways)),
        Data::F64(d) => Data::F64(float_unary(func, d, cx.row_ways)),
        Data::I64(d) => Data::I64(d.iter().map(|&v| unary_int(func, x.dtype, v)).collect()),
        Data::Bool(d) => Data::Bool(d.iter().map(|&v| v ^ (func == UnaryOp::Not)).collect()),
        Data::Str(_) => return Err(unsupported(cx.op, "string input")),
    };
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

/// One float element of `func` (inlined, as [`unary_float`]).
#[inline(always)]
pub(super) fn float_arith<T: Real>(func: BinaryOp, x: T, y: T) -> T {
    match func {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Fmod => x % y,
        BinaryOp::Mod => floor_mod(x % y, y),
        _ if x.is_nan() || y.is_nan() => T::nan(),
        BinaryOp::Max => x.max(y),
        _ => x.min(y),
    }
}

/// A truncated remainder `r` of a division by `y` moved to `y`'s sign (a
/// floored remainder), without the rounding of `x − y·⌊x/y⌋`.
fn floor_mod<T: Real>(r: T, y: T) -> T {
    if r != T::zero() && (r < T::zero()) != (y < T::zero()) {
        r + y
    } else {
        r
    }
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

/// Reference kernel for `Cast`.
pub(super) fn eval_cast(
    cx: &EvalCtx,
    to: DType,
    saturate: bool,
    round_mode: RoundMode,
) -> Result<Vec<Value>, OpError> {
    Ok(vec![cast_with(cx.op, cx.input(0)?, to, saturate, round_mode)?])
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

/// An activation function applied to one element (shared with MoE experts).
#[inline(always)]
pub(crate) fn activate<T: Real>(act: Activation, x: T) -> T {
    let half = T::lit(0.5);
    match act {
        Activation::Silu => x * sigmoid(x),
        Activation::Relu if x < T::zero() => T::zero(),
        Activation::Relu => x,
        Activation::Gelu => half * x * (T::one() + (x * T::lit(std::f64::consts::FRAC_1_SQRT_2)).erf()),
        // ½·(1 + tanh u) = σ(2u): one exponential instead of a tanh, which
        // took a sixth of a small GPT's CPU step.
        Activation::GeluTanh => x * sigmoid(T::lit(2.0) * gelu_tanh_arg(x)),
    }
}

/// [`activate`] over `xs` in `ways` runs, the function chosen once outside
/// the loop so each loop is small enough to inline and vectorize
/// ([`map_v`]).
fn activate_all<T: Real>(act: Activation, xs: &[T], ways: usize) -> Vec<T> {
    match act {
        Activation::Silu => map_v(xs, ways, |x| activate(Activation::Silu, x)),
        Activation::Relu => map_v(xs, ways, |x| activate(Activation::Relu, x)),
        Activation::Gelu => map_v(xs, ways, |x| activate(Activation::Gelu, x)),
        Activation::GeluTanh => map_v(xs, ways, |x| activate(Activation::GeluTanh, x)),
    }
}

/// `u = √(2/π)·(x + 0.044715·x³)`, GELU's tanh approximation's argument.
#[inline(always)]
pub(crate) fn gelu_tanh_arg<T: Real>(x: T) -> T {
    T::lit((2.0 / std::f64::consts::PI).sqrt()) * (x + T::lit(0.044715) * x * x * x)
}

/// Reference kernel for `Silu` and `Gelu`.
pub(super) fn eval_activation(cx: &EvalCtx, act: Activation) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let data = float_kernel!(cx.op, x, T => activate_all(act, cx.floats::<T>(0)?, cx.row_ways));
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

//! Convolutions and pools over `[batch, channels, spatial...]` tensors
//! (1-D, 2-D, 3-D or more): `Conv` (ONNX Conv, grouped and depthwise
//! included), `ConvTranspose`, `Pool` (MaxPool, AveragePool) and their
//! adjoints `ConvGrad` and `PoolGrad`. Every one reads its windows through
//! one [`Window`], so shape rules, costs and kernels agree on the geometry.
//!
//! The kernels lower a convolution to matrix products over gathered
//! windows (im2col), one per sample and group, through the GEMM the other
//! products use. A transposed convolution is the input-adjoint of a
//! convolution with the same weight, so the two ops share their kernels:
//! `ConvTranspose(x, w)` is the gradient a `Conv` with weight `w` sends to
//! an input of the transposed output's shape.

use super::context::{invalid, tensor, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::numel;
use super::{Op, OpError, TensorType};
use crate::{Dim, Value};
use serde::{Deserialize, Serialize};

use super::adjoint::float_outputs;
pub(crate) mod backward;
mod kernel;
mod pool;
mod sizes;
pub use pool::divisors as pool_divisors;
pub(super) mod shard;
mod window;
pub use sizes::ConvSizes;
pub use window::Window;

/// What a pool takes of each window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum PoolKind {
    /// The largest element (padding never wins).
    Max,
    /// The mean: over the window's elements inside the input, or over
    /// the taps inside the padded input when `count_include_pad`.
    Average { count_include_pad: bool },
}

/// The fixed sizes of `x`'s dims from 1 on (channels and spatial), which
/// window rules need; the batch may stay symbolic.
fn fixed_tail(cx: &InferCtx, x: &TensorType) -> Result<Vec<usize>, OpError> {
    x.shape.0[1..]
        .iter()
        .map(|d| {
            d.fixed().ok_or_else(|| {
                invalid(
                    cx.op,
                    format!("channels and spatial dims must be known, got shape {}", x.shape),
                )
            })
        })
        .collect()
}

/// `x[n, c, d...]` with at least one spatial dim, as windowed ops take it
/// (of integers too where `ints`: the max of a window is exact in them).
fn windowed<'a>(
    cx: &InferCtx<'a, '_>,
    window: &Window,
    ints: bool,
) -> Result<(&'a TensorType, Vec<usize>), OpError> {
    let x = match ints {
        true if cx.ty(0)?.dtype.is_int() => cx.ty(0)?,
        _ => cx.float(0)?,
    };
    if x.shape.rank() < 3 {
        return Err(invalid(
            cx.op,
            format!(
                "input must be [batch, channels, spatial...], got shape {}",
                x.shape
            ),
        ));
    }
    window.check(cx.op, x.shape.rank() - 2)?;
    let tail = fixed_tail(cx, x)?;
    Ok((x, tail))
}

/// `[batch, channels, spatial...]` out.
fn output(x: &TensorType, channels: usize, spatial: Vec<usize>) -> TensorType {
    let mut dims = vec![x.shape.0[0].clone(), Dim::Fixed(channels)];
    dims.extend(spatial.into_iter().map(Dim::Fixed));
    tensor(x.dtype, dims)
}

/// The weight `w[out, in/groups, k...]` of a convolution over `x`
/// (`in_dim` names the weight dim that reads `x`'s channels per group: 1 for
/// `Conv`, 0 for `ConvTranspose`) and its optional bias of `bias_len`.
struct Weight {
    /// Kernel taps per spatial dim.
    kernel: Vec<usize>,
    /// Weight dims 0 and 1.
    rows: usize,
    cols: usize,
}

fn weight(cx: &InferCtx, x: &TensorType, groups: usize) -> Result<Weight, OpError> {
    cx.same_dtype(0, 1)?;
    let w = cx.rank(1, x.shape.rank())?;
    let dims: Vec<usize> = w
        .iter()
        .map(|d| {
            d.fixed()
                .ok_or_else(|| invalid(cx.op, "the weight's shape must be known"))
        })
        .collect::<Result<_, _>>()?;
    if groups == 0 {
        return Err(invalid(cx.op, "group must be at least 1"));
    }
    Ok(Weight {
        kernel: dims[2..].to_vec(),
        rows: dims[0],
        cols: dims[1],
    })
}

/// Checks an optional bias (input 2) is `[channels]` of `x`'s type.
fn bias(cx: &InferCtx, channels: usize) -> Result<(), OpError> {
    if cx.opt(2).is_none() {
        return Ok(());
    }
    cx.same_dtype(0, 2)?;
    let b = cx.rank(2, 1)?;
    if b[0].fixed().is_some_and(|n| n != channels) {
        return Err(invalid(
            cx.op,
            format!("bias must have {channels} elements, got {}", b[0]),
        ));
    }
    Ok(())
}

fn lengths(
    cx: &InferCtx,
    rule: impl Fn(usize) -> Option<usize>,
    spatial: usize,
) -> Result<Vec<usize>, OpError> {
    (0..spatial)
        .map(|i| {
            rule(i).filter(|&n| n > 0).ok_or_else(|| {
                invalid(
                    cx.op,
                    format!("spatial dim {i}: the kernel does not fit the padded input"),
                )
            })
        })
        .collect()
}

/// `Conv(x[n, c, d...], w[m, c/groups, k...], b[m]?)` → `[n, m, o...]`.
fn infer_conv(cx: &InferCtx, window: &Window, groups: usize) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 3)?;
    let (x, tail) = windowed(cx, window, false)?;
    let w = weight(cx, x, groups)?;
    let c = tail[0];
    if w.cols * groups != c || w.rows % groups != 0 {
        return Err(invalid(
            cx.op,
            format!(
                "weight [{}, {}, ...] with {groups} groups does not fit {c} input channels",
                w.rows, w.cols
            ),
        ));
    }
    bias(cx, w.rows)?;
    let spatial = lengths(
        cx,
        |i| window.out_len(i, tail[i + 1], w.kernel[i], false),
        w.kernel.len(),
    )?;
    Ok(vec![output(x, w.rows, spatial)])
}

/// `ConvTranspose(x[n, c, d...], w[c, m/groups, k...], b[m]?)` → `[n, m, o...]`.
fn infer_transpose(
    cx: &InferCtx,
    window: &Window,
    groups: usize,
    output_padding: &[usize],
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 3)?;
    let (x, tail) = windowed(cx, window, false)?;
    let w = weight(cx, x, groups)?;
    let c = tail[0];
    if w.rows != c || c % groups != 0 {
        return Err(invalid(
            cx.op,
            format!(
                "weight [{}, {}, ...] with {groups} groups does not fit {c} input channels",
                w.rows, w.cols
            ),
        ));
    }
    let spatial = w.kernel.len();
    if output_padding.len() != spatial {
        return Err(invalid(
            cx.op,
            format!("output_padding must have {spatial} values"),
        ));
    }
    let m = w.cols * groups;
    bias(cx, m)?;
    let lens = lengths(
        cx,
        |i| window.transposed_len(i, tail[i + 1], w.kernel[i], output_padding[i]),
        spatial,
    )?;
    Ok(vec![output(x, m, lens)])
}

/// `ConvGrad(x, w, dout)` → `(dx, dw)`, shaped as `x` and `w`.
fn infer_grad(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 3)?;
    cx.same_dtype(0, 1)?;
    cx.same_dtype(0, 2)?;
    Ok(vec![cx.float(0)?.clone(), cx.float(1)?.clone()])
}

/// `Pool(x[n, c, d...])` → `[n, c, o...]`.
fn infer_pool(
    cx: &InferCtx,
    kind: PoolKind,
    kernel: &[usize],
    window: &Window,
    ceil: bool,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let (x, tail) = windowed(cx, window, kind == PoolKind::Max)?;
    if kernel.len() != tail.len() - 1 || kernel.contains(&0) {
        return Err(invalid(
            cx.op,
            format!(
                "kernel_shape {kernel:?} must give a positive size to each of the {} spatial dims",
                tail.len() - 1
            ),
        ));
    }
    for i in 0..kernel.len() {
        if window.pads[i] >= window.span(i, kernel[i])
            || window.pads[kernel.len() + i] >= window.span(i, kernel[i])
        {
            return Err(invalid(cx.op, "pads must be smaller than the kernel"));
        }
    }
    let spatial = lengths(
        cx,
        |i| window.out_len(i, tail[i + 1], kernel[i], ceil),
        kernel.len(),
    )?;
    Ok(vec![output(x, tail[0], spatial)])
}

/// `PoolGrad(x, dout)` → `dx`.
fn infer_pool_grad(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    cx.same_dtype(0, 1)?;
    Ok(vec![cx.float(0)?.clone()])
}

/// Shape inference of the convolution and pooling ops.
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Conv { window, groups } => infer_conv(cx, window, *groups),
        Op::ConvTranspose {
            window,
            groups,
            output_padding,
        } => infer_transpose(cx, window, *groups, output_padding),
        Op::ConvGrad { .. } => infer_grad(cx),
        Op::Pool {
            kind,
            kernel,
            window,
            ceil_mode,
        } => infer_pool(cx, *kind, kernel, window, *ceil_mode),
        Op::PoolGrad { .. } => infer_pool_grad(cx),
        other => Err(not_in_family(cx.op, other, "convolution")),
    }
}

/// Multiply-adds of a convolution: each element of the (transposed
/// convolution's: input) side with the fewer positions meets every tap of
/// its group's filters.
fn conv_macs(inputs: &[Option<&TensorType>], outputs: &[&TensorType], transpose: bool) -> f64 {
    let (Some(w), Some(y)) = (inputs.get(1).copied().flatten(), outputs.first()) else {
        return 0.0;
    };
    let per_filter = numel(w) / w.shape.0.first().and_then(Dim::fixed).unwrap_or(1).max(1) as f64;
    match transpose {
        // Every output element reads `c/groups · taps` inputs.
        false => numel(y) * per_filter,
        // Every input element scatters into `m/groups · taps` outputs.
        true => inputs[0].map_or(0.0, numel) * per_filter,
    }
}

/// Forward and backward FLOPs of the convolution and pooling ops. A
/// convolution's backward runs two products of its size (input and weight
/// gradients); a pool's backward revisits each window once.
pub(super) fn flops_op(op: &Op, inputs: &[Option<&TensorType>], outputs: &[&TensorType]) -> (f64, f64) {
    let bias = |y: Option<&&TensorType>| match inputs.get(2).copied().flatten() {
        Some(_) => y.map_or(0.0, |y| numel(y)),
        None => 0.0,
    };
    match op {
        Op::Conv { .. } | Op::ConvTranspose { .. } => {
            let macs = conv_macs(inputs, outputs, matches!(op, Op::ConvTranspose { .. }));
            (
                2.0 * macs + bias(outputs.first()),
                4.0 * macs + bias(outputs.first()),
            )
        }
        // Both products of the forward op, which read `dout` as its output.
        Op::ConvGrad { transpose, .. } => {
            let dout = inputs.get(2).copied().flatten();
            let macs = conv_macs(inputs, &dout.into_iter().collect::<Vec<_>>(), *transpose);
            (4.0 * macs, 0.0)
        }
        Op::Pool { kernel, .. } => {
            let taps: usize = kernel.iter().product();
            let n = outputs.first().map_or(0.0, |y| numel(y)) * taps as f64;
            (n, n)
        }
        Op::PoolGrad { kernel, .. } => {
            let taps: usize = kernel.iter().product();
            (
                inputs.get(1).copied().flatten().map_or(0.0, numel) * taps as f64,
                0.0,
            )
        }
        other => misrouted(other, "convolution"),
    }
}

/// Reference kernels of the convolution and pooling ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Conv { window, groups } => kernel::eval_conv(cx, window, *groups),
        Op::ConvTranspose { window, groups, .. } => kernel::eval_transpose(cx, window, *groups),
        Op::ConvGrad {
            window,
            groups,
            transpose,
        } => float_outputs(
            cx,
            || kernel::grad::<f32>(cx, window, *groups, *transpose),
            || kernel::grad::<f64>(cx, window, *groups, *transpose),
        ),
        Op::Pool {
            kind, kernel, window, ..
        } => pool::eval_pool(cx, *kind, kernel, window),
        Op::PoolGrad { kind, kernel, window } => pool::eval_grad(cx, *kind, kernel, window),
        other => Err(not_in_family(cx.op, other, "convolution")),
    }
}

#[cfg(test)]
mod tests;

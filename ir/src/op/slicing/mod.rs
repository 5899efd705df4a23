//! Data movement along axes: `Concat`, `Split`, `Slice`, `Trilu`.

use super::context::{invalid, norm_axes, norm_axis, tensor, unsupported, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::numeric::map_data;
use super::{Op, OpError, TensorType};
use crate::{Dim, Value};

mod kernel;
pub(super) mod shard;
use kernel::{eval_concat, eval_slice, eval_split, eval_trilu};

/// `Concat(x0, x1, …)` along `axis`; other dims must agree.
pub(super) fn infer_concat(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, usize::MAX)?;
    let first = cx.ty(0)?;
    let rank = first.shape.rank();
    let a = norm_axis(cx.op, axis, rank)?;
    let mut dims = first.shape.0.clone();
    let mut fixed = 0usize;
    let mut syms: Vec<Dim> = Vec::new();
    for i in 0..cx.inputs.len() {
        cx.same_dtype(0, i)?;
        let t = cx.ty(i)?;
        if t.shape.rank() != rank {
            return Err(invalid(
                cx.op,
                format!("input {i} has rank {}, expected {rank}", t.shape.rank()),
            ));
        }
        for (j, d) in t.shape.0.iter().enumerate() {
            if j == a {
                match d {
                    Dim::Fixed(n) => fixed += n,
                    s => syms.push(s.clone()),
                }
            } else if let (Dim::Fixed(p), Dim::Fixed(q)) = (&dims[j], d) {
                if p != q {
                    return Err(invalid(cx.op, format!("input {i} dim {j} is {q}, expected {p}")));
                }
            } else if let Dim::Fixed(_) = d {
                dims[j] = d.clone();
            }
        }
    }
    dims[a] = match (syms.as_slice(), fixed) {
        ([], n) => Dim::Fixed(n),
        ([s], 0) => s.clone(),
        _ => return Err(unsupported(cx.op, "concatenating symbolic dims")),
    };
    Ok(vec![tensor(first.dtype, dims)])
}

/// Piece sizes of a `Split`: given, or equal parts of `ceil(len / n)` with
/// a smaller last piece (opset 18 `num_outputs`).
fn split_sizes(
    op: &str,
    given: Option<Vec<i64>>,
    len: Option<usize>,
    n: usize,
) -> Result<Vec<usize>, OpError> {
    if let Some(sizes) = given {
        let sizes = sizes
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| invalid(op, format!("negative split size in {sizes:?}")))?;
        if sizes.len() != n {
            return Err(invalid(
                op,
                format!("{} split sizes for {n} outputs", sizes.len()),
            ));
        }
        if len.is_some_and(|l| sizes.iter().sum::<usize>() != l) {
            return Err(invalid(
                op,
                format!("split sizes {sizes:?} do not sum to {}", len.unwrap_or(0)),
            ));
        }
        return Ok(sizes);
    }
    let len = len.ok_or_else(|| unsupported(op, "splitting a symbolic dim into equal parts"))?;
    if n == 0 {
        return Err(invalid(op, "no outputs"));
    }
    let chunk = len.div_ceil(n);
    let last = len
        .checked_sub(chunk * (n - 1))
        .ok_or_else(|| invalid(op, format!("cannot split {len} into {n} parts")))?;
    let mut sizes = vec![chunk; n - 1];
    sizes.push(last);
    Ok(sizes)
}

/// `Split(x, split?)` → `outputs` pieces along `axis`.
pub(super) fn infer_split(
    cx: &InferCtx,
    axis: i64,
    attr: Option<&[i64]>,
    outputs: usize,
) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    let given = match attr {
        Some(s) => Some(s.to_vec()),
        None => cx.opt_ints(1)?,
    };
    let sizes = split_sizes(cx.op, given, x.shape.0[a].fixed(), outputs)?;
    Ok(sizes
        .into_iter()
        .map(|s| {
            let mut dims = x.shape.0.clone();
            dims[a] = Dim::Fixed(s);
            tensor(x.dtype, dims)
        })
        .collect())
}

/// `x` restricted to `start..start+len` along `axis`.
fn narrow(x: &Value, axis: usize, start: usize, len: usize) -> Value {
    let mut shape = x.shape.clone();
    shape[axis] = len;
    // Each index of the leading dims holds one contiguous run of `len`
    // rows of the trailing dims: copied run by run.
    let inner: usize = x.shape[axis + 1..].iter().product();
    let (block, first, run) = (x.shape[axis] * inner, start * inner, len * inner);
    Value {
        dtype: x.dtype,
        shape,
        data: map_data!(&x.data, d => copy_runs(d, block, first..first + run)),
    }
}

/// The elements `within` of each `block` elements of `data`, in order.
fn copy_runs<T: Clone>(data: &[T], block: usize, within: std::ops::Range<usize>) -> Vec<T> {
    let mut out = Vec::with_capacity(within.len() * (data.len() / block.max(1)));
    if !within.is_empty() {
        for b in data.chunks(block) {
            out.extend_from_slice(&b[within.clone()]);
        }
    }
    out
}

/// One sliced axis: first index, step and resulting length.
struct AxisSlice {
    axis: usize,
    start: i64,
    step: i64,
    len: usize,
}

/// ONNX Slice clamping of `start`/`end` for an axis of length `d`.
fn clamp_slice(start: i64, end: i64, step: i64, d: usize) -> (i64, usize) {
    let (d, start, end, step) = (d as i128, start as i128, end as i128, step as i128);
    let s = if start < 0 { start + d } else { start };
    let e = if end < 0 { end + d } else { end };
    let (s, len) = if step > 0 {
        let (s, e) = (s.max(0).min(d), e.max(0).min(d));
        (s, if e > s { (e - s + step - 1) / step } else { 0 })
    } else {
        let (s, e) = (s.max(0).min(d - 1), e.max(-1).min(d - 1));
        (s, if s > e { (s - e - step - 1) / -step } else { 0 })
    };
    (s.max(0) as i64, len as usize)
}

/// One listed axis of a `Slice`: resolved when its length is known, else the
/// raw `(axis, start, end, step)`.
type Sliced = Result<AxisSlice, (usize, i64, i64, i64)>;

/// Reads `Slice`'s parameter inputs and resolves each listed axis.
fn slice_params(
    op: &str,
    dims: &[Option<usize>],
    starts: &[i64],
    ends: &[i64],
    axes: Option<Vec<i64>>,
    steps: Option<Vec<i64>>,
) -> Result<Vec<Sliced>, OpError> {
    let n = starts.len();
    let axes = axes.unwrap_or_else(|| (0..n as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err(invalid(op, "starts, ends, axes and steps differ in length"));
    }
    let axes = norm_axes(op, &axes, dims.len())?;
    (0..n)
        .map(|i| {
            if steps[i] == 0 {
                return Err(invalid(op, "slice step 0"));
            }
            let axis = axes[i];
            Ok(match dims[axis] {
                Some(d) => {
                    let (start, len) = clamp_slice(starts[i], ends[i], steps[i], d);
                    Ok(AxisSlice {
                        axis,
                        start,
                        step: steps[i],
                        len,
                    })
                }
                None => Err((axis, starts[i], ends[i], steps[i])),
            })
        })
        .collect()
}

/// `Slice(x, starts, ends, axes?, steps?)` with ONNX clamping. A symbolic
/// axis can only be sliced whole (`0..`, step 1).
pub(super) fn infer_slice(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 5)?;
    let x = cx.ty(0)?;
    let fixed: Vec<Option<usize>> = x.shape.0.iter().map(Dim::fixed).collect();
    let params = slice_params(
        cx.op,
        &fixed,
        &cx.ints(1)?,
        &cx.ints(2)?,
        cx.opt_ints(3)?,
        cx.opt_ints(4)?,
    )?;
    let mut dims = x.shape.0.clone();
    for p in params {
        match p {
            Ok(s) => dims[s.axis] = Dim::Fixed(s.len),
            Err((_, 0, end, 1)) if end >= i32::MAX as i64 => {}
            Err((axis, ..)) => {
                return Err(unsupported(
                    cx.op,
                    format!("slicing symbolic dim {} of {}", axis, x.shape),
                ));
            }
        }
    }
    Ok(vec![tensor(x.dtype, dims)])
}

/// `Trilu(x, k?)`: same type and shape; rank ≥ 2.
pub(super) fn infer_trilu(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    if x.shape.rank() < 2 {
        return Err(invalid(
            cx.op,
            format!("input must have rank ≥ 2, got {}", x.shape),
        ));
    }
    if cx.opt(1).is_some() {
        cx.int(1)?;
    }
    Ok(vec![x.clone()])
}

/// Shape inference of the slicing ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Concat { axis } => infer_concat(cx, *axis),
        Op::Split { axis, split, outputs } => infer_split(cx, *axis, split.as_deref(), *outputs),
        Op::Slice => infer_slice(cx),
        Op::Trilu { .. } => infer_trilu(cx),
        other => Err(not_in_family(cx.op, other, "slicing")),
    }
}

/// Forward and backward FLOPs of the slicing ops.
pub(super) fn flops_op(op: &Op, _inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        // Copies: bytes only.
        Op::Concat { .. } | Op::Split { .. } | Op::Slice | Op::Trilu { .. } => (0.0, 0.0),
        other => misrouted(other, "slicing"),
    }
}

/// Reference kernels of the slicing ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Concat { axis } => eval_concat(cx, *axis),
        Op::Split { axis, .. } => eval_split(cx, *axis),
        Op::Slice => eval_slice(cx),
        Op::Trilu { upper } => eval_trilu(cx, *upper),
        other => Err(not_in_family(cx.op, other, "slicing")),
    }
}

#[cfg(test)]
mod tests;

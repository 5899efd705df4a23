//! Shape-changing data movement: `Reshape`, `Transpose`, `Expand`, `Squeeze`,
//! `Unsqueeze`, `Flatten`. (`Concat`, `Split`, `Slice`, `Trilu` live in
//! `slicing`.) Views (reshape-like ops) copy the buffer; `Transpose` and
//! `Expand` gather through strided index maps.

use super::broadcast::broadcast_shapes;
use super::context::{invalid, norm_axes, norm_axis, tensor, unsupported, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::geometry::dim_product;
use super::{Op, OpError, TensorType};
use crate::{Dim, Shape, Value};

pub(crate) mod backward;
mod kernel;

pub(crate) use kernel::transposed;
pub(super) mod shard;
use kernel::{eval_expand, eval_transpose, eval_view};

/// Output value with `x`'s data under a new shape.
fn reshaped(cx: &EvalCtx, x: &Value) -> Result<Vec<Value>, OpError> {
    let shape = cx.out_shape(0)?;
    if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) != Some(x.numel()) {
        return Err(invalid(cx.op, format!("cannot view {:?} as {shape:?}", x.shape)));
    }
    Ok(vec![Value {
        dtype: x.dtype,
        shape,
        data: x.data.clone(),
    }])
}

/// Removes one occurrence of each of `these` from `from`; false if one is missing.
fn remove_all(from: &mut Vec<String>, these: &[String]) -> bool {
    these.iter().all(|s| match from.iter().position(|f| f == s) {
        Some(i) => {
            from.swap_remove(i);
            true
        }
        None => false,
    })
}

fn split_dims(dims: &[Dim]) -> (usize, Vec<String>) {
    let mut fixed = 1usize;
    let mut syms = Vec::new();
    for d in dims {
        match d {
            Dim::Fixed(n) => fixed = fixed.saturating_mul(*n),
            Dim::Sym(s) => syms.push(s.clone()),
        }
    }
    (fixed, syms)
}

/// `Reshape(x, shape)`: `0` copies the input dim (unless `allowzero`), `-1`
/// is inferred. With symbolic inputs, `-1` resolves when the symbols not
/// copied through `0` leave exactly one symbol with matching fixed sizes.
pub(super) fn infer_reshape(cx: &InferCtx, allowzero: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    cx.int(1)?;
    let target = cx.ints(1)?;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, &t) in target.iter().enumerate() {
        out.push(match t {
            -1 if infer_at.is_some() => return Err(invalid(cx.op, "more than one -1 in the target shape")),
            -1 => {
                infer_at = Some(i);
                Dim::Fixed(1)
            }
            0 if !allowzero => x.shape.0.get(i).cloned().ok_or_else(|| {
                invalid(
                    cx.op,
                    format!(
                        "target dim {i} copies a dim the input (rank {}) lacks",
                        x.shape.rank()
                    ),
                )
            })?,
            t if t < 0 => return Err(invalid(cx.op, format!("invalid target dim {t}"))),
            t => Dim::Fixed(t as usize),
        });
    }
    if allowzero && infer_at.is_some() && target.contains(&0) {
        return Err(invalid(cx.op, "allowzero target mixes 0 and -1"));
    }
    let (in_fixed, mut in_syms) = split_dims(&x.shape.0);
    let (out_fixed, out_syms) = split_dims(&out);
    match infer_at {
        Some(p) => {
            if !remove_all(&mut in_syms, &out_syms) {
                return Err(unsupported(
                    cx.op,
                    format!("inferring -1 for {} from {target:?}", x.shape),
                ));
            }
            out[p] = match in_syms.as_slice() {
                [] if out_fixed != 0 && in_fixed % out_fixed == 0 => Dim::Fixed(in_fixed / out_fixed),
                [] => {
                    return Err(invalid(
                        cx.op,
                        format!("cannot reshape {} to {target:?}", x.shape),
                    ))
                }
                [s] if in_fixed == out_fixed => Dim::Sym(s.clone()),
                _ => {
                    return Err(unsupported(
                        cx.op,
                        format!("inferring -1 for {} from {target:?}", x.shape),
                    ))
                }
            };
        }
        None if in_syms.is_empty() && out_syms.is_empty() && in_fixed != out_fixed => {
            return Err(invalid(
                cx.op,
                format!("cannot reshape {} to {target:?}", x.shape),
            ));
        }
        None => {}
    }
    Ok(vec![tensor(x.dtype, out)])
}

fn perm_of(cx: &InferCtx, perm: Option<&[usize]>, rank: usize) -> Result<Vec<usize>, OpError> {
    let p = perm.map_or_else(|| (0..rank).rev().collect(), <[usize]>::to_vec);
    let mut seen = vec![false; rank];
    if p.len() != rank
        || !p
            .iter()
            .all(|&a| a < rank && !std::mem::replace(&mut seen[a], true))
    {
        return Err(invalid(
            cx.op,
            format!("{p:?} is not a permutation of {rank} dims"),
        ));
    }
    Ok(p)
}

/// `Transpose(x)`: dims permuted (reversed without `perm`).
pub(super) fn infer_transpose(cx: &InferCtx, perm: Option<&[usize]>) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let p = perm_of(cx, perm, x.shape.rank())?;
    Ok(vec![tensor(
        x.dtype,
        p.iter().map(|&a| x.shape.0[a].clone()).collect(),
    )])
}

/// `Expand(x, shape)`: bidirectional broadcast of `x` with `shape`.
pub(super) fn infer_expand(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let x = cx.ty(0)?;
    cx.int(1)?;
    let target = cx.ints(1)?;
    let dims = target
        .iter()
        .map(|&t| usize::try_from(t).map(Dim::Fixed))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| invalid(cx.op, format!("negative dim in target {target:?}")))?;
    Ok(vec![TensorType {
        dtype: x.dtype,
        shape: broadcast_shapes(cx.op, &[&x.shape, &Shape(dims)])?,
    }])
}

/// Axes from the attribute or, when absent, the optional second input.
fn axes_from(cx: &InferCtx, attr: Option<&[i64]>) -> Result<Option<Vec<i64>>, OpError> {
    match attr {
        Some(a) => Ok(Some(a.to_vec())),
        None => {
            if cx.opt(1).is_some() {
                cx.int(1)?;
            }
            cx.opt_ints(1)
        }
    }
}

/// `Squeeze(x, axes?)`: without axes, drops every fixed dim of size 1
/// (symbolic dims are assumed not to be 1); listed axes must be 1 or symbolic.
pub(super) fn infer_squeeze(cx: &InferCtx, attr: Option<&[i64]>) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    let dims = &x.shape.0;
    let drop = match axes_from(cx, attr)? {
        Some(a) if !a.is_empty() => {
            let axes = norm_axes(cx.op, &a, dims.len())?;
            if let Some(&bad) = axes.iter().find(|&&i| matches!(dims[i], Dim::Fixed(n) if n != 1)) {
                return Err(invalid(
                    cx.op,
                    format!("cannot squeeze axis {bad} of size {}", dims[bad]),
                ));
            }
            axes
        }
        _ => (0..dims.len()).filter(|&i| dims[i] == Dim::Fixed(1)).collect(),
    };
    let out = (0..dims.len())
        .filter(|i| !drop.contains(i))
        .map(|i| dims[i].clone())
        .collect();
    Ok(vec![tensor(x.dtype, out)])
}

/// `Unsqueeze(x, axes)`: inserts size-1 dims at `axes` of the output.
pub(super) fn infer_unsqueeze(cx: &InferCtx, attr: Option<&[i64]>) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 2)?;
    let x = cx.ty(0)?;
    let axes = axes_from(cx, attr)?.ok_or_else(|| invalid(cx.op, "axes are required"))?;
    let rank = x.shape.rank() + axes.len();
    let axes = norm_axes(cx.op, &axes, rank)?;
    let mut src = x.shape.0.iter();
    let out = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                Some(Dim::Fixed(1))
            } else {
                src.next().cloned()
            }
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| invalid(cx.op, "axes do not fit the output rank"))?;
    Ok(vec![tensor(x.dtype, out)])
}

/// `Flatten(x)` → `[prod(dims[..axis]), prod(dims[axis..])]`; `axis` may equal the rank.
pub(super) fn infer_flatten(cx: &InferCtx, axis: i64) -> Result<Vec<TensorType>, OpError> {
    cx.arity(1, 1)?;
    let x = cx.ty(0)?;
    let rank = x.shape.rank();
    let a = if axis == rank as i64 {
        rank
    } else {
        norm_axis(cx.op, axis, rank)?
    };
    let (outer, inner) = (dim_product(&x.shape.0[..a]), dim_product(&x.shape.0[a..]));
    match (outer, inner) {
        (Some(o), Some(i)) => Ok(vec![tensor(x.dtype, vec![o, i])]),
        _ => Err(unsupported(
            cx.op,
            format!("flattening {} at axis {axis} (symbolic product)", x.shape),
        )),
    }
}

/// Shape inference of the data-movement ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Reshape { allowzero } => infer_reshape(cx, *allowzero),
        Op::Transpose { perm } => infer_transpose(cx, perm.as_deref()),
        Op::Expand => infer_expand(cx),
        Op::Squeeze { axes } => infer_squeeze(cx, axes.as_deref()),
        Op::Unsqueeze { axes } => infer_unsqueeze(cx, axes.as_deref()),
        Op::Flatten { axis } => infer_flatten(cx, *axis),
        other => Err(not_in_family(cx.op, other, "data-movement")),
    }
}

/// Forward and backward FLOPs of the data-movement ops.
pub(super) fn flops_op(op: &Op, _inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        // Copies and views: bytes only.
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Expand
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. } => (0.0, 0.0),
        other => misrouted(other, "data-movement"),
    }
}

/// Reference kernels of the data-movement ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } => eval_view(cx),
        Op::Transpose { perm } => eval_transpose(cx, perm.as_deref()),
        Op::Expand => eval_expand(cx),
        other => Err(not_in_family(cx.op, other, "data-movement")),
    }
}

#[cfg(test)]
mod tests;

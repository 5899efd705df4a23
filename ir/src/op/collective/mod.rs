//! Communication inside a tensor-parallel group, as graph ops. Lowering
//! puts them where a layout changes (a pending sum is reduced, a split
//! tensor gathered, a replicated one sliced), so autodiff can pair each
//! with its conjugate: the backward of an all-reduce is a copy, of a copy
//! an all-reduce, of a gather a slice, and so on (Megatron-LM's f and g
//! operators, generalised). Only a backend that knows the rank's group can
//! run them; the reference interpreter refuses.

use super::context::{invalid, norm_axis, EvalCtx, InferCtx};
use super::define::{misrouted, not_in_family};
use super::{CommKind, Op, OpError, TensorType};
use crate::{Dim, Value};

mod kernel;
pub(super) mod shard;
use kernel::eval;

/// Output type: the input's, with `axis` multiplied (gathers) or divided
/// (slices, reduce-scatters) by `parts`.
pub(super) fn infer(
    cx: &InferCtx,
    kind: CommKind,
    axis: i64,
    parts: usize,
) -> Result<Vec<TensorType>, OpError> {
    if kind.counted() {
        cx.arity(3, 3)?;
        for i in [1, 2] {
            cx.int(i)?;
            if cx.ty(i)?.shape.0.first().and_then(Dim::fixed) != Some(parts) {
                return Err(invalid(
                    cx.op,
                    format!("row counts must have {parts} rows, one per rank"),
                ));
            }
        }
    } else {
        cx.arity(1, 1)?;
    }
    let x = cx.ty(0)?;
    if parts == 0 {
        return Err(invalid(cx.op, "a group needs at least one part"));
    }
    let mut out = x.clone();
    if matches!(kind, CommKind::AllReduce | CommKind::Copy) {
        return Ok(vec![out]);
    }
    let a = norm_axis(cx.op, axis, x.shape.rank())?;
    out.shape.0[a] = match (&x.shape.0[a], kind) {
        (Dim::Fixed(n), CommKind::AllGather | CommKind::GatherForCompute | CommKind::Dispatch) => {
            Dim::Fixed(n * parts)
        }
        (Dim::Fixed(n), CommKind::AllToAll) if n % parts == 0 => Dim::Fixed(*n),
        (Dim::Fixed(n), _) if n % parts == 0 => Dim::Fixed(n / parts),
        (d, _) => {
            return Err(invalid(
                cx.op,
                format!("dim {a} ({d}) must be fixed and divide into {parts} parts"),
            ))
        }
    };
    Ok(vec![out])
}

/// Shape inference of the communication ops (routed here by the op table).
pub(super) fn infer_op(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    match op {
        Op::Comm {
            kind, axis, parts, ..
        } => infer(cx, *kind, *axis, *parts),
        other => Err(not_in_family(cx.op, other, "communication")),
    }
}

/// Forward and backward FLOPs of the communication ops.
pub(super) fn flops_op(op: &Op, _inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> (f64, f64) {
    match op {
        // Communication is priced by the cost model's collectives, not as FLOPs.
        Op::Comm { .. } => (0.0, 0.0),
        other => misrouted(other, "communication"),
    }
}

/// Reference kernels of the communication ops.
pub(super) fn eval_op(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    match op {
        Op::Comm { kind, .. } => eval(cx, *kind),
        other => Err(not_in_family(cx.op, other, "communication")),
    }
}

//! Scatter-adds: the adjoints of the gathers, which backward passes emit.
//!
//! `GatherGrad`, `GatherElementsGrad` and `GatherNdGrad` take
//! `(grad, indices, shape)`: the output is a zero tensor of the constant
//! `shape` (the forward data's shape) to which every element of `grad` is
//! added at the position its forward gather read it from, so repeated
//! indices accumulate. The positions come from running the forward gather's
//! own kernel on the flat positions `0..n` of a `shape` tensor, so index
//! handling (negative indices, range checks, batch dims) is the forward's,
//! exactly.

use super::super::context::{finish, invalid, tensor, EvalCtx, InferCtx};
use super::super::geometry::{numel, prod};
use super::super::numeric::{float_kernel, Real};
use super::super::{InferInput, Op, OpError, TensorType};
use super::kernel;
use crate::{DType, Dim, Shape, Value};

impl Op {
    /// For a scatter-add, the gather it is the adjoint of (`None` for other
    /// ops). That gather is also the scatter-add's own backward.
    pub fn forward_gather(&self) -> Option<Op> {
        match *self {
            Op::GatherGrad { axis } => Some(Op::Gather { axis }),
            Op::GatherElementsGrad { axis } => Some(Op::GatherElements { axis }),
            Op::GatherNdGrad { batch_dims } => Some(Op::GatherNd { batch_dims }),
            _ => None,
        }
    }

    /// For a gather (or `Embedding`, a gather of rows), the scatter-add that
    /// computes its data gradient (`None` for other ops).
    pub fn gather_adjoint(&self) -> Option<Op> {
        match *self {
            Op::Gather { axis } => Some(Op::GatherGrad { axis }),
            Op::Embedding => Some(Op::GatherGrad { axis: 0 }),
            Op::GatherElements { axis } => Some(Op::GatherElementsGrad { axis }),
            Op::GatherNd { batch_dims } => Some(Op::GatherNdGrad { batch_dims }),
            _ => None,
        }
    }
}

/// The forward gather of `op`, or an error naming it.
fn forward_of(name: &str, op: &Op) -> Result<Op, OpError> {
    op.forward_gather()
        .ok_or_else(|| invalid(name, "internal error: not a scatter-add"))
}

/// The fixed output dims from the constant `shape` input.
fn out_dims(cx: &InferCtx) -> Result<Vec<usize>, OpError> {
    cx.int(2)?;
    if cx.ty(2)?.shape.rank() != 1 {
        return Err(invalid(cx.op, "input 2 (shape) must be 1-D"));
    }
    cx.ints(2)?
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| invalid(cx.op, "negative dim in the shape"))
}

/// True when two shapes agree wherever both dims are fixed.
fn compatible(a: &Shape, b: &Shape) -> bool {
    a.rank() == b.rank()
        && a.0.iter().zip(&b.0).all(|(p, q)| match (p, q) {
            (Dim::Fixed(p), Dim::Fixed(q)) => p == q,
            _ => true,
        })
}

/// `(grad, indices, shape)` → `grad.dtype[shape]`, after checking that the
/// forward gather of a `shape` tensor at `indices` has `grad`'s shape.
pub(super) fn infer(cx: &InferCtx, op: &Op) -> Result<Vec<TensorType>, OpError> {
    cx.arity(3, 3)?;
    let grad = cx.float(0)?;
    let dims = out_dims(cx)?;
    let data = tensor(DType::I64, dims.iter().map(|&d| Dim::Fixed(d)).collect());
    let forward = forward_of(cx.op, op)?;
    let gathered = forward
        .infer(&[
            Some(InferInput {
                ty: &data,
                value: None,
            }),
            Some(cx.input(1)?),
        ])
        .map_err(|e| invalid(cx.op, format!("as the adjoint of {e}")))?;
    let want = &gathered[0].shape;
    if !compatible(want, &grad.shape) {
        return Err(invalid(
            cx.op,
            format!("grad {} does not match the gathered shape {want}", grad.shape),
        ));
    }
    Ok(vec![tensor(grad.dtype, data.shape.0)])
}

/// Reference kernel: zeros, then `out[pos[k]] += grad[k]` where `pos` is
/// the forward gather of the flat positions.
pub(super) fn eval(cx: &EvalCtx, op: &Op) -> Result<Vec<Value>, OpError> {
    let grad = cx.input(0)?;
    let shape = cx.out_shape(0)?;
    let ind = cx.input(1)?;
    let ids = ind
        .as_i64()
        .ok_or_else(|| invalid(cx.op, "input 1 must be an integer tensor"))?;
    // The positions the forward gather read, found as it finds them.
    let forward = forward_of(cx.op, op)?;
    let pos = kernel::positions(&forward, &shape, &ind.shape, ids)
        .map_err(|e| invalid(cx.op, format!("as the adjoint of {e}")))?;
    if pos.len() != grad.numel() {
        return Err(invalid(
            cx.op,
            "internal error: gathered positions do not match grad",
        ));
    }
    let n = prod(&shape);
    let data = float_kernel!(cx.op, grad, T => accumulate::<T>(cx.floats::<T>(0)?, &pos, n));
    Ok(vec![finish(grad.dtype, shape, data)])
}

/// `n` zeros with each `g[k]` added at `pos[k]` (positions lie in `0..n`:
/// they were gathered from `0..n`).
fn accumulate<T: Real>(g: &[T], pos: &[usize], n: usize) -> Vec<T> {
    let mut out = vec![T::zero(); n];
    for (&v, &p) in g.iter().zip(pos) {
        if let Some(o) = out.get_mut(p) {
            *o += v;
        }
    }
    out
}

/// Forward FLOPs: one addition per `grad` element. Backward: none (the
/// adjoint of a scatter-add is a gather).
pub(super) fn flops(grad: Option<&TensorType>) -> (f64, f64) {
    (grad.map_or(0.0, numel), 0.0)
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::*;
    use super::super::super::Op;
    use crate::DType;

    fn shape_of(dims: &[i64]) -> crate::Value {
        i64s(&[dims.len()], dims)
    }

    #[test]
    fn gather_grad_accumulates_repeated_and_negative_indices() {
        // Gather rows [2, 0, -1] of a [3, 2] tensor: row 2 is read twice.
        let g = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let ids = i64s(&[3], &[2, 0, -1]);
        assert_eq!(
            eval1(&Op::GatherGrad { axis: 0 }, &[&g, &ids, &shape_of(&[3, 2])]),
            (vec![3, 2], vec![3.0, 4.0, 0.0, 0.0, 6.0, 8.0])
        );
        // Along axis 1 with a scalar index: the axis is dropped in grad.
        let col = crate::Value::f64(vec![2], vec![1.5, -2.0]).unwrap();
        let one = i64s(&[], &[-1]);
        assert_eq!(
            eval1(&Op::GatherGrad { axis: 1 }, &[&col, &one, &shape_of(&[2, 3])]),
            (vec![2, 3], vec![0.0, 0.0, 1.5, 0.0, 0.0, -2.0])
        );
    }

    #[test]
    fn gather_elements_grad_scatters_along_the_axis() {
        let g = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        // Row 0 reads column 0 twice; row 1 reads columns 2 and -3 (= 0).
        let ids = i64s(&[2, 2], &[0, 0, 2, -3]);
        assert_eq!(
            eval1(
                &Op::GatherElementsGrad { axis: 1 },
                &[&g, &ids, &shape_of(&[2, 3])]
            ),
            (vec![2, 3], vec![3.0, 0.0, 0.0, 4.0, 0.0, 3.0])
        );
    }

    #[test]
    fn gather_nd_grad_with_batch_dims() {
        // batch_dims 0: tuples (0, 0) and (1, 1) of a [2, 2] tensor, then (0, 0) again.
        let g = f32s(&[3], &[1.0, 2.0, 3.0]);
        let ids = i64s(&[3, 2], &[0, 0, 1, 1, 0, 0]);
        assert_eq!(
            eval1(
                &Op::GatherNdGrad { batch_dims: 0 },
                &[&g, &ids, &shape_of(&[2, 2])]
            ),
            (vec![2, 2], vec![4.0, 0.0, 0.0, 2.0])
        );
        // batch_dims 1: batch 0 takes row 1, batch 1 takes row 0.
        let g = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let rows = i64s(&[2, 1], &[1, 0]);
        assert_eq!(
            eval1(
                &Op::GatherNdGrad { batch_dims: 1 },
                &[&g, &rows, &shape_of(&[2, 2, 2])]
            ),
            (vec![2, 2, 2], vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0])
        );
    }

    #[test]
    fn half_precision_rounds_once_after_accumulating() {
        let g = crate::Value::f32(vec![2], vec![1.0, 1.0 / 1024.0]).unwrap();
        let g = crate::Value {
            dtype: DType::F16,
            ..g
        };
        let ids = i64s(&[2], &[0, 0]);
        let out = eval(&Op::GatherGrad { axis: 0 }, &[&g, &ids, &shape_of(&[1])]).unwrap();
        assert_eq!(out[0].dtype, DType::F16);
        assert_eq!(out[0].to_f64_vec(), vec![1.0 + 1.0 / 1024.0]);
    }

    #[test]
    fn inference_checks_grad_against_the_forward_shape() {
        let c = |d: &[i64]| (ty(DType::I64, &d.len().to_string()), Some(shape_of(d)));
        let t = infer_with(
            &Op::GatherGrad { axis: 0 },
            &[
                (ty(DType::F32, "b s 8"), None),
                (ty(DType::I64, "b s"), None),
                c(&[50, 8]),
            ],
        )
        .unwrap();
        assert_eq!(t[0], ty(DType::F32, "50 8"));
        let wrong = infer_with(
            &Op::GatherGrad { axis: 0 },
            &[
                (ty(DType::F32, "b s 4"), None),
                (ty(DType::I64, "b s"), None),
                c(&[50, 8]),
            ],
        );
        assert_op_err(
            wrong,
            "GatherGrad",
            "grad [b, s, 4] does not match the gathered shape [b, s, 8]",
        );
        let ints = infer_with(
            &Op::GatherGrad { axis: 0 },
            &[
                (ty(DType::I64, "2 8"), None),
                (ty(DType::I64, "2"), None),
                c(&[50, 8]),
            ],
        );
        assert_op_err(ints, "GatherGrad", "input 0 must be floating point, got i64");
        assert!(matches!(
            infer(
                &Op::GatherGrad { axis: 0 },
                &[ty(DType::F32, "2 8"), ty(DType::I64, "2"), ty(DType::I64, "2")]
            ),
            Err(super::super::super::OpError::NotConstant { input: 2, .. })
        ));
        let g = f32s(&[1], &[1.0]);
        assert_op_err(
            eval(
                &Op::GatherGrad { axis: 0 },
                &[&g, &i64s(&[1], &[3]), &shape_of(&[3])],
            ),
            "GatherGrad",
            "as the adjoint of Gather: index 3 is out of range for an axis of 3",
        );
    }

    #[test]
    fn adjoint_pairs_and_cost() {
        for (fwd, adj) in [
            (Op::Gather { axis: 1 }, Op::GatherGrad { axis: 1 }),
            (
                Op::GatherElements { axis: -1 },
                Op::GatherElementsGrad { axis: -1 },
            ),
            (Op::GatherNd { batch_dims: 1 }, Op::GatherNdGrad { batch_dims: 1 }),
        ] {
            assert_eq!(fwd.gather_adjoint(), Some(adj.clone()));
            assert_eq!(adj.forward_gather(), Some(fwd));
        }
        assert_eq!(Op::Embedding.gather_adjoint(), Some(Op::GatherGrad { axis: 0 }));
        assert_eq!(Op::MatMul.gather_adjoint(), None);
        let (g, i, s, o) = (
            ty(DType::F32, "4 8"),
            ty(DType::I64, "4"),
            ty(DType::I64, "2"),
            ty(DType::F32, "10 8"),
        );
        let cost = Op::GatherGrad { axis: 0 }.cost(&[Some(&g), Some(&i), Some(&s)], &[&o]);
        assert_eq!((cost.forward_flops, cost.backward_flops), (32.0, 0.0));
        assert_eq!(cost.bytes_written, 320.0);
        assert_eq!(cost.bytes_read, 128.0 + 32.0 + 16.0);
    }
}

//! Reference kernels of views, transposes and expands.

use super::super::broadcast::{source_index, strided_index};
use super::super::context::EvalCtx;
use super::super::geometry::{strides, take};
use super::super::numeric::map_data;
use super::super::OpError;
use super::reshaped;
use crate::Value;

/// Reference kernel for the pure views (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`).
pub(super) fn eval_view(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    reshaped(cx, cx.input(0)?)
}

/// Reference kernel for `Transpose`.
pub(super) fn eval_transpose(cx: &EvalCtx, perm: Option<&[usize]>) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let rank = x.shape.len();
    let p = perm.map_or_else(|| (0..rank).rev().collect(), <[usize]>::to_vec);
    let st = strides(&x.shape);
    let out_shape = cx.out_shape(0)?;
    let idx = strided_index(
        &out_shape,
        &p.iter().map(|&a| st[a] as isize).collect::<Vec<_>>(),
        0,
    );
    Ok(vec![Value {
        dtype: x.dtype,
        shape: out_shape,
        data: map_data!(&x.data, d => take(d, &idx)),
    }])
}

/// Reference kernel for `Expand`.
pub(super) fn eval_expand(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let out_shape = cx.out_shape(0)?;
    let idx = source_index(&x.shape, &out_shape);
    Ok(vec![Value {
        dtype: x.dtype,
        shape: out_shape,
        data: map_data!(&x.data, d => take(d, &idx)),
    }])
}

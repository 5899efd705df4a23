//! Shape-changing data movement: `Reshape`, `Transpose`, `Expand`, `Squeeze`,
//! `Unsqueeze`, `Flatten`. (`Concat`, `Split`, `Slice`, `Trilu` live in
//! `slicing`.) Views (reshape-like ops) copy the buffer; `Transpose` and
//! `Expand` gather through strided index maps.

use super::broadcast::{broadcast_shapes, source_index, strided_index};
use super::kernel_util::{
    dim_product, invalid, map_data, norm_axes, norm_axis, strides, take, tensor, unsupported, EvalCtx,
    InferCtx,
};
use super::{OpError, TensorType};
use crate::{Dim, Shape, Value};

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

/// Reference kernel for the pure views (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`).
pub(super) fn eval_view(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    reshaped(cx, cx.input(0)?)
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;
    use crate::DType;

    fn reshape_ty(x: &str, target: &[i64], allowzero: bool) -> Result<TensorType, OpError> {
        let t = i64s(&[target.len()], target);
        infer_with(
            &Op::Reshape { allowzero },
            &[
                (ty(DType::F32, x), None),
                (ty(DType::I64, &target.len().to_string()), Some(t)),
            ],
        )
        .map(|mut v| v.remove(0))
    }

    #[test]
    fn reshape_symbolic_zero_and_minus_one() {
        assert_eq!(
            reshape_ty("b s 768", &[0, 0, 12, 64], false).unwrap(),
            ty(DType::F32, "b s 12 64")
        );
        assert_eq!(
            reshape_ty("b s 12 64", &[0, -1, 768], false).unwrap(),
            ty(DType::F32, "b s 768")
        );
        assert_eq!(
            reshape_ty("b 12 64", &[-1, 768], false).unwrap(),
            ty(DType::F32, "b 768")
        );
        assert_eq!(
            reshape_ty("2 3 4", &[-1, 4], false).unwrap(),
            ty(DType::F32, "6 4")
        );
        assert_eq!(reshape_ty("0 3", &[0, 3], true).unwrap(), ty(DType::F32, "0 3"));
        assert_op_err(
            reshape_ty("2 3 4", &[5, -1], false),
            "Reshape",
            "cannot reshape [2, 3, 4] to [5, -1]",
        );
        assert_op_err(
            reshape_ty("2 3", &[4, 2], false),
            "Reshape",
            "cannot reshape [2, 3] to [4, 2]",
        );
        assert_op_err(
            reshape_ty("b s 64", &[-1, 32], false),
            "Reshape",
            "inferring -1 for [b, s, 64] from [-1, 32] is not supported",
        );
        assert_op_err(
            reshape_ty("2 3", &[-1, -1], false),
            "Reshape",
            "more than one -1 in the target shape",
        );
        let no_value = infer(
            &Op::Reshape { allowzero: false },
            &[ty(DType::F32, "2 3"), ty(DType::I64, "2")],
        );
        assert!(matches!(no_value, Err(OpError::NotConstant { input: 1, .. })));
    }

    #[test]
    fn reshape_eval_keeps_data() {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let t = i64s(&[2], &[3, -1]);
        assert_eq!(
            eval1(&Op::Reshape { allowzero: false }, &[&x, &t]),
            (vec![3, 2], x.to_f64_vec())
        );
    }

    #[test]
    fn transpose_permutes() {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            eval1(&Op::Transpose { perm: None }, &[&x]),
            (vec![3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0])
        );
        let op = Op::Transpose {
            perm: Some(vec![0, 2, 1, 3]),
        };
        assert_eq!(
            infer(&op, &[ty(DType::F32, "b s 12 64")]).unwrap()[0],
            ty(DType::F32, "b 12 s 64")
        );
        assert_op_err(
            infer(
                &Op::Transpose {
                    perm: Some(vec![0, 0]),
                },
                &[ty(DType::F32, "2 3")],
            ),
            "Transpose",
            "[0, 0] is not a permutation of 2 dims",
        );
    }

    #[test]
    fn expand_broadcasts_both_ways() {
        let x = f32s(&[3, 1], &[1.0, 2.0, 3.0]);
        let s = i64s(&[3], &[2, 1, 2]);
        let (shape, out) = eval1(&Op::Expand, &[&x, &s]);
        assert_eq!(shape, vec![2, 3, 2]);
        assert_eq!(&out[..6], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        let sym = infer_with(
            &Op::Expand,
            &[
                (ty(DType::F32, "b 1"), None),
                (ty(DType::I64, "2"), Some(i64s(&[2], &[1, 4]))),
            ],
        );
        assert_eq!(sym.unwrap()[0], ty(DType::F32, "b 4"));
    }

    #[test]
    fn squeeze_and_unsqueeze() {
        let sq = |axes: Option<Vec<i64>>, x: &str| {
            infer(&Op::Squeeze { axes }, &[ty(DType::F32, x)]).map(|mut v| v.remove(0))
        };
        assert_eq!(sq(None, "1 b 1 4").unwrap(), ty(DType::F32, "b 4"));
        assert_eq!(sq(Some(vec![-2]), "1 b 1 4").unwrap(), ty(DType::F32, "1 b 4"));
        assert_op_err(
            sq(Some(vec![3]), "1 b 1 4"),
            "Squeeze",
            "cannot squeeze axis 3 of size 4",
        );
        let axes = i64s(&[1], &[0]);
        let input = infer_with(
            &Op::Squeeze { axes: None },
            &[(ty(DType::F32, "1 3"), None), (ty(DType::I64, "1"), Some(axes))],
        );
        assert_eq!(input.unwrap()[0], ty(DType::F32, "3"));
        let un = Op::Unsqueeze {
            axes: Some(vec![0, -1]),
        };
        assert_eq!(
            infer(&un, &[ty(DType::F32, "b 3")]).unwrap()[0],
            ty(DType::F32, "1 b 3 1")
        );
        let x = f32s(&[2], &[1.0, 2.0]);
        let axes = i64s(&[2], &[2, 0]);
        assert_eq!(
            eval1(&Op::Unsqueeze { axes: None }, &[&x, &axes]).0,
            vec![1, 2, 1]
        );
        assert_op_err(
            infer(
                &Op::Unsqueeze {
                    axes: Some(vec![0, 0]),
                },
                &[ty(DType::F32, "3")],
            ),
            "Unsqueeze",
            "axis 0 is repeated in [0, 0]",
        );
    }

    #[test]
    fn flatten_axes() {
        let fl = |axis, x: &str| infer(&Op::Flatten { axis }, &[ty(DType::F32, x)]).map(|mut v| v.remove(0));
        assert_eq!(fl(1, "2 3 4").unwrap(), ty(DType::F32, "2 12"));
        assert_eq!(fl(0, "2 3 4").unwrap(), ty(DType::F32, "1 24"));
        assert_eq!(fl(3, "2 3 4").unwrap(), ty(DType::F32, "24 1"));
        assert_eq!(fl(-2, "b 3 4").unwrap(), ty(DType::F32, "b 12"));
        assert_op_err(
            fl(-1, "b 3 4"),
            "Flatten",
            "flattening [b, 3, 4] at axis -1 (symbolic product) is not supported",
        );
    }
}

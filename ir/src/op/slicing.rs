//! Data movement along axes: `Concat`, `Split`, `Slice`, `Trilu`.

use super::broadcast::strided_index;
use super::kernel_util::{
    int_values, invalid, map_data, norm_axes, norm_axis, prod, scalar_int, strides, take, tensor,
    unsupported, EvalCtx, InferCtx,
};
use super::{OpError, TensorType};
use crate::{Data, Dim, Value};

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

fn concat_parts<T: Clone>(parts: &[(&[T], usize)], outer: usize) -> Vec<T> {
    let total = parts.iter().map(|(d, _)| d.len()).sum();
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for (d, chunk) in parts {
            out.extend_from_slice(&d[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

/// Reference kernel for `Concat`.
pub(super) fn eval_concat(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let vals = (0..cx.inputs.len())
        .map(|i| cx.input(i))
        .collect::<Result<Vec<_>, _>>()?;
    let first = vals[0];
    let a = norm_axis(cx.op, axis, first.shape.len())?;
    let outer = prod(&first.shape[..a]);
    let chunk = |v: &Value| prod(&v.shape[a..]);
    macro_rules! parts {
        ($variant:ident) => {{
            let parts = vals
                .iter()
                .map(|v| match &v.data {
                    Data::$variant(d) => Ok((&d[..], chunk(v))),
                    _ => Err(invalid(cx.op, "inputs differ in type")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Data::$variant(concat_parts(&parts, outer))
        }};
    }
    let data = match &first.data {
        Data::F32(_) => parts!(F32),
        Data::F64(_) => parts!(F64),
        Data::I64(_) => parts!(I64),
        Data::Bool(_) => parts!(Bool),
        Data::Str(_) => parts!(Str),
    };
    Ok(vec![Value {
        dtype: first.dtype,
        shape: cx.out_shape(0)?,
        data,
    }])
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
    let st: Vec<isize> = strides(&x.shape).into_iter().map(|s| s as isize).collect();
    let idx = strided_index(&shape, &st, start as isize * st[axis]);
    Value {
        dtype: x.dtype,
        shape,
        data: map_data!(&x.data, d => take(d, &idx)),
    }
}

/// Reference kernel for `Split`.
pub(super) fn eval_split(cx: &EvalCtx, axis: i64) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let a = norm_axis(cx.op, axis, x.shape.len())?;
    let mut start = 0;
    let mut out = Vec::with_capacity(cx.out.len());
    for i in 0..cx.out.len() {
        let len = cx.out_shape(i)?[a];
        out.push(narrow(x, a, start, len));
        start += len;
    }
    Ok(out)
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

/// Reference kernel for `Slice`.
pub(super) fn eval_slice(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let ints = |i: usize| cx.opt(i).map(|v| int_values(cx.op, v, i)).transpose();
    let fixed: Vec<Option<usize>> = x.shape.iter().map(|&d| Some(d)).collect();
    let (starts, ends) = (ints(1)?.unwrap_or_default(), ints(2)?.unwrap_or_default());
    let params = slice_params(cx.op, &fixed, &starts, &ends, ints(3)?, ints(4)?)?;
    let st = strides(&x.shape);
    let mut shape = x.shape.clone();
    let mut step_st: Vec<isize> = st.iter().map(|&s| s as isize).collect();
    let mut offset = 0isize;
    for s in params.into_iter().flatten() {
        shape[s.axis] = s.len;
        step_st[s.axis] = st[s.axis] as isize * s.step as isize;
        if s.len > 0 {
            offset += st[s.axis] as isize * s.start as isize;
        }
    }
    let idx = strided_index(&shape, &step_st, offset);
    Ok(vec![Value {
        dtype: x.dtype,
        shape,
        data: map_data!(&x.data, d => take(d, &idx)),
    }])
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

/// Reference kernel for `Trilu`: keeps `j - i ≥ k` (upper) or `j - i ≤ k`
/// (lower) in every trailing matrix, zeroing the rest.
pub(super) fn eval_trilu(cx: &EvalCtx, upper: bool) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let k = match cx.opt(1) {
        Some(v) => scalar_int(cx.op, &int_values(cx.op, v, 1)?, 1)?,
        None => 0,
    };
    let r = x.shape.len();
    let (n, m) = (x.shape[r - 2] as i64, x.shape[r - 1] as i64);
    let keep = |flat: usize| {
        let within = flat as i64 % (n * m).max(1);
        let (i, j) = (within / m.max(1), within % m.max(1));
        if upper {
            j - i >= k
        } else {
            j - i <= k
        }
    };
    fn zero_out<T: Clone + Default>(d: &[T], keep: impl Fn(usize) -> bool) -> Vec<T> {
        d.iter()
            .enumerate()
            .map(|(i, v)| if keep(i) { v.clone() } else { T::default() })
            .collect()
    }
    Ok(vec![Value {
        dtype: x.dtype,
        shape: x.shape.clone(),
        data: map_data!(&x.data, d => zero_out(d, keep)),
    }])
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;
    use crate::DType;

    #[test]
    fn concat_along_negative_axis() {
        let a = f32s(&[2, 1], &[1.0, 2.0]);
        let b = f32s(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            eval1(&Op::Concat { axis: -1 }, &[&a, &b]),
            (vec![2, 3], vec![1.0, 3.0, 4.0, 2.0, 5.0, 6.0])
        );
        let t = infer(
            &Op::Concat { axis: 1 },
            &[ty(DType::F32, "b 2"), ty(DType::F32, "b 3")],
        )
        .unwrap();
        assert_eq!(t[0], ty(DType::F32, "b 5"));
        let t = infer(
            &Op::Concat { axis: 0 },
            &[ty(DType::F32, "s 2"), ty(DType::F32, "0 2")],
        )
        .unwrap();
        assert_eq!(t[0], ty(DType::F32, "s 2"));
        assert_op_err(
            infer(
                &Op::Concat { axis: 0 },
                &[ty(DType::F32, "s 2"), ty(DType::F32, "1 2")],
            ),
            "Concat",
            "concatenating symbolic dims is not supported",
        );
        assert_op_err(
            infer(
                &Op::Concat { axis: 0 },
                &[ty(DType::F32, "1 2"), ty(DType::F32, "1 3")],
            ),
            "Concat",
            "input 1 dim 1 is 3, expected 2",
        );
    }

    #[test]
    fn split_uneven_and_given() {
        let x = f32s(&[7], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let op = Op::Split {
            axis: 0,
            split: None,
            outputs: 3,
        };
        let out = eval(&op, &[&x]).unwrap();
        let shapes: Vec<_> = out.iter().map(|v| v.shape.clone()).collect();
        assert_eq!(shapes, vec![vec![3], vec![3], vec![1]]);
        assert_eq!(out[2].to_f64_vec(), vec![6.0]);
        let sizes = i64s(&[2], &[2, 5]);
        let out = eval(
            &Op::Split {
                axis: -1,
                split: None,
                outputs: 2,
            },
            &[&x, &sizes],
        )
        .unwrap();
        assert_eq!(out[1].to_f64_vec(), vec![2.0, 3.0, 4.0, 5.0, 6.0]);
        let attr = Op::Split {
            axis: 0,
            split: Some(vec![3, 3]),
            outputs: 2,
        };
        assert_op_err(eval(&attr, &[&x]), "Split", "split sizes [3, 3] do not sum to 7");
        let m = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let cols = eval(
            &Op::Split {
                axis: 1,
                split: None,
                outputs: 2,
            },
            &[&m],
        )
        .unwrap();
        assert_eq!(cols[1].to_f64_vec(), vec![2.0, 4.0]);
    }

    fn slice(
        x: &Value,
        starts: &[i64],
        ends: &[i64],
        axes: Option<&[i64]>,
        steps: Option<&[i64]>,
    ) -> (Vec<usize>, Vec<f64>) {
        let v = |d: &[i64]| i64s(&[d.len()], d);
        let mut ins = vec![x.clone(), v(starts), v(ends)];
        ins.extend(axes.map(v));
        ins.extend(steps.map(v));
        eval1(&Op::Slice, &ins.iter().collect::<Vec<_>>())
    }

    #[test]
    fn slice_clamps_and_steps() {
        let x = f32s(&[2, 4], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert_eq!(
            slice(&x, &[1, 0], &[2, 3], Some(&[0, 1]), Some(&[1, 2])),
            (vec![1, 2], vec![4.0, 6.0])
        );
        assert_eq!(
            slice(&x, &[-1], &[i64::MIN], Some(&[-1]), Some(&[-1])),
            (vec![2, 4], vec![3.0, 2.0, 1.0, 0.0, 7.0, 6.0, 5.0, 4.0])
        );
        assert_eq!(
            slice(&x, &[1], &[1000], Some(&[1]), None),
            (vec![2, 3], vec![1.0, 2.0, 3.0, 5.0, 6.0, 7.0])
        );
        assert_eq!(slice(&x, &[10], &[20], Some(&[1]), None).0, vec![2, 0]);
        assert_eq!(
            slice(&x, &[-3], &[-1], Some(&[1]), Some(&[1])).1,
            vec![1.0, 2.0, 5.0, 6.0]
        );
    }

    #[test]
    fn slice_inference_on_symbolic_dims() {
        let c = |d: &[i64]| (ty(DType::I64, &d.len().to_string()), Some(i64s(&[d.len()], d)));
        let x = (ty(DType::F32, "b s 64"), None);
        let r = infer_with(
            &Op::Slice,
            &[x.clone(), c(&[0, 0]), c(&[i64::MAX, 32]), c(&[0, 2])],
        )
        .unwrap();
        assert_eq!(r[0], ty(DType::F32, "b s 32"));
        assert_op_err(
            infer_with(&Op::Slice, &[x.clone(), c(&[0]), c(&[4]), c(&[1])]),
            "Slice",
            "slicing symbolic dim 1 of [b, s, 64] is not supported",
        );
        assert_op_err(
            infer_with(&Op::Slice, &[x, c(&[0]), c(&[4]), c(&[2]), c(&[0])]),
            "Slice",
            "slice step 0",
        );
    }

    #[test]
    fn trilu_keeps_triangles() {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            eval1(&Op::Trilu { upper: true }, &[&x]).1,
            vec![1.0, 2.0, 3.0, 0.0, 5.0, 6.0]
        );
        assert_eq!(
            eval1(&Op::Trilu { upper: false }, &[&x]).1,
            vec![1.0, 0.0, 0.0, 4.0, 5.0, 0.0]
        );
        let k = i64s(&[], &[1]);
        assert_eq!(
            eval1(&Op::Trilu { upper: true }, &[&x, &k]).1,
            vec![0.0, 2.0, 3.0, 0.0, 0.0, 6.0]
        );
        let k = i64s(&[], &[-1]);
        assert_eq!(
            eval1(&Op::Trilu { upper: false }, &[&x, &k]).1,
            vec![0.0, 0.0, 0.0, 4.0, 0.0, 0.0]
        );
        assert_op_err(
            infer(&Op::Trilu { upper: true }, &[ty(DType::F32, "3")]),
            "Trilu",
            "input must have rank ≥ 2, got [3]",
        );
    }
}

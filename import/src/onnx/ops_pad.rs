//! ONNX Pad (every mode) from ops that have every facet already: along each
//! padded axis a `Gather` of the source rows each output row copies (edge:
//! the nearest; reflect: mirrored without the edge; wrap: cyclic; constant:
//! the nearest, then replaced by the value through a mask and `Where`).
//! Negative pads crop. Autodiff, sharding and kernels are the gathers'.

use super::import::Builder;
use super::ops::{float_scalar, single, sub_node, NodeCtx};
use super::OnnxError;
use autopar_ir::op::Op;
use autopar_ir::{BinaryOp, DType, Dim, Value};

/// How rows outside the source are filled.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

/// The source row output row `j` of an axis of `d` rows padded by `before`
/// reads, and whether it is inside the source.
fn source_row(mode: Mode, j: i64, before: i64, d: i64) -> (i64, bool) {
    let i = j - before;
    let inside = (0..d).contains(&i);
    let row = match mode {
        Mode::Constant | Mode::Edge => i.clamp(0, d - 1),
        Mode::Wrap => i.rem_euclid(d),
        Mode::Reflect if d == 1 => 0,
        Mode::Reflect => {
            let m = i.rem_euclid(2 * (d - 1));
            if m < d {
                m
            } else {
                2 * (d - 1) - m
            }
        }
    };
    (row, inside)
}

/// The integers of a constant input, or an error naming it.
fn const_ints(b: &Builder, n: &NodeCtx, i: usize, what: &str) -> Result<Option<Vec<i64>>, OnnxError> {
    let Some(t) = n.input(i) else { return Ok(None) };
    match b.const_value(t).and_then(Value::as_i64) {
        Some(v) => Ok(Some(v.to_vec())),
        None => Err(n.error(format!("{what} must be a constant known at import time"))),
    }
}

pub(crate) fn pad(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let x = n.required(0)?;
    let ty = b.ty(x).clone();
    let rank = ty.shape.rank();
    let mode_name = n.attrs.string("mode")?.unwrap_or_else(|| "constant".into());
    let mode = match mode_name.as_str() {
        "constant" => Mode::Constant,
        "reflect" => Mode::Reflect,
        "edge" => Mode::Edge,
        "wrap" => Mode::Wrap,
        other => {
            return Err(n.error(format!(
                "mode '{other}' is not one of constant, reflect, edge, wrap"
            )))
        }
    };
    // Opset 11 on: pads, constant value and axes are inputs; before: attributes.
    let (pads, axes) = match n.opset >= 11 {
        true => (const_ints(b, n, 1, "pads")?, const_ints(b, n, 3, "axes")?),
        false => (n.attrs.ints("pads")?, None),
    };
    let pads = pads.ok_or_else(|| n.error("needs pads"))?;
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&a| {
                let r = rank as i64;
                usize::try_from(if a < 0 { a + r } else { a })
                    .ok()
                    .filter(|&a| a < rank)
                    .ok_or_else(|| n.error(format!("axis {a} is outside a rank-{rank} input")))
            })
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(n.error(format!(
            "{} pads for {} axes (two per axis)",
            pads.len(),
            axes.len()
        )));
    }
    let mut y = x;
    let mut masks = Vec::new();
    for (k, &axis) in axes.iter().enumerate() {
        let (before, after) = (pads[k], pads[k + axes.len()]);
        if before == 0 && after == 0 {
            continue;
        }
        let d = match ty.shape.0[axis] {
            Dim::Fixed(d) => d as i64,
            Dim::Sym(ref s) => {
                return Err(n.error(format!("axis {axis} ('{s}') must have a known size to pad")))
            }
        };
        let len = d + before + after;
        if d == 0 || len < 0 {
            return Err(n.error(format!(
                "axis {axis} of {d} rows cannot be padded by ({before}, {after})"
            )));
        }
        let (rows, inside): (Vec<i64>, Vec<bool>) = (0..len).map(|j| source_row(mode, j, before, d)).unzip();
        let index = Value::i64(vec![len as usize], rows).map_err(|e| n.error(e.to_string()))?;
        let index = b.constant(&n.sub(&format!("rows{axis}")), "", index)?;
        y = sub_node(
            b,
            n,
            &format!("axis{axis}"),
            Op::Gather { axis: axis as i64 },
            vec![Some(y), Some(index)],
        )?;
        if mode == Mode::Constant && inside.iter().any(|&i| !i) {
            let mut shape = vec![1; rank];
            shape[axis] = len as usize;
            let mask = Value::new(DType::Bool, shape, autopar_ir::Data::Bool(inside))
                .map_err(|e| n.error(e.to_string()))?;
            masks.push(b.constant(&n.sub(&format!("inside{axis}")), "", mask)?);
        }
    }
    let Some((&first, rest)) = masks.split_first() else {
        return single(
            b,
            n,
            Op::Unary {
                func: autopar_ir::UnaryOp::Identity,
            },
            vec![Some(y)],
        );
    };
    let mut inside = first;
    for (k, &m) in rest.iter().enumerate() {
        inside = sub_node(
            b,
            n,
            &format!("inside_all{k}"),
            Op::Binary { func: BinaryOp::And },
            vec![Some(inside), Some(m)],
        )?;
    }
    let value = match (n.opset >= 11, n.input(2)) {
        (true, Some(v)) => v,
        (true, None) => b.constant(&n.sub("value"), "", fill(ty.dtype, 0.0))?,
        (false, _) => {
            let v = n.attrs.float("value")?.unwrap_or(0.0) as f64;
            b.constant(&n.sub("value"), "", fill(ty.dtype, v))?
        }
    };
    single(b, n, Op::Where, vec![Some(inside), Some(y), Some(value)])
}

/// A scalar of `dtype` holding `v` (integers and booleans exactly).
fn fill(dtype: DType, v: f64) -> Value {
    match dtype {
        d if d.is_float() => float_scalar(d, v),
        DType::Bool => {
            Value::new(DType::Bool, vec![], autopar_ir::Data::Bool(vec![v != 0.0])).expect("scalar")
        }
        d => Value::new(d, vec![], autopar_ir::Data::I64(vec![v as i64])).expect("scalar"),
    }
}

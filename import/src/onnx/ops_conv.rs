//! ONNX Conv, ConvTranspose, MaxPool and AveragePool: the attributes read
//! with ONNX's defaults, and `auto_pad` and ConvTranspose's `output_shape`
//! resolved into the explicit pads of a [`Window`] from the input's static
//! spatial dims, so the IR ops need one shape rule.

use super::import::Builder;
use super::ops::{single, NodeCtx};
use super::OnnxError;
use autopar_ir::op::{Op, PoolKind, Window};
use autopar_ir::Dim;

/// ONNX `auto_pad`.
#[derive(Clone, Copy, PartialEq)]
enum AutoPad {
    NotSet,
    Valid,
    SameUpper,
    SameLower,
}

/// What every windowed op reads: the input's spatial dims (which padding
/// needs), the window's attributes and `auto_pad`.
struct Attrs {
    spatial: Vec<usize>,
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pads: Vec<usize>,
    auto_pad: AutoPad,
}

/// A list attribute of `len` non-negative values, or `default` everywhere.
fn sizes(n: &NodeCtx, name: &str, len: usize, default: usize) -> Result<Vec<usize>, OnnxError> {
    let Some(values) = n.attrs.ints(name)? else {
        return Ok(vec![default; len]);
    };
    if values.len() != len {
        return Err(n.error(format!(
            "attribute '{name}' has {} values, expected {len}",
            values.len()
        )));
    }
    values
        .iter()
        .map(|&v| {
            usize::try_from(v).map_err(|_| n.error(format!("attribute '{name}' has a negative value {v}")))
        })
        .collect()
}

/// Reads the window attributes; `kernel` is the weight's taps for a
/// convolution, `None` for a pool (which requires `kernel_shape`).
fn read(b: &Builder, n: &NodeCtx, kernel: Option<Vec<usize>>) -> Result<Attrs, OnnxError> {
    let x = n.required(0)?;
    let ty = b.ty(x);
    let rank = ty.shape.rank();
    if rank < 3 {
        return Err(n.error(format!(
            "input must be [batch, channels, spatial...], got shape {}",
            ty.shape
        )));
    }
    let spatial: Vec<usize> = ty.shape.0[2..]
        .iter()
        .map(Dim::fixed)
        .collect::<Option<_>>()
        .ok_or_else(|| n.error(format!("the spatial dims of {} must be known", ty.shape)))?;
    let s = spatial.len();
    let declared = n.attrs.ints("kernel_shape")?;
    let kernel = match (kernel, declared) {
        (Some(k), Some(d)) if d.iter().map(|&v| v as usize).ne(k.iter().copied()) => {
            return Err(n.error(format!("kernel_shape {d:?} differs from the weight's {k:?}")));
        }
        (Some(k), _) => k,
        (None, Some(_)) => sizes(n, "kernel_shape", s, 1)?,
        (None, None) => return Err(n.error("attribute 'kernel_shape' is required")),
    };
    if kernel.len() != s {
        return Err(n.error(format!("kernel {kernel:?} does not match the {s} spatial dims")));
    }
    let auto_pad = match n.attrs.string("auto_pad")?.as_deref() {
        None | Some("NOTSET") => AutoPad::NotSet,
        Some("VALID") => AutoPad::Valid,
        Some("SAME_UPPER") => AutoPad::SameUpper,
        Some("SAME_LOWER") => AutoPad::SameLower,
        Some(other) => return Err(n.error(format!("unknown auto_pad '{other}'"))),
    };
    Ok(Attrs {
        strides: sizes(n, "strides", s, 1)?,
        dilations: sizes(n, "dilations", s, 1)?,
        pads: sizes(n, "pads", 2 * s, 0)?,
        spatial,
        kernel,
        auto_pad,
    })
}

/// Splits a total padding between the two ends: the larger half at the
/// end (`upper`) or at the start.
fn split(total: usize, upper: bool) -> (usize, usize) {
    let small = total / 2;
    if upper {
        (small, total - small)
    } else {
        (total - small, small)
    }
}

impl Attrs {
    /// The window of a convolution or pool: `SAME_*` pads so that each dim
    /// has `ceil(len / stride)` outputs; `VALID` pads nothing.
    fn window(&self) -> Window {
        let s = self.spatial.len();
        let mut pads = match self.auto_pad {
            AutoPad::NotSet => self.pads.clone(),
            _ => vec![0; 2 * s],
        };
        if matches!(self.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) {
            for i in 0..s {
                let len = self.spatial[i];
                let out = len.div_ceil(self.strides[i]);
                let span = self.dilations[i] * (self.kernel[i].max(1) - 1) + 1;
                let total = ((out.max(1) - 1) * self.strides[i] + span).saturating_sub(len);
                (pads[i], pads[s + i]) = split(total, self.auto_pad == AutoPad::SameUpper);
            }
        }
        Window {
            strides: self.strides.clone(),
            pads,
            dilations: self.dilations.clone(),
        }
    }
}

/// The weight's taps (its dims from 2 on); the weight's shape is static.
fn weight_taps(b: &Builder, n: &NodeCtx) -> Result<Vec<usize>, OnnxError> {
    let w = n.required(1)?;
    let ty = b.ty(w);
    ty.shape
        .0
        .get(2..)
        .and_then(|d| d.iter().map(Dim::fixed).collect::<Option<Vec<_>>>())
        .ok_or_else(|| {
            n.error(format!(
                "the weight's shape {} must be known, with a kernel",
                ty.shape
            ))
        })
}

fn group(n: &NodeCtx) -> Result<usize, OnnxError> {
    let g = n.attrs.int_or("group", 1)?;
    usize::try_from(g)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| n.error(format!("group must be positive, got {g}")))
}

pub(crate) fn conv(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let attrs = read(b, n, Some(weight_taps(b, n)?))?;
    let op = Op::Conv {
        window: attrs.window(),
        groups: group(n)?,
    };
    single(b, n, op, (0..3).map(|i| n.input(i)).collect())
}

pub(crate) fn conv_transpose(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let attrs = read(b, n, Some(weight_taps(b, n)?))?;
    let s = attrs.spatial.len();
    let mut output_padding = sizes(n, "output_padding", s, 0)?;
    let output_shape = match n.attrs.ints("output_shape")? {
        // Only the spatial dims, or (as some exporters write) every dim.
        Some(shape) if shape.len() == s || shape.len() == s + 2 => Some(
            shape[shape.len() - s..]
                .iter()
                .map(|&v| v.max(0) as usize)
                .collect::<Vec<_>>(),
        ),
        Some(shape) => return Err(n.error(format!("output_shape {shape:?} must give the {s} spatial dims"))),
        None if matches!(attrs.auto_pad, AutoPad::SameUpper | AutoPad::SameLower) => {
            Some((0..s).map(|i| attrs.spatial[i] * attrs.strides[i]).collect())
        }
        None => None,
    };
    let mut window = Window {
        strides: attrs.strides.clone(),
        pads: match attrs.auto_pad {
            AutoPad::NotSet => attrs.pads.clone(),
            _ => vec![0; 2 * s],
        },
        dilations: attrs.dilations.clone(),
    };
    // A requested output length: the padding that gives it, the end
    // lengthened when the unpadded output is still too short.
    if let Some(shape) = output_shape {
        for i in 0..s {
            let span = attrs.dilations[i] * (attrs.kernel[i].max(1) - 1) + 1;
            let natural = attrs.strides[i] * (attrs.spatial[i].max(1) - 1) + output_padding[i] + span;
            match natural.checked_sub(shape[i]) {
                Some(total) => {
                    let upper = attrs.auto_pad == AutoPad::SameUpper;
                    (window.pads[i], window.pads[s + i]) = split(total, upper);
                }
                None => {
                    (window.pads[i], window.pads[s + i]) = (0, 0);
                    output_padding[i] += shape[i] - natural;
                }
            }
        }
    }
    let op = Op::ConvTranspose {
        window,
        groups: group(n)?,
        output_padding,
    };
    single(b, n, op, (0..3).map(|i| n.input(i)).collect())
}

pub(crate) fn pool(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    if n.attrs.op_type() == "MaxPool" && n.has_output(1) {
        return Err(n.error("MaxPool's Indices output is not supported"));
    }
    let attrs = read(b, n, None)?;
    let kind = match n.attrs.op_type() {
        "MaxPool" => {
            // Storage order only lays out the Indices output.
            n.attrs.ignore(&["storage_order"]);
            PoolKind::Max
        }
        _ => PoolKind::Average {
            count_include_pad: n.attrs.flag("count_include_pad", false)?,
        },
    };
    let op = Op::Pool {
        kind,
        kernel: attrs.kernel.clone(),
        window: attrs.window(),
        ceil_mode: n.attrs.flag("ceil_mode", false)?,
    };
    single(b, n, op, vec![Some(n.required(0)?)])
}

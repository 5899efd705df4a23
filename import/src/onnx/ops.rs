//! Per-op-type conversion of ONNX nodes into [`Op`] nodes, with ONNX
//! defaults for absent attributes and the opset-dependent forms (attribute
//! vs input operands, Softmax's pre-13 semantics).
//!
//! [`converter`] is the single list of supported op types: the importer asks
//! it both to pre-check a model and to convert each node.

use super::attrs::Attrs;
use super::import::Builder;
use super::proto::NodeProto;
use super::tensor::tensor_value;
use super::OnnxError;
use autopar_ir::op::{BinaryOp, GeluApprox, Op, ReduceKind, ScalarValue, UnaryOp};
use autopar_ir::{DType, Data, RoundMode, TensorId, Value};

/// One ONNX node, its inputs resolved to tensors.
pub(crate) struct NodeCtx<'a> {
    pub(crate) attrs: Attrs<'a>,
    proto: &'a NodeProto,
    inputs: Vec<Option<TensorId>>,
    pub(crate) opset: i64,
}

impl<'a> NodeCtx<'a> {
    /// Bundles node `proto` (named `name`) with its resolved inputs and the
    /// model's ai.onnx opset version.
    pub(crate) fn new(
        name: String,
        proto: &'a NodeProto,
        inputs: Vec<Option<TensorId>>,
        opset: i64,
    ) -> NodeCtx<'a> {
        NodeCtx {
            attrs: Attrs::new(name, proto),
            proto,
            inputs,
            opset,
        }
    }

    pub(super) fn name(&self) -> &str {
        self.attrs.node()
    }

    pub(super) fn error(&self, message: impl Into<String>) -> OnnxError {
        self.attrs.error(message)
    }

    /// Input `i` if present.
    pub(super) fn input(&self, i: usize) -> Option<TensorId> {
        self.inputs.get(i).copied().flatten()
    }

    /// Input `i`, which the op requires.
    pub(super) fn required(&self, i: usize) -> Result<TensorId, OnnxError> {
        self.input(i)
            .ok_or_else(|| self.error(format!("required input {i} is missing")))
    }

    /// The ONNX output names (`""` for an omitted optional output).
    pub(super) fn outputs(&self) -> Vec<&'a str> {
        self.proto.output.iter().map(String::as_str).collect()
    }

    /// Whether the node asks for its output `i`.
    pub(super) fn has_output(&self, i: usize) -> bool {
        self.proto.output.get(i).is_some_and(|o| !o.is_empty())
    }

    /// A sub-node name for multi-node expansions.
    pub(super) fn sub(&self, suffix: &str) -> String {
        format!("{}/{suffix}", self.name())
    }
}

/// Converts one node by adding its op(s) to the builder.
pub(crate) type Convert = fn(&mut Builder, &NodeCtx) -> Result<(), OnnxError>;

const UNARY: &[(&str, UnaryOp)] = &[
    ("Neg", UnaryOp::Neg),
    ("Abs", UnaryOp::Abs),
    ("Sqrt", UnaryOp::Sqrt),
    ("Reciprocal", UnaryOp::Reciprocal),
    ("Exp", UnaryOp::Exp),
    ("Log", UnaryOp::Log),
    ("Tanh", UnaryOp::Tanh),
    ("Erf", UnaryOp::Erf),
    ("Sigmoid", UnaryOp::Sigmoid),
    ("Sin", UnaryOp::Sin),
    ("Cos", UnaryOp::Cos),
    ("Relu", UnaryOp::Relu),
    ("Not", UnaryOp::Not),
    ("Identity", UnaryOp::Identity),
    ("Floor", UnaryOp::Floor),
    ("Ceil", UnaryOp::Ceil),
    ("Sign", UnaryOp::Sign),
];

const BINARY: &[(&str, BinaryOp)] = &[
    ("Add", BinaryOp::Add),
    ("Sub", BinaryOp::Sub),
    ("Mul", BinaryOp::Mul),
    ("Div", BinaryOp::Div),
    ("Pow", BinaryOp::Pow),
    ("And", BinaryOp::And),
    ("Or", BinaryOp::Or),
    ("Xor", BinaryOp::Xor),
    ("Equal", BinaryOp::Equal),
    ("Less", BinaryOp::Less),
    ("LessOrEqual", BinaryOp::LessOrEqual),
    ("Greater", BinaryOp::Greater),
    ("GreaterOrEqual", BinaryOp::GreaterOrEqual),
];

/// Variadic ops, lowered to a chain of the binary op.
const VARIADIC: &[(&str, BinaryOp)] = &[
    ("Max", BinaryOp::Max),
    ("Min", BinaryOp::Min),
    ("Sum", BinaryOp::Add),
];

const REDUCE: &[(&str, ReduceKind)] = &[
    ("ReduceSum", ReduceKind::Sum),
    ("ReduceMean", ReduceKind::Mean),
    ("ReduceMax", ReduceKind::Max),
    ("ReduceMin", ReduceKind::Min),
    ("ReduceProd", ReduceKind::Prod),
];

fn lookup<T: Copy>(table: &[(&str, T)], op_type: &str) -> Option<T> {
    table.iter().find(|(name, _)| *name == op_type).map(|&(_, v)| v)
}

/// The converter for an ai.onnx op type, or `None` if unsupported.
pub(crate) fn converter(op_type: &str) -> Option<Convert> {
    if lookup(UNARY, op_type).is_some() {
        return Some(unary);
    }
    if lookup(BINARY, op_type).is_some() {
        return Some(binary);
    }
    if lookup(VARIADIC, op_type).is_some() {
        return Some(variadic);
    }
    if lookup(REDUCE, op_type).is_some() {
        return Some(reduce);
    }
    Some(match op_type {
        "Where" => where_,
        "MatMul" => matmul,
        "Expand" => expand,
        "Tile" => tile,
        "GlobalAveragePool" | "GlobalMaxPool" => global_pool,
        "Pad" => super::ops_pad::pad,
        "Conv" => super::ops_conv::conv,
        "ConvTranspose" => super::ops_conv::conv_transpose,
        "MaxPool" | "AveragePool" => super::ops_conv::pool,
        "BatchNormalization" => super::ops_batch_norm::batch_norm,
        "Mod" => modulo,
        "IsNaN" => is_nan,
        "IsInf" => is_inf,
        "Range" => range,
        "Size" => size,
        "Cast" => cast,
        "CastLike" => cast_like,
        "Clip" => clip,
        "Gelu" => gelu,
        "Gemm" => gemm,
        "Softmax" | "LogSoftmax" => softmax,
        "LayerNormalization" => layer_norm,
        "RMSNormalization" => rms_norm,
        "ArgMax" => arg_max,
        "TopK" => top_k,
        "CumSum" => cum_sum,
        "Reshape" => reshape,
        "Transpose" => transpose,
        "Squeeze" | "Unsqueeze" => squeeze,
        "Flatten" => flatten,
        "Concat" => concat,
        "Split" => split,
        "Slice" => slice,
        "Shape" => shape,
        "Trilu" => trilu,
        "Gather" | "GatherElements" => gather,
        "GatherND" => gather_nd,
        "ConstantOfShape" => constant_of_shape,
        "Constant" => constant,
        "Dropout" => dropout,
        "Attention" => super::ops_attention::attention,
        "RotaryEmbedding" => super::ops_attention::rotary,
        _ => return None,
    })
}

/// Adds `op` over `inputs` as the node itself, bound to its ONNX outputs.
pub(crate) fn single(
    b: &mut Builder,
    n: &NodeCtx,
    op: Op,
    inputs: Vec<Option<TensorId>>,
) -> Result<(), OnnxError> {
    b.emit(n.name(), n.attrs.op_type(), op, inputs, &n.outputs())?;
    Ok(())
}

/// Adds `op` over the node's own inputs.
pub(crate) fn pass(b: &mut Builder, n: &NodeCtx, op: Op) -> Result<(), OnnxError> {
    single(b, n, op, n.inputs.clone())
}

/// `√(variance + ε)` as sub-nodes (`epsilon`, `var_eps`, `std`), for the
/// normalisations the importer composes.
pub(crate) fn std_dev(
    b: &mut Builder,
    n: &NodeCtx,
    variance: TensorId,
    epsilon: Value,
) -> Result<TensorId, OnnxError> {
    let eps = b.constant(&n.sub("epsilon"), "", epsilon)?;
    let add = Op::Binary { func: BinaryOp::Add };
    let shifted = sub_node(b, n, "var_eps", add, vec![Some(variance), Some(eps)])?;
    sub_node(
        b,
        n,
        "std",
        Op::Unary { func: UnaryOp::Sqrt },
        vec![Some(shifted)],
    )
}

/// Adds an internal sub-node with one output and returns it.
pub(crate) fn sub_node(
    b: &mut Builder,
    n: &NodeCtx,
    suffix: &str,
    op: Op,
    inputs: Vec<Option<TensorId>>,
) -> Result<TensorId, OnnxError> {
    let out = b.emit(&n.sub(suffix), n.attrs.op_type(), op, inputs, &[])?;
    out.into_iter()
        .next()
        .ok_or_else(|| n.error(format!("sub-node '{suffix}' produced no output")))
}

/// An internal `i64[len]` constant (shapes, axes, perms).
pub(crate) fn ints_const(
    b: &mut Builder,
    n: &NodeCtx,
    suffix: &str,
    v: Vec<i64>,
) -> Result<TensorId, OnnxError> {
    let value = Value::i64(vec![v.len()], v).map_err(|e| n.error(e.to_string()))?;
    b.constant(&n.sub(suffix), "", value)
}

/// An operand given as an attribute in older opsets, as an `i64[len]` constant.
fn attr_ints_const(b: &mut Builder, n: &NodeCtx, attr: &str) -> Result<Option<TensorId>, OnnxError> {
    match n.attrs.ints(attr)? {
        Some(v) => ints_const(b, n, attr, v).map(Some),
        None => Ok(None),
    }
}

fn table_op<T: Copy>(n: &NodeCtx, table: &[(&str, T)]) -> Result<T, OnnxError> {
    lookup(table, n.attrs.op_type()).ok_or_else(|| n.error("op type not in its conversion table"))
}

fn unary(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let func = table_op(n, UNARY)?;
    pass(b, n, Op::Unary { func })
}

fn binary(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    if n.attrs.int("broadcast")? == Some(1) && n.attrs.has("axis") {
        return Err(n.error("legacy broadcast with an 'axis' attribute (opset < 7) is not supported"));
    }
    let func = table_op(n, BINARY)?;
    pass(b, n, Op::Binary { func })
}

/// `Mod`: the divisor's sign (`fmod=0`, integers in ONNX), or the
/// dividend's (`fmod=1`, C's `fmod`; required for floats).
fn modulo(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let func = match n.attrs.int("fmod")?.unwrap_or(0) {
        0 => BinaryOp::Mod,
        1 => BinaryOp::Fmod,
        other => return Err(n.error(format!("attribute 'fmod' is {other}; expected 0 or 1"))),
    };
    pass(b, n, Op::Binary { func })
}

fn variadic(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let func = table_op(n, VARIADIC)?;
    let operands = (0..n.inputs.len())
        .map(|i| n.required(i))
        .collect::<Result<Vec<_>, _>>()?;
    let Some((&first, rest)) = operands.split_first() else {
        return Err(n.error("needs at least one input"));
    };
    let Some((&last, middle)) = rest.split_last() else {
        return single(
            b,
            n,
            Op::Unary {
                func: UnaryOp::Identity,
            },
            vec![Some(first)],
        );
    };
    let mut acc = first;
    for (k, &x) in middle.iter().enumerate() {
        acc = sub_node(
            b,
            n,
            &k.to_string(),
            Op::Binary { func },
            vec![Some(acc), Some(x)],
        )?;
    }
    single(b, n, Op::Binary { func }, vec![Some(acc), Some(last)])
}

fn where_(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    pass(b, n, Op::Where)
}

fn matmul(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    pass(b, n, Op::MatMul)
}

fn expand(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    pass(b, n, Op::Expand)
}

/// `Tile(x, repeats)` as ops that have every facet already: `x` with a
/// unit dim before each of its dims, broadcast to `[r0, d0, r1, d1, ...]`,
/// reshaped to `[r0·d0, r1·d1, ...]` (the shapes computed from `Shape`, so
/// symbolic dims and computed repeats fold where they can).
fn tile(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let (x, repeats) = (n.required(0)?, n.required(1)?);
    let rank = b.ty(x).shape.rank() as i64;
    let even: Vec<i64> = (0..rank).map(|i| 2 * i).collect();
    let spread = sub_node(b, n, "spread", Op::Unsqueeze { axes: Some(even) }, vec![Some(x)])?;
    // [r0, 1, r1, 1, ...]: each repeat with a one after it.
    let column = sub_node(
        b,
        n,
        "repeat_column",
        Op::Unsqueeze { axes: Some(vec![1]) },
        vec![Some(repeats)],
    )?;
    let column_shape = sub_node(b, n, "column_shape", shape_of(), vec![Some(column)])?;
    let one = ints_const(b, n, "one", vec![1])?;
    let ones = sub_node(b, n, "ones", Op::Expand, vec![Some(one), Some(column_shape)])?;
    let pairs = sub_node(
        b,
        n,
        "pairs",
        Op::Concat { axis: 1 },
        vec![Some(column), Some(ones)],
    )?;
    let flat = ints_const(b, n, "flat", vec![-1])?;
    let target = sub_node(
        b,
        n,
        "broadcast_shape",
        Op::Reshape { allowzero: false },
        vec![Some(pairs), Some(flat)],
    )?;
    let broadcast = sub_node(b, n, "broadcast", Op::Expand, vec![Some(spread), Some(target)])?;
    let dims = sub_node(b, n, "dims", shape_of(), vec![Some(x)])?;
    let shape = sub_node(
        b,
        n,
        "shape",
        Op::Binary { func: BinaryOp::Mul },
        vec![Some(dims), Some(repeats)],
    )?;
    single(
        b,
        n,
        Op::Reshape { allowzero: false },
        vec![Some(broadcast), Some(shape)],
    )
}

/// A whole tensor's shape.
fn shape_of() -> Op {
    Op::Shape { start: 0, end: None }
}

/// `IsNaN(x)`: NaN is the one value unequal to itself.
fn is_nan(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let x = n.required(0)?;
    let same = sub_node(
        b,
        n,
        "same",
        Op::Binary {
            func: BinaryOp::Equal,
        },
        vec![Some(x), Some(x)],
    )?;
    single(b, n, Op::Unary { func: UnaryOp::Not }, vec![Some(same)])
}

/// `IsInf(x)`: equal to +∞ (`detect_positive`, default on) or −∞
/// (`detect_negative`, default on); with neither, equal to NaN (never).
fn is_inf(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let x = n.required(0)?;
    let dtype = b.ty(x).dtype;
    let on = |name: &str| -> Result<bool, OnnxError> { Ok(n.attrs.int(name)?.unwrap_or(1) != 0) };
    let mut targets = Vec::new();
    if on("detect_positive")? {
        targets.push(("positive", f64::INFINITY));
    }
    if on("detect_negative")? {
        targets.push(("negative", f64::NEG_INFINITY));
    }
    if targets.is_empty() {
        targets.push(("none", f64::NAN));
    }
    let mut hits = Vec::new();
    for (name, v) in &targets {
        let c = b.constant(&n.sub(name), "", float_scalar(dtype, *v))?;
        let last = hits.len() + 1 == targets.len() && hits.is_empty();
        let equal = Op::Binary {
            func: BinaryOp::Equal,
        };
        if last {
            return single(b, n, equal, vec![Some(x), Some(c)]);
        }
        hits.push(sub_node(
            b,
            n,
            &format!("{name}_hit"),
            equal,
            vec![Some(x), Some(c)],
        )?);
    }
    single(
        b,
        n,
        Op::Binary { func: BinaryOp::Or },
        hits.into_iter().map(Some).collect(),
    )
}

fn range(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    pass(b, n, Op::Range)
}

fn size(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    pass(b, n, Op::Size)
}

fn dtype_attr(n: &NodeCtx, code: i64) -> Result<DType, OnnxError> {
    i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx_code)
        .ok_or_else(|| n.error(format!("element type code {code} is not supported")))
}

/// `Cast`/`CastLike` to `to` with the node's `saturate` (float8 targets)
/// and `round_mode` (`f8e8m0` targets) attributes.
fn cast_op(n: &NodeCtx, to: DType) -> Result<Op, OnnxError> {
    let saturate = n.attrs.flag("saturate", true)?;
    let round_mode = match n.attrs.string("round_mode")? {
        None => RoundMode::default(),
        Some(s) => RoundMode::parse(&s)
            .ok_or_else(|| n.error(format!("round_mode '{s}' is not one of up, down, nearest")))?,
    };
    Ok(Op::Cast {
        to,
        saturate,
        round_mode,
    })
}

fn cast(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let to = dtype_attr(n, n.attrs.required_int("to")?)?;
    single(b, n, cast_op(n, to)?, vec![Some(n.required(0)?)])
}

fn cast_like(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let to = b.ty(n.required(1)?).dtype;
    single(b, n, cast_op(n, to)?, vec![Some(n.required(0)?)])
}

/// A scalar of float type `dtype` (rounded to it).
pub(crate) fn float_scalar(dtype: DType, v: f64) -> Value {
    let data = match dtype {
        DType::F64 => Data::F64(vec![v]),
        _ => Data::F32(vec![autopar_ir::round_float(dtype, v as f32)]),
    };
    Value {
        dtype,
        shape: vec![],
        data,
    }
}

fn clip(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    if n.opset >= 11 {
        return pass(b, n, Op::Clip);
    }
    let x = n.required(0)?;
    let dtype = b.ty(x).dtype;
    let mut inputs = vec![Some(x)];
    for bound in ["min", "max"] {
        let t = match n.attrs.float(bound)? {
            Some(v) => Some(b.constant(&n.sub(bound), "", float_scalar(dtype, v as f64))?),
            None => None,
        };
        inputs.push(t);
    }
    single(b, n, Op::Clip, inputs)
}

fn gelu(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let approximate = match n.attrs.string("approximate")?.as_deref() {
        None | Some("none") => GeluApprox::None,
        Some("tanh") => GeluApprox::Tanh,
        Some(other) => return Err(n.error(format!("approximate = '{other}' is not supported"))),
    };
    pass(b, n, Op::Gelu { approximate })
}

fn gemm(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    // Before opset 7 `broadcast` enabled what is now always on.
    n.attrs.ignore(&["broadcast"]);
    let op = Op::Gemm {
        alpha: n.attrs.float_or("alpha", 1.0)? as f64,
        beta: n.attrs.float_or("beta", 1.0)? as f64,
        trans_a: n.attrs.flag("transA", false)?,
        trans_b: n.attrs.flag("transB", false)?,
    };
    pass(b, n, op)
}

/// Softmax/LogSoftmax. Before opset 13 the input is coerced to 2-D at
/// `axis` (default 1) and normalised over the flattened tail; unless `axis`
/// is already the last dim that becomes Flatten → softmax → Reshape back.
fn softmax(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let log = n.attrs.op_type() == "LogSoftmax";
    let make = |axis| {
        if log {
            Op::LogSoftmax { axis }
        } else {
            Op::Softmax { axis }
        }
    };
    let x = n.required(0)?;
    if n.opset >= 13 {
        return single(b, n, make(n.attrs.int_or("axis", -1)?), vec![Some(x)]);
    }
    let rank = b.ty(x).shape.rank() as i64;
    let axis = n.attrs.int_or("axis", 1)?;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank.max(1)).contains(&axis) {
        return Err(n.error(format!("axis {axis} is out of range for rank {rank}")));
    }
    if axis == rank - 1 {
        return single(b, n, make(axis), vec![Some(x)]);
    }
    let flat = sub_node(b, n, "flatten", Op::Flatten { axis }, vec![Some(x)])?;
    let soft = sub_node(b, n, "softmax", make(1), vec![Some(flat)])?;
    let shape = sub_node(b, n, "shape", Op::Shape { start: 0, end: None }, vec![Some(x)])?;
    single(
        b,
        n,
        Op::Reshape { allowzero: false },
        vec![Some(soft), Some(shape)],
    )
}

/// LayerNormalization: `Y` is the canonical op; the optional `Mean` and
/// `InvStdDev` outputs (in `stash_type`, reduced dims kept as 1) are
/// computed beside it from primitive ops.
fn layer_norm(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let axis = n.attrs.int_or("axis", -1)?;
    let epsilon = n.attrs.float_or("epsilon", 1e-5)? as f64;
    let stash = dtype_attr(n, n.attrs.int_or("stash_type", 1)?)?;
    let outs = n.outputs();
    b.emit(
        n.name(),
        n.attrs.op_type(),
        Op::LayerNorm { axis, epsilon },
        n.inputs.clone(),
        &outs[..outs.len().min(1)],
    )?;
    let stat = |i: usize| outs.get(i).copied().unwrap_or_default();
    if stat(1).is_empty() && stat(2).is_empty() {
        return Ok(());
    }
    let x = n.required(0)?;
    let rank = b.ty(x).shape.rank() as i64;
    let start = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&start) {
        return Err(n.error(format!("axis {axis} is out of range for rank {rank}")));
    }
    let mean_op = Op::Reduce {
        kind: ReduceKind::Mean,
        axes: Some((start..rank).collect()),
        keepdims: true,
        noop_with_empty_axes: false,
    };
    let x = if b.ty(x).dtype == stash {
        x
    } else {
        sub_node(b, n, "stash", Op::cast(stash), vec![Some(x)])?
    };
    let op_type = n.attrs.op_type();
    let mean = b.emit(
        &n.sub("mean"),
        op_type,
        mean_op.clone(),
        vec![Some(x)],
        &[stat(1)],
    )?[0];
    let binary = |func| Op::Binary { func };
    let centered = sub_node(b, n, "centered", binary(BinaryOp::Sub), vec![Some(x), Some(mean)])?;
    let squared = sub_node(
        b,
        n,
        "squared",
        binary(BinaryOp::Mul),
        vec![Some(centered), Some(centered)],
    )?;
    let variance = sub_node(b, n, "variance", mean_op, vec![Some(squared)])?;
    let std = std_dev(b, n, variance, float_scalar(stash, epsilon))?;
    let inv = Op::Unary {
        func: UnaryOp::Reciprocal,
    };
    b.emit(&n.sub("inv_std_dev"), op_type, inv, vec![Some(std)], &[stat(2)])?;
    Ok(())
}

fn rms_norm(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    // The kernel's accumulation precision is its own.
    n.attrs.ignore(&["stash_type"]);
    let op = Op::RmsNorm {
        axis: n.attrs.int_or("axis", -1)?,
        epsilon: n.attrs.float_or("epsilon", 1e-5)? as f64,
    };
    pass(b, n, op)
}

/// Reductions: `axes` from the attribute (older opsets) stays an attribute;
/// from input 1 it stays an input.
fn reduce(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let kind = table_op(n, REDUCE)?;
    let keepdims = n.attrs.flag("keepdims", true)?;
    let noop_with_empty_axes = n.attrs.flag("noop_with_empty_axes", false)?;
    let (axes, inputs) = match n.attrs.ints("axes")? {
        Some(axes) if !axes.is_empty() => (Some(axes), vec![Some(n.required(0)?)]),
        Some(_) => (None, vec![Some(n.required(0)?)]),
        None => (None, n.inputs.clone()),
    };
    let op = Op::Reduce {
        kind,
        axes,
        keepdims,
        noop_with_empty_axes,
    };
    single(b, n, op, inputs)
}

/// `GlobalAveragePool` / `GlobalMaxPool` over `[N, C, spatial...]`: the mean
/// or maximum over the spatial dims, kept as ones.
fn global_pool(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let x = n.required(0)?;
    let rank = b.ty(x).shape.rank() as i64;
    if rank < 3 {
        return Err(n.error(format!("needs [N, C, spatial...], got rank {rank}")));
    }
    let kind = match n.attrs.op_type() {
        "GlobalMaxPool" => ReduceKind::Max,
        _ => ReduceKind::Mean,
    };
    let op = Op::Reduce {
        kind,
        axes: Some((2..rank).collect()),
        keepdims: true,
        noop_with_empty_axes: false,
    };
    single(b, n, op, vec![Some(x)])
}

fn arg_max(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let op = Op::ArgMax {
        axis: n.attrs.int_or("axis", 0)?,
        keepdims: n.attrs.flag("keepdims", true)?,
        select_last_index: n.attrs.flag("select_last_index", false)?,
    };
    pass(b, n, op)
}

fn top_k(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let op = Op::TopK {
        axis: n.attrs.int_or("axis", -1)?,
        largest: n.attrs.flag("largest", true)?,
        sorted: n.attrs.flag("sorted", true)?,
    };
    let k = match n.attrs.int("k")? {
        Some(k) => Some(ints_const(b, n, "k", vec![k])?),
        None => Some(n.required(1)?),
    };
    single(b, n, op, vec![Some(n.required(0)?), k])
}

fn cum_sum(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let op = Op::CumSum {
        exclusive: n.attrs.flag("exclusive", false)?,
        reverse: n.attrs.flag("reverse", false)?,
    };
    pass(b, n, op)
}

fn reshape(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let op = Op::Reshape {
        allowzero: n.attrs.flag("allowzero", false)?,
    };
    match attr_ints_const(b, n, "shape")? {
        Some(shape) => single(b, n, op, vec![Some(n.required(0)?), Some(shape)]),
        None => pass(b, n, op),
    }
}

fn transpose(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let perm = n
        .attrs
        .ints("perm")?
        .map(|p| {
            p.iter()
                .map(|&d| usize::try_from(d).map_err(|_| n.error(format!("perm {p:?} has a negative entry"))))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    pass(b, n, Op::Transpose { perm })
}

/// Squeeze/Unsqueeze: `axes` attribute before opset 13, input after.
fn squeeze(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let axes = n.attrs.ints("axes")?;
    let inputs = match axes {
        Some(_) => vec![Some(n.required(0)?)],
        None => n.inputs.clone(),
    };
    let op = if n.attrs.op_type() == "Squeeze" {
        Op::Squeeze { axes }
    } else {
        Op::Unsqueeze { axes }
    };
    single(b, n, op, inputs)
}

fn flatten(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let axis = n.attrs.int_or("axis", 1)?;
    pass(b, n, Op::Flatten { axis })
}

fn concat(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let axis = n.attrs.required_int("axis")?;
    pass(b, n, Op::Concat { axis })
}

fn split(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let split = n.attrs.ints("split")?;
    let outputs = n.outputs().len();
    if let Some(k) = n.attrs.int("num_outputs")? {
        if usize::try_from(k) != Ok(outputs) {
            return Err(n.error(format!("num_outputs = {k} but the node has {outputs} outputs")));
        }
    }
    let inputs = match split {
        Some(_) => vec![Some(n.required(0)?)],
        None => n.inputs.clone(),
    };
    let op = Op::Split {
        axis: n.attrs.int_or("axis", 0)?,
        split,
        outputs,
    };
    single(b, n, op, inputs)
}

/// Slice: `starts`/`ends`/`axes` attributes before opset 10, inputs after.
fn slice(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    if n.opset >= 10 {
        return pass(b, n, Op::Slice);
    }
    let mut inputs = vec![Some(n.required(0)?)];
    for attr in ["starts", "ends", "axes"] {
        inputs.push(attr_ints_const(b, n, attr)?);
    }
    single(b, n, Op::Slice, inputs)
}

fn shape(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let op = Op::Shape {
        start: n.attrs.int_or("start", 0)?,
        end: n.attrs.int("end")?,
    };
    pass(b, n, op)
}

fn trilu(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let upper = n.attrs.flag("upper", true)?;
    pass(b, n, Op::Trilu { upper })
}

fn gather(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let axis = n.attrs.int_or("axis", 0)?;
    let op = if n.attrs.op_type() == "Gather" {
        Op::Gather { axis }
    } else {
        Op::GatherElements { axis }
    };
    pass(b, n, op)
}

fn gather_nd(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let batch_dims = n.attrs.int_or("batch_dims", 0)?;
    pass(b, n, Op::GatherNd { batch_dims })
}

/// A tensor attribute's data (never external for an attribute).
fn attr_value(n: &NodeCtx, attr: &str) -> Result<Option<Value>, OnnxError> {
    let Some(t) = n.attrs.tensor(attr)? else {
        return Ok(None);
    };
    tensor_value(t)?
        .map(Some)
        .ok_or_else(|| n.error(format!("attribute '{attr}' refers to external data")))
}

fn constant_of_shape(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let value = match attr_value(n, "value")? {
        Some(v) => match v.to_f64_vec().as_slice() {
            &[x] => Some(ScalarValue {
                dtype: v.dtype,
                value: x,
            }),
            other => return Err(n.error(format!("'value' must hold one element, holds {}", other.len()))),
        },
        None => None,
    };
    pass(b, n, Op::ConstantOfShape { value })
}

/// `Constant`: a constant tensor, no node.
fn constant(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let shaped = |shape: Vec<usize>, data: Data, dtype| {
        Value::new(dtype, shape, data).map_err(|e| n.error(e.to_string()))
    };
    let value = if let Some(v) = attr_value(n, "value")? {
        v
    } else if let Some(f) = n.attrs.float("value_float")? {
        shaped(vec![], Data::F32(vec![f]), DType::F32)?
    } else if let Some(fs) = n.attrs.floats("value_floats")? {
        shaped(vec![fs.len()], Data::F32(fs), DType::F32)?
    } else if let Some(i) = n.attrs.int("value_int")? {
        Value::scalar_i64(i)
    } else if let Some(is) = n.attrs.ints("value_ints")? {
        shaped(vec![is.len()], Data::I64(is), DType::I64)?
    } else {
        return Err(n.error("value must be a numeric tensor, float(s) or int(s) (strings and sparse tensors are not supported)"));
    };
    let out = n.outputs().first().copied().unwrap_or_default();
    if out.is_empty() {
        return Err(n.error("has no output"));
    }
    b.constant(n.name(), out, value)?;
    Ok(())
}

/// Dropout in inference (or with ratio 0): identity; the optional mask is
/// all `true`.
fn dropout(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    n.attrs.ignore(&["seed"]);
    let training = match n.input(2) {
        Some(t) => match b.const_value(t).map(|v| &v.data) {
            Some(Data::Bool(v)) => v.iter().any(|&x| x),
            _ => return Err(n.error("training_mode must be a constant known at import time")),
        },
        None => n.opset < 7 && n.attrs.int_or("is_test", 0)? == 0,
    };
    let ratio = match n.input(1) {
        Some(t) => b.const_value(t).map(Value::to_f64_vec),
        None => n.attrs.float("ratio")?.map(|r| vec![r as f64]),
    };
    let keeps_all = ratio.is_some_and(|r| r.iter().all(|&x| x == 0.0));
    if training && !keeps_all {
        return Err(n.error("training-mode Dropout (random) is not supported"));
    }
    let x = n.required(0)?;
    let outs = n.outputs();
    b.emit(
        n.name(),
        "Dropout",
        Op::Unary {
            func: UnaryOp::Identity,
        },
        vec![Some(x)],
        &outs[..1.min(outs.len())],
    )?;
    if let Some(&mask) = outs.get(1).filter(|m| !m.is_empty()) {
        let shape = sub_node(b, n, "shape", Op::Shape { start: 0, end: None }, vec![Some(x)])?;
        let all_true = Some(ScalarValue {
            dtype: DType::Bool,
            value: 1.0,
        });
        b.emit(
            &n.sub("mask"),
            "Dropout",
            Op::ConstantOfShape { value: all_true },
            vec![Some(shape)],
            &[mask],
        )?;
    }
    Ok(())
}

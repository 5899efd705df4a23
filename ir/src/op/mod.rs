//! The one op set. Importers map into it, rewrites canonicalise it, cost
//! models price it and the runtime executes it.
//!
//! Primitive ops keep ONNX semantics (opset 13–21) so an imported graph runs
//! exactly as onnxruntime runs it; canonical ops (`Linear`, `Embedding`,
//! `LayerNorm`, `RmsNorm`, `Gelu`, `Silu`, `Attention`, `MoeRouter`) are what rewrites
//! and the model zoo produce and what the planner shards.
//!
//! Each op family lives in one file beside this one, holding that family's
//! shape inference, cost and reference kernel together:
//! `elementwise`, `linalg`, `norm`, `reduce`, `movement`, `indexing`,
//! `generate`, `attention`. Later facets (sharding rules, backward rules) go in
//! the same files.
//!
//! Inputs are positional and may be absent (ONNX's empty input name), hence
//! `Option` in every signature.

mod attention;
mod broadcast;
mod collective;
mod dispatch;
mod elementwise;
mod generate;
mod grad;
mod indexing;
mod kernel_util;
mod linalg;
mod moe;
mod movement;
mod norm;
mod reduce;
mod scatter;
mod slicing;
#[cfg(test)]
mod testing;

use crate::{DType, Value};
use serde::{Deserialize, Serialize};

/// Element-wise functions of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sqrt,
    Reciprocal,
    Exp,
    Log,
    Tanh,
    Erf,
    Sigmoid,
    Sin,
    Cos,
    Relu,
    Not,
    Identity,
    Floor,
    Ceil,
    Sign,
}

/// Element-wise functions of two broadcast inputs (numpy broadcasting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    And,
    Or,
    Xor,
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

/// Reductions over a set of axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

/// Which GELU formula: exact (erf) or the tanh approximation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum GeluApprox {
    None,
    Tanh,
}

/// Activation applied inside fused ops (MoE experts), and the one
/// `ActivationGrad` differentiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Activation {
    Silu,
    Gelu,
    GeluTanh,
    Relu,
}

/// One operation. Attributes are fields; tensor operands are the node's inputs.
///
/// Input lists (`?` = optional) are given per variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "op")]
pub enum Op {
    // ---- element-wise -------------------------------------------------------
    /// `(x)`.
    Unary { func: UnaryOp },
    /// `(a, b)`, broadcast.
    Binary { func: BinaryOp },
    /// `(cond, x, y)`, broadcast.
    Where,
    /// `(x)` converted to `to` (ONNX Cast). `saturate` clamps out-of-range
    /// values to the largest finite float8 value instead of inf/NaN;
    /// `round_mode` applies to `f8e8m0` targets. Both are omitted from JSON
    /// at their defaults (true, up); [`Op::cast`] builds the default.
    Cast {
        to: DType,
        #[serde(default = "yes", skip_serializing_if = "is_yes")]
        saturate: bool,
        #[serde(default, skip_serializing_if = "is_default")]
        round_mode: crate::RoundMode,
    },
    /// `(x, min?, max?)`.
    Clip,
    /// `(x)`: `x · sigmoid(x)`.
    Silu,
    /// `(x)`.
    Gelu { approximate: GeluApprox },

    // ---- linear algebra ------------------------------------------------------
    /// `(a, b)`: numpy matmul with batch broadcasting, 1-D promotion.
    MatMul,
    /// `(a, b, c?)`: `alpha · op(a) · op(b) + beta · c`.
    Gemm {
        alpha: f64,
        beta: f64,
        trans_a: bool,
        trans_b: bool,
    },
    /// `(x, weight[in, out], bias[out]?)`: `x · weight + bias` over the last dim.
    Linear,

    // ---- normalisation and softmax ------------------------------------------
    /// `(x)`: softmax over `axis` (opset 13 semantics: one axis).
    Softmax { axis: i64 },
    /// `(x)`.
    LogSoftmax { axis: i64 },
    /// `(x, scale, bias?)`: normalise over dims `axis..` (ONNX LayerNormalization).
    LayerNorm { axis: i64, epsilon: f64 },
    /// `(x, scale)`: `x / sqrt(mean(x², dims axis..) + epsilon) · scale`.
    RmsNorm { axis: i64, epsilon: f64 },

    // ---- attention -----------------------------------------------------------
    /// `(q[b, hq, sq, d], k[b, hk, sk, d], v[b, hk, sk, dv], mask?)`:
    /// `softmax(q·kᵀ·scale + mask) · v`, grouped-query when `hk < hq`.
    /// A boolean mask keeps `true` positions; a float mask is added.
    /// `scale` defaults to `1/sqrt(d)`. Follows ONNX Attention-23 for 4-D inputs.
    Attention { scale: Option<f64>, causal: bool },

    /// `(x, cos_cache[pos, rot/2], sin_cache[pos, rot/2], position_ids?)`:
    /// rotary position embedding (ONNX RotaryEmbedding-23). `x` is
    /// `[b, heads, s, d]`, or `[b, s, heads·d]` when `num_heads > 0`;
    /// `rotary_dim = 0` rotates the whole head.
    RotaryEmbedding {
        interleaved: bool,
        rotary_dim: usize,
        num_heads: usize,
    },

    // ---- mixture of experts --------------------------------------------------
    /// `(logits[..., experts])` → `(weights[..., top_k], indices[..., top_k])`:
    /// softmax over experts, keep the `top_k` largest, renormalise them to sum
    /// to one (Mixtral routing).
    MoeRouter { top_k: usize },
    /// `(x[..., h], weights[..., k], indices[..., k], w_in[e, h, f], w_out[e, f, h], w_gate[e, h, f]?)`:
    /// each token's output is `Σ_k weights · expert_{indices}(x)` where an
    /// expert is `act(x·w_in) · w_out`, or `(act(x·w_gate) ⊙ x·w_in) · w_out`
    /// when gated.
    MoeExperts { activation: Activation },

    // ---- adjoints of the fused ops (backward passes) --------------------------
    /// `(q, k, v, dout, mask?)` → `(dq, dk, dv, dmask?)`: the gradient of
    /// `Attention { scale, causal }` at `(q, k, v, mask?)` for the output
    /// gradient `dout`. Recomputes the probabilities instead of saving
    /// them. `mask_grad` asks for the gradient of a float mask too (summed
    /// over the dims it was broadcast along), which fixes the output count.
    AttentionGrad {
        scale: Option<f64>,
        causal: bool,
        mask_grad: bool,
    },
    /// `(x, weights, indices, w_in, w_out, dout, w_gate?)` →
    /// `(dx, dweights, dw_in, dw_out, dw_gate?)`: the gradient of
    /// `MoeExperts { activation }` for the output gradient `dout`. `gated`
    /// says whether `w_gate` is given, which fixes the output count.
    MoeExpertsGrad { activation: Activation, gated: bool },
    /// `(x, scale, dout)` → `(dx, dout·x̂)`: the gradient of `LayerNorm`
    /// (`centre`) or `RmsNorm` over the dims `axis..` with respect to `x`,
    /// and the product whose sums over the dims `scale` is broadcast along
    /// are its gradient (in the statistics' type: `f32` for 16-bit floats).
    /// Recomputes the statistics.
    NormGrad { axis: i64, epsilon: f64, centre: bool },
    /// `(x, dout)` → `dx = dout · act'(x)`: the gradient of `Gelu` or `Silu`
    /// (the `Activation` they compute) with respect to `x`.
    ActivationGrad { activation: Activation },
    /// `(y, dout)` → `dx`: the gradient of `Softmax` (`log = false`) or
    /// `LogSoftmax { axis }` from its output `y`.
    SoftmaxGrad { axis: i64, log: bool },

    // ---- tensor-parallel communication (lowered per-rank graphs) ---------------
    /// `(x)`: communication over a `group` of `parts` ranks (see
    /// [`CommKind`]); `axis` is the dim gathered, sliced or scattered.
    Comm {
        kind: CommKind,
        axis: i64,
        parts: usize,
        group: CommGroup,
    },

    // ---- reductions ---------------------------------------------------------
    /// `(x, axes?)`: `axes` as an input (opset 18) or, when imported from an
    /// older opset, already folded into the attribute.
    Reduce {
        kind: ReduceKind,
        axes: Option<Vec<i64>>,
        keepdims: bool,
        noop_with_empty_axes: bool,
    },
    /// `(x)`.
    ArgMax {
        axis: i64,
        keepdims: bool,
        select_last_index: bool,
    },
    /// `(x, k)` → `(values, indices)`.
    TopK { axis: i64, largest: bool, sorted: bool },
    /// `(x, axis)`.
    CumSum { exclusive: bool, reverse: bool },

    // ---- data movement -------------------------------------------------------
    /// `(x, shape)`.
    Reshape { allowzero: bool },
    /// `(x)`; `perm = None` reverses the dims.
    Transpose { perm: Option<Vec<usize>> },
    /// `(x, shape)`: broadcast to `shape`.
    Expand,
    /// `(x, axes?)`; `axes` from the attribute (opset < 13) or the input.
    Squeeze { axes: Option<Vec<i64>> },
    /// `(x, axes?)`; as for `Squeeze`.
    Unsqueeze { axes: Option<Vec<i64>> },
    /// `(x)` → 2-D.
    Flatten { axis: i64 },
    /// `(x0, x1, ...)`.
    Concat { axis: i64 },
    /// `(x, split?)` → `outputs` pieces; `split` from the attribute (opset < 13)
    /// or the input; equal parts (the last smaller) when absent.
    Split {
        axis: i64,
        split: Option<Vec<i64>>,
        outputs: usize,
    },
    /// `(x, starts, ends, axes?, steps?)`.
    Slice,
    /// `(x)` → its shape as `i64[rank]`, dims `start..end`.
    Shape { start: i64, end: Option<i64> },
    /// `(x)` → element count as a scalar `i64`.
    Size,
    /// `(x, k?)`: lower (`upper = false`) or upper triangle.
    Trilu { upper: bool },

    // ---- indexing ------------------------------------------------------------
    /// `(data, indices)`.
    Gather { axis: i64 },
    /// `(data, indices)`.
    GatherElements { axis: i64 },
    /// `(data, indices)`.
    GatherNd { batch_dims: i64 },
    /// `(table[vocab, hidden], ids)`: row lookup, `ids` any integer shape.
    Embedding,

    // ---- scatter-adds: adjoints of the gathers (backward passes) -------------
    /// `(grad, indices, shape)`: zeros of the constant `shape` with each
    /// `grad` element added where `Gather { axis }` of a `shape` tensor at
    /// `indices` read it; repeated indices accumulate. Backward of `Gather`
    /// and `Embedding`.
    GatherGrad { axis: i64 },
    /// `(grad, indices, shape)`: as `GatherGrad`, for `GatherElements { axis }`.
    /// Backward of `GatherElements` and `TopK`.
    GatherElementsGrad { axis: i64 },
    /// `(grad, indices, shape)`: as `GatherGrad`, for `GatherNd { batch_dims }`.
    GatherNdGrad { batch_dims: i64 },

    // ---- generators ------------------------------------------------------------
    /// `(shape)` filled with `value` (a one-element tensor; f32 zero when absent).
    ConstantOfShape { value: Option<ScalarValue> },
    /// `(start, limit, delta)`.
    Range,
}

/// A one-element constant attribute (e.g. ConstantOfShape's fill value).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ScalarValue {
    pub dtype: DType,
    /// The value; integers and booleans are exact in `f64` for the ranges used.
    pub value: f64,
}

/// What an op contributes to a model, for histograms and reports: the
/// Which of a rank's groups an [`Op::Comm`] talks in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CommGroup {
    /// The tensor-parallel group.
    Tensor,
    /// The context-parallel group.
    Context,
    /// The expert-parallel group.
    Expert,
}

/// What a [`Op::Comm`] does forward; its backward is the conjugate kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CommKind {
    /// Sum of every rank's pending share; backward: `Copy`.
    AllReduce,
    /// Identity into a split computation; backward: `AllReduce` of the gradient's shares.
    Copy,
    /// Concatenation of every rank's slice, for a replicated computation; backward: `Slice`.
    AllGather,
    /// This rank's slice of a replicated tensor; backward: `AllGather`.
    Slice,
    /// Concatenation of slices feeding a split computation (sequence
    /// parallelism's gather); backward: `ReduceScatter`.
    GatherForCompute,
    /// Sum of pending shares, keeping this rank's slice; backward: `GatherForCompute`.
    ReduceScatter,
}

impl CommKind {
    /// The kind the backward pass runs on the gradient.
    pub fn conjugate(self) -> CommKind {
        match self {
            CommKind::AllReduce => CommKind::Copy,
            CommKind::Copy => CommKind::AllReduce,
            CommKind::AllGather => CommKind::Slice,
            CommKind::Slice => CommKind::AllGather,
            CommKind::GatherForCompute => CommKind::ReduceScatter,
            CommKind::ReduceScatter => CommKind::GatherForCompute,
        }
    }
}

/// compute classes the planner cares about, and everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum OpClass {
    Linear,
    MatMul,
    Attention,
    Norm,
    Activation,
    Embedding,
    MoeRouting,
    Softmax,
    Elementwise,
    Reduction,
    DataMovement,
    Indexing,
    Generator,
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl Op {
    /// `Cast` to `to` with ONNX's default attributes (saturating, round up).
    pub fn cast(to: DType) -> Op {
        Op::Cast {
            to,
            saturate: true,
            round_mode: crate::RoundMode::default(),
        }
    }

    /// Display name: the ONNX op type for primitive ops, our name for canonical ones.
    pub fn name(&self) -> String {
        match self {
            Op::Unary { func } => format!("{func:?}"),
            Op::Binary { func } => format!("{func:?}"),
            Op::Reduce { kind, .. } => format!("Reduce{kind:?}"),
            other => {
                let dbg = format!("{other:?}");
                dbg.split([' ', '{', '(']).next().unwrap_or_default().to_string()
            }
        }
    }

    /// The class of this op; see [`OpClass`].
    pub fn class(&self) -> OpClass {
        match self {
            Op::Linear | Op::Gemm { .. } => OpClass::Linear,
            Op::MatMul => OpClass::MatMul,
            Op::Attention { .. } => OpClass::Attention,
            Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::NormGrad { .. } => OpClass::Norm,
            Op::Gelu { .. } | Op::Silu | Op::ActivationGrad { .. } => OpClass::Activation,
            Op::Embedding => OpClass::Embedding,
            Op::TopK { .. } | Op::MoeRouter { .. } => OpClass::MoeRouting,
            Op::MoeExperts { .. } | Op::MoeExpertsGrad { .. } => OpClass::Linear,
            Op::AttentionGrad { .. } => OpClass::Attention,
            Op::RotaryEmbedding { .. } => OpClass::Elementwise,
            Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::SoftmaxGrad { .. } => OpClass::Softmax,
            Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast { .. } | Op::Clip => {
                OpClass::Elementwise
            }
            Op::Reduce { .. } | Op::ArgMax { .. } | Op::CumSum { .. } => OpClass::Reduction,
            Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Expand
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Slice
            | Op::Trilu { .. }
            | Op::Comm { .. } => OpClass::DataMovement,
            Op::Gather { .. } | Op::GatherElements { .. } | Op::GatherNd { .. } => OpClass::Indexing,
            Op::GatherGrad { .. } | Op::GatherElementsGrad { .. } | Op::GatherNdGrad { .. } => {
                OpClass::Indexing
            }
            Op::Shape { .. } | Op::Size | Op::ConstantOfShape { .. } | Op::Range => OpClass::Generator,
        }
    }

    /// Number of outputs the op produces.
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::TopK { .. } | Op::MoeRouter { .. } | Op::NormGrad { .. } => 2,
            Op::AttentionGrad { mask_grad, .. } => 3 + usize::from(*mask_grad),
            Op::MoeExpertsGrad { gated, .. } => 4 + usize::from(*gated),
            Op::Split { outputs, .. } => *outputs,
            _ => 1,
        }
    }
}

/// The static type of a tensor: element type and shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: crate::Shape,
}

/// What shape inference knows about one input: its type, and its value when
/// it is a constant (needed for `Reshape`'s target shape and the like).
#[derive(Debug, Clone, Copy)]
pub struct InferInput<'a> {
    pub ty: &'a TensorType,
    pub value: Option<&'a Value>,
}

/// Cost of one op instance at concrete shapes. FLOPs count a multiply-add
/// as two; the backward pass computes gradients for every float input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub forward_flops: f64,
    pub backward_flops: f64,
    pub bytes_read: f64,
    pub bytes_written: f64,
}

/// Why an op could not be typed or evaluated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OpError {
    #[error("{op}: expected {expected} inputs, got {got}")]
    Arity {
        op: String,
        expected: String,
        got: usize,
    },
    #[error("{op}: {message}")]
    Invalid { op: String, message: String },
    #[error("{op}: input {input} must be a constant known at import time")]
    NotConstant { op: String, input: usize },
    #[error("{op}: {what} is not supported")]
    Unsupported { op: String, what: String },
}

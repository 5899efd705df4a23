//! The one op set. Importers map into it, rewrites canonicalise it, cost
//! models price it and the runtime executes it.
//!
//! Primitive ops keep ONNX semantics (opset 13–21) so an imported graph runs
//! exactly as onnxruntime runs it; canonical ops (`Linear`, `Embedding`,
//! `LayerNorm`, `RmsNorm`, `Gelu`, `Silu`, `Attention`, `MoeRouter`) are what rewrites
//! and the model zoo produce and what the planner shards.
//!
//! The op list is declared once, in the `define_ops!` table below: one line
//! per op naming its family module, class, output count and byte traffic;
//! the macro (`define.rs`) generates the enum and every per-variant table
//! from it. Each family module beside this one holds that family's shape
//! inference, cost, reference kernel and sharding rules together: `elementwise`, `linalg`,
//! `norm`, `attention`, `moe`, `collective`, `reduce`, `movement`,
//! `slicing`, `indexing`, `generate`. A family's folder holds `mod.rs`
//! (shape inference, cost and the family's entry points), `kernel.rs` (the
//! reference kernels), `grad.rs` (the fused adjoint or scatter-add its
//! backward pass emits, where it has one), `backward.rs` (its autodiff
//! rule), `shard.rs` (the ways it runs on a tensor-parallel axis, which
//! the cost model, the planner and lowering all read through [`sharding`])
//! and `tests.rs`.
//!
//! Inputs are positional and may be absent (ONNX's empty input name), hence
//! `Option` in every signature.

mod adjoint;
pub(crate) mod attention;
mod broadcast;
mod collective;
mod context;
pub(crate) mod conv;
mod define;
mod dispatch;
pub(crate) mod elementwise;
mod gemm;
mod generate;
mod geometry;
pub(crate) mod indexing;
pub(crate) mod linalg;
pub(crate) mod moe;
pub(crate) mod movement;
pub(crate) mod norm;
mod numeric;
pub(crate) mod reduce;
pub mod sharding;
mod slicing;
#[cfg(test)]
mod testing;
mod threads;

use crate::{DType, Value};
use context::{EvalCtx, InferCtx};
pub use conv::{pool_divisors, ConvSizes, PoolKind, Window};
use define::define_ops;
pub use gemm::copies_transposed_b;
pub use linalg::matmul_rows;
use serde::{Deserialize, Serialize};
pub use threads::{
    attention_ways, kernel_threads, on_kernel_threads, one_float_type, row_split, row_ways,
    set_kernel_threads, split_ways, splits_over_threads,
};

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
    /// Remainder with the divisor's sign, `a − b·⌊a/b⌋` (ONNX `Mod`,
    /// PyTorch's `remainder`, Python's `%`).
    Mod,
    /// Remainder with the dividend's sign, `a − b·trunc(a/b)` (ONNX `Mod`
    /// with `fmod=1`, C's `fmod`).
    Fmod,
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

// Each line ends with the op's family module, `OpClass`, output count and
// byte traffic (`io`, or `meta` for views and shape queries); see `define.rs`.
define_ops! {
/// One operation. Attributes are fields; tensor operands are the node's inputs.
///
/// Input lists (`?` = optional) are given per variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "op")]
pub enum Op {
    // ---- element-wise -------------------------------------------------------
    /// `(x)`.
    Unary { func: UnaryOp } => elementwise, Elementwise, 1, io;
    /// `(a, b)`, broadcast.
    Binary { func: BinaryOp } => elementwise, Elementwise, 1, io;
    /// `(cond, x, y)`, broadcast.
    Where => elementwise, Elementwise, 1, io;
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
    } => elementwise, Elementwise, 1, io;
    /// `(x, min?, max?)`.
    Clip => elementwise, Elementwise, 1, io;
    /// `(x)`: `x · sigmoid(x)`.
    Silu => elementwise, Activation, 1, io;
    /// `(x)`.
    Gelu { approximate: GeluApprox } => elementwise, Activation, 1, io;

    // ---- linear algebra ------------------------------------------------------
    /// `(a, b)`: numpy matmul with batch broadcasting, 1-D promotion.
    MatMul => linalg, MatMul, 1, io;
    /// `(a, b, c?)`: `alpha · op(a) · op(b) + beta · c`.
    Gemm { alpha: f64, beta: f64, trans_a: bool, trans_b: bool } => linalg, Linear, 1, io;
    /// `(x, weight[in, out], bias[out]?)`: `x · weight + bias` over the last dim.
    Linear => linalg, Linear, 1, io;

    // ---- convolution and pooling ---------------------------------------------
    /// `(x[n, c, d...], w[m, c/groups, k...], b[m]?)` → `[n, m, o...]`:
    /// each group of `c/groups` input channels cross-correlated with its
    /// `m/groups` filters (ONNX Conv; `auto_pad` resolved into `window`).
    Conv { window: Window, groups: usize } => conv, Conv, 1, io;
    /// `(x[n, c, d...], w[c, m/groups, k...], b[m]?)` → `[n, m, o...]`: the
    /// input-adjoint of `Conv` (ONNX ConvTranspose; `output_shape` resolved
    /// into pads and `output_padding`, which lengthens the end of each dim).
    ConvTranspose { window: Window, groups: usize, output_padding: Vec<usize> } => conv, Conv, 1, io;
    /// `(x[n, c, d...])` → `[n, c, o...]`: the max or mean of each window
    /// (ONNX MaxPool, AveragePool; `ceil_mode` rounds a partial last window up).
    Pool { kind: PoolKind, kernel: Vec<usize>, window: Window, ceil_mode: bool } => conv, Reduction, 1, io;

    // ---- normalisation and softmax ------------------------------------------
    /// `(x)`: softmax over `axis` (opset 13 semantics: one axis).
    Softmax { axis: i64 } => norm, Softmax, 1, io;
    /// `(x)`.
    LogSoftmax { axis: i64 } => norm, Softmax, 1, io;
    /// `(x, scale, bias?)`: normalise over dims `axis..` (ONNX LayerNormalization).
    LayerNorm { axis: i64, epsilon: f64 } => norm, Norm, 1, io;
    /// `(x, scale)`: `x / sqrt(mean(x², dims axis..) + epsilon) · scale`.
    RmsNorm { axis: i64, epsilon: f64 } => norm, Norm, 1, io;

    // ---- attention -----------------------------------------------------------
    /// `(q[b, hq, sq, d], k[b, hk, sk, d], v[b, hk, sk, dv], mask?)`:
    /// `softmax(q·kᵀ·scale + mask) · v`, grouped-query when `hk < hq`.
    /// A boolean mask keeps `true` positions; a float mask is added.
    /// `scale` defaults to `1/sqrt(d)`. Follows ONNX Attention-23 for 4-D inputs.
    Attention { scale: Option<f64>, causal: bool } => attention, Attention, 1, io;

    /// `(x, cos_cache[pos, rot/2], sin_cache[pos, rot/2], position_ids?)`:
    /// rotary position embedding (ONNX RotaryEmbedding-23). `x` is
    /// `[b, heads, s, d]`, or `[b, s, heads·d]` when `num_heads > 0`;
    /// `rotary_dim = 0` rotates the whole head.
    RotaryEmbedding {
        interleaved: bool,
        rotary_dim: usize,
        num_heads: usize,
    } => attention, Elementwise, 1, io;

    // ---- mixture of experts --------------------------------------------------
    /// `(logits[..., experts])` → `(weights[..., top_k], indices[..., top_k])`:
    /// softmax over experts, keep the `top_k` largest, renormalise them to sum
    /// to one (Mixtral routing).
    MoeRouter { top_k: usize } => moe, MoeRouting, 2, io;
    /// `(x[..., h], weights[..., k], indices[..., k], w_in[e, h, f], w_out[e, f, h], w_gate[e, h, f]?)`:
    /// each token's output is `Σ_k weights · expert_{indices}(x)` where an
    /// expert is `act(x·w_in) · w_out`, or `(act(x·w_gate) ⊙ x·w_in) · w_out`
    /// when gated.
    /// An index of −1 routes nothing (padding). `sources` is 1 for a rank's
    /// own tokens; under expert parallelism it is the ranks whose dispatched
    /// rows `x` holds, each block padded to what one rank could send, so on
    /// average one row in `sources` is routed: the rows the cost counts.
    MoeExperts {
        activation: Activation,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        sources: usize,
    } => moe, Linear, 1, io;
    /// `(indices[..., k] i64)` → `(order[n·k], position[n·k], counts[experts])`,
    /// all i64, over the `n` tokens' `k` assignments sorted by expert (ties
    /// in assignment order): the token each sorted row reads, the sorted row
    /// of each assignment, and the rows of each expert. Expert parallelism's
    /// permutation before its dispatch. With a `capacity`, each expert keeps
    /// its first `capacity` assignments in a block of that many rows
    /// (`order` is `[experts·capacity]`, padding reads token 0), a dropped
    /// assignment's position is −1, and `counts` are the kept ones.
    MoeSort {
        experts: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        capacity: Option<usize>,
    } => moe, MoeRouting, 3, io;
    /// `(counts[parts, local] i64)` → `[parts·rows]` i64: the local expert of
    /// each row of a dispatch's output (block `s` holds `Σ counts[s]` rows
    /// sorted by expert, then padding, marked −1).
    MoeSlots { rows: usize } => moe, MoeRouting, 1, io;

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
    } => attention, Attention, 3 + usize::from(*mask_grad), io;
    /// `(x, weights, indices, w_in, w_out, dout, w_gate?)` →
    /// `(dx, dweights, dw_in, dw_out, dw_gate?)`: the gradient of
    /// `MoeExperts { activation }` for the output gradient `dout`. `gated`
    /// says whether `w_gate` is given, which fixes the output count.
    MoeExpertsGrad {
        activation: Activation,
        gated: bool,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        sources: usize,
    } => moe, Linear, 4 + usize::from(*gated), io;
    /// `(x, scale, dout)` → `(dx, dout·x̂)`: the gradient of `LayerNorm`
    /// (`centre`) or `RmsNorm` over the dims `axis..` with respect to `x`,
    /// and the product whose sums over the dims `scale` is broadcast along
    /// are its gradient (in the statistics' type: `f32` for 16-bit floats).
    /// Recomputes the statistics.
    NormGrad { axis: i64, epsilon: f64, centre: bool } => norm, Norm, 2, io;
    /// `(x, dout)` → `dx = dout · act'(x)`: the gradient of `Gelu` or `Silu`
    /// (the `Activation` they compute) with respect to `x`.
    ActivationGrad { activation: Activation } => elementwise, Activation, 1, io;
    /// `(x, w, dout)` → `(dx, dw)`: the input and weight gradients of `Conv`
    /// or, when `transpose`, of `ConvTranspose` with the same window and
    /// groups, for the output gradient `dout`.
    ConvGrad { window: Window, groups: usize, transpose: bool } => conv, Conv, 2, io;
    /// `(x, dout)` → `dx`: the gradient of `Pool { kind, kernel, window }`
    /// (max: to the first largest element of each window).
    PoolGrad { kind: PoolKind, kernel: Vec<usize>, window: Window } => conv, Reduction, 1, io;
    /// `(y, dout)` → `dx`: the gradient of `Softmax` (`log = false`) or
    /// `LogSoftmax { axis }` from its output `y`.
    SoftmaxGrad { axis: i64, log: bool } => norm, Softmax, 1, io;

    // ---- tensor-parallel communication (lowered per-rank graphs) ---------------
    /// `(x)`: communication over a `group` of `parts` ranks (see
    /// [`CommKind`]); `axis` is the dim gathered, sliced or scattered.
    Comm { kind: CommKind, axis: i64, parts: usize, group: CommGroup } => collective, DataMovement, 1, io;

    // ---- reductions ---------------------------------------------------------
    /// `(x, axes?)`: `axes` as an input (opset 18) or, when imported from an
    /// older opset, already folded into the attribute.
    Reduce {
        kind: ReduceKind,
        axes: Option<Vec<i64>>,
        keepdims: bool,
        noop_with_empty_axes: bool,
    } => reduce, Reduction, 1, io;
    /// `(x)`.
    ArgMax { axis: i64, keepdims: bool, select_last_index: bool } => reduce, Reduction, 1, io;
    /// `(x, k)` → `(values, indices)`.
    TopK { axis: i64, largest: bool, sorted: bool } => reduce, MoeRouting, 2, io;
    /// `(x, axis)`.
    CumSum { exclusive: bool, reverse: bool } => reduce, Reduction, 1, io;

    // ---- data movement -------------------------------------------------------
    /// `(x, shape)`.
    Reshape { allowzero: bool } => movement, DataMovement, 1, meta;
    /// `(x)`; `perm = None` reverses the dims.
    Transpose { perm: Option<Vec<usize>> } => movement, DataMovement, 1, io;
    /// `(x, shape)`: broadcast to `shape`.
    Expand => movement, DataMovement, 1, io;
    /// `(x, axes?)`; `axes` from the attribute (opset < 13) or the input.
    Squeeze { axes: Option<Vec<i64>> } => movement, DataMovement, 1, meta;
    /// `(x, axes?)`; as for `Squeeze`.
    Unsqueeze { axes: Option<Vec<i64>> } => movement, DataMovement, 1, meta;
    /// `(x)` → 2-D.
    Flatten { axis: i64 } => movement, DataMovement, 1, meta;
    /// `(x0, x1, ...)`.
    Concat { axis: i64 } => slicing, DataMovement, 1, io;
    /// `(x, split?)` → `outputs` pieces; `split` from the attribute (opset < 13)
    /// or the input; equal parts (the last smaller) when absent.
    Split { axis: i64, split: Option<Vec<i64>>, outputs: usize } => slicing, DataMovement, *outputs, io;
    /// `(x, starts, ends, axes?, steps?)`.
    Slice => slicing, DataMovement, 1, io;
    /// `(x)` → its shape as `i64[rank]`, dims `start..end`.
    Shape { start: i64, end: Option<i64> } => generate, Generator, 1, meta;
    /// `(x)` → element count as a scalar `i64`.
    Size => generate, Generator, 1, meta;
    /// `(x, k?)`: lower (`upper = false`) or upper triangle.
    Trilu { upper: bool } => slicing, DataMovement, 1, io;

    // ---- indexing ------------------------------------------------------------
    /// `(data, indices)`.
    Gather { axis: i64 } => indexing, Indexing, 1, io;
    /// `(data, indices)`.
    GatherElements { axis: i64 } => indexing, Indexing, 1, io;
    /// `(data, indices)`.
    GatherNd { batch_dims: i64 } => indexing, Indexing, 1, io;
    /// `(table[vocab, hidden], ids)`: row lookup, `ids` any integer shape.
    Embedding => indexing, Embedding, 1, io;

    // ---- scatter-adds: adjoints of the gathers (backward passes) -------------
    /// `(grad, indices, shape)`: zeros of the constant `shape` with each
    /// `grad` element added where `Gather { axis }` of a `shape` tensor at
    /// `indices` read it; repeated indices accumulate. Backward of `Gather`
    /// and `Embedding`.
    GatherGrad { axis: i64 } => indexing, Indexing, 1, io;
    /// `(grad, indices, shape)`: as `GatherGrad`, for `GatherElements { axis }`.
    /// Backward of `GatherElements` and `TopK`.
    GatherElementsGrad { axis: i64 } => indexing, Indexing, 1, io;
    /// `(grad, indices, shape)`: as `GatherGrad`, for `GatherNd { batch_dims }`.
    GatherNdGrad { batch_dims: i64 } => indexing, Indexing, 1, io;

    // ---- generators ------------------------------------------------------------
    /// `(shape)` filled with `value` (a one-element tensor; f32 zero when absent).
    ConstantOfShape { value: Option<ScalarValue> } => generate, Generator, 1, io;
    /// `(start, limit, delta)`.
    Range => generate, Generator, 1, io;
}
}

/// A one-element constant attribute (e.g. ConstantOfShape's fill value).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ScalarValue {
    pub dtype: DType,
    /// The value; integers and booleans are exact in `f64` for the ranges used.
    pub value: f64,
}

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
    /// Block `r` of `axis` goes to the group's `r`-th rank, and the block
    /// received from rank `s` takes its place (equal blocks); backward: itself.
    AllToAll,
    /// `(x, sent, received)`: expert parallelism's token dispatch. `x`'s rows
    /// along `axis` are packed by destination, `sent[r, ..]` summing to the
    /// rows for rank `r`; the rows from rank `s` (`received[s, ..]` summing
    /// to their count) land at the start of block `s` of an output `parts`
    /// times as long, the rest zero. Only routed rows travel. Backward: `Combine`.
    Dispatch,
    /// `(y, sent, received)`: the reverse of `Dispatch`. The first
    /// `sent[r, ..]`-sum rows of block `r` of `y` go back to rank `r`; the
    /// rows from each rank land packed, in rank order, in an output
    /// `parts` times shorter. Backward: `Dispatch`.
    Combine,
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
            CommKind::AllToAll => CommKind::AllToAll,
            CommKind::Dispatch => CommKind::Combine,
            CommKind::Combine => CommKind::Dispatch,
        }
    }

    /// Whether the op takes row counts after its data (`Dispatch` and
    /// `Combine`: the rows sent to and received from each rank), which its
    /// conjugate takes swapped.
    pub fn counted(self) -> bool {
        matches!(self, CommKind::Dispatch | CommKind::Combine)
    }
}

/// What an op contributes to a model, for histograms and reports: the
/// compute classes the planner cares about, and everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum OpClass {
    Linear,
    MatMul,
    Conv,
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

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl Op {
    /// Whether the op's output is its input: an identity, or a copy into a
    /// tensor-parallel region (the identity forward of an all-reduce).
    /// Backends hand the input on as the output (values are never written
    /// in place: a shared tensor is copied first), the simulator lets them
    /// share memory and prices them at nothing, and lowering runs a weight's
    /// again in the backward pass rather than keep the forward's.
    pub fn passes_input(&self) -> bool {
        matches!(
            self,
            Op::Unary {
                func: UnaryOp::Identity
            } | Op::Comm {
                kind: CommKind::Copy,
                ..
            }
        )
    }

    /// Whether the op is a product of its inputs (`Linear`, `Gemm`,
    /// `MatMul`), whose backward pass reads its activation inputs again: an
    /// input lowering gathers over tensor parallelism for one is gathered
    /// again for the backward pass, the rank keeping its part (as
    /// Megatron-LM's sequence parallelism does), and the cost model prices
    /// the second gather.
    pub fn is_product(&self) -> bool {
        matches!(self, Op::Linear | Op::Gemm { .. } | Op::MatMul)
    }

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
            other => other.variant_name().to_string(),
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

//! Per-op kernels on one rank: which GEMMs, attention kernels and
//! memory-bound passes an op runs, with FLOPs and bytes, and which of its
//! tensors it keeps for the backward pass.

use autopar_ir::{BinaryOp, DType, Op, TensorId, TensorType, UnaryOp};

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// One flash-style kernel: scores never reach memory, the backward pass
    /// recomputes them, causal masking skips the masked half.
    Fused,
    /// Two batched GEMMs around a softmax (and dropout) that write the full
    /// score matrix, as Megatron-LM did before fused attention.
    Unfused,
}

/// What bounds a kernel's time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kernel {
    /// `batch` products `[m, k] × [k, n]`.
    Matmul { batch: f64, m: f64, n: f64, k: f64 },
    /// A fused attention kernel over `batch` heads of `sq` queries and `sk` keys of width `d`.
    FusedAttention { batch: f64, sq: f64, sk: f64, d: f64 },
    /// Memory-bandwidth bound.
    Streaming,
}

/// One kernel of one op on one rank, for one micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct OpWork {
    /// The node it comes from.
    pub node: String,
    pub kernel: Kernel,
    pub dtype: DType,
    pub forward_flops: f64,
    pub backward_flops: f64,
    pub forward_bytes: f64,
    pub backward_bytes: f64,
    /// Part of attention's score computation, which selective recomputation
    /// redoes in the backward pass instead of storing.
    pub attention_core: bool,
}

/// A streaming kernel's backward pass reads the output gradient and the
/// saved inputs and writes the input gradients: about twice its forward traffic.
const BACKWARD_TRAFFIC: f64 = 2.0;

/// Fused attention's backward recomputes the scores: five products against
/// the forward's two.
const FUSED_BACKWARD_RATIO: f64 = 2.5;

/// Softmax fused with scaling and masking reads the scores once and writes
/// the probabilities once; its backward reads the gradient and the
/// probabilities and writes one gradient.
const SOFTMAX_PASSES: (f64, f64) = (2.0, 3.0);

/// How a linear layer is divided across the tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProductSplit {
    /// Not a linear layer, or not divided.
    Whole,
    /// By output columns.
    Columns,
    /// By input rows (the output is a pending sum).
    Rows,
}

/// What pricing a node needs to know.
pub struct Context<'a> {
    pub op: &'a Op,
    pub name: &'a str,
    /// Resolved input and output types (absent optional inputs are `None`).
    pub input_types: &'a [Option<TensorType>],
    pub output_types: &'a [TensorType],
    pub dtype: DType,
    /// Ways this op's work is divided on one rank (tensor × context parallel).
    pub work_div: f64,
    /// Ways heads are divided: the tensor-parallel degree for split ops.
    pub head_div: f64,
    /// Ways the sequence is divided (context parallelism).
    pub seq_div: f64,
    /// Tensor-parallel degree.
    pub tp: f64,
    /// Expert-parallel degree an experts node is split over: the rank runs
    /// `1/ep` of the experts on as many routed rows (1 on one rank's graph).
    pub ep: f64,
    /// How a linear layer's weight is split.
    pub split: ProductSplit,
    pub attention: AttentionKernel,
    pub dropout: bool,
    pub residual_add: bool,
}

fn dims(t: &TensorType) -> Vec<f64> {
    t.shape.0.iter().map(|d| d.fixed().unwrap_or(0) as f64).collect()
}

fn numel(t: &TensorType) -> f64 {
    dims(t).iter().product()
}

fn elem_bytes(dtype: DType) -> f64 {
    dtype.size_bits() as f64 / 8.0
}

fn nbytes(t: &TensorType) -> f64 {
    numel(t) * elem_bytes(t.dtype)
}

impl Context<'_> {
    fn input(&self, i: usize) -> Option<&TensorType> {
        self.input_types.get(i).and_then(Option::as_ref)
    }

    fn work(&self, kernel: Kernel, flops: (f64, f64), bytes: (f64, f64), attention_core: bool) -> OpWork {
        OpWork {
            node: self.name.to_string(),
            kernel,
            dtype: self.dtype,
            forward_flops: flops.0,
            backward_flops: flops.1,
            forward_bytes: bytes.0,
            backward_bytes: bytes.1,
            attention_core,
        }
    }

    /// Dropout's mask bytes on one rank over `elements`.
    fn dropout_mask(&self, elements: f64) -> f64 {
        if self.dropout {
            elements
        } else {
            0.0
        }
    }
}

/// The kernels `ctx.op` runs on one rank.
pub fn price(ctx: &Context, ir: &autopar_ir::Cost) -> Vec<OpWork> {
    let div = ctx.work_div;
    let flops = (ir.forward_flops / div, ir.backward_flops / div);
    match ctx.op {
        Op::Linear | Op::MatMul => vec![product(ctx, flops, false)],
        Op::Gemm { trans_a, .. } => vec![product(ctx, flops, *trans_a)],
        Op::MoeExperts { .. } => vec![experts(ctx, flops)],
        Op::Conv { groups, .. } | Op::ConvTranspose { groups, .. } | Op::ConvGrad { groups, .. } => {
            vec![convolution(ctx, flops, *groups)]
        }
        Op::Attention { causal, .. } => attention(ctx, *causal),
        // Views: the next kernel reads through them.
        Op::Reshape { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Shape { .. }
        | Op::Size => vec![],
        Op::Embedding | Op::Gather { .. } => {
            let out = ctx.output_types.first().map_or(0.0, nbytes) / div;
            vec![lookup(ctx.name, ctx.dtype, flops, out)]
        }
        // Reads the entries it returns; its adjoint writes a gradient
        // shaped as the input, zero but at those entries (a cross-entropy's
        // pick of each target's log-probability).
        Op::GatherElements { .. } => {
            let out = ctx.output_types.first().map_or(0.0, nbytes) / div;
            let input = ctx.input(0).map_or(0.0, nbytes) / div;
            let mut pick = lookup(ctx.name, ctx.dtype, flops, out);
            pick.backward_bytes = input + out;
            vec![pick]
        }
        // Streaming passes: each reads its inputs and writes its outputs once.
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Cast { .. }
        | Op::Clip
        | Op::Silu
        | Op::Gelu { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::RotaryEmbedding { .. }
        | Op::MoeRouter { .. }
        | Op::AttentionGrad { .. }
        | Op::MoeExpertsGrad { .. }
        | Op::MoeSort { .. }
        | Op::MoeSlots { .. }
        | Op::NormGrad { .. }
        | Op::ActivationGrad { .. }
        | Op::SoftmaxGrad { .. }
        | Op::Comm { .. }
        | Op::Reduce { .. }
        | Op::Pool { .. }
        | Op::PoolGrad { .. }
        | Op::ArgMax { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::Transpose { .. }
        | Op::Expand
        | Op::Concat { .. }
        | Op::Trilu { .. }
        | Op::GatherNd { .. }
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. }
        | Op::ConstantOfShape { .. }
        | Op::Range => {
            let mut fwd = (ir.bytes_read + ir.bytes_written) / div;
            let mut bwd = fwd * BACKWARD_TRAFFIC;
            if ctx.residual_add {
                let mask = ctx.dropout_mask(ctx.output_types.first().map_or(0.0, numel) / div);
                fwd += mask;
                bwd += mask;
            }
            if fwd == 0.0 && flops.0 == 0.0 {
                return vec![];
            }
            vec![ctx.work(Kernel::Streaming, flops, (fwd, bwd), false)]
        }
    }
}

/// Megatron-LM's default vocabulary-parallel cross-entropy over `logits`
/// elements of type `dtype` on one rank, a streaming kernel: forward, the
/// logits cast to f32 (unless they are), their maximum (read), then in
/// place the shift, the exponential and the division by the sum (read and
/// write each), and the sum (read); backward, the kept softmax scaled in
/// place (read and write) and the gradient cast back. The targets' entries
/// touch one value per token and are left out.
pub fn megatron_cross_entropy(logits: f64, dtype: DType) -> OpWork {
    let own = elem_bytes(dtype);
    let cast = if own == 4.0 { 0.0 } else { own + 4.0 };
    let forward = cast + 4.0 + 8.0 + 8.0 + 4.0 + 8.0;
    let backward = 8.0 + cast;
    OpWork {
        node: "loss/cross_entropy_f32".to_string(),
        kernel: Kernel::Streaming,
        dtype,
        forward_flops: 0.0,
        backward_flops: 0.0,
        forward_bytes: forward * logits,
        backward_bytes: backward * logits,
        attention_core: false,
    }
}

/// A lookup or reorder writing `out` bytes on one rank: it reads only the
/// rows it returns, and its adjoint adds them back.
pub fn lookup(node: &str, dtype: DType, flops: (f64, f64), out: f64) -> OpWork {
    OpWork {
        node: node.to_string(),
        kernel: Kernel::Streaming,
        dtype,
        forward_flops: flops.0,
        backward_flops: flops.1,
        forward_bytes: 2.0 * out,
        backward_bytes: 2.0 * out,
        attention_core: false,
    }
}

/// A GEMM (linear layer or product of two activations) on one rank;
/// `trans_a` says the first operand is read transposed (`Gemm`'s attribute).
fn product(ctx: &Context, flops: (f64, f64), trans_a: bool) -> OpWork {
    let out = ctx.output_types.first().map(dims).unwrap_or_default();
    let a = ctx.input(0).map(dims).unwrap_or_default();
    let k_full = if trans_a { a.first() } else { a.last() }.copied().unwrap_or(1.0);
    let n_full = out.last().copied().unwrap_or(1.0);
    let rows: f64 = out.iter().product::<f64>() / n_full.max(1.0);
    let is_linear = ctx.split != ProductSplit::Whole;
    let (batch, m) = if is_linear {
        (1.0, rows / ctx.seq_div)
    } else {
        let m = if out.len() >= 2 { out[out.len() - 2] } else { 1.0 };
        ((rows / m.max(1.0)) / ctx.head_div, m / ctx.seq_div)
    };
    let (n, k) = match ctx.split {
        ProductSplit::Columns => (n_full / ctx.tp, k_full),
        ProductSplit::Rows => (n_full, k_full / ctx.tp),
        ProductSplit::Whole => (n_full, k_full),
    };
    let bytes = (batch * (m * k + k * n + m * n)) * elem_bytes(ctx.dtype);
    ctx.work(
        Kernel::Matmul { batch, m, n, k },
        flops,
        (bytes, bytes * BACKWARD_TRAFFIC),
        false,
    )
}

/// A convolution as the implicit GEMM a convolution library runs: per
/// group, every output position of the rank's samples (`m`) by the group's
/// filters (`n`) over its input channels' taps (`k`, from the FLOPs). It
/// reads its input and weight and writes its output once.
fn convolution(ctx: &Context, flops: (f64, f64), groups: usize) -> OpWork {
    let (x, w) = (ctx.input(0).map(numel), ctx.input(1).map(numel));
    let y = ctx.output_types.iter().take(1).map(numel).sum::<f64>();
    let out = ctx.output_types.first().map(dims).unwrap_or_default();
    let groups = groups.max(1) as f64;
    let channels = out.get(1).copied().unwrap_or(1.0).max(1.0);
    let m = (y / channels / ctx.work_div).max(1.0);
    let n = (channels / groups).max(1.0);
    let k = (flops.0 / 2.0 / (groups * m * n)).max(1.0);
    let bytes = (x.unwrap_or(0.0) + w.unwrap_or(0.0) + y) / ctx.work_div * elem_bytes(ctx.dtype);
    ctx.work(
        Kernel::Matmul {
            batch: groups,
            m,
            n,
            k,
        },
        flops,
        (bytes, bytes * BACKWARD_TRAFFIC),
        false,
    )
}

/// MoE experts: one grouped GEMM per expert projection.
fn experts(ctx: &Context, flops: (f64, f64)) -> OpWork {
    let x = ctx.input(0).map(dims).unwrap_or_default();
    let top_k = ctx.input(1).and_then(|w| dims(w).last().copied()).unwrap_or(1.0);
    let w_in = ctx.input(3).map(dims).unwrap_or_default();
    let (experts, hidden, ffn) = match w_in.as_slice() {
        [e, h, f] => (*e, *h, *f),
        _ => (1.0, 1.0, 1.0),
    };
    // A dispatch's padded blocks route one row in `sources`.
    let sources = match ctx.op {
        Op::MoeExperts { sources, .. } => (*sources).max(1) as f64,
        _ => 1.0,
    };
    let experts = experts / ctx.ep;
    let tokens = x.iter().product::<f64>() / hidden.max(1.0) / ctx.seq_div / sources;
    let m = tokens * top_k / experts.max(1.0);
    let n = ffn / ctx.tp;
    let bytes = experts * (m * hidden + hidden * n + m * n) * elem_bytes(ctx.dtype);
    ctx.work(
        Kernel::Matmul {
            batch: experts,
            m,
            n,
            k: hidden,
        },
        flops,
        (bytes, bytes * BACKWARD_TRAFFIC),
        false,
    )
}

/// Attention geometry on one rank: `(batch·heads, sq, sk, d, dv)`.
fn attention_geometry(ctx: &Context) -> Option<(f64, f64, f64, f64, f64)> {
    let (q, k, v) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let (q, k, v) = (dims(q), dims(k), dims(v));
    if q.len() != 4 || k.len() != 4 || v.len() != 4 {
        return None;
    }
    Some((q[0] * q[1] / ctx.head_div, q[2] / ctx.seq_div, k[2], q[3], v[3]))
}

fn attention(ctx: &Context, causal: bool) -> Vec<OpWork> {
    let Some((batch, sq, sk, d, dv)) = attention_geometry(ctx) else {
        return vec![];
    };
    let e = elem_bytes(ctx.dtype);
    let scores = batch * sq * sk;
    let io = batch * (sq * (d + dv) + sk * (d + dv)) * e;
    match ctx.attention {
        AttentionKernel::Fused => {
            // A causal mask hides half the scores, which the fused kernel
            // skips: under context parallelism too, where each rank's
            // queries are balanced chunks that see half the keys on average.
            let skip = if causal { 0.5 } else { 1.0 };
            let fwd = 2.0 * scores * (d + dv) * skip;
            vec![ctx.work(
                Kernel::FusedAttention { batch, sq, sk, d },
                (fwd, fwd * FUSED_BACKWARD_RATIO),
                (io, io * BACKWARD_TRAFFIC),
                false,
            )]
        }
        AttentionKernel::Unfused => {
            let qk = 2.0 * scores * d;
            let pv = 2.0 * scores * dv;
            let mut kernels = vec![
                ctx.work(
                    Kernel::Matmul {
                        batch,
                        m: sq,
                        n: sk,
                        k: d,
                    },
                    (qk, 2.0 * qk),
                    (batch * (sq * d + sk * d) * e + scores * e, 0.0),
                    true,
                ),
                ctx.work(
                    Kernel::Streaming,
                    (5.0 * scores, 5.0 * scores),
                    (SOFTMAX_PASSES.0 * scores * e, SOFTMAX_PASSES.1 * scores * e),
                    true,
                ),
            ];
            if ctx.dropout {
                // Reads the probabilities, writes the kept ones and a byte mask;
                // backward reads the gradient and the mask and writes one.
                let pass = scores * (2.0 * e + 1.0);
                kernels.push(ctx.work(Kernel::Streaming, (scores, scores), (pass, pass), true));
            }
            kernels.push(ctx.work(
                Kernel::Matmul {
                    batch,
                    m: sq,
                    n: dv,
                    k: sk,
                },
                (pv, 2.0 * pv),
                (scores * e + batch * sq * dv * e, 0.0),
                true,
            ));
            kernels
        }
    }
}

/// Tensors `op` keeps for its backward pass, among those `keeps` accepts
/// (computed float activations).
pub fn saved_tensors(
    op: &Op,
    inputs: &[Option<TensorId>],
    outputs: &[TensorId],
    keeps: impl Fn(TensorId) -> bool,
) -> Vec<TensorId> {
    let input = |i: usize| inputs.get(i).copied().flatten();
    let candidates: Vec<TensorId> = match op {
        Op::Linear | Op::Gemm { .. } => input(0).into_iter().collect(),
        // The adjoints read the forward input (the weight is a parameter).
        Op::Conv { .. } | Op::ConvTranspose { .. } | Op::Pool { .. } => input(0).into_iter().collect(),
        Op::MatMul
        | Op::Binary {
            func:
                BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Pow
                | BinaryOp::Mod
                | BinaryOp::Fmod
                | BinaryOp::Max
                | BinaryOp::Min,
        } => inputs.iter().flatten().copied().collect(),
        Op::Unary { func } if !matches!(func, UnaryOp::Neg | UnaryOp::Identity | UnaryOp::Not) => {
            input(0).into_iter().collect()
        }
        Op::Gelu { .. } | Op::Silu | Op::Clip | Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            input(0).into_iter().collect()
        }
        Op::MoeExperts { .. } => input(0).into_iter().chain(input(1)).collect(),
        Op::Softmax { .. } | Op::LogSoftmax { .. } | Op::MoeRouter { .. } => {
            outputs.first().copied().into_iter().collect()
        }
        Op::Attention { .. } => (0..3).filter_map(input).collect(),
        // Linear in their inputs, index-only, or not differentiated (the
        // adjoints, shape queries and generators): nothing to keep.
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Cast { .. }
        | Op::RotaryEmbedding { .. }
        | Op::AttentionGrad { .. }
        | Op::ConvGrad { .. }
        | Op::PoolGrad { .. }
        | Op::MoeExpertsGrad { .. }
        | Op::MoeSort { .. }
        | Op::MoeSlots { .. }
        | Op::NormGrad { .. }
        | Op::ActivationGrad { .. }
        | Op::SoftmaxGrad { .. }
        | Op::Comm { .. }
        | Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Expand
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Shape { .. }
        | Op::Size
        | Op::Trilu { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::Embedding
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. }
        | Op::ConstantOfShape { .. }
        | Op::Range => vec![],
    };
    candidates.into_iter().filter(|&t| keeps(t)).collect()
}

/// Bytes an op keeps beyond its named tensors (score matrices, dropout
/// masks, expert intermediates, softmax statistics), and how many of them
/// selective recomputation drops.
pub fn saved_extra_bytes(ctx: &Context) -> (f64, f64) {
    let e = elem_bytes(ctx.dtype);
    match ctx.op {
        Op::Attention { .. } => {
            let Some((batch, sq, sk, _, _)) = attention_geometry(ctx) else {
                return (0.0, 0.0);
            };
            match ctx.attention {
                // The fused adjoint (`AttentionGrad`) reads q, k, v and the
                // output's gradient and recomputes the rest: nothing more.
                AttentionKernel::Fused => (0.0, 0.0),
                AttentionKernel::Unfused => {
                    let scores = batch * sq * sk;
                    // Probabilities; with dropout also its mask and the kept probabilities.
                    let kept = scores * e + ctx.dropout_mask(scores * (1.0 + e));
                    (kept, kept)
                }
            }
        }
        Op::Binary { func: BinaryOp::Add } if ctx.residual_add => {
            let mask = ctx.dropout_mask(ctx.output_types.first().map_or(0.0, numel) / ctx.work_div);
            (mask, 0.0)
        }
        // Everything else keeps only named tensors (or nothing). The experts'
        // fused adjoint recomputes each routed token's hidden states from
        // the op's inputs, so nothing per routed token is kept.
        Op::MoeExperts { .. }
        | Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Cast { .. }
        | Op::Clip
        | Op::Silu
        | Op::Gelu { .. }
        | Op::MatMul
        | Op::Gemm { .. }
        | Op::Linear
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::RotaryEmbedding { .. }
        | Op::MoeRouter { .. }
        | Op::AttentionGrad { .. }
        | Op::Conv { .. }
        | Op::ConvTranspose { .. }
        | Op::Pool { .. }
        | Op::ConvGrad { .. }
        | Op::PoolGrad { .. }
        | Op::MoeExpertsGrad { .. }
        | Op::MoeSort { .. }
        | Op::MoeSlots { .. }
        | Op::NormGrad { .. }
        | Op::ActivationGrad { .. }
        | Op::SoftmaxGrad { .. }
        | Op::Comm { .. }
        | Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Expand
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Shape { .. }
        | Op::Size
        | Op::Trilu { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::Embedding
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. }
        | Op::ConstantOfShape { .. }
        | Op::Range => (0.0, 0.0),
    }
}

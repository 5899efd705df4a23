//! Routes each op to its backward rule, which lives in its family's folder
//! (`op/<family>/backward.rs`). Each rule returns one entry per forward
//! input: its gradient, or `None` where the input needs none (`wants[i]`
//! false) or has no gradient (integer indices, shapes).

use super::{AutodiffError, Ctx};
use crate::op::{attention, conv, elementwise, indexing, linalg, moe, movement, norm, reduce};
use crate::{Node, Op, TensorId};

/// Input gradients of `node` from its output gradients (`None` where an
/// output has none).
pub fn input_grads(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    match &node.op {
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Cast { .. }
        | Op::Clip
        | Op::Silu
        | Op::Gelu { .. }
        | Op::ActivationGrad { .. } => elementwise::backward::backward(ctx, node, grads, wants),
        Op::MatMul | Op::Gemm { .. } | Op::Linear => linalg::backward::backward(ctx, node, grads, wants),
        Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::NormGrad { .. }
        | Op::SoftmaxGrad { .. } => norm::backward::backward(ctx, node, grads, wants),
        Op::Attention { .. } | Op::RotaryEmbedding { .. } | Op::AttentionGrad { .. } => {
            attention::backward::backward(ctx, node, grads, wants)
        }
        Op::MoeRouter { .. } | Op::MoeExperts { .. } | Op::MoeExpertsGrad { .. } => {
            moe::backward::backward(ctx, node, grads, wants)
        }
        Op::Conv { .. }
        | Op::ConvTranspose { .. }
        | Op::Pool { .. }
        | Op::ConvGrad { .. }
        | Op::PoolGrad { .. } => conv::backward::backward(ctx, node, grads, wants),
        Op::Reduce { .. } | Op::CumSum { .. } => reduce::backward::backward(ctx, node, grads, wants),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Expand
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Trilu { .. } => movement::backward::backward(ctx, node, grads, wants),
        Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::Embedding
        | Op::TopK { .. }
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. } => indexing::backward::backward(ctx, node, grads, wants),
        // Communication: the conjugate communication of the gradient.
        Op::Comm {
            kind,
            axis,
            parts,
            group,
        } => {
            let mut out = Ctx::no_grads(node);
            if let (Some(g), true) = (grads[0], wants[0]) {
                let op = Op::Comm {
                    kind: kind.conjugate(),
                    axis: *axis,
                    parts: *parts,
                    group: *group,
                };
                // A counted exchange runs backward with the counts swapped:
                // what a rank received it sends back.
                let mut inputs = vec![g];
                if kind.counted() {
                    inputs.extend(node.inputs[1..].iter().rev().flatten());
                }
                out[0] = Some(ctx.emit1(op, &inputs)?);
            }
            Ok(out)
        }
        // Integer-valued or data-independent results carry no gradient.
        Op::ArgMax { .. }
        | Op::Shape { .. }
        | Op::Size
        | Op::ConstantOfShape { .. }
        | Op::Range
        | Op::MoeSort { .. }
        | Op::MoeSlots { .. } => Ok(Ctx::no_grads(node)),
    }
}

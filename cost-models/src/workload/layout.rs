//! Megatron-style tensor-parallel layouts, propagated op by op.
//!
//! A linear layer reading a replicated activation is split by output columns
//! (its output is split across the tensor-parallel group); one reading a
//! split activation is split by input rows (its output is a pending sum).
//! A pending sum is all-reduced — or reduce-scattered under sequence
//! parallelism — where a non-linear op first needs it. Attention runs on the
//! heads its inputs carry; normalisations and reductions need whole rows.
//! These rules reproduce Megatron-LM's layer sharding for GPT, Llama, BERT
//! and MoE blocks without naming any of them.

use autopar_ir::{BinaryOp, Op};

/// Where the values of a tensor live across the tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Computed only from parameters and constants: weights (sharded with
    /// the op that uses them).
    Weight,
    /// Every rank holds all of it.
    Replicated,
    /// Each rank holds a `1/tp` slice (columns or heads).
    Split,
    /// Each rank holds a `1/tp` share of a sum (after a row-parallel product).
    Partial,
}

impl Layout {
    /// True when the tensor's values are divided across the group.
    pub fn is_sharded(self) -> bool {
        matches!(self, Layout::Split | Layout::Partial)
    }
}

/// What an op needs done to its inputs before it runs, and what it produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Input slots holding a pending sum that must be reduced first.
    pub reduce: Vec<usize>,
    /// Input slots holding a split tensor that must be gathered first.
    pub gather: Vec<usize>,
    /// Input slots read by a column-parallel product: their gradient is a
    /// pending sum in the backward pass.
    pub column_input: Vec<usize>,
    /// Layout of every output.
    pub output: Layout,
    /// The op is split by output columns or input rows (its weights are sharded).
    pub weight_sharded: bool,
}

/// Decides how `op` runs given its inputs' layouts (`None` = absent input).
pub fn decide(op: &Op, inputs: &[Option<Layout>]) -> Decision {
    let present = || inputs.iter().enumerate().filter_map(|(i, l)| l.map(|l| (i, l)));
    let activations: Vec<(usize, Layout)> = present().filter(|(_, l)| *l != Layout::Weight).collect();
    let mut d = Decision {
        reduce: vec![],
        gather: vec![],
        column_input: vec![],
        output: Layout::Weight,
        weight_sharded: false,
    };
    if activations.is_empty() {
        return d;
    }
    let reduce_all = |d: &mut Decision| {
        d.reduce = activations
            .iter()
            .filter(|(_, l)| *l == Layout::Partial)
            .map(|(i, _)| *i)
            .collect();
    };
    let after_reduce = |l: Layout| {
        if l == Layout::Partial {
            Layout::Replicated
        } else {
            l
        }
    };
    let any_split = activations.iter().any(|(_, l)| after_reduce(*l) == Layout::Split);
    let is_weight = |i: usize| inputs.get(i).copied().flatten() == Some(Layout::Weight);
    let rule = rule(op);
    let layer = match rule {
        Rule::Layer => true,
        Rule::Product => is_weight(1) && !is_weight(0),
        Rule::Embedding | Rule::Experts | Rule::Linear | Rule::Rows | Rule::Pointwise => false,
    };
    match rule {
        Rule::Layer | Rule::Product if layer => {
            let x = activations[0];
            if x.1 == Layout::Split {
                d.output = Layout::Partial;
            } else {
                if x.1 == Layout::Partial {
                    d.reduce.push(x.0);
                }
                d.column_input.push(x.0);
                d.output = Layout::Split;
            }
            d.weight_sharded = true;
        }
        Rule::Embedding => {
            // Vocabulary-parallel: each rank looks up its rows, zeros elsewhere.
            d.output = Layout::Partial;
            d.weight_sharded = true;
        }
        Rule::Experts => {
            // Each expert's MLP is split like a dense one: column then row.
            gather_split(&mut d, &activations[..1]);
            reduce_all(&mut d);
            d.column_input.push(activations[0].0);
            d.output = Layout::Partial;
            d.weight_sharded = true;
        }
        // Linear in every input: reshaping or summing pending sums keeps them pending.
        Rule::Linear if activations.iter().all(|(_, l)| *l == Layout::Partial) => {
            d.output = Layout::Partial;
        }
        Rule::Rows => {
            reduce_all(&mut d);
            gather_split(&mut d, &activations);
            d.output = Layout::Replicated;
        }
        Rule::Layer | Rule::Product | Rule::Linear | Rule::Pointwise => {
            reduce_all(&mut d);
            d.output = if any_split {
                Layout::Split
            } else {
                Layout::Replicated
            };
        }
    }
    d
}

fn gather_split(d: &mut Decision, activations: &[(usize, Layout)]) {
    d.gather.extend(
        activations
            .iter()
            .filter(|(_, l)| *l == Layout::Split)
            .map(|(i, _)| *i),
    );
}

/// How the layout propagates through an op, by op family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// A linear layer (`Linear`: its second operand is always the weight).
    Layer,
    /// A product: a linear layer when its second operand is a weight and its
    /// first is not, else element-wise over the split it reads.
    Product,
    /// A row lookup in a vocabulary-parallel table.
    Embedding,
    /// Fused MoE experts: each expert's MLP split column then row.
    Experts,
    /// Linear in its activation inputs, so pending sums pass through.
    Linear,
    /// Needs whole rows (normalisations, reductions, routing): split inputs
    /// are gathered.
    Rows,
    /// Runs on whatever split its inputs carry (heads, columns); pending sums
    /// are reduced first.
    Pointwise,
}

/// The rule of `op`. Exhaustive on purpose: a new op must choose its rule
/// here, or it would silently be priced as point-wise.
fn rule(op: &Op) -> Rule {
    match op {
        Op::Linear => Rule::Layer,
        Op::MatMul | Op::Gemm { .. } => Rule::Product,
        Op::Embedding => Rule::Embedding,
        Op::MoeExperts { .. } => Rule::Experts,
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Concat { .. }
        | Op::Binary {
            func: BinaryOp::Add | BinaryOp::Sub,
        } => Rule::Linear,
        Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Reduce { .. }
        | Op::ArgMax { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::MoeRouter { .. }
        | Op::Conv { .. }
        | Op::ConvTranspose { .. }
        | Op::Pool { .. } => Rule::Rows,
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Cast { .. }
        | Op::Clip
        | Op::Silu
        | Op::Gelu { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Attention { .. }
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
        | Op::Expand
        | Op::Shape { .. }
        | Op::Size
        | Op::Trilu { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. }
        | Op::ConstantOfShape { .. }
        | Op::Range => Rule::Pointwise,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Layout::*;

    fn add() -> Op {
        Op::Binary { func: BinaryOp::Add }
    }

    #[test]
    fn linear_on_replicated_is_column_parallel() {
        let d = decide(&Op::Linear, &[Some(Replicated), Some(Weight), Some(Weight)]);
        assert_eq!(
            (d.output, d.column_input.clone(), d.weight_sharded),
            (Split, vec![0], true)
        );
        assert!(d.reduce.is_empty());
    }

    #[test]
    fn linear_on_split_is_row_parallel() {
        let d = decide(&Op::Linear, &[Some(Split), Some(Weight), None]);
        assert_eq!(d.output, Partial);
        assert!(d.column_input.is_empty() && d.reduce.is_empty());
    }

    #[test]
    fn residual_add_reduces_the_pending_sum() {
        let d = decide(&add(), &[Some(Partial), Some(Replicated)]);
        assert_eq!((d.output, d.reduce), (Replicated, vec![0]));
        let d = decide(&add(), &[Some(Partial), Some(Partial)]);
        assert_eq!((d.output, d.reduce), (Partial, vec![]));
    }

    #[test]
    fn norm_gathers_split_rows() {
        let ln = Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        };
        let d = decide(&ln, &[Some(Split), Some(Weight), Some(Weight)]);
        assert_eq!((d.output, d.gather), (Replicated, vec![0]));
    }

    #[test]
    fn attention_keeps_heads_split_and_weights_stay_weights() {
        let att = Op::Attention {
            scale: None,
            causal: true,
        };
        assert_eq!(
            decide(&att, &[Some(Split), Some(Split), Some(Split), None]).output,
            Split
        );
        let t = Op::Transpose { perm: None };
        assert_eq!(decide(&t, &[Some(Weight)]).output, Weight);
        assert_eq!(
            decide(&Op::Embedding, &[Some(Weight), Some(Replicated)]).output,
            Partial
        );
    }

    #[test]
    fn matmul_of_two_activations_is_not_a_linear_layer() {
        let d = decide(&Op::MatMul, &[Some(Split), Some(Split)]);
        assert_eq!((d.output, d.weight_sharded), (Split, false));
    }
}

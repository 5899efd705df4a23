//! Sharding rules: the ways each op can run on one mesh axis of `tp` ranks.
//!
//! A [`Strategy`] names the layout each input must arrive in, the layout of
//! each output, how many ways the op's work is divided, and which replicated
//! inputs get a partial-sum gradient (so the backward pass must reduce it).
//! Every op can run replicated, so every node has at least one strategy and
//! the ILP is always feasible; a dim is only sharded when `tp` divides it.
//! Products are in [`super::products`], movement and indexing ops in
//! [`super::views`].

use super::ShardingError;
use super::{products, views};
use autopar_ir::{BinaryOp, Bindings, Graph, NodeIndex, Op, ReduceKind, TensorId, UnaryOp, Value};

/// How a tensor is laid out over the `tp` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// Every rank holds all of it.
    Replicate,
    /// Each rank holds a contiguous `1/tp` block of this dim.
    Shard(usize),
    /// Each rank holds a full-size addend; the tensor is their sum.
    Partial,
}

/// Layout of the gradient a producer needs for an output laid out as `l`:
/// a partial sum's addends all see the whole gradient.
pub fn output_grad(l: Layout) -> Layout {
    match l {
        Layout::Partial => Layout::Replicate,
        other => other,
    }
}

/// Layout of the gradient a consumer returns for an input it read as `l`
/// (`partial`: a replicated input read by divided work).
pub fn input_grad(l: Layout, partial: bool) -> Layout {
    match l {
        Layout::Replicate if partial => Layout::Partial,
        Layout::Partial => Layout::Replicate,
        other => other,
    }
}

/// One way to run an op.
#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    /// Short name (`replicate`, `column`, `row`, `heads`, `dim2`, ...).
    pub name: String,
    /// Layout each input slot is consumed in (`None` for absent inputs).
    pub inputs: Vec<Option<Layout>>,
    /// Per input slot: its gradient is a partial sum over the ranks (a
    /// replicated input read by divided work, e.g. column-parallel's input).
    pub grad_partial: Vec<bool>,
    /// Layout of each output.
    pub outputs: Vec<Layout>,
    /// Ways the op's work is divided (1 or `tp`).
    pub divisor: usize,
}

impl Strategy {
    /// A strategy whose replicated inputs get partial gradients exactly when
    /// the work is divided.
    pub(super) fn new(
        name: impl Into<String>,
        inputs: Vec<Option<Layout>>,
        outputs: Vec<Layout>,
        divisor: usize,
    ) -> Strategy {
        let grad_partial = inputs
            .iter()
            .map(|l| *l == Some(Layout::Replicate) && divisor > 1)
            .collect();
        Strategy {
            name: name.into(),
            inputs,
            grad_partial,
            outputs,
            divisor,
        }
    }

    /// How input `slot` is read, and the layout its gradient comes back in.
    pub fn reads(&self, slot: usize) -> (Layout, Layout) {
        let layout = self
            .inputs
            .get(slot)
            .copied()
            .flatten()
            .unwrap_or(Layout::Replicate);
        let partial = self.grad_partial.get(slot).copied().unwrap_or(false);
        (layout, input_grad(layout, partial))
    }

    /// Overrides whether input `slot`'s gradient is a partial sum.
    pub(super) fn grad(mut self, slot: usize, partial: bool) -> Strategy {
        if let Some(g) = self.grad_partial.get_mut(slot) {
            *g = partial;
        }
        self
    }
}

/// What the rules see of one node: resolved shapes, constant input values
/// and the axis size.
pub struct NodeView<'a> {
    /// Input shapes (`None` for absent inputs).
    pub inputs: Vec<Option<Vec<usize>>>,
    /// Constant input values (axes, split sizes), where known.
    pub values: Vec<Option<&'a Value>>,
    pub outputs: Vec<Vec<usize>>,
    /// The first output is a float tensor (partial sums make sense).
    pub float_out: bool,
    pub tp: usize,
}

impl NodeView<'_> {
    /// Shape of input `i`, if present.
    pub(super) fn input(&self, i: usize) -> Option<&[usize]> {
        self.inputs.get(i).and_then(|s| s.as_deref())
    }

    /// Shape of the first output.
    pub(super) fn out(&self) -> Option<&[usize]> {
        self.outputs.first().map(Vec::as_slice)
    }

    /// True when `tp` ranks can each take an equal block of a dim of size `n`.
    pub(super) fn splits(&self, n: usize) -> bool {
        n > 0 && n % self.tp == 0
    }

    /// One layout per input slot from `f(slot, shape)`; absent inputs stay `None`.
    pub(super) fn slots(&self, f: impl Fn(usize, &[usize]) -> Layout) -> Vec<Option<Layout>> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, s)| s.as_deref().map(|s| f(i, s)))
            .collect()
    }

    /// Every output in `layout`.
    pub(super) fn all_out(&self, layout: Layout) -> Vec<Layout> {
        vec![layout; self.outputs.len()]
    }

    /// Input `slot`'s integer constant value, if known.
    pub(super) fn ints(&self, slot: usize) -> Option<&[i64]> {
        self.values.get(slot).copied().flatten().and_then(Value::as_i64)
    }

    /// Partial sums pass through when the inputs in `partial` are partial
    /// and the rest replicated: the op is linear in those inputs.
    pub(super) fn partial_through(&self, partial: &[usize]) -> Option<Strategy> {
        if !self.float_out || partial.iter().any(|&i| self.input(i).is_none()) {
            return None;
        }
        let inputs = self.slots(|i, _| {
            if partial.contains(&i) {
                Layout::Partial
            } else {
                Layout::Replicate
            }
        });
        Some(Strategy::new("partial", inputs, self.all_out(Layout::Partial), 1))
    }
}

/// Resolved dims of tensor `t`, read or written by `node`.
pub(super) fn resolved_dims(
    graph: &Graph,
    bindings: &Bindings,
    node: NodeIndex,
    t: TensorId,
) -> Result<Vec<usize>, ShardingError> {
    let tensor = graph.tensor(t);
    tensor
        .ty
        .shape
        .resolve(bindings)
        .ok_or_else(|| ShardingError::Unbound {
            node: graph.node(node).name.clone(),
            tensor: tensor.name.clone(),
            shape: tensor.ty.shape.to_string(),
        })
}

/// What the rules see of node `idx` of `graph` on `tp` ranks.
pub(super) fn node_view<'g>(
    graph: &'g Graph,
    bindings: &Bindings,
    idx: NodeIndex,
    tp: usize,
) -> Result<NodeView<'g>, ShardingError> {
    let node = graph.node(idx);
    let inputs = node
        .inputs
        .iter()
        .map(|t| t.map(|t| resolved_dims(graph, bindings, idx, t)).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = node
        .outputs
        .iter()
        .map(|&t| resolved_dims(graph, bindings, idx, t))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NodeView {
        values: node
            .inputs
            .iter()
            .map(|t| t.and_then(|t| graph.tensor(t).data.as_deref()))
            .collect(),
        inputs,
        float_out: node
            .outputs
            .first()
            .is_some_and(|&t| graph.tensor(t).ty.dtype.is_float()),
        outputs,
        tp,
    })
}

/// Normalises a possibly negative axis; `None` when out of range.
pub(super) fn axis(a: i64, rank: usize) -> Option<usize> {
    let a = if a < 0 { a + rank as i64 } else { a };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

/// Layout of an operand broadcast against an output of rank `out_rank`
/// when the output is sharded on `out_dim` (of size `size`): sharded on the
/// aligned dim if the operand has it at full size, else replicated.
pub(super) fn aligned(shape: &[usize], out_rank: usize, out_dim: usize, size: usize) -> Layout {
    match (out_dim + shape.len()).checked_sub(out_rank) {
        Some(i) if shape.get(i) == Some(&size) => Layout::Shard(i),
        _ => Layout::Replicate,
    }
}

/// The candidate strategies of `op`, `replicate` first. With `tp == 1`
/// replication is the only one.
pub fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    let inputs = v.slots(|_, _| Layout::Replicate);
    let mut all = vec![Strategy::new(
        "replicate",
        inputs,
        v.all_out(Layout::Replicate),
        1,
    )];
    if v.tp < 2 || v.outputs.is_empty() {
        return all;
    }
    let more = match op {
        Op::Binary { func } => elementwise(v, linear_operands(*func)),
        // Linear in their one operand: a partial sum passes through.
        Op::Unary {
            func: UnaryOp::Neg | UnaryOp::Identity,
        }
        | Op::Cast { .. } => elementwise(v, &[&[0]]),
        Op::Unary { .. } | Op::Where | Op::Clip | Op::Silu | Op::Gelu { .. } => elementwise(v, &[]),
        Op::Linear => products::linear(v),
        Op::MatMul => products::matmul(v),
        Op::Gemm { trans_a, trans_b, .. } => products::gemm(v, *trans_a, *trans_b),
        Op::Attention { .. } => products::attention(v),
        Op::RotaryEmbedding { num_heads, .. } => products::rotary(v, *num_heads),
        Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } => {
            keep_dims(v, |j, r| Some(j) < self::axis(*axis, r))
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            keep_dims(v, |j, r| Some(j) != self::axis(*axis, r))
        }
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes,
        } => reduce(v, *kind, axes.as_deref(), *keepdims, *noop_with_empty_axes),
        Op::ArgMax { axis, keepdims, .. } => match v.input(0).and_then(|x| self::axis(*axis, x.len())) {
            Some(a) => reduced(v, &[a], *keepdims),
            None => vec![],
        },
        Op::TopK { axis, .. } => keep_dims(v, |j, r| Some(j) != self::axis(*axis, r)),
        Op::CumSum { .. } => match v.ints(1).and_then(|a| a.first().copied()) {
            Some(a) => keep_dims(v, |j, r| Some(j) != self::axis(a, r)),
            None => vec![],
        },
        Op::MoeRouter { .. } => keep_dims(v, |j, r| j + 1 < r),
        Op::MoeExperts { .. } => products::experts(v),
        Op::Embedding => products::embedding(v),
        Op::Reshape { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Transpose { .. }
        | Op::Expand
        | Op::Split { .. }
        | Op::Concat { .. }
        | Op::Slice
        | Op::Trilu { .. }
        | Op::Gather { .. }
        | Op::GatherNd { .. } => views::strategies(op, v),
        // Replicated only: adjoints (they run where their forward op ran),
        // lowered communication, index-data gathers and scatters, shape
        // queries and generators.
        Op::AttentionGrad { .. }
        | Op::MoeExpertsGrad { .. }
        | Op::NormGrad { .. }
        | Op::ActivationGrad { .. }
        | Op::SoftmaxGrad { .. }
        | Op::Comm { .. }
        | Op::GatherElements { .. }
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. }
        | Op::Shape { .. }
        | Op::Size
        | Op::ConstantOfShape { .. }
        | Op::Range => vec![],
    };
    for s in more {
        let duplicate = all
            .iter()
            .any(|a| a.name == s.name || (a.inputs == s.inputs && a.outputs == s.outputs));
        if !duplicate {
            all.push(s);
        }
    }
    all
}

/// Element-wise ops: every output dim `tp` divides, operands sharded where
/// they have the dim at full size and replicated where they broadcast; and
/// partial sums through each set of operands in `linear_in` (the op is
/// linear in each set together).
fn elementwise(v: &NodeView, linear_in: &[&[usize]]) -> Vec<Strategy> {
    let Some(out) = v.out() else { return vec![] };
    let mut all: Vec<Strategy> = (0..out.len())
        .filter(|&j| v.splits(out[j]))
        .map(|j| {
            let inputs = v.slots(|_, s| aligned(s, out.len(), j, out[j]));
            Strategy::new(format!("dim{j}"), inputs, v.all_out(Layout::Shard(j)), v.tp)
        })
        .collect();
    for (n, partial) in linear_in.iter().enumerate() {
        if let Some(mut s) = v.partial_through(partial) {
            if partial.len() == 1 && v.inputs.len() == 2 {
                let other = 1 - partial[0];
                s = s.grad(other, true);
            }
            if n > 0 {
                s.name = format!("partial{n}");
            }
            all.push(s);
        }
    }
    all
}

/// The operand sets a binary function is linear in.
fn linear_operands(func: BinaryOp) -> &'static [&'static [usize]] {
    match func {
        BinaryOp::Add | BinaryOp::Sub => &[&[0, 1]],
        // A partial times a replicated factor: the factor's gradient pairs
        // the replicated output gradient with the partial operand.
        BinaryOp::Mul => &[&[0], &[1]],
        BinaryOp::Div => &[&[0]],
        BinaryOp::Pow
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::Equal
        | BinaryOp::Less
        | BinaryOp::LessOrEqual
        | BinaryOp::Greater
        | BinaryOp::GreaterOrEqual => &[],
    }
}

/// Ops that need whole rows along some dims: shard any dim `keep(j, rank)`
/// allows; other inputs (scales, biases, k) replicated.
pub(super) fn keep_dims(v: &NodeView, keep: impl Fn(usize, usize) -> bool) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let rank = x.len();
    (0..rank)
        .filter(|&j| keep(j, rank) && v.splits(x[j]))
        .filter(|&j| v.outputs.iter().all(|o| o.len() == rank && o[j] == x[j]))
        .map(|j| {
            let inputs = v.slots(|i, _| {
                if i == 0 {
                    Layout::Shard(j)
                } else {
                    Layout::Replicate
                }
            });
            Strategy::new(format!("dim{j}"), inputs, v.all_out(Layout::Shard(j)), v.tp)
        })
        .collect()
}

/// `Reduce`: the reduced axes from the attribute or the constant input.
fn reduce(
    v: &NodeView,
    kind: ReduceKind,
    attr: Option<&[i64]>,
    keepdims: bool,
    noop_with_empty_axes: bool,
) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let given = match attr {
        Some(a) => Some(a),
        None if v.input(1).is_some() => match v.ints(1) {
            Some(a) => Some(a),
            None => return vec![],
        },
        None => None,
    };
    let axes: Option<Vec<usize>> = match given {
        Some(a) if !a.is_empty() => a.iter().map(|&a| axis(a, x.len())).collect(),
        _ if noop_with_empty_axes => return keep_dims(v, |_, _| true),
        _ => Some((0..x.len()).collect()),
    };
    let Some(axes) = axes else { return vec![] };
    let mut all = reduced(v, &axes, keepdims);
    if matches!(kind, ReduceKind::Sum | ReduceKind::Mean) && v.float_out {
        // Summing a sharded dim leaves each rank a partial sum.
        for &j in axes.iter().filter(|&&j| v.splits(x[j])) {
            let inputs = v.slots(|i, _| {
                if i == 0 {
                    Layout::Shard(j)
                } else {
                    Layout::Replicate
                }
            });
            all.push(Strategy::new(
                format!("reduce{j}"),
                inputs,
                v.all_out(Layout::Partial),
                v.tp,
            ));
        }
        all.extend(v.partial_through(&[0]));
    }
    all
}

/// Reductions over `axes`: shard a kept dim, mapped to its output position.
fn reduced(v: &NodeView, axes: &[usize], keepdims: bool) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    (0..x.len())
        .filter(|j| !axes.contains(j) && v.splits(x[*j]))
        .map(|j| {
            let out = if keepdims {
                j
            } else {
                j - axes.iter().filter(|&&a| a < j).count()
            };
            let inputs = v.slots(|i, _| {
                if i == 0 {
                    Layout::Shard(j)
                } else {
                    Layout::Replicate
                }
            });
            Strategy::new(format!("dim{j}"), inputs, v.all_out(Layout::Shard(out)), v.tp)
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use Layout::*;

    /// A node with all `inputs` present.
    pub(crate) fn view<'a>(inputs: &[&[usize]], outputs: &[&[usize]], tp: usize) -> NodeView<'a> {
        NodeView {
            inputs: inputs.iter().map(|s| Some(s.to_vec())).collect(),
            values: vec![None; inputs.len()],
            outputs: outputs.iter().map(|s| s.to_vec()).collect(),
            float_out: true,
            tp,
        }
    }

    pub(crate) fn find<'a>(all: &'a [Strategy], name: &str) -> &'a Strategy {
        all.iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} in {all:?}"))
    }

    pub(crate) fn names(all: &[Strategy]) -> Vec<&str> {
        all.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn gradients_travel_in_the_conjugate_layout() {
        assert_eq!(output_grad(Partial), Replicate);
        assert_eq!(output_grad(Shard(1)), Shard(1));
        assert_eq!(input_grad(Replicate, true), Partial);
        assert_eq!(input_grad(Replicate, false), Replicate);
        assert_eq!(input_grad(Partial, false), Replicate);
    }

    #[test]
    fn elementwise_broadcasts_and_passes_partial_sums_through_add() {
        let add = Op::Binary { func: BinaryOp::Add };
        let v = view(&[&[2, 16, 64], &[64]], &[&[2, 16, 64]], 2);
        let all = strategies(&add, &v);
        assert_eq!(names(&all), ["replicate", "dim0", "dim1", "dim2", "partial"]);
        assert_eq!(find(&all, "dim0").inputs, [Some(Shard(0)), Some(Replicate)]);
        assert_eq!(find(&all, "dim2").inputs, [Some(Shard(2)), Some(Shard(0))]);
        assert_eq!(find(&all, "partial").outputs, [Partial]);
        let mul = Op::Binary { func: BinaryOp::Mul };
        let all = strategies(&mul, &v);
        let p = find(&all, "partial1");
        assert_eq!((p.inputs[1], p.grad_partial[0]), (Some(Partial), true));
    }

    #[test]
    fn norms_keep_the_normalised_dims_whole() {
        let ln = Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        };
        let v = view(&[&[2, 16, 64], &[64], &[64]], &[&[2, 16, 64]], 2);
        assert_eq!(names(&strategies(&ln, &v)), ["replicate", "dim0", "dim1"]);
        let sm = Op::Softmax { axis: 1 };
        let v = view(&[&[2, 16, 64]], &[&[2, 16, 64]], 2);
        assert_eq!(names(&strategies(&sm, &v)), ["replicate", "dim0", "dim2"]);
    }

    #[test]
    fn sum_over_a_sharded_dim_is_partial() {
        let op = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: Some(vec![-2]),
            keepdims: false,
            noop_with_empty_axes: false,
        };
        let v = view(&[&[32, 2, 128]], &[&[32, 128]], 2);
        let all = strategies(&op, &v);
        assert_eq!(names(&all), ["replicate", "dim0", "dim2", "reduce1", "partial"]);
        assert_eq!(find(&all, "dim2").outputs, [Shard(1)]);
        assert_eq!(find(&all, "reduce1").outputs, [Partial]);
    }
}

//! Sharding rules: the ways each op can run on one mesh axis of `tp` ranks.
//!
//! They are declared once, beside the ops: each family's folder holds its
//! rules in `shard.rs`, and the op table routes every op to its family's
//! (`define.rs`). This module holds what they share (the types, the view of
//! a node they read, common layouts) and the entry points the cost model,
//! the planner's intra-op search and lowering all call, so the three cannot
//! disagree about what a strategy reads and writes.
//!
//! A [`Strategy`] names the layout each input must arrive in, the layout of
//! each output, how many ways the op's work is divided, and which replicated
//! inputs get a partial-sum gradient (so the backward pass must reduce it).
//! Every op can run replicated, so every node has at least one strategy and
//! a search over them is always feasible; a dim is only sharded when `tp`
//! divides it.

use super::Op;
use crate::{Bindings, Graph, NodeIndex, TensorId, Value};

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

/// The comm ops, in order, that move a tensor laid out as `from` into
/// `to` over the axis's ranks, each with the dim it works along (their
/// conjugates, [`super::CommKind::conjugate`], move the gradient back):
/// lowering inserts them and the cost model prices them. `None` where no
/// comm op makes the move (a whole tensor or a block into a pending sum).
pub fn moves(from: Layout, to: Layout) -> Option<Vec<(super::CommKind, usize)>> {
    use super::CommKind::{AllGather, AllReduce, ReduceScatter, Slice};
    Some(match (from, to) {
        _ if from == to => vec![],
        (Layout::Replicate, Layout::Shard(d)) => vec![(Slice, d)],
        (Layout::Shard(a), Layout::Replicate) => vec![(AllGather, a)],
        (Layout::Shard(a), Layout::Shard(b)) => vec![(AllGather, a), (Slice, b)],
        (Layout::Partial, Layout::Replicate) => vec![(AllReduce, 0)],
        (Layout::Partial, Layout::Shard(d)) => vec![(ReduceScatter, d)],
        (Layout::Replicate | Layout::Shard(_) | Layout::Partial, Layout::Partial) => return None,
        (Layout::Replicate, Layout::Replicate) => vec![],
    })
}

/// The comm ops that bring a tensor laid out as `from` to a reader that
/// reads it as `to`; `shares`: the reader divides its work over the ranks
/// while reading the tensor whole, so its gradient is a share on each rank
/// (column-parallel's input). Those shares are summed backward: a gather
/// becomes one [`GatherForCompute`](super::CommKind::GatherForCompute)
/// (backward: reduce-scatter, sequence parallelism's gather), and a whole
/// tensor is read through a `Copy` (backward: all-reduce). The gradient
/// layouts the planner's program prices ([`input_grad`] moved back into
/// [`output_grad`]) are these conjugates; lowering emits these ops and the
/// cost model prices them.
pub fn read_moves(from: Layout, to: Layout, shares: bool) -> Option<Vec<(super::CommKind, usize)>> {
    use super::CommKind::{AllGather, Copy, GatherForCompute};
    let mut steps = moves(from, to)?;
    if shares && to == Layout::Replicate {
        match steps.last_mut() {
            Some((kind @ AllGather, _)) => *kind = GatherForCompute,
            _ => steps.push((Copy, 0)),
        }
    }
    Some(steps)
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
    pub(crate) fn new(
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
    pub(crate) fn grad(mut self, slot: usize, partial: bool) -> Strategy {
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
    pub(crate) fn input(&self, i: usize) -> Option<&[usize]> {
        self.inputs.get(i).and_then(|s| s.as_deref())
    }

    /// Shape of the first output.
    pub(crate) fn out(&self) -> Option<&[usize]> {
        self.outputs.first().map(Vec::as_slice)
    }

    /// True when `tp` ranks can each take an equal block of a dim of size `n`.
    pub(crate) fn splits(&self, n: usize) -> bool {
        n > 0 && n % self.tp == 0
    }

    /// One layout per input slot from `f(slot, shape)`; absent inputs stay `None`.
    pub(crate) fn slots(&self, f: impl Fn(usize, &[usize]) -> Layout) -> Vec<Option<Layout>> {
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, s)| s.as_deref().map(|s| f(i, s)))
            .collect()
    }

    /// Input 0 sharded on `dim`, the other inputs (weights, scales, shapes,
    /// axes) replicated.
    pub(crate) fn first_sharded(&self, dim: usize) -> Vec<Option<Layout>> {
        self.slots(|i, _| {
            if i == 0 {
                Layout::Shard(dim)
            } else {
                Layout::Replicate
            }
        })
    }

    /// Every output in `layout`.
    pub(crate) fn all_out(&self, layout: Layout) -> Vec<Layout> {
        vec![layout; self.outputs.len()]
    }

    /// Input `slot`'s integer constant value, if known.
    pub(crate) fn ints(&self, slot: usize) -> Option<&[i64]> {
        self.values.get(slot).copied().flatten().and_then(Value::as_i64)
    }

    /// Partial sums pass through when the inputs in `partial` are partial
    /// and the rest replicated: the op is linear in those inputs.
    pub(crate) fn partial_through(&self, partial: &[usize]) -> Option<Strategy> {
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

/// A node whose shapes still hold a symbol, so no rule can size its blocks.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("node '{node}': tensor '{tensor}' has shape {shape} with an unbound symbol (bind it)")]
pub struct UnboundDims {
    pub node: String,
    pub tensor: String,
    pub shape: String,
}

/// Resolved dims of tensor `t`, read or written by `node`.
pub fn resolved_dims(
    graph: &Graph,
    bindings: &Bindings,
    node: NodeIndex,
    t: TensorId,
) -> Result<Vec<usize>, UnboundDims> {
    let tensor = graph.tensor(t);
    tensor.ty.shape.resolve(bindings).ok_or_else(|| UnboundDims {
        node: graph.node(node).name.clone(),
        tensor: tensor.name.clone(),
        shape: tensor.ty.shape.to_string(),
    })
}

/// What the rules see of node `idx` of `graph` on `tp` ranks.
pub fn node_view<'g>(
    graph: &'g Graph,
    bindings: &Bindings,
    idx: NodeIndex,
    tp: usize,
) -> Result<NodeView<'g>, UnboundDims> {
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

/// The candidate strategies of `op`, `replicate` first, then its family's
/// rules (`<family>/shard.rs`) without repeats. With `tp == 1` replication
/// is the only one.
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
    for s in op.family_strategies(v) {
        let duplicate = all
            .iter()
            .any(|a| a.name == s.name || (a.inputs == s.inputs && a.outputs == s.outputs));
        if !duplicate {
            all.push(s);
        }
    }
    all
}

/// The strategy called `name` among `op`'s on `v` (a plan names the
/// strategy each node runs).
pub fn strategy_named(op: &Op, v: &NodeView, name: &str) -> Option<Strategy> {
    strategies(op, v).into_iter().find(|s| s.name == name)
}

/// Normalises a possibly negative axis; `None` when out of range.
pub(crate) fn axis(a: i64, rank: usize) -> Option<usize> {
    let a = if a < 0 { a + rank as i64 } else { a };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

/// Layout of an operand broadcast against an output of rank `out_rank`
/// when the output is sharded on `out_dim` (of size `size`): sharded on the
/// aligned dim if the operand has it at full size, else replicated.
pub(crate) fn aligned(shape: &[usize], out_rank: usize, out_dim: usize, size: usize) -> Layout {
    match (out_dim + shape.len()).checked_sub(out_rank) {
        Some(i) if shape.get(i) == Some(&size) => Layout::Shard(i),
        _ => Layout::Replicate,
    }
}

/// Name of a split along a data dim of a product: `batch` for the outermost.
pub(crate) fn data_name(dim: usize) -> String {
    if dim == 0 {
        "batch".into()
    } else {
        format!("dim{dim}")
    }
}

/// Ops that need whole rows along some dims: shard any dim `keep(j, rank)`
/// allows; other inputs (scales, biases, k) replicated.
pub(crate) fn keep_dims(v: &NodeView, keep: impl Fn(usize, usize) -> bool) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let rank = x.len();
    (0..rank)
        .filter(|&j| keep(j, rank) && v.splits(x[j]))
        .filter(|&j| v.outputs.iter().all(|o| o.len() == rank && o[j] == x[j]))
        .map(|j| moved(v, j, j))
        .collect()
}

/// Input 0 sharded on `input_dim`, the other inputs replicated, every
/// output sharded on `output_dim`: movement and indexing ops map a sharded
/// dim through to the output dim that holds the same elements in the same
/// blocks.
pub(crate) fn moved(v: &NodeView, input_dim: usize, output_dim: usize) -> Strategy {
    Strategy::new(
        format!("dim{output_dim}"),
        v.first_sharded(input_dim),
        v.all_out(Layout::Shard(output_dim)),
        v.tp,
    )
}

#[cfg(test)]
mod tests {
    use super::super::testing::{find, layouts, names, view};
    use super::*;
    use Layout::*;

    #[test]
    fn gradients_travel_in_the_conjugate_layout() {
        assert_eq!(output_grad(Partial), Replicate);
        assert_eq!(output_grad(Shard(1)), Shard(1));
        assert_eq!(input_grad(Replicate, true), Partial);
        assert_eq!(input_grad(Replicate, false), Replicate);
        assert_eq!(input_grad(Partial, false), Replicate);
    }

    #[test]
    fn embedding_and_experts() {
        let v = view(&[&[100, 64], &[2, 16]], &[&[2, 16, 64]], 2);
        let all = strategies(&Op::Embedding, &v);
        assert_eq!(names(&all), ["replicate", "vocab", "hidden", "batch", "dim1"]);
        assert_eq!(find(&all, "hidden").outputs, [Shard(2)]);
        let x: &[usize] = &[2, 16, 64];
        let v = view(
            &[
                x,
                &[2, 16, 2],
                &[2, 16, 2],
                &[8, 64, 128],
                &[8, 128, 64],
                &[8, 64, 128],
            ],
            &[x],
            4,
        );
        let op = Op::MoeExperts {
            activation: crate::Activation::Silu,
            sources: 1,
        };
        let all = strategies(&op, &v);
        assert_eq!(names(&all), ["replicate", "expert", "ffn", "dim1"]);
        assert_eq!(find(&all, "ffn").inputs[4], Some(Shard(1)));
        assert_eq!(find(&all, "dim1").inputs[1], Some(Shard(1)));
    }

    /// A reader whose gradient is a share sums those shares backward: a
    /// sequence gather's conjugate becomes a reduce-scatter (the gradient
    /// layouts the planner's program prices: a share moved back into the
    /// slice), and a whole tensor is read through a copy (all-reduce).
    #[test]
    fn reads_by_divided_work_sum_their_gradient_shares() {
        use crate::CommKind::{AllGather, AllReduce, Copy, GatherForCompute, ReduceScatter, Slice};
        assert_eq!(
            read_moves(Shard(1), Replicate, true),
            Some(vec![(GatherForCompute, 1)])
        );
        assert_eq!(read_moves(Shard(1), Replicate, false), Some(vec![(AllGather, 1)]));
        assert_eq!(read_moves(Replicate, Replicate, true), Some(vec![(Copy, 0)]));
        assert_eq!(
            read_moves(Partial, Replicate, true),
            Some(vec![(AllReduce, 0), (Copy, 0)])
        );
        assert_eq!(read_moves(Replicate, Shard(2), true), Some(vec![(Slice, 2)]));
        assert_eq!(read_moves(Replicate, Partial, true), None);
        let back: Vec<_> = read_moves(Shard(1), Replicate, true)
            .unwrap()
            .iter()
            .map(|(k, _)| k.conjugate())
            .collect();
        assert_eq!(back, [ReduceScatter]);
        assert_eq!(
            moves(input_grad(Replicate, true), output_grad(Shard(1))),
            Some(vec![(ReduceScatter, 1)])
        );
    }

    #[test]
    fn transpose_permutes_and_split_keeps_the_fused_axis() {
        let v = view(&[&[2, 16, 4, 32]], &[&[2, 4, 16, 32]], 4);
        let t = Op::Transpose {
            perm: Some(vec![0, 2, 1, 3]),
        };
        let all = strategies(&t, &v);
        assert!(layouts(&all).contains(&("dim1", Some(Shard(2)), Shard(1))));
        let piece: &[usize] = &[2, 16, 128];
        let v = view(&[&[2, 16, 384]], &[piece; 3], 4);
        let s = Op::Split {
            axis: -1,
            split: None,
            outputs: 3,
        };
        let all = strategies(&s, &v);
        let fused = all.iter().find(|s| s.name == "dim2").unwrap();
        assert_eq!(fused.outputs, [Shard(2); 3]);
    }
}

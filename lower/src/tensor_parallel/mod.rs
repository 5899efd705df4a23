//! Tensor parallelism as a graph rewrite: the model's forward graph becomes
//! the graph one rank of a tensor-parallel group runs, with sliced weights
//! and [`Op::Comm`] nodes where layouts change. Autodiff then derives the
//! backward communication from each comm op's conjugate, so forward and
//! backward stay consistent by construction.
//!
//! Layouts are propagated op by op with Megatron-LM's rules, the ones the
//! cost model prices (`autopar_cost_models::workload::layout`): a linear
//! layer on a replicated input is split by output columns (its input is
//! copied in, so the input's gradient is all-reduced); on a column-split
//! input it is split by input rows and its output all-reduced — or, under
//! sequence parallelism, reduce-scattered along the sequence, so norms and
//! residuals run on sequence slices and the next column split gathers them.
//! Attention runs on the heads its inputs carry; reshapes and transposes
//! move the split dim; row-wise ops keep it; anything else gathers. A column
//! split feeding an equal `Split` (a fused QKV projection) is cut per block,
//! so every rank gets matching query, key and value heads.
//!
//! The two ends are vocabulary-parallel ([`vocab`]): an embedding table is
//! stored as each rank's vocabulary rows and its output is a pending sum,
//! reduced (all-reduce, or reduce-scatter along the sequence) where a
//! non-linear op first reads it; the loss runs on the head's
//! vocabulary-split logits without gathering them.
//!
//! Files: this one holds the walk and the shared rules; [`linear`] the
//! column and row splits, [`heads`] attention and the ops that move a split
//! dim, [`vocab`] the vocabulary-parallel ends, [`context`] context
//! parallelism's own rules.

mod context;
mod heads;
mod linear;
mod planned;
mod vocab;

use autopar_ir::op::sharding::Layout as Rule;
use autopar_ir::{CommGroup, CommKind, Graph, NodeIndex, Op, Role, Shape, TensorId};
use autopar_planner::sharding::{ShardingError, Strategy as Planned};
use autopar_planner::spec::OpSharding;
use std::collections::{BTreeMap, HashMap, HashSet};

/// How a stored weight is cut: dim `axis` into `parts` slices, or, with
/// `blocks > 1`, each of `blocks` equal blocks along `axis` into slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WeightSlice {
    pub axis: usize,
    pub blocks: usize,
}

/// The per-rank graph and how its stored weights relate to the model's.
#[derive(Debug, Clone)]
pub struct TensorParallel {
    pub graph: Graph,
    pub parts: usize,
    /// Weights stored as slices, by name (the others are stored whole).
    pub slices: BTreeMap<String, WeightSlice>,
}

/// Why a graph cannot be split.
#[derive(Debug, thiserror::Error)]
pub enum TpError {
    #[error("tensor '{0}' has a symbolic shape; bind batch and sequence first")]
    Unbound(String),
    #[error("node '{node}': {message}")]
    Node { node: String, message: String },
    #[error(transparent)]
    Plan(#[from] ShardingError),
    #[error(transparent)]
    Graph(#[from] autopar_ir::GraphError),
}

/// Where an activation lives across the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Layout {
    Replicated,
    /// Each rank holds `1/parts` of dim `axis` (of each block when `blocks > 1`).
    Split {
        axis: usize,
        blocks: usize,
    },
    /// Each rank holds a share of a sum (a vocabulary-parallel embedding's
    /// rows); see [`Rewriter::reduced`].
    Partial,
}

const WHOLE: usize = 1;

/// The graph one rank of a `parts`-way tensor-parallel group runs
/// (sequence-parallel between the split regions when `sp`). Dims must be bound.
pub fn shard(model: &Graph, parts: usize, sp: bool) -> Result<TensorParallel, TpError> {
    rewrite(model, parts, sp, None, None)
}

/// The graph one rank of a `parts`-way tensor-parallel group runs when
/// the nodes `plan` covers run the per-op sharding it names (a plan's
/// `sharding`); the nodes it does not cover (the loss lowering adds)
/// follow their inputs' layouts as in [`shard`] (`sp`: pending sums they
/// read are reduce-scattered along the sequence). The parameters named in
/// `whole` (the two copies of a tied weight its readers read differently,
/// whose gradients are summed element by element) are stored whole, each
/// use slicing what it reads.
pub fn shard_planned(
    model: &Graph,
    parts: usize,
    sp: bool,
    plan: &[OpSharding],
    whole: &[String],
) -> Result<TensorParallel, TpError> {
    rewrite(model, parts, sp, None, Some((plan, whole)))
}

/// The training graph one rank of a `parts`-way context-parallel group
/// runs: the inputs named in `per_token` are cut along the sequence (their
/// dim 1) into `2·parts` chunks, rank `r` keeping chunks `r` and
/// `2·parts − 1 − r` (so causal attention costs every rank alike), every
/// token-wise op runs on the rank's tokens, attention gathers the keys and
/// values of the whole sequence in order (their gradients are
/// reduce-scattered back) and runs the rank's queries at their positions,
/// and sums over the sequence (the loss) are all-reduced. Weights stay whole: their
/// gradients are summed over the context-parallel ranks with the
/// data-parallel ones.
pub fn shard_context(graph: &Graph, parts: usize, per_token: &[String]) -> Result<Graph, TpError> {
    Ok(rewrite(graph, parts, false, Some(per_token), None)?.graph)
}

fn rewrite(
    model: &Graph,
    parts: usize,
    sp: bool,
    per_token: Option<&[String]>,
    plan: Option<(&[OpSharding], &[String])>,
) -> Result<TensorParallel, TpError> {
    let mut src = model.clone();
    bind(&mut src)?;
    let (plan, stored_whole, boundaries) = match plan {
        Some((plan, whole)) => (
            planned::resolve(&src, parts, plan)?,
            whole.iter().cloned().collect(),
            Some(planned::Boundaries::new(&src)?),
        ),
        None => (HashMap::new(), HashSet::new(), None),
    };
    let mut g = Graph::new(src.name.clone());
    g.bindings = src.bindings.clone();
    g.blocks = src.blocks.clone();
    let block_of: HashMap<String, usize> = src
        .blocks
        .iter()
        .enumerate()
        .flat_map(|(b, block)| block.nodes.iter().map(move |n| (n.clone(), b)))
        .collect();
    let mut r = Rewriter {
        src: &src,
        g,
        parts,
        sp,
        context: per_token.is_some(),
        sequence: context::sequence(&src, per_token)?,
        balanced: context::Orders::default(),
        map: HashMap::new(),
        layouts: HashMap::new(),
        slices: BTreeMap::new(),
        cache: HashMap::new(),
        plan,
        stored_whole,
        boundaries,
        pending: HashMap::new(),
        block: None,
        count: 0,
    };
    for &input in &src.inputs {
        let t = r.tensor(input);
        r.g.inputs.push(t);
        r.layouts.insert(t, Layout::Replicated);
        let name = &src.tensor(input).name;
        if per_token.is_some_and(|names| names.contains(name)) {
            let sliced = r.comm(
                t,
                CommKind::Slice,
                1,
                Layout::Split {
                    axis: 1,
                    blocks: WHOLE,
                },
            )?;
            r.map.insert(input, sliced);
        }
    }
    for idx in src.topo_order()? {
        r.block = block_of.get(&src.node(idx).name).copied();
        r.node(idx)?;
    }
    r.block = None;
    for &out in &src.outputs {
        let t = r.map[&out];
        let whole = r.replicated(t, "outputs")?;
        r.g.outputs.push(whole);
    }
    r.g.validate()?;
    Ok(TensorParallel {
        graph: r.g,
        parts,
        slices: r.slices,
    })
}

struct Rewriter<'a> {
    src: &'a Graph,
    g: Graph,
    parts: usize,
    sp: bool,
    /// Splitting sequences (context parallelism) instead of weights.
    context: bool,
    /// Under context parallelism: the sequence length, and the balanced
    /// order's constants by length and the rank's positions by (length, layer).
    sequence: usize,
    balanced: context::Orders,
    /// Source tensor → rewritten tensor.
    map: HashMap<TensorId, TensorId>,
    /// Layouts of activations; weights and constants have none.
    layouts: HashMap<TensorId, Layout>,
    slices: BTreeMap<String, WeightSlice>,
    /// One comm node per (tensor, kind, axis), shared by all consumers.
    cache: HashMap<(TensorId, CommKind, usize), TensorId>,
    /// The plan's strategy per node it covers, by node name.
    plan: HashMap<String, Planned>,
    /// Parameters stored whole whatever their uses read.
    stored_whole: HashSet<String>,
    /// Under a plan: where the layer boundaries are.
    boundaries: Option<planned::Boundaries>,
    /// Pending sums with an addend still to add after their reduction (a
    /// row-parallel product's bias), by the sum.
    pending: HashMap<TensorId, TensorId>,
    /// The layer of the node being rewritten: nodes added for it join it.
    block: Option<usize>,
    count: usize,
}

impl Rewriter<'_> {
    /// The rewritten tensor of a source tensor (copying leaves on first use).
    fn tensor(&mut self, t: TensorId) -> TensorId {
        if let Some(&n) = self.map.get(&t) {
            return n;
        }
        let s = self.src.tensor(t);
        let n = self
            .g
            .add_tensor(s.name.clone(), s.ty.clone(), s.role, s.data.clone());
        self.map.insert(t, n);
        n
    }

    fn dims(&self, t: TensorId) -> Vec<usize> {
        fixed_dims(&self.g, t)
    }

    fn layout(&self, t: TensorId) -> Option<Layout> {
        self.layouts.get(&t).copied()
    }

    fn err(&self, at: &str, message: impl Into<String>) -> TpError {
        TpError::Node {
            node: at.into(),
            message: message.into(),
        }
    }

    /// Adds `op` on `inputs` with outputs typed by inference; the node
    /// joins the current layer.
    fn add(
        &mut self,
        name: String,
        op: Op,
        inputs: Vec<Option<TensorId>>,
        out_names: &[String],
    ) -> Result<Vec<TensorId>, TpError> {
        let types = {
            let infer: Vec<Option<autopar_ir::InferInput>> = inputs
                .iter()
                .map(|t| {
                    t.map(|t| autopar_ir::InferInput {
                        ty: &self.g.tensor(t).ty,
                        value: self.g.tensor(t).data.as_deref(),
                    })
                })
                .collect();
            op.infer(&infer).map_err(|e| self.err(&name, e.to_string()))?
        };
        let outs: Vec<TensorId> = types
            .into_iter()
            .zip(out_names)
            .map(|(ty, n)| self.g.add_tensor(n.clone(), ty, Role::Activation, None))
            .collect();
        self.g.add_node(name.clone(), op, inputs, outs.clone())?;
        if let Some(b) = self.block {
            self.g.blocks[b].nodes.push(name);
        }
        Ok(outs)
    }

    /// The prefix of the names this rewrite gives its own nodes and
    /// constants: context parallelism rewrites a tensor-parallel graph
    /// again, so the two must not collide.
    fn prefix(&self) -> &'static str {
        if self.context {
            "cp"
        } else {
            "tp"
        }
    }

    /// A new node of our own on `inputs`, one output.
    fn helper(&mut self, what: &str, op: Op, inputs: Vec<Option<TensorId>>) -> Result<TensorId, TpError> {
        self.count += 1;
        let name = format!("{}/{what}{}", self.prefix(), self.count);
        Ok(self.add(name.clone(), op, inputs, &[name])?[0])
    }

    /// `x` through a comm node (one per tensor, kind and axis).
    fn comm(&mut self, x: TensorId, kind: CommKind, axis: usize, out: Layout) -> Result<TensorId, TpError> {
        if let Some(&y) = self.cache.get(&(x, kind, axis)) {
            return Ok(y);
        }
        if self.context && !matches!(kind, CommKind::AllReduce | CommKind::Copy) {
            let y = self.balanced_comm(x, kind, axis)?;
            self.layouts.insert(y, out);
            self.cache.insert((x, kind, axis), y);
            return Ok(y);
        }
        let op = Op::Comm {
            kind,
            axis: axis as i64,
            parts: self.parts,
            group: if self.context {
                CommGroup::Context
            } else {
                CommGroup::Tensor
            },
        };
        let what = format!("{kind:?}").to_lowercase();
        let y = self.helper(&what, op, vec![Some(x)])?;
        self.layouts.insert(y, out);
        self.cache.insert((x, kind, axis), y);
        Ok(y)
    }

    /// `x` whole on every rank.
    fn replicated(&mut self, x: TensorId, at: &str) -> Result<TensorId, TpError> {
        match self.layout(x) {
            Some(Layout::Split { axis, blocks: WHOLE }) => {
                self.moved(x, Rule::Shard(axis), Rule::Replicate, false, at)
            }
            Some(Layout::Split { .. }) => {
                Err(self.err(at, "gathering a block-split tensor is not supported"))
            }
            Some(Layout::Partial) => self.moved(x, Rule::Partial, Rule::Replicate, false, at),
            Some(Layout::Replicated) | None => Ok(x),
        }
    }

    /// `x` as the input of a split computation: float tensors that are
    /// whole on every rank (activations and weights) are copied in, so their
    /// gradient — a share on each rank — is all-reduced.
    fn copied_in(&mut self, x: TensorId) -> Result<TensorId, TpError> {
        if self.context {
            // Weight gradients are summed over context ranks with the data-parallel reduction.
            return Ok(x);
        }
        let t = self.g.tensor(x);
        let whole = self.layout(x).is_none_or(|l| l == Layout::Replicated);
        if whole && t.ty.dtype.is_float() && t.role != Role::Constant {
            return self.comm(x, CommKind::Copy, 0, Layout::Replicated);
        }
        Ok(x)
    }

    /// Copies source node `idx` with `inputs` and `op`, mapping its outputs
    /// with `layout`.
    fn emit(
        &mut self,
        idx: NodeIndex,
        op: Op,
        inputs: Vec<Option<TensorId>>,
        layout: Option<Layout>,
    ) -> Result<Vec<TensorId>, TpError> {
        let n = self.src.node(idx);
        let names: Vec<String> = n
            .outputs
            .iter()
            .map(|&o| self.src.tensor(o).name.clone())
            .collect();
        let outs = self.add(n.name.clone(), op, inputs, &names)?;
        for (&o, &new) in n.outputs.iter().zip(&outs) {
            self.map.insert(o, new);
            if let Some(l) = layout {
                self.layouts.insert(new, l);
            }
        }
        Ok(outs)
    }

    /// Runs the node on whole tensors.
    fn whole(&mut self, idx: NodeIndex, ins: Vec<Option<TensorId>>) -> Result<(), TpError> {
        let name = self.src.node(idx).name.clone();
        let ins = ins
            .into_iter()
            .map(|t| t.map(|t| self.replicated(t, &name)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        self.emit(idx, self.src.node(idx).op.clone(), ins, Some(Layout::Replicated))?;
        Ok(())
    }

    fn node(&mut self, idx: NodeIndex) -> Result<(), TpError> {
        let n = self.src.node(idx).clone();
        let mut ins: Vec<Option<TensorId>> = n.inputs.iter().map(|t| t.map(|t| self.tensor(t))).collect();
        if let Some(s) = self.plan.get(&n.name).cloned() {
            return self.planned(idx, ins, &s);
        }
        if !self.context {
            if self.settle_partials(idx, &mut ins)? {
                return Ok(());
            }
            if let Some(done) = self.vocab_node(idx, &ins)? {
                return Ok(done);
            }
        }
        let acts: Vec<(usize, Layout)> = ins
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.and_then(|t| self.layout(t)).map(|l| (i, l)))
            .collect();
        if acts.is_empty() {
            // Weights and constants computed from weights: unchanged.
            self.emit(idx, n.op.clone(), ins, None)?;
            return Ok(());
        }
        let first = acts[0].1;
        let splits: Vec<Layout> = acts
            .iter()
            .map(|&(_, l)| l)
            .filter(|&l| l != Layout::Replicated)
            .collect();
        let one_split = splits
            .first()
            .copied()
            .filter(|&l| splits.iter().all(|&m| m == l));
        if self.context {
            if let Some(done) = self.context_node(idx, &ins, first)? {
                return Ok(done);
            }
        }
        match &n.op {
            // Context parallelism never splits a weight.
            Op::Linear if self.layout_of_slot(&ins, 1).is_none() && !self.context => self.linear(idx, ins),
            Op::Attention { .. } => self.attention(idx, ins),
            Op::Reshape { allowzero } if acts.len() == 1 => self.reshape(idx, ins, *allowzero, first),
            Op::Transpose { perm } => self.transpose(idx, ins, perm.as_deref(), first),
            Op::Split { axis, outputs, .. } if acts.len() == 1 => {
                self.split(idx, ins, *axis, *outputs, first)
            }
            Op::Slice if acts.len() == 1 => self.slice(idx, ins, first),
            Op::Concat { axis } => self.concat(idx, ins, *axis),
            Op::Unsqueeze { .. } if acts.len() == 1 => self.unsqueeze(idx, ins, first),
            Op::Expand if acts.len() == 1 => self.expand(idx, ins, first),
            Op::Unary { .. } | Op::Gelu { .. } | Op::Silu | Op::Cast { .. } if acts.len() == 1 => {
                self.emit(idx, n.op.clone(), ins, Some(first))?;
                Ok(())
            }
            Op::Binary { .. } | Op::Where if one_split.is_some() => {
                self.broadcast_split(idx, ins, one_split.expect("checked"))
            }
            Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } if acts.len() == 1 => {
                self.row_norm(idx, ins, *axis, first)
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => self.softmax(idx, ins, *axis, first),
            // Named one by one so a new op must choose its rule here.
            Op::Linear
            | Op::Reshape { .. }
            | Op::Split { .. }
            | Op::Slice
            | Op::Unsqueeze { .. }
            | Op::Expand
            | Op::Unary { .. }
            | Op::Gelu { .. }
            | Op::Silu
            | Op::Cast { .. }
            | Op::Binary { .. }
            | Op::Where
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Clip
            | Op::MatMul
            | Op::Gemm { .. }
            | Op::RotaryEmbedding { .. }
            | Op::MoeRouter { .. }
            | Op::MoeExperts { .. }
            | Op::AttentionGrad { .. }
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
            | Op::Squeeze { .. }
            | Op::Flatten { .. }
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
            | Op::Conv { .. }
            | Op::ConvTranspose { .. }
            | Op::Pool { .. }
            | Op::ConvGrad { .. }
            | Op::PoolGrad { .. }
            | Op::Range => self.whole(idx, ins),
        }
    }

    fn layout_of_slot(&self, ins: &[Option<TensorId>], slot: usize) -> Option<Layout> {
        ins.get(slot).copied().flatten().and_then(|t| self.layout(t))
    }

    /// Dims of a source tensor (bound).
    fn source_dims(&self, t: TensorId) -> Vec<usize> {
        fixed_dims(self.src, t)
    }

    /// An elementwise op on activations split alike: whole operands must
    /// broadcast along the split dim (else they are sliced).
    fn broadcast_split(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        split: Layout,
    ) -> Result<(), TpError> {
        let Layout::Split { axis, blocks } = split else {
            return self.whole(idx, ins);
        };
        let out_rank = self.src.tensor(self.src.node(idx).outputs[0]).ty.shape.rank();
        let mut new = Vec::with_capacity(ins.len());
        for &t in &ins {
            let Some(t) = t else {
                new.push(None);
                continue;
            };
            if self.layout(t) == Some(split) {
                new.push(Some(t));
                continue;
            }
            let d = self.dims(t);
            let aligned = (axis + d.len()).checked_sub(out_rank);
            let broadcasts = aligned.is_none_or(|i| d[i] == 1);
            if broadcasts {
                new.push(Some(self.copied_in(t)?));
            } else if blocks == WHOLE && self.layout(t).is_none_or(|l| l == Layout::Replicated) {
                let i = aligned.expect("checked");
                new.push(Some(self.comm(
                    t,
                    CommKind::Slice,
                    i,
                    Layout::Split { axis: i, blocks },
                )?));
            } else {
                return self.whole(idx, ins);
            }
        }
        self.emit(idx, self.src.node(idx).op.clone(), new, Some(split))?;
        Ok(())
    }
}

/// The dims of `t` in `g`, whose shapes are bound.
fn fixed_dims(g: &Graph, t: TensorId) -> Vec<usize> {
    g.tensor(t)
        .ty
        .shape
        .0
        .iter()
        .map(|d| d.fixed().unwrap_or(0))
        .collect()
}

/// Replaces every symbolic dim of `g` with its bound value: the rewrites
/// split concrete dims.
pub(super) fn bind(g: &mut Graph) -> Result<(), TpError> {
    let ids: Vec<TensorId> = g.tensors().map(|(id, _)| id).collect();
    for id in ids {
        let t = g.tensor(id);
        let dims =
            t.ty.shape
                .resolve(&g.bindings)
                .ok_or_else(|| TpError::Unbound(t.name.clone()))?;
        g.tensor_mut(id).ty.shape = Shape::fixed(&dims);
    }
    Ok(())
}

fn norm(axis: i64, rank: usize) -> usize {
    if axis < 0 {
        (axis + rank as i64).max(0) as usize
    } else {
        axis as usize
    }
}

/// The output dim a reshape carries split input dim `a` to: the one that
/// starts at the same element offset, when both divide into `parts`.
fn reshape_axis(input: &[usize], a: usize, output: &[usize], parts: usize) -> Option<usize> {
    let before: usize = input[..a].iter().product();
    let mut prefix = 1;
    for (j, &d) in output.iter().enumerate() {
        if prefix == before && d > 1 {
            return (d % parts == 0 && input[a] % parts == 0).then_some(j);
        }
        prefix *= d;
        if prefix > before {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_carries_the_split_dim() {
        // [b, s, h] split on h → [b, s, heads, dim]: split on heads.
        assert_eq!(reshape_axis(&[2, 8, 32], 2, &[2, 8, 4, 8], 2), Some(2));
        // And back.
        assert_eq!(reshape_axis(&[2, 8, 4, 8], 2, &[2, 8, 32], 2), Some(2));
        // Flattening batch and sequence keeps a split hidden dim last.
        assert_eq!(reshape_axis(&[2, 8, 32], 2, &[16, 32], 2), Some(1));
        // Heads that do not divide: no.
        assert_eq!(reshape_axis(&[2, 8, 3, 8], 2, &[2, 8, 24], 2), None);
    }
}

#[cfg(test)]
mod layer_tests;

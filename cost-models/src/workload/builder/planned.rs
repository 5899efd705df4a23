//! Pricing a plan's per-op sharding: each node the plan covers runs the
//! strategy the plan names, from the sharding rules declared beside the ops
//! ([`autopar_ir::op::sharding`]) that the planner's program chose among
//! and lowering executes. A tensor is moved into the layout each reader
//! reads it in, and into the boundary layout where it crosses from one part
//! to another ([`autopar_ir::layers`]), with the collectives lowering
//! inserts for those moves: a slice (whose gradient is all-gathered), an
//! all-gather, an all-reduce, a reduce-scatter (whose gradient is
//! all-gathered); an input whose gradient the strategy leaves as shares is
//! copied in (its gradient all-reduced). Weights are stored sliced when
//! read by their one reader; otherwise each sharded read slices them.

use super::{tensor_comm, Builder};
use crate::comm::{of_comm, Collective};
use crate::workload::layout::{Decision, Layout};
use crate::workload::CommWork;
use crate::workload::{Layered, Place, WorkloadError};
use autopar_ir::layers;
use autopar_ir::op::sharding::{self, Layout as Rule, Strategy};
use autopar_ir::{Bindings, NodeIndex, Op, Role, TensorId};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A plan's per-op sharding resolved against the walked nodes, and the
/// layouts the program gives their tensors.
pub(in crate::workload) struct Planned {
    by_node: HashMap<NodeIndex, Strategy>,
    /// Layout of each tensor as the program lays it out (`None`: a weight
    /// as stored, or a tensor not yet produced).
    rules: Vec<Option<Rule>>,
    parts: HashMap<NodeIndex, usize>,
    streams: Vec<bool>,
    /// Per tensor: carries a gradient back.
    grads: Vec<bool>,
    /// Moves already priced: (tensor, layout it was moved into).
    moved: HashSet<(TensorId, Rule, bool)>,
    /// Copies already priced: (tensor, layout it was copied in as).
    copied: HashSet<(TensorId, Rule)>,
    /// Weight slices already priced: (weight, layout, reader's part), as a
    /// tied weight's copies before and after the layers slice apart.
    sliced: HashSet<(TensorId, Rule, usize)>,
    /// Row-parallel sums whose bias is added after their reduction.
    pending_bias: HashMap<TensorId, TensorId>,
}

impl Planned {
    /// `names`: node name → strategy name (a plan's `sharding`); a node of
    /// a later layer takes the strategy of its place in the first.
    pub(in crate::workload) fn new(
        l: &Layered,
        bindings: &Bindings,
        tp: usize,
        names: &BTreeMap<String, String>,
    ) -> Result<Planned, WorkloadError> {
        let graph = l.graph;
        let first: HashMap<usize, &str> = graph
            .blocks
            .first()
            .map(|b| b.nodes.iter().enumerate().map(|(i, n)| (i, n.as_str())).collect())
            .unwrap_or_default();
        let place_in_layer: HashMap<&str, usize> = graph
            .blocks
            .iter()
            .flat_map(|b| b.nodes.iter().enumerate().map(|(i, n)| (n.as_str(), i)))
            .collect();
        let mut by_node = HashMap::new();
        for &idx in &l.order {
            let name = graph.node(idx).name.as_str();
            let entry = names.get(name).or_else(|| {
                let i = place_in_layer.get(name)?;
                names.get(*first.get(i)?)
            });
            let Some(strategy) = entry else { continue };
            let fail = |message: String| WorkloadError::Plan {
                node: name.to_string(),
                message,
            };
            let view = sharding::node_view(graph, bindings, idx, tp).map_err(|e| fail(e.to_string()))?;
            let op = &graph.node(idx).op;
            let s = sharding::strategy_named(op, &view, strategy).ok_or_else(|| {
                fail(format!(
                    "{} has no strategy '{strategy}' on {tp} ranks",
                    op.name()
                ))
            })?;
            by_node.insert(idx, s);
        }
        let topo = graph.topo_order()?;
        let grads = layers::flow_flags(
            graph,
            &topo,
            |t| t.role == Role::Parameter && t.ty.dtype.is_float(),
            true,
        );
        let inputs: HashSet<TensorId> = graph.inputs.iter().copied().collect();
        Ok(Planned {
            by_node,
            rules: graph
                .tensors()
                .map(|(id, _)| inputs.contains(&id).then_some(Rule::Replicate))
                .collect(),
            parts: layers::parts(graph),
            streams: layers::streams(graph)?,
            grads,
            moved: HashSet::new(),
            copied: HashSet::new(),
            sliced: HashSet::new(),
            pending_bias: HashMap::new(),
        })
    }

    pub(in crate::workload) fn strategy(&self, idx: NodeIndex) -> Option<&Strategy> {
        self.by_node.get(&idx)
    }

    /// What the loss lowering adds does with graph output `t` (of `rank`
    /// dims): `Some(None)` runs the vocabulary-parallel cross-entropy on it
    /// (split along its last dim), `Some(Some(c))` first makes it whole
    /// with `c`, `None` reads it as it is.
    pub(in crate::workload) fn loss_input(&self, t: TensorId, rank: usize) -> Option<Option<Collective>> {
        match self.rules[t.index()] {
            Some(Rule::Shard(d)) if d + 1 == rank => Some(None),
            Some(Rule::Shard(_)) => Some(Some(Collective::AllGather)),
            Some(Rule::Partial) => Some(Some(Collective::AllReduce)),
            Some(Rule::Replicate) | None => None,
        }
    }
}

/// The workload's coarse layout of a tensor the program lays out as `r`.
fn coarse(r: Rule) -> Layout {
    match r {
        Rule::Replicate => Layout::Replicated,
        Rule::Shard(_) => Layout::Split,
        Rule::Partial => Layout::Partial,
    }
}

impl Builder<'_> {
    /// Visits node `idx` running the plan's strategy `s`.
    pub(in crate::workload) fn visit_planned(
        &mut self,
        idx: NodeIndex,
        s: &Strategy,
    ) -> Result<(), WorkloadError> {
        let graph = self.graph;
        let node = graph.node(idx);
        let unit = self.unit_of(idx);
        let mut weight_sharded = false;
        let mut weights_only = true;
        // Inputs gathered for this node and gathered again for its backward
        // pass: the rank keeps its part.
        let mut kept_split = Vec::new();
        for (slot, t) in node.inputs.iter().enumerate() {
            let Some(t) = *t else { continue };
            self.adopt_repeat_layout(t);
            let want = s.reads(slot).0;
            let shares = s.grad_partial.get(slot).copied().unwrap_or(false);
            if self.layouts[t.index()] == Layout::Weight {
                // Only a weight stored as each rank's slice is held sliced; a
                // tied weight read differently is stored whole and sliced per read.
                weight_sharded |= matches!(want, Rule::Shard(_))
                    && self.stored_sliced(t)
                    && !self.parameter_sources(t).is_empty();
                self.read_weight(idx, t, want, shares, unit)?;
                continue;
            }
            weights_only = false;
            let here = self.crossing(idx, t)?;
            let at = self.reader_unit(t, unit);
            self.move_into(t, here, want, shares, at)?;
            if self.regathered(t, here, want) {
                kept_split.push(slot);
            }
        }
        let out = s.outputs.first().copied().unwrap_or(Rule::Replicate);
        let layout = if weights_only { Layout::Weight } else { coarse(out) };
        let planned = self.planned.as_mut().expect("visiting a planned node");
        for &o in &node.outputs {
            planned.rules[o.index()] = Some(out);
            self.layouts[o.index()] = layout;
            self.produced[o.index()] = Some(layout);
        }
        let bias = node.inputs.get(2).copied().flatten();
        if let (Op::Linear | Op::Gemm { .. }, "row", Some(b)) = (&node.op, s.name.as_str(), bias) {
            planned.pending_bias.insert(node.outputs[0], b);
        }
        let Some(u) = unit else { return Ok(()) };
        if weights_only {
            return Ok(());
        }
        let d = Decision {
            reduce: vec![],
            gather: vec![],
            column_input: vec![],
            output: layout,
            weight_sharded,
        };
        self.reads = (0..node.inputs.len())
            .map(|slot| match kept_split.contains(&slot) {
                true => Some(self.divisor(Layout::Split)),
                false => Some(self.divisor(coarse(s.reads(slot).0))),
            })
            .collect();
        let priced = self.price(idx, u, &d, Some(s.divisor));
        self.reads.clear();
        priced
    }

    /// The unit a reader in `unit` pays for moving `t` in: a tensor made
    /// (or stored) before the layers and read by every layer (a mask, a
    /// rotary table) is moved once for all of them, so the part before the
    /// layers pays.
    fn reader_unit(&self, t: TensorId, unit: Option<usize>) -> Option<usize> {
        let places = &self.layered.places;
        let made_before = self.graph.producer(t).is_none_or(|p| places[&p] == Place::Pre);
        let every_layer = self
            .graph
            .consumers(t)
            .iter()
            .any(|c| matches!(places.get(c), Some(Place::Second | Place::Repeat)));
        match made_before && every_layer {
            true => Some(0),
            false => unit,
        }
    }

    /// The layout activation `t` arrives in at node `idx`: where it crosses
    /// from another part, moved into the boundary layout first (priced in
    /// its producer's unit, once).
    fn crossing(&mut self, idx: NodeIndex, t: TensorId) -> Result<Rule, WorkloadError> {
        let planned = self.planned.as_ref().expect("planned");
        let have = planned.rules[t.index()].unwrap_or(Rule::Replicate);
        let Some(p) = self.graph.producer(t) else {
            return Ok(have);
        };
        if planned.parts.get(&p) == planned.parts.get(&idx) {
            return Ok(have);
        }
        let tp = self.opts.sharding.tp;
        let seq = layers::crosses_sequence_split(
            planned.streams[t.index()],
            &self.dims[t.index()],
            tp,
            self.opts.sharding.sp,
        );
        let boundary = if seq { Rule::Shard(1) } else { Rule::Replicate };
        // Later layers hand on what the first one does: only a walked
        // producer's crossing is priced.
        let home = match self.layered.places[&p] {
            Place::Pre | Place::Layer | Place::Post => self.unit_of(p),
            Place::Second | Place::Repeat => None,
        };
        self.move_into(t, have, boundary, false, home)?;
        Ok(boundary)
    }

    /// Prices moving activation `t` from `from` into `to` in `unit` for a
    /// reader whose gradient is a share when `shares` (once per tensor,
    /// layout and kind of reader), with a row-parallel bias added after a
    /// reduction.
    fn move_into(
        &mut self,
        t: TensorId,
        from: Rule,
        to: Rule,
        shares: bool,
        unit: Option<usize>,
    ) -> Result<(), WorkloadError> {
        use Collective::{AllGather, AllReduce};
        let Some(steps) = sharding::read_moves(from, to, shares) else {
            return Err(WorkloadError::Plan {
                node: self.graph.tensor(t).name.clone(),
                message: format!("moving it from {from:?} into {to:?} is not something lowering runs"),
            });
        };
        let planned = self.planned.as_mut().expect("planned");
        if steps.is_empty() || !planned.moved.insert((t, to, shares)) {
            return Ok(());
        }
        let grad = planned.grads[t.index()];
        let bias = planned.pending_bias.get(&t).copied();
        let Some(u) = unit else { return Ok(()) };
        let bytes = self.full_bytes(t) / self.context_share(t);
        let regathered = self.regathered(t, from, to);
        if regathered {
            self.units[u].regathered_bytes += bytes;
        }
        for (kind, _) in steps {
            let back = of_comm(kind.conjugate()).filter(|_| grad);
            if let Some(c) = of_comm(kind) {
                self.units[u].comms.push(CommWork {
                    regathered: regathered && c == AllGather,
                    ..tensor_comm(Some(c), None, bytes)
                });
            }
            if let Some(c) = back {
                self.units[u].comms.push(tensor_comm(None, Some(c), bytes));
            }
        }
        // The bias, added once on the reduced sum: on sequence slices it is
        // copied in (its gradient, a share, all-reduced), or sliced.
        if let (Some(b), Rule::Shard(d)) = (bias, to) {
            let rank = self.dims[t.index()].len();
            let bd = self.dims[b.index()].clone();
            let along_bias = (d + bd.len()).checked_sub(rank).is_some_and(|i| bd[i] > 1);
            let bytes = self.full_bytes(b);
            let c = if along_bias { AllGather } else { AllReduce };
            self.units[u].comms.push(tensor_comm(None, Some(c), bytes));
        }
        Ok(())
    }

    /// True when moving activation `t` from `from` into `to` gathers it for
    /// a product (which keeps its input for the weight's gradient): lowering
    /// gathers it again for the backward pass, and the rank keeps its part
    /// ([`Op::is_product`]).
    fn regathered(&self, t: TensorId, from: Rule, to: Rule) -> bool {
        let gathers = sharding::moves(from, to).is_some_and(|steps| {
            steps
                .iter()
                .any(|(kind, _)| of_comm(*kind) == Some(Collective::AllGather))
        });
        let graph = self.graph;
        let planned = self.planned.as_ref().expect("planned");
        gathers
            && self.layouts[t.index()] != Layout::Weight
            && graph.consumers(t).iter().any(|&c| {
                let n = graph.node(c);
                let reads_gathered = |s: &Strategy| {
                    n.inputs
                        .iter()
                        .enumerate()
                        .any(|(slot, &x)| x == Some(t) && s.reads(slot).0 == to)
                };
                n.op.is_product() && planned.strategy(c).is_some_and(reads_gathered)
            })
    }

    /// Prices copying `t` (read as `as_read`) into divided work: its
    /// gradient, a share on each rank, is all-reduced (once per tensor).
    fn copy_in(&mut self, t: TensorId, as_read: Rule, unit: Option<usize>) {
        let planned = self.planned.as_mut().expect("planned");
        let float = self.graph.tensor(t).ty.dtype.is_float() && self.graph.tensor(t).role != Role::Constant;
        if !float || !planned.copied.insert((t, as_read)) {
            return;
        }
        let grad = planned.grads[t.index()];
        if let (Some(u), true) = (unit, grad) {
            let bytes = self.full_bytes(t) / self.context_share(t);
            self.units[u]
                .comms
                .push(tensor_comm(None, Some(Collective::AllReduce), bytes));
        }
    }

    /// How many ways context parallelism divides `t` on a rank: an
    /// activation holds the rank's share of the tokens, a weight (or a
    /// tensor computed from weights alone) is whole on every rank.
    fn context_share(&self, t: TensorId) -> f64 {
        match self.layouts[t.index()] {
            Layout::Weight => 1.0,
            _ => self.opts.sharding.cp as f64,
        }
    }

    /// Prices reading weight `t` as `want`: stored sliced when this is its
    /// parameter's one reader (directly or through a transpose of its
    /// own), else sliced per read (its gradient all-gathered); copied in
    /// when the strategy leaves its gradient as shares; moved like an
    /// activation when a planned op prepared it split.
    fn read_weight(
        &mut self,
        idx: NodeIndex,
        t: TensorId,
        want: Rule,
        shares: bool,
        unit: Option<usize>,
    ) -> Result<(), WorkloadError> {
        let have = self.planned.as_ref().expect("planned").rules[t.index()];
        if let Some(have @ (Rule::Shard(_) | Rule::Partial)) = have {
            // Prepared by a planned op into a split: moved like an activation.
            return self.move_into(t, have, want, shares, unit);
        }
        match want {
            Rule::Shard(_) if self.stored_sliced(t) => {}
            Rule::Shard(_) => {
                // One slice per weight, shared by every reader (a weight read
                // by every layer is sliced once, paid before the layers); a
                // tied weight's two copies are sliced apart.
                let tied = self.tied(t);
                let unit = self.reader_unit(t, unit);
                let planned = self.planned.as_mut().expect("planned");
                let grad = planned.grads[t.index()];
                let part = match tied {
                    true => planned.parts.get(&idx).copied().unwrap_or(0),
                    false => 0,
                };
                if planned.sliced.insert((t, want, part)) && grad {
                    if let Some(u) = unit {
                        let bytes = self.full_bytes(t);
                        self.units[u]
                            .comms
                            .push(tensor_comm(None, Some(Collective::AllGather), bytes));
                    }
                }
            }
            Rule::Replicate if shares => self.copy_in(t, want, unit),
            Rule::Replicate | Rule::Partial => {}
        }
        Ok(())
    }

    /// True when weight `t` is stored as each rank's slice: a parameter (or
    /// a transpose of one) with one reader, or tied across the model's ends
    /// and read alike by both ([`Builder::tied_read_alike`]; otherwise its
    /// two copies are stored whole).
    fn stored_sliced(&self, t: TensorId) -> bool {
        let graph = self.graph;
        let sole = |t: TensorId| graph.consumers(t).len() == 1;
        let own_param = |p: TensorId| {
            graph.tensor(p).role == Role::Parameter
                && match self.tied(p) {
                    true => self.tied_read_alike(p),
                    false => sole(p),
                }
        };
        if graph.tensor(t).role == Role::Parameter {
            return own_param(t);
        }
        let Some(p) = graph.producer(t) else { return false };
        let node = graph.node(p);
        let source = node.inputs.first().copied().flatten();
        matches!(node.op, Op::Transpose { .. }) && sole(t) && source.is_some_and(own_param)
    }

    /// True when the plan has every reader of tied parameter `p` read the
    /// same slice of it (directly, or through a transpose read only there):
    /// lowering then stores both copies as that slice, as Megatron-LM keeps
    /// a vocabulary-parallel embedding and output layer. False without a plan.
    pub(super) fn tied_read_alike(&self, p: TensorId) -> bool {
        let graph = self.graph;
        let Some(planned) = self.planned.as_ref() else {
            return false;
        };
        let rank = graph.tensor(p).ty.shape.rank();
        let slot_of =
            |node: NodeIndex, t: TensorId| graph.node(node).inputs.iter().position(|&i| i == Some(t));
        let shard = |reader: NodeIndex, slot: usize| match planned.strategy(reader)?.reads(slot).0 {
            Rule::Shard(d) => Some(d),
            _ => None,
        };
        // The axis of `p` reader `c` reads a slice along: by its own planned
        // strategy, or for a transpose the plan leaves to its one reader,
        // by that reader's.
        let axis_read = |c: NodeIndex| -> Option<usize> {
            let node = graph.node(c);
            if planned.strategy(c).is_some() {
                return shard(c, slot_of(c, p)?);
            }
            let Op::Transpose { perm } = &node.op else {
                return None;
            };
            let t = node.outputs[0];
            let [reader] = graph.consumers(t)[..] else {
                return None;
            };
            let perm = perm.clone().unwrap_or_else(|| (0..rank).rev().collect());
            perm.get(shard(reader, slot_of(reader, t)?)?).copied()
        };
        let readers = graph.consumers(p);
        let mut axes = readers.iter().map(|&c| axis_read(c));
        match axes.next() {
            Some(Some(first)) => axes.all(|a| a == Some(first)),
            _ => false,
        }
    }

    /// True when parameter `p` is read both before and after the layers
    /// (lowering trains it as two tied copies).
    pub(super) fn tied(&self, p: TensorId) -> bool {
        self.layered.tied.contains(&p)
    }
}

//! The walk that fills a [`Workload`]: layouts op by op, collectives where
//! layouts change, kernels, saved activations and parameter shards.

mod planned;

use super::layout::{self, decide, Layout};
use super::{
    kernels, CommWork, Group, Kernel, Layered, ParamShard, Place, ProductSplit, Unit, WorkloadError,
    WorkloadOptions,
};
use crate::comm::Collective;
use autopar_ir::{Bindings, DType, Dim, Graph, NodeIndex, Op, Role, Shape, TensorId, TensorType};
pub(super) use planned::Planned;
use std::collections::HashSet;

/// Walks the graph once, tracking layouts and filling the units.
pub(super) struct Builder<'g> {
    graph: &'g Graph,
    layered: &'g Layered<'g>,
    opts: &'g WorkloadOptions,
    /// Resolved dims of the tensors the walked nodes touch.
    dims: Vec<Vec<usize>>,
    layouts: Vec<Layout>,
    /// Layout each walked tensor had when produced (before any reduction).
    produced: Vec<Option<Layout>>,
    /// Tensors whose backward all-reduce (column-parallel input) is counted.
    column_inputs: HashSet<TensorId>,
    /// Storage already counted as saved for backward, with the ways it is
    /// divided on a rank as kept (the program keeps the copy an op reads).
    saved: HashSet<(TensorId, u64)>,
    /// Per input slot of the node being priced: the ways the op reads it
    /// divided when it is moved first (gathered), else `None`.
    reads: Vec<Option<f64>>,
    /// Whole weights read on sequence slices whose gradient all-reduce is counted.
    sequence_params: HashSet<TensorId>,
    /// Bytes of those gradients in each unit.
    sequence_grad_bytes: [f64; 3],
    pub(super) units: [Unit; 3],
    pub(super) compute_dtype: Option<DType>,
    pub(super) fixed_batch: Option<usize>,
    pub(super) heads: Vec<(usize, usize)>,
    /// A plan's per-op sharding, when its nodes run that (else the
    /// propagation rules of [`layout`]).
    planned: Option<Planned>,
}

impl<'g> Builder<'g> {
    pub(super) fn new(
        layered: &'g Layered<'g>,
        bindings: &Bindings,
        opts: &'g WorkloadOptions,
        planned: Option<Planned>,
    ) -> Result<Builder<'g>, WorkloadError> {
        let graph = layered.graph;
        let count = graph.tensors().count();
        let mut dims = vec![Vec::new(); count];
        for &idx in &layered.order {
            let node = graph.node(idx);
            for &t in node.inputs.iter().flatten().chain(&node.outputs) {
                let tensor = graph.tensor(t);
                dims[t.index()] =
                    tensor
                        .ty
                        .shape
                        .resolve(bindings)
                        .ok_or_else(|| WorkloadError::Unbound {
                            tensor: tensor.name.clone(),
                            shape: tensor.ty.shape.to_string(),
                        })?;
            }
        }
        let layouts = graph
            .tensors()
            .map(|(_, t)| match t.role {
                Role::Parameter | Role::Constant => Layout::Weight,
                Role::Input | Role::Activation => Layout::Replicated,
            })
            .collect();
        let fixed_batch = graph
            .inputs
            .first()
            .and_then(|&t| graph.tensor(t).ty.shape.0.first())
            .and_then(Dim::fixed);
        Ok(Builder {
            graph,
            layered,
            opts,
            dims,
            layouts,
            produced: vec![None; count],
            column_inputs: HashSet::new(),
            saved: HashSet::new(),
            reads: Vec::new(),
            sequence_params: HashSet::new(),
            sequence_grad_bytes: [0.0; 3],
            units: Default::default(),
            compute_dtype: None,
            fixed_batch,
            heads: Vec::new(),
            planned,
        })
    }

    /// Gives tensors of skipped later layers the layout their counterpart
    /// in the second layer was produced with.
    fn adopt_repeat_layout(&mut self, t: TensorId) {
        if self.produced[t.index()].is_some() {
            return;
        }
        let Some(p) = self.graph.producer(t) else { return };
        let Some(&twin) = self.layered.counterpart.get(&p) else {
            return;
        };
        let slot = self.graph.node(p).outputs.iter().position(|&o| o == t);
        let twin_out = slot.and_then(|j| self.graph.node(twin).outputs.get(j).copied());
        if let Some(layout) = twin_out.and_then(|o| self.produced[o.index()]) {
            self.layouts[t.index()] = layout;
            self.produced[t.index()] = Some(layout);
        }
    }

    fn unit_of(&self, idx: NodeIndex) -> Option<usize> {
        match self.layered.places[&idx] {
            Place::Pre => Some(0),
            Place::Layer => Some(1),
            Place::Second | Place::Repeat => None,
            Place::Post => Some(2),
        }
    }

    fn numel(&self, t: TensorId) -> f64 {
        self.dims[t.index()].iter().map(|&d| d as f64).product()
    }

    fn full_bytes(&self, t: TensorId) -> f64 {
        self.numel(t) * self.graph.tensor(t).ty.dtype.size_bits() as f64 / 8.0
    }

    /// How many ways a tensor with `layout` is divided on one rank (under
    /// the propagation rules' sequence parallelism a replicated activation
    /// is split along the sequence; a plan's program says so itself).
    fn divisor(&self, layout: Layout) -> f64 {
        let s = self.opts.sharding;
        let seq_split = s.sp && layout == Layout::Replicated && self.planned.is_none();
        let tp = if layout.is_sharded() || seq_split { s.tp } else { 1 };
        (tp * s.cp) as f64
    }

    /// Bytes of `t` on one rank, as laid out now.
    pub(super) fn rank_bytes(&self, t: TensorId) -> f64 {
        let layout = self.layouts[t.index()];
        if layout == Layout::Weight {
            return 0.0;
        }
        self.full_bytes(t) / self.divisor(layout)
    }

    pub(super) fn visit(&mut self, idx: NodeIndex) -> Result<(), WorkloadError> {
        if let Some(s) = self.planned.as_ref().and_then(|p| p.strategy(idx)).cloned() {
            return self.visit_planned(idx, &s);
        }
        let graph = self.graph;
        let node = graph.node(idx);
        for &t in node.inputs.iter().flatten() {
            self.adopt_repeat_layout(t);
        }
        let in_layouts: Vec<Option<Layout>> = node
            .inputs
            .iter()
            .map(|t| t.map(|t| self.layouts[t.index()]))
            .collect();
        let d = decide(&node.op, &in_layouts);
        let unit = self.unit_of(idx);
        let sp = self.opts.sharding.sp;
        for &slot in &d.reduce {
            let Some(t) = node.inputs[slot] else { continue };
            // Attributed to the unit that produced the pending sum.
            let home = graph.producer(t).and_then(|p| self.unit_of(p));
            let bytes = self.full_bytes(t) / self.opts.sharding.cp as f64;
            if let Some(home) = home {
                let (fwd, bwd) = if sp {
                    (Collective::ReduceScatter, Some(Collective::AllGather))
                } else {
                    (Collective::AllReduce, None)
                };
                self.units[home].comms.push(tensor_comm(Some(fwd), bwd, bytes));
            }
            self.layouts[t.index()] = Layout::Replicated;
        }
        for &slot in &d.gather {
            let Some(t) = node.inputs[slot] else { continue };
            if let Some(u) = unit {
                let bytes = self.full_bytes(t) / self.opts.sharding.cp as f64;
                self.units[u]
                    .comms
                    .push(tensor_comm(Some(Collective::AllGather), None, bytes));
            }
            self.layouts[t.index()] = Layout::Replicated;
        }
        self.reads = vec![None; node.inputs.len()];
        for &slot in &d.column_input {
            let Some(t) = node.inputs[slot] else { continue };
            if let Some(u) = unit.filter(|_| self.column_inputs.insert(t)) {
                let bytes = self.full_bytes(t) / self.opts.sharding.cp as f64;
                // Under sequence parallelism the product's input is gathered
                // along the sequence, and gathered again for the backward
                // pass: the rank keeps its slice.
                let (fwd, bwd) = if sp {
                    (Some(Collective::AllGather), Collective::ReduceScatter)
                } else {
                    (None, Collective::AllReduce)
                };
                self.units[u].comms.push(CommWork {
                    regathered: sp,
                    ..tensor_comm(fwd, Some(bwd), bytes)
                });
                if sp {
                    self.units[u].regathered_bytes += bytes;
                }
            }
        }
        for &t in &node.outputs {
            self.layouts[t.index()] = d.output;
            self.produced[t.index()] = Some(d.output);
        }
        let Some(u) = unit else { return Ok(()) };
        if d.output == Layout::Weight {
            return Ok(());
        }
        let priced = self.price(idx, u, &d, None);
        self.reads.clear();
        priced
    }

    /// Kernels, saved activations, parameters and extra collectives of a
    /// node in unit `u` (`ways`: how many ways a planned strategy divides
    /// its work).
    fn price(
        &mut self,
        idx: NodeIndex,
        u: usize,
        d: &layout::Decision,
        ways: Option<usize>,
    ) -> Result<(), WorkloadError> {
        let graph = self.graph;
        let node = graph.node(idx);
        let s = self.opts.sharding;
        let work_div = match ways {
            Some(ways) => (ways * s.cp) as f64,
            None if d.weight_sharded => (s.tp * s.cp) as f64,
            None => self.divisor(d.output),
        };
        let head_div = if d.output.is_sharded() { s.tp } else { 1 };
        let resolved = |t: TensorId| TensorType {
            dtype: graph.tensor(t).ty.dtype,
            shape: Shape::fixed(&self.dims[t.index()]),
        };
        let mut input_types: Vec<Option<TensorType>> = node.inputs.iter().map(|t| t.map(resolved)).collect();
        if let Some(rows) = self.padded_expert_rows(node) {
            // Under a capacity factor a rank's experts run on every row of
            // their padded blocks, each row one assignment.
            let h = self.dispatch_geometry(node).map_or(1, |d| d.h);
            for (slot, dims) in [(0, [rows, h]), (1, [rows, 1]), (2, [rows, 1])] {
                if let Some(t) = input_types.get_mut(slot).and_then(Option::as_mut) {
                    t.shape = Shape::fixed(&dims);
                }
            }
        }
        let output_types: Vec<TensorType> = node.outputs.iter().map(|&t| resolved(t)).collect();
        let dtype = output_types.first().map_or(DType::F32, |t| t.dtype);
        let split = match (d.weight_sharded, d.output) {
            (true, Layout::Partial) => ProductSplit::Rows,
            (true, _) => ProductSplit::Columns,
            (false, _) => ProductSplit::Whole,
        };
        let ctx = kernels::Context {
            op: &node.op,
            name: &node.name,
            input_types: &input_types,
            output_types: &output_types,
            dtype,
            work_div,
            head_div: head_div as f64,
            seq_div: s.cp as f64,
            tp: s.tp as f64,
            ep: if matches!(node.op, Op::MoeExperts { .. }) {
                s.ep
            } else {
                1
            } as f64,
            split,
            attention: self.opts.attention,
            dropout: self.opts.dropout,
            residual_add: is_residual_add(graph, node),
        };
        if matches!(node.op, Op::MatMul) && is_attention_scores(graph, node) && s.cp > 1 {
            return Err(WorkloadError::ContextNeedsAttention {
                node: node.name.clone(),
            });
        }
        let ir = node.op.cost(
            &input_types.iter().map(Option::as_ref).collect::<Vec<_>>(),
            &output_types.iter().collect::<Vec<_>>(),
        );
        let flops = &mut self.units[u].model_flops;
        flops.0 += ir.forward_flops;
        flops.1 += ir.backward_flops;
        let priced = kernels::price(&ctx, &ir);
        if priced.iter().any(|w| matches!(w.kernel, Kernel::Matmul { .. })) && self.compute_dtype.is_none() {
            self.compute_dtype = Some(dtype);
        }
        self.units[u].ops.extend(priced);
        if matches!(node.op, Op::Attention { .. }) && s.cp > 1 {
            // Context parallelism gathers keys and values along the
            // sequence before attention, and the gathered copies are kept.
            self.reads.resize(node.inputs.len(), None);
            for slot in [1, 2] {
                let Some(t) = node.inputs.get(slot).copied().flatten() else {
                    continue;
                };
                let held = self.reads[slot].unwrap_or_else(|| self.divisor(self.layouts[t.index()]));
                self.reads[slot] = Some(held / s.cp as f64);
            }
        }
        self.save_activations(idx, u, &ctx);
        self.add_params(idx, u, d);
        if ways.is_none() {
            // A plan's program prices its own copies of whole weights.
            self.sequence_parallel_grads(idx, u, d);
        }
        self.extra_comms(idx, u, d);
        Ok(())
    }

    /// Activations this op keeps for its backward pass.
    fn save_activations(&mut self, idx: NodeIndex, u: usize, ctx: &kernels::Context) {
        let node = self.graph.node(idx);
        let kept = kernels::saved_tensors(&node.op, &node.inputs, &node.outputs, |t| {
            self.layouts[t.index()] != Layout::Weight && self.graph.tensor(t).ty.dtype.is_float()
        });
        for t in kept {
            let root = self.storage_root(t);
            // An input moved into another layout before the op (gathered
            // along the sequence, say) is kept for backward as moved.
            let slot = node.inputs.iter().position(|&i| i == Some(t));
            let read = slot.and_then(|i| self.reads.get(i).copied().flatten());
            let held = self.layouts[root.index()];
            let (ways, bytes) = match read {
                Some(ways) if held != Layout::Weight => (ways, self.full_bytes(root) / ways),
                _ => (self.divisor(held), self.rank_bytes(root)),
            };
            if self.saved.insert((root, ways.to_bits())) {
                self.units[u].saved_bytes += bytes;
            }
        }
        let (extra, selective) = kernels::saved_extra_bytes(ctx);
        self.units[u].saved_bytes += extra;
        self.units[u].selective_bytes += selective;
    }

    /// Follows views (reshapes, splits) back to the tensor that owns the memory.
    fn storage_root(&self, mut t: TensorId) -> TensorId {
        while let Some(p) = self.graph.producer(t) {
            let node = self.graph.node(p);
            let is_view = matches!(
                node.op,
                Op::Reshape { .. }
                    | Op::Squeeze { .. }
                    | Op::Unsqueeze { .. }
                    | Op::Flatten { .. }
                    | Op::Split { .. }
            );
            match node.inputs.first().copied().flatten() {
                Some(src) if is_view && self.layouts[src.index()] != Layout::Weight => t = src,
                _ => break,
            }
        }
        t
    }

    /// The parameters this op reads (through weight preparation such as a
    /// transposed tied embedding), with their shard on one rank.
    fn add_params(&mut self, idx: NodeIndex, u: usize, d: &layout::Decision) {
        let graph = self.graph;
        let node = graph.node(idx);
        let s = self.opts.sharding;
        let is_experts = matches!(node.op, Op::MoeExperts { .. });
        for (slot, t) in node.inputs.iter().enumerate() {
            let Some(t) = *t else { continue };
            for p in self.parameter_sources(t) {
                let expert = is_experts && slot >= 3;
                // A tied weight is stored as the slice its readers share,
                // else whole ([`Builder::store_tied_alike`] without a plan).
                let sliced = match (self.tied(p), self.planned.is_some()) {
                    (true, true) => self.tied_read_alike(p),
                    _ => d.weight_sharded,
                };
                let mut div = if sliced { s.tp } else { 1 } as f64;
                if expert {
                    div *= s.ep as f64;
                }
                let shard = ParamShard {
                    elements: self.numel(p) / div,
                    rows: self.dims[p.index()].first().copied().unwrap_or(1) as f64,
                    dtype: graph.tensor(p).ty.dtype,
                    expert,
                };
                self.units[u].params.entry(p.index()).or_insert(shard);
            }
        }
    }

    /// Without a plan, a tied weight's copies before and after the layers
    /// are stored as their readers' layouts slice them; where the two
    /// differ, lowering stores both whole, and so are they priced.
    pub(super) fn store_tied_alike(&mut self) {
        let [pre, _, post] = &mut self.units;
        for (id, a) in pre.params.iter_mut() {
            if let Some(b) = post.params.get_mut(id) {
                let whole = a.elements.max(b.elements);
                a.elements = whole;
                b.elements = whole;
            }
        }
    }

    /// Under sequence parallelism an op outside the split regions runs on
    /// the rank's slice of the sequence, so the gradient of each whole
    /// weight it reads (norm scales and shifts, a row-parallel layer's bias
    /// added after the reduce-scatter) is a share, all-reduced backward
    /// over the tensor-parallel group (as Megatron-LM does for its
    /// `sequence_parallel` parameters).
    fn sequence_parallel_grads(&mut self, idx: NodeIndex, u: usize, d: &layout::Decision) {
        let s = self.opts.sharding;
        if !s.sp || s.tp == 1 {
            return;
        }
        let node = self.graph.node(idx);
        let slots: Vec<usize> = match (d.weight_sharded, d.output) {
            (false, Layout::Replicated) => (0..node.inputs.len()).collect(),
            (true, Layout::Partial) if matches!(node.op, Op::Linear) => vec![2],
            _ => return,
        };
        let params: Vec<TensorId> = slots
            .into_iter()
            .filter_map(|slot| node.inputs.get(slot).copied().flatten())
            .flat_map(|t| self.parameter_sources(t))
            .filter(|p| self.graph.tensor(*p).ty.dtype.is_float())
            .collect();
        for p in params {
            if self.sequence_params.insert(p) {
                self.sequence_grad_bytes[u] += self.full_bytes(p);
            }
        }
    }

    /// One all-reduce per unit of the gradients [`Self::sequence_parallel_grads`]
    /// found: the bytes the runtime's per-weight all-reduces send, with the
    /// latency of one collective (Megatron-LM coalesces them into one buffer).
    pub(super) fn add_sequence_parallel_grad_comms(&mut self) {
        for (unit, &bytes) in self.units.iter_mut().zip(&self.sequence_grad_bytes) {
            if bytes > 0.0 {
                unit.comms
                    .push(tensor_comm(None, Some(Collective::AllReduce), bytes));
            }
        }
    }

    /// Parameter tensors `t` is computed from, if it is a weight.
    fn parameter_sources(&self, t: TensorId) -> Vec<TensorId> {
        let mut found = Vec::new();
        let mut stack = vec![t];
        let mut seen = HashSet::new();
        while let Some(t) = stack.pop() {
            if !seen.insert(t) || self.layouts[t.index()] != Layout::Weight {
                continue;
            }
            if self.graph.tensor(t).role == Role::Parameter {
                found.push(t);
            } else if let Some(p) = self.graph.producer(t) {
                stack.extend(self.graph.node(p).inputs.iter().flatten());
            }
        }
        found
    }

    /// Context-parallel key/value exchange and expert-parallel token moves.
    fn extra_comms(&mut self, idx: NodeIndex, u: usize, d: &layout::Decision) {
        let graph = self.graph;
        let node = graph.node(idx);
        let s = self.opts.sharding;
        match node.op {
            Op::Attention { .. } => {
                let (Some(q), Some(k), Some(v)) = (
                    node.inputs.first().copied().flatten(),
                    node.inputs.get(1).copied().flatten(),
                    node.inputs.get(2).copied().flatten(),
                ) else {
                    return;
                };
                let (hq, hk) = (self.dims[q.index()][1], self.dims[k.index()][1]);
                self.heads.push((hq, hk));
                if s.cp > 1 {
                    // Keys and values gathered one by one, as lowering does,
                    // and put back in sequence order (the ranks hold
                    // balanced chunks).
                    let heads_div = if d.output.is_sharded() { s.tp } else { 1 } as f64;
                    for t in [k, v] {
                        let gathered = self.full_bytes(t) / heads_div;
                        let name = format!("{}/in_order", node.name);
                        let dtype = graph.tensor(t).ty.dtype;
                        let reorder = kernels::lookup(&name, dtype, (0.0, 0.0), gathered);
                        self.units[u].ops.push(reorder);
                        self.units[u].comms.push(CommWork {
                            group: Group::Context,
                            forward: Some(Collective::AllGather),
                            backward: Some(Collective::ReduceScatter),
                            bytes: self.full_bytes(t) / heads_div,
                            regathered: false,
                        });
                    }
                }
            }
            Op::MoeExperts { .. } if s.ep > 1 || self.opts.moe_capacity_factor.is_some() => {
                self.dispatch(node, u)
            }
            _ => {}
        }
    }

    /// Expert parallelism's token dispatch around an experts node, as
    /// `lower::expert_parallel` lowers it: the rank's `n` tokens' `k`
    /// assignments sorted by expert, the counts exchanged, the rows sent to
    /// their experts' ranks and back (an all-to-all each way, forward and
    /// backward, routed evenly in expectation), and put back in token order,
    /// weighted and summed. Its kernels are priced as the same ops, and the
    /// rows received (blocks padded to what one rank could send), the
    /// returned rows and the permutations are kept for backward.
    fn dispatch(&mut self, node: &autopar_ir::Node, u: usize) {
        let Some(d) = self.dispatch_geometry(node) else {
            return;
        };
        let Dispatch {
            n,
            k,
            h,
            experts,
            capacity,
            dtype,
        } = d;
        let s = self.opts.sharding;
        let (assignments, ep, local) = (n * k, s.ep, experts / s.ep);
        // Rows each rank's experts run on: padded blocks per source.
        let rows = capacity.map_or(assignments, |c| experts * c);
        let float = |dims: &[usize]| TensorType {
            dtype,
            shape: Shape::fixed(dims),
        };
        let int = |dims: &[usize]| TensorType {
            dtype: DType::I64,
            shape: Shape::fixed(dims),
        };
        let binary = |func| Op::Binary { func };
        let sum = Op::Reduce {
            kind: autopar_ir::ReduceKind::Sum,
            axes: Some(vec![-2]),
            keepdims: false,
            noop_with_empty_axes: false,
        };
        let mut kernels = vec![
            (
                Op::MoeSort { experts, capacity },
                vec![int(&[n, k])],
                vec![int(&[rows]), int(&[assignments]), int(&[experts])],
            ),
            (
                Op::Gather { axis: 0 },
                vec![float(&[n, h]), int(&[rows])],
                vec![float(&[rows, h])],
            ),
            (
                Op::Gather { axis: 0 },
                vec![float(&[rows, h]), int(&[assignments])],
                vec![float(&[assignments, h])],
            ),
            (
                binary(autopar_ir::BinaryOp::Mul),
                vec![float(&[n, k, h]), float(&[n, k, 1])],
                vec![float(&[n, k, h])],
            ),
            (sum, vec![float(&[n, k, h])], vec![float(&[n, h])]),
        ];
        match capacity {
            None => kernels.push((
                Op::MoeSlots { rows: assignments },
                vec![int(&[ep, local])],
                vec![int(&[ep * rows])],
            )),
            // The kept assignments' mask, on the routing weights.
            Some(_) => {
                let flat = [assignments];
                kernels.extend([
                    (
                        binary(autopar_ir::BinaryOp::GreaterOrEqual),
                        vec![int(&flat), int(&[])],
                        vec![TensorType {
                            dtype: DType::Bool,
                            shape: Shape::fixed(&flat),
                        }],
                    ),
                    (
                        Op::cast(dtype),
                        vec![TensorType {
                            dtype: DType::Bool,
                            shape: Shape::fixed(&flat),
                        }],
                        vec![float(&flat)],
                    ),
                    (
                        binary(autopar_ir::BinaryOp::Mul),
                        vec![float(&[n, k]), float(&[n, k])],
                        vec![float(&[n, k])],
                    ),
                    (
                        binary(autopar_ir::BinaryOp::Max),
                        vec![int(&flat), int(&[])],
                        vec![int(&flat)],
                    ),
                ]);
            }
        }
        let name = format!("{}/dispatch", node.name);
        for (op, inputs, outputs) in kernels {
            let priced = self.synthetic(&op, &name, inputs, &outputs, 1.0);
            self.units[u].ops.extend(priced);
        }
        let width = dtype.size_bits() as f64 / 8.0;
        let row = h as f64 * width;
        // Kept for backward: the rows the experts ran on and the rows
        // returned in assignment order, and the permutations (and mask).
        let (received, exchanges) = match capacity {
            None => (
                ep * assignments,
                vec![
                    // The counts (i64, which the collectives carry as 8 bytes).
                    (None, (experts * 8) as f64),
                    (Some(Collective::AllToAll), assignments as f64 * row),
                    (Some(Collective::AllToAll), assignments as f64 * row),
                ],
            ),
            Some(_) => (
                rows,
                vec![
                    (Some(Collective::AllToAll), rows as f64 * row),
                    (Some(Collective::AllToAll), rows as f64 * row),
                ],
            ),
        };
        let ints = match capacity {
            None => (ep + 2) * assignments,
            Some(_) => rows + 2 * assignments,
        };
        let mask = if capacity.is_some() {
            assignments as f64 * width
        } else {
            0.0
        };
        self.units[u].saved_bytes += (received + assignments) as f64 * row + (ints * 8) as f64 + mask;
        if ep == 1 {
            return;
        }
        for (backward, bytes) in exchanges {
            self.units[u].comms.push(CommWork {
                group: Group::Expert,
                forward: Some(Collective::AllToAll),
                backward,
                bytes,
                regathered: false,
            });
        }
    }

    /// Rows an experts node runs on under a capacity factor, as the whole
    /// graph counts them (`cp` times a rank's padded blocks).
    fn padded_expert_rows(&self, node: &autopar_ir::Node) -> Option<usize> {
        if !matches!(node.op, Op::MoeExperts { .. }) {
            return None;
        }
        let d = self.dispatch_geometry(node)?;
        Some(d.experts * d.capacity? * self.opts.sharding.cp)
    }

    /// A rank's share of an experts node's routing: its `n` tokens' `k`
    /// assignments of `h`-wide rows over `experts`, and each expert's
    /// block of rows under the workload's capacity factor.
    fn dispatch_geometry(&self, node: &autopar_ir::Node) -> Option<Dispatch> {
        let input = |i: usize| node.inputs.get(i).copied().flatten();
        let (x, ids, w_in) = (input(0)?, input(2)?, input(3)?);
        let x_dims = &self.dims[x.index()];
        let h = x_dims.last().copied().unwrap_or(1);
        let k = self.dims[ids.index()].last().copied().unwrap_or(1);
        let experts = self.dims[w_in.index()].first().copied().unwrap_or(1);
        let cp = self.opts.sharding.cp as f64;
        let read = self.reads.first().copied().flatten().unwrap_or(cp);
        let n = ((x_dims.iter().product::<usize>() / h.max(1)) as f64 / read).round() as usize;
        let capacity = self
            .opts
            .moe_capacity_factor
            .map(|cf| super::expert_capacity(cf, n * k, experts));
        Some(Dispatch {
            n,
            k,
            h,
            experts,
            capacity,
            dtype: self.graph.tensor(x).ty.dtype,
        })
    }

    /// The kernels of an op lowering adds beside the graph's own, at one
    /// rank's shapes divided `work_div` ways.
    fn synthetic(
        &self,
        op: &Op,
        name: &str,
        inputs: Vec<TensorType>,
        outputs: &[TensorType],
        work_div: f64,
    ) -> Vec<kernels::OpWork> {
        let inputs: Vec<Option<TensorType>> = inputs.into_iter().map(Some).collect();
        let dtype = outputs
            .iter()
            .chain(inputs.iter().flatten())
            .map(|t| t.dtype)
            .find(|d| d.is_float())
            .unwrap_or(DType::F32);
        let ctx = kernels::Context {
            op,
            name,
            input_types: &inputs,
            output_types: outputs,
            dtype,
            work_div,
            head_div: 1.0,
            seq_div: self.opts.sharding.cp as f64,
            tp: self.opts.sharding.tp as f64,
            ep: 1.0,
            split: ProductSplit::Whole,
            attention: self.opts.attention,
            dropout: false,
            residual_add: false,
        };
        let ir = op.cost(
            &inputs.iter().map(Option::as_ref).collect::<Vec<_>>(),
            &outputs.iter().collect::<Vec<_>>(),
        );
        kernels::price(&ctx, &ir)
    }

    /// The graph outputs a loss reads (the float ones; lowering trains a
    /// model with one) and the unit that produces each.
    pub(super) fn loss_outputs(&self) -> Vec<(TensorId, usize)> {
        let graph = self.graph;
        graph
            .outputs
            .iter()
            .filter(|&&t| graph.tensor(t).ty.dtype.is_float())
            .filter_map(|&t| Some((t, graph.producer(t).and_then(|p| self.unit_of(p))?)))
            .collect()
    }

    /// The kernels of the loss lowering appends on each float graph output
    /// ([`autopar_ir::Loss::standalone`], the nodes the training graph
    /// gets), at the rank's shapes and priced as each op is wherever it
    /// runs. Returns those kernels and, for a cross-entropy, the logit
    /// elements it reads on one rank (what another implementation of it
    /// is priced against).
    pub(super) fn add_loss_kernels(&mut self) -> (Vec<kernels::OpWork>, f64) {
        let (mut all, mut elements) = (Vec::new(), 0.0);
        let loss = self.opts.loss;
        for (t, u) in self.loss_outputs() {
            let ty = TensorType {
                dtype: self.graph.tensor(t).ty.dtype,
                shape: Shape::fixed(&self.dims[t.index()]),
            };
            let work_div = self.divisor(self.layouts[t.index()]);
            let g = loss.standalone(&ty);
            for idx in g.node_indices() {
                let node = g.node(idx);
                let types = |ts: &[TensorId]| ts.iter().map(|&t| g.tensor(t).ty.clone()).collect::<Vec<_>>();
                let inputs = types(&node.inputs.iter().flatten().copied().collect::<Vec<_>>());
                let priced = self.synthetic(&node.op, &node.name, inputs, &types(&node.outputs), work_div);
                all.extend(priced.iter().cloned());
                self.units[u].ops.extend(priced);
            }
            if loss.over_classes() {
                elements += self.dims[t.index()].iter().product::<usize>() as f64 / work_div;
            }
        }
        (all, elements)
    }

    /// The cross-entropy the runtime computes on vocabulary-split logits
    /// (each graph output still split when the walk ends): forward, the
    /// ranks' maxima are all-gathered and the sum of exponentials and the
    /// target's logit all-reduced; backward, the log-sum-exp's gradient is
    /// all-reduced. Each moves one value per token, so the logits are never
    /// gathered. Under context parallelism the ranks' loss sums are
    /// all-reduced too.
    pub(super) fn add_loss_comms(&mut self) {
        let s = self.opts.sharding;
        if s.cp > 1 {
            // Each context rank sums its tokens' losses; the sums are
            // all-reduced (one value per graph output).
            for (t, u) in self.loss_outputs() {
                let bytes = self.graph.tensor(t).ty.dtype.size_bits() as f64 / 8.0;
                self.units[u].comms.push(CommWork {
                    group: Group::Context,
                    forward: Some(Collective::AllReduce),
                    backward: None,
                    bytes,
                    regathered: false,
                });
            }
        }
        if s.tp == 1 {
            return;
        }
        for (t, u) in self.loss_outputs() {
            let vocab_split = match &self.planned {
                Some(planned) => match planned.loss_input(t, self.dims[t.index()].len()) {
                    Some(None) => true,
                    Some(Some(whole)) => {
                        let bytes = self.full_bytes(t) / s.cp as f64;
                        self.units[u].comms.push(tensor_comm(Some(whole), None, bytes));
                        false
                    }
                    None => false,
                },
                None => self.layouts[t.index()] == Layout::Split,
            };
            if !vocab_split {
                continue;
            }
            if !self.opts.loss.over_classes() {
                // A squared error on a split output reads the values' slice
                // and all-reduces its one partial sum.
                let bytes = self.graph.tensor(t).ty.dtype.size_bits() as f64 / 8.0;
                self.units[u]
                    .comms
                    .push(tensor_comm(Some(Collective::AllReduce), None, bytes));
                continue;
            }
            let vocab = self.dims[t.index()].last().copied().unwrap_or(1).max(1) as f64;
            let per_token = self.full_bytes(t) / vocab / s.cp as f64;
            let comms = [
                (Some(Collective::AllGather), None, per_token * s.tp as f64),
                (Some(Collective::AllReduce), None, per_token),
                (Some(Collective::AllReduce), None, per_token),
                (None, Some(Collective::AllReduce), per_token),
            ];
            for (fwd, bwd, bytes) in comms {
                self.units[u].comms.push(tensor_comm(fwd, bwd, bytes));
            }
        }
    }

    /// Bytes on one rank of graph output `t` as the loss reads it: whole
    /// (the rank's tokens) where a plan's sharding gathers it first, else
    /// as laid out.
    pub(super) fn loss_input_bytes(&self, t: TensorId) -> f64 {
        let gathered = self
            .planned
            .as_ref()
            .and_then(|p| p.loss_input(t, self.dims[t.index()].len()))
            .is_some_and(|whole| whole.is_some());
        match gathered {
            true => self.full_bytes(t) / self.opts.sharding.cp as f64,
            false => self.rank_bytes(t),
        }
    }

    /// Bytes on one rank of what the second layer reads from the first.
    pub(super) fn boundary_bytes(&self) -> f64 {
        let graph = self.graph;
        let places = &self.layered.places;
        let mut crossing = HashSet::new();
        for &idx in &self.layered.order {
            if places[&idx] != Place::Second {
                continue;
            }
            for &t in graph.node(idx).inputs.iter().flatten() {
                if graph.producer(t).is_some_and(|p| places[&p] == Place::Layer) {
                    crossing.insert(t);
                }
            }
        }
        let cp = self.opts.sharding.cp as f64;
        crossing.iter().map(|&t| self.full_bytes(t) / cp).sum()
    }
}

fn tensor_comm(forward: Option<Collective>, backward: Option<Collective>, bytes: f64) -> CommWork {
    CommWork {
        group: Group::Tensor,
        forward,
        backward,
        bytes,
        regathered: false,
    }
}

/// An `Add` of two computed tensors of the output's shape: a residual
/// connection (where training applies dropout to the branch).
pub fn is_residual_add(graph: &Graph, node: &autopar_ir::Node) -> bool {
    if !matches!(
        node.op,
        Op::Binary {
            func: autopar_ir::BinaryOp::Add
        }
    ) {
        return false;
    }
    let Some(&out) = node.outputs.first() else {
        return false;
    };
    let out_shape = &graph.tensor(out).ty.shape;
    node.inputs.iter().flatten().count() == 2
        && node.inputs.iter().flatten().all(|&t| {
            let tensor = graph.tensor(t);
            tensor.role == Role::Activation && &tensor.ty.shape == out_shape
        })
}

/// A `MatMul` of two computed tensors (attention scores in exported graphs
/// whose attention was not recognised).
fn is_attention_scores(graph: &Graph, node: &autopar_ir::Node) -> bool {
    node.inputs
        .iter()
        .flatten()
        .all(|&t| graph.tensor(t).role == Role::Activation)
}

/// A rank's share of an experts node's routing ([`Builder::dispatch_geometry`]).
struct Dispatch {
    n: usize,
    k: usize,
    h: usize,
    experts: usize,
    /// Each expert's block of rows, under a capacity factor.
    capacity: Option<usize>,
    /// The tokens' type.
    dtype: DType,
}

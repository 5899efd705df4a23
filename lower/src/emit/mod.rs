//! Emission of each rank's instruction list: the schedule's tasks become
//! loads, receives, node computations and sends; then come the gradient
//! reduction, optimizer and parameter traffic the ZeRO stage asks for; every
//! micro-batch buffer is freed after its last use.
//!
//! A rank of a large plan emits hundreds of thousands of instructions, so
//! the graph facts emission needs are indexed by tensor once per plan, and
//! buffers are tracked by integer [`Key`]s in dense tables; names are only
//! copied into the instructions themselves.

use super::objective::Feed;
use super::partition::Partition;
use super::program::{Buf, Coord, Instr, Program};
use super::schedule::{stage_order, Phase, Task};
use super::strategy::Strategy;
use super::training::TrainingGraph;
use super::LowerError;
use autopar_cost_models::Recompute;
use autopar_ir::{CommGroup, NodeIndex, Op, OpClass, Role, TensorId};
use std::collections::{BTreeMap, BTreeSet, HashMap};

mod buckets;
mod frees;
mod prefetch;
mod zero;

use buckets::Buckets;
use frees::{Groups, Key, Lifetimes};
use prefetch::Segments;

/// Facts about the training graph shared by every rank's emission.
pub(super) struct Layout<'a> {
    pub t: &'a TrainingGraph,
    pub s: &'a Strategy,
    pub part: &'a Partition,
    /// By tensor index: the first tensor with the same name, which stands
    /// for the name in buffer [`Key`]s (buffers are named by tensor name).
    name_of: Vec<u32>,
    /// Virtual stages that consume each tensor (with repeats), by tensor index.
    consumers: Groups<usize>,
    /// How each data input is fed, by tensor index.
    feeds: Vec<Option<Feed>>,
    /// By name ([`Layout::name_of`]): the parameter a gradient tensor
    /// accumulates into, and the name of that parameter's gradient.
    accumulates: Vec<Option<(&'a str, Option<u32>)>>,
    /// The loss tensor's name ([`Layout::name_of`]).
    loss: Option<u32>,
    /// Virtual stages that use each parameter, and the one that owns its gradient.
    param_users: BTreeMap<String, BTreeSet<usize>>,
    param_owner: HashMap<String, usize>,
    /// By parameter: its gradient's bytes on a rank, which fill buckets.
    grad_bytes: HashMap<String, f64>,
    /// By node index: the repeated layer it belongs to (a backward node,
    /// that of the forward node it came from).
    layer_of: Vec<Option<usize>>,
    /// By node index: computed from constants alone, with no communication
    /// (an explicit causal mask from positions, a rank's rows of a table).
    constant_made: Vec<bool>,
    /// By node index: a tensor-parallel all-gather of an activation for a
    /// product whose gathered copy the backward pass reads.
    regathered: Vec<bool>,
}

impl<'a> Layout<'a> {
    pub fn new(t: &'a TrainingGraph, s: &'a Strategy, part: &'a Partition) -> Layout<'a> {
        let g = &t.graph;
        // Each name's first and last tensor: the first names buffers, the
        // last is the one a lookup by name finds.
        let mut by_name: HashMap<&str, (u32, TensorId)> = HashMap::with_capacity(g.tensors().size_hint().0);
        let name_of: Vec<u32> = g
            .tensors()
            .map(|(id, x)| {
                let ids = by_name.entry(x.name.as_str()).or_insert((id.0, id));
                ids.1 = id;
                ids.0
            })
            .collect();
        let position = |name: &str| by_name.get(name).map(|&(first, _)| first);
        let uses: Vec<(usize, usize)> = part
            .groups
            .iter()
            .flat_map(|(&(vs, _), nodes)| nodes.iter().map(move |&i| (vs, i)))
            .flat_map(|(vs, i)| g.node(i).inputs.iter().flatten().map(move |x| (x.index(), vs)))
            .collect();
        let consumers = Groups::new(name_of.len(), &uses);
        let mut param_users: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
        for (id, tensor) in g.tensors() {
            let stages = consumers.get(id.index());
            if tensor.role == Role::Parameter && !stages.is_empty() {
                param_users
                    .entry(tensor.name.clone())
                    .or_default()
                    .extend(stages.iter().copied());
            }
        }
        let id_of = |name: &str| by_name.get(name).map(|&(_, last)| last);
        let mut feeds = vec![None; name_of.len()];
        for (name, feed) in &t.feeds {
            if let Some(slot) = id_of(name).and_then(|id| feeds.get_mut(id.index())) {
                *slot = Some(*feed);
            }
        }
        let grad_of: HashMap<&str, &str> = t
            .gradients
            .iter()
            .map(|(p, gr)| (gr.as_str(), p.as_str()))
            .collect();
        let grad_tensor: HashMap<&str, &str> = t
            .gradients
            .iter()
            .map(|(p, gr)| (p.as_str(), gr.as_str()))
            .collect();
        let mut accumulates = vec![None; name_of.len()];
        for (gr, p) in grad_of {
            if let Some(slot) = position(gr).and_then(|k| accumulates.get_mut(k as usize)) {
                *slot = Some((p, grad_tensor.get(p).and_then(|&gr| position(gr))));
            }
        }
        let loss = position(&t.loss);
        let mut param_owner = HashMap::new();
        for (p, grad) in &t.gradients {
            if let Some(node) = id_of(grad).and_then(|id| g.producer(id)) {
                param_owner.insert(p.clone(), part.place[&node].0);
            }
        }
        let grad_bytes = t
            .gradients
            .iter()
            .filter_map(|(p, grad)| {
                let x = g.tensor(id_of(grad)?);
                let numel = x.ty.shape.numel(&g.bindings)?;
                Some((p.clone(), (numel as usize * x.ty.dtype.size_bytes()) as f64))
            })
            .collect();
        Layout {
            t,
            s,
            part,
            name_of,
            consumers,
            feeds,
            accumulates,
            loss,
            param_users,
            param_owner,
            grad_bytes,
            layer_of: layers_of(t),
            constant_made: constant_made(g),
            regathered: regathered(g, part),
        }
    }

    /// The key of `x`'s buffer for micro-batch `mb` (`None`: per step).
    fn key(&self, x: TensorId, mb: Option<usize>) -> Key {
        Key {
            name: self.name_of.get(x.index()).copied().unwrap_or_default(),
            mb: mb.map_or(0, |mb| mb + 1),
        }
    }

    /// The name of tensor `name` ([`Key::name`]).
    fn name(&self, name: u32) -> &'a str {
        &self.t.graph.tensor(TensorId(name)).name
    }

    /// The virtual stage `coord`'s rank runs `task` on.
    fn task_stage(&self, task: Task, coord: Coord) -> usize {
        task.chunk * self.s.pp + coord.pp
    }

    /// Nodes of `vs`'s `phase`, in topological order.
    fn stage_nodes(&self, vs: usize, phase: Phase) -> &[NodeIndex] {
        self.part.groups.get(&(vs, phase)).map_or(&[], Vec::as_slice)
    }

    /// Forward nodes of `vs` that its backward phase runs again: those its
    /// recomputation policy names, and always the nodes passing a weight on
    /// ([`Op::passes_input`]: tensor-parallel copies of weights), those
    /// made from constants alone, and the tensor-parallel all-gathers of
    /// activations the backward pass reads. A backward pass that read the
    /// forward's would keep every layer's copy alive from its forward to
    /// its backward pass (under ZeRO-3, every layer's gathered weights;
    /// under context parallelism, every layer's explicit causal mask; under
    /// sequence parallelism, every product's input whole where Megatron-LM
    /// keeps the rank's slice and gathers it again).
    fn recomputed(&self, vs: usize) -> impl Iterator<Item = NodeIndex> + '_ {
        let policy = self.s.recompute[vs % self.s.pp];
        let g = &self.t.graph;
        self.stage_nodes(vs, Phase::Forward)
            .iter()
            .copied()
            .filter(move |&i| {
                let n = g.node(i);
                let weight_copy = n.op.passes_input()
                    && n.inputs
                        .iter()
                        .flatten()
                        .all(|&x| g.tensor(x).role == Role::Parameter);
                weight_copy
                    || self.constant_made[i.index()]
                    || self.regathered[i.index()]
                    || match policy {
                        Recompute::None => false,
                        Recompute::Full => true,
                        Recompute::Selective => n.op.class() == OpClass::Attention,
                    }
            })
    }

    /// The program of `rank`.
    pub fn program(&self, rank: usize) -> Result<Program, LowerError> {
        let coord = self.s.ranks[rank];
        let order = stage_order(
            self.s.schedule,
            coord.pp,
            self.s.pp,
            self.s.chunks,
            self.s.micro_batches,
        )?;
        // Emission appends a little more than one instruction per node
        // run: reserving two spares regrowing the longest vector.
        let runs: usize = order
            .iter()
            .map(|&task| {
                let vs = self.task_stage(task, coord);
                let again = match task.phase {
                    Phase::Forward => 0,
                    Phase::Backward => self.recomputed(vs).count(),
                };
                self.stage_nodes(vs, task.phase).len() + again
            })
            .sum();
        let mut e = Emitter {
            l: self,
            coord,
            rank,
            stage_ranks: self.s.pipeline_group(coord),
            comm_groups: Default::default(),
            dp_groups: Default::default(),
            out: Vec::with_capacity(2 * runs),
            lifetimes: Lifetimes::default(),
            tasks: 0,
            gathered: Vec::new(),
            reduce_early: BTreeMap::new(),
            reduced: BTreeSet::new(),
            buckets: Buckets::default(),
            segments: Segments::default(),
        };
        e.reduce_early = e.early_reductions();
        e.plan_buckets();
        for task in &order {
            e.task(*task)?;
        }
        let params = e.optimizer()?;
        let instructions = e.with_frees();
        Ok(Program {
            rank,
            coord,
            params,
            instructions,
        })
    }
}

/// The repeated layer of every node of `t`, by node index: forward nodes
/// by name, backward nodes by the forward node they came from.
fn layers_of(t: &TrainingGraph) -> Vec<Option<usize>> {
    let g = &t.graph;
    let by_name: HashMap<&str, usize> = g
        .blocks
        .iter()
        .enumerate()
        .flat_map(|(layer, b)| b.nodes.iter().map(move |n| (n.as_str(), layer)))
        .collect();
    let mut layers = Vec::new();
    for i in g.node_indices() {
        let name = g.node(i).name.as_str();
        let forward = t.origins.get(name).map_or(name, String::as_str);
        if layers.len() <= i.index() {
            layers.resize(i.index() + 1, None);
        }
        layers[i.index()] = by_name.get(forward).copied();
    }
    layers
}

/// By node index: whether the node's inputs are constants or outputs of
/// such nodes, and it moves nothing between ranks (a context-parallel
/// slice only takes the rank's part).
fn constant_made(g: &autopar_ir::Graph) -> Vec<bool> {
    let local = |op: &Op| match op {
        Op::Comm { kind, .. } => *kind == autopar_ir::CommKind::Slice,
        _ => true,
    };
    let made = made_from(g, |r| r == Role::Constant, local);
    let mut out = vec![false; g.node_indices().map(|i| i.index() + 1).max().unwrap_or(0)];
    for i in g.node_indices() {
        out[i.index()] = g.node(i).outputs.iter().all(|&x| made[x.index()]);
    }
    out
}

/// By tensor index: whether the tensor has a `leaf` role or is computed,
/// by nodes whose op `counts`, from such tensors alone.
fn made_from(g: &autopar_ir::Graph, leaf: impl Fn(Role) -> bool, counts: impl Fn(&Op) -> bool) -> Vec<bool> {
    let mut made: Vec<bool> = g.tensors().map(|(_, t)| leaf(t.role)).collect();
    if let Ok(order) = g.topo_order() {
        for i in order {
            let n = g.node(i);
            if counts(&n.op) && n.inputs.iter().flatten().all(|&x| made[x.index()]) {
                for &x in &n.outputs {
                    made[x.index()] = true;
                }
            }
        }
    }
    made
}

/// By node index: whether the node is a forward tensor-parallel all-gather
/// of an activation for a product ([`Op::is_product`]) whose output a
/// backward node reads, or a node passing such a gather's output on
/// ([`Op::passes_input`]: a copy into a tensor-parallel region) to one.
fn regathered(g: &autopar_ir::Graph, part: &Partition) -> Vec<bool> {
    let mut out = vec![false; g.node_indices().map(|i| i.index() + 1).max().unwrap_or(0)];
    let phase = |c: &NodeIndex| part.place.get(c).map(|p| p.1);
    let from_weights = made_from(g, |r| matches!(r, Role::Parameter | Role::Constant), |_| true);
    for i in g.node_indices() {
        let n = g.node(i);
        let gather = matches!(
            n.op,
            Op::Comm {
                kind: autopar_ir::CommKind::AllGather | autopar_ir::CommKind::GatherForCompute,
                group: CommGroup::Tensor,
                ..
            }
        );
        let activation = n.inputs.iter().flatten().all(|&x| !from_weights[x.index()]);
        if !gather || !activation || phase(&i) != Some(Phase::Forward) {
            continue;
        }
        // The gather and the forward nodes handing its output on.
        let mut chain = vec![i];
        let (mut for_product, mut backward_reads) = (false, false);
        let mut k = 0;
        while k < chain.len() {
            for &x in &g.node(chain[k]).outputs {
                for c in g.consumers(x) {
                    match phase(&c) {
                        Some(Phase::Backward) => backward_reads = true,
                        Some(Phase::Forward) if g.node(c).op.passes_input() => chain.push(c),
                        Some(Phase::Forward) => for_product |= g.node(c).op.is_product(),
                        None => {}
                    }
                }
            }
            k += 1;
        }
        if for_product && backward_reads {
            for c in chain {
                out[c.index()] = true;
            }
        }
    }
    out
}

/// One rank's program while it is emitted.
struct Emitter<'l, 'a> {
    l: &'l Layout<'a>,
    coord: Coord,
    rank: usize,
    /// The rank running each pipeline stage in this rank's replica.
    stage_ranks: Vec<usize>,
    /// This rank's context, tensor and expert groups, made on first use.
    comm_groups: [Option<Vec<usize>>; 3],
    /// This rank's data-parallel groups for dense and expert weights, made on first use.
    dp_groups: [Option<Vec<usize>>; 2],
    out: Vec<Instr>,
    lifetimes: Lifetimes,
    /// Tasks emitted so far, and by name the last of them that gathered a
    /// parameter (ZeRO-3).
    tasks: usize,
    gathered: Vec<usize>,
    /// Parameters whose gradient is reduced in the backward pass
    /// (overlapping the rest of it), in buckets, with the micro-batches'
    /// gradients still to come this step: after the last (ZeRO-0/1), or
    /// each micro-batch's (ZeRO-2/3).
    reduce_early: BTreeMap<String, usize>,
    /// Parameters whose reduction joined a bucket that way.
    reduced: BTreeSet<String>,
    /// The gradient buckets being filled.
    buckets: Buckets,
    /// ZeRO-3: the current task's weights in runs of one layer, to gather ahead.
    segments: Segments,
}

impl Emitter<'_, '_> {
    fn zero3(&self) -> bool {
        self.l.s.zero == 3
    }

    /// The physical rank running virtual stage `vs` in this rank's replica.
    fn stage_rank(&self, vs: usize) -> usize {
        self.stage_ranks[vs % self.l.s.pp]
    }

    fn comm_group(&mut self, group: CommGroup) -> Vec<usize> {
        let slot = match group {
            CommGroup::Context => 0,
            CommGroup::Tensor => 1,
            CommGroup::Expert => 2,
        };
        let (l, coord) = (self.l, self.coord);
        self.comm_groups[slot]
            .get_or_insert_with(|| l.s.comm_group(group, coord))
            .clone()
    }

    fn dp_group(&mut self, param: &str) -> Vec<usize> {
        let expert = self.l.t.expert_slices.contains_key(param);
        let (l, coord) = (self.l, self.coord);
        self.dp_groups[usize::from(expert)]
            .get_or_insert_with(|| l.s.replica_group(expert, coord))
            .clone()
    }

    /// Whether the current task has not gathered `key`'s parameter yet
    /// (and now has).
    fn first_gather(&mut self, key: Key) -> bool {
        let name = key.name as usize;
        if self.gathered.len() <= name {
            self.gathered.resize(name + 1, 0);
        }
        std::mem::replace(&mut self.gathered[name], self.tasks) != self.tasks
    }

    /// Appends `instr`, which reads `key`.
    fn push_use(&mut self, instr: Instr, key: Key) {
        self.lifetimes.used(key, self.out.len());
        self.out.push(instr);
    }

    /// Appends `instr`, which defines `key`.
    fn push_def(&mut self, instr: Instr, key: Key) {
        self.lifetimes.defined(key, self.out.len());
        self.out.push(instr);
    }

    fn task(&mut self, task: Task) -> Result<(), LowerError> {
        let l = self.l;
        let vs = l.task_stage(task, self.coord);
        self.tasks += 1;
        let runs = self.task_runs(vs, task.phase);
        if self.zero3() {
            // Weights are gathered ahead in the order the task runs its nodes.
            self.segments = l.segments(runs.iter().map(|&(node, _)| node));
        }
        for (node, recompute) in runs {
            self.compute(node, task.micro_batch, recompute)?;
        }
        Ok(())
    }

    /// The nodes a task of `vs`'s `phase` runs, in order, each with whether
    /// it is a forward node run again. A layer's forward nodes are run again
    /// just before its backward pass reaches it (per-layer checkpointing, as
    /// Megatron-LM does), so one layer's recomputed activations are live at
    /// a time; those outside the layers first.
    fn task_runs(&self, vs: usize, phase: Phase) -> Vec<(NodeIndex, bool)> {
        let l = self.l;
        let mut redo: Vec<(Option<usize>, NodeIndex)> = match phase {
            Phase::Backward => l.recomputed(vs).map(|n| (l.layer(n), n)).collect(),
            Phase::Forward => Vec::new(),
        };
        let mut runs: Vec<(NodeIndex, bool)> = redo
            .iter()
            .filter(|(layer, _)| layer.is_none())
            .map(|&(_, n)| (n, true))
            .collect();
        redo.retain(|(layer, _)| layer.is_some());
        for &node in l.stage_nodes(vs, phase) {
            if let Some(layer) = l.layer(node).filter(|_| !redo.is_empty()) {
                runs.extend(
                    redo.iter()
                        .filter(|(at, _)| *at == Some(layer))
                        .map(|&(_, n)| (n, true)),
                );
                redo.retain(|(at, _)| *at != Some(layer));
            }
            runs.push((node, false));
        }
        runs
    }

    /// Node `node` on micro-batch `mb`, after what its inputs need (ZeRO-3
    /// gathers each parameter once per task), then the sends, loss report
    /// and gradient accumulation of its outputs unless it is `recompute`d.
    fn compute(&mut self, node: NodeIndex, mb: usize, recompute: bool) -> Result<(), LowerError> {
        let l = self.l;
        let g = &l.t.graph;
        let n = g.node(node);
        let zero3 = self.zero3();
        for &x in n.inputs.iter().flatten() {
            let tensor = g.tensor(x);
            match tensor.role {
                Role::Constant => {}
                Role::Parameter if zero3 => self.gather_ahead(l.key(x, None), &tensor.name),
                Role::Parameter => {}
                _ => self.ensure(x, mb)?,
            }
        }
        let at = self.out.len();
        for &x in n.inputs.iter().flatten() {
            match g.tensor(x).role {
                Role::Constant => {}
                Role::Parameter if !zero3 => {}
                Role::Parameter => self.lifetimes.used(l.key(x, None), at),
                _ => self.lifetimes.used(l.key(x, Some(mb)), at),
            }
        }
        for &o in &n.outputs {
            self.lifetimes.defined(l.key(o, Some(mb)), at);
        }
        let instr = match &n.op {
            Op::Comm {
                kind, axis, group, ..
            } => {
                let input = n.inputs.first().copied().flatten().ok_or_else(|| {
                    LowerError::Internal(format!("communication node '{}' has no input", n.name))
                })?;
                let rank = g.tensor(input).ty.shape.rank() as i64;
                Instr::Collective {
                    node: n.name.clone(),
                    micro_batch: mb,
                    kind: *kind,
                    axis: if *axis < 0 {
                        (axis + rank) as usize
                    } else {
                        *axis as usize
                    },
                    group: self.comm_group(*group),
                }
            }
            _ => Instr::Compute {
                node: n.name.clone(),
                micro_batch: mb,
            },
        };
        self.out.push(instr);
        if recompute {
            return Ok(());
        }
        for &o in &n.outputs {
            let name = &g.tensor(o).name;
            let key = l.key(o, Some(mb));
            let mut targets: Vec<usize> = l
                .consumers
                .get(o.index())
                .iter()
                .map(|&vs| self.stage_rank(vs))
                .filter(|&r| r != self.rank)
                .collect();
            targets.sort_unstable();
            targets.dedup();
            for to in targets {
                let buf = Buf::of(name, mb);
                self.push_use(Instr::Send { buf, to }, key);
            }
            if l.loss == Some(key.name) && self.coord.tp == 0 && self.coord.cp == 0 {
                let buf = Buf::of(name, mb);
                self.push_use(Instr::ReportLoss { buf }, key);
            }
            if let Some(&Some((param, grad))) = l.accumulates.get(key.name as usize) {
                self.gradient(param, mb, grad.map(|name| Key { name, ..key }));
            }
        }
        Ok(())
    }

    /// Makes `x` of micro-batch `mb` available: loaded, received, or
    /// already computed here.
    fn ensure(&mut self, x: TensorId, mb: usize) -> Result<(), LowerError> {
        let l = self.l;
        let key = l.key(x, Some(mb));
        if self.lifetimes.is_defined(key) {
            return Ok(());
        }
        let g = &l.t.graph;
        let name = &g.tensor(x).name;
        let buf = Buf::of(name, mb);
        if let Some(Some(feed)) = l.feeds.get(x.index()).copied() {
            let rows_per_replica = l.s.micro_batch * l.s.micro_batches;
            let start = self.coord.dp * rows_per_replica + mb * l.s.micro_batch;
            let rows = (start, start + l.s.micro_batch);
            self.push_def(Instr::Load { buf, feed, rows }, key);
            return Ok(());
        }
        let producer = g
            .producer(x)
            .ok_or_else(|| LowerError::Internal(format!("tensor '{name}' has no producer")))?;
        let &(vs, _) =
            l.part.place.get(&producer).ok_or_else(|| {
                LowerError::Internal(format!("the producer of '{name}' has no pipeline stage"))
            })?;
        let from = self.stage_rank(vs);
        if from == self.rank {
            return Err(LowerError::Internal(format!(
                "rank {}: {buf} is used before it is computed (schedule order)",
                self.rank
            )));
        }
        self.push_def(Instr::Recv { buf, from }, key);
        Ok(())
    }
}

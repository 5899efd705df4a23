//! Emission of each rank's instruction list: the schedule's tasks become
//! loads, receives, node computations and sends; then come the gradient
//! reduction, optimizer and parameter traffic the ZeRO stage asks for; a
//! last pass frees every micro-batch buffer after its last use.

use super::partition::Partition;
use super::program::{Buf, Coord, Instr, ParamSlot, Program, Reduction, Shard};
use super::schedule::{stage_order, Phase, Task};
use super::strategy::Strategy;
use super::training::{Feed, TrainingGraph};
use super::LowerError;
use autopar_cost_models::Recompute;
use autopar_ir::{CommGroup, NodeIndex, Op, OpClass, Role, TensorId};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Facts about the training graph shared by every rank's emission.
pub(super) struct Layout<'a> {
    pub t: &'a TrainingGraph,
    pub s: &'a Strategy,
    pub part: &'a Partition,
    /// Virtual stages that consume each tensor.
    consumers: HashMap<TensorId, BTreeSet<usize>>,
    feeds: HashMap<TensorId, Feed>,
    /// Gradient tensor → parameter, and back.
    grad_of: HashMap<String, String>,
    grad_tensor: HashMap<String, String>,
    /// Virtual stages that use each parameter, and the one that owns its gradient.
    param_users: BTreeMap<String, BTreeSet<usize>>,
    param_owner: HashMap<String, usize>,
}

impl<'a> Layout<'a> {
    pub fn new(t: &'a TrainingGraph, s: &'a Strategy, part: &'a Partition) -> Layout<'a> {
        let g = &t.graph;
        let mut consumers: HashMap<TensorId, BTreeSet<usize>> = HashMap::new();
        let mut param_users: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
        for (&i, &(vs, _)) in &part.place {
            for &x in g.node(i).inputs.iter().flatten() {
                consumers.entry(x).or_default().insert(vs);
                let tensor = g.tensor(x);
                if tensor.role == Role::Parameter {
                    param_users.entry(tensor.name.clone()).or_default().insert(vs);
                }
            }
        }
        let id_of: HashMap<&str, TensorId> = g.tensors().map(|(id, t)| (t.name.as_str(), id)).collect();
        let feeds = t
            .feeds
            .iter()
            .filter_map(|(n, f)| id_of.get(n.as_str()).map(|&id| (id, *f)))
            .collect();
        let grad_of: HashMap<String, String> = t
            .gradients
            .iter()
            .map(|(p, gr)| (gr.clone(), p.clone()))
            .collect();
        let grad_tensor: HashMap<String, String> = t.gradients.iter().cloned().collect();
        let mut param_owner = HashMap::new();
        for (p, grad) in &t.gradients {
            if let Some(node) = id_of.get(grad.as_str()).and_then(|&id| g.producer(id)) {
                param_owner.insert(p.clone(), part.place[&node].0);
            }
        }
        Layout {
            t,
            s,
            part,
            consumers,
            feeds,
            grad_of,
            grad_tensor,
            param_users,
            param_owner,
        }
    }

    /// The physical rank running virtual stage `vs` in `coord`'s data-parallel replica.
    fn rank_of_vs(&self, vs: usize, coord: Coord) -> usize {
        self.s.rank_of(Coord {
            pp: vs % self.s.pp,
            ..coord
        })
    }

    /// The ranks of `coord`'s `group`, in order.
    fn comm_group(&self, group: CommGroup, coord: Coord) -> Vec<usize> {
        let s = self.s;
        match group {
            CommGroup::Context => (0..s.cp).map(|cp| s.rank_of(Coord { cp, ..coord })).collect(),
            CommGroup::Tensor => (0..s.tp).map(|tp| s.rank_of(Coord { tp, ..coord })).collect(),
            // Expert-parallel groups are runs of `ep` consecutive data-parallel ranks.
            CommGroup::Expert => {
                let first = coord.dp / s.ep * s.ep;
                (first..first + s.ep)
                    .map(|dp| s.rank_of(Coord { dp, ..coord }))
                    .collect()
            }
        }
    }

    /// The ranks that hold copies of `coord`'s weights and sum their
    /// gradients: data-parallel replicas and context-parallel ranks, in (dp, cp) order.
    /// Expert weights (split over an expert-parallel group) have copies only
    /// on the data-parallel ranks at the same place in their own groups.
    fn dp_group(&self, param: &str, coord: Coord) -> Vec<usize> {
        let s = self.s;
        let expert = self.t.expert_slices.contains_key(param);
        (0..s.dp)
            .filter(|dp| !expert || dp % s.ep == coord.dp % s.ep)
            .flat_map(|dp| (0..s.cp).map(move |cp| Coord { dp, cp, ..coord }))
            .map(|c| s.rank_of(c))
            .collect()
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
        let mut e = Emitter {
            l: self,
            coord,
            rank,
            out: Vec::new(),
            defined: HashSet::new(),
        };
        for task in &order {
            e.task(*task)?;
        }
        let params = e.optimizer()?;
        let instructions = free_after_last_use(self, e.out);
        Ok(Program {
            rank,
            coord,
            params,
            instructions,
        })
    }
}

struct Emitter<'l, 'a> {
    l: &'l Layout<'a>,
    coord: Coord,
    rank: usize,
    out: Vec<Instr>,
    defined: HashSet<Buf>,
}

impl Emitter<'_, '_> {
    fn zero3(&self) -> bool {
        self.l.s.zero == 3
    }

    fn task(&mut self, task: Task) -> Result<(), LowerError> {
        let vs = task.chunk * self.l.s.pp + self.coord.pp;
        let mb = task.micro_batch;
        let mut gathered = HashSet::new();
        if task.phase == Phase::Backward {
            for node in self.recomputed(vs) {
                self.compute(node, mb, true, &mut gathered)?;
            }
        }
        let nodes = self
            .l
            .part
            .groups
            .get(&(vs, task.phase))
            .cloned()
            .unwrap_or_default();
        for node in nodes {
            self.compute(node, mb, false, &mut gathered)?;
        }
        Ok(())
    }

    /// Forward nodes of `vs` that its backward phase runs again.
    fn recomputed(&self, vs: usize) -> Vec<NodeIndex> {
        let policy = self.l.s.recompute[vs % self.l.s.pp];
        let g = &self.l.t.graph;
        let forward = self
            .l
            .part
            .groups
            .get(&(vs, Phase::Forward))
            .cloned()
            .unwrap_or_default();
        match policy {
            Recompute::None => Vec::new(),
            Recompute::Full => forward,
            Recompute::Selective => forward
                .into_iter()
                .filter(|&i| g.node(i).op.class() == OpClass::Attention)
                .collect(),
        }
    }

    fn compute(
        &mut self,
        node: NodeIndex,
        mb: usize,
        recompute: bool,
        gathered: &mut HashSet<String>,
    ) -> Result<(), LowerError> {
        let g = &self.l.t.graph;
        let n = g.node(node);
        for &x in n.inputs.iter().flatten() {
            let tensor = g.tensor(x);
            match tensor.role {
                Role::Constant => {}
                Role::Parameter => {
                    if self.zero3() && gathered.insert(tensor.name.clone()) {
                        let group = self.l.dp_group(&tensor.name, self.coord);
                        self.out.push(Instr::GatherParam {
                            param: tensor.name.clone(),
                            group,
                        });
                    }
                }
                _ => self.ensure(x, mb)?,
            }
        }
        self.out.push(match &n.op {
            Op::Comm {
                kind, axis, group, ..
            } => {
                let rank = g.tensor(n.inputs[0].expect("comm input")).ty.shape.rank() as i64;
                Instr::Collective {
                    node: n.name.clone(),
                    micro_batch: mb,
                    kind: *kind,
                    axis: if *axis < 0 {
                        (axis + rank) as usize
                    } else {
                        *axis as usize
                    },
                    group: self.l.comm_group(*group, self.coord),
                }
            }
            _ => Instr::Compute {
                node: n.name.clone(),
                micro_batch: mb,
            },
        });
        for &o in &n.outputs {
            let name = &g.tensor(o).name;
            let buf = Buf::of(name, mb);
            self.defined.insert(buf.clone());
            if recompute {
                continue;
            }
            let targets: BTreeSet<usize> = self
                .l
                .consumers
                .get(&o)
                .into_iter()
                .flatten()
                .map(|&vs| self.l.rank_of_vs(vs, self.coord))
                .filter(|&r| r != self.rank)
                .collect();
            for to in targets {
                self.out.push(Instr::Send { buf: buf.clone(), to });
            }
            if *name == self.l.t.loss && self.coord.tp == 0 && self.coord.cp == 0 {
                self.out.push(Instr::ReportLoss { buf: buf.clone() });
            }
            if let Some(param) = self.l.grad_of.get(name) {
                self.out.push(Instr::AccumulateGrad {
                    param: param.clone(),
                    micro_batch: mb,
                });
            }
        }
        Ok(())
    }

    /// Makes `x` of micro-batch `mb` available: loaded, received, or
    /// already computed here.
    fn ensure(&mut self, x: TensorId, mb: usize) -> Result<(), LowerError> {
        let g = &self.l.t.graph;
        let name = &g.tensor(x).name;
        let buf = Buf::of(name, mb);
        if self.defined.contains(&buf) {
            return Ok(());
        }
        if let Some(&feed) = self.l.feeds.get(&x) {
            let rows_per_replica = self.l.s.micro_batch * self.l.s.micro_batches;
            let start = self.coord.dp * rows_per_replica + mb * self.l.s.micro_batch;
            self.out.push(Instr::Load {
                buf: buf.clone(),
                feed,
                rows: (start, start + self.l.s.micro_batch),
            });
        } else {
            let producer = g
                .producer(x)
                .ok_or_else(|| LowerError::Internal(format!("tensor '{name}' has no producer")))?;
            let from = self.l.rank_of_vs(self.l.part.place[&producer].0, self.coord);
            if from == self.rank {
                return Err(LowerError::Internal(format!(
                    "rank {}: {buf} is used before it is computed (schedule order)",
                    self.rank
                )));
            }
            self.out.push(Instr::Recv {
                buf: buf.clone(),
                from,
            });
        }
        self.defined.insert(buf);
        Ok(())
    }

    /// The reduction, optimizer step and gather of one parameter the ZeRO
    /// stage asks for: ZeRO-0 all-reduces and steps the whole parameter;
    /// ZeRO-1 all-reduces, steps its shard and all-gathers the weights;
    /// ZeRO-2 reduce-scatters instead; ZeRO-3 keeps only the shard.
    fn update(&mut self, param: &str, group: &[usize], shard: Option<Shard>) {
        let s = self.l.s;
        let p = param.to_string();
        if group.len() == 1 {
            self.out.push(Instr::OptimizerStep {
                param: p,
                shard: None,
            });
            return;
        }
        let group = group.to_vec();
        self.out.push(match s.zero {
            0 => Instr::AllReduceGrad {
                param: p.clone(),
                group: group.clone(),
                reduction: s.reduction,
            },
            1 => Instr::AllReduceGrad {
                param: p.clone(),
                group: group.clone(),
                reduction: Reduction::Ring,
            },
            _ => Instr::ReduceScatterGrad {
                param: p.clone(),
                group: group.clone(),
            },
        });
        self.out.push(Instr::OptimizerStep {
            param: p.clone(),
            shard,
        });
        if s.zero == 1 || s.zero == 2 {
            self.out.push(Instr::AllGatherParam { param: p, group });
        }
    }

    /// Gradient reduction, optimizer steps and parameter traffic after the
    /// last backward pass; returns the parameters this rank holds.
    fn optimizer(&mut self) -> Result<Vec<ParamSlot>, LowerError> {
        let s = self.l.s;
        let my_vs: BTreeSet<usize> = (0..s.chunks).map(|c| c * s.pp + self.coord.pp).collect();
        let mut slots = Vec::new();
        for (original, copy) in &self.l.t.tied {
            let owners: BTreeMap<usize, Vec<String>> = [original, copy]
                .into_iter()
                .filter_map(|p| {
                    let vs = *self.l.param_owner.get(p)?;
                    Some((self.l.rank_of_vs(vs, self.coord), p.clone()))
                })
                .fold(BTreeMap::new(), |mut m, (r, p)| {
                    m.entry(r).or_insert_with(Vec::new).push(p);
                    m
                });
            if let Some(params) = owners.get(&self.rank) {
                self.out.push(Instr::SumTiedGrads {
                    key: original.clone(),
                    params: params.clone(),
                    group: owners.keys().copied().collect(),
                });
            }
        }
        let mut receives = Vec::new();
        for (param, users) in &self.l.param_users {
            if users.is_disjoint(&my_vs) {
                continue;
            }
            let group = self.l.dp_group(param, self.coord);
            let shard = (s.zero > 0).then(|| Shard {
                index: group.iter().position(|&r| r == self.rank).unwrap_or(0),
                parts: group.len(),
            });
            slots.push(ParamSlot {
                name: param.clone(),
                stored_shard: if s.zero == 3 { shard } else { None },
            });
            let Some(&owner_vs) = self.l.param_owner.get(param) else {
                continue;
            };
            let holders: BTreeSet<usize> = users
                .iter()
                .map(|&vs| self.l.rank_of_vs(vs, self.coord))
                .collect();
            let owner = self.l.rank_of_vs(owner_vs, self.coord);
            if holders.len() > 1 && s.zero == 3 {
                return Err(LowerError::Unsupported(format!(
                    "parameter '{param}' is used on two pipeline stages; ZeRO-3 with weights shared across stages"
                )));
            }
            if owner != self.rank {
                receives.push(Instr::RecvParam {
                    param: param.clone(),
                    from: owner,
                });
                continue;
            }
            let p = param.clone();
            self.update(&p, &group, shard);
            for &to in holders.iter().filter(|&&r| r != self.rank) {
                self.out.push(Instr::SendParam { param: p.clone(), to });
            }
        }
        self.out.extend(receives);
        Ok(slots)
    }
}

/// Inserts a `Free` after the last use of every definition of a
/// micro-batch buffer (and of gathered parameters), so the program itself
/// states each buffer's lifetime.
fn free_after_last_use(l: &Layout, instructions: Vec<Instr>) -> Vec<Instr> {
    let g = &l.t.graph;
    let by_name: HashMap<&str, NodeIndex> = g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect();
    // For every instruction: the buffers it defines and uses.
    let mut last_use: HashMap<usize, usize> = HashMap::new(); // def index → last index using it
    let mut current: HashMap<Buf, usize> = HashMap::new();
    let zero3 = l.s.zero == 3;
    let mut frees_at: BTreeMap<usize, Vec<Buf>> = BTreeMap::new();
    for (i, instr) in instructions.iter().enumerate() {
        let (defs, uses) = defs_and_uses(instr, g, &by_name, zero3, &l.grad_tensor);
        for b in uses {
            if let Some(&d) = current.get(&b) {
                last_use.insert(d, i);
            }
        }
        for b in defs {
            if let Some(prev) = current.insert(b.clone(), i) {
                let at = last_use.get(&prev).copied().unwrap_or(prev);
                frees_at.entry(at).or_default().push(b.clone());
            }
        }
    }
    for (b, d) in current {
        let at = last_use.get(&d).copied().unwrap_or(d);
        frees_at.entry(at).or_default().push(b);
    }
    let mut out = Vec::with_capacity(instructions.len() * 2);
    for (i, instr) in instructions.into_iter().enumerate() {
        out.push(instr);
        if let Some(mut bufs) = frees_at.remove(&i) {
            bufs.sort();
            out.extend(bufs.into_iter().map(|buf| Instr::Free { buf }));
        }
    }
    out
}

fn defs_and_uses(
    instr: &Instr,
    g: &autopar_ir::Graph,
    by_name: &HashMap<&str, NodeIndex>,
    zero3: bool,
    grad_tensor: &HashMap<String, String>,
) -> (Vec<Buf>, Vec<Buf>) {
    match instr {
        Instr::Load { buf, .. } | Instr::Recv { buf, .. } => (vec![buf.clone()], vec![]),
        Instr::Send { buf, .. } | Instr::ReportLoss { buf } => (vec![], vec![buf.clone()]),
        Instr::GatherParam { param, .. } => (vec![Buf::step(param)], vec![]),
        Instr::AccumulateGrad { param, micro_batch } => {
            let uses = grad_tensor.get(param).map(|gr| Buf::of(gr, *micro_batch));
            (vec![], uses.into_iter().collect())
        }
        Instr::Compute { node, micro_batch }
        | Instr::Collective {
            node, micro_batch, ..
        } => {
            let n = g.node(by_name[node.as_str()]);
            let uses = n
                .inputs
                .iter()
                .flatten()
                .filter_map(|&x| {
                    let t = g.tensor(x);
                    match t.role {
                        Role::Constant => None,
                        Role::Parameter => zero3.then(|| Buf::step(&t.name)),
                        _ => Some(Buf::of(&t.name, *micro_batch)),
                    }
                })
                .collect();
            let defs = n
                .outputs
                .iter()
                .map(|&o| Buf::of(&g.tensor(o).name, *micro_batch))
                .collect();
            (defs, uses)
        }
        _ => (vec![], vec![]),
    }
}

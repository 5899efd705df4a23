//! A rank's program turned into what the replay needs: per instruction its
//! lane (compute or communication), duration, the buffers it reads and
//! writes as dense slots, and what it waits on across ranks. Compiled once,
//! each program can then be dropped, so thousands of ranks fit in memory.

use super::pricing::{type_bytes, Pricing};
use super::ranks::Representatives;
use autopar_cost_models::comm::{Algorithm, Collective};
use autopar_cost_models::GradCompression;
use autopar_ir::{CommGroup, DType, Graph, Op};
use autopar_lower::program::{operands, Operand, Payload, Transfer};
use autopar_lower::{Buf, Instr, Program};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

/// Which stream of a rank an instruction occupies. Collectives of
/// different communicators run concurrently (as NCCL's do), so tensor-
/// parallel collectives, pipeline transfers and gradient traffic each have
/// a stream of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Compute,
    /// Tensor-, context- and expert-parallel collectives.
    Collective,
    /// Pipeline sends (activations, gradients, shared weights).
    Transfer,
    /// Data-parallel gradient reduction and parameter gathers.
    Gradient,
    /// Bookkeeping and receives: takes no stream time of its own.
    None,
}

impl Lane {
    /// The lane's index among the timed lanes.
    pub fn index(self) -> Option<usize> {
        match self {
            Lane::Compute => Some(0),
            Lane::Collective => Some(1),
            Lane::Transfer => Some(2),
            Lane::Gradient => Some(3),
            Lane::None => None,
        }
    }
}

/// What a stretch of a rank's time is spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Activity {
    Forward,
    Backward,
    Recompute,
    /// Optimizer steps and gradient accumulation.
    Optimizer,
    /// Data loads and other small passes.
    Other,
    /// Tensor-parallel collectives (and what waits on them).
    TensorComm,
    ContextComm,
    ExpertComm,
    /// Gradient reduction and parameter gathers across replicas.
    DataComm,
    /// Pipeline transfers and waiting on other stages.
    Pipeline,
}

impl Activity {
    /// Every activity, in the order reports list them.
    pub const ALL: [Activity; 10] = [
        Activity::Forward,
        Activity::Backward,
        Activity::Recompute,
        Activity::Optimizer,
        Activity::Other,
        Activity::TensorComm,
        Activity::ContextComm,
        Activity::ExpertComm,
        Activity::DataComm,
        Activity::Pipeline,
    ];

    /// The activity as reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Activity::Forward => "forward",
            Activity::Backward => "backward",
            Activity::Recompute => "recompute",
            Activity::Optimizer => "optimizer",
            Activity::Other => "other",
            Activity::TensorComm => "tensor-parallel comm",
            Activity::ContextComm => "context-parallel comm",
            Activity::ExpertComm => "expert-parallel comm",
            Activity::DataComm => "data-parallel comm",
            Activity::Pipeline => "pipeline",
        }
    }

    /// The activity's character in the terminal timeline.
    pub fn symbol(self) -> char {
        match self {
            Activity::Forward => 'F',
            Activity::Backward => 'B',
            Activity::Recompute => 'R',
            Activity::Optimizer => 'O',
            Activity::Other => '-',
            Activity::TensorComm => 't',
            Activity::ContextComm => 'c',
            Activity::ExpertComm => 'e',
            Activity::DataComm => 'd',
            Activity::Pipeline => '.',
        }
    }

    /// Moving data between ranks rather than computing.
    pub fn is_communication(self) -> bool {
        matches!(
            self,
            Activity::TensorComm
                | Activity::ContextComm
                | Activity::ExpertComm
                | Activity::DataComm
                | Activity::Pipeline
        )
    }
}

/// How an instruction synchronises with other ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    Local,
    /// Sends a message (`key`) to representative `to`.
    Send {
        to: u32,
        key: MessageKey,
    },
    /// Waits for message `key` from representative `from`.
    Recv {
        from: u32,
        key: MessageKey,
    },
    /// A collective over representative set `group` of `size` classes
    /// (two or more): starts when all arrive.
    Meet {
        group: u32,
        size: u32,
    },
    /// Releases buffer `slot`.
    Free {
        slot: u32,
    },
}

/// A message between two stages: the tensor and micro-batch it carries.
pub type MessageKey = (u32, u32);

/// One compiled instruction.
#[derive(Debug, Clone)]
pub struct Step {
    pub lane: Lane,
    pub activity: Activity,
    pub seconds: f64,
    /// Moves bytes over its rank's inter-node link, which the rank's steps
    /// on other lanes share.
    pub inter_node: bool,
    pub sync: Sync,
    reads: (u32, u16),
    writes: (u32, u16),
}

#[cfg(test)]
impl Step {
    /// A step that reads and writes nothing and waits on no peer.
    pub(crate) fn local(lane: Lane, seconds: f64, inter_node: bool) -> Step {
        Step {
            lane,
            activity: Activity::Other,
            seconds,
            inter_node,
            sync: Sync::Local,
            reads: (0, 0),
            writes: (0, 0),
        }
    }
}

/// A compiled program.
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    pub rank: usize,
    pub steps: Vec<Step>,
    slots: Vec<u32>,
    /// Bytes of each buffer slot (0 for those not counted as activations).
    pub slot_bytes: Vec<f64>,
    /// Per slot: the slot whose memory it shares (its node's output is its
    /// input, [`Op::passes_input`]), [`RESIDENT`] where that input is a
    /// weight held all step, else `u32::MAX`.
    pub alias_of: Vec<u32>,
    /// Weights, gradients and optimizer state held all step.
    pub static_bytes: f64,
    /// Each step's description, when asked for (traces).
    pub labels: Vec<String>,
}

impl Compiled {
    /// The slots step `i` reads.
    pub fn reads(&self, s: &Step) -> &[u32] {
        &self.slots[s.reads.0 as usize..s.reads.0 as usize + s.reads.1 as usize]
    }

    /// The slots step `i` writes.
    pub fn writes(&self, s: &Step) -> &[u32] {
        &self.slots[s.writes.0 as usize..s.writes.0 as usize + s.writes.1 as usize]
    }
}

/// What a data-parallel collective reads of each of its parameters.
#[derive(Clone, Copy)]
enum Read {
    Nothing,
    /// The parameter's own buffer (`GRADIENT` or `UPDATED`).
    Own(u32),
    /// Its gradient of this micro-batch (ZeRO-2/3's reduce-scatters).
    Gradient(u32),
}

/// [`Compiled::alias_of`] of a node passing on a weight held all step: no memory of its own.
pub const RESIDENT: u32 = u32::MAX - 1;

/// Buffers that are not a micro-batch's: what each of a parameter's per-step buffers holds.
const GATHERED: u32 = u32::MAX;
const GRADIENT: u32 = u32::MAX - 1;
const UPDATED: u32 = u32::MAX - 2;

/// Facts about the training graph every rank's compilation shares.
pub struct GraphIndex<'g> {
    g: &'g Graph,
    tensor_id: HashMap<&'g str, u32>,
    tensor_bytes: Vec<f64>,
    tensor_dtype: Vec<DType>,
    /// Each tensor's first dim (1 for a scalar).
    rows: Vec<usize>,
    node: HashMap<&'g str, NodeFacts>,
    /// Gradient tensor of each parameter, by parameter tensor id.
    gradient: HashMap<u32, u32>,
    zero3: bool,
    /// Gradients kept as shards (ZeRO-2 and 3).
    sharded_grads: bool,
}

struct NodeFacts {
    inputs: Vec<u32>,
    params: Vec<u32>,
    outputs: Vec<u32>,
    forward: bool,
    /// The group a communication node runs over.
    comm: Option<CommGroup>,
    /// Its output is its input ([`Op::passes_input`]): they share memory.
    passes_input: bool,
    /// Seconds of one micro-batch (computations).
    seconds: f64,
}

impl<'g> GraphIndex<'g> {
    /// Indexes `t`'s graph for a plan with ZeRO stage `zero`, with each
    /// node's seconds from `pricing`.
    pub fn new(t: &'g autopar_lower::TrainingGraph, zero: u8, pricing: &Pricing) -> GraphIndex<'g> {
        let g = &t.graph;
        let mut tensor_id = HashMap::default();
        let mut tensor_bytes = Vec::new();
        let mut tensor_dtype = Vec::new();
        let mut rows = Vec::new();
        let mut index_of = HashMap::default();
        for (id, tensor) in g.tensors() {
            let i = tensor_bytes.len() as u32;
            tensor_id.insert(tensor.name.as_str(), i);
            index_of.insert(id, i);
            tensor_bytes.push(type_bytes(&tensor.ty, g));
            tensor_dtype.push(tensor.ty.dtype);
            rows.push(tensor.ty.shape.0.first().and_then(|d| d.fixed()).unwrap_or(1));
        }
        let forward: HashSet<&str> = t.forward.iter().map(String::as_str).collect();
        let mut node = HashMap::default();
        for i in g.node_indices() {
            let n = g.node(i);
            let (mut inputs, mut params) = (Vec::new(), Vec::new());
            for x in operands(g, n) {
                match x {
                    Operand::Param(x) => params.push(index_of[&x]),
                    Operand::Buffer(x) => inputs.push(index_of[&x]),
                }
            }
            let comm = match &n.op {
                Op::Comm { group, .. } => Some(*group),
                _ => None,
            };
            node.insert(
                n.name.as_str(),
                NodeFacts {
                    inputs,
                    params,
                    outputs: n.outputs.iter().map(|o| index_of[o]).collect(),
                    forward: forward.contains(n.name.as_str()),
                    comm,
                    passes_input: n.op.passes_input(),
                    seconds: pricing.node(&n.name),
                },
            );
        }
        let gradient = t
            .gradients
            .iter()
            .filter_map(|(p, gr)| Some((*tensor_id.get(p.as_str())?, *tensor_id.get(gr.as_str())?)))
            .collect();
        GraphIndex {
            g,
            tensor_id,
            tensor_bytes,
            tensor_dtype,
            rows,
            node,
            gradient,
            zero3: zero == 3,
            sharded_grads: zero >= 2,
        }
    }

    fn tensor(&self, name: &str) -> u32 {
        self.tensor_id.get(name).copied().unwrap_or(u32::MAX)
    }

    fn bytes(&self, tensor: u32) -> f64 {
        self.tensor_bytes.get(tensor as usize).copied().unwrap_or(0.0)
    }

    fn elements(&self, tensor: u32) -> f64 {
        let dtype = self.dtype(tensor);
        self.bytes(tensor) * 8.0 / dtype.size_bits() as f64
    }

    /// A parameter's `(rows, cols)` view: its first dim by the rest.
    fn matrix(&self, tensor: u32) -> (usize, usize) {
        let elements = self.elements(tensor).round() as usize;
        let rows = self.rows.get(tensor as usize).copied().unwrap_or(1).max(1);
        (rows, elements / rows)
    }

    fn dtype(&self, tensor: u32) -> DType {
        self.tensor_dtype
            .get(tensor as usize)
            .copied()
            .unwrap_or(DType::F32)
    }

    /// The graph the index was built from.
    pub fn graph(&self) -> &Graph {
        self.g
    }
}

/// Compiles `p` (a representative rank's program) against `index` and `pricing`.
pub struct Compiler<'c, 'g> {
    pub index: &'c GraphIndex<'g>,
    pub pricing: &'c Pricing<'c>,
    pub reps: &'c Representatives,
    pub labels: bool,
    /// Micro-batches per step (buffers are laid out per micro-batch).
    pub micro_batches: usize,
}

/// Builds one program's compiled form.
struct Builder<'c, 'g> {
    c: &'c Compiler<'c, 'g>,
    out: Compiled,
    /// First slot of each tensor's block: one slot per micro-batch, then
    /// its gathered, gradient and updated per-step buffers.
    base: Vec<u32>,
    stride: u32,
    /// Slots some instruction has written (a second write is a recomputation).
    written: Vec<bool>,
    scratch: Vec<u32>,
    /// Parts of each parameter this rank's optimizer updates (1: all of it).
    updates: HashMap<u32, f64>,
    /// Whether the instruction being compiled runs on the runtime's
    /// communication stream ([`Instr::overlaps_compute`]).
    overlapped: bool,
}

/// A step's stand-alone seconds, and whether it moves bytes over its rank's
/// inter-node link (local work does not).
#[derive(Clone, Copy)]
struct Busy {
    seconds: f64,
    inter_node: bool,
}

impl From<f64> for Busy {
    fn from(seconds: f64) -> Busy {
        Busy {
            seconds,
            inter_node: false,
        }
    }
}

impl Builder<'_, '_> {
    fn slot(&mut self, tensor: u32, mb: u32) -> u32 {
        let m = self.stride - 3;
        let offset = match mb {
            GATHERED => m,
            GRADIENT => m + 1,
            UPDATED => m + 2,
            mb => mb.min(m - 1),
        };
        let t = (tensor as usize).min(self.base.len() - 1);
        if self.base[t] == u32::MAX {
            self.base[t] = self.out.slot_bytes.len() as u32;
            let bytes = self.c.index.bytes(tensor);
            // Micro-batch buffers and gathered weights count as live memory;
            // gradients and updated weights are part of the model state.
            self.out
                .slot_bytes
                .extend((0..self.stride).map(|i| if i <= m { bytes } else { 0.0 }));
            self.written.extend((0..self.stride).map(|_| false));
            self.out.alias_of.extend((0..self.stride).map(|_| u32::MAX));
        }
        self.base[t] + offset
    }

    fn buf(&mut self, b: &Buf) -> u32 {
        let t = self.c.index.tensor(&b.tensor);
        match b.micro_batch {
            Some(mb) => self.slot(t, mb as u32),
            None => self.slot(t, GATHERED),
        }
    }

    fn push(
        &mut self,
        lane: Lane,
        activity: Activity,
        busy: impl Into<Busy>,
        sync: Sync,
        reads: &[u32],
        writes: &[u32],
    ) {
        let Busy { seconds, inter_node } = busy.into();
        // An interpreter runs a rank's instructions one after another on
        // one thread, but for the collectives its communication worker
        // overlaps: every other timed instruction takes the compute lane.
        // Each instruction also costs it some bookkeeping.
        // Data-parallel traffic runs beside the computation exactly where
        // the program says its instruction does ([`Instr::overlaps_compute`],
        // which the backends follow too); elsewhere it holds the compute lane.
        let lane = match lane {
            Lane::Gradient if !self.overlapped => Lane::Compute,
            lane => lane,
        };
        let (lane, seconds) = if self.c.pricing.serial() {
            let lane = if self.overlapped { lane } else { Lane::Compute };
            (lane, seconds + self.c.pricing.instruction_overhead())
        } else {
            (lane, seconds)
        };
        let r = (self.out.slots.len() as u32, reads.len() as u16);
        self.out.slots.extend_from_slice(reads);
        let w = (self.out.slots.len() as u32, writes.len() as u16);
        self.out.slots.extend_from_slice(writes);
        self.out.steps.push(Step {
            lane,
            activity,
            seconds,
            inter_node,
            sync,
            reads: r,
            writes: w,
        });
    }

    fn meet(&self, group: &[usize]) -> Sync {
        let (group, size) = self.c.reps.group_id(group);
        if size <= 1 {
            Sync::Local
        } else {
            Sync::Meet { group, size }
        }
    }

    /// A collective over a data-parallel group on the gradient lane, priced
    /// as one collective of its parameters' summed bytes (a bucket of
    /// gradients, or one weight): it reads each parameter's `read` buffer
    /// and writes its `write` buffer (`GRADIENT`, `UPDATED` or `GATHERED`).
    fn data_parallel(&mut self, params: &[String], instr: &Instr, read: Read, write: u32) {
        let (Some((collective, algorithm)), Some(group)) = (instr.collective(), instr.group()) else {
            return;
        };
        let ix = self.c.index;
        let (mut reads, mut writes, mut bytes) = (Vec::new(), Vec::with_capacity(params.len()), 0.0);
        let mut shapes = Vec::with_capacity(params.len());
        for param in params {
            let p = ix.tensor(param);
            match read {
                Read::Nothing => {}
                Read::Own(r) => reads.push(self.slot(p, r)),
                Read::Gradient(mb) => {
                    if let Some(&grad) = ix.gradient.get(&p) {
                        reads.push(self.slot(grad, mb));
                    }
                }
            }
            writes.push(self.slot(p, write));
            // A 16-bit reduction sends each element in its type.
            let sent = instr
                .compression()
                .and_then(GradCompression::narrow)
                .map_or(1.0, |wire| {
                    (wire.size_bits() as f64 / ix.dtype(p).size_bits() as f64).min(1.0)
                });
            bytes += ix.bytes(p) * sent;
            shapes.push(ix.matrix(p));
        }
        // A lossy one sends what its calls send, one after another.
        let width = params
            .first()
            .map_or(4.0, |p| ix.dtype(ix.tensor(p)).size_bits() as f64 / 8.0);
        let calls = instr
            .compression()
            .and_then(|c| c.lossy_calls(&shapes, width, group.len()))
            .unwrap_or((collective, vec![bytes]));
        let pricing = self.c.pricing;
        let elements: usize = shapes.iter().map(|&(m, n)| m * n).sum();
        let work = instr
            .compression()
            .filter(|_| group.len() > 1)
            .map_or(0.0, |c| pricing.compression(c, elements as f64, width));
        let seconds = work
            + calls
                .1
                .iter()
                .map(|&b| pricing.collective(calls.0, algorithm, b, group))
                .sum::<f64>();
        let busy = Busy {
            seconds,
            inter_node: self.c.pricing.spans_nodes(group),
        };
        let sync = self.meet(group);
        self.push(Lane::Gradient, Activity::DataComm, busy, sync, &reads, &writes);
    }

    fn instr(&mut self, rank: usize, instr: &Instr) {
        self.overlapped = instr.overlaps_compute();
        let c = self.c;
        let ix = c.index;
        let pr = c.pricing;
        match instr {
            Instr::Load { buf, .. } => {
                let s = self.buf(buf);
                let seconds = pr.streaming(self.out.slot_bytes[s as usize]);
                self.push(Lane::Compute, Activity::Other, seconds, Sync::Local, &[], &[s]);
            }
            Instr::Compute { node, micro_batch }
            | Instr::Collective {
                node, micro_batch, ..
            } => {
                let Some(f) = ix.node.get(node.as_str()) else {
                    return;
                };
                self.node(instr, f, *micro_batch as u32);
            }
            Instr::Send { .. } | Instr::Recv { .. } | Instr::SendParam { .. } | Instr::RecvParam { .. } => {
                if let Some(t) = instr.transfer() {
                    self.transfer(rank, t);
                }
            }
            Instr::Free { buf } => {
                let slot = self.buf(buf);
                self.push(Lane::None, Activity::Other, 0.0, Sync::Free { slot }, &[], &[]);
            }
            Instr::AccumulateGrad { param, micro_batch } => {
                let p = ix.tensor(param);
                let Some(&grad) = ix.gradient.get(&p) else {
                    return;
                };
                let from = self.slot(grad, *micro_batch as u32);
                let acc = self.slot(p, GRADIENT);
                let seconds = pr.accumulation(ix.bytes(grad));
                let (reads, writes) = ([from, acc], [acc]);
                self.push(
                    Lane::Compute,
                    Activity::Optimizer,
                    seconds,
                    Sync::Local,
                    &reads,
                    &writes,
                );
            }
            Instr::SumTiedGrads { params, group, .. } => {
                let slots: Vec<u32> = params.iter().map(|p| self.slot(ix.tensor(p), GRADIENT)).collect();
                let bytes = params.first().map_or(0.0, |p| ix.bytes(ix.tensor(p)));
                let busy = Busy {
                    seconds: pr.collective(Collective::AllReduce, Algorithm::Ring, bytes, group),
                    inter_node: pr.spans_nodes(group),
                };
                let sync = self.meet(group);
                self.push(Lane::Gradient, Activity::DataComm, busy, sync, &slots, &slots);
            }
            Instr::AllReduceGrad { params, .. }
            | Instr::ReduceScatterGrad {
                params,
                micro_batch: None,
                ..
            } => self.data_parallel(params, instr, Read::Own(GRADIENT), GRADIENT),
            Instr::ReduceScatterGrad {
                params,
                micro_batch: Some(mb),
                ..
            } => self.data_parallel(params, instr, Read::Gradient(*mb as u32), GRADIENT),
            Instr::OptimizerStep { param, shard } => {
                let p = ix.tensor(param);
                let acc = self.slot(p, GRADIENT);
                let updated = self.slot(p, UPDATED);
                let parts = shard.map_or(1, |s| s.parts) as f64;
                self.updates.insert(p, parts);
                let seconds = pr.optimizer(ix.elements(p) / parts, ix.dtype(p));
                self.push(
                    Lane::Compute,
                    Activity::Optimizer,
                    seconds,
                    Sync::Local,
                    &[acc],
                    &[updated],
                );
            }
            Instr::AllGatherParams { params, .. } => {
                self.data_parallel(params, instr, Read::Own(UPDATED), UPDATED)
            }
            Instr::GatherParam { param, .. } => {
                self.data_parallel(std::slice::from_ref(param), instr, Read::Nothing, GATHERED)
            }
            Instr::ReportLoss { .. } => return,
        }
        if c.labels {
            self.out.labels.push(instr.describe());
        }
    }

    /// A node of the training graph on micro-batch `mb`: computed, or
    /// (a communication node) run over its group.
    fn node(&mut self, instr: &Instr, f: &NodeFacts, mb: u32) {
        let ix = self.c.index;
        let mut slots = std::mem::take(&mut self.scratch);
        slots.clear();
        for &t in &f.inputs {
            slots.push(self.slot(t, mb));
        }
        if ix.zero3 {
            for &p in &f.params {
                slots.push(self.slot(p, GATHERED));
            }
        }
        let n_reads = slots.len();
        for &t in &f.outputs {
            slots.push(self.slot(t, mb));
        }
        let (reads, writes) = slots.split_at(n_reads);
        let redo = writes.iter().any(|&w| self.written[w as usize]);
        match (f.passes_input, reads, writes) {
            (true, [from], [to]) => self.out.alias_of[*to as usize] = *from,
            // Of a weight every rank holds all step.
            (true, [], [to]) if !f.params.is_empty() => self.out.alias_of[*to as usize] = RESIDENT,
            _ => {}
        }
        for &w in writes {
            self.written[w as usize] = true;
        }
        match (instr.group(), f.comm) {
            (Some(group), Some(which)) => {
                let collective = instr.collective();
                let by_output = match instr {
                    Instr::Collective { kind, .. } => autopar_cost_models::comm::priced_by_output(*kind),
                    _ => false,
                };
                let tensor = match by_output {
                    true => f.outputs.first(),
                    false => f.inputs.first(),
                };
                let seconds = collective.map_or(0.0, |(coll, algorithm)| {
                    let bytes = tensor.map_or(0.0, |&t| ix.bytes(t));
                    self.c.pricing.collective(coll, algorithm, bytes, group)
                });
                let activity = match which {
                    CommGroup::Tensor => Activity::TensorComm,
                    CommGroup::Context => Activity::ContextComm,
                    CommGroup::Expert => Activity::ExpertComm,
                };
                let (lane, sync) = match collective {
                    Some(_) => (Lane::Collective, self.meet(group)),
                    None => (Lane::None, Sync::Local),
                };
                let busy = Busy {
                    seconds,
                    inter_node: collective.is_some() && self.c.pricing.spans_nodes(group),
                };
                self.push(lane, activity, busy, sync, reads, writes);
            }
            _ => {
                let activity = match (f.forward, redo) {
                    (true, false) => Activity::Forward,
                    (true, true) => Activity::Recompute,
                    (false, _) => Activity::Backward,
                };
                self.push(Lane::Compute, activity, f.seconds, Sync::Local, reads, writes);
            }
        }
        self.scratch = slots;
    }

    /// A pipeline transfer (an activation or gradient of a micro-batch, or
    /// a shared weight after its update): the send takes the link's time,
    /// the receive waits for it.
    fn transfer(&mut self, rank: usize, t: Transfer<'_>) {
        let ix = self.c.index;
        let (slot, key, bytes) = match t.payload {
            Payload::Buf(buf) => {
                let s = self.buf(buf);
                (s, message_key(ix, buf), self.out.slot_bytes[s as usize])
            }
            Payload::Param(param) => {
                let p = ix.tensor(param);
                (self.slot(p, UPDATED), (p, UPDATED), ix.bytes(p))
            }
        };
        let peer = self.c.reps.rep_of(t.peer);
        if t.send {
            let busy = Busy {
                seconds: self.c.pricing.transfer(bytes, rank, t.peer),
                inter_node: self.c.pricing.spans_nodes(&[rank, t.peer]),
            };
            let sync = Sync::Send { to: peer, key };
            self.push(Lane::Transfer, Activity::Pipeline, busy, sync, &[slot], &[]);
        } else {
            let sync = Sync::Recv { from: peer, key };
            self.push(Lane::None, Activity::Pipeline, 0.0, sync, &[], &[slot]);
        }
    }
}

fn message_key(ix: &GraphIndex, b: &Buf) -> MessageKey {
    (ix.tensor(&b.tensor), b.micro_batch.map_or(GATHERED, |m| m as u32))
}

impl Compiler<'_, '_> {
    /// The compiled form of `p`.
    pub fn compile(&self, p: &Program) -> Compiled {
        let mut b = Builder {
            c: self,
            out: Compiled {
                rank: p.rank,
                ..Compiled::default()
            },
            base: vec![u32::MAX; self.index.tensor_bytes.len() + 1],
            stride: self.micro_batches as u32 + 3,
            written: Vec::new(),
            scratch: Vec::new(),
            updates: HashMap::default(),
            overlapped: false,
        };
        for instr in &p.instructions {
            b.instr(p.rank, instr);
        }
        let ix = self.index;
        b.out.static_bytes = p
            .params
            .iter()
            .map(|slot| {
                let t = ix.tensor(&slot.name);
                let bytes = ix.bytes(t);
                let stored = slot.stored_shard.map_or(1, |s| s.parts) as f64;
                // Weights (a shard under ZeRO-3), gradients (shards under
                // ZeRO-2/3) and the optimizer state of what this rank updates.
                let state = b.updates.get(&t).map_or(0.0, |&parts| {
                    ix.elements(t) * self.pricing.state_bytes_per_element(ix.dtype(t)) / parts
                });
                let grads = if ix.sharded_grads {
                    bytes / b.updates.get(&t).copied().unwrap_or(1.0)
                } else {
                    bytes
                };
                bytes / stored + grads + state
            })
            .sum();
        b.out
    }
}

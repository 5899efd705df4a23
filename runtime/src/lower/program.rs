//! Per-rank programs: what one rank does in one training step, as data.
//! Buffers are named by tensor and micro-batch; the instruction list alone
//! says when each buffer is created, moved and freed, so a backend only
//! interprets it and a simulator can replay it.

use super::training::Feed;
use serde::{Deserialize, Serialize};

/// A rank's place on the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Coord {
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
}

/// A named buffer: an activation of one micro-batch, or (no micro-batch) a
/// per-step buffer such as a gathered parameter or an accumulated gradient.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Buf {
    pub tensor: String,
    pub micro_batch: Option<usize>,
}

impl Buf {
    /// The buffer of `tensor` for micro-batch `mb`.
    pub fn of(tensor: &str, mb: usize) -> Buf {
        Buf {
            tensor: tensor.into(),
            micro_batch: Some(mb),
        }
    }

    /// A per-step buffer.
    pub fn step(tensor: &str) -> Buf {
        Buf {
            tensor: tensor.into(),
            micro_batch: None,
        }
    }
}

impl std::fmt::Display for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.micro_batch {
            Some(mb) => write!(f, "{}@mb{mb}", self.tensor),
            None => write!(f, "{}", self.tensor),
        }
    }
}

/// How data-parallel gradients are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reduction {
    /// Ring all-reduce (reduce-scatter then all-gather).
    Ring,
    /// Every rank pushes to the group's first rank, which sums and sends back.
    ParameterServer,
}

/// The part of a parameter a rank owns under ZeRO: part `index` of `parts`
/// equal pieces of the flattened parameter (padded with zeros to a multiple
/// of `parts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    pub parts: usize,
}

/// One step of a rank's program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Instr {
    /// Fill a data input for a micro-batch from rows `[rows.0, rows.1)` of
    /// the step's global batch.
    Load {
        buf: Buf,
        feed: Feed,
        rows: (usize, usize),
    },
    /// Run one node of the training graph on micro-batch `micro_batch`.
    /// Run one communication node of the training graph (tensor
    /// parallelism) over `group`, the rank's tensor-parallel group in order.
    Collective {
        node: String,
        micro_batch: usize,
        kind: autopar_ir::CommKind,
        axis: usize,
        group: Vec<usize>,
    },
    Compute {
        node: String,
        micro_batch: usize,
    },
    /// Point-to-point: pipeline activations and their gradients.
    Send {
        buf: Buf,
        to: usize,
    },
    Recv {
        buf: Buf,
        from: usize,
    },
    /// Drop a buffer after its last use.
    Free {
        buf: Buf,
    },
    /// Add micro-batch `micro_batch`'s gradient of `param` into the step's
    /// gradient buffer (and free the micro-batch's).
    AccumulateGrad {
        param: String,
        micro_batch: usize,
    },
    /// Sum the gradients of a tied weight's copies (`params`: those held
    /// here; `group`: the ranks holding any, `key` names the tie) and give
    /// every copy the sum.
    SumTiedGrads {
        key: String,
        params: Vec<String>,
        group: Vec<usize>,
    },
    /// Sum `param`'s gradient over `group` (data parallel).
    AllReduceGrad {
        param: String,
        group: Vec<usize>,
        reduction: Reduction,
    },
    /// Sum `param`'s gradient over `group`, keeping only this rank's shard (ZeRO-2/3).
    ReduceScatterGrad {
        param: String,
        group: Vec<usize>,
    },
    /// Update `param` (or this rank's shard of it) from its gradient.
    OptimizerStep {
        param: String,
        shard: Option<Shard>,
    },
    /// Rebuild the full `param` from every rank's updated shard (ZeRO-1/2).
    AllGatherParam {
        param: String,
        group: Vec<usize>,
    },
    /// Gather the full `param` from shards into a per-step buffer before use (ZeRO-3).
    GatherParam {
        param: String,
        group: Vec<usize>,
    },
    /// Send an updated parameter to a rank that holds a copy (weights
    /// shared by two pipeline stages, such as tied embeddings).
    SendParam {
        param: String,
        to: usize,
    },
    RecvParam {
        param: String,
        from: usize,
    },
    /// Record micro-batch `micro_batch`'s loss (a scalar buffer).
    ReportLoss {
        buf: Buf,
    },
}

/// What a rank keeps between steps for one parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamSlot {
    pub name: String,
    /// Weights stored only as this shard (ZeRO-3); otherwise stored whole.
    pub stored_shard: Option<Shard>,
}

/// One rank's training step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub rank: usize,
    pub coord: Coord,
    /// The parameters this rank holds.
    pub params: Vec<ParamSlot>,
    pub instructions: Vec<Instr>,
}

impl Instr {
    /// Whether runtimes run it on a communication stream beside the compute
    /// stream (the interpreter's worker thread, a GPU's communication
    /// stream): the data-parallel gradient reductions and parameter gathers
    /// after an update. The compute stream waits for its result only where
    /// an instruction reads it.
    pub fn overlaps_compute(&self) -> bool {
        matches!(
            self,
            Instr::AllReduceGrad { .. } | Instr::ReduceScatterGrad { .. } | Instr::AllGatherParam { .. }
        )
    }

    /// Whether it moves a tensor between two ranks (a pipeline's
    /// activations and gradients, a shared weight).
    pub fn is_transfer(&self) -> bool {
        matches!(
            self,
            Instr::Send { .. } | Instr::Recv { .. } | Instr::SendParam { .. } | Instr::RecvParam { .. }
        )
    }

    /// A short description for errors and traces.
    pub fn describe(&self) -> String {
        match self {
            Instr::Load { buf, .. } => format!("load {buf}"),
            Instr::Compute { node, micro_batch } => format!("compute '{node}' (mb {micro_batch})"),
            Instr::Collective {
                node,
                micro_batch,
                kind,
                ..
            } => format!("{kind:?} '{node}' (mb {micro_batch})"),
            Instr::Send { buf, to } => format!("send {buf} to rank {to}"),
            Instr::Recv { buf, from } => format!("recv {buf} from rank {from}"),
            Instr::Free { buf } => format!("free {buf}"),
            Instr::AccumulateGrad { param, micro_batch } => {
                format!("accumulate grad of '{param}' (mb {micro_batch})")
            }
            Instr::AllReduceGrad { param, reduction, .. } => {
                format!("all-reduce ({reduction:?}) grad of '{param}'")
            }
            Instr::ReduceScatterGrad { param, .. } => format!("reduce-scatter grad of '{param}'"),
            Instr::OptimizerStep { param, .. } => format!("optimizer step of '{param}'"),
            Instr::AllGatherParam { param, .. } => format!("all-gather '{param}'"),
            Instr::GatherParam { param, .. } => format!("gather '{param}'"),
            Instr::SendParam { param, to } => format!("send '{param}' to rank {to}"),
            Instr::RecvParam { param, from } => format!("recv '{param}' from rank {from}"),
            Instr::ReportLoss { buf } => format!("report loss {buf}"),
            Instr::SumTiedGrads { key, .. } => format!("sum the tied gradients of '{key}'"),
        }
    }
}

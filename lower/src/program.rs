//! Per-rank programs: what one rank does in one training step, as data.
//! Buffers are named by tensor and micro-batch; the instruction list alone
//! says when each buffer is created, moved and freed, so a backend only
//! interprets it and a simulator can replay it.

use super::objective::Feed;
use autopar_cost_models::comm::{Algorithm, Collective};
use autopar_cost_models::GradCompression;
use autopar_ir::{CommKind, Graph, Node, Role, TensorId};
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
        kind: CommKind,
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
    /// Sum the step's gradients of `params` over `group` (data parallel)
    /// as one collective: a bucket, its members flattened and concatenated
    /// in order.
    AllReduceGrad {
        params: Vec<String>,
        group: Vec<usize>,
        reduction: Algorithm,
        /// The 16-bit float type the gradients cross the wire in, if
        /// compressed (a ring's partial sums accumulate in their own type).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compression: Option<GradCompression>,
    },
    /// Sum the gradients of `params` over `group` as one reduce-scatter (a
    /// bucket) and add this rank's shard of each sum into that parameter's
    /// gradient shard (ZeRO-1 to 3). It reduces the step's accumulated
    /// gradients (`micro_batch: None`: ZeRO-1, and what reduces after the
    /// pipeline), or micro-batch `mb`'s gradient buffers as that
    /// micro-batch's backward pass completes them (`Some(mb)`: ZeRO-2/3,
    /// which never hold a full-size gradient past its bucket). This
    /// rank's part of the bucket is the concatenation of its [`Shard`] of
    /// each member, so optimizer steps stay per parameter.
    ReduceScatterGrad {
        params: Vec<String>,
        group: Vec<usize>,
        micro_batch: Option<usize>,
        /// As [`Instr::AllReduceGrad`]'s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compression: Option<GradCompression>,
    },
    /// Update `param` (or this rank's shard of it) from its gradient.
    OptimizerStep {
        param: String,
        shard: Option<Shard>,
    },
    /// Rebuild the full weights of a bucket of `params` from every rank's
    /// updated shards (ZeRO-1/2), as one collective: each rank sends its
    /// [`Shard`] of every member, concatenated (a reduce-scatter's layout
    /// read backwards).
    AllGatherParams {
        params: Vec<String>,
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

/// What an instruction does to the transient buffers (activations,
/// gathered weights), as far as the instruction itself says: a node's
/// operands and a parameter's gradient tensor are named by the training
/// graph, so those two come back as the node or parameter to look up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferUse<'a> {
    /// Creates the buffer (a load, a receive, a gathered weight).
    Creates(Buf),
    /// Reads the buffer (a send, a loss report).
    Reads(&'a Buf),
    /// Drops the buffer.
    Frees(&'a Buf),
    /// Reads node `node`'s inputs of `micro_batch` (and the weights it
    /// uses) and creates its outputs.
    Node { node: &'a str, micro_batch: usize },
    /// Reads micro-batch `micro_batch`'s gradients of `params`.
    Gradients {
        params: &'a [String],
        micro_batch: usize,
    },
    /// None: it touches only weights, gradient accumulators and optimizer state.
    Nothing,
}

/// What a point-to-point transfer moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// A pipeline's activation or gradient.
    Buf(&'a Buf),
    /// A shared weight, whole.
    Param(&'a str),
}

impl std::fmt::Display for Payload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::Buf(b) => write!(f, "{b}"),
            Payload::Param(p) => write!(f, "{p}"),
        }
    }
}

/// One side of a point-to-point transfer, as the rank running it sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer<'a> {
    /// Whether this rank sends (else it receives).
    pub send: bool,
    /// The other rank.
    pub peer: usize,
    pub payload: Payload<'a>,
}

impl Instr {
    /// The ranks a collective instruction is issued over, this one among
    /// them (every member issues it, in the same order); `None` for the
    /// rest. Tensor-parallel copies and slices count too, though they
    /// exchange nothing: their group is the tensor-parallel group.
    pub fn group(&self) -> Option<&[usize]> {
        match self {
            Instr::Collective { group, .. }
            | Instr::SumTiedGrads { group, .. }
            | Instr::AllReduceGrad { group, .. }
            | Instr::ReduceScatterGrad { group, .. }
            | Instr::AllGatherParams { group, .. }
            | Instr::GatherParam { group, .. } => Some(group),
            Instr::Load { .. }
            | Instr::Compute { .. }
            | Instr::Send { .. }
            | Instr::Recv { .. }
            | Instr::Free { .. }
            | Instr::AccumulateGrad { .. }
            | Instr::OptimizerStep { .. }
            | Instr::SendParam { .. }
            | Instr::RecvParam { .. }
            | Instr::ReportLoss { .. } => None,
        }
    }

    /// The collective it runs over [`Instr::group`] and with which
    /// algorithm; `None` where it exchanges nothing (tensor-parallel
    /// copies and slices, everything without a group).
    pub fn collective(&self) -> Option<(Collective, Algorithm)> {
        let ring = |c| Some((c, Algorithm::Ring));
        match self {
            Instr::Collective { kind, .. } => autopar_cost_models::comm::of_comm(*kind).and_then(ring),
            Instr::SumTiedGrads { .. } => ring(Collective::AllReduce),
            Instr::AllReduceGrad { reduction, .. } => Some((Collective::AllReduce, *reduction)),
            Instr::ReduceScatterGrad { .. } => ring(Collective::ReduceScatter),
            Instr::AllGatherParams { .. } | Instr::GatherParam { .. } => ring(Collective::AllGather),
            Instr::Load { .. }
            | Instr::Compute { .. }
            | Instr::Send { .. }
            | Instr::Recv { .. }
            | Instr::Free { .. }
            | Instr::AccumulateGrad { .. }
            | Instr::OptimizerStep { .. }
            | Instr::SendParam { .. }
            | Instr::RecvParam { .. }
            | Instr::ReportLoss { .. } => None,
        }
    }

    /// Its side of a point-to-point transfer, if it is one.
    pub fn transfer(&self) -> Option<Transfer<'_>> {
        let (send, peer, payload) = match self {
            Instr::Send { buf, to } => (true, *to, Payload::Buf(buf)),
            Instr::Recv { buf, from } => (false, *from, Payload::Buf(buf)),
            Instr::SendParam { param, to } => (true, *to, Payload::Param(param)),
            Instr::RecvParam { param, from } => (false, *from, Payload::Param(param)),
            Instr::Load { .. }
            | Instr::Collective { .. }
            | Instr::Compute { .. }
            | Instr::Free { .. }
            | Instr::AccumulateGrad { .. }
            | Instr::SumTiedGrads { .. }
            | Instr::AllReduceGrad { .. }
            | Instr::ReduceScatterGrad { .. }
            | Instr::OptimizerStep { .. }
            | Instr::AllGatherParams { .. }
            | Instr::GatherParam { .. }
            | Instr::ReportLoss { .. } => return None,
        };
        Some(Transfer { send, peer, payload })
    }

    /// What it does to the transient buffers.
    pub fn buffers(&self) -> BufferUse<'_> {
        match self {
            Instr::Load { buf, .. } | Instr::Recv { buf, .. } => BufferUse::Creates(buf.clone()),
            Instr::GatherParam { param, .. } => BufferUse::Creates(Buf::step(param)),
            Instr::Send { buf, .. } | Instr::ReportLoss { buf } => BufferUse::Reads(buf),
            Instr::Free { buf } => BufferUse::Frees(buf),
            Instr::Compute { node, micro_batch }
            | Instr::Collective {
                node, micro_batch, ..
            } => BufferUse::Node {
                node,
                micro_batch: *micro_batch,
            },
            Instr::AccumulateGrad { param, micro_batch } => BufferUse::Gradients {
                params: std::slice::from_ref(param),
                micro_batch: *micro_batch,
            },
            Instr::ReduceScatterGrad {
                params,
                micro_batch: Some(mb),
                ..
            } => BufferUse::Gradients {
                params,
                micro_batch: *mb,
            },
            Instr::SumTiedGrads { .. }
            | Instr::AllReduceGrad { .. }
            | Instr::ReduceScatterGrad {
                micro_batch: None, ..
            }
            | Instr::OptimizerStep { .. }
            | Instr::AllGatherParams { .. }
            | Instr::SendParam { .. }
            | Instr::RecvParam { .. } => BufferUse::Nothing,
        }
    }

    /// The parameters whose gradient or stored weight it reads or
    /// replaces: a collective still in flight on one of them must finish
    /// first.
    pub fn params(&self) -> Vec<&str> {
        match self {
            Instr::AccumulateGrad { param, .. }
            | Instr::OptimizerStep { param, .. }
            | Instr::GatherParam { param, .. }
            | Instr::SendParam { param, .. }
            | Instr::RecvParam { param, .. } => vec![param],
            Instr::SumTiedGrads { params, .. }
            | Instr::AllReduceGrad { params, .. }
            | Instr::ReduceScatterGrad { params, .. }
            | Instr::AllGatherParams { params, .. } => params.iter().map(String::as_str).collect(),
            Instr::Load { .. }
            | Instr::Collective { .. }
            | Instr::Compute { .. }
            | Instr::Send { .. }
            | Instr::Recv { .. }
            | Instr::Free { .. }
            | Instr::ReportLoss { .. } => Vec::new(),
        }
    }

    /// Whether runtimes run it on a communication stream beside the compute
    /// stream (the interpreter's worker thread, a GPU's communication
    /// stream): the data-parallel gradient reductions, the parameter
    /// gathers after an update and ZeRO-3's weight gathers (issued ahead of
    /// their readers by the prefetch). The compute stream waits for its
    /// result only where an instruction reads it. Backends choose their
    /// stream by it and the simulator its lane.
    pub fn overlaps_compute(&self) -> bool {
        matches!(
            self,
            Instr::AllReduceGrad { .. }
                | Instr::ReduceScatterGrad { .. }
                | Instr::AllGatherParams { .. }
                | Instr::GatherParam { .. }
        )
    }

    /// Whether it moves a tensor between two ranks (a pipeline's
    /// activations and gradients, a shared weight).
    pub fn is_transfer(&self) -> bool {
        self.transfer().is_some()
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
            Instr::AllReduceGrad {
                params,
                reduction,
                compression,
                ..
            } => format!(
                "all-reduce ({reduction:?}) {}{}",
                grads(params),
                sent_as(compression)
            ),
            Instr::ReduceScatterGrad {
                params,
                micro_batch,
                compression,
                ..
            } => match micro_batch {
                Some(mb) => format!(
                    "reduce-scatter {}{} (mb {mb})",
                    grads(params),
                    sent_as(compression)
                ),
                None => format!("reduce-scatter {}{}", grads(params), sent_as(compression)),
            },
            Instr::OptimizerStep { param, .. } => format!("optimizer step of '{param}'"),
            Instr::AllGatherParams { params, .. } => match params.as_slice() {
                [param] => format!("all-gather '{param}'"),
                [first, .., last] => format!(
                    "all-gather bucket of {} weights ('{first}' … '{last}')",
                    params.len()
                ),
                [] => "all-gather empty bucket".into(),
            },
            Instr::GatherParam { param, .. } => format!("gather '{param}'"),
            Instr::SendParam { param, to } => format!("send '{param}' to rank {to}"),
            Instr::RecvParam { param, from } => format!("recv '{param}' from rank {from}"),
            Instr::ReportLoss { buf } => format!("report loss {buf}"),
            Instr::SumTiedGrads { key, .. } => format!("sum the tied gradients of '{key}'"),
        }
    }
}

/// A bucket's gradients as descriptions name them: the one parameter's,
/// or how many with the first and last (a bucket may hold hundreds).
impl Instr {
    /// The 16-bit type a data-parallel gradient reduction sends, if compressed.
    pub fn compression(&self) -> Option<GradCompression> {
        match self {
            Instr::AllReduceGrad { compression, .. } | Instr::ReduceScatterGrad { compression, .. } => {
                *compression
            }
            _ => None,
        }
    }
}

/// ` in bf16` for a reduction sent compressed, else nothing.
fn sent_as(compression: &Option<GradCompression>) -> String {
    compression.map_or(String::new(), |d| format!(" in {d}"))
}

fn grads(params: &[String]) -> String {
    match params {
        [param] => format!("grad of '{param}'"),
        [first, .., last] => format!("bucket of {} grads ('{first}' … '{last}')", params.len()),
        [] => "empty bucket".into(),
    }
}

/// How a node's input reaches it in a program.
pub enum Operand {
    /// The micro-batch's buffer of the tensor.
    Buffer(TensorId),
    /// A parameter: held by the rank, or gathered into a per-step buffer (ZeRO-3).
    Param(TensorId),
}

/// The inputs of `n` a program provides, in order (constants belong to the
/// node): the simulator's and the GPU memory planner's one definition of
/// what a `Compute` reads, so it sits with the programs both crates read.
pub fn operands<'a>(g: &'a Graph, n: &'a Node) -> impl Iterator<Item = Operand> + 'a {
    n.inputs
        .iter()
        .flatten()
        .filter_map(move |&x| match g.tensor(x).role {
            Role::Constant => None,
            Role::Parameter => Some(Operand::Param(x)),
            _ => Some(Operand::Buffer(x)),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Instr> {
        let g = vec![0, 1];
        let b = Buf::of("x", 0);
        let p = String::from("w");
        vec![
            Instr::Load {
                buf: b.clone(),
                feed: Feed::Tokens,
                rows: (0, 2),
            },
            Instr::Collective {
                node: "c".into(),
                micro_batch: 1,
                kind: CommKind::AllGather,
                axis: 0,
                group: g.clone(),
            },
            Instr::Compute {
                node: "n".into(),
                micro_batch: 1,
            },
            Instr::Send {
                buf: b.clone(),
                to: 1,
            },
            Instr::Recv {
                buf: b.clone(),
                from: 1,
            },
            Instr::Free { buf: b.clone() },
            Instr::AccumulateGrad {
                param: p.clone(),
                micro_batch: 2,
            },
            Instr::SumTiedGrads {
                key: "tie".into(),
                params: vec!["a".into(), "b".into()],
                group: g.clone(),
            },
            Instr::AllReduceGrad {
                params: vec![p.clone()],
                group: g.clone(),
                reduction: Algorithm::ParameterServer,
                compression: None,
            },
            Instr::ReduceScatterGrad {
                params: vec![p.clone()],
                group: g.clone(),
                micro_batch: None,
                compression: None,
            },
            Instr::OptimizerStep {
                param: p.clone(),
                shard: None,
            },
            Instr::AllGatherParams {
                params: vec![p.clone()],
                group: g.clone(),
            },
            Instr::GatherParam {
                param: p.clone(),
                group: g.clone(),
            },
            Instr::SendParam {
                param: p.clone(),
                to: 3,
            },
            Instr::RecvParam { param: p, from: 3 },
            Instr::ReportLoss { buf: b },
            Instr::ReduceScatterGrad {
                params: vec!["a".into(), "b".into(), "c".into()],
                group: g,
                micro_batch: Some(1),
                compression: Some(GradCompression::Bf16),
            },
        ]
    }

    /// Each instruction's description and what each method says of it, one line each.
    fn table() -> Vec<String> {
        all()
            .iter()
            .map(|i| {
                let transfer = i
                    .transfer()
                    .map(|t| format!("{} {} {}", if t.send { "to" } else { "from" }, t.peer, t.payload));
                format!(
                    "{} | group {:?} | {:?} | {:?} | {:?} | params {:?}",
                    i.describe(),
                    i.group(),
                    i.collective(),
                    transfer,
                    i.buffers(),
                    i.params()
                )
            })
            .collect()
    }

    #[test]
    fn instructions_describe_what_they_touch() {
        let expected = [
            r#"load x@mb0 | group None | None | None | Creates(Buf { tensor: "x", micro_batch: Some(0) }) | params []"#,
            r#"AllGather 'c' (mb 1) | group Some([0, 1]) | Some((AllGather, Ring)) | None | Node { node: "c", micro_batch: 1 } | params []"#,
            r#"compute 'n' (mb 1) | group None | None | None | Node { node: "n", micro_batch: 1 } | params []"#,
            r#"send x@mb0 to rank 1 | group None | None | Some("to 1 x@mb0") | Reads(Buf { tensor: "x", micro_batch: Some(0) }) | params []"#,
            r#"recv x@mb0 from rank 1 | group None | None | Some("from 1 x@mb0") | Creates(Buf { tensor: "x", micro_batch: Some(0) }) | params []"#,
            r#"free x@mb0 | group None | None | None | Frees(Buf { tensor: "x", micro_batch: Some(0) }) | params []"#,
            r#"accumulate grad of 'w' (mb 2) | group None | None | None | Gradients { params: ["w"], micro_batch: 2 } | params ["w"]"#,
            r#"sum the tied gradients of 'tie' | group Some([0, 1]) | Some((AllReduce, Ring)) | None | Nothing | params ["a", "b"]"#,
            r#"all-reduce (ParameterServer) grad of 'w' | group Some([0, 1]) | Some((AllReduce, ParameterServer)) | None | Nothing | params ["w"]"#,
            r#"reduce-scatter grad of 'w' | group Some([0, 1]) | Some((ReduceScatter, Ring)) | None | Nothing | params ["w"]"#,
            r#"optimizer step of 'w' | group None | None | None | Nothing | params ["w"]"#,
            r#"all-gather 'w' | group Some([0, 1]) | Some((AllGather, Ring)) | None | Nothing | params ["w"]"#,
            r#"gather 'w' | group Some([0, 1]) | Some((AllGather, Ring)) | None | Creates(Buf { tensor: "w", micro_batch: None }) | params ["w"]"#,
            r#"send 'w' to rank 3 | group None | None | Some("to 3 w") | Nothing | params ["w"]"#,
            r#"recv 'w' from rank 3 | group None | None | Some("from 3 w") | Nothing | params ["w"]"#,
            r#"report loss x@mb0 | group None | None | None | Reads(Buf { tensor: "x", micro_batch: Some(0) }) | params []"#,
            r#"reduce-scatter bucket of 3 grads ('a' … 'c') in bf16 (mb 1) | group Some([0, 1]) | Some((ReduceScatter, Ring)) | None | Gradients { params: ["a", "b", "c"], micro_batch: 1 } | params ["a", "b", "c"]"#,
        ];
        assert_eq!(table(), expected);
    }

    #[test]
    fn tensor_parallel_copies_and_slices_meet_but_exchange_nothing() {
        for kind in [CommKind::Copy, CommKind::Slice] {
            let i = Instr::Collective {
                node: "c".into(),
                micro_batch: 0,
                kind,
                axis: 0,
                group: vec![0, 1],
            };
            assert_eq!(i.group(), Some(&[0, 1][..]));
            assert_eq!(i.collective(), None);
        }
    }

    #[test]
    fn overlapped_and_transfer_instructions() {
        let flags: Vec<(bool, bool)> = all()
            .iter()
            .map(|i| (i.overlaps_compute(), i.is_transfer()))
            .collect();
        let overlapped: Vec<usize> = (0..flags.len()).filter(|&i| flags[i].0).collect();
        let transfers: Vec<usize> = (0..flags.len()).filter(|&i| flags[i].1).collect();
        assert_eq!(overlapped, [8, 9, 11, 12, 16]);
        assert_eq!(transfers, [3, 4, 13, 14]);
    }
}

//! What the CUDA backend needs from the collectives between ranks' device
//! buffers, written once for its two kinds: NCCL between GPUs
//! ([`super::nccl::Nccl`]) and the exchange between ranks that share one
//! GPU in this process ([`super::same_device::SameDevice`]). Calls are
//! queued on a stream and return once queued; every member of a group
//! makes the same calls on it in the same order. What both kinds do alike
//! (a rank's place in a group, counting the bytes it sends) is here; each
//! kind only queues a [`Call`] its own way.

use super::meetings::MeetingError;
use super::nccl::{DataType, Posted, TransferRoute};
use super::CudaError;
use autopar_comm::collective::{Algorithm, Collective, CommError};
use autopar_cost_models::comm::bytes_sent;
use autopar_exec::BackendError;
use cudarc::driver::{CudaStream, DriverError};
use cudarc::nccl::sys::ncclResult_t;
use std::cell::Cell;
use std::sync::Arc;

pub(crate) type Stream = Arc<CudaStream>;

/// What a device collective does, and to which device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceOp {
    /// Sums the call's `count` elements at this address in place.
    AllReduce(u64),
    /// Sums the `count × group size` elements at `send` over the group and
    /// writes this member's part of the sum (`count` elements) to `recv`.
    ReduceScatter { send: u64, recv: u64 },
    /// Concatenates every member's `count` elements at `send` into `recv`
    /// (`count × group size` elements, parts in group order). In place
    /// when `send` is this member's part of `recv`.
    AllGather { send: u64, recv: u64 },
}

impl DeviceOp {
    /// `self` over `group`, `count` elements of `dtype` (see the variants).
    pub fn over(self, group: &[usize], count: usize, dtype: DataType) -> Call<'_> {
        Call {
            op: self,
            group,
            count,
            dtype,
        }
    }

    /// "all-reduce", as errors and reports name it.
    pub fn name(self) -> &'static str {
        match self {
            DeviceOp::AllReduce(_) => "all-reduce",
            DeviceOp::ReduceScatter { .. } => "reduce-scatter",
            DeviceOp::AllGather { .. } => "all-gather",
        }
    }

    fn collective(self) -> Collective {
        match self {
            DeviceOp::AllReduce(_) => Collective::AllReduce,
            DeviceOp::ReduceScatter { .. } => Collective::ReduceScatter,
            DeviceOp::AllGather { .. } => Collective::AllGather,
        }
    }
}

/// One device collective over `group` (see [`DeviceOp`] for `count`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    pub op: DeviceOp,
    pub group: &'a [usize],
    pub count: usize,
    pub dtype: DataType,
}

/// A rank's side of every device collective: its rank, and the bytes it
/// has sent, counted per ring algorithm as the fabric counts its
/// collectives (NCCL's own choice of ring or tree aside).
pub(crate) struct Member {
    rank: usize,
    sent: Cell<u64>,
}

impl Member {
    pub fn new(rank: usize) -> Member {
        Member {
            rank,
            sent: Cell::new(0),
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// This rank's place in `group` (its rank in the group's communicator).
    pub fn position(&self, group: &[usize]) -> Option<usize> {
        group.iter().position(|&r| r == self.rank)
    }

    /// Counts a ring `collective` of `count` elements of `dtype` over
    /// `members` ranks.
    pub fn count(&self, collective: Collective, members: usize, count: usize, dtype: DataType) {
        let bytes = (count * element_size(dtype)) as f64;
        let sent = bytes_sent(collective, Algorithm::Ring, members, bytes).map_or(0.0, |v| v[0]) as u64;
        self.sent.set(self.sent.get() + sent);
    }

    /// Counts `call`, whose whole is `count` elements (an all-reduce) or
    /// `count` per member (the others).
    pub(crate) fn count_call(&self, call: &Call) {
        let members = call.group.len();
        let elements = match call.op {
            DeviceOp::AllReduce(_) => call.count,
            DeviceOp::ReduceScatter { .. } | DeviceOp::AllGather { .. } => call.count * members,
        };
        self.count(call.op.collective(), members, elements, call.dtype);
    }
}

/// Collectives and transfers between ranks' device buffers.
pub(crate) trait DeviceComms {
    /// This rank, and what it has sent.
    fn member(&self) -> &Member;
    /// Whether `group`'s collectives run here (every member gets the same answer).
    fn connects(&self, group: &[usize]) -> bool;
    /// Queues `call` on `stream`, this kind's way ([`DeviceComms::collective`]
    /// counts it).
    fn queue(&self, call: Call, stream: &Stream) -> Result<(), CommsError>;
    /// Why the collectives stopped early (a failed peer), if they did.
    fn stopped(&self) -> Option<CommsError>;
    /// How pipeline transfers run here, if they do.
    fn route(&self) -> Option<&TransferRoute> {
        None
    }
    /// Runs `posted` as one group ([`TransferRoute::Grouped`]).
    fn transfer(&self, posted: &[Posted], stream: &Stream) -> Result<(), CommsError> {
        let _ = (posted, stream);
        Err(CommsError::NotGrouped("the device"))
    }
    /// Sends or receives `posted` with its peer at once, on the pair's own
    /// channel ([`TransferRoute::Pairs`]).
    fn transfer_pair(&self, posted: Posted, stream: &Stream) -> Result<(), CommsError> {
        let _ = (posted, stream);
        Err(CommsError::NotPaired)
    }

    /// This rank's place in `group`.
    fn position(&self, group: &[usize]) -> Option<usize> {
        self.member().position(group)
    }

    /// Bytes this rank has sent ([`Member`]).
    fn bytes_sent(&self) -> u64 {
        self.member().sent.get()
    }

    /// Counts `call` and queues it on `stream`.
    fn collective(&self, call: Call, stream: &Stream) -> Result<(), CommsError> {
        self.member().count_call(&call);
        self.queue(call, stream)
    }

    /// Counts `calls` (over one group: a gradient bucket's) and queues
    /// them on `stream` as one group where this kind groups calls (NCCL);
    /// by default one by one.
    fn collectives(&self, calls: &[Call], stream: &Stream) -> Result<(), CommsError> {
        calls.iter().try_for_each(|&call| self.collective(call, stream))
    }
}

/// Why a collective or transfer between device buffers, or the setting up
/// of their communicators, failed. Each names the call or ranks at fault.
#[derive(Debug, thiserror::Error)]
pub enum CommsError {
    /// A driver call failed: binding the context, an event, a copy.
    #[error("{doing}: {source}")]
    Driver {
        doing: &'static str,
        source: DriverError,
    },
    /// An NCCL call failed; `call` names it and its ranks.
    #[error("{call}: {code:?}")]
    Nccl { call: String, code: ncclResult_t },
    #[error("no NCCL communicator for ranks {0:?}")]
    NoGroup(Vec<usize>),
    #[error("no NCCL communicator for transfers from rank {from} to rank {to}")]
    NoPair { from: usize, to: usize },
    /// The communicators were aborted because rank `by` failed.
    #[error("NCCL stopped because rank {by} failed: {why}")]
    Stopped { by: usize, why: String },
    #[error("rank {rank} is not in {group:?}")]
    NotMember { rank: usize, group: Vec<usize> },
    /// Grouped transfers were asked of collectives (on NCCL, or the
    /// device) that do not run them.
    #[error("transfers are not grouped on {0} here")]
    NotGrouped(&'static str),
    #[error("transfers do not run per pair on the device here")]
    NotPaired,
    /// The same-device exchange sums f32 and bf16 only.
    #[error("no same-device sum of {0:?}")]
    NoSum(DataType),
    /// A same-device kernel could not be launched.
    #[error(transparent)]
    Kernel(Box<CudaError>),
    #[error(transparent)]
    Meeting(#[from] MeetingError),
    /// The fabric failed while the ranks agreed on NCCL, shared its ids or
    /// their host names.
    #[error(transparent)]
    Fabric(#[from] CommError),
    /// These words were sent as f64 and arrived as f32.
    #[error("{0} arrived as f32")]
    ArrivedAsF32(String),
    /// Words that do not decode to the bytes of a message of this length.
    #[error("malformed {0}-byte message")]
    Malformed(usize),
    #[error("cannot tell which node this process runs on (no /proc/sys/kernel/hostname or HOSTNAME)")]
    UnknownHost,
}

impl CommsError {
    /// A failed driver call while `doing` something.
    pub(crate) fn driver(doing: &'static str) -> impl Fn(DriverError) -> CommsError {
        move |source| CommsError::Driver { doing, source }
    }
}

/// The device layers' failures as the interpreter sees them: a collective
/// asked of a group or route that does not run it, or a failed device,
/// library or peer.
impl From<CommsError> for BackendError {
    fn from(e: CommsError) -> BackendError {
        match e {
            CommsError::NotMember { .. }
            | CommsError::NotGrouped(_)
            | CommsError::NotPaired
            | CommsError::NoGroup(_)
            | CommsError::NoPair { .. }
            | CommsError::NoSum(_) => BackendError::Collective(e.to_string()),
            CommsError::Driver { .. }
            | CommsError::Nccl { .. }
            | CommsError::Stopped { .. }
            | CommsError::Kernel(_)
            | CommsError::Meeting(_)
            | CommsError::Fabric(_)
            | CommsError::ArrivedAsF32(_)
            | CommsError::Malformed(_)
            | CommsError::UnknownHost => BackendError::Device(e.to_string()),
        }
    }
}

/// Bytes per element of a type the backend uses.
pub(crate) fn element_size(dtype: DataType) -> usize {
    match dtype {
        DataType::ncclBfloat16 | DataType::ncclFloat16 => 2,
        DataType::ncclFloat64 | DataType::ncclInt64 | DataType::ncclUint64 => 8,
        DataType::ncclInt8 | DataType::ncclUint8 => 1,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call is counted as the fabric counts its ring collective of the
    /// whole: 2 (p - 1) / p of it for an all-reduce, (p - 1) / p for the others.
    #[test]
    fn calls_are_counted_over_the_whole_they_move() {
        let member = Member::new(2);
        let group = [0, 1, 2, 3];
        let f32s = DataType::ncclFloat32;
        member.count_call(&DeviceOp::AllReduce(0).over(&group, 1000, f32s));
        assert_eq!(member.sent.get(), 6000);
        member.count_call(&DeviceOp::ReduceScatter { send: 0, recv: 0 }.over(&group, 250, f32s));
        assert_eq!(member.sent.get(), 6000 + 3000);
        let gather = DeviceOp::AllGather { send: 0, recv: 0 }.over(&group, 100, DataType::ncclBfloat16);
        member.count_call(&gather);
        assert_eq!(member.sent.get(), 9000 + 600);
        assert_eq!(member.position(&group), Some(2));
        assert_eq!(member.position(&[0, 1]), None);
    }

    /// Errors keep their text on the way to the interpreter; what a group
    /// or route cannot do is a collective's fault, the rest the device's.
    #[test]
    fn errors_reach_the_interpreter_as_collective_or_device_faults() {
        let misuse = BackendError::from(CommsError::NotMember {
            rank: 3,
            group: vec![0, 1],
        });
        assert!(
            matches!(&misuse, BackendError::Collective(m) if m == "rank 3 is not in [0, 1]"),
            "{misuse:?}"
        );
        let failed = BackendError::from(CommsError::Stopped {
            by: 1,
            why: "out of memory".into(),
        });
        let text = "NCCL stopped because rank 1 failed: out of memory";
        assert!(
            matches!(&failed, BackendError::Device(m) if m == text),
            "{failed:?}"
        );
    }
}

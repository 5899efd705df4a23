//! Collectives between ranks.
//!
//! Ranks in one process (one OS thread each) talk through a [`fabric`] of
//! shared mailboxes; a rank in another process is reached over TCP
//! ([`connect`]), behind the same [`Endpoint`]. Collectives are the real algorithms
//! (ring reduce-scatter / all-gather / all-reduce, pairwise all-to-all,
//! chain broadcast, parameter-server all-reduce) built from point-to-point
//! messages, and every rank counts the bytes it sends, so a run can be
//! checked against the communication model
//! ([`autopar_cost_models::comm::bytes_sent`]).
//!
//! Results are bitwise identical on all members of a group and from run to
//! run: every reduced element is summed once, in a fixed order, by one rank,
//! and then copied to the others.

mod buffer;
mod fabric;
mod lossy;
mod narrow;
mod ops;
mod pool;
mod tcp;
#[cfg(test)]
mod tests;
pub mod values;
mod watchdog;

pub use autopar_cost_models::comm::{Algorithm, Collective};
pub(crate) use buffer::with_elements;
pub use buffer::{Buffer, LayoutMismatch};
pub use fabric::{fabric, Endpoint};
pub use lossy::Feedback;
pub use narrow::Half;
pub use tcp::{connect, MeshError};
pub use watchdog::Watchdog;

/// Why a point-to-point message or a collective failed. Every variant names
/// the rank that saw the failure and `what` it was executing, so a failed
/// multi-rank run can be traced to one instruction.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// A message did not arrive in time: a peer is stuck, deadlocked or dead.
    /// `waited_s` is the fabric's timeout (so messages are reproducible).
    #[error("rank {rank}: {what} waited {waited_s:.1} s for rank {peer}; deadlock or a failed rank")]
    Timeout {
        rank: usize,
        peer: usize,
        what: String,
        waited_s: f64,
    },
    /// Some rank called [`Endpoint::abort`]; everyone stops waiting.
    #[error("rank {rank}: {what} aborted because rank {by} failed: {reason}")]
    Aborted {
        rank: usize,
        by: usize,
        reason: String,
        what: String,
    },
    /// A buffer cannot be cut into equal chunks, one per group member.
    #[error("rank {rank}: {what}: {len} elements do not split into {parts} equal chunks")]
    Uneven {
        rank: usize,
        what: String,
        len: usize,
        parts: usize,
    },
    /// The calling rank is not a member of the group it asked to talk in.
    #[error("rank {rank}: {what}: this rank is not in group {group:?}")]
    NotInGroup {
        rank: usize,
        what: String,
        group: Vec<usize>,
    },
    /// The group is empty, repeats a rank or names one outside the fabric.
    #[error("rank {rank}: {what}: bad group {group:?}: {reason}")]
    BadGroup {
        rank: usize,
        what: String,
        group: Vec<usize>,
        reason: String,
    },
    /// The connection to a rank in another process failed.
    #[error("rank {rank}: {what}: the connection to rank {peer} failed: {message}")]
    Link {
        rank: usize,
        peer: usize,
        what: String,
        message: String,
    },
    /// A point-to-point peer outside the fabric.
    #[error("rank {rank}: {what}: no rank {peer} in a world of {world}")]
    NoSuchRank {
        rank: usize,
        what: String,
        peer: usize,
        world: usize,
    },
    /// A broadcast root position outside the group.
    #[error("rank {rank}: {what}: root position {root} is outside a group of {size}")]
    BadRoot {
        rank: usize,
        what: String,
        root: usize,
        size: usize,
    },
    /// A peer's buffer differs in element type or length from this rank's:
    /// the ranks disagree about the instruction.
    #[error("rank {rank}: {what}: buffer from rank {peer} does not match: {mismatch}")]
    Mismatch {
        rank: usize,
        what: String,
        peer: usize,
        mismatch: LayoutMismatch,
    },
    /// The algorithm does not implement this collective here.
    #[error("rank {rank}: {what}: {algorithm:?} {collective:?} is not implemented")]
    Unsupported {
        rank: usize,
        what: String,
        collective: Collective,
        algorithm: Algorithm,
    },
}

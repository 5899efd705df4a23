//! Why a program's buffers cannot be planned, and why a plan is wrong.

use super::Block;
use autopar_lower::Buf;

/// Why a program cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("rank {rank}, instruction {index} ({what}): {source}")]
    Instruction {
        rank: usize,
        index: usize,
        what: String,
        source: BufferError,
    },
    #[error("rank {rank}, parameter '{param}': {source}")]
    Param {
        rank: usize,
        param: String,
        source: BufferError,
    },
}

/// What an instruction (or a parameter) says of a buffer that the program
/// or its training graph does not back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BufferError {
    #[error("no tensor '{0}' in the training graph")]
    NoTensor(String),
    #[error("tensor '{0}' has dims the micro-batch does not bind")]
    UnboundDims(String),
    #[error("no node '{0}' in the training graph")]
    NoNode(String),
    #[error("parameter '{0}' has no gradient in the training graph")]
    NoGradient(String),
    /// The instruction `reads` or `frees` a buffer it cannot.
    #[error("{action} {buf}, which is not alive here (never created on this rank, or already freed)")]
    NotAlive { action: &'static str, buf: Buf },
}

/// Why [`check`](super::check) refuses a plan: the block (or blocks) at
/// fault, boxed since a block carries its buffer's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("{block} is misaligned, outside the {arena_bytes}-byte arena or ends before it starts")]
    Misplaced { block: Box<Block>, arena_bytes: u64 },
    #[error("{block} overlaps {other}")]
    Overlap { block: Box<Block>, other: Box<Block> },
}

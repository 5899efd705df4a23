//! Why an instruction failed on a rank. The step loop wraps it with the
//! rank, step and instruction ([`crate::ExecError::Rank`]).

use crate::backend::BackendError;
use crate::buckets::BucketError;
use crate::train::DataError;
use autopar_comm::collective::values::ValueMismatch;
use autopar_comm::collective::CommError;
use autopar_ir::ValueError;
use autopar_lower::Buf;

/// What went wrong inside one instruction, apart from communication.
#[derive(Debug, thiserror::Error)]
pub enum RankError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A parameter's optimizer update failed.
    #[error("'{param}': {source}")]
    Update { param: String, source: BackendError },
    /// A received or gathered buffer is not the tensor it should be.
    #[error(transparent)]
    Received(#[from] ValueMismatch),
    /// A gradient bucket could not be laid out or cut back.
    #[error(transparent)]
    Bucket(#[from] BucketError),
    /// A data input could not be built.
    #[error(transparent)]
    Value(#[from] ValueError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("no tensor '{0}' in the training graph")]
    NoTensor(String),
    #[error("tensor '{0}' has unbound dims")]
    UnboundDims(String),
    #[error("no node '{0}'")]
    NoNode(String),
    #[error("'{0}' has no input")]
    NoInput(String),
    #[error("constant '{0}' has no data")]
    NoData(String),
    #[error("buffer {0} is not here (freed, never received or never computed)")]
    NoBuffer(Buf),
    #[error("no gradient of '{0}' was accumulated")]
    NotAccumulated(String),
    /// An optimizer step found no gradient (reduced away, or never made).
    #[error("no gradient of '{0}'")]
    NoGradient(String),
    #[error("parameter '{0}' is not held by this rank")]
    NotHeld(String),
    /// A checkpoint asked for optimizer state the rank has not made.
    #[error("no optimizer state of '{0}' to save")]
    NoState(String),
    #[error("parameter '{0}' is not held whole here")]
    NotWhole(String),
    #[error("gathered pieces differ in size")]
    UnevenGather,
    #[error("nothing to reduce-scatter")]
    NothingToScatter,
    /// A counted exchange's rows do not fit its tensors (a bad count).
    #[error("'{0}': its row counts do not fit its tensors")]
    BadCounts(String),
    /// Only whole leading-dim blocks are exchanged all-to-all.
    #[error("'{0}': an all-to-all exchanges blocks of dim 0 only")]
    AllToAllAxis(String),
    /// The test hook of [`crate::TrainOptions::fault`].
    #[error("injected failure (test hook)")]
    Injected,
}

/// A failure inside one instruction: a communication error (already names
/// rank and instruction) or anything else (named by the caller).
#[derive(Debug)]
pub(crate) enum Failure {
    Comm(CommError),
    Rank(RankError),
}

impl From<CommError> for Failure {
    fn from(e: CommError) -> Failure {
        Failure::Comm(e)
    }
}

/// Whatever becomes a [`RankError`] becomes a failure with `?`.
macro_rules! rank_failure {
    ($($from:ty),*) => {$(
        impl From<$from> for Failure {
            fn from(e: $from) -> Failure {
                Failure::Rank(e.into())
            }
        }
    )*};
}

rank_failure!(
    RankError,
    BackendError,
    BucketError,
    ValueMismatch,
    ValueError,
    DataError
);

//! Training pieces the per-rank programs run: optimizers stepping flat
//! slices (`optim`), deterministic token batches (`data`) and initial
//! weights for weightless graphs (`init`). Each is a pure function of its
//! inputs and a seed, never of how many ranks share the work, so a parallel
//! run can be checked against a single-process one.

mod data;
mod init;
mod optim;
mod random;

pub use data::{Arrays, Data, DataError, TokenSource};
pub use init::{initialize, InitError, INIT_STD};
pub use optim::{decays, Corrections, OptimError, Optimizer, State, DEFAULT_ADAMW_LR, DEFAULT_SGD_LR};

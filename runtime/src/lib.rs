//! Execution of autopar graphs: the CPU reference interpreter (`cpu`),
//! lowering of a plan to per-rank
//! programs (`lower`), in-process collectives between rank threads
//! (`collective`), the training pieces they run (`train`), the CUDA backend
//! (`cuda`, behind the `cuda` feature) and the simulator (`sim`).
//!
//! Architecture invariant: the runtime executes what it is given; it never
//! re-plans or rewrites a graph.

/// Reverse-mode autodiff, which lives in `ir` beside the ops' backward
/// rules; re-exported for the callers that found it here.
pub use autopar_ir::autodiff;
pub mod collective;
pub mod cpu;
pub mod cuda;
pub mod launch;
pub mod lower;
pub mod session;
pub mod sim;
pub mod trace;
pub mod train;

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
pub mod cpu;
pub mod cuda;
/// Collectives and launch, now their own crate; re-exported for the paths
/// that name them here.
pub use autopar_comm::{collective, launch};
/// Execution's training pieces and traces, now in `autopar-exec`;
/// re-exported for the paths that name them here.
pub use autopar_exec::{trace, train};
/// Lowering, now its own crate; re-exported for the paths that name it here.
pub use autopar_lower as lower;
/// The simulator, now its own crate; re-exported for the paths that name it here.
pub use autopar_sim as sim;

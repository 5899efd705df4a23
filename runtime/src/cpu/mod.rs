//! The CPU backend and host profiler, now `autopar-cpu` over `autopar-exec`,
//! and the reference interpreter, now `autopar_ir::interp`; re-exported for
//! the paths that name them here.

pub use autopar_cpu::profile;
pub use autopar_ir::interp::{compare, run, run_with, Comparison, Precision, RunError};

/// The rank interpreter (`autopar-exec`) with the CPU backend's entry points.
pub mod parallel {
    pub use autopar_cpu::{train, train_rank, CpuBackend};
    pub use autopar_exec::*;
}

//! The threaded CPU backend (`parallel`) and the host profiler (`profile`);
//! the reference interpreter they build on lives in `autopar_ir::interp`.

pub mod parallel;
pub mod profile;

pub use autopar_ir::interp::{compare, run, run_with, Comparison, Precision, RunError};

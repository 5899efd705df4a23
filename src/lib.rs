//! The `autopar` command line, as a library so tests drive the same code the
//! binary runs. Each command is one module with a function that returns a
//! report (data) and a renderer for people; `main.rs` only parses arguments.

pub mod check;
pub mod compare;
pub mod convert;
pub mod errors;
pub mod estimate;
pub mod export;
pub mod export_weights;
pub mod host_profile;
pub mod inspect;
pub mod limits;
pub mod model;
pub mod output;
pub mod plan;
pub mod profile;
pub mod replan;
pub mod report;
pub mod run;
pub mod simulate;
pub mod units;

//! Lowering: a plan and a model become one [`Program`] per rank. The
//! model's training graph (forward, loss, backward) is split into pipeline
//! stages and phases ([`partition`]), each stage's tasks are ordered by the
//! schedule ([`schedule`]), and each rank's instruction list is emitted with
//! the point-to-point transfers, gradient reductions, optimizer steps and
//! ZeRO parameter traffic the plan implies ([`emit`](self)).
//!
//! Architecture invariant: nothing here executes a program, moves a value
//! between ranks or touches a device; lowering is a pure function of the
//! model and the plan, which the executors (`autopar-exec` and the
//! backends) and the simulator (`autopar-sim`) only read.

pub mod blocking;
mod emit;
pub mod expert_parallel;
pub mod objective;
pub mod partition;
pub mod program;
pub mod schedule;
pub mod strategy;
pub mod tensor_parallel;
pub mod training;

pub use objective::{
    bidirectional, infer_objective, plan_objective, planned_objective, FeatureInput, Feed, Objective, Task,
};
pub use program::{Buf, Coord, Instr, ParamSlot, Program, Shard};
pub use strategy::{Strategy, StrategyError};
pub use tensor_parallel::WeightSlice;
pub use training::{for_strategy, training_graph, TrainingError, TrainingGraph};

/// Why a plan could not be lowered.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    #[error(transparent)]
    Partition(#[from] partition::PartitionError),
    #[error("pipeline schedule: {0}")]
    Schedule(#[from] schedule::ScheduleError),
    #[error("{0} is not supported yet")]
    Unsupported(String),
    #[error("internal lowering error: {0}")]
    Internal(String),
}

/// Every rank's program for one training step of `t` under `s`.
pub fn lower(t: &TrainingGraph, s: &Strategy) -> Result<Vec<Program>, LowerError> {
    s.check()?;
    let layer_vs = s.layer_virtual_stages();
    let part = partition::partition(t, &layer_vs, s.pp * s.chunks)?;
    let layout = emit::Layout::new(t, s, &part);
    (0..s.world()).map(|rank| layout.program(rank)).collect()
}

/// Lowers the programs of `ranks` only, in parallel, handing each to `f`
/// as it is made: a simulator replays one representative rank of each
/// group of identical ones and keeps only what it compiled from each.
pub fn lower_ranks<R: Send>(
    t: &TrainingGraph,
    s: &Strategy,
    ranks: &[usize],
    f: impl Fn(Program) -> R + Sync,
) -> Result<Vec<R>, LowerError> {
    use rayon::prelude::*;
    s.check()?;
    let layer_vs = s.layer_virtual_stages();
    let part = partition::partition(t, &layer_vs, s.pp * s.chunks)?;
    let layout = emit::Layout::new(t, s, &part);
    ranks
        .par_iter()
        .map(|&rank| layout.program(rank).map(&f))
        .collect()
}

/// The programs of a tiny zoo GPT (`layers` layers, hidden 32, sequence 8)
/// under `s`, for tests of what reads programs (other crates' tests get it
/// with the `testing` feature).
#[cfg(any(test, feature = "testing"))]
pub fn tiny_gpt_programs(layers: usize, s: &Strategy) -> Vec<Program> {
    let spec = format!("gpt:layers={layers},hidden=32,heads=4,vocab=64,seq=8");
    let g = autopar_import::zoo::build(&spec).unwrap();
    let t = for_strategy(&g, s, 8, Objective::Lm).unwrap();
    lower(&t, s).unwrap()
}

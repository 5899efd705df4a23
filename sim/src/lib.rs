//! The simulator: a plan's per-rank programs replayed in virtual time.
//!
//! Lowering makes the programs ([`autopar_lower`]); [`pricing`] gives every
//! instruction a duration from the cost models (or a measured calibration);
//! [`compile`] turns each program into lanes, durations and dependencies;
//! [`engine`] replays them, one compute and one communication stream per
//! rank, sends before receives, collectives when every member has arrived.
//! Big plans replay one representative rank per pipeline stage
//! ([`ranks`]); the report says when it did.
//!
//! Architecture invariant: nothing here executes an op or moves a value;
//! the simulator only prices and replays the programs lowering made, and
//! borrows from execution no more than its trace format (`autopar_exec::trace`).

pub mod compile;
pub mod engine;
pub mod pricing;
pub mod ranks;
pub mod report;

use autopar_exec::trace::{Stream, TraceEvent};
use autopar_lower::{self as lower, LowerError, Strategy, TrainingGraph};
use compile::{Compiler, GraphIndex, Lane};
pub use pricing::{Pricing, PricingError, PricingOptions};
use ranks::Representatives;
pub use report::{RankReport, Simulation, Term};

/// How to simulate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimOptions {
    /// Replay every rank, not one per pipeline stage.
    pub every_rank: bool,
    /// Keep every instruction's span and the memory curve (for a trace).
    pub trace: bool,
}

/// Why a plan could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Lower(#[from] LowerError),
    #[error(transparent)]
    Pricing(#[from] PricingError),
    #[error(transparent)]
    Deadlock(#[from] engine::Deadlock),
}

/// Simulates one training step of `t` under `s`, priced by `pricing`.
pub fn simulate(
    t: &TrainingGraph,
    s: &Strategy,
    pricing: &Pricing,
    opts: &SimOptions,
) -> Result<Simulation, SimError> {
    let reps = if opts.every_rank {
        Representatives::all(s.world())
    } else {
        Representatives::per_stage(s)
    };
    let index = GraphIndex::new(t, s.zero, pricing);
    let compiler = Compiler {
        index: &index,
        pricing,
        reps: &reps,
        labels: opts.trace,
        micro_batches: s.micro_batches.max(1),
    };
    let programs = lower::lower_ranks(t, s, &reps.ranks, |p| compiler.compile(&p))?;
    let timelines = engine::replay(&programs)?;
    let trace = if opts.trace {
        trace_events(&programs, &timelines)
    } else {
        Vec::new()
    };
    Ok(Simulation::new(s, &reps, &programs, timelines, trace))
}

/// The replay as trace events: a span per timed instruction, a memory sample per change.
fn trace_events(programs: &[compile::Compiled], timelines: &[engine::Timeline]) -> Vec<TraceEvent> {
    let mut out = Vec::new();
    for (p, t) in programs.iter().zip(timelines) {
        for &(lane, label, start, seconds) in &t.spans {
            out.push(TraceEvent::Span {
                rank: p.rank,
                stream: match lane {
                    Lane::Compute => Stream::Compute,
                    Lane::Transfer => Stream::Transfers,
                    Lane::Gradient => Stream::Gradients,
                    Lane::Collective | Lane::None => Stream::Communication,
                },
                name: p.labels.get(label).cloned().unwrap_or_default(),
                step: 0,
                start_us: start * 1e6,
                duration_us: seconds * 1e6,
            });
        }
        for &(at, bytes) in &t.memory {
            out.push(TraceEvent::Memory {
                rank: p.rank,
                at_us: at * 1e6,
                bytes: bytes as u64,
            });
        }
    }
    out
}

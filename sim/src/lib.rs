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

use autopar_cost_models::{host_threads_per_rank, Calibration, Cluster, ClusterError, Schedule};
use autopar_exec::trace::{Stream, TraceEvent};
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{self as lower, LowerError, Program, Strategy, TrainingGraph};
use autopar_planner::{plan_candidate, Candidate, ModelId, Plan, SearchOptions, SearchResult};
pub use compile::Activity;
use compile::{Compiler, GraphIndex, Lane};
pub use pricing::{Pricing, PricingError, PricingOptions};
use ranks::Representatives;
pub use report::{RankReport, Simulation, Term, TimelineRow};

/// How to simulate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimOptions {
    /// Replay every rank, not one per pipeline stage.
    pub every_rank: bool,
    /// Keep every instruction's span and the memory curve (for a trace).
    pub trace: bool,
    /// On the `cpu` preset, the threads each rank splits its large
    /// products over (`None`: the run's default, its share of this host).
    pub threads_per_rank: Option<usize>,
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
    #[error("the plan's cluster '{name}'")]
    Cluster {
        name: String,
        #[source]
        source: ClusterError,
    },
    #[error("{given} programs for a plan of {world} ranks")]
    Programs { given: usize, world: usize },
    #[error(transparent)]
    Strategy(#[from] lower::StrategyError),
    #[error(transparent)]
    Training(#[from] lower::TrainingError),
    #[error("the model's sequence length is symbolic and the plan does not give it")]
    Sequence,
}

/// Simulates one training step of `t` under `s`, priced by `pricing`.
pub fn simulate(
    t: &TrainingGraph,
    s: &Strategy,
    pricing: &Pricing,
    opts: &SimOptions,
) -> Result<Simulation, SimError> {
    replay(t, s, pricing, opts, None)
}

/// Simulates plan `p` (lowered as `s` over training graph `t`) priced under
/// `calibration`, and says whether nodes were priced from measured per-op
/// rates. On the `cpu` preset, ranks beyond this host's cores share them.
/// `programs`, when the caller has lowered them already (every rank, in rank
/// order), are replayed as they are instead of lowered again.
pub fn simulate_plan(
    p: &Plan,
    t: &TrainingGraph,
    s: &Strategy,
    programs: Option<&[Program]>,
    calibration: &Calibration,
    precision: Precision,
    opts: &SimOptions,
) -> Result<(Simulation, bool), SimError> {
    let cluster = plan_cluster(p)?;
    let pricing = plan_pricing(p, t, s, &cluster, calibration, precision, opts.threads_per_rank)?;
    let sim = replay(t, s, &pricing, opts, programs)?;
    Ok((sim, pricing.per_node))
}

/// How plan `p`'s instructions are priced on `cluster` (the plan's) under `calibration`.
fn plan_pricing<'a>(
    p: &Plan,
    t: &TrainingGraph,
    s: &Strategy,
    cluster: &'a Cluster,
    calibration: &'a Calibration,
    precision: Precision,
    threads_per_rank: Option<usize>,
) -> Result<Pricing<'a>, SimError> {
    let pricing_opts = PricingOptions {
        attention: p.parallel.attention,
        dropout: p.parallel.dropout,
        precision,
    };
    let pricing = Pricing::new(t, cluster, calibration, &pricing_opts)?;
    if p.inputs.cluster.name != "cpu" {
        return Ok(pricing);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = threads_per_rank.unwrap_or_else(|| host_threads_per_rank(s.world()));
    Ok(pricing.sharing_cores(t, s.world(), cores, threads))
}

/// Plan `p`'s strategy and training graph over `model`, built as `autopar
/// run` builds them (for the objective the plan was made for).
fn lower_model_plan(p: &Plan, model: &Graph) -> Result<(Strategy, TrainingGraph), SimError> {
    let strategy = Strategy::from_plan(p)?;
    let seq = model
        .inputs
        .first()
        .and_then(|&t| model.tensor(t).ty.shape.0.get(1)?.fixed())
        .or(p.inputs.seq)
        .or_else(|| model.bindings.get("seq").copied())
        .ok_or(SimError::Sequence)?;
    let t = lower::for_strategy(model, &strategy, seq, lower::plan_objective(p, model)?)?;
    Ok((strategy, t))
}

/// Simulates plan `p` of `model` (the canonical graph it was planned on)
/// priced under `calibration`, lowering it as `autopar run` would: what
/// the consistency checks replay.
pub fn simulate_model_plan(
    p: &Plan,
    model: &Graph,
    calibration: &Calibration,
) -> Result<Simulation, SimError> {
    let (strategy, t) = lower_model_plan(p, model)?;
    let opts = SimOptions::default();
    Ok(simulate_plan(p, &t, &strategy, None, calibration, Precision::F32, &opts)?.0)
}

/// Plan `p`'s simulated step seconds, as [`simulate_model_plan`] reports
/// them, in a fraction of its time when a one-chunk pipeline runs many more
/// micro-batches than it has stages: what `autopar plan --verify` reports.
///
/// Once the pipeline is full, each further micro-batch adds the same
/// instructions in the same order to every rank, so every lane of every
/// rank ends a fixed time later per micro-batch. Two replays past the fill,
/// at `m` and `m + 1` micro-batches, give each lane's end and its growth;
/// the step is the latest lane end extended to the plan's count. Lanes are
/// extended one by one, so one that ends early but grows faster
/// (data-parallel traffic falling behind the computation) still ends last
/// where it would. `tests/periodic.rs` pins this to the full replay; the
/// consistency bench measures it on every plan it replays (exact to 1e-12
/// on 119 of 122; on three Llama 405B plans with cp 16, a lane that falls
/// behind past the fill leaves it 0.023 % short).
pub fn simulate_model_plan_step(p: &Plan, model: &Graph, calibration: &Calibration) -> Result<f64, SimError> {
    let (strategy, t) = lower_model_plan(p, model)?;
    let cluster = plan_cluster(p)?;
    let opts = SimOptions::default();
    let pricing = plan_pricing(p, &t, &strategy, &cluster, calibration, Precision::F32, None)?;
    let Some((fill, period)) = steady_fill(&strategy) else {
        return Ok(replay(&t, &strategy, &pricing, &opts, None)?.step_time_s);
    };
    let lane_ends = |micro_batches: usize| -> Result<Vec<f64>, SimError> {
        let s = Strategy {
            micro_batches,
            ..strategy.clone()
        };
        let sim = replay(&t, &s, &pricing, &opts, None)?;
        Ok(sim.timelines.iter().flat_map(|tl| tl.lane_end_s).collect())
    };
    let (first, second) = (lane_ends(fill)?, lane_ends(fill + period)?);
    let more = (strategy.micro_batches - fill - period) as f64 / period as f64;
    Ok(first
        .iter()
        .zip(&second)
        .map(|(&a, &b)| b + (b - a) * more)
        .fold(0.0, f64::max))
}

/// The smaller micro-batch count [`simulate_model_plan_step`] replays, and
/// the period it extends by: past the pipeline's fill, where every stage's
/// last forward task already follows a backward one (with `pp` micro-batches,
/// the first stage's last forward still follows its warm-up directly, and its
/// sends end a whole round trip early), one micro-batch at a time. The
/// interleaved schedule runs micro-batches in groups of `pp` per chunk, so it
/// is replayed for two and three groups and extended a group at a time (on
/// the consistency bench's interleaved plans and in `tests/periodic.rs` this
/// matches the full replay to 1e-9). `None` where replaying the shorter runs
/// costs no less than the plan itself.
fn steady_fill(s: &Strategy) -> Option<(usize, usize)> {
    let (fill, period) = match s.schedule {
        Schedule::Interleaved => (2 * s.pp, s.pp),
        Schedule::OneFOneB | Schedule::Gpipe => (s.pp + 1, 1),
    };
    (2 * fill + period < s.micro_batches).then_some((fill, period))
}

/// Candidate `c` of the search `found` made into its plan (per-op sharding
/// solved and priced) and simulated: the estimate beside the replay, for
/// every plan the planner could emit.
pub fn simulate_candidate(
    model: &Graph,
    id: &ModelId,
    cluster: &Cluster,
    calibration: &Calibration,
    opts: &SearchOptions,
    found: &SearchResult,
    c: &Candidate,
) -> Result<(Plan, Simulation), String> {
    let plan = plan_candidate(model, id, cluster, calibration, opts, found, c).map_err(|e| e.to_string())?;
    let sim = simulate_model_plan(&plan, model, calibration).map_err(|e| e.to_string())?;
    Ok((plan, sim))
}

/// The cluster plan `p` was made for, sized to its ranks.
pub fn plan_cluster(p: &Plan) -> Result<Cluster, SimError> {
    let name = &p.inputs.cluster.name;
    Cluster::load(name)
        .and_then(|c| c.with_gpus(p.mesh.ranks.len()))
        .map_err(|source| SimError::Cluster {
            name: name.clone(),
            source,
        })
}

/// Compiles the representative ranks' programs (`programs`, or lowered
/// here) and replays them.
fn replay(
    t: &TrainingGraph,
    s: &Strategy,
    pricing: &Pricing,
    opts: &SimOptions,
    programs: Option<&[Program]>,
) -> Result<Simulation, SimError> {
    use rayon::prelude::*;
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
    let programs = match programs {
        None => lower::lower_ranks(t, s, &reps.ranks, |p| compiler.compile(&p))?,
        Some(given) if given.len() != s.world() => {
            return Err(SimError::Programs {
                given: given.len(),
                world: s.world(),
            })
        }
        Some(given) => reps
            .ranks
            .par_iter()
            .map(|&r| compiler.compile(&given[r]))
            .collect(),
    };
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

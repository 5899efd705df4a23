//! `autopar simulate`: replay a plan's per-rank programs in virtual time
//! and set the result next to the analytic estimate, term by term.

use crate::units::{binary, seconds};
use crate::{model, output, plan, run};
use anyhow::{Context, Result};
use autopar_cost_models::{estimate, Calibration, Estimate};
use autopar_exec::trace::chrome_json;
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{for_strategy, plan_objective, Strategy};
use autopar_planner::{planned_workload, Plan};
use autopar_sim::{plan_cluster, simulate_plan, RankReport, SimOptions, Simulation, Term};
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub plan: PathBuf,
    /// Price with this calibration (e.g. from `autopar profile`) instead of the defaults.
    pub calibration: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// Replay every rank instead of one per pipeline stage.
    pub every_rank: bool,
    /// On the `cpu` preset: threads each rank splits its products over
    /// (default: its share of this host's cores, as `run`'s).
    pub threads: Option<usize>,
}

/// What a simulation found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    pub world: usize,
    pub simulated_ranks: usize,
    /// How ranks were folded, when they were.
    pub representatives: Option<String>,
    pub step_time_s: f64,
    pub analytic_step_time_s: f64,
    pub bubble_fraction: f64,
    /// Where the slowest stage's step goes, analytic next to simulated.
    pub terms: Vec<Term>,
    /// `analytic kernels` or `measured per-op rates`.
    pub pricing: String,
    pub per_rank: Vec<RankReport>,
    #[serde(skip)]
    pub timeline: String,
}

/// A plan replayed, and the analytic estimate it is set against.
pub struct Simulated {
    pub sim: Simulation,
    /// Priced with measured per-op rates rather than analytic kernels.
    pub per_node: bool,
    pub analytic: Estimate,
}

/// The model the plan `p` (read from `plan_arg`) was made for, bound to
/// the plan's shapes and canonicalised; its file must be the one planned.
pub fn plan_graph(p: &Plan, plan_arg: &str) -> Result<Graph> {
    run::check_model(p, plan_arg, &p.inputs.model)?;
    model::canonical(&model::load_with(&p.inputs.model, model::Axes::of_plan(p))?)
}

/// Lowers the plan `p` (read from `plan_arg`) of `graph` ([`plan_graph`])
/// and replays its programs, priced with `calibration` (default: the cost
/// models' own figures).
pub fn simulate(
    p: &Plan,
    plan_arg: &str,
    graph: &Graph,
    calibration: Option<&Path>,
    opts: &SimOptions,
) -> Result<Simulated> {
    let model_arg = &p.inputs.model;
    let strategy = Strategy::from_plan(p).with_context(|| format!("{plan_arg}: lowering the plan"))?;
    let seq = run::seq_of(graph, p)?;
    let objective = plan_objective(p, graph).with_context(|| model_arg.clone())?;
    let t = for_strategy(graph, &strategy, seq, objective).with_context(|| model_arg.clone())?;
    let cal = match calibration {
        Some(path) => Calibration::load(path)?,
        None => Calibration::default(),
    };
    let (sim, per_node) = simulate_plan(p, &t, &strategy, None, &cal, Precision::F32, opts)
        .with_context(|| plan_arg.to_string())?;
    let analytic = match calibration {
        Some(_) => analytic_estimate(p, graph, &cal, plan_arg)?,
        None => p.predicted.clone(),
    };
    Ok(Simulated {
        sim,
        per_node,
        analytic,
    })
}

/// Simulates the plan in `r`.
pub fn run(r: &Request) -> Result<Report> {
    if let Some(path) = &r.trace {
        output::check_folder(path)?;
    }
    let plan_arg = r.plan.display().to_string();
    let p = plan::load(&r.plan)?;
    if r.threads == Some(0) {
        anyhow::bail!("--threads 0: a rank needs at least one thread");
    }
    let sim_opts = SimOptions {
        every_rank: r.every_rank,
        trace: r.trace.is_some(),
        threads_per_rank: r.threads,
    };
    let Simulated {
        sim,
        per_node,
        analytic,
    } = simulate(
        &p,
        &plan_arg,
        &plan_graph(&p, &plan_arg)?,
        r.calibration.as_deref(),
        &sim_opts,
    )?;
    if let Some(path) = &r.trace {
        let ranks: Vec<usize> = sim.per_rank.iter().map(|r| r.rank).collect();
        let json = chrome_json(&sim.trace, &ranks);
        output::write_atomic(path, serde_json::to_string(&json)?.as_bytes())?;
    }
    Ok(Report {
        model: p.inputs.model.clone(),
        world: sim.world,
        simulated_ranks: sim.simulated_ranks,
        representatives: representatives(&sim),
        step_time_s: sim.step_time_s,
        analytic_step_time_s: analytic.step_time_s,
        bubble_fraction: sim.bubble_fraction,
        terms: sim.terms(&analytic.breakdown),
        pricing: pricing(per_node).into(),
        timeline: sim.timeline(96, 16),
        per_rank: sim.per_rank,
    })
}

/// How ranks were folded into representatives, when they were.
pub fn representatives(sim: &Simulation) -> Option<String> {
    sim.reduced().then(|| {
        format!(
            "replayed one rank per pipeline stage ({} of {}); the other ranks of a stage differ only in their tensor-, context- or data-parallel place and run the same program, so their timelines are the same",
            sim.simulated_ranks, sim.world
        )
    })
}

/// What priced the simulation.
pub fn pricing(per_node: bool) -> &'static str {
    if per_node {
        "measured per-op rates"
    } else {
        "analytic kernels"
    }
}

/// The plan's analytic estimate (of its per-op sharding) under another calibration.
fn analytic_estimate(
    p: &Plan,
    graph: &Graph,
    calibration: &Calibration,
    plan_arg: &str,
) -> Result<autopar_cost_models::Estimate> {
    let cluster = &plan_cluster(p).with_context(|| plan_arg.to_string())?;
    let cfg = p.training_config();
    let w = planned_workload(graph, &cfg, &p.sharding).with_context(|| p.inputs.model.clone())?;
    Ok(estimate(&w, cluster, calibration, &cfg)?)
}

/// The report for people.
pub fn render(r: &Report, trace: Option<&Path>) -> String {
    let mut out = String::new();
    let gap = (r.step_time_s / r.analytic_step_time_s - 1.0) * 100.0;
    let _ = writeln!(out, "model      {}", r.model);
    let _ = writeln!(
        out,
        "step time  {} simulated, {} analytic ({gap:+.1} %), priced by {}",
        seconds(r.step_time_s),
        seconds(r.analytic_step_time_s),
        r.pricing
    );
    let _ = writeln!(
        out,
        "bubble     {:.1} % of the step idle in the pipeline (mean over ranks)",
        100.0 * r.bubble_fraction
    );
    if let Some(note) = &r.representatives {
        let _ = writeln!(out, "ranks      {}: {note}", r.world);
    } else {
        let _ = writeln!(out, "ranks      {}, every one replayed", r.world);
    }
    let _ = writeln!(out, "\nwhere the slowest stage's step goes:");
    let _ = writeln!(
        out,
        "  {:<28} {:>12} {:>12} {:>12}",
        "term", "analytic", "simulated", "difference"
    );
    for t in &r.terms {
        if t.analytic_s == 0.0 && t.simulated_s == 0.0 {
            continue;
        }
        let _ = writeln!(
            out,
            "  {:<28} {:>12} {:>12} {:>12}",
            t.term,
            seconds(t.analytic_s),
            seconds(t.simulated_s),
            signed_seconds(t.simulated_s - t.analytic_s)
        );
    }
    if let Some(t) = r.terms.iter().max_by(|a, b| {
        (a.simulated_s - a.analytic_s)
            .abs()
            .total_cmp(&(b.simulated_s - b.analytic_s).abs())
    }) {
        let _ = writeln!(
            out,
            "  the largest difference is {}: {} simulated against {} analytic",
            t.term,
            seconds(t.simulated_s),
            seconds(t.analytic_s)
        );
    }
    let _ = writeln!(out, "\nper rank:");
    let _ = writeln!(
        out,
        "  {:>6} {:>5} {:>7} {:>12} {:>12} {:>12} {:>12} {:>11}",
        "rank", "stage", "ranks", "busy", "comm", "idle", "bubble", "peak memory"
    );
    for rank in r.per_rank.iter().take(32) {
        let _ = writeln!(
            out,
            "  {:>6} {:>5} {:>7} {:>12} {:>12} {:>12} {:>12} {:>11}",
            rank.rank,
            rank.stage,
            rank.represents,
            seconds(rank.busy_s),
            seconds(rank.communication_s),
            seconds(rank.idle_s),
            seconds(rank.bubble_s),
            binary(rank.peak_memory_bytes)
        );
    }
    if r.per_rank.len() > 32 {
        let _ = writeln!(out, "  ({} more; --json lists all)", r.per_rank.len() - 32);
    }
    let _ = writeln!(out, "\ntimeline (compute stream, the whole step across):");
    out.push_str(&r.timeline);
    if let Some(path) = trace {
        let _ = writeln!(
            out,
            "\nwrote {} (open it in Perfetto or chrome://tracing)",
            path.display()
        );
    }
    out
}

fn signed_seconds(d: f64) -> String {
    if d < 0.0 {
        format!("-{}", seconds(-d))
    } else {
        format!("+{}", seconds(d))
    }
}

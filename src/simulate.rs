//! `autopar simulate`: replay a plan's per-rank programs in virtual time
//! and set the result next to the analytic estimate, term by term.

use crate::units::{binary, seconds};
use crate::{model, output, plan, run};
use anyhow::{Context, Result};
use autopar_cost_models::{estimate, Calibration};
use autopar_exec::trace::chrome_json;
use autopar_ir::interp::Precision;
use autopar_lower::{for_strategy, Objective, Strategy};
use autopar_planner::{planned_workload, Plan};
use autopar_sim::{plan_cluster, simulate_plan, RankReport, SimOptions, Term};
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

/// Simulates the plan in `r`.
pub fn run(r: &Request) -> Result<Report> {
    if let Some(path) = &r.trace {
        output::check_folder(path)?;
    }
    let plan_arg = r.plan.display().to_string();
    let p = plan::load(&r.plan)?;
    let model_arg = p.inputs.model.clone();
    run::check_model(&p, &plan_arg, &model_arg)?;
    let graph = model::canonical(&model::load_with(&model_arg, model::Axes::of_plan(&p))?)?;
    let strategy = Strategy::from_plan(&p).with_context(|| format!("{plan_arg}: lowering the plan"))?;
    let seq = run::seq_of(&graph, &p)?;
    let objective = Objective::infer(&graph).with_context(|| model_arg.clone())?;
    let t = for_strategy(&graph, &strategy, seq, objective).with_context(|| model_arg.clone())?;
    let calibration = match &r.calibration {
        Some(path) => Calibration::load(path)?,
        None => Calibration::default(),
    };
    let sim_opts = SimOptions {
        every_rank: r.every_rank,
        trace: r.trace.is_some(),
    };
    let (sim, per_node) = simulate_plan(&p, &t, &strategy, None, &calibration, Precision::F32, &sim_opts)
        .with_context(|| plan_arg.clone())?;
    let analytic = match &r.calibration {
        Some(_) => analytic_estimate(&p, &graph, &calibration, &plan_arg)?,
        None => p.predicted.clone(),
    };
    if let Some(path) = &r.trace {
        let ranks: Vec<usize> = sim.per_rank.iter().map(|r| r.rank).collect();
        let json = chrome_json(&sim.trace, &ranks);
        output::write_atomic(path, serde_json::to_string(&json)?.as_bytes())?;
    }
    let representatives = sim.reduced().then(|| {
        format!(
            "replayed one rank per pipeline stage ({} of {}); the other ranks of a stage differ only in their tensor-, context- or data-parallel place and run the same program, so their timelines are the same",
            sim.simulated_ranks, sim.world
        )
    });
    Ok(Report {
        model: model_arg,
        world: sim.world,
        simulated_ranks: sim.simulated_ranks,
        representatives,
        step_time_s: sim.step_time_s,
        analytic_step_time_s: analytic.step_time_s,
        bubble_fraction: sim.bubble_fraction,
        terms: sim.terms(&analytic.breakdown),
        pricing: if per_node {
            "measured per-op rates".into()
        } else {
            "analytic kernels".into()
        },
        timeline: sim.timeline(96, 16),
        per_rank: sim.per_rank,
    })
}

/// The plan's analytic estimate (of its per-op sharding) under another calibration.
fn analytic_estimate(
    p: &Plan,
    graph: &autopar_ir::Graph,
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

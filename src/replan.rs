//! `autopar replan`: after losing GPUs, a plan for the ones left — the
//! checkpoint's model, global batch and sequence on `--gpus M` — that
//! `autopar run PLAN --resume DIR` continues from the checkpoint with
//! (resharding its weights and optimizer state).

use crate::{model, plan, run};
use anyhow::{Context, Result};
use autopar_exec::checkpoint;
use autopar_planner::Plan;
use std::path::{Path, PathBuf};

/// What was planned.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Replanned {
    /// The checkpoint folder read (`DIR/step-<S>`).
    pub checkpoint: String,
    pub step: usize,
    pub output: String,
    pub plan: Plan,
}

/// Plans the model of the checkpoint `dir` names for `gpus` GPUs of
/// `cluster` (default: the cluster its plan was made for) and writes the
/// plan to `out` (default: `DIR/plan-<gpus>.json`).
pub fn run(dir: &Path, gpus: usize, cluster: Option<&str>, out: Option<PathBuf>) -> Result<Replanned> {
    let (step_dir, index) = checkpoint::read_index(dir).with_context(|| dir.display().to_string())?;
    let saved: Plan = serde_json::from_value(index.plan.clone())
        .with_context(|| format!("{}: the checkpoint's plan", step_dir.display()))?;
    let cluster = cluster.unwrap_or(&saved.inputs.cluster.name);
    let out = out.unwrap_or_else(|| dir.join(format!("plan-{gpus}.json")));
    let m = model::load_with(&index.model, model::Axes::training(None, saved.inputs.seq))
        .with_context(|| format!("the checkpoint's model {}", index.model))?;
    let canonical = model::canonical(&m)?;
    let request = plan::Request {
        // What the checkpoint's run trains, as its plan priced it.
        objective: saved.inputs.objective,
        ..run::runnable_request(
            &index.model,
            &canonical,
            cluster,
            gpus,
            saved.inputs.global_batch,
            saved.inputs.seq,
            out.clone(),
        )
    };
    let plan =
        plan::run(&request, &|_, _| {}).with_context(|| format!("planning for {gpus} GPUs of {cluster}"))?;
    Ok(Replanned {
        checkpoint: step_dir.display().to_string(),
        step: index.step,
        output: out.display().to_string(),
        plan,
    })
}

/// The plan as `autopar plan` shows it, and how to continue.
pub fn render(r: &Replanned, dir: &Path) -> String {
    format!(
        "{}\nfrom {} (step {}); continue with: autopar run {} --resume {}\n",
        plan::render(&r.plan, Path::new(&r.output)),
        r.checkpoint,
        r.step,
        r.output,
        dir.display()
    )
}

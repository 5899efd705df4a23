//! `autopar report`: a plan as one self-contained HTML page (no network, no
//! script needed to read it): the mesh on the cluster, the stage map, memory
//! against capacity, where a step's time goes, the simulated pipeline
//! timeline and the ranking with why the winner won.
//!
//! Every figure comes from the layer that owns it: groups from lowering's
//! [`Strategy`] (the ranks its collectives use), memory per stage from the
//! cost model's evaluator, the timeline from the simulator's rows (the same
//! cells `autopar simulate` prints), the ranking and the reasons from the
//! plan file and `explain`.

mod charts;
mod mesh;
mod page;
mod tables;

use crate::output;
use crate::simulate::{self, Simulated};
use anyhow::{Context, Result};
use autopar_cost_models::memory::MemoryBreakdown;
use autopar_cost_models::{Calibration, Cluster, Evaluator, Mesh};
use autopar_lower::Strategy;
use autopar_planner::{planned_workload, Plan};
use autopar_sim::{plan_cluster, SimOptions};
use std::path::{Path, PathBuf};

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct Request {
    pub plan: PathBuf,
    pub output: PathBuf,
    /// Simulate with this calibration instead of the cost models' figures.
    pub calibration: Option<PathBuf>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    pub path: PathBuf,
    pub bytes: usize,
    /// What the page could not show, and why (also said in the page).
    pub notes: Vec<String>,
}

/// Writes the report of the plan file `r.plan`.
pub fn run(r: &Request) -> Result<Written> {
    output::check_folder(&r.output)?;
    let plan = crate::plan::load(&r.plan)?;
    write_report(
        &plan,
        &r.plan.display().to_string(),
        &r.output,
        r.calibration.as_deref(),
    )
}

/// Writes the report of `plan` to `output` (for front ends that hold a plan
/// rather than its file).
pub fn write(plan: &Plan, output: &Path) -> Result<Written> {
    output::check_folder(output)?;
    write_report(plan, &plan.inputs.model, output, None)
}

fn write_report(plan: &Plan, plan_arg: &str, output: &Path, calibration: Option<&Path>) -> Result<Written> {
    let strategy =
        Strategy::from_plan(plan).with_context(|| format!("{plan_arg}: reading the plan's mesh"))?;
    let facts = Facts::gather(plan, plan_arg, calibration);
    let html = page::render(plan, &strategy, &facts);
    output::write_atomic(output, html.as_bytes())?;
    Ok(Written {
        path: output.to_path_buf(),
        bytes: html.len(),
        notes: facts.missing,
    })
}

/// What the report shows beyond the plan file: the simulation and each
/// stage's memory, which need the model. A model that cannot be read
/// leaves those sections out, saying why, rather than no report at all.
pub(crate) struct Facts {
    /// The plan's cluster, when its preset or file can still be read.
    pub cluster: Option<Cluster>,
    pub simulated: Option<Simulated>,
    /// Each pipeline stage's memory by term (the estimate's, per stage).
    pub stage_memory: Vec<MemoryBreakdown>,
    pub missing: Vec<String>,
}

impl Facts {
    fn gather(plan: &Plan, plan_arg: &str, calibration: Option<&Path>) -> Facts {
        let mut missing = Vec::new();
        let cluster = plan_cluster(plan)
            .map_err(|e| missing.push(format!("no link figures or per-stage memory: {e}")))
            .ok();
        let graph = match simulate::plan_graph(plan, plan_arg) {
            Ok(g) => Some(g),
            Err(e) => {
                missing.push(format!(
                    "no simulation or per-stage memory: {}",
                    crate::errors::one_line(&e)
                ));
                None
            }
        };
        let Some(graph) = graph else {
            return Facts {
                cluster,
                simulated: None,
                stage_memory: Vec::new(),
                missing,
            };
        };
        let stage_memory = match &cluster {
            Some(c) => stage_memory(plan, &graph, c).unwrap_or_else(|e| {
                missing.push(format!("no per-stage memory: {}", crate::errors::one_line(&e)));
                Vec::new()
            }),
            None => Vec::new(),
        };
        let simulated = simulate::simulate(plan, plan_arg, &graph, calibration, &SimOptions::default())
            .map_err(|e| missing.push(format!("no simulation: {}", crate::errors::one_line(&e))))
            .ok();
        Facts {
            cluster,
            simulated,
            stage_memory,
            missing,
        }
    }
}

/// Each stage's memory as the plan's estimate prices it (the estimate
/// itself keeps only the peak stage's).
fn stage_memory(plan: &Plan, graph: &autopar_ir::Graph, cluster: &Cluster) -> Result<Vec<MemoryBreakdown>> {
    let cfg = plan.training_config();
    let calibration = Calibration::default();
    let w = planned_workload(graph, &cfg, &plan.sharding)?;
    let ev = Evaluator::new(&w, cluster, &calibration, &Mesh::of(&cfg), cfg.sp)?;
    Ok(ev.stages(&cfg).iter().map(|s| ev.stage_memory(&cfg, s)).collect())
}

//! `autopar plan … --compare FILE`: the found plan next to a configuration
//! a user already runs (Megatron-LM arguments, a torchtitan job TOML or a
//! DeepSpeed config): how much faster the plan is, term by term, and how
//! the two configurations differ.

use crate::estimate::{self, EstimateReport};
use crate::export::{self, Settings, Tool};
use crate::plan;
use crate::units::{binary, seconds};
use anyhow::{Context, Result};
use autopar_planner::Plan;
use std::path::Path;

/// The plan against the user's configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    pub file: String,
    /// Which tool's configuration the file is.
    pub tool: String,
    /// The file's configuration, estimated on the plan's cluster and GPUs.
    pub theirs: EstimateReport,
    pub plan_step_time_s: f64,
    /// How many times faster the plan's step is.
    pub speedup: f64,
    /// Each step-time part's excess in the file's configuration over the
    /// plan's (negative: the plan spends more there), largest first.
    pub by_term: Vec<(String, f64)>,
}

/// Which tool `text` configures: DeepSpeed's JSON, a torchtitan TOML, or
/// Megatron-LM arguments.
fn detect(text: &str) -> Tool {
    if serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| v.is_object()) {
        Tool::Deepspeed
    } else if text
        .parse::<toml::Table>()
        .is_ok_and(|t| t.contains_key("parallelism") || t.contains_key("training"))
    {
        Tool::Torchtitan
    } else {
        Tool::Megatron
    }
}

/// Compares `p`, planned for `r`, with the configuration in `file`.
pub fn compare(p: &Plan, r: &plan::Request, file: &Path) -> Result<Comparison> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--compare {}: cannot read it", file.display()))?;
    let tool = detect(&text);
    let settings: Settings = export::read(tool, file).context("--compare")?;
    let request = estimate::Request {
        model: r.model.clone(),
        cluster: r.cluster.clone(),
        gpus: p.mesh.ranks.len(),
        tp: 1,
        pp: 1,
        dp: None,
        virtual_stages: None,
        layers_per_chunk: None,
        sp: false,
        cp: 1,
        ep: 1,
        zero: 0,
        global_batch: r.global_batch,
        micro_batch: None,
        seq: r.seq,
        recompute: autopar_cost_models::Recompute::None,
        schedule: autopar_cost_models::Schedule::OneFOneB,
        attention: r.attention,
        dropout: r.dropout,
        moe_capacity_factor: r.moe_capacity_factor,
        objective: r.objective,
        overlap_grad_reduce: true,
        grad_bucket_mib: autopar_cost_models::DEFAULT_BUCKET_MIB,
        tp_comm_overlap: false,
        overlap_param_gather: false,
        f32_main_grads: false,
        f32_cross_entropy: false,
        grad_compression: None,
        mesh_order: Default::default(),
        calibration: r.calibration.clone(),
    }
    .with(&settings);
    let theirs =
        estimate::run(&request).with_context(|| format!("--compare {}: estimating it", file.display()))?;
    let ours = &p.predicted;
    let mut by_term: Vec<(String, f64)> = theirs
        .estimate
        .breakdown
        .parts()
        .iter()
        .zip(ours.breakdown.parts())
        .map(|(&(name, t), (_, o))| (name.to_string(), t - o))
        .filter(|(_, d)| d.abs() > 1e-9 * ours.step_time_s)
        .collect();
    by_term.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
    Ok(Comparison {
        file: file.display().to_string(),
        tool: tool.name().to_string(),
        speedup: theirs.estimate.step_time_s / ours.step_time_s,
        plan_step_time_s: ours.step_time_s,
        theirs,
        by_term,
    })
}

/// For people: the verdict, the terms, and the two configurations.
pub fn render(c: &Comparison, p: &Plan) -> String {
    let t = &c.theirs;
    let cfg = &t.config;
    let terms: Vec<String> = c
        .by_term
        .iter()
        .map(|(name, d)| match *d > 0.0 {
            true => format!("{name} +{}", seconds(*d)),
            false => format!("{name} −{}", seconds(-d)),
        })
        .collect();
    let pp = &p.parallel;
    format!(
        "\ncompared with {} ({}): dp {} · tp {}{} · pp {} · cp {} · ep {}, {} ({} chunks), ZeRO {}, micro-batch {} × {}, recompute {}\n  its step {} against this plan's {}: the plan is {:.2}× {}{}\n  this plan: dp {} · tp {}{} · pp {} · cp {} · ep {}, {} ({} chunks), ZeRO {}, micro-batch {} × {}, recompute {}\n  memory per GPU: {} ({}) against the plan's {}\n",
        c.file,
        c.tool,
        cfg.dp,
        cfg.tp,
        if cfg.sp { " (sp)" } else { "" },
        cfg.pp,
        cfg.cp,
        cfg.ep,
        cfg.schedule,
        cfg.virtual_stages,
        cfg.zero,
        cfg.micro_batch,
        cfg.micro_batches,
        cfg.recompute,
        seconds(t.estimate.step_time_s),
        seconds(c.plan_step_time_s),
        if c.speedup >= 1.0 { c.speedup } else { 1.0 / c.speedup },
        if c.speedup >= 1.0 { "faster" } else { "slower" },
        if terms.is_empty() {
            String::new()
        } else {
            format!("; its excess by term: {}", terms.join(", "))
        },
        pp.dp,
        pp.tp,
        if pp.sp { " (sp)" } else { "" },
        pp.pp,
        pp.cp,
        pp.ep,
        pp.schedule,
        pp.virtual_stages,
        pp.zero,
        pp.micro_batch,
        pp.micro_batches,
        pp.recompute,
        binary(t.estimate.memory_per_gpu_bytes),
        if t.estimate.fits { "fits" } else { "does not fit" },
        binary(p.predicted.memory_per_gpu_bytes),
    )
}

//! `autopar export`: a plan as the configuration of a tool people already
//! train with — Megatron-LM's `pretrain_gpt.py` arguments, a torchtitan job
//! TOML, a DeepSpeed `ds_config.json`. Each target says what it cannot
//! express (per-stage recomputation, uneven stages, a parameter server, …)
//! in the file and on stderr, and gets the closest configuration it has:
//! nothing of the plan is dropped silently.

mod deepspeed;
mod megatron;
mod settings;
mod torchtitan;

pub use settings::{read, Settings};

use crate::{output, plan};
use anyhow::{Context, Result};
use autopar_cost_models::Recompute;
use autopar_import::zoo::ModelSpec;
use autopar_ir::DType;
use autopar_planner::Plan;
use std::path::{Path, PathBuf};

/// A tool a plan is exported to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Tool {
    Megatron,
    Torchtitan,
    Deepspeed,
}

impl Tool {
    /// The tool called `name` (any case), as the CLI and the Python package read it.
    pub fn named(name: &str) -> Result<Tool, String> {
        <Tool as clap::ValueEnum>::from_str(name, true)
            .map_err(|_| format!("unknown tool '{name}' (expected megatron, torchtitan or deepspeed)"))
    }

    /// The file written when `-o` is not given.
    pub fn default_file(self) -> &'static str {
        match self {
            Tool::Megatron => "megatron_args.sh",
            Tool::Torchtitan => "torchtitan.toml",
            Tool::Deepspeed => "ds_config.json",
        }
    }

    /// The tool's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Megatron => "Megatron-LM",
            Tool::Torchtitan => "torchtitan",
            Tool::Deepspeed => "DeepSpeed",
        }
    }
}

/// A plan in a tool's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    /// The file's contents.
    pub text: String,
    /// What the tool cannot express, each with what was emitted instead.
    pub caveats: Vec<String>,
}

/// What every target reads of a plan besides its degrees: the model, when
/// it is a zoo spec, and the plan's own facts the targets disagree on.
struct Facts<'a> {
    plan: &'a Plan,
    /// The zoo model, whose shape arguments a target can be given.
    spec: Option<ModelSpec>,
    /// The type the model's weights and activations are in: what each
    /// tool's mixed-precision setting says.
    dtype: DType,
    /// The sequence length, when the plan or the spec fixes it.
    seq: Option<usize>,
    /// Layers per stage, in stage order (over all of a stage's chunks).
    stage_layers: Vec<usize>,
    /// The recomputation every stage uses, when they agree.
    uniform_recompute: Option<Recompute>,
}

impl<'a> Facts<'a> {
    fn of(plan: &'a Plan) -> Facts<'a> {
        let spec: Option<ModelSpec> = plan.inputs.model.parse().ok();
        let dtype = match &spec {
            Some(ModelSpec::Gpt(c)) => c.dtype,
            Some(ModelSpec::Llama(c)) => c.dtype,
            Some(ModelSpec::Bert(c)) => c.dtype,
            None => DType::F32,
        };
        let spec_seq = match &spec {
            Some(ModelSpec::Gpt(c)) => Some(c.seq),
            Some(ModelSpec::Llama(c)) => Some(c.seq),
            Some(ModelSpec::Bert(c)) => Some(c.seq),
            None => None,
        };
        let stage_layers = plan
            .stages
            .iter()
            .map(|s| s.layers[1].saturating_sub(s.layers[0]))
            .collect();
        let first = plan.stages.first().map(|s| s.recompute);
        let uniform_recompute = first.filter(|r| plan.stages.iter().all(|s| s.recompute == *r));
        Facts {
            plan,
            seq: plan.inputs.seq.or(spec_seq),
            spec,
            dtype,
            stage_layers,
            uniform_recompute,
        }
    }

    /// Total repeated layers.
    fn layers(&self) -> usize {
        self.stage_layers.iter().sum()
    }

    /// Layers in each interleaved chunk of a stage.
    fn layers_per_chunk(&self) -> usize {
        let p = &self.plan.parallel;
        self.layers() / (p.pp * p.virtual_stages).max(1)
    }

    /// Whether every stage holds as many layers.
    fn even_stages(&self) -> bool {
        self.stage_layers.windows(2).all(|w| w[0] == w[1])
    }

    /// The caveats every target shares: a per-stage recomputation reduced
    /// to the strongest, and what no target here runs.
    fn common_caveats(&self) -> Vec<String> {
        let p = &self.plan.parallel;
        let mut out = Vec::new();
        if self.uniform_recompute.is_none() {
            let each: Vec<String> = self.plan.stages.iter().map(|s| s.recompute.to_string()).collect();
            out.push(format!(
                "per-stage recomputation ({}): every stage recomputes as the strongest, {}",
                each.join(", "),
                p.recompute
            ));
        }
        if p.grad_reduce == autopar_cost_models::comm::Algorithm::ParameterServer {
            out.push("gradients through a parameter server: reduced by all-reduce instead".into());
        }
        if let Some(c) = p.grad_compression {
            out.push(format!(
                "gradient compression ({c}): gradients reduced uncompressed"
            ));
        }
        out
    }

    /// The first comment lines of a file: where it came from and the plan.
    fn header(&self, tool: Tool, comment: &str) -> String {
        let p = self.plan;
        format!(
            "{comment} {} configuration written by `autopar export` from a plan for {} on {} GPUs of {}\n{comment} {}; predicted step {:.3} s\n",
            tool.name(),
            p.inputs.model,
            p.mesh.ranks.len(),
            p.inputs.cluster.name,
            summary(&p.parallel),
            p.predicted.step_time_s,
        )
    }
}

/// `plan` in `tool`'s terms.
pub fn export(plan: &Plan, tool: Tool) -> Exported {
    let facts = Facts::of(plan);
    match tool {
        Tool::Megatron => megatron::export(&facts),
        Tool::Torchtitan => torchtitan::export(&facts),
        Tool::Deepspeed => deepspeed::export(&facts),
    }
}

/// Exports the plan file `plan_file` to `tool`, writing `output` (default:
/// the tool's usual file name beside the plan); returns what was written.
pub fn run(plan_file: &Path, tool: Tool, output: Option<PathBuf>) -> Result<(PathBuf, Exported)> {
    let p = plan::load(plan_file)?;
    let out = output.unwrap_or_else(|| plan_file.with_file_name(tool.default_file()));
    let e = write(&p, tool, &out)?;
    Ok((out, e))
}

/// Writes `plan` in `tool`'s terms to `out` (the CLI's and the Python
/// package's one way to write an export); returns what was written.
pub fn write(plan: &Plan, tool: Tool, out: &Path) -> Result<Exported> {
    output::check_folder(out)?;
    let e = export(plan, tool);
    output::write_atomic(out, e.text.as_bytes()).with_context(|| out.display().to_string())?;
    Ok(e)
}

/// The plan's degrees and knobs in one line.
pub(crate) fn summary(p: &autopar_planner::Parallel) -> String {
    format!(
        "{}{}, {} schedule ({} chunks per stage), ZeRO {}, micro-batch {} × {} (global batch {}), recompute {}",
        plan::degrees(p),
        if p.sp { ", sequence-parallel" } else { "" },
        p.schedule,
        p.virtual_stages,
        p.zero,
        p.micro_batch,
        p.micro_batches,
        p.global_batch,
        p.recompute
    )
}

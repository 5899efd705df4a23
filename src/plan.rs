//! `autopar plan`: search for the fastest parallel plan that fits, write it
//! as a plan file, and show the runners-up; `autopar explain`: a plan file
//! for people.

use crate::units::{binary, flop_rate, seconds};
use crate::{limits, model, output};
use anyhow::{Context, Result};
use autopar_cost_models::comm::Algorithm;
use autopar_cost_models::{AttentionKernel, Calibration, Cluster};
use autopar_ir::Objective;
use autopar_lower::planned_objective;
use autopar_planner::plan::{fnv1a_hex, Alternative, Parallel};
use autopar_planner::{plan_model_verified, DegreeLimits, ModelId, Plan, SearchOptions, Verify};
use autopar_sim::simulate_model_plan_step;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Candidates `autopar plan` simulates unless told otherwise.
pub const DEFAULT_VERIFY: usize = 1;

/// What the user asked for (the CLI's flags).
#[derive(Debug, Clone)]
pub struct Request {
    pub model: String,
    pub cluster: String,
    pub gpus: usize,
    pub global_batch: usize,
    pub seq: Option<usize>,
    pub max_memory_fraction: f64,
    pub top: usize,
    pub attention: AttentionKernel,
    pub dropout: bool,
    pub moe_capacity_factor: Option<f64>,
    /// What the model is trained for (`--objective`; its loss is priced);
    /// `None`: what `run` infers ([`planned_objective`]).
    pub objective: Option<Objective>,
    pub calibration: Option<PathBuf>,
    pub output: PathBuf,
    /// What the search may use.
    pub limits: DegreeLimits,
    /// Price tensor-parallel communication as overlapped with the GEMMs.
    pub tp_comm_overlap: bool,
    /// Re-rank this many of the fastest candidates by simulating them.
    pub verify: usize,
}

/// Plans `r.model`, writes the plan file, and returns the plan.
pub fn run(r: &Request, progress: &(dyn Fn(usize, usize) + Sync)) -> Result<Plan> {
    output::check_folder(&r.output)?;
    let plan = make(r, progress)?;
    output::write_atomic(&r.output, file_text(&plan)?.as_bytes())?;
    Ok(plan)
}

/// A plan file's text: pretty JSON and a final newline.
pub fn file_text(plan: &Plan) -> Result<String> {
    Ok(format!("{}\n", serde_json::to_string_pretty(plan)?))
}

/// Plans `r.model` (`r.output` is not written).
pub fn make(r: &Request, progress: &(dyn Fn(usize, usize) + Sync)) -> Result<Plan> {
    if !(r.max_memory_fraction > 0.0 && r.max_memory_fraction <= 1.0) {
        anyhow::bail!(
            "--max-memory-fraction {} must be in (0, 1]",
            r.max_memory_fraction
        );
    }
    limits::global_batch(r.global_batch)?;
    limits::seq(r.seq)?;
    let cluster = Cluster::load(&r.cluster)?.with_gpus(limits::gpus(r.gpus)?)?;
    let calibration = match &r.calibration {
        Some(path) => Calibration::load(path)?,
        None => Calibration::default(),
    };
    let m = model::load_with(&r.model, model::Axes::training(None, r.seq))?;
    model::check_seq(&r.model, &m, r.seq)?;
    let graph = model::canonical(&m)?;
    let opts = SearchOptions {
        limits: r.limits,
        global_batch: r.global_batch,
        seq: r.seq,
        max_memory_fraction: r.max_memory_fraction,
        attention: r.attention,
        dropout: r.dropout,
        moe_capacity_factor: r.moe_capacity_factor,
        objective: planned_objective(&graph, r.objective),
        top: r.top,
        tp_comm_overlap: r.tp_comm_overlap,
    };
    let model = ModelId {
        arg: &r.model,
        hash: model_hash(&r.model)?,
    };
    let simulate = |p: &Plan| simulate_model_plan_step(p, &graph, &calibration).map_err(|e| e.to_string());
    let verify = Verify {
        candidates: r.verify,
        simulate: &simulate,
    };
    plan_model_verified(&graph, &model, &cluster, &calibration, &opts, progress, &verify)
        .with_context(|| r.model.clone())
}

/// The model's identity: its file's bytes, or the spec text.
pub fn model_hash(model: &str) -> Result<String> {
    let path = Path::new(model);
    Ok(if path.is_file() {
        fnv1a_hex(&std::fs::read(path).with_context(|| format!("{model}: cannot read"))?)
    } else {
        fnv1a_hex(model.as_bytes())
    })
}

/// Reads a plan file.
pub fn load(path: &Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    Plan::from_json(&text).with_context(|| path.display().to_string())
}

pub(crate) fn degrees(p: &Parallel) -> String {
    let mut s = format!("dp {} · tp {} · pp {}", p.dp, p.tp, p.pp);
    if p.cp > 1 {
        let _ = write!(s, " · cp {}", p.cp);
    }
    if p.ep > 1 {
        let _ = write!(s, " · ep {}", p.ep);
    }
    s
}

/// What a plan that leaves GPUs idle says about them.
pub(crate) fn spares_line(plan: &Plan) -> Option<String> {
    let used = plan.gpus_used?;
    (plan.spare_gpus > 0).then(|| {
        format!(
            "{} GPUs used, {} left idle as spares: no parallel layout uses all {}",
            used,
            plan.spare_gpus,
            used + plan.spare_gpus
        )
    })
}

/// The ranking table and a summary of the chosen plan.
pub fn render(plan: &Plan, output: &Path) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "searched {} configurations in {} for {} on {} × {}",
        plan.search.configs_evaluated,
        seconds(plan.search.seconds),
        plan.inputs.model,
        plan.inputs.cluster.nodes * plan.inputs.cluster.gpus_per_node,
        plan.inputs.cluster.device
    );
    let verified = plan.search.top.iter().any(|a| a.simulated_step_time_s.is_some());
    let _ = writeln!(
        out,
        "\n  #  {:<22} {:>3} {:>3} {:>4} {:>9} {:>9}  {:>11}  {:>10}  {:>6}{}",
        "dp·tp·pp(·cp·ep)",
        "sp",
        "mb",
        "zero",
        "recompute",
        "grads",
        "step",
        "memory",
        "MFU",
        if verified { "    simulated" } else { "" }
    );
    for (i, alt) in plan.search.top.iter().enumerate() {
        let p = &alt.parallel;
        let mut mesh = format!("{}·{}·{}", p.dp, p.tp, p.pp);
        if p.cp > 1 || p.ep > 1 {
            let _ = write!(mesh, "·{}·{}", p.cp, p.ep);
        }
        if p.virtual_stages > 1 {
            let _ = write!(mesh, " v{}", p.virtual_stages);
        }
        let _ = writeln!(
            out,
            "{:>3}  {:<22} {:>3} {:>3} {:>4} {:>9} {:>9}  {:>11}  {:>10}  {:>5.1}%{}",
            i + 1,
            mesh,
            if p.sp { "yes" } else { "no" },
            p.micro_batch,
            p.zero,
            p.recompute,
            grads(p),
            seconds(alt.predicted.step_time_s),
            binary(alt.predicted.memory_per_gpu_bytes),
            100.0 * alt.predicted.mfu,
            alt.simulated_step_time_s
                .map_or(String::new(), |s| format!("  {:>11}", seconds(s)))
        );
    }
    let _ = writeln!(out, "\nchosen: {}", summary(&plan.parallel, &plan.predicted));
    if let Some(spares) = spares_line(plan) {
        let _ = writeln!(out, "{spares}");
    }
    let _ = writeln!(
        out,
        "wrote {} (see it with `autopar explain {}`)",
        output.display(),
        output.display()
    );
    out
}

/// How gradients cross replicas: `ring`, `ps`, with `+bf16` when compressed.
pub(crate) fn grads(p: &Parallel) -> String {
    let algorithm = match p.grad_reduce {
        Algorithm::ParameterServer => "ps",
        Algorithm::Ring | Algorithm::Tree => p.grad_reduce.name(),
    };
    match &p.grad_compression {
        Some(d) => format!("{algorithm}+{d}"),
        None => algorithm.into(),
    }
}

pub(crate) fn summary(p: &Parallel, e: &autopar_cost_models::Estimate) -> String {
    format!(
        "{}, {} schedule{}, ZeRO {}{}{}, micro-batch {} × {}: {} per step, MFU {:.1} %, {} per GPU",
        degrees(p),
        p.schedule,
        if p.virtual_stages > 1 {
            format!(" ({} virtual stages)", p.virtual_stages)
        } else {
            String::new()
        },
        p.zero,
        p.grad_compression
            .map_or(String::new(), |c| format!(", gradients sent as {c}")),
        p.moe_capacity_factor.map_or(String::new(), |cf| format!(
            ", experts drop beyond capacity factor {cf}"
        )),
        p.micro_batch,
        p.micro_batches,
        seconds(e.step_time_s),
        100.0 * e.mfu,
        binary(e.memory_per_gpu_bytes)
    )
}

/// Ranks as compact ranges: `0-7, 16-23`.
pub(crate) fn rank_ranges(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    if parts.len() > 6 {
        let n = parts.len();
        format!(
            "{}, … ({} ranges), {}",
            parts[..3].join(", "),
            n - 4,
            parts[n - 1]
        )
    } else {
        parts.join(", ")
    }
}

/// A plan for people: the mesh, what each GPU holds, where time goes, and
/// why it beat the runner-up.
pub fn explain(plan: &Plan) -> String {
    let mut out = String::new();
    let c = &plan.inputs.cluster;
    let _ = writeln!(
        out,
        "plan for {} (hash {})",
        plan.inputs.model, plan.inputs.model_hash
    );
    let _ = writeln!(
        out,
        "cluster   {}: {} nodes × {} {}, global batch {}",
        c.name, c.nodes, c.gpus_per_node, c.device, plan.inputs.global_batch
    );
    if let Some(spares) = spares_line(plan) {
        let _ = writeln!(out, "          {spares}");
    }
    explain_mesh(&mut out, plan);
    explain_stages(&mut out, plan);
    explain_memory(&mut out, plan);
    explain_time(&mut out, plan);
    explain_sharding(&mut out, plan);
    let _ = writeln!(out, "\n{}", why(plan));
    let _ = writeln!(
        out,
        "search: {} configurations in {}, memory limit {} per GPU",
        plan.search.configs_evaluated,
        seconds(plan.search.seconds),
        binary(plan.search.memory_limit_bytes)
    );
    out
}

/// The mesh's axes, fastest-varying first: `tp 8 × cp 1 × dp 24 × pp 16`.
pub(crate) fn mesh_axes(plan: &Plan) -> String {
    let axes: Vec<String> = plan
        .mesh
        .axes
        .iter()
        .map(|a| format!("{} {}", a.name, a.size))
        .collect();
    axes.join(" × ")
}

/// The mesh's axes, where tensor-parallel groups sit, and the configuration.
fn explain_mesh(out: &mut String, plan: &Plan) {
    let p = &plan.parallel;
    let e = &plan.predicted;
    let c = &plan.inputs.cluster;
    let _ = writeln!(
        out,
        "\nmesh      {} (fastest-varying first; ranks fill nodes in order)",
        mesh_axes(plan)
    );
    let tp_nodes = if p.tp * p.cp <= c.gpus_per_node {
        "inside one node"
    } else {
        "across nodes"
    };
    let _ = writeln!(
        out,
        "          each tensor-parallel group of {} GPUs sits {tp_nodes}{}",
        p.tp,
        if p.sp { ", with sequence parallelism" } else { "" }
    );
    let _ = writeln!(out, "          {}", summary(p, e));
}

/// The pipeline stages (the first three and last two of long pipelines).
fn explain_stages(out: &mut String, plan: &Plan) {
    let _ = writeln!(out, "\nstages");
    let shown: Vec<usize> = if plan.stages.len() <= 8 {
        (0..plan.stages.len()).collect()
    } else {
        let n = plan.stages.len();
        vec![0, 1, 2, n - 2, n - 1]
    };
    for (k, &i) in shown.iter().enumerate() {
        if k > 0 && i != shown[k - 1] + 1 {
            let _ = writeln!(out, "  …");
        }
        let s = &plan.stages[i];
        let mut extra = Vec::new();
        if s.holds_pre {
            extra.push("embeddings");
        }
        if s.holds_post {
            extra.push("head");
        }
        let _ = writeln!(
            out,
            "  stage {:>3}: layers {:>3}-{:<3} recompute {:<9} ranks {}{}",
            s.index,
            s.layers[0],
            s.layers[1].saturating_sub(1),
            s.recompute,
            rank_ranges(&s.ranks),
            if extra.is_empty() {
                String::new()
            } else {
                format!(" + {}", extra.join(", "))
            }
        );
    }
}

/// What each GPU holds at its peak stage, part by part, against its memory.
fn explain_memory(out: &mut String, plan: &Plan) {
    let e = &plan.predicted;
    let c = &plan.inputs.cluster;
    let _ = writeln!(
        out,
        "\neach GPU holds (stage {} at its peak): {} of {}{}",
        e.memory_peak_stage,
        binary(e.memory_per_gpu_bytes),
        binary(c.memory_bytes),
        if e.fits { "" } else { " — DOES NOT FIT" }
    );
    for (name, bytes) in e.memory.parts() {
        let _ = writeln!(out, "  {name:<22} {:>11}", binary(bytes));
    }
}

/// Where a step's time goes, part by part, and the throughput.
fn explain_time(out: &mut String, plan: &Plan) {
    let e = &plan.predicted;
    let _ = writeln!(out, "\nwhere a step's {} goes", seconds(e.step_time_s));
    for (name, t) in e.breakdown.parts() {
        if t > 0.0 {
            let _ = writeln!(
                out,
                "  {name:<22} {:>11}  {:>5.1} %",
                seconds(t),
                100.0 * t / e.step_time_s
            );
        }
    }
    let _ = writeln!(
        out,
        "  throughput {} model / {} hardware per GPU (MFU {:.1} %, HFU {:.1} %)",
        flop_rate(e.model_tflops_per_gpu * 1e12),
        flop_rate(e.hardware_tflops_per_gpu * 1e12),
        100.0 * e.mfu,
        100.0 * e.hfu
    );
}

/// How the heavy ops shard over tensor parallelism (one layer's worth).
fn explain_sharding(out: &mut String, plan: &Plan) {
    let p = &plan.parallel;
    // The ops that carry the weights and the work; views follow them.
    let heavy = ["Linear", "MatMul", "Gemm", "Attention", "Embedding", "MoeExperts"];
    let ops: Vec<String> = plan
        .sharding
        .iter()
        .filter(|o| heavy.contains(&o.op.as_str()))
        .map(|o| format!("{} {}", o.node, o.strategy))
        .collect();
    if p.tp > 1 && !ops.is_empty() {
        let _ = writeln!(
            out,
            "\nop sharding over tp (one layer shown; every layer repeats it):"
        );
        for chunk in ops.chunks(4) {
            let _ = writeln!(out, "  {}", chunk.join(", "));
        }
    }
}

/// The chosen configuration as the search priced it when ranking: what the
/// runners-up are compared with. (The plan's `predicted` also prices its
/// per-op sharding, which the ranking's estimates do not.)
pub(crate) fn ranked_estimate(plan: &Plan) -> &autopar_cost_models::Estimate {
    plan.search
        .top
        .iter()
        .find(|a| a.parallel == plan.parallel)
        .map_or(&plan.predicted, |a| &a.predicted)
}

/// Why the plan beat the runner-up (the fastest other configuration the
/// search ranked): the step-time parts that differ most.
pub(crate) fn why(plan: &Plan) -> String {
    let Some(runner_up) = plan.search.top.iter().find(|a| a.parallel != plan.parallel) else {
        return "no other configuration fits".into();
    };
    let Alternative {
        parallel,
        predicted,
        simulated_step_time_s,
    } = runner_up;
    if let (Some(ours), Some(theirs)) = (plan.simulated_step_time_s, *simulated_step_time_s) {
        return format!(
            "why this plan: simulated, the runner-up ({}) takes {} against this plan's {} ({:+.2} %)",
            summary(parallel, predicted),
            seconds(theirs),
            seconds(ours),
            100.0 * (theirs / ours - 1.0)
        );
    }
    let e = ranked_estimate(plan);
    let slower = predicted.step_time_s / e.step_time_s - 1.0;
    let mut deltas: Vec<(&str, f64)> = predicted
        .breakdown
        .parts()
        .iter()
        .zip(e.breakdown.parts())
        .map(|(&(name, theirs), (_, ours))| (name, theirs - ours))
        .filter(|(_, d)| d.abs() > 1e-9 * e.step_time_s)
        .collect();
    deltas.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
    let reasons: Vec<String> = deltas
        .iter()
        .take(3)
        .map(|(name, d)| {
            format!(
                "{} {name}",
                if *d > 0.0 {
                    format!("+{}", seconds(*d))
                } else {
                    format!("−{}", seconds(-d))
                }
            )
        })
        .collect();
    if slower.abs() < 1e-9 {
        let more = predicted.memory_per_gpu_bytes - e.memory_per_gpu_bytes;
        return match more > 0.0 {
            true => format!(
                "why this plan: the runner-up ({}) takes the same time but needs {} more per GPU",
                summary(parallel, predicted),
                binary(more)
            ),
            false => format!(
                "why this plan: the runner-up ({}) takes the same time; ties go to less communication, then less memory",
                summary(parallel, predicted)
            ),
        };
    }
    format!(
        "why this plan: the runner-up ({}) is {:.2} % slower{}{}",
        summary(parallel, predicted),
        100.0 * slower,
        if reasons.is_empty() { "" } else { ": " },
        reasons.join(", ")
    )
}

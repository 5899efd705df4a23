//! `autopar estimate`: step time, throughput and per-GPU memory of one
//! training configuration of a model on a cluster, with breakdowns.

use crate::inspect::human;
use crate::units::{binary, flop_rate, seconds};
use crate::{limits, model};
use anyhow::{Context, Result};
use autopar_cost_models::{
    estimate, AttentionKernel, Calibration, Cluster, Estimate, Recompute, Schedule, Sharding, TrainingConfig,
    Workload, WorkloadOptions,
};
use autopar_ir::{Loss, Objective};
use autopar_lower::planned_objective;
use serde::Serialize;
use std::fmt::Write;
use std::path::PathBuf;

/// What the user asked for (the CLI's flags).
#[derive(Debug, Clone)]
pub struct Request {
    pub model: String,
    pub cluster: String,
    pub gpus: usize,
    pub tp: usize,
    pub pp: usize,
    pub dp: Option<usize>,
    pub virtual_stages: Option<usize>,
    /// Layers per interleaved chunk, when the configuration says that
    /// instead of `virtual_stages` (Megatron-LM, torchtitan).
    pub layers_per_chunk: Option<usize>,
    pub sp: bool,
    pub cp: usize,
    pub ep: usize,
    pub zero: u8,
    pub global_batch: usize,
    /// `None`: the model's own batch (1 for zoo specs unless `batch=` says otherwise).
    pub micro_batch: Option<usize>,
    pub seq: Option<usize>,
    pub recompute: Recompute,
    pub schedule: Schedule,
    pub attention: AttentionKernel,
    pub dropout: bool,
    pub moe_capacity_factor: Option<f64>,
    /// What the model is trained for (`--objective`; its loss is priced);
    /// `None`: what `run` infers ([`planned_objective`]).
    pub objective: Option<Objective>,
    pub overlap_grad_reduce: bool,
    /// Gradient bucket size in MiB (0: one collective per parameter tensor).
    pub grad_bucket_mib: u32,
    /// Tensor-parallel communication beside the GEMMs (Megatron-Core's overlap).
    pub tp_comm_overlap: bool,
    /// ZeRO-1/2's weight gathers beside the next forward pass (Megatron-Core's overlap).
    pub overlap_param_gather: bool,
    /// Gradients accumulated and reduced in f32 (Megatron-LM's bf16 default).
    pub f32_main_grads: bool,
    /// The loss as Megatron-LM computes it (logits cast to f32).
    pub f32_cross_entropy: bool,
    /// Gradient reductions sent compressed.
    pub grad_compression: Option<autopar_cost_models::GradCompression>,
    /// How ranks are laid out on the mesh.
    pub mesh_order: autopar_cost_models::MeshOrder,
    pub calibration: Option<PathBuf>,
}

/// What `--from TOOL FILE` reads, when given.
pub fn settings_from(from: Option<(&str, &std::path::Path)>) -> Result<Option<crate::export::Settings>> {
    from.map(|(tool, file)| {
        let tool = crate::export::Tool::named(tool).map_err(|e| anyhow::anyhow!("--from: {e}"))?;
        crate::export::read(tool, file)
    })
    .transpose()
}

/// The global batch: what a `--from` file says, else the flag's.
pub fn global_batch(flag: Option<usize>, settings: Option<&crate::export::Settings>) -> Result<usize> {
    match (settings.and_then(|s| s.global_batch), flag) {
        (Some(g), _) | (None, Some(g)) => Ok(g),
        (None, None) => anyhow::bail!("--global-batch is required (or a --from file that gives it)"),
    }
}

impl Request {
    /// The request with what another tool's configuration says in place of
    /// the flags' values; the data-parallel degree and the pipeline depth a
    /// configuration leaves out follow from the GPUs.
    pub fn with(mut self, s: &crate::export::Settings) -> Request {
        self.tp = s.tp.unwrap_or(self.tp);
        self.cp = s.cp.unwrap_or(self.cp);
        self.ep = s.ep.unwrap_or(self.ep);
        self.dp = s.dp.or(self.dp);
        self.pp = match (s.pp, self.dp) {
            (Some(pp), _) => pp,
            (None, Some(dp)) if dp * self.tp * self.cp > 0 => (self.gpus / (dp * self.tp * self.cp)).max(1),
            (None, _) => self.pp,
        };
        self.sp = s.sp.unwrap_or(self.sp);
        self.zero = s.zero.unwrap_or(self.zero);
        self.micro_batch = s.micro_batch.or(self.micro_batch);
        self.global_batch = s.global_batch.unwrap_or(self.global_batch);
        self.seq = s.seq.or(self.seq);
        self.recompute = s.recompute.unwrap_or(self.recompute);
        self.schedule = s.schedule.unwrap_or(self.schedule);
        self.layers_per_chunk = s.layers_per_chunk.or(self.layers_per_chunk);
        self.dropout = s.dropout.unwrap_or(self.dropout);
        self.moe_capacity_factor = s.moe_capacity_factor.or(self.moe_capacity_factor);
        self.overlap_grad_reduce = s.overlap_grad_reduce.unwrap_or(self.overlap_grad_reduce);
        self.grad_bucket_mib = s.grad_bucket_mib.unwrap_or(self.grad_bucket_mib);
        self.tp_comm_overlap = s.tp_comm_overlap.unwrap_or(self.tp_comm_overlap);
        self.mesh_order = s.mesh_order.unwrap_or(self.mesh_order);
        self.attention = s.attention.unwrap_or(self.attention);
        self.overlap_param_gather = s.overlap_param_gather.unwrap_or(self.overlap_param_gather);
        self.f32_main_grads = s.f32_main_grads.unwrap_or(self.f32_main_grads);
        self
    }
}

/// The size flags within [`limits`].
fn check_sizes(r: &Request) -> Result<()> {
    use limits::{size, size_opt, MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_RANKS};
    limits::gpus(r.gpus)?;
    limits::global_batch(r.global_batch)?;
    limits::seq(r.seq)?;
    size_opt(
        "--micro-batch",
        r.micro_batch,
        MAX_GLOBAL_BATCH,
        "MAX_GLOBAL_BATCH",
    )?;
    for (flag, degree) in [("--tp", r.tp), ("--pp", r.pp), ("--cp", r.cp), ("--ep", r.ep)] {
        size(flag, degree, MAX_RANKS, "MAX_RANKS")?;
    }
    size_opt("--dp", r.dp, MAX_RANKS, "MAX_RANKS")?;
    size_opt("--virtual-stages", r.virtual_stages, MAX_LAYERS, "MAX_LAYERS")?;
    Ok(())
}

/// The estimate with what it was computed for.
#[derive(Debug, Clone, Serialize)]
pub struct EstimateReport {
    pub model: String,
    pub parameters: f64,
    pub cluster: String,
    pub device: String,
    pub gpus: usize,
    pub config: ConfigEcho,
    #[serde(flatten)]
    pub estimate: Estimate,
}

/// The configuration as resolved (derived degrees filled in).
#[derive(Debug, Clone, Serialize)]
pub struct ConfigEcho {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    pub virtual_stages: usize,
    pub sp: bool,
    pub cp: usize,
    pub ep: usize,
    pub zero: u8,
    pub recompute: String,
    pub schedule: String,
    pub attention: String,
    pub dropout: bool,
    pub micro_batch: usize,
    pub global_batch: usize,
    pub micro_batches: usize,
    pub seq: Option<usize>,
}

/// Runs the estimate for `r`.
pub fn run(r: &Request) -> Result<EstimateReport> {
    check_sizes(r)?;
    let cluster = Cluster::load(&r.cluster)?.with_gpus(r.gpus)?;
    let calibration = match &r.calibration {
        Some(path) => Calibration::load(path)?,
        None => Calibration::default(),
    };
    let m = model::load_with(&r.model, model::Axes::training(r.micro_batch, r.seq))?;
    model::check_seq(&r.model, &m, r.seq)?;
    let graph = model::canonical(&m)?;
    let dp = match r.dp {
        Some(dp) => dp,
        None => TrainingConfig::derive_dp(r.gpus, r.tp, r.pp, r.cp)?,
    };
    let virtual_stages = match (r.virtual_stages, r.layers_per_chunk, r.schedule) {
        (Some(v), _, _) => v,
        (None, Some(k), Schedule::Interleaved) if k > 0 => (graph.blocks.len() / (r.pp * k).max(1)).max(1),
        (None, _, Schedule::Interleaved) => TrainingConfig::default_virtual_stages(graph.blocks.len(), r.pp),
        (None, _, Schedule::Gpipe | Schedule::OneFOneB) => 1,
    };
    let loss = Loss::of(planned_objective(&graph, r.objective));
    let opts = WorkloadOptions {
        micro_batch: r.micro_batch,
        seq: r.seq,
        sharding: Sharding {
            tp: r.tp,
            sp: r.sp,
            cp: r.cp,
            ep: r.ep,
        },
        attention: r.attention,
        dropout: r.dropout,
        moe_capacity_factor: r.moe_capacity_factor,
        loss,
    };
    let workload = Workload::build(&graph, &opts).with_context(|| r.model.clone())?;
    let cfg = TrainingConfig {
        dp,
        tp: r.tp,
        pp: r.pp,
        virtual_stages,
        sp: r.sp,
        cp: r.cp,
        ep: r.ep,
        zero: r.zero,
        recompute: r.recompute,
        schedule: r.schedule,
        micro_batch: workload.micro_batch,
        global_batch: r.global_batch,
        seq: r.seq,
        attention: r.attention,
        dropout: r.dropout,
        moe_capacity_factor: r.moe_capacity_factor,
        loss,
        overlap_grad_reduce: r.overlap_grad_reduce,
        grad_reduce: autopar_cost_models::GradReduce {
            bucket_mib: r.grad_bucket_mib,
            f32_main_grads: r.f32_main_grads,
            compression: r.grad_compression,
            ..Default::default()
        },
        tp_comm_overlap: r.tp_comm_overlap,
        overlap_param_gather: r.overlap_param_gather,
        f32_cross_entropy: r.f32_cross_entropy,
        mesh_order: r.mesh_order,
        ..TrainingConfig::default()
    };
    cfg.check(r.gpus)?;
    let bindings = model::bindings(&m.graph, Some(workload.micro_batch), r.seq);
    let parameters = m.graph.float_parameter_elements(&bindings) as f64;
    let estimate = estimate(&workload, &cluster, &calibration, &cfg)?;
    Ok(EstimateReport {
        model: r.model.clone(),
        parameters,
        cluster: cluster.name.clone(),
        device: cluster.device.name.clone(),
        gpus: r.gpus,
        config: ConfigEcho {
            dp,
            tp: r.tp,
            pp: r.pp,
            virtual_stages,
            sp: r.sp,
            cp: r.cp,
            ep: r.ep,
            zero: r.zero,
            recompute: r.recompute.to_string(),
            schedule: r.schedule.to_string(),
            attention: r.attention.to_string(),
            dropout: r.dropout,
            micro_batch: workload.micro_batch,
            global_batch: r.global_batch,
            micro_batches: estimate.micro_batches,
            seq: workload.seq,
        },
        estimate,
    })
}

/// The report for people.
pub fn render(r: &EstimateReport) -> String {
    let e = &r.estimate;
    let c = &r.config;
    let mut out = String::new();
    let step = e.step_time_s;
    let _ = writeln!(out, "model      {} ({} parameters)", r.model, human(r.parameters));
    let _ = writeln!(out, "cluster    {}: {} × {}", r.cluster, r.gpus, r.device);
    let mut mesh = format!("dp {} · tp {} · pp {}", c.dp, c.tp, c.pp);
    if c.cp > 1 {
        let _ = write!(mesh, " · cp {}", c.cp);
    }
    if c.ep > 1 {
        let _ = write!(mesh, " · ep {}", c.ep);
    }
    if c.sp {
        mesh.push_str(" + sequence parallel");
    }
    let _ = writeln!(out, "config     {mesh}");
    let virtual_note = if c.virtual_stages > 1 {
        format!(" ({} virtual stages)", c.virtual_stages)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "           {} schedule{virtual_note}, ZeRO {}, recompute {}, {} attention{}",
        c.schedule,
        c.zero,
        c.recompute,
        c.attention,
        if c.dropout { ", dropout" } else { "" }
    );
    let _ = writeln!(
        out,
        "           global batch {} = {} micro-batches of {} × dp {}{}",
        c.global_batch,
        c.micro_batches,
        c.micro_batch,
        c.dp,
        c.seq.map_or(String::new(), |s| format!(", seq {s}"))
    );
    let _ = writeln!(out, "step time  {}", seconds(step));
    for (name, t) in e.breakdown.parts() {
        if t > 0.0 || name == "compute" {
            let _ = writeln!(
                out,
                "  {name:<22} {:>11}  {:>5.1} %",
                seconds(t),
                100.0 * t / step
            );
        }
    }
    let _ = writeln!(
        out,
        "throughput {} model per GPU (MFU {:.1} %), {} hardware per GPU (HFU {:.1} %)",
        flop_rate(e.model_tflops_per_gpu * 1e12),
        100.0 * e.mfu,
        flop_rate(e.hardware_tflops_per_gpu * 1e12),
        100.0 * e.hfu
    );
    let _ = writeln!(
        out,
        "memory     {} of {} per GPU on stage {}: {}",
        binary(e.memory_per_gpu_bytes),
        binary(e.memory_capacity_bytes),
        e.memory_peak_stage,
        if e.fits { "fits" } else { "DOES NOT FIT" }
    );
    for (name, bytes) in e.memory.parts() {
        let _ = writeln!(out, "  {name:<22} {:>11}", binary(bytes));
    }
    out
}

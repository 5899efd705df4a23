//! `autopar run`: train a model under a plan — a plan file, or one planned
//! on the spot for this host (`--plan auto`) — by lowering it to per-rank
//! programs and executing them: every rank a thread of this process, or,
//! under a launcher (torchrun, Slurm), one rank per process.

use crate::host_profile::{self, HostKey, PredictionSource};
use crate::units::{binary, seconds};
use crate::{limits, model, output, plan};
use anyhow::{bail, Context, Result};
use autopar_comm::launch::LaunchEnv;
use autopar_cost_models::{AttentionKernel, Calibration};
use autopar_cpu::profile::{profile, ProfileOptions};
use autopar_cpu::CpuRunner;
use autopar_cuda::{self as cuda, CudaOptions, CudaReport, CudaRunner, GpuPrecision};
use autopar_exec::checkpoint::{self, CheckpointError, Restored, SavePolicy};
use autopar_exec::session::{RunOptions, Session};
use autopar_exec::trace::chrome_json;
use autopar_exec::train::{Optimizer, DEFAULT_ADAMW_LR, DEFAULT_SGD_LR};
use autopar_exec::StepReport;
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{infer_objective, Objective};
use autopar_planner::{DegreeLimits, Parallel, Plan};
use autopar_sim::{simulate_plan, SimOptions};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long the processes of a launched run wait for each other to start
/// and connect by default (torch's default store timeout).
const RENDEZVOUS_WAIT: Duration = Duration::from_secs(300);
/// Overrides [`RENDEZVOUS_WAIT`], in seconds (slow starts on big clusters).
const RENDEZVOUS_WAIT_VAR: &str = "AUTOPAR_RENDEZVOUS_TIMEOUT";

/// How long a rank waits for a peer in a collective or transfer by default.
pub const TIMEOUT_S: f64 = 60.0;
/// Sets the timeout when `--timeout` is not given, in seconds.
pub const TIMEOUT_VAR: &str = "AUTOPAR_TIMEOUT";

/// How long to wait for the other processes: [`RENDEZVOUS_WAIT_VAR`] or the default.
pub(crate) fn rendezvous_wait() -> Result<Duration> {
    Ok(seconds_from_env(RENDEZVOUS_WAIT_VAR)?.unwrap_or(RENDEZVOUS_WAIT))
}

/// The collective and transfer timeout: `--timeout`, [`TIMEOUT_VAR`] or [`TIMEOUT_S`].
fn timeout(flag: Option<f64>) -> Result<Duration> {
    let env = seconds_from_env(TIMEOUT_VAR)?;
    match flag {
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        Some(s) => bail!("--timeout {s}: expected a positive number of seconds"),
        None => Ok(env.unwrap_or(Duration::from_secs_f64(TIMEOUT_S))),
    }
}

/// A positive number of seconds from environment variable `var`, if set.
fn seconds_from_env(var: &str) -> Result<Option<Duration>> {
    match std::env::var(var) {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
            _ => bail!("{var}='{v}' is invalid: expected a positive number of seconds"),
        },
    }
}

/// Rows per step per rank of `--plan auto` without `--global-batch`, in
/// units of the model's batch.
pub const ROWS_PER_RANK: usize = 4;

/// What the user asked for (the CLI's flags).
#[derive(Debug, Clone)]
pub struct Request {
    /// A plan file, or a model when `plan` is given.
    pub target: String,
    /// `auto` (plan for this host) or a plan file for the model in `target`.
    pub plan: Option<String>,
    pub backend: String,
    /// The plan's ranks; under a launcher it defaults to WORLD_SIZE.
    pub ranks: Option<usize>,
    pub steps: usize,
    /// What to train the model for; `None`: inferred from the model.
    pub objective: Option<Objective>,
    /// `synthetic` (default), a tokens.bin file (little-endian uint16), or
    /// arrays of features (`.npy` with `labels`, `.safetensors`).
    pub data: Option<String>,
    /// Labels for `.npy` features.
    pub labels: Option<PathBuf>,
    pub optimizer: String,
    pub lr: Option<f64>,
    pub seed: u64,
    pub precision: RunPrecision,
    /// For `--plan auto`: rows per step (default [`ROWS_PER_RANK`] per rank × the model's batch).
    pub global_batch: Option<usize>,
    pub seq: Option<usize>,
    /// For `--plan auto`: also write the plan here.
    pub save_plan: Option<PathBuf>,
    /// Write a Chrome trace-event timeline of the run here.
    pub trace: Option<PathBuf>,
    /// Predict the step by simulating the plan priced with this
    /// calibration (from `autopar profile`), to set next to the measurement;
    /// without it a CPU run predicts from this host's cached profile (see
    /// [`host_profile`]).
    pub calibration: Option<PathBuf>,
    /// Gradient reductions and weight refreshes beside the backward pass
    /// (a communication thread on the CPU, a stream on the GPU).
    pub overlap: bool,
    /// Save checkpoints.
    pub save: Option<SavePolicy>,
    /// Continue from the checkpoint this folder (or its `latest`) holds.
    pub resume: Option<PathBuf>,
    /// `--timeout`: seconds a rank waits for a peer.
    pub timeout: Option<f64>,
    /// `--threads`: threads each rank splits its large products over
    /// (default: its share of this host's cores).
    pub threads: Option<usize>,
}

/// How many checkpoints `--save` keeps by default.
pub const DEFAULT_KEEP: usize = 3;

/// The checkpoint policy `--save DIR --save-every K --keep N` ask for.
pub fn save_policy(dir: Option<PathBuf>, every: Option<usize>, keep: usize) -> Result<Option<SavePolicy>> {
    let Some(dir) = dir else {
        if every.is_some() {
            bail!("--save-every needs --save DIR");
        }
        return Ok(None);
    };
    if every == Some(0) {
        bail!("--save-every must be at least 1");
    }
    if keep == 0 {
        bail!("--keep must be at least 1 (the checkpoint just saved)");
    }
    Ok(Some(SavePolicy {
        dir,
        every: every.unwrap_or(0),
        keep,
    }))
}

/// The checkpoint `--resume` names, or `None` (with a note) where its
/// folder holds none yet: the first launch of a supervised job.
fn resumed(path: &Path) -> Result<Option<Arc<Restored>>> {
    match checkpoint::resolve(path) {
        Err(CheckpointError::NoCheckpoint { .. }) => {
            eprintln!(
                "note: --resume {}: no checkpoint there yet; starting at step 0",
                path.display()
            );
            Ok(None)
        }
        Err(e) => Err(e).context("--resume"),
        Ok(_) => Ok(Some(Arc::new(checkpoint::open(path).context("--resume")?))),
    }
}

/// The arithmetic of a run: f32 or f64 on the CPU; f32 or bf16 mixed
/// precision (bf16 weights and activations, f32 master weights) on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPrecision {
    F32,
    F64,
    Bf16,
}

/// Which backend runs the programs, with its options.
enum Target {
    Cpu,
    Cuda(CudaOptions),
}

impl Request {
    /// The backend and precision asked for, or why they don't go together;
    /// a GPU run uses the launcher's LOCAL_RANK as its device.
    fn target(&self, launch: &LaunchEnv) -> Result<Target> {
        Ok(match (self.backend.as_str(), self.precision) {
            ("cpu", RunPrecision::F32 | RunPrecision::F64) => Target::Cpu,
            ("cpu", RunPrecision::Bf16) => {
                bail!("--precision bf16 needs --backend cuda (the CPU backend computes in f32 or f64)")
            }
            ("cuda", RunPrecision::F64) => bail!("--precision f64: the CUDA backend computes in f32 or bf16"),
            ("cuda", p) => Target::Cuda(CudaOptions {
                precision: if p == RunPrecision::Bf16 {
                    GpuPrecision::Bf16
                } else {
                    GpuPrecision::F32
                },
                device: launch.local_rank,
            }),
            (other, _) => bail!("--backend {other}: unknown backend (expected cpu or cuda)"),
        })
    }

    /// The host precision the programs' values use (also what the simulator prices).
    fn host_precision(&self) -> Precision {
        match self.precision {
            RunPrecision::F64 => Precision::F64,
            _ => Precision::F32,
        }
    }

    /// The plan's rank count: `--ranks`, or the launcher's world size.
    fn ranks(&self, launch: &LaunchEnv) -> Result<usize> {
        let launched = launch.world_size > 1;
        match self.ranks {
            Some(n) if launched && n != launch.world_size => bail!(
                "--ranks {n}, but the launcher started {} processes (WORLD_SIZE); one process runs one rank",
                launch.world_size
            ),
            Some(0) => bail!("--steps and --ranks must be at least 1"),
            Some(n) if launched => limits::size("--ranks", n, limits::MAX_RANKS, "MAX_RANKS"),
            Some(n) => limits::size("--ranks", n, limits::MAX_LOCAL_RANKS, "MAX_LOCAL_RANKS"),
            None if launched => Ok(launch.world_size),
            None => bail!("--ranks is required (the plan's rank count) unless a launcher sets WORLD_SIZE"),
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    pub ranks: usize,
    /// Processes the ranks ran in: 1 (every rank a thread), or one per rank under a launcher.
    pub processes: usize,
    pub plan: PlanSummary,
    /// What the run trained the model for.
    pub objective: Objective,
    /// The steps a resumed run's checkpoint had completed (`losses` are
    /// of the steps after it); `null` for a fresh run.
    pub resumed_from_step: Option<usize>,
    /// The objective's mean loss of each step this run ran (token or class
    /// cross-entropy, or squared error).
    pub losses: Vec<f64>,
    pub step_times_s: Vec<f64>,
    /// What `tokens_per_step` and `tokens_per_s` count: `tokens`, or
    /// `samples` for classify and regress.
    pub throughput_unit: &'static str,
    pub tokens_per_step: usize,
    pub tokens_per_s: Vec<f64>,
    pub per_rank: Vec<RankSummary>,
    /// Median step time, the first step (warm-up) left out when there are three or more.
    pub median_step_time_s: f64,
    /// The simulator's step time under `--calibration`.
    pub simulated_step_time_s: Option<f64>,
    /// What ran on the GPU (`--backend cuda` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSummary>,
    /// How much of this host a CPU run's ranks got (ranks as threads of
    /// this process only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostUse>,
}

/// The cores a CPU run kept busy while training, from this process's CPU
/// time: other work on the host leaves it fewer than the host has, and its
/// steps slower than a prediction for the host alone.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct HostUse {
    pub cores: usize,
    pub cores_used: f64,
    /// Threads each rank split its large products over.
    pub threads_per_rank: usize,
}

/// The device a CUDA run used and the nodes that had to run on the host.
#[derive(Debug, Clone, Serialize)]
pub struct GpuSummary {
    pub device: String,
    pub precision: String,
    /// Op name → nodes of that op run on the host (no device kernel), over all ranks and steps.
    pub host_nodes: BTreeMap<String, usize>,
    /// Per rank: the planned arena of transient buffers (activations, gradients of a micro-batch).
    pub planned_arena_bytes: Vec<u64>,
    /// Per rank: weights, gradient accumulators and optimizer state.
    pub planned_model_state_bytes: Vec<u64>,
    /// How the all-reduces between ranks ran ("NCCL 2.21.5 …", or host-staged and why).
    pub collectives: String,
    /// The most bytes the run's tensors held at once on this process's GPU,
    /// measured (absent on devices without memory pools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_peak_bytes: Option<u64>,
    /// Planned bytes (buffers and model state) of the ranks on this process's GPU.
    pub planned_here_bytes: u64,
    /// What the cost model's memory model predicts for the ranks on this
    /// process's GPU: the plan's per-GPU peak times those ranks.
    pub predicted_here_bytes: u64,
}

/// The plan a run follows: the plan file's own degrees and knobs (the
/// report's `plan` object has their keys) and the step time predicted for
/// it, with the figures that prediction comes from.
#[derive(Debug, Clone, Serialize)]
pub struct PlanSummary {
    #[serde(flatten)]
    pub parallel: Parallel,
    pub predicted_step_time_s: f64,
    pub prediction_source: PredictionSource,
    /// The cluster the plan was made for, whose preset figures a nominal
    /// prediction comes from.
    #[serde(skip)]
    pub planned_for: String,
}

/// One rank's traffic and memory.
#[derive(Debug, Clone, Serialize)]
pub struct RankSummary {
    pub rank: usize,
    /// Over the whole run.
    pub bytes_sent: u64,
    pub peak_activation_bytes: u64,
    pub instructions: usize,
}

/// The plan to run, the model argument it belongs to, and that model's
/// canonical graph. `--plan auto` plans for `ranks`; only `writer` writes
/// `--save-plan` (rank 0 of a launched run).
fn resolve(r: &Request, ranks: usize, writer: bool) -> Result<(Plan, String, Graph)> {
    match r.plan.as_deref() {
        Some("auto") => {
            let m = model::load_with(&r.target, model::Axes::training(None, r.seq))?;
            model::check_seq(&r.target, &m, r.seq)?;
            let batch = fixed_batch(&m.graph).unwrap_or(1);
            let canonical = model::canonical(&m)?;
            let request = plan::Request {
                objective: r.objective,
                ..runnable_request(
                    &r.target,
                    &canonical,
                    "cpu",
                    ranks,
                    r.global_batch.unwrap_or(ROWS_PER_RANK * ranks * batch),
                    r.seq,
                    r.save_plan.clone().unwrap_or_default(),
                )
            };
            let p = match &r.save_plan {
                Some(_) if writer => plan::run(&request, &|_, _| {})?,
                _ => plan::make(&request, &|_, _| {})?,
            };
            Ok((p, r.target.clone(), canonical))
        }
        Some(file) => {
            let p = plan::load(Path::new(file))?;
            check_model(&p, file, &r.target)?;
            let graph = model::canonical(&model::load_with(&r.target, model::Axes::of_plan(&p))?)?;
            Ok((p, r.target.clone(), graph))
        }
        None => {
            let p = plan::load(Path::new(&r.target))?;
            let model = p.inputs.model.clone();
            check_model(&p, &r.target, &model)?;
            let graph = model::canonical(&model::load_with(&model, model::Axes::of_plan(&p))?)?;
            Ok((p, model, graph))
        }
    }
}

/// A search for plans `autopar run` executes (the runnable degrees and
/// knobs; expert parallelism only where the canonical graph has fused
/// experts, which it splits) for `model` on `gpus` of `cluster`.
pub(crate) fn runnable_request(
    model: &str,
    canonical: &Graph,
    cluster: &str,
    gpus: usize,
    global_batch: usize,
    seq: Option<usize>,
    output: PathBuf,
) -> plan::Request {
    let fused_experts = canonical
        .node_indices()
        .any(|i| matches!(canonical.node(i).op, autopar_ir::Op::MoeExperts { .. }));
    plan::Request {
        model: model.to_string(),
        cluster: cluster.into(),
        gpus,
        global_batch,
        seq,
        max_memory_fraction: 0.9,
        top: 5,
        attention: AttentionKernel::Fused,
        dropout: false,
        moe_capacity_factor: None,
        objective: None,
        calibration: None,
        output,
        limits: DegreeLimits {
            ep: if fused_experts { usize::MAX } else { 1 },
            ..DegreeLimits::RUNNABLE
        },
        tp_comm_overlap: false,
        verify: 0,
    }
}

/// A plan runs only the model it was made for.
pub(crate) fn check_model(p: &Plan, plan_file: &str, model: &str) -> Result<()> {
    let hash = plan::model_hash(model).with_context(|| format!("{plan_file}: the plan's model"))?;
    if hash != p.inputs.model_hash {
        bail!(
            "{plan_file}: the plan was made for a different model (model hash {}, but {model} hashes to {hash}); plan it again with `autopar plan {model}`",
            p.inputs.model_hash
        );
    }
    Ok(())
}

/// The batch size of a model whose token input has a fixed batch dim.
fn fixed_batch(g: &Graph) -> Option<usize> {
    let t = g.inputs.first()?;
    g.tensor(*t).ty.shape.0.first()?.fixed()
}

/// The sequence length to train at: the model's fixed one, the plan's, or the model's default.
pub(crate) fn seq_of(g: &Graph, p: &Plan) -> Result<usize> {
    if let Some(fixed) = g
        .inputs
        .first()
        .and_then(|&t| g.tensor(t).ty.shape.0.get(1)?.fixed())
    {
        return Ok(fixed);
    }
    p.inputs
        .seq
        .or_else(|| g.bindings.get("seq").copied())
        .context("the model's sequence length is symbolic; give --seq")
}

/// What a run is about to do, told before training.
pub struct Start<'a> {
    pub plan: &'a PlanSummary,
    pub ranks: usize,
    pub objective: Objective,
    pub chosen: Chosen,
}

/// How the objective was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chosen {
    /// With `--objective`.
    Flag,
    /// Inferred from the model's inputs and outputs.
    Inferred,
    /// Inferred as next-token prediction for a model whose attention is
    /// not causal (an encoder, or a causal mask autopar did not recognise).
    InferredNotCausal,
    /// The one the plan was made for (`plan --objective`), which is not
    /// the one inferred.
    Planned,
}

/// What a step's throughput counts: `per_step` of `unit` (tokens, or
/// samples for classify and regress).
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    pub per_step: usize,
    pub unit: &'static str,
}

/// The objective `r` asks for, else the one plan `p` was made for where
/// it is not the one `graph` calls for, else that one; and how it was
/// chosen.
fn objective(r: &Request, graph: &Graph, p: &Plan) -> Result<(Objective, Chosen)> {
    if let Some(o) = r.objective {
        return Ok((o, Chosen::Flag));
    }
    let inferred = infer_objective(graph);
    let o = match (p.inputs.objective, inferred) {
        (Some(planned), Ok(o)) if planned != o => return Ok((planned, Chosen::Planned)),
        (Some(planned), Err(_)) => return Ok((planned, Chosen::Planned)),
        (_, inferred) => inferred?,
    };
    let not_causal = o == Objective::Lm && autopar_lower::bidirectional(graph);
    Ok((
        o,
        if not_causal {
            Chosen::InferredNotCausal
        } else {
            Chosen::Inferred
        },
    ))
}

/// Runs `r`, calling `on_start` before training and `on_step` after each
/// step. Under a launcher with more than one process this process runs one
/// rank: rank 0 calls back and returns the report, the other ranks return
/// `None`.
pub fn run(
    r: &Request,
    on_start: &dyn Fn(&Start),
    on_step: &(dyn Fn(&StepReport, Throughput) + Sync),
) -> Result<Option<Report>> {
    let launch = LaunchEnv::from_env().context("reading the launcher's environment")?;
    let target = r.target(&launch)?;
    if let Target::Cuda(o) = &target {
        // Fail before planning when there is no GPU to run on.
        cuda::probe(o.device).map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?;
    }
    let ranks = r.ranks(&launch)?;
    if r.steps == 0 {
        bail!("--steps and --ranks must be at least 1");
    }
    r.global_batch.map(limits::global_batch).transpose()?;
    limits::seq(r.seq)?;
    if let Some(path) = &r.trace {
        output::check_folder(path)?;
    }
    let restored = r.resume.as_deref().map(resumed).transpose()?.flatten();
    let mut opts = run_options(r, &launch)?;
    let calibration = r.calibration.as_deref().map(Calibration::load).transpose()?;
    let nominal = host_profile::nominal_requested()?;
    let resumed_request;
    let r = match &restored {
        // The data stream and global batch continue as the checkpoint's run had them.
        Some(c) => {
            let saved: Plan = serde_json::from_value(c.index.plan.clone())
                .with_context(|| format!("--resume {}: the checkpoint's plan", c.dir.display()))?;
            let mut request = r.clone();
            request.global_batch = request.global_batch.or(Some(saved.inputs.global_batch));
            request.seed = c.index.data.seed;
            opts.seed = c.index.data.seed;
            opts.resume = Some(Arc::clone(c));
            resumed_request = request;
            &resumed_request
        }
        None => r,
    };
    let (p, model_arg, graph) = resolve(r, ranks, launch.rank == 0)?;
    let world = p.mesh.ranks.len();
    if world != ranks && launch.world_size > 1 {
        bail!(
            "the plan has {world} ranks but the launcher started {ranks} processes (WORLD_SIZE); launch {world}, one per rank"
        );
    }
    if world != ranks {
        bail!(
            "the plan has {world} ranks but --ranks is {ranks}; run it with --ranks {world} or plan for {ranks} ranks"
        );
    }
    let seq = seq_of(&graph, &p)?;
    let (objective, chosen) = objective(r, &graph, &p).with_context(|| model_arg.clone())?;
    if p.inputs.loss() != objective.loss() {
        let planned = p
            .inputs
            .objective
            .map_or("an unknown objective".into(), |o| o.to_string());
        bail!(
            "the plan was made for {planned}, priced with a {} loss, but this run trains {objective}, a {} loss: run it without --objective, or plan again with --objective {objective}",
            p.inputs.loss(),
            objective.loss()
        );
    }
    opts.objective = Some(objective);
    let rank = launch.rank;
    let session = Session::new(p, graph, seq, opts, launch).with_context(|| model_arg.clone())?;
    // Only rank 0 reports, so only rank 0 predicts.
    let host = matches!(target, Target::Cpu) && !nominal && rank == 0;
    let (predicted_step_time_s, prediction_source) = match &calibration {
        Some(cal) if rank == 0 => (
            simulated(&session, session.plan(), cal)?,
            PredictionSource::CalibrationFile,
        ),
        _ if host => predict_on_host(&session),
        _ => (session.plan().predicted.step_time_s, PredictionSource::Nominal),
    };
    let summary = PlanSummary {
        parallel: session.plan().parallel.clone(),
        predicted_step_time_s,
        prediction_source,
        planned_for: session.plan().inputs.cluster.name.clone(),
    };
    if rank == 0 {
        on_start(&Start {
            plan: &summary,
            ranks: world,
            objective,
            chosen,
        });
    }
    let tokens_per_step = session.tokens_per_step();
    let throughput = Throughput {
        per_step: tokens_per_step,
        unit: session.training().task.throughput_unit().1,
    };
    let progress = |s: &StepReport| on_step(s, throughput);
    let (cpu_before, started) = (process_cpu_seconds(), std::time::Instant::now());
    let in_process_cpu = matches!(target, Target::Cpu) && !session.launched();
    let outcome = match target {
        Target::Cpu => session.run(&CpuRunner, &progress)?.map_details(|()| None),
        Target::Cuda(options) => {
            let runner = CudaRunner(options);
            let outcome = session.run(&runner, &progress)?;
            outcome.map_details(|c| Some(gpu_summary(&c, &runner.0, &session)))
        }
    };
    // Under a launcher each rank writes its own timeline next to `--trace`.
    if let (Some(path), Some(events)) = (&r.trace, &outcome.rank_trace) {
        let json = chrome_json(events, &[rank]);
        output::write_atomic(&rank_path(path, rank), serde_json::to_string(&json)?.as_bytes())?;
    }
    let host = match (in_process_cpu, cpu_before, process_cpu_seconds()) {
        (true, Some(before), Some(after)) => Some(HostUse {
            threads_per_rank: session.threads_per_rank(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cores_used: (after - before) / started.elapsed().as_secs_f64().max(1e-9),
        }),
        _ => None,
    };
    let Some(result) = outcome.report else {
        return Ok(None);
    };
    let simulated_step_time_s = match summary.prediction_source {
        PredictionSource::CalibrationFile => Some(summary.predicted_step_time_s),
        PredictionSource::HostProfile | PredictionSource::Nominal => None,
    };
    if let (Some(path), false) = (&r.trace, session.launched()) {
        let json = chrome_json(&result.trace, &(0..world).collect::<Vec<_>>());
        output::write_atomic(path, serde_json::to_string(&json)?.as_bytes())?;
    }
    Ok(Some(Report {
        resumed_from_step: restored.as_ref().map(|c| c.index.step),
        model: model_arg,
        ranks: world,
        processes: if session.launched() { world } else { 1 },
        plan: summary,
        objective,
        throughput_unit: throughput.unit,
        losses: result.losses,
        median_step_time_s: median_after_warmup(&result.step_times_s),
        simulated_step_time_s,
        gpu: result.details,
        host,
        tokens_per_s: result
            .step_times_s
            .iter()
            .map(|s| tokens_per_step as f64 / s)
            .collect(),
        step_times_s: result.step_times_s,
        tokens_per_step,
        per_rank: result
            .per_rank
            .iter()
            .map(|rr| RankSummary {
                rank: rr.rank,
                bytes_sent: rr.bytes_sent,
                peak_activation_bytes: rr.peak_activation_bytes,
                instructions: rr.instructions,
            })
            .collect(),
    }))
}

/// The step time of `p` (the session's plan, or that plan placed on another
/// cluster) replayed by the simulator: the programs that will run, priced
/// by `cal`.
fn simulated(session: &Session, p: &Plan, cal: &Calibration) -> Result<f64> {
    let (sim, _) = simulate_plan(
        p,
        session.training(),
        session.strategy(),
        Some(session.programs()),
        cal,
        session.precision(),
        &SimOptions {
            threads_per_rank: Some(session.threads_per_rank()),
            ..SimOptions::default()
        },
    )?;
    Ok(sim.step_time_s)
}

/// A CPU run's prediction from this host's profile (cached, or measured
/// now): the programs simulated on this host (the `cpu` cluster, whatever
/// the plan was made for), ranks sharing its cores. Without a profile, or
/// when the simulator cannot replay the plan, the plan's own nominal
/// estimate, said so on stderr.
fn predict_on_host(session: &Session) -> (f64, PredictionSource) {
    let nominal = (session.plan().predicted.step_time_s, PredictionSource::Nominal);
    let note = |n: &str| eprintln!("note: {n}");
    let dir = host_profile::cache_dir(&|name| std::env::var_os(name));
    let measure = || Ok(profile(&ProfileOptions::default())?);
    let Some(cal) = host_profile::load_or_measure(dir.as_deref(), &HostKey::this_host(), measure, &note)
    else {
        return nominal;
    };
    let mut on_host = session.plan().clone();
    on_host.inputs.cluster.name = "cpu".into();
    match simulated(session, &on_host, &cal) {
        Ok(step) => (step, PredictionSource::HostProfile),
        Err(e) => {
            note(&format!(
                "the simulator could not price this plan ({e:#}); predicting from nominal figures"
            ));
            nominal
        }
    }
}

/// Seconds of CPU this process has used, user and system, from
/// `/proc/self/stat` (`None` where there is none).
fn process_cpu_seconds() -> Option<f64> {
    cpu_seconds_of_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `utime + stime` of a `/proc/<pid>/stat` line, in seconds: fields 14 and
/// 15, counted after the command name (which may hold spaces) in clock
/// ticks of `USER_HZ`, 100 on Linux.
fn cpu_seconds_of_stat(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    // After the name, field 3 (the state) is index 0.
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// The optimizer `--optimizer` and `--lr` ask for, its learning rate in
/// the optimizer's range.
fn optimizer(r: &Request) -> Result<Optimizer> {
    let optimizer = match r.optimizer.as_str() {
        "adamw" => Optimizer::adamw(r.lr.unwrap_or(DEFAULT_ADAMW_LR)),
        "sgd" => Optimizer::sgd(r.lr.unwrap_or(DEFAULT_SGD_LR)),
        other => bail!("--optimizer {other}: expected adamw or sgd"),
    };
    if let Err(e) = optimizer.validate() {
        bail!("--lr: {e}");
    }
    Ok(optimizer)
}

/// The session's options from the flags.
fn run_options(r: &Request, launch: &LaunchEnv) -> Result<RunOptions> {
    if r.threads == Some(0) {
        bail!("--threads 0: a rank needs at least one thread");
    }
    Ok(RunOptions {
        steps: r.steps,
        seed: r.seed,
        optimizer: optimizer(r)?,
        objective: r.objective,
        data: r.data.as_deref().filter(|d| *d != "synthetic").map(PathBuf::from),
        labels: r.labels.clone(),
        precision: r.host_precision(),
        overlap: r.overlap,
        trace: r.trace.is_some(),
        // Only a launched run waits for other processes (and reads the variable).
        rendezvous_wait: if launch.world_size > 1 {
            rendezvous_wait()?
        } else {
            RENDEZVOUS_WAIT
        },
        timeout: timeout(r.timeout)?,
        save: r.save.clone(),
        resume: None,
        threads_per_rank: r.threads,
    })
}

/// What a CUDA run's report adds: the device, memory planned, measured
/// and predicted, how collectives ran and what ran on the host.
fn gpu_summary(c: &CudaReport, options: &CudaOptions, session: &Session) -> GpuSummary {
    let p = session.plan();
    let here = if session.launched() { 1 } else { p.mesh.ranks.len() };
    GpuSummary {
        device: c.device.name.clone(),
        precision: format!("{:?}", options.precision).to_lowercase(),
        host_nodes: c.host_nodes.clone(),
        planned_arena_bytes: c.planned.iter().map(|m| m.arena_bytes).collect(),
        planned_model_state_bytes: c.planned.iter().map(|m| m.persistent.total()).collect(),
        collectives: c.collectives.clone(),
        measured_peak_bytes: c.measured_peak_bytes,
        planned_here_bytes: c.planned_here_bytes,
        predicted_here_bytes: (p.predicted.memory_per_gpu_bytes * here as f64) as u64,
    }
}

/// Where rank `rank` of a launched run writes its timeline: `run.json` →
/// `run.rank3.json` (the rank before the extension, if any).
fn rank_path(path: &Path, rank: usize) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

/// The median of `times`, leaving out the first (warm-up) when there are three or more.
fn median_after_warmup(times: &[f64]) -> f64 {
    let mut t: Vec<f64> = if times.len() >= 3 {
        times[1..].to_vec()
    } else {
        times.to_vec()
    };
    t.sort_by(f64::total_cmp);
    match t.len() {
        0 => 0.0,
        n if n % 2 == 1 => t[n / 2],
        n => (t[n / 2 - 1] + t[n / 2]) / 2.0,
    }
}

/// What the run trains for, in one line, printed before training.
pub fn objective_line(objective: Objective, chosen: Chosen) -> String {
    match chosen {
        Chosen::Flag => format!("objective: {objective}"),
        Chosen::Inferred => format!("objective: {objective} (inferred from the model; --objective chooses another)"),
        Chosen::InferredNotCausal => format!(
            "objective: {objective} (inferred from the model; its attention is not causal, so predicting the next \
             token lets it see the answer: --objective mlm trains an encoder as a masked LM)"
        ),
        Chosen::Planned => format!("objective: {objective} (the plan's)"),
    }
}

/// The plan in one line, printed before training.
pub fn plan_line(summary: &PlanSummary, ranks: usize) -> String {
    let p = &summary.parallel;
    let mut s = format!("plan: dp {} · tp {} · pp {}", p.dp, p.tp, p.pp);
    if p.cp > 1 || p.ep > 1 {
        let _ = write!(s, " · cp {} · ep {}", p.cp, p.ep);
    }
    if p.sp {
        let _ = write!(s, " (sequence-parallel)");
    }
    let _ = write!(s, ", {} schedule", p.schedule);
    if p.virtual_stages > 1 {
        let _ = write!(s, " ({} chunks per stage)", p.virtual_stages);
    }
    let _ = write!(
        s,
        ", ZeRO {}, micro-batch {} × {}, recompute {}, gradients by {}{}; {} ranks; predicted {} per step ({})",
        p.zero,
        p.micro_batch,
        p.micro_batches,
        p.recompute,
        p.grad_reduce,
        p.grad_compression.map_or(String::new(), |d| format!(" in {d}")),
        ranks,
        seconds(summary.predicted_step_time_s),
        match summary.prediction_source {
            PredictionSource::HostProfile => "this host's profile".to_string(),
            PredictionSource::CalibrationFile => "simulated with the calibration".to_string(),
            PredictionSource::Nominal => format!("nominal {} figures", summary.planned_for),
        }
    );
    s
}

/// One step's line.
pub fn step_line(s: &StepReport, throughput: Throughput) -> String {
    format!(
        "step {:>4}  loss {:.4}  {}  {:.0} {}/s",
        s.step + 1,
        s.loss,
        seconds(s.seconds),
        throughput.per_step as f64 / s.seconds,
        throughput.unit
    )
}

/// The summary after training.
pub fn render_summary(r: &Report) -> String {
    let mut out = String::new();
    if let (Some(first), Some(last)) = (r.losses.first(), r.losses.last()) {
        let _ = writeln!(out, "loss {first:.4} → {last:.4} over {} steps", r.losses.len());
    }
    let _ = write!(out, "step time {} (median)", seconds(r.median_step_time_s));
    if let Some(sim) = r.simulated_step_time_s {
        let gap = (sim / r.median_step_time_s - 1.0) * 100.0;
        let _ = write!(
            out,
            "; simulated with the calibration {} ({gap:+.1} %)",
            seconds(sim)
        );
    }
    if let Some(h) = &r.host {
        let _ = write!(
            out,
            "; training kept {:.1} of this host's {} cores busy ({} thread{} a rank)",
            h.cores_used,
            h.cores,
            h.threads_per_rank,
            if h.threads_per_rank == 1 { "" } else { "s" }
        );
    }
    out.push('\n');
    if let Some(g) = &r.gpu {
        let _ = writeln!(
            out,
            "device: {} ({}); collectives: {}",
            g.device, g.precision, g.collectives
        );
        for (rank, (arena, state)) in g
            .planned_arena_bytes
            .iter()
            .zip(&g.planned_model_state_bytes)
            .enumerate()
        {
            let _ = writeln!(
                out,
                "  rank {rank:>2}: planned device memory {} of buffers + {} of model state",
                binary(*arena as f64),
                binary(*state as f64)
            );
        }
        if let Some(peak) = g.measured_peak_bytes {
            let _ = writeln!(
                out,
                "  device memory at peak: {} measured (tensors, this GPU's ranks) against {} planned \
                 and {} predicted by the memory model",
                binary(peak as f64),
                binary(g.planned_here_bytes as f64),
                binary(g.predicted_here_bytes as f64)
            );
        }
        if !g.host_nodes.is_empty() {
            let ops: Vec<String> = g.host_nodes.iter().map(|(op, n)| format!("{op} ×{n}")).collect();
            let _ = writeln!(out, "ran on the host (no GPU kernel yet): {}", ops.join(", "));
        }
    }
    for rank in &r.per_rank {
        let _ = writeln!(
            out,
            "  rank {:>2}: sent {} per step, peak activations {}, {} instructions per step",
            rank.rank,
            binary(rank.bytes_sent as f64 / r.losses.len().max(1) as f64),
            binary(rank.peak_activation_bytes as f64),
            rank.instructions
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CUDA run's summary sets the measured device-memory peak next to
    /// the runtime's plan and the cost model's prediction.
    #[test]
    fn a_gpu_summary_compares_measured_planned_and_predicted_memory() {
        let cfg = autopar_cost_models::TrainingConfig {
            dp: 2,
            global_batch: 2,
            ..Default::default()
        };
        let plan = PlanSummary {
            parallel: Parallel::of(&cfg, 1),
            predicted_step_time_s: 0.1,
            prediction_source: PredictionSource::Nominal,
            planned_for: "cpu".into(),
        };
        let gib = 1u64 << 30;
        let report = Report {
            resumed_from_step: None,
            model: "m".into(),
            ranks: 2,
            processes: 1,
            plan,
            objective: Objective::Lm,
            throughput_unit: "tokens",
            losses: vec![2.0, 1.5],
            step_times_s: vec![0.2, 0.1],
            tokens_per_step: 8,
            tokens_per_s: vec![40.0, 80.0],
            per_rank: Vec::new(),
            median_step_time_s: 0.1,
            simulated_step_time_s: None,
            host: None,
            gpu: Some(GpuSummary {
                device: "H200".into(),
                precision: "bf16".into(),
                host_nodes: BTreeMap::new(),
                planned_arena_bytes: vec![gib, gib],
                planned_model_state_bytes: vec![2 * gib, 2 * gib],
                collectives: "same-device exchange".into(),
                measured_peak_bytes: Some(7 * gib),
                planned_here_bytes: 6 * gib,
                predicted_here_bytes: 8 * gib,
            }),
        };
        let text = render_summary(&report);
        assert!(!text.contains("cores busy"), "{text}");
        assert!(
            text.contains(
                "device memory at peak: 7.0 GiB measured (tensors, this GPU's ranks) against 6.0 GiB planned \
                 and 8.0 GiB predicted by the memory model"
            ),
            "{text}"
        );
    }

    /// A CPU run's summary says how much of the host its ranks got.
    #[test]
    fn a_cpu_summary_says_how_many_cores_training_kept_busy() {
        let stat = "4242 (autopar run (x)) R 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 6";
        assert_eq!(cpu_seconds_of_stat(stat), Some(1.75));
        assert_eq!(cpu_seconds_of_stat("4242 (autopar) R 1 2"), None);
        assert!(process_cpu_seconds().is_some_and(|s| s >= 0.0));
        let report = Report {
            resumed_from_step: None,
            model: "m".into(),
            ranks: 4,
            processes: 1,
            plan: PlanSummary {
                parallel: Parallel::of(&autopar_cost_models::TrainingConfig::default(), 1),
                predicted_step_time_s: 0.05,
                prediction_source: PredictionSource::HostProfile,
                planned_for: "cpu".into(),
            },
            objective: Objective::Lm,
            throughput_unit: "tokens",
            losses: vec![2.0],
            step_times_s: vec![0.1],
            tokens_per_step: 8,
            tokens_per_s: vec![80.0],
            per_rank: Vec::new(),
            median_step_time_s: 0.1,
            simulated_step_time_s: None,
            gpu: None,
            host: Some(HostUse {
                cores: 2,
                cores_used: 1.14,
                threads_per_rank: 1,
            }),
        };
        assert!(
            render_summary(&report)
                .contains("step time 100.000 ms (median); training kept 1.1 of this host's 2 cores busy (1 thread a rank)\n"),
            "{}",
            render_summary(&report)
        );
    }
}

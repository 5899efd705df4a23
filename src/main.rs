//! The `autopar` command line. Parses arguments and calls the library; exit
//! code 0 on success, 1 when a check finds a mismatch, 2 on any error.

use anyhow::Result;
use autopar::{check, convert, estimate, inspect, plan};
use autopar_ir::interp::Precision;
use autopar_lower::Objective;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// Planning and simulating allocate many small, short-lived buffers
/// (instructions, names, steps); mimalloc serves them faster than the
/// system allocator, and keeps what a training step frees for the next
/// (`autopar_cpu::allocator`).
#[global_allocator]
static ALLOCATOR: autopar_cpu::allocator::MiMalloc = autopar_cpu::allocator::MiMalloc;

#[derive(Parser)]
#[command(
    name = "autopar",
    version,
    about = "Automatic parallelism planner and compiler for deep-learning training"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parameters, FLOPs, op histograms and layers of a model.
    Inspect {
        /// An .onnx file, an autopar .json graph, or a zoo spec (gpt:layers=12,hidden=768,...).
        model: String,
        /// Batch size for symbolic batch dims and dynamic ONNX batch axes (default: the model's own).
        #[arg(long)]
        batch: Option<usize>,
        /// Sequence length for symbolic seq dims and dynamic ONNX sequence axes (default: the model's own).
        #[arg(long)]
        seq: Option<usize>,
        /// Print JSON for machines.
        #[arg(long)]
        json: bool,
    },
    /// Run a model on ONNX backend-test data and compare with its outputs.
    Check {
        model: String,
        /// Folder with input_*.pb and output_*.pb.
        #[arg(long)]
        data: PathBuf,
        /// Canonicalise the graph first (default).
        #[arg(long, overrides_with = "no_rewrite")]
        rewrite: bool,
        /// Run the graph as imported.
        #[arg(long)]
        no_rewrite: bool,
        /// Arithmetic precision.
        #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
        precision: PrecisionArg,
        /// Also check parameter gradients against this reference folder
        /// (manifest.json, cotangent.pb, one .pb per initializer).
        #[arg(long)]
        grads: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Write a model as an autopar JSON graph.
    Convert {
        model: String,
        #[arg(short, long)]
        output: PathBuf,
        /// Canonicalise the graph first.
        #[arg(long)]
        rewrite: bool,
    },
    /// Print the JSON Schema of the graph format (or, with --plan, of plan files).
    Schema {
        /// The plan file format instead of the graph format.
        #[arg(long)]
        plan: bool,
    },
    /// Step time, MFU and per-GPU memory of one training configuration.
    Estimate(EstimateArgs),
    /// Search for the fastest parallel plan that fits and write it as a plan file.
    Plan(PlanArgs),
    /// Print a plan file for people: mesh, stages, memory, time, and why it won.
    Explain {
        /// A plan file written by `autopar plan`.
        plan: PathBuf,
    },
    /// Measure a backend on this host (matmul, streaming, collective and
    /// per-op rates) and write them as a calibration file for the cost models.
    Profile {
        /// Which backend to measure.
        #[arg(long, value_enum)]
        backend: autopar::profile::Backend,
        /// Calibration JSON to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Tiny sizes, for smoke tests: finishes at once, numbers not meaningful.
        #[arg(long)]
        quick: bool,
    },
    /// Train a model under a parallel plan: lower it to per-rank programs
    /// and run them, one thread per rank.
    Run(RunArgs),
    /// Write a plan as another tool's configuration: Megatron-LM's
    /// pretrain_gpt.py arguments, a torchtitan job TOML or a DeepSpeed
    /// ds_config.json. What the tool cannot express is said on stderr and
    /// in the file, and the closest configuration it has is written.
    Export {
        /// A plan file written by `autopar plan`.
        plan: PathBuf,
        #[arg(long, value_enum)]
        to: autopar::export::Tool,
        /// The file to write (default beside the plan: megatron_args.sh,
        /// torchtitan.toml or ds_config.json).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Write a plan as one self-contained HTML page: the mesh on the
    /// cluster, the stage map, memory against capacity, where a step's time
    /// goes, the simulated pipeline timeline and the ranking.
    Report {
        /// A plan file written by `autopar plan`.
        plan: PathBuf,
        /// The page to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Simulate with this calibration (from `autopar profile`).
        #[arg(long)]
        calibration: Option<PathBuf>,
    },
    /// Write a checkpoint's trained weights: FILE.safetensors (whole
    /// tensors named as the model's parameters: an ONNX model's initializer
    /// names) or FILE.onnx (the model the run trained, its initializers
    /// trained).
    ExportWeights {
        /// A checkpoint folder (`--save DIR`: its latest) or DIR/step-<S>.
        dir: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// With -o FILE.onnx: the ONNX model to write with the trained
        /// weights (default: the one the run trained).
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Plan a checkpoint's model and global batch again for the GPUs left
    /// (after losing some), for `autopar run PLAN --resume DIR`.
    Replan {
        /// A checkpoint folder (`--save DIR`: its latest) or DIR/step-<S>.
        dir: PathBuf,
        /// GPUs (ranks) to plan for.
        #[arg(long)]
        gpus: usize,
        /// A preset or a cluster .toml file (default: the one the checkpoint's plan was made for).
        #[arg(long)]
        cluster: Option<String>,
        /// The plan file to write (default: DIR/plan-<GPUS>.json).
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Replay a plan's per-rank programs in virtual time: step time next to
    /// the analytic estimate by term, bubble, memory, a pipeline timeline.
    Simulate {
        /// A plan file written by `autopar plan`.
        plan: PathBuf,
        /// Calibration JSON (e.g. from `autopar profile`) to price with.
        #[arg(long)]
        calibration: Option<PathBuf>,
        /// Write the simulated timeline as Chrome trace-event JSON (Perfetto).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Replay every rank, not one per pipeline stage.
        #[arg(long)]
        every_rank: bool,
        /// On the `cpu` preset: threads each rank splits its large matrix
        /// products over, as `run --threads` (default: its share of this
        /// host's cores).
        #[arg(long, value_name = "N")]
        threads: Option<usize>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `autopar run` flags.
#[derive(clap::Args)]
struct RunArgs {
    /// A plan file written by `autopar plan`, or a model with `--plan`.
    target: String,
    /// `auto`: plan for this host's ranks first; or a plan file for the model given as TARGET.
    #[arg(long)]
    plan: Option<String>,
    /// Where to run: cpu or cuda. Every rank is a thread of this process
    /// (on one GPU for cuda), or under a launcher (torchrun, srun) one rank
    /// per process (on GPU LOCAL_RANK for cuda).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Ranks; must equal the plan's (default under a launcher: WORLD_SIZE).
    #[arg(long)]
    ranks: Option<usize>,
    /// Training steps.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// What to train the model for: lm (next-token prediction), seq2seq
    /// (encoder-decoder with teacher forcing: the decoder reads the targets
    /// shifted right), mlm (masked tokens predicted, for encoders), classify
    /// (a class per row of features) or regress (squared error). Default:
    /// what the model's inputs and outputs call for: seq2seq with a
    /// decoder input, lm with token ids, regress for float inputs and a
    /// [batch] or [batch, 1] output, classify for a [batch, classes] one.
    /// Encoders are not inferred as mlm (whether attention is causal is not
    /// reliably visible in an export): ask for it.
    #[arg(long)]
    objective: Option<Objective>,
    /// `synthetic` (learnable data of the objective's kind, the default), a
    /// tokens.bin file of little-endian uint16 tokens (lm, seq2seq, mlm), or
    /// arrays for classify and regress: FEATURES.npy (with --labels) for a
    /// model with one input, or FILE.safetensors holding a tensor per model
    /// input, named as the input, and `labels`. Arrays hold one example per
    /// index of their first dim.
    #[arg(long)]
    data: Option<String>,
    /// With --data FEATURES.npy: the labels, one per example: integer
    /// classes (classify), or values [examples] or [examples, outputs]
    /// (regress).
    #[arg(long)]
    labels: Option<PathBuf>,
    /// adamw or sgd.
    #[arg(long, default_value = "adamw")]
    optimizer: String,
    // The defaults are the optimizers' own, named once (see `lr_help`).
    #[arg(long, help = lr_help())]
    lr: Option<f64>,
    /// Seed of the data and of the initial weights of weightless models.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Arithmetic precision: f32 or f64 on cpu; f32 or bf16 (mixed precision) on cuda.
    #[arg(long, value_enum, default_value_t = RunPrecisionArg::F32)]
    precision: RunPrecisionArg,
    #[arg(long, help = format!(
        "With `--plan auto`: rows per step (default: {} per rank × the model's batch)",
        autopar::run::ROWS_PER_RANK
    ))]
    global_batch: Option<usize>,
    #[arg(long, help = format!(
        "Sequence length for models whose sequence is symbolic or a dynamic ONNX axis (default for the latter: {})",
        autopar::model::DEFAULT_DYNAMIC_SEQ
    ))]
    seq: Option<usize>,
    /// With `--plan auto`: also write the plan to this file.
    #[arg(long)]
    save_plan: Option<PathBuf>,
    /// Write the run's timeline (Chrome trace-event JSON: open in Perfetto);
    /// under a launcher each rank writes its own, `run.json` → `run.rank3.json`.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Calibration JSON (from `autopar profile`): also simulate the plan
    /// with it and print the predicted step next to the measured one.
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Run gradient reductions and weight refreshes where they are issued
    /// instead of beside the backward pass (to measure what overlap gains,
    /// or to rule it out).
    #[arg(long)]
    no_overlap: bool,
    /// Threads each rank splits its large matrix products and its attention
    /// over, on the CPU backend (default: the rank's share of this host's
    /// cores, so one rank on two cores uses both). They give the same bits
    /// on any count; the predicted step prices the same split.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Save checkpoints in DIR: `DIR/step-<S>/` holds one safetensors file
    /// per rank (its shards of weights and optimizer state) and index.json;
    /// `DIR/latest` names the newest complete one. Saved after the last
    /// step (and every --save-every steps), written while training goes on.
    #[arg(long, value_name = "DIR")]
    save: Option<PathBuf>,
    /// With --save: also save after every K steps (default: after the last only).
    #[arg(long, value_name = "K")]
    save_every: Option<usize>,
    /// With --save: keep the newest N checkpoints.
    #[arg(long, value_name = "N", default_value_t = autopar::run::DEFAULT_KEEP)]
    keep: usize,
    /// Continue from a checkpoint: DIR (the one `DIR/latest` names) or
    /// DIR/step-<S>. --steps stays the total, so a run saved at step 3 and
    /// resumed with --steps 6 runs steps 4-6. Under another plan or rank
    /// count the weights and optimizer state are resharded. A DIR with no
    /// checkpoint yet starts at step 0, so a supervisor can relaunch one
    /// command (`--save DIR --resume DIR --plan auto`).
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// Seconds a rank waits for a peer in a collective or transfer before
    /// the run fails naming it (default: $AUTOPAR_TIMEOUT, else 60). Under
    /// a launcher a peer process that sends nothing, not even a heartbeat,
    /// is named after half of it, even when no collective waits on it.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    #[arg(long)]
    json: bool,
}

/// `autopar plan` flags.
#[derive(clap::Args)]
struct PlanArgs {
    /// An .onnx file, an autopar .json graph, or a zoo spec.
    model: String,
    /// A preset (dgx-a100-80g, dgx-h100, hgx-h200, p3-v100, cpu) or a cluster .toml file.
    #[arg(long)]
    cluster: String,
    /// GPUs in all: whole nodes, or part of one node.
    #[arg(long)]
    gpus: usize,
    /// What the model is trained for, as `run --objective` takes it: its
    /// loss is what the plan prices. Default: what `run` infers.
    #[arg(long)]
    objective: Option<Objective>,
    /// Samples per optimizer step.
    #[arg(long)]
    global_batch: usize,
    #[arg(long, help = seq_help())]
    seq: Option<usize>,
    /// Share of each GPU's memory a plan may use.
    #[arg(long, default_value_t = 0.9)]
    max_memory_fraction: f64,
    /// How many of the fastest plans to show and keep in the plan file.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// fused (flash-style) | unfused.
    #[arg(long, default_value = "fused")]
    attention: autopar_cost_models::AttentionKernel,
    /// Train with dropout (attention probabilities and residual branches).
    #[arg(long)]
    dropout: bool,
    /// MoE capacity factor: each expert keeps at most ⌈CF · assignments /
    /// experts⌉ of a rank's token assignments (drop and pad, as Megatron-Core);
    /// absent: no token is dropped.
    #[arg(long, value_name = "CF", value_parser = capacity_factor)]
    moe_capacity_factor: Option<f64>,
    /// Calibration JSON overriding the default efficiencies.
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Price tensor-parallel collectives as overlapped with the GEMMs
    /// (Megatron-Core's --tp-comm-overlap). No backend here runs it, so such
    /// a plan is for comparing with Megatron-Core, not for `autopar run`.
    #[arg(long)]
    tp_comm_overlap: bool,
    /// Also try the lossy gradient compressions at their default settings
    /// (PowerSGD rank 8, top-k keeping 10 %, each after 20 uncompressed steps), picked only where they make
    /// the step faster. Training then differs from uncompressed.
    #[arg(long)]
    allow_lossy_compression: bool,
    /// Simulate the K fastest candidates (their programs replayed as the
    /// backends run them) and choose the fastest simulated; 0 trusts the
    /// estimate alone.
    #[arg(long, value_name = "K", default_value_t = plan::DEFAULT_VERIFY)]
    verify: usize,
    /// The plan file to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Print the plan as JSON instead of the table.
    /// A configuration you already run (Megatron-LM arguments, a
    /// torchtitan job TOML or a DeepSpeed ds_config.json): say how much
    /// faster the found plan is, by term, and how the two differ.
    #[arg(long, value_name = "FILE")]
    compare: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

/// `autopar estimate` flags.
#[derive(clap::Args)]
struct EstimateArgs {
    /// An .onnx file, an autopar .json graph, or a zoo spec.
    model: String,
    /// A preset (dgx-a100-80g, dgx-h100, hgx-h200, p3-v100, cpu) or a cluster .toml file.
    #[arg(long)]
    cluster: String,
    /// GPUs in all: whole nodes, or part of one node.
    #[arg(long)]
    gpus: usize,
    /// What the model is trained for, as `run --objective` takes it: its
    /// loss is what the plan prices. Default: what `run` infers.
    #[arg(long)]
    objective: Option<Objective>,
    /// Tensor-parallel degree.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Pipeline-parallel degree (stages).
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Data-parallel degree (default: gpus / (tp·pp·cp)).
    #[arg(long)]
    dp: Option<usize>,
    /// Layer chunks per stage for the interleaved schedule (default: the
    /// smallest count above one that splits each stage's layers evenly).
    #[arg(long)]
    virtual_stages: Option<usize>,
    /// Sequence parallelism inside the tensor-parallel group.
    #[arg(long)]
    sp: bool,
    /// Context-parallel degree.
    #[arg(long, default_value_t = 1)]
    cp: usize,
    /// Expert-parallel degree (divides dp).
    #[arg(long, default_value_t = 1)]
    ep: usize,
    /// ZeRO stage, 0-3.
    #[arg(long, default_value_t = 0)]
    zero: u8,
    /// Samples per optimizer step (required unless --from gives it).
    #[arg(long)]
    global_batch: Option<usize>,
    /// Price a configuration another tool runs: `--from megatron ARGS.sh`
    /// (pretrain_gpt.py arguments), `--from torchtitan JOB.toml` or `--from
    /// deepspeed ds_config.json`. What the file says replaces the flags'
    /// values; what it leaves out (DeepSpeed's pipeline depth: the GPUs over
    /// data and tensor parallelism) follows from the GPUs or the flags.
    #[arg(long, num_args = 2, value_names = ["TOOL", "FILE"])]
    from: Option<Vec<String>>,
    /// Samples per micro-batch (default: the model's batch; 1 for zoo specs).
    #[arg(long)]
    micro_batch: Option<usize>,
    #[arg(long, help = seq_help())]
    seq: Option<usize>,
    /// none | selective | full.
    #[arg(long, default_value = "none")]
    recompute: autopar_cost_models::Recompute,
    /// gpipe | 1f1b | interleaved.
    #[arg(long, default_value = "1f1b")]
    schedule: autopar_cost_models::Schedule,
    /// fused (flash-style) | unfused.
    #[arg(long, default_value = "fused")]
    attention: autopar_cost_models::AttentionKernel,
    /// Train with dropout (attention probabilities and residual branches).
    #[arg(long)]
    dropout: bool,
    /// MoE capacity factor: each expert keeps at most ⌈CF · assignments /
    /// experts⌉ of a rank's token assignments (drop and pad, as Megatron-Core);
    /// absent: no token is dropped.
    #[arg(long, value_name = "CF", value_parser = capacity_factor)]
    moe_capacity_factor: Option<f64>,
    /// Overlap the gradient reduction with the last backward pass.
    #[arg(long)]
    overlap_grad_reduce: bool,
    /// Gradient bucket size in MiB; 0 reduces each parameter tensor on its own.
    #[arg(long, default_value_t = autopar_cost_models::DEFAULT_BUCKET_MIB)]
    grad_bucket_mib: u32,
    /// Price tensor-parallel collectives as overlapped with the GEMMs
    /// (Megatron-Core's --tp-comm-overlap; no backend here runs it).
    #[arg(long)]
    tp_comm_overlap: bool,
    /// Price ZeRO-1/2's weight all-gathers as run beside the next step's
    /// first forward pass (Megatron-Core's --overlap-param-gather; no
    /// backend here runs it).
    #[arg(long)]
    overlap_param_gather: bool,
    /// Price gradients accumulated and reduced in f32 beside 16-bit weights
    /// (Megatron-LM's default for bf16; no backend here does it).
    #[arg(long)]
    f32_main_grads: bool,
    /// Price the loss as Megatron-LM computes it by default: the logits
    /// cast to f32 and its cross-entropy's passes over them (no backend
    /// here does it).
    #[arg(long)]
    f32_cross_entropy: bool,
    /// How ranks fill the mesh: dp-inner (tp, cp, dp, pp: Megatron-LM's
    /// default) or pp-inner (tp, cp, pp, dp: its --use-tp-pp-dp-mapping).
    #[arg(long, default_value = "dp-inner")]
    mesh_order: autopar_cost_models::MeshOrder,
    /// Data-parallel gradient reductions sent compressed: bf16 or fp16
    /// (16-bit values, partial sums in the gradients' own type), powersgd:R
    /// or topk:F (lossy, with error feedback; :W after either reduces the
    /// first W steps uncompressed).
    #[arg(long, value_name = "METHOD")]
    grad_compression: Option<autopar_cost_models::GradCompression>,
    /// Calibration JSON overriding the default efficiencies (see `autopar profile`).
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Print JSON for machines.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    F32,
    F64,
}

#[derive(Clone, Copy, ValueEnum)]
enum RunPrecisionArg {
    F32,
    F64,
    Bf16,
}

fn main() -> ExitCode {
    autopar_cpu::allocator::keep_freed_memory();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", autopar::errors::one_line(&e));
            ExitCode::from(2)
        }
    }
}

/// Writes to stdout; a closed pipe (`autopar ... | head`) is not an error.
fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// A progress bar on stderr when it is a terminal (not when piped or in CI).
fn progress_bar() -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("searching {bar:40} {pos}/{len} mesh groups {elapsed}")
    {
        bar.set_style(style);
    }
    Some(bar)
}

fn precision_of(p: PrecisionArg) -> Precision {
    match p {
        PrecisionArg::F32 => Precision::F32,
        PrecisionArg::F64 => Precision::F64,
    }
}

fn run_command(a: RunArgs) -> Result<()> {
    use autopar::run;
    let request = run::Request {
        target: a.target,
        plan: a.plan,
        backend: a.backend,
        ranks: a.ranks,
        steps: a.steps,
        objective: a.objective,
        data: a.data,
        labels: a.labels,
        optimizer: a.optimizer,
        lr: a.lr,
        seed: a.seed,
        precision: match a.precision {
            RunPrecisionArg::F32 => run::RunPrecision::F32,
            RunPrecisionArg::F64 => run::RunPrecision::F64,
            RunPrecisionArg::Bf16 => run::RunPrecision::Bf16,
        },
        global_batch: a.global_batch,
        seq: a.seq,
        save_plan: a.save_plan,
        trace: a.trace,
        calibration: a.calibration,
        overlap: !a.no_overlap,
        save: run::save_policy(a.save, a.save_every, a.keep)?,
        resume: a.resume,
        timeout: a.timeout,
        threads: a.threads,
    };
    let json = a.json;
    let bar = step_bar(a.steps);
    let on_start = |start: &run::Start| {
        if !json {
            let _ = emit(&format!(
                "{}\n{}\n",
                run::plan_line(start.plan, start.ranks),
                run::objective_line(start.objective, start.chosen)
            ));
        }
    };
    let on_step = |s: &autopar_exec::StepReport, throughput: run::Throughput| {
        let line = run::step_line(s, throughput);
        match (&bar, json) {
            (Some(bar), false) => {
                bar.println(line);
                bar.inc(1);
            }
            (Some(bar), true) => bar.inc(1),
            (None, false) => {
                let _ = emit(&format!("{line}\n"));
            }
            (None, true) => {}
        }
    };
    let result = run::run(&request, &on_start, &on_step);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // Under a launcher only rank 0 reports the run.
    let Some(report) = result? else {
        return Ok(());
    };
    if json {
        print_json(&report)
    } else {
        emit(&run::render_summary(&report))
    }
}

/// A bar over training steps, on terminals only.
fn step_bar(steps: usize) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(steps as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template("training {bar:40} step {pos}/{len} {elapsed}")
    {
        bar.set_style(style);
    }
    Some(bar)
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    emit(&format!("{}\n", serde_json::to_string_pretty(value)?))
}

/// `autopar plan`: searches with a progress bar on terminals, then prints
/// the plan (or its JSON).
fn plan_command(a: PlanArgs) -> Result<()> {
    let request = plan::Request {
        model: a.model,
        cluster: a.cluster,
        gpus: a.gpus,
        global_batch: a.global_batch,
        seq: a.seq,
        max_memory_fraction: a.max_memory_fraction,
        top: a.top,
        attention: a.attention,
        dropout: a.dropout,
        moe_capacity_factor: a.moe_capacity_factor,
        objective: a.objective,
        calibration: a.calibration,
        output: a.output.clone(),
        limits: autopar_planner::DegreeLimits {
            lossy_compression: a.allow_lossy_compression,
            ..autopar_planner::DegreeLimits::RUNNABLE
        },
        tp_comm_overlap: a.tp_comm_overlap,
        verify: a.verify,
    };
    let bar = progress_bar();
    let report = |done: usize, total: usize| {
        if let Some(bar) = &bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    };
    let result = plan::run(&request, &report);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let p = result?;
    let compared = a
        .compare
        .as_deref()
        .map(|file| autopar::compare::compare(&p, &request, file))
        .transpose()?;
    if a.json {
        print_json(&p)?;
        // The plan's JSON stays the plan's; the comparison goes to stderr.
        if let Some(c) = &compared {
            eprintln!("{}", serde_json::to_string(c)?);
        }
    } else {
        emit(&plan::render(&p, &a.output))?;
        if let Some(c) = &compared {
            emit(&autopar::compare::render(c, &p))?;
        }
    }
    Ok(())
}

/// `autopar estimate`: prices the one configuration the flags give.
fn estimate_command(a: EstimateArgs) -> Result<()> {
    let from = match a.from.as_deref() {
        Some([tool, file]) => Some((tool.as_str(), std::path::Path::new(file))),
        _ => None,
    };
    let settings = estimate::settings_from(from)?;
    let global_batch = estimate::global_batch(a.global_batch, settings.as_ref())?;
    let request = estimate::Request {
        model: a.model,
        cluster: a.cluster,
        gpus: a.gpus,
        tp: a.tp,
        pp: a.pp,
        dp: a.dp,
        virtual_stages: a.virtual_stages,
        layers_per_chunk: None,
        sp: a.sp,
        cp: a.cp,
        ep: a.ep,
        zero: a.zero,
        global_batch,
        micro_batch: a.micro_batch,
        seq: a.seq,
        recompute: a.recompute,
        schedule: a.schedule,
        attention: a.attention,
        dropout: a.dropout,
        moe_capacity_factor: a.moe_capacity_factor,
        objective: a.objective,
        overlap_grad_reduce: a.overlap_grad_reduce,
        grad_bucket_mib: a.grad_bucket_mib,
        tp_comm_overlap: a.tp_comm_overlap,
        overlap_param_gather: a.overlap_param_gather,
        f32_main_grads: a.f32_main_grads,
        f32_cross_entropy: a.f32_cross_entropy,
        grad_compression: a.grad_compression,
        mesh_order: a.mesh_order,
        calibration: a.calibration,
    };
    let report = estimate::run(&match &settings {
        Some(s) => request.with(s),
        None => request,
    })?;
    if a.json {
        print_json(&report)?;
    } else {
        emit(&estimate::render(&report))?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Inspect {
            model,
            batch,
            seq,
            json,
        } => {
            let r = inspect::report(&model, batch, seq)?;
            if json {
                print_json(&r)?;
            } else {
                emit(&inspect::render(&r))?;
            }
        }
        Command::Check {
            model,
            data,
            no_rewrite,
            precision,
            grads,
            json,
            ..
        } => {
            let precision = precision_of(precision);
            let r = check::run(&model, &data, !no_rewrite, precision, grads.as_deref())?;
            if json {
                print_json(&r)?;
            } else {
                emit(&check::render(&r))?;
            }
            if !r.ok {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Convert {
            model,
            output,
            rewrite,
        } => convert::run(&model, &output, rewrite)?,
        Command::Schema { plan: false } => emit(&format!("{}\n", autopar_ir::json::graph_schema()))?,
        Command::Schema { plan: true } => emit(&format!("{}\n", autopar_planner::Plan::schema()))?,
        Command::Plan(a) => plan_command(a)?,
        Command::Explain { plan: path } => emit(&plan::explain(&plan::load(&path)?))?,
        Command::Estimate(a) => estimate_command(a)?,
        Command::Run(a) => run_command(a)?,
        Command::Export { plan, to, output } => {
            let (written, e) = autopar::export::run(&plan, to, output)?;
            for c in &e.caveats {
                eprintln!("note: not expressible: {c}");
            }
            emit(&format!("wrote {}\n", written.display()))?
        }
        Command::Report {
            plan,
            output,
            calibration,
        } => {
            let w = autopar::report::run(&autopar::report::Request {
                plan,
                output,
                calibration,
            })?;
            for n in &w.notes {
                eprintln!("note: {n}");
            }
            emit(&format!(
                "wrote {} ({})\n",
                w.path.display(),
                autopar::units::binary(w.bytes as f64)
            ))?
        }
        Command::ExportWeights {
            dir,
            output,
            model,
            json,
        } => {
            let e = autopar::export_weights::run(&dir, &output, model.as_deref())?;
            if json {
                print_json(&e)?
            } else {
                emit(&autopar::export_weights::render(&e))?
            }
        }
        Command::Replan {
            dir,
            gpus,
            cluster,
            output,
            json,
        } => {
            let r = autopar::replan::run(&dir, gpus, cluster.as_deref(), output)?;
            if json {
                print_json(&r)?
            } else {
                emit(&autopar::replan::render(&r, &dir))?
            }
        }
        Command::Simulate {
            plan,
            calibration,
            trace,
            every_rank,
            threads,
            json,
        } => {
            use autopar::simulate;
            let request = simulate::Request {
                plan,
                calibration,
                trace,
                every_rank,
                threads,
            };
            let report = simulate::run(&request)?;
            if json {
                print_json(&report)?;
            } else {
                emit(&simulate::render(&report, request.trace.as_deref()))?;
            }
        }
        Command::Profile {
            backend,
            output,
            quick,
        } => {
            let options = autopar_cpu::profile::ProfileOptions { quick };
            if let Some(cal) = autopar::profile::run(backend, &output, &options)? {
                emit(&autopar::profile::render(&cal, &output))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `run --lr`'s help: the optimizers' default learning rates.
fn lr_help() -> String {
    use autopar_exec::train::{DEFAULT_ADAMW_LR, DEFAULT_SGD_LR};
    format!("Learning rate (default: {DEFAULT_ADAMW_LR:e} for AdamW, {DEFAULT_SGD_LR:e} for SGD)")
}

/// `plan --seq` and `estimate --seq`'s help, with the default of a dynamic axis.
fn seq_help() -> String {
    format!(
        "Sequence length (default: the model's; {} for an ONNX export with a dynamic sequence axis)",
        autopar::model::DEFAULT_DYNAMIC_SEQ
    )
}

/// A capacity factor: a positive finite number.
fn capacity_factor(s: &str) -> Result<f64, String> {
    let cf = s
        .parse::<f64>()
        .map_err(|_| format!("'{s}' is not a capacity factor (a positive number, such as 1.25)"))?;
    autopar::limits::capacity_factor(cf)
}

//! Wall time of one training step on the CPU backend: forward, token
//! cross-entropy, backward, gradient reduction and an AdamW update, in f32,
//! for each model on one thread and on two sharing the same global batch:
//! one rank splitting its large products over two threads ("dp=1 x2 thr",
//! what `autopar run` does by default with one rank on two cores), data
//! parallelism over two ranks (dp=2) and, for the zoo GPT, a two-stage 1F1B
//! pipeline (pp=2). The dp=2 layout runs twice: with gradient reduction
//! overlapping the backward pass on each rank's communication worker (the
//! default), and inline ("dp=2 inline"), to measure what the overlap gains.
//! Each row trains a few warm-up steps, then reports the median of the
//! measured steps' wall time (the slowest rank's `StepReport::seconds`) and
//! tokens/s = global batch · seq / step time, and each model ends with the
//! speed-up of its two-thread rows over one thread.
//!
//! Run with `cargo bench -p autopar-cpu --bench train_step` (release
//! build; the zoo GPT takes a few seconds a step on a small machine).
//! Each model's rows end with PyTorch's time for the same step (for
//! gpt2-tiny, the zoo GPT of its architecture), run in the same bench by
//! `scripts/torch_train_step.py` (1 and 2 threads) just before autopar's
//! rows and just after, and autopar's speed relative to the mean of the
//! two: one thread against one, the fastest two-thread layout against two. `AUTOPAR_TORCH_PYTHON` names the Python with
//! torch (default `python3`); without torch the comparison says it was
//! skipped. The bench allocates as the `autopar` binary does (mimalloc,
//! keeping freed memory: `autopar_cpu::allocator`).

use autopar_cpu::train;
use autopar_exec::train::{initialize, Data, Optimizer, TokenSource, DEFAULT_ADAMW_LR};
use autopar_exec::TrainOptions;
use autopar_import::onnx;
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{lower, training_graph, Objective, Strategy};
use autopar_rewrite::{canonicalize, detect_blocks};
use std::error::Error;
use std::path::Path;
use std::process::Command;

/// What the `autopar` binary allocates with, so the bench times what it runs.
#[global_allocator]
static ALLOCATOR: autopar_cpu::allocator::MiMalloc = autopar_cpu::allocator::MiMalloc;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Steps trained before timing (first-touch allocations, optimizer state).
const WARMUP: usize = 2;
/// Steps whose median is reported, for a model whose step takes a
/// second or so; a model of milliseconds a step measures
/// [`MEASURED_SMALL`] (its steps vary more with the host's other work).
const MEASURED: usize = 5;
const MEASURED_SMALL: usize = 50;
/// Seed of the synthetic tokens and of the zoo model's weights.
const SEED: u64 = 1;

/// The ONNX model with a fixed `[2, 16]` token input.
const ONNX_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/models/gpt2-tiny.ts.onnx"
);
/// A GPT-2-style decoder of about 21 M parameters (tied embeddings).
const ZOO_MODEL: &str = "gpt:layers=4,hidden=512,heads=8,vocab=8192,seq=256";
/// gpt2-tiny's architecture as a zoo spec, which the PyTorch baseline
/// builds: GPT-2's learned positions, pre-LayerNorm layers, GELU(tanh) MLP
/// of 4 × hidden, tied head and final LayerNorm, at its 2 layers, 128
/// hidden, 4 heads of 32, 1,000 words and 16 tokens.
const GPT2_TINY_SPEC: &str = "gpt:layers=2,hidden=128,heads=4,vocab=1000,seq=16,final_norm=true";

/// One model to time, with the batch its rows share.
struct Model {
    name: String,
    graph: Graph,
    seq: usize,
    /// Rows per micro-batch at most: an ONNX model's fixed batch; a zoo
    /// model runs a rank's rows in one micro-batch, as `autopar plan` and
    /// `run --plan auto` choose on this host (and as PyTorch runs them).
    max_micro_batch: usize,
    /// Rows per step, the same for every rank count.
    global_batch: usize,
    /// Whether to time a two-stage pipeline too.
    pipeline: bool,
    /// The zoo spec PyTorch builds for the comparison.
    torch_spec: &'static str,
    /// Steps whose median is reported.
    measured: usize,
}

/// One timed configuration.
struct Row {
    ranks: usize,
    /// Threads in all: ranks × each rank's product threads.
    threads: usize,
    layout: String,
    /// Each rank's micro-batches a step, and their rows.
    micro: String,
    step_s: f64,
    tokens_per_s: f64,
}

/// The imported model in canonical ops, its layers found.
fn onnx_model(path: &str) -> Result<Graph> {
    let imported = onnx::load_model(Path::new(path)).map_err(|e| format!("{path}: {e}"))?;
    let mut g = canonicalize(&imported).map_err(|e| format!("{path}: {e}"))?.0;
    g.blocks = detect_blocks(&g).map_err(|e| format!("{path}: {e}"))?;
    Ok(g)
}

/// The size of the `[batch, seq]` token input's dim `axis`, when fixed.
fn fixed_input_dim(g: &Graph, axis: usize) -> Option<usize> {
    let input = g.inputs.first()?;
    g.tensor(*input).ty.shape.0.get(axis)?.fixed()
}

/// The vocabulary: the last dim of the logits output.
fn vocab(g: &Graph) -> Result<usize> {
    g.outputs
        .first()
        .and_then(|&t| g.tensor(t).ty.shape.0.last()?.fixed())
        .ok_or_else(|| "the model has no logits output with a fixed vocabulary".into())
}

fn models() -> Result<Vec<Model>> {
    let tiny = onnx_model(ONNX_MODEL)?;
    let batch = fixed_input_dim(&tiny, 0).ok_or("gpt2-tiny: batch is not fixed")?;
    let seq = fixed_input_dim(&tiny, 1).ok_or("gpt2-tiny: seq is not fixed")?;
    let mut zoo = autopar_import::zoo::build(ZOO_MODEL).map_err(|e| format!("{ZOO_MODEL}: {e}"))?;
    initialize(&mut zoo, SEED).map_err(|e| format!("{ZOO_MODEL}: {e}"))?;
    let zoo_seq = *zoo.bindings.get("seq").ok_or("zoo model without a seq binding")?;
    Ok(vec![
        Model {
            name: "gpt2-tiny.ts.onnx".into(),
            graph: tiny,
            seq,
            max_micro_batch: batch,
            global_batch: 2 * batch,
            pipeline: false,
            torch_spec: GPT2_TINY_SPEC,
            measured: MEASURED_SMALL,
        },
        Model {
            name: ZOO_MODEL.into(),
            graph: zoo,
            seq: zoo_seq,
            max_micro_batch: usize::MAX,
            global_batch: 2,
            pipeline: true,
            torch_spec: ZOO_MODEL,
            measured: MEASURED,
        },
    ])
}

/// One layout to time: its name, strategy, whether communication
/// overlaps compute, and the threads each rank splits its products over.
struct Layout {
    name: &'static str,
    strategy: Strategy,
    overlap: bool,
    threads_per_rank: usize,
}

/// The layouts timed for `m`: one rank on one thread and on two, dp=2
/// (overlapped and inline communication) and (if asked) pp=2, each with
/// `m.global_batch` rows per step.
fn layouts(m: &Model) -> Vec<Layout> {
    let layers = m.graph.blocks.len();
    // Each rank's rows in micro-batches as large as the model allows.
    let on = |dp: usize, pp: usize| {
        let rows = m.global_batch / dp;
        let micro = rows.min(m.max_micro_batch);
        Strategy::new(dp, pp, layers, micro, rows / micro)
    };
    let (one, dp2) = (on(1, 1), on(2, 1));
    let layout = |name, strategy, overlap, threads_per_rank| Layout {
        name,
        strategy,
        overlap,
        threads_per_rank,
    };
    let mut out = vec![
        layout("dp=1", one.clone(), true, 1),
        layout("dp=1 x2 thr", one, true, 2),
        layout("dp=2", dp2.clone(), true, 1),
        layout("dp=2 inline", dp2, false, 1),
    ];
    if m.pipeline {
        out.push(layout("pp=2 1f1b", on(1, 2), true, 1));
    }
    out
}

/// Trains `WARMUP + m.measured` steps of `m` under `s`; the median measured step.
fn time(m: &Model, layout: &Layout) -> Result<Row> {
    let s = &layout.strategy;
    let t = training_graph(&m.graph, s.micro_batch, m.seq, s.global_batch(), Objective::Lm)?;
    let programs = lower(&t, s)?;
    let data: Data = TokenSource::synthetic(vocab(&m.graph)?, SEED).into();
    let mut opts = TrainOptions::new(
        Precision::F32,
        Optimizer::adamw(DEFAULT_ADAMW_LR),
        WARMUP + m.measured,
    );
    opts.overlap_comm = layout.overlap;
    opts.threads_per_rank = layout.threads_per_rank;
    let report = train(&t, &programs, &data, &opts, &|_| {})?;
    let mut times: Vec<f64> = report.steps[WARMUP..].iter().map(|r| r.seconds).collect();
    times.sort_by(f64::total_cmp);
    let step_s = times[times.len() / 2];
    Ok(Row {
        ranks: programs.len(),
        threads: programs.len() * layout.threads_per_rank,
        layout: layout.name.to_string(),
        micro: format!("{} × {}", s.micro_batches, s.micro_batch),
        step_s,
        tokens_per_s: (s.global_batch() * m.seq) as f64 / step_s,
    })
}

fn main() -> Result<()> {
    autopar_cpu::allocator::keep_freed_memory();
    println!("f32, AdamW; the median step after {WARMUP} warm-up steps; one thread per rank unless the layout says");
    for m in models()? {
        println!();
        println!(
            "{}  ({} layers, {} parameters, global batch {} × seq {}, {} steps timed)",
            m.name,
            m.graph.blocks.len(),
            m.graph.float_parameter_elements(&m.graph.bindings),
            m.global_batch,
            m.seq,
            m.measured
        );
        let torch_before = torch_steps(&m);
        println!("  ranks  threads  layout       micro-batches  step_s   tokens/s");
        let mut rows = Vec::new();
        for layout in layouts(&m) {
            let row = time(&m, &layout).map_err(|e| format!("{}: {e}", m.name))?;
            println!(
                "  {:>5}  {:>7}  {:<11}  {:>13}  {:>6.4}  {:>9.0}",
                row.ranks, row.threads, row.layout, row.micro, row.step_s, row.tokens_per_s
            );
            rows.push(row);
        }
        let one = &rows[0];
        let ratios: Vec<String> = rows[1..]
            .iter()
            .map(|r| format!("{} {:.2}×", r.layout, r.tokens_per_s / one.tokens_per_s))
            .collect();
        println!("  2 threads vs 1 (tokens/s): {}", ratios.join(", "));
        compare_with_torch(&m, &rows, torch_before);
    }
    Ok(())
}

/// PyTorch's version and median step for `m` at each of 1 and 2 threads,
/// or why it could not run.
fn torch_steps(m: &Model) -> std::result::Result<(String, Vec<(usize, f64)>), String> {
    let python = std::env::var("AUTOPAR_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/torch_train_step.py");
    let out = Command::new(&python)
        .args([
            script,
            "--spec",
            m.torch_spec,
            "--batch",
            &m.global_batch.to_string(),
        ])
        .args([
            "--warmup",
            &WARMUP.to_string(),
            "--steps",
            &m.measured.to_string(),
        ])
        .args(["--threads", "1", "2"])
        .output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("");
            return Err(format!(
                "{python} {script} failed: {last}; set AUTOPAR_TORCH_PYTHON"
            ));
        }
        Err(e) => return Err(format!("{python}: {e}; set AUTOPAR_TORCH_PYTHON")),
    };
    // Its table rows: threads, step_s, tokens/s, params, loss.
    let steps = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [threads, step, _, _, _] => Some((threads.parse().ok()?, step.parse().ok()?)),
                _ => None,
            }
        })
        .collect();
    let version = text
        .lines()
        .next()
        .unwrap_or("")
        .split(',')
        .next()
        .unwrap_or("torch");
    Ok((version.to_string(), steps))
}

/// PyTorch's step for `m` beside autopar's rows: one thread against
/// autopar's one, two against autopar's fastest two-thread layout.
/// PyTorch runs just before autopar's rows (`before`) and just after, and
/// is compared at the mean of the two, so a host whose speed drifts
/// during the bench (these are shared machines) favours neither side.
fn compare_with_torch(
    m: &Model,
    rows: &[Row],
    before: std::result::Result<(String, Vec<(usize, f64)>), String>,
) {
    let (version, first) = match before {
        Ok(b) => b,
        Err(why) => {
            println!("  PyTorch: skipped ({why})");
            return;
        }
    };
    let after = torch_steps(m).map(|(_, s)| s).unwrap_or_default();
    for (threads, torch_before) in first {
        let Some(&(_, torch_after)) = after.iter().find(|(t, _)| *t == threads) else {
            continue;
        };
        let torch_s = (torch_before + torch_after) / 2.0;
        let ours = rows
            .iter()
            .filter(|r| r.threads == threads)
            .min_by(|a, b| a.step_s.total_cmp(&b.step_s));
        if let Some(r) = ours {
            println!(
                "  {version}, {threads} thread{}: {torch_s:.4} s (before {torch_before:.4}, after {torch_after:.4}); \
                 autopar ({}) {:.4} s = {:.2}× PyTorch's speed",
                if threads == 1 { "" } else { "s" },
                r.layout,
                r.step_s,
                torch_s / r.step_s
            );
        }
    }
}

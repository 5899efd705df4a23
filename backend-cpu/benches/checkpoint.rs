//! Checkpoint costs on this machine:
//!
//! 1. Save and load throughput of a ~100M-parameter zoo GPT (weights and
//!    AdamW's two moments, f32: about 1.3 GB): one step trained on one rank
//!    with a save after it, the save timed from the step's end until the
//!    checkpoint is published; the load is `checkpoint::open` rebuilding
//!    every tensor whole.
//! 2. What saving costs a run: the median step time of the 16.9M-parameter
//!    zoo GPT (global batch 2 × 256 tokens) without saving and with a save
//!    every step (`--save-every 1`) or every fourth, on one rank and on two
//!    data-parallel ranks (ZeRO-1); the writer thread writes while the next
//!    steps train, so what a save costs the steps is the CPU its writing
//!    takes from them (the kernel's copy into the page cache and the flush),
//!    which a rank that has a core to itself does not feel.
//!
//! Run with `cargo bench -p autopar-cpu --bench checkpoint` (release; a
//! minute or two, ~1.3 GB written to a temporary folder).

use autopar_cpu::train;
use autopar_exec::checkpoint::{self, RunRecord, SavePolicy, Saver};
use autopar_exec::train::{initialize, Data, Optimizer, TokenSource};
use autopar_exec::TrainOptions;
use autopar_ir::interp::Precision;
use autopar_lower::{for_strategy, lower, Objective, Program, Strategy, TrainingGraph};
use std::error::Error;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// About 110M parameters (85M in the layers, 25M in the tied embedding).
const LARGE: &str = "gpt:layers=12,hidden=768,heads=12,vocab=32768,seq=32";
/// The 16.9M-parameter zoo GPT of the README.
const SMALL: &str = "gpt:layers=4,hidden=512,heads=8,vocab=8192,seq=256";
/// Steps of the overhead runs (the first two are warm-up).
const STEPS: usize = 10;

fn lowered(spec: &str, s: &Strategy, seq: usize) -> Result<(TrainingGraph, Vec<Program>, u64)> {
    let mut g = autopar_import::zoo::build(spec)?;
    initialize(&mut g, 1)?;
    let params = g
        .tensors()
        .filter(|(_, t)| t.role == autopar_ir::Role::Parameter)
        .filter_map(|(_, t)| t.data.as_ref().map(|d| d.numel() as u64))
        .sum();
    let t = for_strategy(&g, s, seq, Objective::Lm)?;
    let programs = lower(&t, s)?;
    Ok((t, programs, params))
}

fn saver(
    dir: &Path,
    every: usize,
    t: &TrainingGraph,
    programs: &[Program],
    steps: usize,
) -> Result<Arc<Saver>> {
    let policy = SavePolicy {
        dir: dir.to_path_buf(),
        every,
        keep: 2,
    };
    let record = RunRecord {
        model: "bench".into(),
        model_hash: "bench".into(),
        precision: Precision::F32,
        optimizer: Optimizer::adamw(1e-4),
        seed: 1,
        plan: serde_json::Value::Null,
    };
    let local = (0..programs.len()).collect();
    Ok(Arc::new(Saver::start(
        policy,
        record,
        t,
        programs,
        local,
        0,
        steps,
        Duration::from_secs(600),
    )?))
}

fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn throughput() -> Result<()> {
    let s = Strategy::new(1, 1, 12, 1, 1);
    let (t, programs, params) = lowered(LARGE, &s, 32)?;
    let dir = tempfile::tempdir()?;
    let data: Data = TokenSource::synthetic(32768, 1).into();
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-4), 1);
    opts.saver = Some(saver(dir.path(), 0, &t, &programs, 1)?);
    let report = train(&t, &programs, &data, &opts, &|_| {})?;
    let trained = Instant::now();
    opts.saver.as_ref().ok_or("no saver")?.finish()?;
    let save_s = trained.elapsed().as_secs_f64();
    let bytes = folder_bytes(&dir.path().join("step-1"));
    let loading = Instant::now();
    let restored = checkpoint::open(dir.path())?;
    let load_s = loading.elapsed().as_secs_f64();
    let gb = bytes as f64 / 1e9;
    println!(
        "{LARGE}: {:.1}M parameters, step {:.2} s; checkpoint {gb:.2} GB ({} tensors)",
        params as f64 / 1e6,
        report.steps[0].seconds,
        restored.index.tensors.len()
    );
    println!(
        "  save (after the step, until published) {save_s:.2} s = {:.2} GB/s",
        gb / save_s
    );
    println!(
        "  load (read and rebuild whole)          {load_s:.2} s = {:.2} GB/s",
        gb / load_s
    );
    Ok(())
}

/// The median step time of `STEPS` steps after two warm-up steps, saving
/// every `every` steps (0: never) into a fresh folder in `dir`.
fn median_step(t: &TrainingGraph, programs: &[Program], dir: &Path, every: usize) -> Result<(f64, u64)> {
    let data: Data = TokenSource::synthetic(8192, 1).into();
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-4), STEPS);
    let fresh = tempfile::tempdir_in(dir)?;
    if every > 0 {
        opts.saver = Some(saver(fresh.path(), every, t, programs, STEPS)?);
    }
    let report = train(t, programs, &data, &opts, &|_| {})?;
    if let Some(s) = &opts.saver {
        s.finish()?;
    }
    let mut steps: Vec<f64> = report.steps.iter().skip(2).map(|s| s.seconds).collect();
    steps.sort_by(f64::total_cmp);
    let saved = folder_bytes(&fresh.path().join(format!("step-{STEPS}")));
    Ok((steps[steps.len() / 2], saved))
}

fn overhead() -> Result<()> {
    println!("{SMALL}, global batch 2 × 256 tokens:");
    let dir = tempfile::tempdir()?;
    for (ranks, name) in [(1, "1 rank"), (2, "dp 2 ZeRO-1")] {
        let mut s = Strategy::new(ranks, 1, 4, 1, 2 / ranks);
        s.zero = u8::from(ranks > 1);
        let (t, programs, _) = lowered(SMALL, &s, 256)?;
        // Interleaved twice, the faster kept: drift on a shared machine falls on all alike.
        let mut best = [f64::INFINITY; 3];
        let mut bytes = 0;
        for _ in 0..2 {
            for (i, every) in [0, 1, 4].into_iter().enumerate() {
                let (step, saved) = median_step(&t, &programs, dir.path(), every)?;
                best[i] = best[i].min(step);
                bytes = bytes.max(saved);
            }
        }
        let pct = |x: f64| (x / best[0] - 1.0) * 100.0;
        println!(
            "  {name}: {:.0} MB a checkpoint; median step {:.3} s without saving, {:.3} s saving every step ({:+.1} %), {:.3} s every 4th ({:+.1} %)",
            bytes as f64 / 1e6,
            best[0],
            best[1],
            pct(best[1]),
            best[2],
            pct(best[2])
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    throughput()?;
    overhead()
}

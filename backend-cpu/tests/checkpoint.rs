//! Checkpoints: a run saved after some steps and resumed continues as if it
//! had never stopped — bit for bit under the same plan, and to 1e-12 in
//! f64 under another plan (data, tensor, pipeline and expert parallelism,
//! every ZeRO stage, other rank counts), which reads the index's global
//! layouts and cuts its own slices and shards.

use autopar_cpu::train;
use autopar_exec::checkpoint::{self, RunRecord, SavePolicy, Saver};
use autopar_exec::train::{initialize, Data, Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_lower::{for_strategy, lower, Objective, Program, Strategy, TrainingGraph};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const SEQ: usize = 8;
const LAYERS: usize = 4;
const STEPS: usize = 6;
const SAVED_AT: usize = 3;

/// The zoo GPT (tied embeddings: pipelines keep a copy).
const GPT: &str = "gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8";
/// A zoo mixture of experts (expert parallelism slices the experts).
const MOE: &str = "moe:layers=4,hidden=32,ffn=48,heads=4,experts=4,top_k=2,vocab=64,seq=8";

/// `spec` lowered for `s`.
fn lowered(spec: &str, s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    let mut g = autopar_import::zoo::build(spec).unwrap();
    initialize(&mut g, 7).unwrap();
    let t = for_strategy(&g, s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, s).unwrap();
    (t, programs)
}

fn data() -> Data {
    TokenSource::synthetic(64, 3).into()
}

fn options(precision: Precision, steps: usize) -> TrainOptions {
    let mut opts = TrainOptions::new(precision, Optimizer::adamw(1e-2), steps);
    opts.timeout = Duration::from_secs(30);
    opts
}

fn losses(r: &TrainReport) -> Vec<f64> {
    r.steps.iter().map(|s| s.loss).collect()
}

/// Trains `s` for `SAVED_AT` of `STEPS` steps, saving into `dir`.
fn train_and_save(spec: &str, s: &Strategy, precision: Precision, dir: &Path) -> Vec<f64> {
    let (t, programs) = lowered(spec, s);
    let policy = SavePolicy {
        dir: dir.to_path_buf(),
        every: 0,
        keep: 2,
    };
    let record = RunRecord {
        model: "zoo".into(),
        model_hash: "test".into(),
        precision,
        optimizer: Optimizer::adamw(1e-2),
        seed: 3,
        plan: serde_json::Value::Null,
    };
    let local = (0..programs.len()).collect();
    let saver = Saver::start(
        policy,
        record,
        &t,
        &programs,
        local,
        0,
        SAVED_AT,
        Duration::from_secs(5),
    )
    .unwrap();
    let mut opts = options(precision, SAVED_AT);
    opts.saver = Some(Arc::new(saver));
    let report = train(&t, &programs, &data(), &opts, &|_| {}).unwrap();
    opts.saver.as_ref().unwrap().finish().unwrap();
    losses(&report)
}

/// Resumes the checkpoint in `dir` under `s` up to `STEPS`.
fn resume(spec: &str, s: &Strategy, precision: Precision, dir: &Path) -> Vec<f64> {
    let (t, programs) = lowered(spec, s);
    let restored = checkpoint::open(dir).unwrap();
    assert_eq!(restored.index.step, SAVED_AT);
    let mut opts = options(precision, STEPS);
    opts.first_step = restored.index.step;
    opts.restore = Some(Arc::new(restored));
    let report = train(&t, &programs, &data(), &opts, &|_| {}).unwrap();
    assert_eq!(report.steps.first().map(|s| s.step), Some(SAVED_AT));
    losses(&report)
}

fn uninterrupted(spec: &str, s: &Strategy, precision: Precision) -> Vec<f64> {
    let (t, programs) = lowered(spec, s);
    losses(&train(&t, &programs, &data(), &options(precision, STEPS), &|_| {}).unwrap())
}

/// The plans resumed: every kind of parallelism and ZeRO stage, eight rows a step.
fn strategies() -> Vec<(&'static str, Strategy)> {
    let zero = |mut s: Strategy, stage: u8| {
        s.zero = stage;
        s
    };
    vec![
        ("dp2 zero2", zero(Strategy::new(2, 1, LAYERS, 2, 2), 2)),
        ("tp2 pp2", Strategy::new(1, 2, LAYERS, 2, 4).with_tp(2, false)),
        (
            "dp2 tp2 sp zero1",
            zero(Strategy::new(2, 1, LAYERS, 2, 2).with_tp(2, true), 1),
        ),
        ("pp2 dp2 zero3", zero(Strategy::new(2, 2, LAYERS, 2, 2), 3)),
        ("one rank", Strategy::new(1, 1, LAYERS, 2, 4)),
    ]
}

#[test]
fn a_resumed_run_continues_bit_for_bit_under_its_plan() {
    for (name, s) in strategies() {
        let dir = tempfile::tempdir().unwrap();
        let whole = uninterrupted(GPT, &s, Precision::F32);
        let mut split = train_and_save(GPT, &s, Precision::F32, dir.path());
        split.extend(resume(GPT, &s, Precision::F32, dir.path()));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&split), bits(&whole), "{name}: {split:?} vs {whole:?}");
    }
}

/// Trains `a` to `SAVED_AT`, resumes under `b` to `STEPS`: the losses of
/// `a` uninterrupted, to 1e-12 in f64.
fn reshards(spec: &str, (from, a): &(&str, Strategy), (to, b): &(&str, Strategy)) {
    let dir = tempfile::tempdir().unwrap();
    let whole = uninterrupted(spec, a, Precision::F64);
    let mut split = train_and_save(spec, a, Precision::F64, dir.path());
    split.extend(resume(spec, b, Precision::F64, dir.path()));
    assert_eq!(split.len(), whole.len());
    for (x, y) in split.iter().zip(&whole) {
        assert!(
            (x - y).abs() <= 1e-12 * y.abs(),
            "{from} → {to}: {split:?} vs {whole:?}"
        );
    }
}

#[test]
fn a_run_resumed_under_another_plan_reshards() {
    let plans = strategies();
    for pair in plans
        .windows(2)
        .chain([[plans[4].clone(), plans[0].clone()].as_slice()])
    {
        reshards(GPT, &pair[0], &pair[1]);
    }
}

#[test]
fn experts_reshard_between_expert_parallel_and_one_rank() {
    let mut ep2 = Strategy::new(2, 1, LAYERS, 2, 2);
    ep2.ep = 2;
    let ep2 = ("dp2 ep2", ep2);
    let one = ("one rank", Strategy::new(1, 1, LAYERS, 2, 4));
    reshards(MOE, &ep2, &one);
    reshards(MOE, &one, &ep2);
}

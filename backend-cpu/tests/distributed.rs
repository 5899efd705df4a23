//! One rank per process = every rank in one process: a plan run with each
//! rank on its own TCP endpoint (as separate processes under a launcher
//! run it) gives bit for bit the losses and the byte counts of the same
//! plan run as threads, and rank 0 reports the whole run.

use autopar_comm::collective::connect;
use autopar_comm::launch::LaunchEnv;
use autopar_cpu::{train, train_rank};
use autopar_exec::trace::TraceEvent;
use autopar_exec::train::{initialize, Data, Optimizer, TokenSource};
use autopar_exec::{ExecError, Fault, RankResult, StepReport, TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{for_strategy, lower, Objective, Program, Strategy, TrainingGraph};
use std::sync::Mutex;
use std::time::Duration;

const SEQ: usize = 8;
const LAYERS: usize = 4;

fn lowered(s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    let spec = format!("gpt:layers={LAYERS},hidden=32,heads=4,vocab=64,seq={SEQ}");
    let mut g: Graph = autopar_import::zoo::build(&spec).unwrap();
    initialize(&mut g, 7).unwrap();
    let t = for_strategy(&g, s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, s).unwrap();
    (t, programs)
}

fn options(steps: usize) -> TrainOptions {
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-2), steps);
    opts.timeout = Duration::from_secs(20);
    opts
}

/// A loopback port no other test of this process is using.
fn free_port() -> u16 {
    autopar_comm::launch::loopback_test_port().expect("a free loopback port")
}

/// Runs every rank on its own thread with its own TCP endpoint, as
/// separate processes would; returns each rank's result and rank 0's
/// progress calls.
fn run_per_rank(
    t: &TrainingGraph,
    programs: &[Program],
    opts: &TrainOptions,
) -> (Vec<Result<RankResult<TrainReport>, ExecError>>, Vec<StepReport>) {
    let world = programs.len();
    let port = free_port();
    let data: Data = TokenSource::synthetic(64, 3).into();
    let progress = Mutex::new(Vec::new());
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (data, progress) = (&data, &progress);
                s.spawn(move || {
                    let env = LaunchEnv::loopback(rank, world, port);
                    let endpoint = connect(&env, Duration::from_secs(20), opts.timeout).unwrap();
                    let on_step = |r: &StepReport| progress.lock().unwrap().push(r.clone());
                    train_rank(t, programs, endpoint, data, opts, &on_step)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (results, progress.into_inner().unwrap())
}

fn check(s: Strategy) {
    let (t, programs) = lowered(&s);
    let opts = options(3);
    let threads = train(
        &t,
        &programs,
        &TokenSource::synthetic(64, 3).into(),
        &opts,
        &|_| {},
    )
    .unwrap();
    let (results, progress) = run_per_rank(&t, &programs, &opts);
    let mut results = results.into_iter();
    let report = results
        .next()
        .unwrap()
        .unwrap()
        .report
        .expect("rank 0 reports the run");
    assert!(
        results.all(|r| r.is_ok_and(|r| r.report.is_none())),
        "ranks above 0 report nothing"
    );
    let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(losses(&report), losses(&threads), "losses differ");
    assert_eq!(
        progress.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>(),
        losses(&threads),
        "progress differs"
    );
    let bytes = |r: &TrainReport| r.ranks.iter().map(|r| (r.rank, r.bytes_sent)).collect::<Vec<_>>();
    assert_eq!(bytes(&report), bytes(&threads));
    let peaks = |r: &TrainReport| {
        r.ranks
            .iter()
            .map(|r| r.peak_activation_bytes)
            .collect::<Vec<_>>()
    };
    assert_eq!(peaks(&report), peaks(&threads));
}

#[test]
fn data_parallel_with_zero() {
    let mut s = Strategy::new(2, 1, LAYERS, 2, 2);
    s.zero = 2;
    check(s);
}

#[test]
fn pipeline_1f1b() {
    check(Strategy::new(1, 2, LAYERS, 1, 4));
}

#[test]
fn hybrid_dp2_tp2_pp2() {
    let mut s = Strategy::new(2, 2, LAYERS, 1, 2).with_tp(2, true);
    s.zero = 1;
    check(s);
}

#[test]
fn a_failing_rank_fails_every_process_naming_it() {
    let (t, programs) = lowered(&Strategy::new(1, 2, LAYERS, 1, 2));
    let mut opts = options(2);
    opts.fault = Some(Fault {
        rank: 1,
        step: 1,
        instruction: 3,
    });
    let (results, _) = run_per_rank(&t, &programs, &opts);
    let messages: Vec<String> = results.into_iter().map(|r| r.unwrap_err().to_string()).collect();
    assert!(
        messages[1].starts_with("rank 1, step 1, instruction 3"),
        "{}",
        messages[1]
    );
    assert!(
        messages[0].contains("because rank 1 failed: rank 1, step 1, instruction 3"),
        "{}",
        messages[0]
    );
}

#[test]
fn gradients_need_one_process() {
    let (t, programs) = lowered(&Strategy::new(2, 1, LAYERS, 1, 2));
    let mut opts = options(1);
    opts.record_grads = true;
    let (results, _) = run_per_rank(&t, &programs, &opts);
    for r in results {
        let message = r.unwrap_err().to_string();
        assert!(message.contains("needs every rank in one process"), "{message}");
    }
}

#[test]
fn each_rank_keeps_its_own_trace() {
    let (t, programs) = lowered(&Strategy::new(1, 2, LAYERS, 1, 2));
    let mut opts = options(1);
    opts.trace = true;
    let (results, _) = run_per_rank(&t, &programs, &opts);
    for (rank, r) in results.into_iter().enumerate() {
        let trace = r.unwrap().trace;
        assert!(!trace.is_empty(), "rank {rank} traced nothing");
        assert!(trace.iter().all(|e| match e {
            TraceEvent::Span { rank: r, .. } | TraceEvent::Memory { rank: r, .. } => *r == rank,
        }));
    }
}

//! Parallel = single: every strategy the runtime lowers computes the same
//! losses and gradients as one rank running the whole batch.
//!
//! Every test is written once and runs twice: on the CPU backend
//! (`cpu::...`) and on the CUDA backend (`cuda::...`, all ranks on GPU 0;
//! skipped with a message where there is no GPU, and failing there under
//! `AUTOPAR_REQUIRE_GPU=1`). CUDA computes in f32, so its copies compare in
//! f32 with a GPU tolerance where the CPU ones use f64.

use autopar_cost_models::comm::Algorithm;
use autopar_cost_models::{Recompute, Schedule};
use autopar_exec::train::{initialize, Data, Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{for_strategy, lower, Objective, Strategy};

const SEQ: usize = 8;
const LAYERS: usize = 4;

fn model() -> Graph {
    let spec = format!("gpt:layers={LAYERS},hidden=32,heads=4,vocab=64,seq={SEQ}");
    let mut g = autopar_import::zoo::build(&spec).unwrap();
    initialize(&mut g, 7).unwrap();
    g
}

/// The backend a copy of the tests runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Cpu,
    Cuda,
}

/// Trains `programs` on `on` (CUDA runs f64 requests in f32).
fn train(
    on: On,
    t: &autopar_lower::TrainingGraph,
    programs: &[autopar_lower::Program],
    data: &Data,
    opts: &TrainOptions,
) -> TrainReport {
    match on {
        On::Cpu => autopar_cpu::train(t, programs, data, opts, &|_| {}).unwrap(),
        On::Cuda => {
            let mut opts = opts.clone();
            opts.precision = Precision::F32;
            let cuda = autopar_cuda::CudaOptions::default();
            autopar_cuda::train(t, programs, data, &opts, &cuda, &|_| {})
                .unwrap()
                .train
        }
    }
}

/// The relative tolerance of a comparison in `precision` on `on`: f32
/// kernels on the GPU sum in other orders (atomics, tiles) than the CPU.
fn tol(on: On, precision: Precision) -> f64 {
    match (on, precision) {
        (On::Cpu, Precision::F64) => 1e-9,
        (On::Cpu, Precision::F32) => 1e-5,
        (On::Cuda, _) => 2e-4,
    }
}

fn run(on: On, s: &Strategy, precision: Precision, optimizer: Optimizer, steps: usize) -> TrainReport {
    let g = model();
    let t = for_strategy(&g, s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, s).unwrap();
    let mut opts = TrainOptions::new(precision, optimizer, steps);
    opts.record_grads = true;
    opts.timeout = std::time::Duration::from_secs(30);
    train(on, &t, &programs, &TokenSource::synthetic(64, 3).into(), &opts)
}

/// Relative error of gradient `a` against `b`: max|a−b| / max|b|, with the
/// scale floored at `floor` (the largest gradient of the model), so a
/// gradient that is zero in exact arithmetic (rounding noise on both sides,
/// such as a constant added to every score before a softmax) is compared
/// at the model's scale.
fn rel(a: &[f64], b: &[f64], floor: f64) -> f64 {
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    diff / scale.max(floor)
}

/// A millionth of the largest gradient entry of a run: the floor for [`rel`]
/// (so the absolute tolerance of a tiny gradient is `tol` × that).
fn noise_floor(r: &TrainReport) -> f64 {
    let max = r
        .gradients
        .values()
        .flat_map(|g| g.to_f64_vec())
        .fold(0.0, |m: f64, x| m.max(x.abs()));
    max * 1e-6
}

/// `b`'s first step matches `a`'s: the loss and every gradient within
/// `tol`. Where `b` keeps a tied weight's two copies (pipeline or tensor
/// parallelism; one rank keeps one weight), each copy's gradient is the
/// tied weight's.
fn assert_same_step(a: &TrainReport, b: &TrainReport, tol: f64) {
    let (la, lb) = (a.steps[0].loss, b.steps[0].loss);
    assert!(((la - lb) / la).abs() <= tol, "loss {la} vs {lb}");
    let keys = || b.gradients.keys().collect::<Vec<_>>();
    assert!(
        a.gradients.keys().all(|p| b.gradients.contains_key(p)),
        "{:?}",
        keys()
    );
    for (p, gb) in &b.gradients {
        let original = p.strip_suffix(".tied").unwrap_or(p);
        let ga = a
            .gradients
            .get(original)
            .unwrap_or_else(|| panic!("{p} has no counterpart"));
        let e = rel(&gb.to_f64_vec(), &ga.to_f64_vec(), noise_floor(a));
        assert!(e <= tol, "gradient of {p}: rel {e}");
    }
}

/// `b` has `a`'s loss at every step, within `tol`.
fn assert_same_losses(a: &TrainReport, b: &TrainReport, tol: f64) {
    for (x, y) in a.steps.iter().zip(&b.steps) {
        assert!(
            ((x.loss - y.loss) / x.loss).abs() <= tol,
            "step {}: {} vs {}",
            x.step,
            x.loss,
            y.loss
        );
    }
}

/// One step's loss and gradients, then (in f64) five steps' losses, against
/// one rank; an f64 check also runs the one-step check in f32.
fn check_on(on: On, s: Strategy, precision: Precision) {
    let tol = tol(on, precision);
    let single = Strategy::new(1, 1, LAYERS, s.micro_batch, s.global_batch() / s.micro_batch);
    let a = run(on, &single, precision, Optimizer::sgd(0.1), 1);
    let b = run(on, &s, precision, Optimizer::sgd(0.1), 1);
    assert_same_step(&a, &b, tol);
    if precision == Precision::F64 {
        let a = run(on, &single, precision, Optimizer::adamw(1e-2), 5);
        let b = run(on, &s, precision, Optimizer::adamw(1e-2), 5);
        assert_same_losses(&a, &b, tol);
        assert!(a.steps[4].loss < a.steps[0].loss);
        if on == On::Cpu {
            check_on(on, s, Precision::F32);
        }
    }
}

fn with(mut s: Strategy, f: impl FnOnce(&mut Strategy)) -> Strategy {
    f(&mut s);
    s
}

/// Instantiates the tests once per backend; inside them `ON` names it.
macro_rules! on_every_backend {
    ($($(#[doc = $doc:expr])* fn $name:ident() $body:block)*) => {
        mod cpu {
            use super::*;
            const ON: On = On::Cpu;
            $($(#[doc = $doc])* #[test] fn $name() $body)*
        }
        mod cuda {
            use super::*;
            const ON: On = On::Cuda;
            $($(#[doc = $doc])* #[test] fn $name() {
                if autopar_cuda::gpu_or_skip(concat!("cuda::", stringify!($name))).is_none() {
                    return;
                }
                $body
            })*
        }
    };
}

on_every_backend! {

fn data_parallel_ring() {
    check_on(ON, Strategy::new(2, 1, LAYERS, 2, 2), Precision::F64);
}

fn data_parallel_parameter_server() {
    check_on(ON,
        with(Strategy::new(4, 1, LAYERS, 1, 2), |s| {
            s.reduction = Algorithm::ParameterServer
        }),
        Precision::F64,
    );
}

fn zero_stages() {
    for zero in 1..=3 {
        check_on(ON,
            with(Strategy::new(2, 1, LAYERS, 2, 2), |s| s.zero = zero),
            Precision::F64,
        );
    }
    // ZeRO-3 under a pipeline, with the tied embedding's copies on both ends.
    check_on(ON,
        with(Strategy::new(2, 2, LAYERS, 1, 2), |s| s.zero = 3),
        Precision::F64,
    );
}

fn zero_stages_in_buckets() {
    // One gradient per collective, and several buckets (the default holds
    // the tiny model in one): ZeRO-2/3 reduce-scatter each of the 2
    // micro-batches bucket by bucket; with a pipeline, the tied embedding's
    // copies reduce after it.
    for bucket_bytes in [0, 16 << 10] {
        for zero in 0..=3 {
            let s = with(Strategy::new(2, 1, LAYERS, 1, 2), |s| {
                s.zero = zero;
                s.bucket_bytes = bucket_bytes;
            });
            check_on(ON, s, Precision::F64);
        }
        let s = with(Strategy::new(2, 2, LAYERS, 1, 2), |s| {
            s.zero = 2;
            s.bucket_bytes = bucket_bytes;
        });
        check_on(ON, s, Precision::F64);
    }
}

fn pipeline_gpipe() {
    check_on(ON,
        with(Strategy::new(1, 2, LAYERS, 2, 4), |s| {
            s.schedule = Schedule::Gpipe
        }),
        Precision::F64,
    );
}

fn pipeline_1f1b() {
    check_on(ON, Strategy::new(1, 4, LAYERS, 1, 4), Precision::F64);
}

fn pipeline_interleaved() {
    let s = with(Strategy::new(1, 2, LAYERS, 1, 4), |s| {
        s.schedule = Schedule::Interleaved;
        s.chunks = 2;
    });
    check_on(ON, s, Precision::F64);
}

fn recomputation() {
    let s = with(Strategy::new(1, 2, LAYERS, 2, 2), |s| {
        s.recompute = vec![Recompute::Full, Recompute::Selective]
    });
    check_on(ON, s, Precision::F64);
}

fn hybrid_data_and_pipeline_on_8_ranks() {
    let s = with(Strategy::new(4, 2, LAYERS, 1, 2), |s| s.zero = 1);
    check_on(ON, s, Precision::F64);
    check_on(ON, Strategy::new(2, 2, LAYERS, 1, 2), Precision::F32);
}

fn tensor_parallel() {
    check_on(ON,
        Strategy::new(1, 1, LAYERS, 2, 2).with_tp(2, false),
        Precision::F64,
    );
    check_on(ON,
        Strategy::new(1, 1, LAYERS, 2, 1).with_tp(4, false),
        Precision::F32,
    );
}

fn tensor_and_sequence_parallel() {
    check_on(ON, Strategy::new(1, 1, LAYERS, 2, 2).with_tp(2, true), Precision::F64);
    check_on(ON, Strategy::new(1, 1, LAYERS, 2, 1).with_tp(4, true), Precision::F64);
}

fn hybrid_dp2_tp2_pp2_on_8_ranks() {
    let s = with(Strategy::new(2, 2, LAYERS, 1, 2).with_tp(2, true), |s| s.zero = 1);
    check_on(ON, s, Precision::F64);
}

fn context_parallel() {
    check_on(ON, Strategy::new(1, 1, LAYERS, 2, 2).with_cp(2), Precision::F64);
    let s = with(Strategy::new(2, 2, LAYERS, 1, 2).with_cp(2), |s| s.zero = 2);
    check_on(ON, s, Precision::F64);
}

fn expert_parallel() {
    let spec = format!("moe:layers=2,hidden=32,ffn=48,heads=4,experts=4,top_k=2,vocab=64,seq={SEQ}");
    let mut g = autopar_import::zoo::build(&spec).unwrap();
    initialize(&mut g, 5).unwrap();
    let run = |s: &Strategy, optimizer: Optimizer, steps: usize| {
        let t = for_strategy(&g, s, SEQ, Objective::Lm).unwrap();
        let programs = lower(&t, s).unwrap();
        let mut opts = TrainOptions::new(Precision::F64, optimizer, steps);
        opts.record_grads = true;
        train(ON, &t, &programs, &TokenSource::synthetic(64, 3).into(), &opts)
    };
    let single = Strategy::new(1, 1, 2, 1, 4);
    // Expert parallelism alone (2 and 4 ways), and with data, tensor and
    // pipeline parallelism.
    for s in [
        with(Strategy::new(2, 1, 2, 1, 2), |s| s.ep = 2),
        with(Strategy::new(4, 1, 2, 1, 1), |s| s.ep = 4),
        with(Strategy::new(4, 1, 2, 1, 1), |s| {
            s.ep = 2;
            s.zero = 1;
        }),
        with(Strategy::new(2, 1, 2, 1, 2).with_tp(2, false), |s| s.ep = 2),
        with(Strategy::new(2, 2, 2, 1, 2), |s| s.ep = 2),
        with(Strategy::new(2, 1, 2, 1, 2).with_cp(2), |s| s.ep = 2),
    ] {
        eprintln!("dp {} tp {} pp {} cp {} ep {}", s.dp, s.tp, s.pp, s.cp, s.ep);
        assert_same_step(
            &run(&single, Optimizer::sgd(0.1), 1),
            &run(&s, Optimizer::sgd(0.1), 1),
            tol(ON, Precision::F64),
        );
        assert_same_losses(
            &run(&single, Optimizer::adamw(1e-2), 5),
            &run(&s, Optimizer::adamw(1e-2), 5),
            tol(ON, Precision::F64),
        );
    }
    // A capacity factor drops what exceeds each expert's block of a rank's
    // assignments; expert parallelism drops the same (capacity is per
    // rank's micro-batch), so it gives one rank's losses at that capacity.
    let capped = |s: Strategy, cf: f64| with(s, |s| s.capacity_factor = Some(cf));
    let dropless = run(&single, Optimizer::sgd(0.1), 1);
    let tight = run(&capped(single.clone(), 0.5), Optimizer::sgd(0.1), 1);
    assert!((tight.steps[0].loss - dropless.steps[0].loss).abs() > 1e-6, "a capacity of half drops tokens");
    for s in [
        with(Strategy::new(2, 1, 2, 1, 2), |s| s.ep = 2),
        with(Strategy::new(4, 1, 2, 1, 1).with_tp(1, false), |s| s.ep = 4),
    ] {
        for cf in [0.5, 1.25] {
            assert_same_step(
                &run(&capped(single.clone(), cf), Optimizer::sgd(0.1), 1),
                &run(&capped(s.clone(), cf), Optimizer::sgd(0.1), 1),
                tol(ON, Precision::F64),
            );
        }
    }
}

fn the_bundled_onnx_models_train_in_parallel() {
    // GPT-2 (tied embeddings across pipeline stages) and Llama (rotary) as
    // exported by PyTorch, with the largest tensor-parallel degree their
    // (key/value) heads allow.
    for (file, max_tp) in [
        ("gpt2-tiny.ts.onnx", 4),
        ("gpt2-tiny.dynamo.onnx", 4),
        ("llama-tiny.ts.onnx", 2),
        ("llama-tiny.dynamo.onnx", 2),
    ] {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/models/").to_string() + file;
        let mut g = autopar_import::onnx::load_model(std::path::Path::new(&path)).unwrap();
        let (canonical, _) = autopar_rewrite::canonicalize(&g).unwrap();
        g = canonical;
        g.blocks = autopar_rewrite::detect_blocks(&g).unwrap();
        let layers = g.blocks.len();
        let run = |s: &Strategy| {
            let t = for_strategy(&g, s, 16, Objective::Lm).unwrap();
            let programs = lower(&t, s).unwrap();
            let mut opts = TrainOptions::new(Precision::F64, Optimizer::sgd(0.1), 1);
            opts.record_grads = true;
            train(ON, &t, &programs, &TokenSource::synthetic(1000, 3).into(), &opts)
        };
        let single = run(&Strategy::new(1, 1, layers, 2, 2));
        let mut strategies = vec![Strategy::new(1, 2, layers, 2, 2)];
        for tp in [2, 4].into_iter().filter(|&tp| tp <= max_tp) {
            for sp in [false, true] {
                strategies.push(Strategy::new(1, 1, layers, 2, 2).with_tp(tp, sp));
            }
        }
        for s in strategies {
            eprintln!("{file}: pp {} tp {} sp {}", s.pp, s.tp, s.sp);
            assert_same_step(&single, &run(&s), tol(ON, Precision::F64));
        }
    }
}

/// The image classifiers (convolutions, pools) give the host's step on
/// this backend, and the same step under data and pipeline parallelism.
fn the_image_classifiers_train_as_on_the_host() {
    for file in ["convnet3.ts.onnx", "vit.dynamo.onnx"] {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/hf-models/").to_string() + file;
        let g = autopar_import::onnx::load_model(std::path::Path::new(&path)).unwrap();
        let (mut g, _) = autopar_rewrite::canonicalize(&g).unwrap();
        g.blocks = autopar_rewrite::detect_blocks(&g).unwrap();
        let layers = g.blocks.len();
        let run = |on: On, s: &Strategy| {
            let t = for_strategy(&g, s, 1, Objective::Classify).unwrap();
            let programs = lower(&t, s).unwrap();
            let mut opts = TrainOptions::new(Precision::F64, Optimizer::sgd(0.1), 1);
            opts.record_grads = true;
            let data = Data::open(&t.task, None, None, 3).unwrap();
            train(on, &t, &programs, &data, &opts)
        };
        let single = Strategy::new(1, 1, layers, 2, 2);
        let host = run(On::Cpu, &single);
        assert_same_step(&host, &run(ON, &single), tol(ON, Precision::F64));
        let mut strategies = vec![Strategy::new(2, 1, layers, 2, 1)];
        if layers >= 2 {
            strategies.push(Strategy::new(1, 2, layers, 2, 2));
        }
        for s in strategies {
            eprintln!("{file}: dp {} pp {}", s.dp, s.pp);
            assert_same_step(&host, &run(ON, &s), tol(ON, Precision::F64));
        }
    }
}

fn expert_parallel_on_mixtral_tiny() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/models/mixtral-tiny.dynamo.onnx"
    );
    let g = autopar_import::onnx::load_model(std::path::Path::new(path)).unwrap();
    let (mut g, _) = autopar_rewrite::canonicalize(&g).unwrap();
    g.blocks = autopar_rewrite::detect_blocks(&g).unwrap();
    let layers = g.blocks.len();
    let run = |s: &Strategy, optimizer: Optimizer, steps: usize| {
        let t = for_strategy(&g, s, 16, Objective::Lm).unwrap();
        assert_eq!(t.expert_slices.len(), if s.ep > 1 { 2 * layers } else { 0 });
        let programs = lower(&t, s).unwrap();
        let mut opts = TrainOptions::new(Precision::F64, optimizer, steps);
        opts.record_grads = true;
        train(ON, &t, &programs, &TokenSource::synthetic(1000, 3).into(), &opts)
    };
    let single = Strategy::new(1, 1, layers, 2, 2);
    let ep = with(Strategy::new(2, 1, layers, 2, 1), |s| s.ep = 2);
    assert_same_step(
        &run(&single, Optimizer::sgd(0.1), 1),
        &run(&ep, Optimizer::sgd(0.1), 1),
        tol(ON, Precision::F64),
    );
    assert_same_losses(
        &run(&single, Optimizer::adamw(1e-2), 5),
        &run(&ep, Optimizer::adamw(1e-2), 5),
        tol(ON, Precision::F64),
    );
    // Four ways, and two with a pipeline of two stages.
    let single = Strategy::new(1, 1, layers, 2, 4);
    for s in [
        with(Strategy::new(4, 1, layers, 2, 1), |s| s.ep = 4),
        with(Strategy::new(2, 2, layers, 2, 2), |s| s.ep = 2),
    ] {
        assert_same_step(
            &run(&single, Optimizer::sgd(0.1), 1),
            &run(&s, Optimizer::sgd(0.1), 1),
            tol(ON, Precision::F64),
        );
    }
}
}

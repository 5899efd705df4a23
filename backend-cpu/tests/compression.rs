//! Gradient compression that trains: data-parallel gradient reductions
//! sent in bf16 or f16 (`parallel.grad_compression`) under every ZeRO
//! stage follow the uncompressed losses within 16-bit precision, and a
//! rank sends half the gradient bytes: what the estimate counts.

use autopar_cost_models::{
    estimate, Calibration, Cluster, GradCompression, GradReduce, TrainingConfig, Workload,
};
use autopar_cpu::train;
use autopar_exec::train::{Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_lower::{for_strategy, lower, Objective, Strategy};
use std::time::Duration;

mod common;

const SEQ: usize = 8;
const VOCAB: usize = 64;
const STEPS: usize = 20;

/// A two-layer GPT with tied embeddings, which one rank keeps as one table.
fn gpt() -> autopar_ir::Graph {
    common::zoo_gpt()
}

fn run(zero: u8, compression: Option<GradCompression>) -> TrainReport {
    let mut s = Strategy::new(4, 1, 2, 1, 2);
    s.zero = zero;
    s.compression = compression;
    let t = for_strategy(&gpt(), &s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, &s).unwrap();
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(3e-3), STEPS);
    opts.timeout = Duration::from_secs(60);
    train(
        &t,
        &programs,
        &TokenSource::synthetic(VOCAB, 3).into(),
        &opts,
        &|_| {},
    )
    .unwrap()
}

/// The bytes a rank sends per step by the estimate of the same run.
fn estimated_bytes(zero: u8, compression: Option<GradCompression>) -> f64 {
    let mut opts = common::workload_options(SEQ, 1, false);
    opts.micro_batch = Some(1);
    let w = Workload::build(&gpt(), &opts).unwrap();
    let cluster = Cluster::preset("cpu").and_then(|c| c.with_gpus(4)).unwrap();
    let cfg = TrainingConfig {
        dp: 4,
        zero,
        micro_batch: 1,
        global_batch: 8,
        grad_reduce: GradReduce {
            compression,
            ..GradReduce::default()
        },
        ..TrainingConfig::default()
    };
    let per_step = estimate(&w, &cluster, &Calibration::default(), &cfg)
        .unwrap()
        .comm_bytes_per_gpu;
    per_step * STEPS as f64
}

#[test]
fn sixteen_bit_reductions_train_like_f32_and_send_half_the_gradient_bytes() {
    for zero in 0..=3 {
        let plain = run(zero, None);
        let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss).collect::<Vec<_>>();
        let sent = |r: &TrainReport| r.ranks[0].bytes_sent as f64;
        for (dtype, tolerance) in [(GradCompression::Bf16, 2e-3), (GradCompression::Fp16, 1e-4)] {
            let packed = run(zero, Some(dtype));
            let (a, b) = (losses(&plain), losses(&packed));
            assert!(b[STEPS - 1] < 0.8 * b[0], "ZeRO {zero} {dtype}: {b:?}");
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| ((x - y) / x).abs())
                .fold(0.0, f64::max);
            eprintln!(
                "ZeRO {zero} {dtype}: worst loss gap {worst:.1e} over {STEPS} steps, bytes {} vs {}",
                sent(&packed),
                sent(&plain)
            );
            assert!(
                worst <= tolerance,
                "ZeRO {zero} {dtype}: {worst:.2e}\n{a:?}\n{b:?}"
            );
            // What compression saves is what the estimate saves; the totals
            // agree too (the tied table reduced once, as the estimate counts
            // it), but under ZeRO-3, whose programs gather 4 % fewer weight
            // bytes than the estimate counts.
            let priced = estimated_bytes(zero, Some(dtype));
            let saved = sent(&plain) - sent(&packed);
            let priced_saving = estimated_bytes(zero, None) - priced;
            assert!(
                (saved - priced_saving).abs() <= 0.01 * priced_saving,
                "ZeRO {zero} {dtype}: saves {saved} bytes, the estimate {priced_saving}"
            );
            if zero < 3 {
                assert!(
                    (sent(&packed) - priced).abs() <= 0.01 * priced,
                    "ZeRO {zero} {dtype}: sends {} bytes, the estimate counts {priced}",
                    sent(&packed)
                );
            }
            if zero == 0 {
                // Only gradients cross the data-parallel group: half the
                // bytes, up to a packed word's padding per message.
                let (half, got) = (sent(&plain) / 2.0, sent(&packed));
                assert!(
                    (got - half).abs() <= 0.01 * half,
                    "ZeRO 0 {dtype}: {got} vs {half}"
                );
            } else {
                assert!(sent(&packed) < sent(&plain), "ZeRO {zero} {dtype}");
            }
        }
    }
}

/// The lossy methods train (the loss falls over 20 steps), send a
/// fraction of the gradient bytes, and send what the estimate counts;
/// under ZeRO they are refused by name.
#[test]
fn lossy_compressions_train_and_send_what_the_estimate_counts() {
    let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss).collect::<Vec<_>>();
    let sent = |r: &TrainReport| r.ranks[0].bytes_sent as f64;
    let uncompressed = run(0, None);
    let plain = sent(&uncompressed);
    // A warm-up reduces uncompressed: the first steps are the plain run's.
    let warm = run(0, Some("powersgd:4:5".parse().unwrap()));
    assert_eq!(losses(&warm)[..6], losses(&uncompressed)[..6]);
    assert_ne!(losses(&warm)[7], losses(&uncompressed)[7]);
    for spelled in ["powersgd:4", "topk:0.05"] {
        let c: GradCompression = spelled.parse().unwrap();
        let report = run(0, Some(c));
        let l = losses(&report);
        assert!(l[STEPS - 1] < 0.8 * l[0], "{c}: {l:?}");
        let priced = estimated_bytes(0, Some(c));
        eprintln!(
            "{c}: loss {:.4} → {:.4}, sends {} bytes (uncompressed {plain}), the estimate {priced}",
            l[0],
            l[STEPS - 1],
            sent(&report)
        );
        assert!(sent(&report) < 0.5 * plain, "{c}: {} of {plain}", sent(&report));
        assert!(
            (sent(&report) - priced).abs() <= 0.01 * priced,
            "{c}: sends {} bytes, the estimate counts {priced}",
            sent(&report)
        );
        let mut plan_cfg = TrainingConfig {
            dp: 4,
            zero: 1,
            micro_batch: 1,
            global_batch: 8,
            ..TrainingConfig::default()
        };
        plan_cfg.grad_reduce.compression = Some(c);
        let err = plan_cfg.check(4).unwrap_err().to_string();
        assert!(err.contains(spelled) && err.contains("ZeRO 1"), "{err}");
    }
}

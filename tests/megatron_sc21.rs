//! `autopar estimate` against Megatron-LM's published weak-scaling runs
//! (Narayanan et al., SC'21, Table 1; `fixtures/megatron_sc21_table1.json`):
//! every row within ±10 % of the published step time and a mean absolute
//! error of at most 5 %, with one cluster preset and the default
//! calibration for all rows.
//!
//! The published configuration: GPT with vocabulary 51,200 and sequence
//! 2,048 in bf16, dropout, attention computed unfused (2021, before fused
//! attention kernels), full recomputation, the interleaved 1F1B schedule
//! (default chunk count) where there is a pipeline, micro-batch 1.

use autopar::estimate::{run, Request};
use autopar_cost_models::{AttentionKernel, Recompute, Schedule};

const TABLE: &str = include_str!("../fixtures/megatron_sc21_table1.json");
const SEQ: f64 = 2048.0;
const VOCAB: f64 = 51200.0;

#[derive(serde::Deserialize)]
struct Table {
    rows: Vec<Row>,
}

#[derive(serde::Deserialize)]
struct Row {
    heads: usize,
    hidden: usize,
    layers: usize,
    tp: usize,
    pp: usize,
    gpus: usize,
    batch: usize,
    tflops_per_gpu: f64,
}

/// The paper's FLOPs per iteration (recomputation counted) over the
/// achieved rate of all GPUs.
fn published_step_time(r: &Row) -> f64 {
    let (b, s, l, h) = (r.batch as f64, SEQ, r.layers as f64, r.hidden as f64);
    let flops = 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + VOCAB / (16.0 * l * h));
    flops / (r.tflops_per_gpu * 1e12 * r.gpus as f64)
}

fn published_configuration(r: &Row) -> Request {
    Request {
        model: format!(
            "gpt:layers={},hidden={},heads={},vocab=51200,seq=2048,dtype=bf16",
            r.layers, r.hidden, r.heads
        ),
        cluster: "dgx-a100-80g".into(),
        gpus: r.gpus,
        tp: r.tp,
        pp: r.pp,
        dp: None,
        virtual_stages: None,
        sp: false,
        cp: 1,
        ep: 1,
        zero: 0,
        global_batch: r.batch,
        micro_batch: Some(1),
        seq: None,
        recompute: Recompute::Full,
        schedule: if r.pp > 1 {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        },
        attention: AttentionKernel::Unfused,
        dropout: true,
        overlap_grad_reduce: false,
        calibration: None,
    }
}

#[test]
fn every_published_run_within_ten_percent() {
    let table: Table = serde_json::from_str(TABLE).unwrap();
    let mut errors = Vec::new();
    println!("row  params  gpus  tp  pp  predicted_s  published_s   error  fits");
    for (i, r) in table.rows.iter().enumerate() {
        let report = run(&published_configuration(r)).unwrap();
        let (predicted, published) = (report.estimate.step_time_s, published_step_time(r));
        let err = (predicted - published) / published;
        println!(
            "{:>3}  {:>5.1}B  {:>4}  {:>2}  {:>2}  {:>11.3}  {:>11.3}  {:>+5.1}%  {}",
            i + 1,
            report.parameters / 1e9,
            r.gpus,
            r.tp,
            r.pp,
            predicted,
            published,
            100.0 * err,
            report.estimate.fits
        );
        // Megatron ran every one of these configurations.
        assert!(report.estimate.fits, "row {} does not fit", i + 1);
        errors.push(err);
    }
    let mean = errors.iter().map(|e| e.abs()).sum::<f64>() / errors.len() as f64;
    println!("mean absolute error {:.1}%", 100.0 * mean);
    assert!(errors.iter().all(|e| e.abs() <= 0.10), "{errors:?}");
    assert!(mean <= 0.05, "mean {mean}");
}

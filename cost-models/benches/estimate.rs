//! Timings of the cost model on Megatron-LM's ten published configurations
//! (`fixtures/megatron_sc21_table1.json`): building the models, building
//! their per-rank workloads, and estimating all ten. Run with
//! `cargo bench -p autopar-cost-models --bench estimate`; prints the median
//! of several runs.

use autopar_cost_models::{
    estimate, AttentionKernel, Calibration, Cluster, Recompute, Schedule, Sharding, TrainingConfig, Workload,
    WorkloadOptions,
};
use autopar_ir::{Graph, ModelSpec};
use std::time::{Duration, Instant};

const TABLE: &str = include_str!("../../fixtures/megatron_sc21_table1.json");

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
}

fn median<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn model(r: &Row) -> Graph {
    let spec: ModelSpec = format!(
        "gpt:layers={},hidden={},heads={},vocab=51200,seq=2048,dtype=bf16",
        r.layers, r.hidden, r.heads
    )
    .parse()
    .expect("spec parses");
    spec.build().expect("spec builds")
}

fn options(r: &Row) -> WorkloadOptions {
    WorkloadOptions {
        micro_batch: Some(1),
        seq: None,
        sharding: Sharding {
            tp: r.tp,
            sp: false,
            cp: 1,
            ep: 1,
        },
        attention: AttentionKernel::Unfused,
        dropout: true,
    }
}

fn config(r: &Row) -> TrainingConfig {
    let interleaved = r.pp > 1;
    TrainingConfig {
        dp: TrainingConfig::derive_dp(r.gpus, r.tp, r.pp, 1).expect("degrees fit"),
        tp: r.tp,
        pp: r.pp,
        virtual_stages: if interleaved {
            TrainingConfig::default_virtual_stages(r.layers, r.pp)
        } else {
            1
        },
        sp: false,
        cp: 1,
        ep: 1,
        zero: 0,
        recompute: Recompute::Full,
        schedule: if interleaved {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        },
        micro_batch: 1,
        global_batch: r.batch,
        seq: None,
        attention: AttentionKernel::Unfused,
        dropout: true,
        overlap_grad_reduce: false,
        ..TrainingConfig::default()
    }
}

fn main() {
    let table: Table = serde_json::from_str(TABLE).expect("table parses");
    let rows = &table.rows;
    let calibration = Calibration::default();
    let preset = Cluster::preset("dgx-a100-80g").expect("preset");
    let clusters: Vec<Cluster> = rows
        .iter()
        .map(|r| preset.clone().with_gpus(r.gpus).expect("gpus fit"))
        .collect();
    let configs: Vec<TrainingConfig> = rows.iter().map(config).collect();

    let t = median(5, || rows.iter().map(model).collect::<Vec<_>>());
    println!("build the 10 models:                 {t:?} (median of 5)");
    let graphs: Vec<Graph> = rows.iter().map(model).collect();

    let build_workloads = || {
        rows.iter()
            .zip(&graphs)
            .map(|(r, g)| Workload::build(g, &options(r)).expect("workload"))
            .collect::<Vec<_>>()
    };
    let t = median(11, build_workloads);
    println!("build the 10 workloads:              {t:?} (median of 11)");
    let workloads = build_workloads();

    let estimate_all = || {
        workloads
            .iter()
            .zip(&clusters)
            .zip(&configs)
            .map(|((w, c), cfg)| estimate(w, c, &calibration, cfg).expect("estimate").step_time_s)
            .sum::<f64>()
    };
    let t = median(101, estimate_all);
    println!("estimate the 10 configurations:      {t:?} (median of 101)");
}

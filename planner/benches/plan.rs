//! Timings of the full search on Megatron-LM's published configurations
//! (`fixtures/megatron_sc21_table1.json`): for each row, the time to plan the
//! model on its cluster, the plan found, and the estimate of the published
//! configuration under the same cost model. Run with
//! `cargo bench -p autopar-planner --bench plan`; prints the median of several
//! runs per row.

use autopar_cost_models::{
    estimate, AttentionKernel, Calibration, Cluster, Recompute, Schedule, Sharding, TrainingConfig, Workload,
    WorkloadOptions,
};
use autopar_ir::{Graph, ModelSpec};
use autopar_planner::{search, SearchOptions};
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

fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
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

/// The published configuration's estimate (as `tests/megatron_sc21.rs` makes it).
fn published(r: &Row, graph: &Graph, cluster: &Cluster) -> f64 {
    let opts = WorkloadOptions {
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
    };
    let w = Workload::build(graph, &opts).expect("workload");
    let interleaved = r.pp > 1;
    let cfg = TrainingConfig {
        dp: r.gpus / (r.tp * r.pp),
        tp: r.tp,
        pp: r.pp,
        virtual_stages: if interleaved {
            TrainingConfig::default_virtual_stages(r.layers, r.pp)
        } else {
            1
        },
        recompute: Recompute::Full,
        schedule: if interleaved {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        },
        global_batch: r.batch,
        attention: AttentionKernel::Unfused,
        dropout: true,
        ..TrainingConfig::default()
    };
    estimate(&w, cluster, &Calibration::default(), &cfg)
        .expect("estimate")
        .step_time_s
}

fn main() {
    let table: Table = serde_json::from_str(TABLE).expect("table parses");
    let calibration = Calibration::default();
    println!("row  gpus  search_median  configs  plan (dp tp pp v mb zero recompute)  plan_s  published_s");
    for (i, r) in table.rows.iter().enumerate() {
        let graph = model(r);
        let cluster = Cluster::preset("dgx-a100-80g")
            .expect("preset")
            .with_gpus(r.gpus)
            .expect("gpus");
        let opts = SearchOptions {
            global_batch: r.batch,
            seq: None,
            max_memory_fraction: 1.0,
            attention: AttentionKernel::Unfused,
            dropout: true,
            top: 5,
        };
        let run = || search(&graph, &cluster, &calibration, &opts, &|_, _| {}).expect("plan");
        let t = median(if r.gpus <= 64 { 11 } else { 3 }, || {
            std::hint::black_box(run());
        });
        let result = run();
        let best = &result.ranked[0];
        let c = &best.config;
        println!(
            "{:>3}  {:>4}  {:>13.1?}  {:>7}  {:>3} {:>2} {:>2} {:>2} {:>2} {:>4} {:>9}  {:>6.3}  {:>11.3}",
            i + 1,
            r.gpus,
            t,
            result.configs_evaluated,
            c.dp,
            c.tp,
            c.pp,
            c.virtual_stages,
            c.micro_batch,
            c.zero,
            c.recompute.to_string(),
            best.estimate.step_time_s,
            published(r, &graph, &cluster)
        );
    }
}

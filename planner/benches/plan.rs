//! Timings of the full search on Megatron-LM's published configurations
//! (`autopar_cost_models::published`): for each row, the time to plan the
//! model on its cluster, the plan found, and the estimate of the published
//! configuration under the same cost model. Run with
//! `cargo bench -p autopar-planner --bench plan`; prints the median of several
//! runs per row.

use autopar_cost_models::{estimate, published, Calibration, Cluster, Workload};
use autopar_import::ModelSpec;
use autopar_planner::{search, SearchOptions};
use std::time::{Duration, Instant};

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

fn main() {
    let calibration = Calibration::default();
    println!("row  gpus  search_median  configs  plan (dp tp pp v mb zero recompute)  plan_s  published_s");
    for (i, r) in published::megatron_sc21().iter().enumerate() {
        let graph = r
            .model_spec()
            .parse::<ModelSpec>()
            .expect("spec")
            .build()
            .expect("builds");
        let cluster = Cluster::preset(&r.setting.cluster)
            .expect("preset")
            .with_gpus(r.gpus)
            .expect("gpus");
        let w = Workload::build(&graph, &r.workload_options()).expect("workload");
        let published = estimate(&w, &cluster, &calibration, &r.config())
            .expect("estimate")
            .step_time_s;
        let opts = SearchOptions {
            limits: autopar_planner::search::DegreeLimits::NONE,
            global_batch: r.batch,
            seq: None,
            max_memory_fraction: 1.0,
            attention: r.config().attention,
            dropout: r.config().dropout,
            moe_capacity_factor: None,
            objective: None,
            top: 5,
            tp_comm_overlap: false,
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
            published
        );
    }
}

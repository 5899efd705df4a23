//! Timings of the cost model on Megatron-LM's ten published configurations
//! (`autopar_cost_models::published`): building the models, building their
//! per-rank workloads, and estimating all ten. Run with
//! `cargo bench -p autopar-cost-models --bench estimate`; prints the median
//! of several runs.

use autopar_cost_models::{estimate, published, Calibration, Cluster, TrainingConfig, Workload};
use autopar_import::ModelSpec;
use autopar_ir::Graph;
use std::time::{Duration, Instant};

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

fn main() {
    let runs = published::megatron_sc21();
    let calibration = Calibration::default();
    let preset = Cluster::preset(&runs[0].setting.cluster).expect("preset");
    let clusters: Vec<Cluster> = runs
        .iter()
        .map(|r| preset.clone().with_gpus(r.gpus).expect("gpus fit"))
        .collect();
    let configs: Vec<TrainingConfig> = runs.iter().map(|r| r.config()).collect();
    let model = |spec: String| -> Graph { spec.parse::<ModelSpec>().expect("spec").build().expect("builds") };

    let t = median(5, || {
        runs.iter().map(|r| model(r.model_spec())).collect::<Vec<_>>()
    });
    println!("build the 10 models:                 {t:?} (median of 5)");
    let graphs: Vec<Graph> = runs.iter().map(|r| model(r.model_spec())).collect();

    let build_workloads = || {
        runs.iter()
            .zip(&graphs)
            .map(|(r, g)| Workload::build(g, &r.workload_options()).expect("workload"))
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

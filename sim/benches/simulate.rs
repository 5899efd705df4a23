//! Simulates every Megatron-LM SC'21 run (Table 1, their configurations:
//! interleaved 1F1B, full recomputation, micro-batch 1) and prints the
//! simulated step next to the analytic estimate, with the seconds each
//! took, the largest (1T parameters on 3,072 GPUs, 64 stages) included.
//! Exits non-zero when a row differs from the analytic estimate by 10 % or
//! more. Run: `cargo bench -p autopar-sim --bench simulate` (add `-- 3072` for one row).

use autopar_cost_models::published::megatron_sc21;
use autopar_cost_models::{estimate, Calibration, Cluster, Recompute, Workload};
use autopar_lower::{for_strategy, Objective, Strategy};
use autopar_sim::{simulate, Pricing, PricingOptions, SimOptions};
use std::time::Instant;

fn main() {
    let mut worst: f64 = 0.0;
    println!(
        "{:>6} {:>4} {:>3} {:>12} {:>12} {:>7} {:>10}",
        "GPUs", "tp", "pp", "simulated", "analytic", "ratio", "seconds"
    );
    // `-- 3072` (any GPU counts) simulates only those rows.
    let only: Vec<usize> = std::env::args().filter_map(|a| a.parse().ok()).collect();
    for r in megatron_sc21()
        .into_iter()
        .filter(|r| only.is_empty() || only.contains(&r.gpus))
    {
        let started = Instant::now();
        let cfg = r.config();
        let g = autopar_import::zoo::build(&r.model_spec()).expect("zoo spec");
        let mut s =
            Strategy::new(cfg.dp, cfg.pp, r.layers, 1, cfg.global_batch / cfg.dp).with_tp(cfg.tp, false);
        s.chunks = cfg.virtual_stages;
        s.schedule = cfg.schedule;
        s.recompute = vec![Recompute::Full; cfg.pp];
        let t = for_strategy(&g, &s, r.setting.seq, Objective::Lm).expect("training graph");
        let cluster = Cluster::preset(&r.setting.cluster)
            .and_then(|c| c.with_gpus(r.gpus))
            .expect("cluster");
        let calibration = Calibration::default();
        let opts = r.workload_options();
        let pricing = PricingOptions {
            attention: opts.attention,
            dropout: opts.dropout,
            ..PricingOptions::default()
        };
        let pricing = Pricing::new(&t, &cluster, &calibration, &pricing).expect("pricing");
        let sim = simulate(&t, &s, &pricing, &SimOptions::default()).expect("simulation");
        let seconds = started.elapsed().as_secs_f64();
        let w = Workload::build(&g, &opts).expect("workload");
        let analytic = estimate(&w, &cluster, &calibration, &cfg).expect("estimate");
        let ratio = sim.step_time_s / analytic.step_time_s;
        worst = worst.max((ratio - 1.0).abs());
        println!(
            "{:>6} {:>4} {:>3} {:>10.3} s {:>10.3} s {:>7.3} {:>8.2} s",
            r.gpus, r.tp, r.pp, sim.step_time_s, analytic.step_time_s, ratio, seconds
        );
    }
    println!(
        "largest difference from the analytic estimate: {:.1} %",
        100.0 * worst
    );
    if worst >= 0.10 {
        std::process::exit(1);
    }
}

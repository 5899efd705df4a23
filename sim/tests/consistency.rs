//! The analytic estimate prices what the simulator replays: for a sample of
//! models and clusters, every one of the planner's top candidates, made into
//! its plan, estimates within 5 % of its simulation, and its memory model
//! within 10 % of the replay's fullest rank. (The full sweep is
//! `cargo bench -p autopar-sim --bench consistency`.)

use autopar_cost_models::{Calibration, Cluster};
use autopar_planner::{search, ModelId, SearchOptions};
use autopar_sim::simulate_candidate;

/// Models at sizes people train, where a step is long against a kernel
/// launch: below a few milliseconds per step, per-kernel costs the estimate
/// folds into its rates (views, transposes, launches) reach 5-15 %.
const SAMPLE: &[(&str, &str, usize, usize)] = &[
    (
        "gpt:layers=24,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=bf16",
        "dgx-a100-80g",
        8,
        64,
    ),
    (
        "llama:layers=16,hidden=4096,ffn=11008,heads=32,vocab=32000,seq=4096,dtype=bf16",
        "dgx-h100",
        32,
        128,
    ),
    (
        "moe:layers=8,hidden=2048,ffn=5632,heads=16,experts=8,top_k=2,vocab=32000,seq=2048,dtype=bf16",
        "dgx-a100-80g",
        32,
        256,
    ),
    // Its top candidates dispatch tokens to experts all-to-all (ep 4 and 8).
    (
        "moe:layers=8,hidden=2048,ffn=8192,heads=16,kv_heads=4,experts=16,top_k=2,vocab=32000,seq=2048,dtype=bf16",
        "dgx-h100",
        16,
        64,
    ),
    (
        "bert:layers=4,hidden=16384,heads=128,vocab=4096,seq=32768,dtype=bf16",
        "hgx-h200",
        16,
        8,
    ),
];

#[test]
fn every_top_candidate_estimates_within_five_percent_of_its_simulation_and_ten_of_its_memory() {
    let calibration = Calibration::default();
    let (mut gaps, mut memory_gaps) = (Vec::new(), Vec::new());
    for &(spec, preset, gpus, global_batch) in SAMPLE {
        let graph = autopar_import::zoo::build(spec).unwrap();
        let cluster = Cluster::preset(preset).unwrap().with_gpus(gpus).unwrap();
        let opts = SearchOptions::runnable(global_batch, 3);
        let found = search(&graph, &cluster, &calibration, &opts, &|_, _| {}).unwrap();
        let id = ModelId {
            arg: spec,
            hash: String::new(),
        };
        for c in &found.ranked {
            let (plan, sim) =
                simulate_candidate(&graph, &id, &cluster, &calibration, &opts, &found, c).unwrap();
            let gap = plan.predicted.step_time_s / sim.step_time_s - 1.0;
            let p = &plan.parallel;
            let what = format!(
                "{spec} on {gpus} {preset}: dp {} tp {} pp {} cp {} ep {} v {} mb {} ZeRO {}",
                p.dp, p.tp, p.pp, p.cp, p.ep, p.virtual_stages, p.micro_batch, p.zero
            );
            eprintln!(
                "{what}: estimate {:.4} s, simulated {:.4} s ({:+.1} %)",
                plan.predicted.step_time_s,
                sim.step_time_s,
                100.0 * gap
            );
            if gap.abs() > 0.05 {
                for t in sim.terms(&plan.predicted.breakdown) {
                    eprintln!(
                        "    {:<28} {:>10.1} µs {:>10.1} µs",
                        t.term,
                        1e6 * t.analytic_s,
                        1e6 * t.simulated_s
                    );
                }
            }
            let replayed = sim
                .per_rank
                .iter()
                .map(|r| r.peak_memory_bytes)
                .fold(0.0, f64::max);
            let memory_gap = plan.predicted.memory_per_gpu_bytes / replayed - 1.0;
            eprintln!(
                "    memory model {:+.1} % from the replay's fullest rank",
                100.0 * memory_gap
            );
            memory_gaps.push((what.clone(), memory_gap));
            gaps.push((what, gap));
        }
    }
    let far: Vec<_> = gaps.iter().filter(|(_, g)| g.abs() > 0.05).collect();
    assert!(
        far.is_empty(),
        "estimate more than 5 % from the simulation: {far:?}"
    );
    let far: Vec<_> = memory_gaps.iter().filter(|(_, g)| g.abs() > 0.10).collect();
    assert!(
        far.is_empty(),
        "memory model more than 10 % from the replay's peak: {far:?}"
    );
    assert!(gaps.len() >= 10, "{gaps:?}");
}

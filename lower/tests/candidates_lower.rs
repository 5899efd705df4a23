//! The planner never offers a plan lowering refuses: over a sweep of zoo
//! models and clusters (tensor, context, expert and pipeline parallelism,
//! every ZeRO stage the search keeps), each of the search's fastest
//! candidates becomes a plan, and that plan lowers to programs for every
//! rank. (Gradient compression is left out: it does not run yet, and the
//! runs that plan for themselves search without it.)

use autopar_cost_models::{Calibration, Cluster};
use autopar_lower::{for_strategy, lower, Objective, Strategy};
use autopar_planner::{plan_candidate, search, ModelId, SearchOptions};

/// `(zoo spec, cluster preset, GPUs, global batch)`.
const SWEEP: &[(&str, &str, usize, usize)] = &[
    ("gpt:layers=4,hidden=256,heads=8,vocab=1024,seq=256", "cpu", 4, 8),
    (
        "llama:layers=2,hidden=64,ffn=128,heads=4,kv_heads=2,vocab=256,seq=1024",
        "cpu",
        2,
        1,
    ),
    (
        "llama:layers=4,hidden=512,ffn=1024,heads=8,kv_heads=4,vocab=1024,seq=4096",
        "dgx-h100",
        16,
        16,
    ),
    (
        "moe:layers=4,hidden=256,ffn=512,heads=8,kv_heads=4,experts=8,top_k=2,vocab=1024,seq=256",
        "dgx-h100",
        8,
        16,
    ),
    (
        "gpt:layers=8,hidden=1024,heads=16,vocab=4096,seq=1024",
        "dgx-a100-80g",
        16,
        64,
    ),
    // Long sequences on wide layers: context parallelism inside tensor
    // parallelism (without a causal mask, whose masked keys lowering's
    // context parallelism does not skip, so causal models rarely pick it).
    (
        "bert:layers=4,hidden=16384,heads=128,vocab=4096,seq=32768",
        "dgx-h100",
        16,
        8,
    ),
];

#[test]
fn every_top_candidate_lowers() {
    let mut refused = Vec::new();
    let mut lowered = 0;
    let mut seen_cp_tp = false;
    for &(spec, preset, gpus, global_batch) in SWEEP {
        let graph = autopar_import::zoo::build(spec).unwrap();
        let cluster = Cluster::preset(preset).unwrap().with_gpus(gpus).unwrap();
        let calibration = Calibration::default();
        let opts = SearchOptions::runnable(global_batch, 8);
        let found = search(&graph, &cluster, &calibration, &opts, &|_, _| {}).unwrap();
        let model = ModelId {
            arg: spec,
            hash: String::new(),
        };
        let seq = graph.bindings.get("seq").copied().unwrap_or(1);
        for c in &found.ranked {
            let plan = plan_candidate(&graph, &model, &cluster, &calibration, &opts, &found, c).unwrap();
            let p = &plan.parallel;
            seen_cp_tp |= p.cp > 1 && p.tp > 1;
            let what = format!(
                "{spec} on {gpus} {preset}: dp {} tp {} pp {} cp {} ep {} sp {} ZeRO {}",
                p.dp, p.tp, p.pp, p.cp, p.ep, p.sp, p.zero
            );
            let result = Strategy::from_plan(&plan)
                .map_err(|e| e.to_string())
                .and_then(|s| {
                    let t = for_strategy(&graph, &s, seq, Objective::Lm).map_err(|e| e.to_string())?;
                    lower(&t, &s).map_err(|e| e.to_string())
                });
            match result {
                Ok(_) => lowered += 1,
                Err(e) => refused.push(format!("{what}: {e}")),
            }
        }
    }
    assert!(
        refused.is_empty(),
        "{} lowered; refused:\n{}",
        lowered,
        refused.join("\n")
    );
    assert!(
        seen_cp_tp,
        "the sweep no longer reaches context with tensor parallelism"
    );
    eprintln!("{lowered} candidate plans lowered");
}

//! The analytic estimate against the simulator on the plans the planner
//! emits, and the planner's picks against published configurations.
//!
//! 1. Published tables (Megatron-LM SC'21 Table 1 on A100s, Megatron-Core's
//!    H100 model table): for every row, the planner's pick and the
//!    published configuration, each made into a plan (per-op sharding
//!    solved), lowered, simulated and estimated, and the published
//!    configuration's estimate as its authors ran it against the published
//!    step.
//! 2. A sweep of GPT, Llama and MoE models over A100, H100 and H200
//!    clusters: the planner's top candidates, each estimated and simulated.
//!
//! Prints both tables and the largest gap between estimate and simulation.
//! Run: `cargo bench -p autopar-sim --bench consistency` (`-- sc21`,
//! `-- mcore` or `-- sweep` for one part; `-- quick` for a few sweep cases).

use autopar_cost_models::published::{megatron_core_h100, megatron_sc21, PublishedRun};
use autopar_cost_models::{estimate, Calibration, Cluster, Workload};
use autopar_ir::Graph;
use autopar_planner::plan::fnv1a_hex;
use autopar_planner::{search, Candidate, ModelId, SearchOptions, SearchResult};
use autopar_sim::{simulate_candidate, simulate_model_plan_step};
use std::time::Instant;

/// What one plan's estimate and simulation said.
struct Pair {
    estimate: f64,
    simulated: f64,
    seconds: f64,
    /// Peak bytes per GPU: the memory model's and the replay's fullest rank.
    memory: (f64, f64),
    /// The step `autopar plan --verify` ranks by (short replays extended).
    extended: f64,
}

impl Pair {
    fn gap(&self) -> f64 {
        self.estimate / self.simulated - 1.0
    }

    /// How far the extended replays' step is from the full replay's.
    fn extended_gap(&self) -> f64 {
        (self.extended / self.simulated - 1.0).abs()
    }
}

/// Makes `candidate` a plan, lowers it and simulates it.
fn replay(
    graph: &Graph,
    spec: &str,
    cluster: &Cluster,
    opts: &SearchOptions,
    found: &SearchResult,
    c: &Candidate,
) -> Result<Pair, String> {
    let started = Instant::now();
    let model = ModelId {
        arg: spec,
        hash: fnv1a_hex(spec.as_bytes()),
    };
    let calibration = Calibration::default();
    let (plan, sim) = simulate_candidate(graph, &model, cluster, &calibration, opts, found, c)?;
    let extended = simulate_model_plan_step(&plan, graph, &calibration).map_err(|e| e.to_string())?;
    let replayed = sim
        .per_rank
        .iter()
        .map(|r| r.peak_memory_bytes)
        .fold(0.0, f64::max);
    Ok(Pair {
        estimate: plan.predicted.step_time_s,
        simulated: sim.step_time_s,
        seconds: started.elapsed().as_secs_f64(),
        memory: (plan.predicted.memory_per_gpu_bytes, replayed),
        extended,
    })
}

fn describe(c: &Candidate) -> String {
    let k = &c.config;
    format!(
        "dp{} tp{} pp{} cp{} ep{} v{} mb{} z{}{}",
        k.dp,
        k.tp,
        k.pp,
        k.cp,
        k.ep,
        k.virtual_stages,
        k.micro_batch,
        k.zero,
        if k.sp { " sp" } else { "" }
    )
}

/// A published table: the planner's pick and the published configuration
/// side by side, both as the backends run them
/// ([`autopar_cost_models::TrainingConfig::runnable`]),
/// and the published configuration's estimate as its authors ran it (their
/// overlaps) against the published step: the cost model's error per row.
fn published(title: &str, runs: &[PublishedRun], worst: &mut f64, worst_extended: &mut f64) {
    println!("{title}: the planner's pick and the published configuration, estimated and simulated");
    println!(
        "{:>3} {:>5} {:<34} {:>9} {:>9} {:>7} | {:<18} {:>9} {:>9} {:>7} {:>6} | {:>9} {:>9} {:>7}",
        "row",
        "gpus",
        "pick",
        "est s",
        "sim s",
        "gap",
        "published",
        "est s",
        "sim s",
        "gap",
        "pick≤",
        "as run s",
        "published",
        "error"
    );
    let calibration = Calibration::default();
    let mut errors = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let spec = r.model_spec();
        let graph = autopar_import::zoo::build(&spec).expect("zoo spec");
        let cluster = Cluster::preset(&r.setting.cluster)
            .and_then(|c| c.with_gpus(r.gpus))
            .expect("cluster");
        let as_run = r.config();
        let mut opts = SearchOptions::runnable(r.batch, 1);
        opts.attention = as_run.attention;
        opts.dropout = as_run.dropout;
        let found = search(&graph, &cluster, &calibration, &opts, &|_, _| {}).expect("search");
        let pick = &found.ranked[0];
        let w = Workload::build(&graph, &r.workload_options()).expect("workload");
        let runnable = as_run.runnable();
        let published = Candidate {
            estimate: estimate(&w, &cluster, &calibration, &runnable).expect("estimate"),
            config: runnable,
        };
        let megatron = estimate(&w, &cluster, &calibration, &as_run)
            .expect("estimate")
            .step_time_s;
        let error = megatron / r.step_time_s() - 1.0;
        errors.push(error);
        let p = replay(&graph, &spec, &cluster, &opts, &found, pick);
        let q = replay(&graph, &spec, &cluster, &opts, &found, &published);
        match (p, q) {
            (Ok(p), Ok(q)) => {
                *worst = worst.max(p.gap().abs()).max(q.gap().abs());
                *worst_extended = worst_extended.max(p.extended_gap()).max(q.extended_gap());
                for (which, x) in [("pick", &p), ("published", &q)] {
                    if x.extended_gap() > 1e-9 {
                        println!(
                            "    {which}: extended replays {:.6} s against the full replay's {:.6} s",
                            x.extended, x.simulated
                        );
                    }
                }
                println!(
                    "{:>3} {:>5} {:<34} {:>9.3} {:>9.3} {:>+6.1}% | {:<18} {:>9.3} {:>9.3} {:>+6.1}% {:>6} | {:>9.3} {:>9.3} {:>+6.1}%",
                    i + 1,
                    r.gpus,
                    describe(pick),
                    p.estimate,
                    p.simulated,
                    100.0 * p.gap(),
                    format!("tp{} pp{} v{}", r.tp, r.pp, as_run.virtual_stages),
                    q.estimate,
                    q.simulated,
                    100.0 * q.gap(),
                    if p.simulated <= q.simulated * (1.0 + 1e-9) { "yes" } else { "NO" },
                    megatron,
                    r.step_time_s(),
                    100.0 * error,
                );
            }
            (p, q) => println!(
                "{:>3} {:>5} pick: {:?} published: {:?}",
                i + 1,
                r.gpus,
                p.err(),
                q.err()
            ),
        }
    }
    let n = errors.len().max(1) as f64;
    println!(
        "{title}: estimate as run against the published step: mean |error| {:.1} %, largest {:.1} %\n",
        100.0 * errors.iter().map(|e| e.abs()).sum::<f64>() / n,
        100.0 * errors.iter().fold(0.0f64, |m, e| m.max(e.abs()))
    );
}

/// The sweep's cases: model spec, cluster preset, GPUs, global batch.
fn cases(quick: bool) -> Vec<(&'static str, &'static str, usize, usize)> {
    let all = vec![
        ("gpt:layers=24,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 8, 64),
        ("gpt:layers=24,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=bf16", "dgx-h100", 64, 512),
        ("gpt:layers=40,hidden=5120,heads=40,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 64, 512),
        ("gpt:layers=40,hidden=6144,heads=48,vocab=51200,seq=2048,dtype=bf16", "dgx-h100", 192, 768),
        ("llama:layers=32,hidden=4096,ffn=11008,heads=32,vocab=32000,seq=4096,dtype=bf16", "dgx-h100", 32, 256),
        ("llama:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,vocab=128256,seq=8192,dtype=bf16", "hgx-h200", 64, 256),
        ("llama:layers=80,hidden=8192,ffn=28672,heads=64,kv_heads=8,vocab=128256,seq=4096,dtype=bf16", "dgx-h100", 512, 1024),
        ("moe:layers=16,hidden=2048,ffn=5632,heads=16,experts=8,top_k=2,vocab=32000,seq=2048,dtype=bf16", "dgx-a100-80g", 32, 256),
        ("moe:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,experts=8,top_k=2,vocab=32000,seq=4096,dtype=bf16", "dgx-h100", 128, 512),
        ("gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 1024, 1536),
        ("gpt:layers=24,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=bf16", "hgx-h200", 8, 32),
        ("gpt:layers=24,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=f16", "p3-v100", 16, 128),
        ("gpt:layers=32,hidden=2560,heads=32,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 16, 128),
        ("gpt:layers=32,hidden=4096,heads=32,vocab=51200,seq=2048,dtype=bf16", "dgx-h100", 8, 64),
        ("gpt:layers=32,hidden=4096,heads=32,vocab=51200,seq=2048,dtype=bf16", "dgx-h100", 64, 256),
        ("gpt:layers=32,hidden=4096,heads=32,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 128, 512),
        ("gpt:layers=40,hidden=5120,heads=40,vocab=51200,seq=2048,dtype=bf16", "hgx-h200", 128, 512),
        ("gpt:layers=44,hidden=6144,heads=48,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 256, 1024),
        ("gpt:layers=48,hidden=8192,heads=64,vocab=51200,seq=2048,dtype=bf16", "dgx-h100", 512, 1536),
        ("gpt:layers=60,hidden=10240,heads=80,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 1024, 1792),
        ("gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048,dtype=bf16", "dgx-h100", 2048, 2048),
        ("gpt:layers=105,hidden=20480,heads=128,vocab=51200,seq=2048,dtype=bf16", "dgx-a100-80g", 2240, 2240),
        ("gpt:layers=128,hidden=25600,heads=160,vocab=51200,seq=2048,dtype=bf16", "dgx-h100", 16384, 8192),
        ("llama:layers=32,hidden=4096,ffn=11008,heads=32,vocab=32000,seq=4096,dtype=bf16", "hgx-h200", 8, 64),
        ("llama:layers=32,hidden=4096,ffn=11008,heads=32,vocab=32000,seq=4096,dtype=bf16", "dgx-a100-80g", 512, 2048),
        ("llama:layers=40,hidden=5120,ffn=13824,heads=40,vocab=32000,seq=4096,dtype=bf16", "dgx-a100-80g", 64, 256),
        ("llama:layers=80,hidden=8192,ffn=28672,heads=64,kv_heads=8,vocab=128256,seq=4096,dtype=bf16", "hgx-h200", 256, 512),
        ("llama:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,vocab=128256,seq=32768,dtype=bf16", "dgx-h100", 64, 64),
        ("llama:layers=80,hidden=8192,ffn=28672,heads=64,kv_heads=8,vocab=128256,seq=32768,dtype=bf16", "dgx-h100", 256, 64),
        ("llama:layers=126,hidden=16384,ffn=53248,heads=128,kv_heads=8,vocab=128256,seq=8192,dtype=bf16", "dgx-h100", 8192, 2048),
        ("moe:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,experts=8,top_k=2,vocab=32000,seq=4096,dtype=bf16", "hgx-h200", 64, 256),
        ("moe:layers=56,hidden=6144,ffn=16384,heads=48,kv_heads=8,experts=8,top_k=2,vocab=32768,seq=4096,dtype=bf16", "dgx-h100", 512, 1024),
        ("bert:layers=24,hidden=1024,heads=16,vocab=30522,seq=512,dtype=bf16", "dgx-a100-80g", 8, 256),
        ("bert:layers=24,hidden=1024,heads=16,vocab=30522,seq=16384,dtype=bf16", "dgx-h100", 32, 32),
    ];
    match quick {
        true => all.into_iter().take(3).collect(),
        false => all,
    }
}

/// The planner's top candidates of every case, estimated and simulated.
fn sweep(quick: bool, worst: &mut f64, worst_memory: &mut f64, worst_extended: &mut f64) {
    println!("\nsweep: the planner's top 3 candidates per case, estimate against simulation");
    println!(
        "{:<70} {:>14} {:>5} {:<34} {:>9} {:>9} {:>7} {:>8} {:>8} {:>7} {:>6}",
        "model",
        "cluster",
        "gpus",
        "candidate",
        "est s",
        "sim s",
        "gap",
        "est GiB",
        "sim GiB",
        "gap",
        "took s"
    );
    let calibration = Calibration::default();
    let mut count = 0;
    for (spec, preset, gpus, batch) in cases(quick) {
        let Ok(graph) = autopar_import::zoo::build(spec) else {
            println!("{spec}: not a zoo spec");
            continue;
        };
        let cluster = Cluster::preset(preset)
            .and_then(|c| c.with_gpus(gpus))
            .expect("cluster");
        let opts = SearchOptions::runnable(batch, 3);
        let found = match search(&graph, &cluster, &calibration, &opts, &|_, _| {}) {
            Ok(f) => f,
            Err(e) => {
                println!("{spec} on {gpus} × {preset}: {e}");
                continue;
            }
        };
        for c in &found.ranked {
            match replay(&graph, spec, &cluster, &opts, &found, c) {
                Ok(p) => {
                    count += 1;
                    *worst = worst.max(p.gap().abs());
                    *worst_extended = worst_extended.max(p.extended_gap());
                    if p.extended_gap() > 1e-9 {
                        println!(
                            "    extended replays {:.6} s against the full replay's {:.6} s",
                            p.extended, p.simulated
                        );
                    }
                    let gib = |b: f64| b / (1u64 << 30) as f64;
                    let (est, sim) = p.memory;
                    *worst_memory = worst_memory.max((est / sim - 1.0).abs());
                    println!(
                        "{:<70} {:>14} {:>5} {:<34} {:>9.3} {:>9.3} {:>+6.1}% {:>8.1} {:>8.1} {:>+6.1}% {:>6.1}",
                        spec,
                        preset,
                        gpus,
                        describe(c),
                        p.estimate,
                        p.simulated,
                        100.0 * p.gap(),
                        gib(est),
                        gib(sim),
                        100.0 * (est / sim - 1.0),
                        p.seconds
                    );
                }
                Err(e) => println!("{spec} {}: {e}", describe(c)),
            }
        }
    }
    println!("{count} plans simulated");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |a: &str| args.iter().any(|x| x == a);
    let (only_tables, only_sweep) = (has("sc21") || has("mcore"), has("sweep"));
    let (mut worst, mut worst_memory, mut worst_extended): (f64, f64, f64) = (0.0, 0.0, 0.0);
    if !only_sweep && !has("mcore") {
        let title = "SC'21 Table 1 (A100 80 GB; attention unfused, dropout on, as published)";
        published(title, &megatron_sc21(), &mut worst, &mut worst_extended);
    }
    if !only_sweep && !has("sc21") {
        let title = "Megatron-Core's H100 model table";
        published(title, &megatron_core_h100(), &mut worst, &mut worst_extended);
    }
    if !only_tables {
        sweep(has("quick"), &mut worst, &mut worst_memory, &mut worst_extended);
    }
    println!(
        "largest gap between the full replay and the extended replays `plan --verify` ranks by: {:.2e}",
        worst_extended
    );
    println!(
        "largest gap between estimate and simulation: {:.1} %",
        100.0 * worst
    );
    println!(
        "largest gap between the memory model and the replay's peak (sweep): {:.1} %",
        100.0 * worst_memory
    );
}

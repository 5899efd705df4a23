//! On small instances the search finds what brute force finds: every mesh,
//! micro-batch, sequence-parallel setting, mesh order, schedule (GPipe
//! included), ZeRO stage, gradient reduction, stage split and per-stage
//! recomputation, evaluated without pruning.

use autopar_cost_models::comm::Algorithm;
use autopar_cost_models::estimate::unsplit_heads;
use autopar_cost_models::workload::Layered;
use autopar_cost_models::{
    AttentionKernel, Calibration, Cluster, Evaluator, GradReduce, Mesh, MeshOrder, Recompute, Schedule,
    Sharding, StageSpec, TrainingConfig, Workload, WorkloadOptions,
};
use autopar_import::ModelSpec;
use autopar_ir::Graph;
use autopar_planner::{search, SearchOptions};

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// Compositions of `n` into `parts` positive parts.
fn compositions(n: usize, parts: usize) -> Vec<Vec<usize>> {
    if parts == 1 {
        return if n >= 1 { vec![vec![n]] } else { vec![] };
    }
    (1..n)
        .flat_map(|first| {
            compositions(n - first, parts - 1)
                .into_iter()
                .map(move |mut rest| {
                    rest.insert(0, first);
                    rest
                })
        })
        .collect()
}

/// Every assignment of a policy to each of `pp` stages.
fn policies(pp: usize) -> Vec<Vec<Recompute>> {
    let all = [Recompute::None, Recompute::Selective, Recompute::Full];
    (0..3usize.pow(pp as u32))
        .map(|mut code| {
            (0..pp)
                .map(|_| {
                    let r = all[code % 3];
                    code /= 3;
                    r
                })
                .collect()
        })
        .collect()
}

/// The fastest step time of any configuration that fits, by brute force.
fn brute_force(graph: &Graph, cluster: &Cluster, opts: &SearchOptions) -> (f64, usize) {
    let cal = Calibration::default();
    let layered = Layered::new(graph).unwrap();
    let gpus = cluster.gpus();
    let limit = opts.max_memory_fraction * cluster.device.memory_bytes;
    let probe = Workload::from_layered(
        &layered,
        &WorkloadOptions {
            attention: opts.attention,
            dropout: opts.dropout,
            ..WorkloadOptions::default()
        },
    )
    .unwrap();
    let (layers, seq) = (probe.layers, probe.seq.unwrap());
    let mut best = f64::INFINITY;
    let mut evaluated = 0;
    for tp in divisors(gpus).into_iter().filter(|&t| t <= cluster.gpus_per_node) {
        if probe
            .heads
            .iter()
            .any(|&(q, kv)| unsplit_heads(q, kv, tp).is_some())
        {
            continue;
        }
        for cp in divisors(gpus / tp) {
            if cp > 1 && !(seq % (2 * cp) == 0 && seq / cp >= 512) {
                continue;
            }
            for pp in divisors(gpus / (tp * cp)).into_iter().filter(|&p| p <= layers) {
                let dp = gpus / (tp * cp * pp);
                if opts.global_batch % dp != 0 {
                    continue;
                }
                for mb in divisors(opts.global_batch / dp).into_iter().filter(|&m| m <= 32) {
                    for sp in if tp > 1 { vec![false, true] } else { vec![false] } {
                        let w = Workload::from_layered(
                            &layered,
                            &WorkloadOptions {
                                micro_batch: Some(mb),
                                seq: None,
                                sharding: Sharding { tp, sp, cp, ep: 1 },
                                attention: opts.attention,
                                dropout: opts.dropout,
                                moe_capacity_factor: None,
                                loss: Default::default(),
                            },
                        )
                        .unwrap();
                        for order in [MeshOrder::DataInner, MeshOrder::PipelineInner] {
                            let base = TrainingConfig {
                                dp,
                                tp,
                                pp,
                                cp,
                                sp,
                                micro_batch: mb,
                                global_batch: opts.global_batch,
                                attention: opts.attention,
                                dropout: opts.dropout,
                                mesh_order: order,
                                overlap_grad_reduce: true,
                                ..TrainingConfig::default()
                            };
                            let ev = Evaluator::new(&w, cluster, &cal, &Mesh::of(&base), sp).unwrap();
                            let mut schedules = vec![(Schedule::OneFOneB, 1)];
                            let micro_batches = opts.global_batch / (dp * mb);
                            if pp > 1 {
                                schedules.push((Schedule::Gpipe, 1));
                                // Interleaving sends micro-batches in groups of pp.
                                if layers % pp == 0 && micro_batches % pp == 0 {
                                    for v in divisors(layers / pp).into_iter().filter(|&v| v > 1) {
                                        schedules.push((Schedule::Interleaved, v));
                                    }
                                }
                            }
                            for (schedule, v) in schedules {
                                let splits = if schedule == Schedule::Interleaved {
                                    vec![vec![layers / pp; pp]]
                                } else {
                                    compositions(layers, pp)
                                };
                                for zero in if dp * cp > 1 { 0..=3u8 } else { 0..=0u8 } {
                                    let reductions = if zero == 0 && dp * cp > 1 {
                                        vec![
                                            GradReduce::default(),
                                            GradReduce {
                                                algorithm: Algorithm::ParameterServer,
                                                ..GradReduce::default()
                                            },
                                            GradReduce {
                                                algorithm: Algorithm::Ring,
                                                compression: Some(autopar_cost_models::GradCompression::Bf16),
                                                ..GradReduce::default()
                                            },
                                        ]
                                    } else {
                                        vec![GradReduce::default()]
                                    };
                                    for grad_reduce in reductions {
                                        for split in &splits {
                                            for policy in policies(pp) {
                                                let cfg = TrainingConfig {
                                                    schedule,
                                                    virtual_stages: v,
                                                    zero,
                                                    grad_reduce,
                                                    stages: Some(
                                                        split
                                                            .iter()
                                                            .zip(&policy)
                                                            .map(|(&layers, &recompute)| StageSpec {
                                                                layers,
                                                                recompute,
                                                            })
                                                            .collect(),
                                                    ),
                                                    ..base.clone()
                                                };
                                                let e = ev.evaluate(&cfg).unwrap();
                                                evaluated += 1;
                                                if e.memory_per_gpu_bytes <= limit {
                                                    best = best.min(e.step_time_s);
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    (best, evaluated)
}

/// Runs both; returns the plan found.
fn check(
    spec: &str,
    preset: &str,
    gpus: usize,
    global_batch: usize,
    fraction: f64,
) -> autopar_planner::Candidate {
    let graph = spec.parse::<ModelSpec>().unwrap().build().unwrap();
    let cluster = Cluster::preset(preset).unwrap().with_gpus(gpus).unwrap();
    let opts = SearchOptions {
        limits: autopar_planner::search::DegreeLimits::NONE,
        global_batch,
        seq: None,
        max_memory_fraction: fraction,
        attention: AttentionKernel::Fused,
        dropout: false,
        moe_capacity_factor: None,
        objective: None,
        top: 3,
        tp_comm_overlap: false,
    };
    let found = search(&graph, &cluster, &Calibration::default(), &opts, &|_, _| {}).unwrap();
    let (want, evaluated) = brute_force(&graph, &cluster, &opts);
    for candidate in found.ranked.iter().chain(&found.pareto) {
        candidate.config.check(gpus).unwrap();
    }
    let got = found.ranked[0].estimate.step_time_s;
    assert!(evaluated > 1000, "brute force evaluated only {evaluated}");
    eprintln!(
        "{spec}: brute force {evaluated} configurations, best {want}; search {} configurations",
        found.configs_evaluated
    );
    assert!(
        (got - want).abs() <= 1e-9 * want,
        "{spec} on {gpus}: search {got}, brute force {want} ({evaluated} configurations)"
    );
    found.ranked[0].clone()
}

#[test]
fn eight_gpus_four_layers_with_room() {
    let _ = check(
        "gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=1024,dtype=bf16",
        "dgx-a100-80g",
        8,
        16,
        1.0,
    );
}

#[test]
fn eight_gpus_tight_memory_forces_recomputation_and_sharding() {
    // 4 layers of a wide model with 2.5 GiB per GPU: plain data parallelism does not fit.
    let plan = check(
        "gpt:layers=4,hidden=2048,heads=16,vocab=8000,seq=1024,dtype=bf16",
        "dgx-a100-80g",
        8,
        16,
        2.5 / 80.0,
    );
    let c = &plan.config;
    let plain = c.tp == 1 && c.pp == 1 && c.zero == 0 && c.recompute == Recompute::None;
    assert!(!plain, "{c:?}");
}

#[test]
fn sixteen_gpus_across_two_nodes() {
    let _ = check(
        "llama:layers=4,hidden=512,ffn=1024,heads=8,kv_heads=4,vocab=1000,seq=1024,dtype=bf16",
        "dgx-h100",
        16,
        32,
        1.0,
    );
}

#[test]
fn eight_layers_uneven_stages_under_pressure() {
    let _ = check(
        "gpt:layers=8,hidden=1024,heads=8,vocab=50000,seq=1024,dtype=bf16",
        "dgx-a100-80g",
        8,
        8,
        1.2 / 80.0,
    );
}

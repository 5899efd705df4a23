//! Plan assembly, the planner's front door: search the configurations,
//! shard the chosen one's ops, and record it with its mesh, stages and
//! runners-up as a [`Plan`]. Callers (the CLI, `autopar run --plan auto`)
//! only gather the inputs and write the result.

use crate::layer_sharding;
use crate::plan::{
    Alternative, ClusterSummary, Inputs, MeshAxis, MeshLayout, Parallel, Plan, RankPlace, SearchSummary,
    StagePlan, FORMAT, VERSION,
};
use crate::search::{search, Candidate, SearchError, SearchOptions, SearchResult};
use crate::sharding::ShardingError;
use crate::spec::OpSharding;
use autopar_cost_models::{
    estimate, Calibration, Cluster, EstimateError, MeshOrder, Sharding, TrainingConfig, Workload,
    WorkloadError, WorkloadOptions,
};
use autopar_ir::Graph;
use std::collections::BTreeMap;

/// The model a plan is made for, as its plan file names it.
#[derive(Debug, Clone)]
pub struct ModelId<'a> {
    /// The model argument as given (file or zoo spec).
    pub arg: &'a str,
    /// Its identity: [`crate::plan::fnv1a_hex`] of the file's bytes, or of the spec.
    pub hash: String,
}

/// Why no plan came out.
#[derive(Debug, thiserror::Error)]
pub enum PlanningError {
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error("per-op sharding of the chosen plan: {0}")]
    Sharding(#[from] ShardingError),
    #[error("pricing the chosen plan's per-op sharding: {0}")]
    Workload(#[from] WorkloadError),
    #[error("pricing the chosen plan's per-op sharding: {0}")]
    Estimate(#[from] EstimateError),
}

/// The fastest plan for `graph` (canonical, with its blocks detected) on
/// `cluster` (sized to the GPUs to plan for) that fits, with the runners-up
/// `opts.top` keeps. `progress` hears (meshes done, meshes in all).
pub fn plan_model(
    graph: &Graph,
    model: &ModelId,
    cluster: &Cluster,
    calibration: &Calibration,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Plan, PlanningError> {
    let verify = Verify {
        candidates: 0,
        simulate: &|_| Err("not verified".into()),
    };
    plan_model_verified(graph, model, cluster, calibration, opts, progress, &verify)
}

/// How many of the search's fastest candidates to check by replaying their
/// programs, and the replay: a plan's simulated step seconds, or why it
/// cannot be simulated. (The planner does not simulate; its caller does.)
pub struct Verify<'a> {
    pub candidates: usize,
    pub simulate: &'a dyn Fn(&Plan) -> Result<f64, String>,
}

/// [`plan_model`], with the `verify.candidates` fastest candidates made
/// into plans and simulated: the fastest simulated one is chosen, the
/// verified ones lead the runners-up in simulated order (any that cannot be
/// simulated after them), and each carries its simulated step.
pub fn plan_model_verified(
    graph: &Graph,
    model: &ModelId,
    cluster: &Cluster,
    calibration: &Calibration,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
    verify: &Verify,
) -> Result<Plan, PlanningError> {
    let (mut found, used) = search_with_spares(graph, cluster, calibration, opts, progress)?;
    if found.ranked.is_empty() {
        return Err(SearchError::Empty("the search ranked no plan".into()).into());
    }
    let k = verify.candidates.min(found.ranked.len());
    let mut simulated = Vec::with_capacity(k);
    for c in &found.ranked[..k] {
        let plan = plan_candidate(graph, model, &used, calibration, opts, &found, c)?;
        simulated.push((verify.simulate)(&plan).ok());
    }
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| match (simulated[a], simulated[b]) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (x, y) => y.is_some().cmp(&x.is_some()).then(a.cmp(&b)),
    });
    let mut ranked: Vec<Candidate> = order.iter().map(|&i| found.ranked[i].clone()).collect();
    ranked.extend(found.ranked.drain(k..));
    found.ranked = ranked;
    let mut plan = plan_candidate(graph, model, &used, calibration, opts, &found, &found.ranked[0])?;
    for (alt, &i) in plan.search.top.iter_mut().zip(&order) {
        alt.simulated_step_time_s = simulated[i];
    }
    plan.simulated_step_time_s = order.first().and_then(|&i| simulated[i]);
    plan.spare_gpus = cluster.gpus() - used.gpus();
    Ok(plan)
}

/// At most this many smaller GPU counts are tried when no layout uses them all.
const SPARE_TRIES: usize = 64;

/// The search on all of `cluster`'s GPUs or, when no parallel layout uses
/// them all (a prime node count, a batch that does not divide), on the
/// most GPUs that have one: whole nodes fewer, or fewer GPUs of one node.
/// Returns the search and the cluster sized to the GPUs it used.
fn search_with_spares(
    graph: &Graph,
    cluster: &Cluster,
    calibration: &Calibration,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(SearchResult, Cluster), PlanningError> {
    let first = match search(graph, cluster, calibration, opts, progress) {
        Ok(found) => return Ok((found, cluster.clone())),
        Err(e @ SearchError::NoLayout { .. }) => e,
        Err(e) => return Err(e.into()),
    };
    let gpn = cluster.gpus_per_node;
    let total = cluster.gpus();
    let fewer = (1..total)
        .rev()
        .filter(|&n| n % gpn == 0 || n < gpn)
        .take(SPARE_TRIES);
    for n in fewer {
        let Ok(sized) = cluster.clone().with_gpus(n) else {
            continue;
        };
        match search(graph, &sized, calibration, opts, &|_, _| {}) {
            Ok(found) => return Ok((found, sized)),
            Err(SearchError::NoLayout { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(first.into())
}

/// The plan of one `candidate` of the search `found` (the fastest, or a
/// runner-up a user wants to run): its per-op sharding solved and priced,
/// its mesh and stages laid out.
pub fn plan_candidate(
    graph: &Graph,
    model: &ModelId,
    cluster: &Cluster,
    calibration: &Calibration,
    opts: &SearchOptions,
    found: &SearchResult,
    candidate: &Candidate,
) -> Result<Plan, PlanningError> {
    let cfg = &candidate.config;
    let sharding = layer_sharding::for_config(graph, cluster, calibration, cfg, opts.seq)?;
    // The search ranks with the propagation rules' layouts; the plan's
    // prediction prices the per-op sharding that will run.
    let w = planned_workload(graph, cfg, &sharding)?;
    let predicted = estimate(&w, cluster, calibration, cfg)?;
    let mesh = mesh_of(cfg, cluster);
    let stages = stages_of(cfg, graph.blocks.len(), &mesh);
    Ok(Plan {
        format: FORMAT.into(),
        version: VERSION,
        inputs: Inputs {
            model: model.arg.into(),
            model_hash: model.hash.clone(),
            cluster: ClusterSummary {
                name: cluster.name.clone(),
                nodes: cluster.nodes,
                gpus_per_node: cluster.gpus_per_node,
                device: cluster.device.name.clone(),
                memory_bytes: cluster.device.memory_bytes,
            },
            global_batch: opts.global_batch,
            seq: opts.seq,
            max_memory_fraction: opts.max_memory_fraction,
            objective: opts.objective,
        },
        mesh,
        parallel: Parallel::of(cfg, candidate.estimate.micro_batches),
        stages,
        sharding,
        predicted,
        gpus_used: Some(cluster.gpus()),
        spare_gpus: 0,
        simulated_step_time_s: None,
        search: SearchSummary {
            configs_evaluated: found.configs_evaluated,
            seconds: found.seconds,
            memory_limit_bytes: found.memory_limit_bytes,
            top: found
                .ranked
                .iter()
                .map(|c| Alternative {
                    parallel: Parallel::of(&c.config, c.estimate.micro_batches),
                    predicted: c.estimate.clone(),
                    simulated_step_time_s: None,
                })
                .collect(),
        },
    })
}

/// What one rank computes and sends per micro-batch under `cfg` when its
/// tensor-parallel group runs the per-op `sharding` (a plan's): priced from
/// the sharding rules lowering executes.
pub fn planned_workload(
    graph: &Graph,
    cfg: &TrainingConfig,
    sharding: &[OpSharding],
) -> Result<Workload, WorkloadError> {
    let opts = WorkloadOptions {
        micro_batch: Some(cfg.micro_batch),
        seq: cfg.seq,
        sharding: Sharding {
            tp: cfg.tp,
            sp: cfg.sp,
            cp: cfg.cp,
            ep: cfg.ep,
        },
        attention: cfg.attention,
        dropout: cfg.dropout,
        moe_capacity_factor: cfg.moe_capacity_factor,
        loss: cfg.loss,
    };
    let names: BTreeMap<String, String> = sharding
        .iter()
        .map(|o| (o.node.clone(), o.strategy.clone()))
        .collect();
    match cfg.tp > 1 && !names.is_empty() {
        true => Workload::build_planned(graph, &opts, &names),
        false => Workload::build(graph, &opts),
    }
}

/// Mesh axes and rank places of `cfg` on `cluster`.
pub fn mesh_of(cfg: &TrainingConfig, cluster: &Cluster) -> MeshLayout {
    let mesh = autopar_cost_models::Mesh::of(cfg);
    let outer = match cfg.mesh_order {
        MeshOrder::DataInner => [("dp", cfg.dp), ("pp", cfg.pp)],
        MeshOrder::PipelineInner => [("pp", cfg.pp), ("dp", cfg.dp)],
    };
    let axes = [("tp", cfg.tp), ("cp", cfg.cp), outer[0], outer[1]]
        .into_iter()
        .map(|(name, size)| MeshAxis {
            name: name.into(),
            size,
        })
        .collect();
    let mut ranks = Vec::with_capacity(cluster.gpus());
    for pp in 0..cfg.pp {
        for dp in 0..cfg.dp {
            for cp in 0..cfg.cp {
                for tp in 0..cfg.tp {
                    let rank = mesh.rank(tp, cp, dp, pp);
                    ranks.push(RankPlace {
                        rank,
                        node: rank / cluster.gpus_per_node,
                        gpu: rank % cluster.gpus_per_node,
                        tp,
                        cp,
                        dp,
                        pp,
                    });
                }
            }
        }
    }
    ranks.sort_by_key(|r| r.rank);
    MeshLayout { axes, ranks }
}

/// The stages of `cfg` with their layer ranges and ranks.
pub fn stages_of(cfg: &TrainingConfig, layers: usize, mesh: &MeshLayout) -> Vec<StagePlan> {
    let specs = cfg.stages.clone().unwrap_or_else(|| {
        autopar_cost_models::pipeline::stages(layers, cfg.pp, cfg.virtual_stages, cfg.recompute)
            .iter()
            .map(|s| autopar_cost_models::StageSpec {
                layers: s.layers,
                recompute: s.recompute,
            })
            .collect()
    });
    let mut start = 0;
    specs
        .iter()
        .enumerate()
        .map(|(s, spec)| {
            let range = [start, start + spec.layers];
            start += spec.layers;
            StagePlan {
                index: s,
                layers: range,
                holds_pre: s == 0,
                holds_post: s + 1 == cfg.pp,
                recompute: spec.recompute,
                ranks: mesh.ranks.iter().filter(|r| r.pp == s).map(|r| r.rank).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_the_mesh_order() {
        let cluster = Cluster::preset("dgx-a100-80g").unwrap().with_gpus(16).unwrap();
        let cfg = TrainingConfig {
            dp: 2,
            tp: 4,
            pp: 2,
            global_batch: 8,
            ..TrainingConfig::default()
        };
        let mesh = mesh_of(&cfg, &cluster);
        assert_eq!(mesh.ranks.len(), 16);
        // tp fastest, then dp, then pp.
        let r5 = &mesh.ranks[5];
        assert_eq!((r5.tp, r5.dp, r5.pp, r5.node, r5.gpu), (1, 1, 0, 0, 5));
        let pipeline_inner = TrainingConfig {
            mesh_order: MeshOrder::PipelineInner,
            ..cfg
        };
        let mesh = mesh_of(&pipeline_inner, &cluster);
        let r5 = &mesh.ranks[5];
        assert_eq!((r5.tp, r5.pp, r5.dp), (1, 1, 0));
        let stages = stages_of(&pipeline_inner, 6, &mesh);
        assert_eq!(stages[0].layers, [0, 3]);
        assert_eq!(stages[1].layers, [3, 6]);
        assert_eq!(stages[1].ranks, vec![4, 5, 6, 7, 12, 13, 14, 15]);
    }
}

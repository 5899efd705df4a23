//! The plan file: everything the runtime needs to execute a parallel plan
//! and everything a person needs to trust it, as versioned JSON.

use crate::search::Candidate;
use crate::spec::OpSharding;
use autopar_cost_models::comm::Algorithm;
use autopar_cost_models::{Cluster, Estimate, MeshOrder, Recompute, TrainingConfig};
use serde::{Deserialize, Serialize};

/// The `format` tag of plan files.
pub const FORMAT: &str = "autopar-plan";
/// The plan format version this code writes and reads.
pub const VERSION: u32 = 1;

/// A parallel plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Plan {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    pub inputs: Inputs,
    pub mesh: MeshLayout,
    pub parallel: Parallel,
    pub stages: Vec<StagePlan>,
    /// Per-op sharding inside a stage, over the mesh axis `tp`: the part
    /// before the layers, one layer (every layer repeats it) and the part after.
    pub sharding: Vec<OpSharding>,
    pub predicted: Estimate,
    pub search: SearchSummary,
}

/// What the plan was made for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Inputs {
    /// The model argument as given (file or zoo spec).
    pub model: String,
    /// FNV-1a 64 of the model file's bytes (or of the spec string), hex.
    pub model_hash: String,
    pub cluster: ClusterSummary,
    pub global_batch: usize,
    pub seq: Option<usize>,
    pub max_memory_fraction: f64,
}

/// The cluster's facts that the plan depends on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClusterSummary {
    pub name: String,
    pub nodes: usize,
    pub gpus_per_node: usize,
    pub device: String,
    pub memory_bytes: f64,
}

/// The device mesh: axes (fastest-varying first) and where each rank runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MeshLayout {
    pub axes: Vec<MeshAxis>,
    pub ranks: Vec<RankPlace>,
}

/// One mesh axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MeshAxis {
    /// `tp`, `cp`, `dp` or `pp`.
    pub name: String,
    pub size: usize,
}

/// A rank's place on the cluster and its coordinate on the mesh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RankPlace {
    pub rank: usize,
    pub node: usize,
    pub gpu: usize,
    pub tp: usize,
    pub cp: usize,
    pub dp: usize,
    pub pp: usize,
}

/// The parallel degrees and knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Parallel {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    pub cp: usize,
    pub ep: usize,
    pub sp: bool,
    pub virtual_stages: usize,
    pub schedule: String,
    pub zero: u8,
    /// The strongest recomputation any stage uses (per-stage policies are in `stages`).
    pub recompute: String,
    pub micro_batch: usize,
    pub micro_batches: usize,
    pub global_batch: usize,
    pub attention: String,
    pub dropout: bool,
    /// `ring` or `parameter-server`.
    pub grad_reduce: String,
    /// Gradients sent as this type, if compressed.
    pub grad_compression: Option<String>,
    /// `dp-inner` (tp, cp, dp, pp) or `pp-inner` (tp, cp, pp, dp).
    pub mesh_order: String,
}

/// One pipeline stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StagePlan {
    pub index: usize,
    /// Repeated layers `[start, end)` in model order (over all of the
    /// stage's chunks when interleaved: chunk `c` of stage `s` holds the
    /// `(c·pp + s)`-th slice of layers).
    pub layers: [usize; 2],
    pub holds_pre: bool,
    pub holds_post: bool,
    pub recompute: String,
    /// The global ranks of the stage.
    pub ranks: Vec<usize>,
}

/// How the plan was found, and the runner-up it beat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchSummary {
    pub configs_evaluated: usize,
    pub seconds: f64,
    pub memory_limit_bytes: f64,
    /// The fastest plans, this one first.
    pub top: Vec<Alternative>,
}

/// A plan the search ranked, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Alternative {
    pub parallel: Parallel,
    pub predicted: Estimate,
}

fn recompute_name(r: Recompute) -> String {
    r.to_string()
}

fn algorithm_name(a: Algorithm) -> String {
    match a {
        Algorithm::Ring => "ring",
        Algorithm::Tree => "tree",
        Algorithm::ParameterServer => "parameter-server",
    }
    .into()
}

impl Plan {
    /// The configuration the plan records, for pricing it again (under
    /// another calibration, or to set a simulation next to it). Gradient
    /// reduction is taken as overlapped with the last backward pass, as the
    /// search always plans it.
    pub fn training_config(&self) -> Result<TrainingConfig, String> {
        let p = &self.parallel;
        let field = |name: &str, e: String| format!("plan field '{name}': {e}");
        let stages = self
            .stages
            .iter()
            .map(|s| {
                Ok(autopar_cost_models::StageSpec {
                    layers: s.layers[1] - s.layers[0],
                    recompute: s.recompute.parse().map_err(|e| field("stages[].recompute", e))?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let algorithm = match p.grad_reduce.as_str() {
            "ring" => Algorithm::Ring,
            "tree" => Algorithm::Tree,
            "parameter-server" => Algorithm::ParameterServer,
            other => {
                return Err(field(
                    "parallel.grad_reduce",
                    format!("unknown reduction '{other}'"),
                ))
            }
        };
        if let Some(c) = &p.grad_compression {
            return Err(field(
                "parallel.grad_compression",
                format!("'{c}' cannot be priced again here"),
            ));
        }
        Ok(TrainingConfig {
            dp: p.dp,
            tp: p.tp,
            pp: p.pp,
            virtual_stages: p.virtual_stages,
            sp: p.sp,
            cp: p.cp,
            ep: p.ep,
            zero: p.zero,
            recompute: p.recompute.parse().map_err(|e| field("parallel.recompute", e))?,
            schedule: p.schedule.parse().map_err(|e| field("parallel.schedule", e))?,
            micro_batch: p.micro_batch,
            global_batch: p.global_batch,
            seq: self.inputs.seq,
            attention: p.attention.parse().map_err(|e| field("parallel.attention", e))?,
            dropout: p.dropout,
            overlap_grad_reduce: true,
            grad_reduce: autopar_cost_models::GradReduce {
                algorithm,
                compression: None,
            },
            mesh_order: match p.mesh_order.as_str() {
                "pp-inner" => MeshOrder::PipelineInner,
                _ => MeshOrder::DataInner,
            },
            stages: Some(stages),
        })
    }
}

/// The degrees and knobs of `cfg` as recorded in plans.
pub fn parallel_of(cfg: &TrainingConfig, micro_batches: usize) -> Parallel {
    Parallel {
        dp: cfg.dp,
        tp: cfg.tp,
        pp: cfg.pp,
        cp: cfg.cp,
        ep: cfg.ep,
        sp: cfg.sp,
        virtual_stages: cfg.virtual_stages,
        schedule: cfg.schedule.to_string(),
        zero: cfg.zero,
        recompute: recompute_name(cfg.recompute),
        micro_batch: cfg.micro_batch,
        micro_batches,
        global_batch: cfg.global_batch,
        attention: cfg.attention.to_string(),
        dropout: cfg.dropout,
        grad_reduce: algorithm_name(cfg.grad_reduce.algorithm),
        grad_compression: cfg
            .grad_reduce
            .compression
            .map(|d| format!("{d:?}").to_lowercase()),
        mesh_order: match cfg.mesh_order {
            MeshOrder::DataInner => "dp-inner",
            MeshOrder::PipelineInner => "pp-inner",
        }
        .into(),
    }
}

/// FNV-1a 64-bit hash, hex: a stable identity for the model's bytes.
pub fn fnv1a_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
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
                recompute: recompute_name(spec.recompute),
                ranks: mesh.ranks.iter().filter(|r| r.pp == s).map(|r| r.rank).collect(),
            }
        })
        .collect()
}

/// What [`Plan::new`] needs besides the chosen candidate.
pub struct PlanContext<'a> {
    pub model: &'a str,
    pub model_hash: String,
    pub cluster: &'a Cluster,
    pub global_batch: usize,
    pub seq: Option<usize>,
    pub max_memory_fraction: f64,
    pub layers: usize,
    pub configs_evaluated: usize,
    pub seconds: f64,
    pub memory_limit_bytes: f64,
}

impl Plan {
    /// The plan for `ranked[0]`, remembering the others as alternatives.
    pub fn new(cx: &PlanContext, ranked: &[Candidate], sharding: Vec<OpSharding>) -> Option<Plan> {
        let best = ranked.first()?;
        let mesh = mesh_of(&best.config, cx.cluster);
        let stages = stages_of(&best.config, cx.layers, &mesh);
        let c = cx.cluster;
        Some(Plan {
            format: FORMAT.into(),
            version: VERSION,
            inputs: Inputs {
                model: cx.model.into(),
                model_hash: cx.model_hash.clone(),
                cluster: ClusterSummary {
                    name: c.name.clone(),
                    nodes: c.nodes,
                    gpus_per_node: c.gpus_per_node,
                    device: c.device.name.clone(),
                    memory_bytes: c.device.memory_bytes,
                },
                global_batch: cx.global_batch,
                seq: cx.seq,
                max_memory_fraction: cx.max_memory_fraction,
            },
            mesh,
            parallel: parallel_of(&best.config, best.estimate.micro_batches),
            stages,
            sharding,
            predicted: best.estimate.clone(),
            search: SearchSummary {
                configs_evaluated: cx.configs_evaluated,
                seconds: cx.seconds,
                memory_limit_bytes: cx.memory_limit_bytes,
                top: ranked
                    .iter()
                    .map(|c| Alternative {
                        parallel: parallel_of(&c.config, c.estimate.micro_batches),
                        predicted: c.estimate.clone(),
                    })
                    .collect(),
            },
        })
    }

    /// Reads a plan file's JSON, checking its format and version.
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PlanError::Parse(e.to_string()))?;
        let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
        if format != FORMAT {
            return Err(PlanError::Format(format.to_string()));
        }
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version != u64::from(VERSION) {
            return Err(PlanError::Version(version));
        }
        serde_json::from_value(value).map_err(|e| PlanError::Parse(e.to_string()))
    }

    /// The JSON Schema of plan files.
    pub fn schema() -> String {
        serde_json::to_string_pretty(&schemars::schema_for!(Plan)).unwrap_or_default()
    }
}

/// Why a plan file cannot be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("not a plan file: {0}")]
    Parse(String),
    #[error("'format' is '{0}', expected '{FORMAT}'")]
    Format(String),
    #[error("plan format version {0} is not supported (this autopar reads version {VERSION})")]
    Version(u64),
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

    #[test]
    fn bad_files_are_named() {
        assert!(matches!(Plan::from_json("{}"), Err(PlanError::Format(_))));
        assert!(matches!(
            Plan::from_json(r#"{"format": "autopar-plan", "version": 9}"#),
            Err(PlanError::Version(9))
        ));
        assert!(matches!(Plan::from_json("nope"), Err(PlanError::Parse(_))));
        assert_eq!(fnv1a_hex(b""), "cbf29ce484222325");
    }
}

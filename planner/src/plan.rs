//! The plan file: everything the runtime needs to execute a parallel plan
//! and everything a person needs to trust it, as versioned JSON.

use crate::spec::OpSharding;
use autopar_cost_models::comm::Algorithm;
use autopar_cost_models::{AttentionKernel, Estimate, MeshOrder, Recompute, Schedule, TrainingConfig};
use autopar_ir::{Loss, Objective};
use serde::{Deserialize, Serialize};

/// The `format` tag of plan files.
pub const FORMAT: &str = "autopar-plan";
/// The plan format version this code writes.
pub const VERSION: u32 = 2;
/// The versions this code reads. Version 2 has version 1's keys and values;
/// it only declares the knobs' allowed values (and readers refuse others),
/// so a valid version-1 file reads as it is.
pub const READS: &[u32] = &[1, VERSION];

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
    /// GPUs the plan runs on (`inputs.cluster` sized to them); absent in
    /// files written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_used: Option<usize>,
    /// GPUs asked for that no layout could use, left idle as spares.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spare_gpus: usize,
    /// The plan's step as the simulator replays its programs, when the
    /// search verified its fastest candidates (`autopar plan --verify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_step_time_s: Option<f64>,
}

fn default_bucket_mib() -> u32 {
    autopar_cost_models::DEFAULT_BUCKET_MIB
}

fn default_prefetch() -> usize {
    autopar_cost_models::DEFAULT_PREFETCH
}

fn is_zero(n: &usize) -> bool {
    *n == 0
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
    /// What the model is trained for, whose loss the plan priced; `null`
    /// when not known (priced with a cross-entropy, as files written before
    /// it was recorded were).
    #[serde(default)]
    pub objective: Option<Objective>,
}

impl Inputs {
    /// The loss the plan priced.
    pub fn loss(&self) -> Loss {
        Loss::of(self.objective)
    }
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
    pub schedule: Schedule,
    pub zero: u8,
    /// The strongest recomputation any stage uses (per-stage policies are in `stages`).
    pub recompute: Recompute,
    pub micro_batch: usize,
    pub micro_batches: usize,
    pub global_batch: usize,
    pub attention: AttentionKernel,
    pub dropout: bool,
    /// MoE experts keep at most `⌈cf · assignments / experts⌉` of a rank's
    /// token assignments each (drop and pad). Absent: no token is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_capacity_factor: Option<f64>,
    /// How gradients cross the data-parallel group.
    pub grad_reduce: Algorithm,
    /// Gradients sent as this type, if compressed.
    pub grad_compression: Option<autopar_cost_models::GradCompression>,
    /// Gradient buckets of about this many MiB, each reduced as soon as the
    /// backward pass completes it; 0: one collective per parameter tensor.
    /// Files written before buckets existed read as the default.
    #[serde(default = "default_bucket_mib")]
    pub grad_bucket_mib: u32,
    /// Priced with tensor-parallel communication beside the GEMMs
    /// (Megatron-Core's overlap); no backend here runs it. Absent: off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tp_comm_overlap: bool,
    /// ZeRO-3: layers ahead of the one it computes that a task gathers
    /// weights for. Files written before it read as the default.
    #[serde(default = "default_prefetch")]
    pub zero3_prefetch: usize,
    /// `dp-inner` (tp, cp, dp, pp) or `pp-inner` (tp, cp, pp, dp).
    pub mesh_order: MeshOrder,
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
    pub recompute: Recompute,
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
    /// Its step as the simulator replays its programs, when it was
    /// verified (`autopar plan --verify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_step_time_s: Option<f64>,
}

impl Plan {
    /// The configuration the plan records, for pricing it again (under
    /// another calibration, or to set a simulation next to it). Gradient
    /// reduction is taken as overlapped with the last backward pass, as the
    /// search always plans it.
    pub fn training_config(&self) -> TrainingConfig {
        let p = &self.parallel;
        let stages = self
            .stages
            .iter()
            .map(|s| autopar_cost_models::StageSpec {
                layers: s.layers[1].saturating_sub(s.layers[0]),
                recompute: s.recompute,
            })
            .collect();
        TrainingConfig {
            dp: p.dp,
            tp: p.tp,
            pp: p.pp,
            virtual_stages: p.virtual_stages,
            sp: p.sp,
            cp: p.cp,
            ep: p.ep,
            zero: p.zero,
            recompute: p.recompute,
            schedule: p.schedule,
            micro_batch: p.micro_batch,
            global_batch: p.global_batch,
            seq: self.inputs.seq,
            attention: p.attention,
            dropout: p.dropout,
            moe_capacity_factor: p.moe_capacity_factor,
            loss: self.inputs.loss(),
            overlap_grad_reduce: true,
            grad_reduce: autopar_cost_models::GradReduce {
                algorithm: p.grad_reduce,
                compression: p.grad_compression,
                // Only estimates of other tools' runs price these.
                f32_main_grads: false,
                bucket_mib: p.grad_bucket_mib,
            },
            tp_comm_overlap: p.tp_comm_overlap,
            overlap_param_gather: false,
            f32_cross_entropy: false,
            zero3_prefetch: p.zero3_prefetch,
            mesh_order: p.mesh_order,
            stages: Some(stages),
        }
    }
}

impl Parallel {
    /// The degrees and knobs of `cfg` as recorded in plans.
    pub fn of(cfg: &TrainingConfig, micro_batches: usize) -> Parallel {
        Parallel {
            dp: cfg.dp,
            tp: cfg.tp,
            pp: cfg.pp,
            cp: cfg.cp,
            ep: cfg.ep,
            sp: cfg.sp,
            virtual_stages: cfg.virtual_stages,
            schedule: cfg.schedule,
            zero: cfg.zero,
            recompute: cfg.recompute,
            micro_batch: cfg.micro_batch,
            micro_batches,
            global_batch: cfg.global_batch,
            attention: cfg.attention,
            dropout: cfg.dropout,
            moe_capacity_factor: cfg.moe_capacity_factor,
            grad_reduce: cfg.grad_reduce.algorithm,
            grad_compression: cfg.grad_reduce.compression,
            grad_bucket_mib: cfg.grad_reduce.bucket_mib,
            tp_comm_overlap: cfg.tp_comm_overlap,
            zero3_prefetch: cfg.zero3_prefetch,
            mesh_order: cfg.mesh_order,
        }
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

impl Plan {
    /// Reads a plan file's JSON, checking its format and version. A value
    /// that does not fit its field (an unknown `mesh_order`, say) is refused
    /// naming the field's path and the values allowed there. A version-1
    /// file reads as the current version: the keys and values are the same.
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PlanError::Parse(e.to_string()))?;
        let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
        if format != FORMAT {
            return Err(PlanError::Format(format.to_string()));
        }
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if !READS.iter().any(|&v| u64::from(v) == version) {
            return Err(PlanError::Version(version));
        }
        // Read from the text, not `value`, so messages keep line and column.
        let mut reader = serde_json::Deserializer::from_str(text);
        let mut plan: Plan = serde_path_to_error::deserialize(&mut reader).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            // The root's path is `.`: a missing top-level key names itself.
            if path == "." {
                PlanError::Parse(message)
            } else {
                PlanError::Field { path, message }
            }
        })?;
        plan.version = VERSION;
        plan.check_sizes()?;
        Ok(plan)
    }

    /// Refuses sizes no plan holds, naming the field: counts of zero, and
    /// counts beyond the planner's [`limits`](crate::limits), which every
    /// later step would allocate or loop over. Whether a plan's parts agree
    /// with each other and with its model is for lowering to say.
    fn check_sizes(&self) -> Result<(), PlanError> {
        use crate::limits::{MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_RANKS, MAX_SEQ};
        let field = |path: &str, message: String| PlanError::Field {
            path: path.to_string(),
            message,
        };
        let within = |path: &str, value: usize, limit: usize, limit_name: &str| {
            if value == 0 {
                Err(field(path, "must be at least 1".into()))
            } else if value > limit {
                Err(field(
                    path,
                    format!("{value} is above the limit of {limit} ({limit_name})"),
                ))
            } else {
                Ok(())
            }
        };
        let i = &self.inputs;
        within(
            "inputs.global_batch",
            i.global_batch,
            MAX_GLOBAL_BATCH,
            "MAX_GLOBAL_BATCH",
        )?;
        if let Some(seq) = i.seq {
            within("inputs.seq", seq, MAX_SEQ, "MAX_SEQ")?;
        }
        within("inputs.cluster.nodes", i.cluster.nodes, MAX_RANKS, "MAX_RANKS")?;
        within(
            "inputs.cluster.gpus_per_node",
            i.cluster.gpus_per_node,
            MAX_RANKS,
            "MAX_RANKS",
        )?;
        let p = &self.parallel;
        for (name, degree) in [
            ("dp", p.dp),
            ("tp", p.tp),
            ("pp", p.pp),
            ("cp", p.cp),
            ("ep", p.ep),
        ] {
            within(&format!("parallel.{name}"), degree, MAX_RANKS, "MAX_RANKS")?;
        }
        let world = [p.tp, p.cp, p.pp].iter().try_fold(p.dp, |a, &b| a.checked_mul(b));
        if world.is_none_or(|w| w > MAX_RANKS) {
            return Err(field(
                "parallel",
                format!(
                    "dp·tp·cp·pp = {}·{}·{}·{} ranks is above the limit of {MAX_RANKS} (MAX_RANKS)",
                    p.dp, p.tp, p.cp, p.pp
                ),
            ));
        }
        within(
            "parallel.virtual_stages",
            p.virtual_stages,
            MAX_LAYERS,
            "MAX_LAYERS",
        )?;
        if p.pp.saturating_mul(p.virtual_stages) > MAX_LAYERS {
            return Err(field(
                "parallel.virtual_stages",
                format!(
                    "pp·virtual_stages = {}·{} layer chunks is above the limit of {MAX_LAYERS} (MAX_LAYERS)",
                    p.pp, p.virtual_stages
                ),
            ));
        }
        within(
            "parallel.global_batch",
            p.global_batch,
            MAX_GLOBAL_BATCH,
            "MAX_GLOBAL_BATCH",
        )?;
        within(
            "parallel.micro_batch",
            p.micro_batch,
            MAX_GLOBAL_BATCH,
            "MAX_GLOBAL_BATCH",
        )?;
        within(
            "parallel.micro_batches",
            p.micro_batches,
            MAX_GLOBAL_BATCH,
            "MAX_GLOBAL_BATCH",
        )?;
        let rows = [p.micro_batch, p.micro_batches]
            .iter()
            .try_fold(p.dp, |a, &b| a.checked_mul(b));
        if rows != Some(p.global_batch) {
            return Err(field(
                "parallel.micro_batches",
                format!(
                    "dp·micro_batch·micro_batches = {}·{}·{} is not global_batch {}",
                    p.dp, p.micro_batch, p.micro_batches, p.global_batch
                ),
            ));
        }
        if p.zero3_prefetch > MAX_LAYERS {
            return Err(field(
                "parallel.zero3_prefetch",
                format!(
                    "{} is above the limit of {MAX_LAYERS} (MAX_LAYERS)",
                    p.zero3_prefetch
                ),
            ));
        }
        if self.mesh.ranks.len() > MAX_RANKS {
            return Err(field(
                "mesh.ranks",
                format!(
                    "{} ranks is above the limit of {MAX_RANKS} (MAX_RANKS)",
                    self.mesh.ranks.len()
                ),
            ));
        }
        if self.stages.len() > MAX_LAYERS {
            return Err(field(
                "stages",
                format!(
                    "{} stages is above the limit of {MAX_LAYERS} (MAX_LAYERS)",
                    self.stages.len()
                ),
            ));
        }
        for (n, s) in self.stages.iter().enumerate() {
            let [start, end] = s.layers;
            if start > end {
                return Err(field(
                    &format!("stages[{n}].layers"),
                    format!("[{start}, {end}] ends before it starts"),
                ));
            }
            if end > MAX_LAYERS {
                return Err(field(
                    &format!("stages[{n}].layers"),
                    format!("layer {end} is above the limit of {MAX_LAYERS} (MAX_LAYERS)"),
                ));
            }
        }
        Ok(())
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
    #[error("plan format version {0} is not supported (this autopar reads versions {versions})", versions = versions_read())]
    Version(u64),
    #[error("plan field '{path}': {message}")]
    Field { path: String, message: String },
}

/// [`READS`], for messages: `1, 2`.
fn versions_read() -> String {
    READS.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan `autopar plan` wrote in format version 1.
    const V1: &str = include_str!("../../fixtures/plans/v1.json");

    /// The version-1 plan with `field` of `parallel` (or of the first stage) set to `value`.
    fn edited(section: &str, field: &str, value: serde_json::Value) -> String {
        let mut v: serde_json::Value = serde_json::from_str(V1).unwrap();
        match section {
            "parallel" => v["parallel"][field] = value,
            "stages" => v["stages"][0][field] = value,
            "top-level" => v[field] = value,
            other => panic!("no section {other}"),
        }
        serde_json::to_string_pretty(&v).unwrap()
    }

    /// Removes the keys added since version 1 wherever they occur, checking
    /// they hold their defaults.
    fn strip_added(v: &mut serde_json::Value) {
        let defaults = [
            ("grad_bucket_mib", serde_json::Value::from(default_bucket_mib())),
            ("comm_bytes_per_gpu", serde_json::Value::from(0.0)),
            ("zero3_prefetch", serde_json::Value::from(default_prefetch())),
            ("objective", serde_json::Value::Null),
        ];
        match v {
            serde_json::Value::Object(o) => {
                for (key, default) in &defaults {
                    if let Some(found) = o.remove(*key) {
                        assert_eq!(&found, default, "{key}");
                    }
                }
                o.values_mut().for_each(strip_added);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip_added),
            _ => {}
        }
    }

    #[test]
    fn a_version_1_file_reads_as_the_current_version() {
        let plan = Plan::from_json(V1).unwrap();
        assert_eq!(plan.version, VERSION);
        assert_eq!(plan.parallel.schedule, Schedule::OneFOneB);
        assert_eq!(plan.parallel.mesh_order, MeshOrder::DataInner);
        assert_eq!(plan.parallel.grad_reduce, Algorithm::Ring);
        // Written again, it has the same keys and values, only a newer
        // version and the keys added since, at their defaults.
        let mut written = serde_json::to_value(&plan).unwrap();
        let mut read: serde_json::Value = serde_json::from_str(V1).unwrap();
        written["version"] = 0.into();
        read["version"] = 0.into();
        strip_added(&mut written);
        assert_eq!(written, read);
    }

    #[test]
    fn unknown_knob_values_name_the_field_and_the_values_allowed() {
        let cases = [
            (
                "parallel",
                "mesh_order",
                "parallel.mesh_order",
                "dp-inner, pp-inner",
            ),
            (
                "parallel",
                "schedule",
                "parallel.schedule",
                "gpipe, 1f1b, interleaved",
            ),
            (
                "parallel",
                "recompute",
                "parallel.recompute",
                "none, selective, full",
            ),
            (
                "parallel",
                "grad_reduce",
                "parallel.grad_reduce",
                "ring, tree, parameter-server",
            ),
            ("parallel", "attention", "parallel.attention", "fused, unfused"),
            (
                "stages",
                "recompute",
                "stages[0].recompute",
                "none, selective, full",
            ),
        ];
        for (section, field, path, allowed) in cases {
            let err = Plan::from_json(&edited(section, field, "bogus".into())).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(&err, PlanError::Field { path: p, .. } if p == path),
                "{field}: {text}"
            );
            assert!(text.contains(&format!("plan field '{path}'")), "{text}");
            assert!(text.contains(&format!("'bogus' (expected {allowed})")), "{text}");
        }
        let err = Plan::from_json(&edited("parallel", "grad_compression", "bf17".into())).unwrap_err();
        assert!(
            err.to_string().contains("plan field 'parallel.grad_compression'"),
            "{err}"
        );
    }

    #[test]
    fn unsupported_versions_are_refused_naming_them() {
        let err = Plan::from_json(&edited("top-level", "version", 99.into())).unwrap_err();
        assert_eq!(err, PlanError::Version(99));
        assert_eq!(
            err.to_string(),
            "plan format version 99 is not supported (this autopar reads versions 1, 2)"
        );
        let current = Plan::from_json(&edited("top-level", "version", VERSION.into())).unwrap();
        assert_eq!(current, Plan::from_json(V1).unwrap());
    }

    #[test]
    fn the_typed_configuration_round_trips() {
        let plan = Plan::from_json(V1).unwrap();
        let cfg = plan.training_config();
        assert_eq!(Parallel::of(&cfg, plan.parallel.micro_batches), plan.parallel);
        assert_eq!(
            cfg.stages.unwrap().iter().map(|s| s.layers).sum::<usize>(),
            plan.stages.last().unwrap().layers[1]
        );
    }

    #[test]
    fn bad_files_are_named() {
        assert!(matches!(Plan::from_json("{}"), Err(PlanError::Format(_))));
        assert!(matches!(
            Plan::from_json(r#"{"format": "autopar-plan", "version": 9}"#),
            Err(PlanError::Version(9))
        ));
        assert!(matches!(Plan::from_json("nope"), Err(PlanError::Parse(_))));
        let no_stages = Plan::from_json(r#"{"format": "autopar-plan", "version": 2}"#).unwrap_err();
        assert!(
            no_stages
                .to_string()
                .starts_with("not a plan file: missing field"),
            "{no_stages}"
        );
        assert_eq!(fnv1a_hex(b""), "cbf29ce484222325");
    }

    /// Sizes no plan holds are refused by the reader, naming the field and
    /// the limit, before anything allocates for them.
    #[test]
    fn absurd_sizes_name_the_field_and_the_limit() {
        let huge = serde_json::Value::from(1_000_000_000_000u64);
        let cases = [
            (
                edited("stages", "layers", serde_json::json!([3, 1])),
                "stages[0].layers",
                "ends before it starts",
            ),
            (
                edited("stages", "layers", serde_json::json!([0, 100_000])),
                "stages[0].layers",
                "MAX_LAYERS",
            ),
            (
                edited("parallel", "micro_batches", huge.clone()),
                "parallel.micro_batches",
                "MAX_GLOBAL_BATCH",
            ),
            (
                edited("parallel", "micro_batch", huge.clone()),
                "parallel.micro_batch",
                "MAX_GLOBAL_BATCH",
            ),
            (
                edited("parallel", "micro_batch", 3.into()),
                "parallel.micro_batches",
                "is not global_batch 16",
            ),
            (edited("parallel", "tp", 0.into()), "parallel.tp", "at least 1"),
            (edited("parallel", "pp", huge.clone()), "parallel.pp", "MAX_RANKS"),
            (
                edited("parallel", "virtual_stages", 2000.into()),
                "parallel.virtual_stages",
                "MAX_LAYERS",
            ),
            (
                edited("parallel", "zero3_prefetch", huge),
                "parallel.zero3_prefetch",
                "MAX_LAYERS",
            ),
        ];
        for (text, path, needle) in cases {
            let err = Plan::from_json(&text).unwrap_err();
            assert!(
                matches!(&err, PlanError::Field { path: p, .. } if p == path),
                "{path}: {err}"
            );
            assert!(err.to_string().contains(needle), "{path}: {err}");
        }
        // Degrees whose product overflows are refused, not wrapped.
        let mut v: serde_json::Value = serde_json::from_str(V1).unwrap();
        for degree in ["dp", "tp", "pp", "cp"] {
            v["parallel"][degree] = (1u64 << 17).into();
        }
        let err = Plan::from_json(&v.to_string()).unwrap_err();
        assert!(
            err.to_string().contains("plan field 'parallel': dp·tp·cp·pp"),
            "{err}"
        );
    }
}

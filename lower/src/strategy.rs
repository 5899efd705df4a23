//! The part of a plan that lowering executes: degrees, schedule, ZeRO
//! stage, micro-batching, stage splits and where each rank sits on the
//! mesh. Tests build one directly; `autopar run` reads it from a plan file.

use super::program::Coord;
use autopar_cost_models::comm::Algorithm;
use autopar_cost_models::{Recompute, Schedule};
use autopar_ir::CommGroup;
use autopar_planner::spec::OpSharding;
use autopar_planner::Plan;

/// What lowering needs to know about a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Strategy {
    pub dp: usize,
    pub tp: usize,
    pub cp: usize,
    pub ep: usize,
    pub pp: usize,
    /// Sequence parallelism between tensor-parallel regions.
    pub sp: bool,
    /// Model chunks per stage (interleaved schedule), else 1.
    pub chunks: usize,
    pub schedule: Schedule,
    pub zero: u8,
    pub micro_batch: usize,
    pub micro_batches: usize,
    pub reduction: Algorithm,
    /// The 16-bit float type data-parallel gradient reductions send
    /// (`parallel.grad_compression`); `None` sends them as they are.
    pub compression: Option<autopar_cost_models::GradCompression>,
    /// MoE capacity factor (`parallel.moe_capacity_factor`): experts drop
    /// what exceeds their blocks; `None` drops nothing.
    pub capacity_factor: Option<f64>,
    /// Gradients are reduced in buckets of at least this many bytes, in the
    /// order the backward pass completes them; 0: one collective per parameter.
    pub bucket_bytes: usize,
    /// ZeRO-3: how many layers ahead of the one it computes a task
    /// gathers weights, so the gathers run beside the computation.
    pub prefetch: usize,
    /// Repeated layers per stage (over all of its chunks).
    pub stage_layers: Vec<usize>,
    pub recompute: Vec<Recompute>,
    /// Every rank's mesh coordinate, by rank.
    pub ranks: Vec<Coord>,
    /// The plan's per-op sharding over the `tp` ranks, which the
    /// tensor-parallel rewrite executes (with `sp`, the plan's program kept
    /// activations split along the sequence between layers); empty: the
    /// rewrite's propagation rules lay the group out as Megatron-LM does
    /// (strategies built by hand, as tests do).
    pub sharding: Vec<OpSharding>,
}

pub use autopar_cost_models::DEFAULT_PREFETCH;

/// Why a plan cannot be lowered.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StrategyError {
    #[error("plan field '{field}': {message}")]
    Field { field: &'static str, message: String },
    #[error("{0} is planned but the CPU runtime does not lower it yet; plan without it (e.g. `autopar run MODEL --plan auto` restricts the search to what runs)")]
    NotLowered(String),
}

fn field(field: &'static str, message: impl Into<String>) -> StrategyError {
    StrategyError::Field {
        field,
        message: message.into(),
    }
}

impl Strategy {
    /// Data parallelism over `dp` ranks and pipelining over `pp` stages of
    /// equal layer counts (`layers` in all), ranks laid out dp-inner; the
    /// rest at its simplest. A starting point for tests and examples.
    pub fn new(dp: usize, pp: usize, layers: usize, micro_batch: usize, micro_batches: usize) -> Strategy {
        let stage_layers = (0..pp)
            .map(|s| layers / pp + usize::from(s < layers % pp))
            .collect();
        Strategy {
            dp,
            tp: 1,
            cp: 1,
            ep: 1,
            pp,
            sp: false,
            chunks: 1,
            schedule: Schedule::OneFOneB,
            zero: 0,
            micro_batch,
            micro_batches,
            reduction: Algorithm::Ring,
            compression: None,
            capacity_factor: None,
            bucket_bytes: autopar_cost_models::GradReduce::default().bucket_bytes(),
            prefetch: DEFAULT_PREFETCH,
            stage_layers,
            recompute: vec![Recompute::None; pp],
            ranks: (0..pp)
                .flat_map(|p| {
                    (0..dp).map(move |d| Coord {
                        tp: 0,
                        cp: 0,
                        dp: d,
                        pp: p,
                    })
                })
                .collect(),
            sharding: Vec::new(),
        }
    }

    /// The same strategy running the per-op sharding `sharding` (a plan's).
    pub fn with_sharding(mut self, sharding: Vec<OpSharding>) -> Strategy {
        self.sharding = sharding;
        self
    }

    /// The same strategy with a `tp`-way tensor-parallel group inside each
    /// rank of it (sequence-parallel when `sp`): ranks tp-fastest, then cp,
    /// then dp, then pp.
    pub fn with_tp(mut self, tp: usize, sp: bool) -> Strategy {
        self.tp = tp;
        self.sp = sp && tp > 1;
        self.place_ranks();
        self
    }

    /// The same strategy with each rank's sequences split over a `cp`-way
    /// context-parallel group: ranks tp-fastest, then cp, then dp, then pp.
    pub fn with_cp(mut self, cp: usize) -> Strategy {
        self.cp = cp;
        self.place_ranks();
        self
    }

    /// Every rank's coordinate, tp fastest, then cp, dp and pp (Megatron-LM's order).
    fn place_ranks(&mut self) {
        let (tp, cp, dp) = (self.tp, self.cp, self.dp);
        self.ranks = (0..self.pp)
            .flat_map(|pp| {
                (0..dp).flat_map(move |dp| {
                    (0..cp).flat_map(move |cp| (0..tp).map(move |tp| Coord { tp, cp, dp, pp }))
                })
            })
            .collect();
    }

    /// The plan's strategy, checked for what lowering supports.
    pub fn from_plan(plan: &Plan) -> Result<Strategy, StrategyError> {
        let p = &plan.parallel;
        let reduction = match p.grad_reduce {
            Algorithm::Ring | Algorithm::ParameterServer => p.grad_reduce,
            Algorithm::Tree => {
                return Err(StrategyError::NotLowered(format!(
                    "gradient reduction '{}' (parallel.grad_reduce)",
                    p.grad_reduce
                )))
            }
        };
        if p.tp_comm_overlap {
            return Err(StrategyError::NotLowered(
                "tensor-parallel communication overlapped with the GEMMs (parallel.tp_comm_overlap)".into(),
            ));
        }
        let compression = match p.grad_compression {
            Some(_) if reduction == Algorithm::ParameterServer => {
                return Err(StrategyError::NotLowered(
                    "gradient compression with a parameter server (parallel.grad_compression with parallel.grad_reduce 'parameter-server')".into(),
                ))
            }
            Some(c) if c.lossy() && p.zero > 0 => {
                return Err(StrategyError::NotLowered(format!(
                    "gradient compression '{c}' with ZeRO {} (lossy compression keeps each rank's unsent values and compresses the all-reduce of ZeRO 0; ZeRO 1-3 reduce-scatter, which only bf16 and fp16 compress)",
                    p.zero
                )))
            }
            c => c,
        };
        let stage_layers = plan
            .stages
            .iter()
            .map(|s| {
                s.layers[1].checked_sub(s.layers[0]).ok_or_else(|| {
                    field(
                        "stages[].layers",
                        format!("stage {} ends before it starts", s.index),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ranks = plan
            .mesh
            .ranks
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if r.rank == i {
                    Ok(Coord {
                        tp: r.tp,
                        cp: r.cp,
                        dp: r.dp,
                        pp: r.pp,
                    })
                } else {
                    Err(field("mesh.ranks", format!("entry {i} is rank {}", r.rank)))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let s = Strategy {
            dp: p.dp,
            tp: p.tp,
            cp: p.cp,
            ep: p.ep,
            pp: p.pp,
            sp: p.sp,
            chunks: if p.schedule == Schedule::Interleaved {
                p.virtual_stages
            } else {
                1
            },
            schedule: p.schedule,
            zero: p.zero,
            micro_batch: p.micro_batch,
            micro_batches: p.micro_batches,
            reduction,
            compression,
            capacity_factor: p.moe_capacity_factor,
            bucket_bytes: autopar_cost_models::GradReduce {
                bucket_mib: p.grad_bucket_mib,
                ..Default::default()
            }
            .bucket_bytes(),
            prefetch: p.zero3_prefetch,
            stage_layers,
            recompute: plan.stages.iter().map(|s| s.recompute).collect(),
            ranks,
            sharding: match p.tp > 1 {
                true => plan.sharding.clone(),
                false => Vec::new(),
            },
        };
        s.check()?;
        Ok(s)
    }

    /// Ranks in all.
    pub fn world(&self) -> usize {
        self.dp * self.tp * self.cp * self.pp
    }

    /// Rows of the global batch per step.
    pub fn global_batch(&self) -> usize {
        self.dp * self.micro_batch * self.micro_batches
    }

    /// The rank at `coord`.
    pub fn rank_of(&self, coord: Coord) -> usize {
        self.ranks
            .iter()
            .position(|&c| c == coord)
            .expect("coordinates come from the mesh")
    }

    /// The ranks of `coord`'s `group`, in order: every collective lowering
    /// emits, and every view of the mesh (the plan report), uses these.
    pub fn comm_group(&self, group: CommGroup, coord: Coord) -> Vec<usize> {
        match group {
            CommGroup::Context => (0..self.cp)
                .map(|cp| self.rank_of(Coord { cp, ..coord }))
                .collect(),
            CommGroup::Tensor => (0..self.tp)
                .map(|tp| self.rank_of(Coord { tp, ..coord }))
                .collect(),
            // Expert-parallel groups are runs of `ep` consecutive data-parallel ranks.
            CommGroup::Expert => {
                let first = coord.dp / self.ep * self.ep;
                (first..first + self.ep)
                    .map(|dp| self.rank_of(Coord { dp, ..coord }))
                    .collect()
            }
        }
    }

    /// The ranks that hold copies of `coord`'s weights and sum their
    /// gradients: data-parallel replicas and context-parallel ranks, in (dp, cp) order.
    /// Expert weights (split over an expert-parallel group) have copies only
    /// on the data-parallel ranks at the same place in their own groups.
    pub fn replica_group(&self, expert: bool, coord: Coord) -> Vec<usize> {
        (0..self.dp)
            .filter(|dp| !expert || dp % self.ep == coord.dp % self.ep)
            .flat_map(|dp| (0..self.cp).map(move |cp| Coord { dp, cp, ..coord }))
            .map(|c| self.rank_of(c))
            .collect()
    }

    /// The rank running each pipeline stage in `coord`'s replica.
    pub fn pipeline_group(&self, coord: Coord) -> Vec<usize> {
        (0..self.pp)
            .map(|pp| self.rank_of(Coord { pp, ..coord }))
            .collect()
    }

    /// Consistency, and the strategies lowering does not implement yet.
    pub fn check(&self) -> Result<(), StrategyError> {
        for (name, degree) in [
            ("dp", self.dp),
            ("tp", self.tp),
            ("cp", self.cp),
            ("ep", self.ep),
            ("pp", self.pp),
        ] {
            if degree == 0 {
                return Err(field("parallel", format!("{name} must be at least 1")));
            }
        }
        if self.cp > 1 && self.sp {
            return Err(StrategyError::NotLowered(format!(
                "context parallelism (cp = {}) together with sequence parallelism (both split the sequence)",
                self.cp
            )));
        }
        if self.dp % self.ep != 0 {
            return Err(field(
                "parallel.ep",
                format!(
                    "expert-parallel groups of {} must divide dp = {}",
                    self.ep, self.dp
                ),
            ));
        }
        if let Some(cf) = self.capacity_factor.filter(|cf| !(cf.is_finite() && *cf > 0.0)) {
            return Err(field(
                "parallel.moe_capacity_factor",
                format!("{cf} is not a capacity factor (a positive number, such as 1.25)"),
            ));
        }
        if self.zero > 3 {
            return Err(field(
                "parallel.zero",
                format!("ZeRO stage {} does not exist", self.zero),
            ));
        }
        if self.zero > 0 && self.reduction == Algorithm::ParameterServer {
            return Err(field(
                "parallel.zero",
                "ZeRO shards gradients with reduce-scatter; it cannot use a parameter server",
            ));
        }
        if self.micro_batch == 0 || self.micro_batches == 0 {
            return Err(field(
                "parallel.micro_batches",
                "micro-batch size and count must be at least 1",
            ));
        }
        if self.chunks == 0 || (self.chunks > 1 && self.schedule != Schedule::Interleaved) {
            return Err(field(
                "parallel.virtual_stages",
                "more than one chunk per stage needs the interleaved schedule",
            ));
        }
        if self.stage_layers.len() != self.pp || self.recompute.len() != self.pp {
            return Err(field(
                "stages",
                format!("{} stages for pp = {}", self.stage_layers.len(), self.pp),
            ));
        }
        if self.ranks.len() != self.world() {
            return Err(field(
                "mesh.ranks",
                format!("{} ranks for a mesh of {}", self.ranks.len(), self.world()),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &self.ranks {
            if c.dp >= self.dp || c.pp >= self.pp || c.tp >= self.tp || c.cp >= self.cp || !seen.insert(*c) {
                return Err(field(
                    "mesh.ranks",
                    format!("coordinate {c:?} is outside the mesh or repeated"),
                ));
            }
        }
        Ok(())
    }

    /// The virtual stage (`chunk · pp + stage`) of each repeated layer.
    pub fn layer_virtual_stages(&self) -> Vec<usize> {
        let v = self.chunks;
        let mut counts = vec![0; self.pp * v];
        for (s, &layers) in self.stage_layers.iter().enumerate() {
            for c in 0..v {
                counts[c * self.pp + s] = layers / v + usize::from(c < layers % v);
            }
        }
        counts
            .iter()
            .enumerate()
            .flat_map(|(vs, &n)| std::iter::repeat_n(vs, n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_layers_go_round_the_stages() {
        let mut s = Strategy::new(1, 2, 8, 1, 4);
        s.schedule = Schedule::Interleaved;
        s.chunks = 2;
        assert_eq!(s.layer_virtual_stages(), vec![0, 0, 1, 1, 2, 2, 3, 3]);
        let plain = Strategy::new(1, 3, 7, 1, 4);
        assert_eq!(plain.layer_virtual_stages(), vec![0, 0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn plans_with_what_lowering_lacks_are_refused_naming_it() {
        let mut plan = Plan::from_json(include_str!("../../fixtures/plans/v1.json")).unwrap();
        let s = Strategy::from_plan(&plan).unwrap();
        assert_eq!(
            (s.dp, s.schedule, s.reduction),
            (8, Schedule::OneFOneB, Algorithm::Ring)
        );
        assert_eq!(s.recompute, vec![Recompute::None]);
        plan.parallel.zero = 0;
        plan.parallel.grad_reduce = Algorithm::ParameterServer;
        assert_eq!(
            Strategy::from_plan(&plan).unwrap().reduction,
            Algorithm::ParameterServer
        );
        plan.parallel.grad_reduce = Algorithm::Tree;
        let err = Strategy::from_plan(&plan).unwrap_err();
        assert!(
            matches!(&err, StrategyError::NotLowered(what) if what.contains("gradient reduction 'tree'")),
            "{err}"
        );
        // 16-bit gradient compression on a ring is lowered; with a
        // parameter server it is not.
        use autopar_cost_models::GradCompression;
        plan.parallel.grad_reduce = Algorithm::Ring;
        for c in [GradCompression::Bf16, GradCompression::Fp16] {
            plan.parallel.grad_compression = Some(c);
            assert_eq!(Strategy::from_plan(&plan).unwrap().compression, Some(c));
        }
        plan.parallel.grad_reduce = Algorithm::ParameterServer;
        let err = Strategy::from_plan(&plan).unwrap_err();
        assert!(
            matches!(&err, StrategyError::NotLowered(what) if what.contains("compression with a parameter server")),
            "{err}"
        );
    }

    #[test]
    fn unsupported_strategies_say_what() {
        let mut s = Strategy::new(2, 1, 2, 1, 1).with_tp(2, false);
        assert!(s.check().is_ok());
        assert_eq!(
            s.rank_of(Coord {
                tp: 1,
                cp: 0,
                dp: 1,
                pp: 0
            }),
            3
        );
        (s.cp, s.sp) = (2, true);
        assert!(s
            .check()
            .unwrap_err()
            .to_string()
            .contains("context parallelism (cp = 2) together with sequence parallelism"));
        let mut s = Strategy::new(2, 1, 2, 1, 1);
        s.zero = 2;
        s.reduction = Algorithm::ParameterServer;
        assert!(s.check().unwrap_err().to_string().contains("parameter server"));
    }
}

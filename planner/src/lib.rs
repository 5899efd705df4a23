//! Parallel-plan search: enumerate parallel degrees and knobs with pruning,
//! split layers into pipeline stages, shard ops inside a stage, keep the
//! Pareto front of step time and memory, and emit a [`Plan`]
//! ([`plan_model`] does all of it).

pub mod assemble;
pub mod layer_sharding;
pub mod limits;
pub mod plan;
pub mod search;
pub mod sharding;
pub mod spec;
pub mod stages;

pub use assemble::{
    mesh_of, plan_candidate, plan_model, plan_model_verified, planned_workload, stages_of, ModelId,
    PlanningError, Verify,
};
pub use plan::{Parallel, Plan, PlanError};
pub use search::{search, Candidate, DegreeLimits, SearchError, SearchOptions, SearchResult};

//! Parallel-plan search: enumerate parallel degrees and knobs with pruning,
//! split layers into pipeline stages, shard ops inside a stage, keep the
//! Pareto front of step time and memory, and emit a [`Plan`].

pub mod layer_sharding;
pub mod plan;
pub mod search;
pub mod sharding;
pub mod spec;
pub mod stages;

pub use plan::{Plan, PlanError};
pub use search::{search, Candidate, DegreeLimits, SearchError, SearchOptions, SearchResult};

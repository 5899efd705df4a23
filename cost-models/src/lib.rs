//! Cluster descriptions and the cost models the planner optimises.
//!
//! `cluster` holds the hardware facts (devices, link levels) described in
//! TOML or chosen from presets; `calibration` the efficiencies real kernels
//! and collectives reach on them; `comm` prices collectives. `workload`
//! turns a model graph into what one rank computes for one micro-batch under
//! a sharding; `compute`, `memory` and `pipeline` price it; `estimate` puts
//! them together into a step time, MFU and per-GPU memory for a
//! [`TrainingConfig`]. `measured` predicts one node's time on the CPU
//! backend from a profiled calibration (the simulator and profiler use it).

pub mod calibration;
mod cluster;
pub mod comm;
pub mod compute;
pub mod config;
pub mod estimate;
pub mod measured;
pub mod memory;
pub mod pipeline;
pub mod published;
pub mod workload;

pub use calibration::{Calibration, CalibrationError};
pub use cluster::{host_threads_per_rank, Cluster, ClusterError, Device, Link, MAX_GPUS, PRESET_NAMES};
pub use config::{
    ConfigError, GradCompression, GradReduce, GradWire, MeshOrder, Recompute, Schedule, StageSpec,
    TrainingConfig, DEFAULT_BUCKET_MIB, DEFAULT_PREFETCH,
};
pub use estimate::{estimate, Estimate, EstimateError, Evaluator, Mesh, TimeBreakdown};
pub use workload::{AttentionKernel, Sharding, Workload, WorkloadError, WorkloadOptions};

//! Cluster descriptions and the cost models the planner optimises.
//!
//! `cluster` holds the hardware facts (devices, link levels) described in
//! TOML or chosen from presets; `comm` prices collectives on them. The
//! compute and memory models build on both.

mod cluster;
pub mod comm;

pub use cluster::{Cluster, ClusterError, Device, Link};

//! Cluster descriptions and the cost models the planner optimises.
//!
//! This crate starts with `cluster`: the hardware facts (devices, link
//! levels) described in TOML or chosen from presets. The compute,
//! communication and memory models build on it.

mod cluster;

pub use cluster::{Cluster, ClusterError, Device, Link};

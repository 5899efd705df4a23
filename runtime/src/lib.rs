//! Execution of autopar graphs. This milestone holds the CPU reference
//! interpreter (`cpu`); lowering, the simulator and the CUDA backend come
//! with later work.
//!
//! Architecture invariant: the runtime executes what it is given; it never
//! re-plans or rewrites a graph.

pub mod autodiff;
pub mod cpu;

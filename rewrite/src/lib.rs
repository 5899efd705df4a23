//! Graph-to-graph clean-ups between import and planning: egg
//! canonicalisation turns exporter-specific primitive chains into the
//! canonical ops the planner shards (and marks causal attention, fuses
//! exported experts), and layer detection records the repeated transformer
//! blocks so the planner prices one layer and reuses it.
//!
//! Architecture invariant: every rewrite keeps the graph's outputs; the
//! result is re-typed through `Op::infer` and validated. `rewrite` depends on
//! `ir` only.

mod canonical;
mod layers;

pub use canonical::{canonicalize, compute_histogram, RewriteError, RewriteReport, COMPUTE_CLASSES};
pub use layers::detect_blocks;

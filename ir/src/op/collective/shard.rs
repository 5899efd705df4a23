//! Sharding rules of the communication ops: none beyond `replicate`. They
//! are what lowering inserts into per-rank graphs after sharding, so the
//! planner never shards them again.

use crate::op::define::misrouted;
use crate::op::sharding::{NodeView, Strategy};
use crate::op::Op;

/// Strategies of a communication op beyond `replicate`: none.
pub(in crate::op) fn strategies(op: &Op, _v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::Comm { .. } => vec![],
        other => misrouted(other, "communication"),
    }
}

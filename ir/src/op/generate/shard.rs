//! Sharding rules of shape queries and generators: none beyond
//! `replicate`. Their outputs are small index or shape tensors every rank
//! computes whole.

use crate::op::define::misrouted;
use crate::op::sharding::{NodeView, Strategy};
use crate::op::Op;

/// Strategies of a shape query or generator beyond `replicate`: none.
pub(in crate::op) fn strategies(op: &Op, _v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::Shape { .. } | Op::Size | Op::ConstantOfShape { .. } | Op::Range => vec![],
        other => misrouted(other, "generator"),
    }
}

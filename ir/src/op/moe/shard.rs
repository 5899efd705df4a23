//! Sharding rules of mixture-of-experts layers: the router by token, the
//! experts by expert, by each expert's hidden width, or by tokens.

use crate::op::define::misrouted;
use crate::op::sharding::{data_name, keep_dims, Layout, NodeView, Strategy};
use crate::op::Op;

/// Strategies of a mixture-of-experts op beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    match op {
        // Routing needs each token's whole row of expert logits.
        Op::MoeRouter { .. } => keep_dims(v, |j, r| j + 1 < r),
        Op::MoeExperts { .. } => experts(v),
        // The adjoint runs where its forward op ran, and expert parallelism's
        // bookkeeping is inserted after sharding: replicated only.
        Op::MoeExpertsGrad { .. } | Op::MoeSort { .. } | Op::MoeSlots { .. } => vec![],
        other => misrouted(other, "mixture-of-experts"),
    }
}

/// `MoeExperts(x[..., h], weights, indices, w_in[e, h, f], w_out[e, f, h], w_gate?)`:
/// by expert or by each expert's hidden width `f` (both leave partial
/// sums), or by tokens.
fn experts(v: &NodeView) -> Vec<Strategy> {
    let (Some(x), Some(w_in)) = (v.input(0), v.input(3)) else {
        return vec![];
    };
    let &[e, _, f] = w_in else { return vec![] };
    let mut all = Vec::new();
    let weights_in = |name: &str, w_in: Layout, w_out: Layout| {
        let inputs = v.slots(|i, _| match i {
            3 | 5 => w_in,
            4 => w_out,
            _ => Layout::Replicate,
        });
        Strategy::new(name, inputs, vec![Layout::Partial], v.tp)
    };
    if v.float_out && v.splits(e) {
        // Each rank runs its experts on every token's routes, the routes to
        // other ranks' experts masked, not skipped: the weights divide, the
        // work does not.
        let mut by_expert = weights_in("expert", Layout::Shard(0), Layout::Shard(0));
        by_expert.divisor = 1;
        all.push(by_expert);
    }
    if v.float_out && v.splits(f) {
        all.push(weights_in("ffn", Layout::Shard(2), Layout::Shard(1)));
    }
    let tokens = x.len().saturating_sub(1);
    for j in (0..tokens).filter(|&j| v.splits(x[j])) {
        let inputs = v.slots(|i, s| match i {
            0 => Layout::Shard(j),
            1 | 2 if s.len() == x.len() && s[j] == x[j] => Layout::Shard(j),
            _ => Layout::Replicate,
        });
        all.push(Strategy::new(data_name(j), inputs, vec![Layout::Shard(j)], v.tp));
    }
    all
}

//! Sharding rules of attention and rotary embeddings: by heads or by batch.

use crate::op::define::misrouted;
use crate::op::sharding::{aligned, Layout, NodeView, Strategy};
use crate::op::Op;

/// Strategies of an attention-family op beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::Attention { .. } => attention(v),
        Op::RotaryEmbedding { num_heads, .. } => rotary(v, *num_heads),
        // The adjoint runs where its forward op ran: replicated only.
        Op::AttentionGrad { .. } => vec![],
        other => misrouted(other, "attention"),
    }
}

/// `Attention(q[b, hq, sq, d], k[b, hk, sk, d], v, mask?, positions?)`: by
/// heads (both head counts divisible) or by batch; query positions are read
/// whole. Masks are never differentiated.
fn attention(v: &NodeView) -> Vec<Strategy> {
    let (Some(q), Some(k)) = (v.input(0), v.input(1)) else {
        return vec![];
    };
    let qkv_ok = (0..3).all(|i| v.input(i).is_some_and(|s| s.len() == 4));
    if !qkv_ok {
        return vec![];
    }
    let split = |name: &str, dim: usize| {
        let inputs = v.slots(|i, s| match i {
            0..=2 => Layout::Shard(dim),
            3 => aligned(s, 4, dim, q[dim]),
            _ => Layout::Replicate,
        });
        Strategy::new(name, inputs, vec![Layout::Shard(dim)], v.tp).grad(3, false)
    };
    let mut all = Vec::new();
    if v.splits(q[1]) && v.splits(k[1]) {
        all.push(split("heads", 1));
    }
    // Multi-query attention (one key/value head, as Falcon's): each rank
    // takes its query heads against the one key/value head, read whole
    // (its gradient a partial sum over the ranks' query heads).
    if v.splits(q[1]) && k[1] == 1 && q[1] > 1 {
        let inputs = v.slots(|i, s| match i {
            0 => Layout::Shard(1),
            3 => aligned(s, 4, 1, q[1]),
            _ => Layout::Replicate,
        });
        all.push(Strategy::new("query heads", inputs, vec![Layout::Shard(1)], v.tp).grad(3, false));
    }
    if v.splits(q[0]) {
        all.push(split("batch", 0));
    }
    all
}

/// `RotaryEmbedding(x, cos, sin, positions?)`: by heads (`x` 4-D, or 3-D
/// with `num_heads` packed in the last dim) or by batch.
fn rotary(v: &NodeView, num_heads: usize) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let heads_dim = match x.len() {
        4 if num_heads == 0 => Some((1, x[1])),
        3 if num_heads > 0 => Some((2, num_heads)),
        _ => None,
    };
    let mut all = Vec::new();
    if let Some((dim, _)) = heads_dim.filter(|&(_, h)| v.splits(h)) {
        let inputs = v.first_sharded(dim);
        all.push(Strategy::new("heads", inputs, vec![Layout::Shard(dim)], v.tp));
    }
    if x.len() >= 3 && v.splits(x[0]) {
        let inputs = v.slots(|i, s| match i {
            0 => Layout::Shard(0),
            3 => aligned(s, s.len(), 0, x[0]),
            _ => Layout::Replicate,
        });
        all.push(Strategy::new("batch", inputs, vec![Layout::Shard(0)], v.tp));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::{find, view};
    use Layout::*;

    #[test]
    fn attention_splits_heads_and_broadcasts_the_mask() {
        let q: &[usize] = &[2, 8, 16, 32];
        let kv: &[usize] = &[2, 4, 16, 32];
        let v = view(&[q, kv, kv, &[2, 1, 16, 16]], &[q], 4);
        let op = Op::Attention {
            scale: None,
            causal: true,
        };
        let all = strategies(&op, &v);
        let heads = find(&all, "heads");
        assert_eq!(
            heads.inputs,
            [Some(Shard(1)), Some(Shard(1)), Some(Shard(1)), Some(Replicate)]
        );
        assert!(!heads.grad_partial[3], "masks get no gradient");
        // Two ranks per batch entry only divide batch 2 when tp = 2.
        assert!(all.iter().all(|s| s.name != "batch"));
        let v = view(&[q, kv, kv, &[2, 1, 16, 16]], &[q], 2);
        let batch = find(&strategies(&op, &v), "batch").clone();
        assert_eq!(batch.inputs[3], Some(Shard(0)));
    }
}

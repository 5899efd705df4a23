//! Sharding rules of the movement ops: a sharded dim maps through to the
//! output dim that holds the same elements in the same blocks, and partial
//! sums pass through (these ops are linear in their data).

use crate::op::define::misrouted;
use crate::op::sharding::{aligned, moved, Layout, NodeView, Strategy};
use crate::op::Op;
use Layout::{Replicate, Shard};

/// Strategies of a movement op beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    let mut all = match op {
        Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } => view(v),
        Op::Transpose { perm } => transpose(v, perm.as_deref()),
        Op::Expand => expand(v),
        other => misrouted(other, "data-movement"),
    };
    all.extend(v.partial_through(&[0]));
    all
}

/// Pairs `(input dim, output dim)` of a reshape whose blocks coincide: dims
/// are grouped into runs with equal products, and the outermost non-unit
/// dim of an input run maps to the outermost non-unit dim of its output run
/// (`[b, s, h] → [b, s, heads, d]` maps `h` to `heads`).
fn view_dims(input: &[usize], output: &[usize]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < input.len() && j < output.len() {
        let (i0, j0) = (i, j);
        let (mut pi, mut pj) = (input[i] as u128, output[j] as u128);
        (i, j) = (i + 1, j + 1);
        while pi != pj {
            if pi < pj {
                let Some(&d) = input.get(i) else { return pairs };
                (pi, i) = (pi.saturating_mul(d as u128), i + 1);
            } else {
                let Some(&d) = output.get(j) else { return pairs };
                (pj, j) = (pj.saturating_mul(d as u128), j + 1);
            }
        }
        let a = (i0..i).find(|&k| input[k] != 1);
        let b = (j0..j).find(|&k| output[k] != 1);
        if let (Some(a), Some(b)) = (a, b) {
            pairs.push((a, b));
        }
    }
    pairs
}

/// `Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`: through [`view_dims`].
fn view(v: &NodeView) -> Vec<Strategy> {
    let (Some(x), Some(out)) = (v.input(0), v.out()) else {
        return vec![];
    };
    view_dims(x, out)
        .into_iter()
        .filter(|&(i, o)| v.splits(x[i]) && v.splits(out[o]))
        .map(|(i, o)| moved(v, i, o))
        .collect()
}

/// `Transpose`: output dim `j` is input dim `perm[j]`.
fn transpose(v: &NodeView, perm: Option<&[usize]>) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let perm: Vec<usize> = perm.map_or_else(|| (0..x.len()).rev().collect(), <[usize]>::to_vec);
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..x.len()).collect::<Vec<_>>() {
        return vec![];
    }
    (0..x.len())
        .filter(|&j| v.splits(x[perm[j]]))
        .map(|j| moved(v, perm[j], j))
        .collect()
}

/// `Expand`: a dim the input has at full size stays sharded; a broadcast
/// dim is sharded by each rank materialising its block.
fn expand(v: &NodeView) -> Vec<Strategy> {
    let (Some(x), Some(out)) = (v.input(0), v.out()) else {
        return vec![];
    };
    (0..out.len())
        .filter(|&j| v.splits(out[j]))
        .map(|j| {
            let inputs = v.slots(|i, _| {
                if i == 0 {
                    aligned(x, out.len(), j, out[j])
                } else {
                    Replicate
                }
            });
            Strategy::new(format!("dim{j}"), inputs, v.all_out(Shard(j)), v.tp)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::{layouts, view as node};
    use Layout::Partial;

    #[test]
    fn reshape_maps_the_outermost_dim_of_each_run() {
        assert_eq!(
            view_dims(&[2, 16, 128], &[2, 16, 4, 32]),
            [(0, 0), (1, 1), (2, 2)]
        );
        assert_eq!(view_dims(&[2, 16, 4, 32], &[32, 128]), [(0, 0), (2, 1)]);
        assert_eq!(view_dims(&[64, 128], &[64, 128, 1]), [(0, 0), (1, 1)]);
        assert_eq!(view_dims(&[1, 64], &[64]), [(1, 0)]);
        assert_eq!(
            view_dims(&[6, 4], &[4, 6]),
            [(0, 0)],
            "the same contiguous blocks"
        );
        assert_eq!(view_dims(&[0, 3], &[3]), []);
    }

    #[test]
    fn heads_reshape_keeps_the_hidden_shard_on_heads() {
        // Batch 2 is too small for 4 ranks; 16 tokens and 4 heads split.
        let v = node(&[&[2, 16, 128], &[4]], &[&[2, 16, 4, 32]], 4);
        let all = strategies(&Op::Reshape { allowzero: false }, &v);
        assert_eq!(
            layouts(&all),
            [
                ("replicate", Some(Replicate), Replicate),
                ("dim1", Some(Shard(1)), Shard(1)),
                ("dim2", Some(Shard(2)), Shard(2)),
                ("partial", Some(Partial), Partial),
            ]
        );
        assert_eq!(all[2].inputs[1], Some(Replicate), "the shape input stays whole");
    }
}

//! Sharding rules of concatenation, splits and slices: any dim the op does
//! not cut, and the cut axis itself where every piece divides; partial sums
//! pass through (these ops are linear in their data).

use crate::op::define::misrouted;
use crate::op::sharding::{axis, keep_dims, moved, Layout, NodeView, Strategy};
use crate::op::Op;

/// Strategies of a concatenation, split, slice or triangle beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    let (mut all, data) = match op {
        Op::Split { axis, .. } => (split(v, *axis), vec![0]),
        Op::Concat { axis } => (concat(v, *axis), (0..v.inputs.len()).collect()),
        Op::Slice => (slice(v), vec![0]),
        Op::Trilu { .. } => (keep_dims(v, |j, rank| j + 2 < rank), vec![0]),
        other => misrouted(other, "slicing"),
    };
    all.extend(v.partial_through(&data));
    all
}

/// `Split`: any other dim; the split axis itself when every piece divides,
/// each rank then holding a block of every piece (as Megatron-LM lays out
/// its fused QKV weight).
fn split(v: &NodeView, split_axis: i64) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let Some(a) = axis(split_axis, x.len()) else {
        return vec![];
    };
    if v.outputs.iter().any(|o| o.len() != x.len()) {
        return vec![];
    }
    (0..x.len())
        .filter(|&j| match j == a {
            true => v.outputs.iter().all(|o| v.splits(o[a])),
            false => v.splits(x[j]),
        })
        .map(|j| moved(v, j, j))
        .collect()
}

/// `Concat`: the inverse of [`split`].
fn concat(v: &NodeView, concat_axis: i64) -> Vec<Strategy> {
    let Some(out) = v.out() else { return vec![] };
    let Some(a) = axis(concat_axis, out.len()) else {
        return vec![];
    };
    let all_fit = |j: usize| {
        v.inputs
            .iter()
            .all(|s| s.as_ref().is_some_and(|s| s.len() == out.len() && v.splits(s[j])))
    };
    (0..out.len())
        .filter(|&j| (j == a || v.splits(out[j])) && all_fit(j))
        .map(|j| {
            let inputs = v.slots(|_, _| Layout::Shard(j));
            Strategy::new(format!("dim{j}"), inputs, vec![Layout::Shard(j)], v.tp)
        })
        .collect()
}

/// `Slice(x, starts, ends, axes?, steps?)`: dims it does not slice.
fn slice(v: &NodeView) -> Vec<Strategy> {
    let (Some(x), Some(out)) = (v.input(0), v.out()) else {
        return vec![];
    };
    let sliced: Vec<usize> = match (v.input(3), v.ints(3), v.input(1)) {
        (Some(_), Some(axes), _) => axes.iter().filter_map(|&a| axis(a, x.len())).collect(),
        (None, _, Some(starts)) => (0..starts.first().copied().unwrap_or(0)).collect(),
        _ => return vec![],
    };
    if out.len() != x.len() {
        return vec![];
    }
    (0..x.len())
        .filter(|j| !sliced.contains(j) && x[*j] == out[*j] && v.splits(x[*j]))
        .map(|j| moved(v, j, j))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::view as node;

    #[test]
    fn slice_keeps_unsliced_dims() {
        let axes = crate::Value::i64(vec![1], vec![-1]).unwrap();
        let mut v = node(&[&[2, 4, 16, 32], &[1], &[1], &[1], &[1]], &[&[2, 4, 16, 16]], 2);
        v.values[3] = Some(&axes);
        let all = strategies(&Op::Slice, &v);
        let names: Vec<_> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["replicate", "dim0", "dim1", "dim2", "partial"]);
    }
}

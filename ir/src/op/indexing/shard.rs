//! Sharding rules of the gathers and embeddings: a data dim other than the
//! gathered one, or an index dim; embeddings also by vocabulary (partial
//! output) or hidden width. Partial sums pass through the gathers (they
//! are linear in their data).

use crate::op::define::misrouted;
use crate::op::sharding::{axis, data_name, moved, Layout, NodeView, Strategy};
use crate::op::Op;
use Layout::{Replicate, Shard};

/// Strategies of an indexing op beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    let mut all = match op {
        Op::Gather { axis } => gather(v, *axis),
        Op::GatherNd { batch_dims: 0 } => gather_nd(v),
        Op::Embedding => return embedding(v),
        // Replicated only: gathers along index data, gathers with batch
        // dims, and the scatter-adds (adjoints run where their forward op ran).
        Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. } => return vec![],
        other => misrouted(other, "indexing"),
    };
    all.extend(v.partial_through(&[0]));
    all
}

/// `Gather(data, indices)` on `axis`: a data dim other than the axis, or an
/// index dim.
fn gather(v: &NodeView, gather_axis: i64) -> Vec<Strategy> {
    let (Some(data), Some(idx), Some(out)) = (v.input(0), v.input(1), v.out()) else {
        return vec![];
    };
    let Some(a) = axis(gather_axis, data.len()) else {
        return vec![];
    };
    if out.len() + 1 != data.len() + idx.len() {
        return vec![];
    }
    let mut all: Vec<Strategy> = (0..data.len())
        .filter(|&j| j != a && v.splits(data[j]))
        .map(|j| moved(v, j, if j < a { j } else { j + idx.len() - 1 }))
        .collect();
    all.extend(by_index(v, idx.len(), a));
    all
}

/// `GatherNd(data, indices[..., q])` without batch dims: a leading index
/// dim, or a data dim past the `q` indexed ones.
fn gather_nd(v: &NodeView) -> Vec<Strategy> {
    let (Some(data), Some(idx), Some(out)) = (v.input(0), v.input(1), v.out()) else {
        return vec![];
    };
    let Some((&q, lead)) = idx.split_last() else {
        return vec![];
    };
    if q > data.len() || out.len() != lead.len() + data.len() - q {
        return vec![];
    }
    let mut all: Vec<Strategy> = (q..data.len())
        .filter(|&j| v.splits(data[j]))
        .map(|j| moved(v, j, lead.len() + j - q))
        .collect();
    all.extend(by_index(v, lead.len(), 0));
    all
}

/// Gathers split along index dim `j < dims`, landing on output dim `at + j`.
fn by_index(v: &NodeView, dims: usize, at: usize) -> Vec<Strategy> {
    let Some(idx) = v.input(1) else { return vec![] };
    (0..dims)
        .filter(|&j| v.splits(idx[j]))
        .map(|j| {
            let inputs = v.slots(|i, _| if i == 1 { Shard(j) } else { Replicate });
            Strategy::new(format!("dim{}", at + j), inputs, v.all_out(Shard(at + j)), v.tp)
        })
        .collect()
}

/// `Embedding(table[vocab, hidden], ids)`: vocabulary-parallel (partial
/// output), hidden-parallel, or a split of the ids.
fn embedding(v: &NodeView) -> Vec<Strategy> {
    let (Some(table), Some(ids)) = (v.input(0), v.input(1)) else {
        return vec![];
    };
    let &[vocab, hidden] = table else { return vec![] };
    let mut all = Vec::new();
    let with_table = |name: String, table: Layout, ids: Layout, out: Layout| {
        let inputs = v.slots(|i, _| if i == 0 { table } else { ids });
        Strategy::new(name, inputs, vec![out], v.tp)
    };
    if v.splits(vocab) && v.float_out {
        all.push(with_table("vocab".into(), Shard(0), Replicate, Layout::Partial));
    }
    if v.splits(hidden) {
        let out = Shard(ids.len());
        all.push(with_table("hidden".into(), Shard(1), Replicate, out));
    }
    for j in (0..ids.len()).filter(|&j| v.splits(ids[j])) {
        all.push(with_table(data_name(j), Replicate, Shard(j), Shard(j)));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::{layouts, view as node};

    #[test]
    fn gathers_split_data_or_indices() {
        let v = node(&[&[4, 128, 256], &[64, 1]], &[&[64, 128, 256]], 2);
        let all = strategies(&Op::GatherNd { batch_dims: 0 }, &v);
        let names: Vec<_> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["replicate", "dim1", "dim2", "dim0", "partial"]);
        let v = node(&[&[100, 64], &[2, 16]], &[&[2, 16, 64]], 2);
        let all = strategies(&Op::Gather { axis: 0 }, &v);
        assert!(layouts(&all).contains(&("dim2", Some(Shard(1)), Shard(2))));
        assert!(layouts(&all).contains(&("dim0", Some(Replicate), Shard(0))));
    }
}

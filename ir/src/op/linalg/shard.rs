//! Sharding rules of the linear layers and matrix products: column (the
//! output features), row (the contracted dim, leaving partial sums) and
//! data splits.

use crate::op::define::misrouted;
use crate::op::sharding::{aligned, data_name, Layout, NodeView, Strategy};
use crate::op::Op;

/// Strategies of a product beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::Linear => linear(v),
        Op::MatMul => matmul(v),
        Op::Gemm { trans_a, trans_b, .. } => gemm(v, *trans_a, *trans_b),
        other => misrouted(other, "linear-algebra"),
    }
}

/// `Linear(x[..., k], w[k, n], b[n]?)`: column (`n`), row (`k`, output a
/// partial sum, bias added once), or a split of any data dim of `x`.
fn linear(v: &NodeView) -> Vec<Strategy> {
    let (Some(x), Some(w)) = (v.input(0), v.input(1)) else {
        return vec![];
    };
    let (&[k, n], Some(last)) = (w, x.len().checked_sub(1)) else {
        return vec![];
    };
    let mut all = Vec::new();
    if v.splits(n) {
        let inputs = v.slots(|i, s| match i {
            0 => Layout::Replicate,
            1 => Layout::Shard(1),
            _ => aligned(s, x.len(), last, n),
        });
        all.push(Strategy::new("column", inputs, vec![Layout::Shard(last)], v.tp));
    }
    if v.splits(k) {
        let inputs = v.slots(|i, _| match i {
            0 => Layout::Shard(last),
            1 => Layout::Shard(0),
            _ => Layout::Replicate,
        });
        all.push(Strategy::new("row", inputs, vec![Layout::Partial], v.tp).grad(2, false));
    }
    for j in (0..last).filter(|&j| v.splits(x[j])) {
        let inputs = v.first_sharded(j);
        all.push(Strategy::new(data_name(j), inputs, vec![Layout::Shard(j)], v.tp));
    }
    all
}

/// `MatMul(a[..., m, k], b[..., k, n])` with both operands at least 2-D:
/// column (`n`), row (`k`), rows of `a` (`m`), or a batch dim.
fn matmul(v: &NodeView) -> Vec<Strategy> {
    let (Some(a), Some(b), Some(out)) = (v.input(0), v.input(1), v.out()) else {
        return vec![];
    };
    let (ra, rb, ro) = (a.len(), b.len(), out.len());
    if ra < 2 || rb < 2 || ro < 2 {
        return vec![];
    }
    let (m, k, n) = (a[ra - 2], a[ra - 1], b[rb - 1]);
    let mut all = Vec::new();
    let two = |name: String, la: Layout, lb: Layout, lo: Layout| {
        Strategy::new(name, vec![Some(la), Some(lb)], vec![lo], v.tp)
    };
    if v.splits(n) {
        all.push(two(
            "column".into(),
            Layout::Replicate,
            Layout::Shard(rb - 1),
            Layout::Shard(ro - 1),
        ));
    }
    if v.splits(k) {
        all.push(two(
            "row".into(),
            Layout::Shard(ra - 1),
            Layout::Shard(rb - 2),
            Layout::Partial,
        ));
    }
    if v.splits(m) {
        all.push(two(
            data_name(ro - 2),
            Layout::Shard(ra - 2),
            Layout::Replicate,
            Layout::Shard(ro - 2),
        ));
    }
    for j in (0..ro - 2).filter(|&j| v.splits(out[j])) {
        let (la, lb) = (aligned(a, ro, j, out[j]), aligned(b, ro, j, out[j]));
        all.push(two(data_name(j), la, lb, Layout::Shard(j)));
    }
    all
}

/// `Gemm(a, b, c?)` on 2-D operands, transposes honoured.
fn gemm(v: &NodeView, trans_a: bool, trans_b: bool) -> Vec<Strategy> {
    let (Some(a), Some(b)) = (v.input(0), v.input(1)) else {
        return vec![];
    };
    if a.len() != 2 || b.len() != 2 {
        return vec![];
    }
    let (a_m, a_k) = if trans_a { (1, 0) } else { (0, 1) };
    let (b_k, b_n) = if trans_b { (1, 0) } else { (0, 1) };
    let (m, k, n) = (a[a_m], a[a_k], b[b_n]);
    let mut all = Vec::new();
    let three = |name: &str, la: Layout, lb: Layout, out_dim: Option<usize>, size: usize| {
        let inputs = v.slots(|i, s| match (i, out_dim) {
            (0, _) => la,
            (1, _) => lb,
            (_, Some(d)) => aligned(s, 2, d, size),
            (_, None) => Layout::Replicate,
        });
        let out = out_dim.map_or(Layout::Partial, Layout::Shard);
        Strategy::new(name, inputs, vec![out], v.tp)
    };
    if v.splits(n) {
        all.push(three("column", Layout::Replicate, Layout::Shard(b_n), Some(1), n));
    }
    if v.splits(k) {
        all.push(three("row", Layout::Shard(a_k), Layout::Shard(b_k), None, k).grad(2, false));
    }
    if v.splits(m) {
        all.push(three("batch", Layout::Shard(a_m), Layout::Replicate, Some(0), m));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::{find, names, view};
    use Layout::*;

    #[test]
    fn linear_has_column_row_and_data_splits() {
        let v = view(&[&[4, 16, 64], &[64, 256], &[256]], &[&[4, 16, 256]], 4);
        let all = strategies(&Op::Linear, &v);
        assert_eq!(names(&all), ["replicate", "column", "row", "batch", "dim1"]);
        let col = find(&all, "column");
        assert_eq!(col.inputs, [Some(Replicate), Some(Shard(1)), Some(Shard(0))]);
        assert_eq!(
            (col.outputs.as_slice(), col.grad_partial[0]),
            (&[Shard(2)][..], true)
        );
        let row = find(&all, "row");
        assert_eq!(row.inputs, [Some(Shard(2)), Some(Shard(0)), Some(Replicate)]);
        assert_eq!((row.outputs[0], row.grad_partial[2]), (Partial, false));
        let batch = find(&all, "batch");
        // Data parallel inside the group: the weight's gradient is a partial sum.
        assert_eq!((batch.inputs[1], batch.grad_partial[1]), (Some(Replicate), true));
    }

    #[test]
    fn only_divisible_dims_are_sharded_and_tp_one_replicates() {
        let mut v = view(&[&[3, 5, 6], &[6, 9]], &[&[3, 5, 9]], 2);
        v.inputs.push(None);
        v.values.push(None);
        assert_eq!(names(&strategies(&Op::Linear, &v)), ["replicate", "row"]);
        let v = view(&[&[4, 8], &[8, 8]], &[&[4, 8]], 1);
        assert_eq!(names(&strategies(&Op::Linear, &v)), ["replicate"]);
    }

    #[test]
    fn matmul_of_activations_splits_batch_dims() {
        let v = view(&[&[2, 4, 16, 32], &[2, 4, 32, 16]], &[&[2, 4, 16, 16]], 2);
        let all = strategies(&Op::MatMul, &v);
        assert_eq!(
            names(&all),
            ["replicate", "column", "row", "dim2", "batch", "dim1"]
        );
        assert_eq!(find(&all, "dim1").inputs, [Some(Shard(1)), Some(Shard(1))]);
    }
}

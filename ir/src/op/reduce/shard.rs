//! Sharding rules of the reductions: shard a dim the op keeps (mapped to
//! its output position); a sum or mean over a sharded dim leaves each rank
//! a partial sum.

use crate::op::define::misrouted;
use crate::op::sharding::{axis, keep_dims, Layout, NodeView, Strategy};
use crate::op::{Op, ReduceKind};

/// Strategies of a reduction beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes,
        } => reduce(v, *kind, axes.as_deref(), *keepdims, *noop_with_empty_axes),
        Op::ArgMax {
            axis: a, keepdims, ..
        } => match v.input(0).and_then(|x| axis(*a, x.len())) {
            Some(a) => reduced(v, &[a], *keepdims),
            None => vec![],
        },
        Op::TopK { axis: a, .. } => keep_dims(v, |j, r| Some(j) != axis(*a, r)),
        Op::CumSum { .. } => match v.ints(1).and_then(|a| a.first().copied()) {
            Some(a) => keep_dims(v, |j, r| Some(j) != axis(a, r)),
            None => vec![],
        },
        other => misrouted(other, "reduction"),
    }
}

/// `Reduce`: the reduced axes from the attribute or the constant input.
fn reduce(
    v: &NodeView,
    kind: ReduceKind,
    attr: Option<&[i64]>,
    keepdims: bool,
    noop_with_empty_axes: bool,
) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let given = match attr {
        Some(a) => Some(a),
        None if v.input(1).is_some() => match v.ints(1) {
            Some(a) => Some(a),
            None => return vec![],
        },
        None => None,
    };
    let axes: Option<Vec<usize>> = match given {
        Some(a) if !a.is_empty() => a.iter().map(|&a| axis(a, x.len())).collect(),
        _ if noop_with_empty_axes => return keep_dims(v, |_, _| true),
        _ => Some((0..x.len()).collect()),
    };
    let Some(axes) = axes else { return vec![] };
    let mut all = reduced(v, &axes, keepdims);
    if matches!(kind, ReduceKind::Sum | ReduceKind::Mean) && v.float_out {
        // Summing a sharded dim leaves each rank a partial sum.
        for &j in axes.iter().filter(|&&j| v.splits(x[j])) {
            let inputs = v.first_sharded(j);
            all.push(Strategy::new(
                format!("reduce{j}"),
                inputs,
                v.all_out(Layout::Partial),
                v.tp,
            ));
        }
        all.extend(v.partial_through(&[0]));
    }
    all
}

/// Reductions over `axes`: shard a kept dim, mapped to its output position.
fn reduced(v: &NodeView, axes: &[usize], keepdims: bool) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    (0..x.len())
        .filter(|j| !axes.contains(j) && v.splits(x[*j]))
        .map(|j| {
            let out = if keepdims {
                j
            } else {
                j - axes.iter().filter(|&&a| a < j).count()
            };
            let inputs = v.first_sharded(j);
            Strategy::new(format!("dim{j}"), inputs, v.all_out(Layout::Shard(out)), v.tp)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::{find, names, view};
    use Layout::*;

    #[test]
    fn sum_over_a_sharded_dim_is_partial() {
        let op = Op::Reduce {
            kind: ReduceKind::Sum,
            axes: Some(vec![-2]),
            keepdims: false,
            noop_with_empty_axes: false,
        };
        let v = view(&[&[32, 2, 128]], &[&[32, 128]], 2);
        let all = strategies(&op, &v);
        assert_eq!(names(&all), ["replicate", "dim0", "dim2", "reduce1", "partial"]);
        assert_eq!(find(&all, "dim2").outputs, [Shard(1)]);
        assert_eq!(find(&all, "reduce1").outputs, [Partial]);
    }
}

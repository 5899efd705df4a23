//! Sharding rules of convolutions and pools: by samples (data parallel
//! inside the op), by output channels (each rank its filters: the
//! column-parallel analogue), by input channels (each rank a partial sum:
//! the row-parallel analogue), and by groups when every group is whole on
//! one rank (depthwise). Pools run per channel. Splitting the spatial dims
//! would need halo exchanges, which no rule offers.

use crate::op::define::misrouted;
use crate::op::sharding::{data_name, Layout, NodeView, Strategy};
use crate::op::Op;

/// Strategies of a convolution-family op beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::Conv { groups, .. } => conv(v, *groups, false),
        Op::ConvTranspose { groups, .. } => conv(v, *groups, true),
        Op::Pool { .. } => pool(v),
        // The adjoints run where their forward op ran: replicated only.
        Op::ConvGrad { .. } | Op::PoolGrad { .. } => vec![],
        other => misrouted(other, "convolution"),
    }
}

/// `Conv(x[n, c, ...], w[m, c/g, ...], b[m]?)` or `ConvTranspose(x[n, c, ...],
/// w[c, m/g, ...], b[m]?)`. `filters` and `reads` are the weight dims that
/// hold the output and the input channels.
fn conv(v: &NodeView, groups: usize, transpose: bool) -> Vec<Strategy> {
    let (Some(x), Some(w), Some(y)) = (v.input(0), v.input(1), v.out()) else {
        return vec![];
    };
    let (filters, reads) = if transpose { (1, 0) } else { (0, 1) };
    let bias = v.input(2).is_some();
    let mut all = Vec::new();
    if v.splits(x[0]) {
        all.push(Strategy::new(
            data_name(0),
            v.first_sharded(0),
            vec![Layout::Shard(0)],
            v.tp,
        ));
    }
    if groups == 1 && v.splits(y[1]) {
        let inputs = v.slots(|i, _| match i {
            0 => Layout::Replicate,
            1 => Layout::Shard(filters),
            _ => Layout::Shard(0),
        });
        all.push(Strategy::new("filters", inputs, vec![Layout::Shard(1)], v.tp));
    }
    // A partial sum cannot take the bias once per rank: only without one.
    if groups == 1 && !bias && v.float_out && v.splits(x[1]) {
        let inputs = v.slots(|i, _| match i {
            0 => Layout::Shard(1),
            _ => Layout::Shard(reads),
        });
        all.push(Strategy::new("channels", inputs, vec![Layout::Partial], v.tp));
    }
    // Whole groups per rank: input channels, weight rows and output
    // channels all split in the same group blocks.
    if groups > 1 && v.splits(groups) && w.first().is_some_and(|&n| v.splits(n)) {
        let inputs = v.slots(|i, _| match i {
            0 => Layout::Shard(1),
            _ => Layout::Shard(0),
        });
        all.push(Strategy::new("groups", inputs, vec![Layout::Shard(1)], v.tp));
    }
    all
}

/// `Pool(x[n, c, ...])`: each sample and channel pools on its own.
fn pool(v: &NodeView) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    (0..2)
        .filter(|&j| v.splits(x[j]))
        .map(|j| Strategy::new(data_name(j), v.first_sharded(j), vec![Layout::Shard(j)], v.tp))
        .collect()
}

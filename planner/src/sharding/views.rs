//! Sharding rules of movement and indexing ops: a sharded dim maps through
//! to the output dim that holds the same elements in the same blocks, and
//! partial sums pass through (these ops are linear in their data).

use super::rules::{aligned, axis, keep_dims, Layout, NodeView, Strategy};
use autopar_ir::Op;
use Layout::{Replicate, Shard};

/// Strategies of the movement and indexing ops (none for other ops).
pub(super) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    let mut all = match op {
        Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } => view(v),
        Op::Transpose { perm } => transpose(v, perm.as_deref()),
        Op::Expand => expand(v),
        Op::Split { axis, .. } => split(v, *axis),
        Op::Concat { axis } => concat(v, *axis),
        Op::Slice => slice(v),
        Op::Trilu { .. } => keep_dims(v, |j, rank| j + 2 < rank),
        Op::Gather { axis } => gather(v, *axis),
        Op::GatherNd { batch_dims: 0 } => gather_nd(v),
        _ => return vec![],
    };
    let data: Vec<usize> = match op {
        Op::Concat { .. } => (0..v.inputs.len()).collect(),
        _ => vec![0],
    };
    all.extend(v.partial_through(&data));
    all
}

/// Input 0 sharded on `input_dim`, the other inputs replicated, every
/// output sharded on `output_dim`.
fn moved(v: &NodeView, input_dim: usize, output_dim: usize) -> Strategy {
    let inputs = v.slots(|i, _| if i == 0 { Shard(input_dim) } else { Replicate });
    Strategy::new(
        format!("dim{output_dim}"),
        inputs,
        v.all_out(Shard(output_dim)),
        v.tp,
    )
}

/// Pairs `(input dim, output dim)` of a reshape whose blocks coincide: dims
/// are grouped into runs with equal products, and the outermost non-unit
/// dim of an input run maps to the outermost non-unit dim of its output run
/// (`[b, s, h] → [b, s, heads, d]` maps `h` to `heads`).
pub(super) fn view_dims(input: &[usize], output: &[usize]) -> Vec<(usize, usize)> {
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
            let inputs = v.slots(|_, _| Shard(j));
            Strategy::new(format!("dim{j}"), inputs, vec![Shard(j)], v.tp)
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

#[cfg(test)]
mod tests {
    use super::super::rules::{strategies as all_strategies, tests::view as node};
    use super::*;
    use Layout::Partial;

    fn layouts(all: &[Strategy]) -> Vec<(&str, Option<Layout>, Layout)> {
        all.iter()
            .map(|s| (s.name.as_str(), s.inputs[0], s.outputs[0]))
            .collect()
    }

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
        let all = all_strategies(&Op::Reshape { allowzero: false }, &v);
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

    #[test]
    fn transpose_permutes_and_split_keeps_the_fused_axis() {
        let v = node(&[&[2, 16, 4, 32]], &[&[2, 4, 16, 32]], 4);
        let t = Op::Transpose {
            perm: Some(vec![0, 2, 1, 3]),
        };
        let all = all_strategies(&t, &v);
        assert!(layouts(&all).contains(&("dim1", Some(Shard(2)), Shard(1))));
        let piece: &[usize] = &[2, 16, 128];
        let v = node(&[&[2, 16, 384]], &[piece; 3], 4);
        let s = Op::Split {
            axis: -1,
            split: None,
            outputs: 3,
        };
        let all = all_strategies(&s, &v);
        let fused = all.iter().find(|s| s.name == "dim2").unwrap();
        assert_eq!(fused.outputs, [Shard(2); 3]);
    }

    #[test]
    fn gathers_split_data_or_indices() {
        let v = node(&[&[4, 128, 256], &[64, 1]], &[&[64, 128, 256]], 2);
        let all = all_strategies(&Op::GatherNd { batch_dims: 0 }, &v);
        let names: Vec<_> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["replicate", "dim1", "dim2", "dim0", "partial"]);
        let v = node(&[&[100, 64], &[2, 16]], &[&[2, 16, 64]], 2);
        let all = all_strategies(&Op::Gather { axis: 0 }, &v);
        assert!(layouts(&all).contains(&("dim2", Some(Shard(1)), Shard(2))));
        assert!(layouts(&all).contains(&("dim0", Some(Replicate), Shard(0))));
    }

    #[test]
    fn slice_keeps_unsliced_dims() {
        let axes = autopar_ir::Value::i64(vec![1], vec![-1]).unwrap();
        let mut v = node(&[&[2, 4, 16, 32], &[1], &[1], &[1], &[1]], &[&[2, 4, 16, 16]], 2);
        v.values[3] = Some(&axes);
        let all = all_strategies(&Op::Slice, &v);
        let names: Vec<_> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["replicate", "dim0", "dim1", "dim2", "partial"]);
    }
}

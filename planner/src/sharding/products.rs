//! Sharding rules of products and the ops built around them: linear
//! layers and matrix products (column, row, data splits), attention and
//! rotary embeddings (heads, batch), embeddings (vocabulary, hidden, ids)
//! and mixture-of-experts layers (experts, expert width, tokens).

use super::rules::{aligned, Layout, NodeView, Strategy};

/// Name of a split along a data dim of a product: `batch` for the outermost.
fn data_name(dim: usize) -> String {
    if dim == 0 {
        "batch".into()
    } else {
        format!("dim{dim}")
    }
}

/// `Linear(x[..., k], w[k, n], b[n]?)`: column (`n`), row (`k`, output a
/// partial sum, bias added once), or a split of any data dim of `x`.
pub(super) fn linear(v: &NodeView) -> Vec<Strategy> {
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
        let inputs = v.slots(|i, _| {
            if i == 0 {
                Layout::Shard(j)
            } else {
                Layout::Replicate
            }
        });
        all.push(Strategy::new(data_name(j), inputs, vec![Layout::Shard(j)], v.tp));
    }
    all
}

/// `MatMul(a[..., m, k], b[..., k, n])` with both operands at least 2-D:
/// column (`n`), row (`k`), rows of `a` (`m`), or a batch dim.
pub(super) fn matmul(v: &NodeView) -> Vec<Strategy> {
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
pub(super) fn gemm(v: &NodeView, trans_a: bool, trans_b: bool) -> Vec<Strategy> {
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

/// `Attention(q[b, hq, sq, d], k[b, hk, sk, d], v, mask?)`: by heads (both
/// head counts divisible) or by batch. Masks are never differentiated.
pub(super) fn attention(v: &NodeView) -> Vec<Strategy> {
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
            _ => aligned(s, 4, dim, q[dim]),
        });
        Strategy::new(name, inputs, vec![Layout::Shard(dim)], v.tp).grad(3, false)
    };
    let mut all = Vec::new();
    if v.splits(q[1]) && v.splits(k[1]) {
        all.push(split("heads", 1));
    }
    if v.splits(q[0]) {
        all.push(split("batch", 0));
    }
    all
}

/// `RotaryEmbedding(x, cos, sin, positions?)`: by heads (`x` 4-D, or 3-D
/// with `num_heads` packed in the last dim) or by batch.
pub(super) fn rotary(v: &NodeView, num_heads: usize) -> Vec<Strategy> {
    let Some(x) = v.input(0) else { return vec![] };
    let heads_dim = match x.len() {
        4 if num_heads == 0 => Some((1, x[1])),
        3 if num_heads > 0 => Some((2, num_heads)),
        _ => None,
    };
    let mut all = Vec::new();
    if let Some((dim, _)) = heads_dim.filter(|&(_, h)| v.splits(h)) {
        let inputs = v.slots(|i, _| {
            if i == 0 {
                Layout::Shard(dim)
            } else {
                Layout::Replicate
            }
        });
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

/// `Embedding(table[vocab, hidden], ids)`: vocabulary-parallel (partial
/// output), hidden-parallel, or a split of the ids.
pub(super) fn embedding(v: &NodeView) -> Vec<Strategy> {
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
        all.push(with_table(
            "vocab".into(),
            Layout::Shard(0),
            Layout::Replicate,
            Layout::Partial,
        ));
    }
    if v.splits(hidden) {
        let out = Layout::Shard(ids.len());
        all.push(with_table(
            "hidden".into(),
            Layout::Shard(1),
            Layout::Replicate,
            out,
        ));
    }
    for j in (0..ids.len()).filter(|&j| v.splits(ids[j])) {
        all.push(with_table(
            data_name(j),
            Layout::Replicate,
            Layout::Shard(j),
            Layout::Shard(j),
        ));
    }
    all
}

/// `MoeExperts(x[..., h], weights, indices, w_in[e, h, f], w_out[e, f, h], w_gate?)`:
/// by expert or by each expert's hidden width `f` (both leave partial
/// sums), or by tokens.
pub(super) fn experts(v: &NodeView) -> Vec<Strategy> {
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
        all.push(weights_in("expert", Layout::Shard(0), Layout::Shard(0)));
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

#[cfg(test)]
mod tests {
    use super::super::rules::strategies;
    use super::super::rules::tests::{find, names, view};
    use super::*;
    use autopar_ir::Op;
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

    #[test]
    fn embedding_and_experts() {
        let v = view(&[&[100, 64], &[2, 16]], &[&[2, 16, 64]], 2);
        let all = strategies(&Op::Embedding, &v);
        assert_eq!(names(&all), ["replicate", "vocab", "hidden", "batch", "dim1"]);
        assert_eq!(find(&all, "hidden").outputs, [Shard(2)]);
        let x: &[usize] = &[2, 16, 64];
        let v = view(
            &[
                x,
                &[2, 16, 2],
                &[2, 16, 2],
                &[8, 64, 128],
                &[8, 128, 64],
                &[8, 64, 128],
            ],
            &[x],
            4,
        );
        let op = Op::MoeExperts {
            activation: autopar_ir::Activation::Silu,
        };
        let all = strategies(&op, &v);
        assert_eq!(names(&all), ["replicate", "expert", "ffn", "dim1"]);
        assert_eq!(find(&all, "ffn").inputs[4], Some(Shard(1)));
        assert_eq!(find(&all, "dim1").inputs[1], Some(Shard(1)));
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

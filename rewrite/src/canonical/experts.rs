//! Fusing exported mixture-of-experts MLPs into `MoeExperts`.
//!
//! Hugging Face's Mixtral with batched expert kernels computes its experts
//! densely per routed slot: every token is repeated `k` times, each copy
//! gathers its expert's stacked gate/up and down weights, runs two batched
//! matrix-vector products around the gated activation, is scaled by its
//! routing weight, and the `k` copies are summed. The two exporters spell
//! the steps differently (dynamo: `Expand`, `GatherNd`, `Split`; the legacy
//! exporter: `Tile`, `Gather` along the expert axis, two `Slice`s), and
//! both are matched. That chain of views,
//! gathers and batched matmuls is not something a planner can shard, so this
//! pass replaces it with one `MoeExperts` node. Its expert weights come from
//! the exported ones through weight-only nodes (`Slice` of the stacked
//! gate/up rows, `Transpose` to `[e, in, out]`), so the parameters and the
//! computed values stay the same.
//!
//! Matching follows dataflow, op kinds and fixed shapes, never names. Views
//! (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`) keep row-major element
//! order, so any chain of them between two matched tensors is accepted.
//! Intermediate values read elsewhere stay computed; only nodes left dead by
//! the fusion are removed.

use super::RewriteError;
use autopar_ir::op::{Activation, BinaryOp, GeluApprox, Op, ReduceKind, TensorType, UnaryOp};
use autopar_ir::{DType, Data, Graph, NodeIndex, Role, Shape, TensorId, Value};
use std::collections::HashSet;

/// One expert computation found in the graph.
#[derive(Debug, Clone, PartialEq)]
struct Experts {
    /// Tokens `[t, h]`.
    x: TensorId,
    /// Routing weights `[t, k]` and expert indices `[t, k]`.
    weights: TensorId,
    indices: TensorId,
    /// Stacked gate and up projections `[e, 2f, h]` (output rows first).
    gate_up: TensorId,
    /// Which half of `gate_up`'s rows feeds the activation.
    gate_first: bool,
    /// Down projection `[e, h, f]`.
    down: TensorId,
    activation: Activation,
    /// Expert hidden size `f`.
    hidden: usize,
    /// The summed expert output `[t, h]` that the fused op replaces.
    out: TensorId,
    /// The summing node, where dead-node removal starts.
    sum: NodeIndex,
}

/// Replaces every exported expert computation in `graph` by `MoeExperts`
/// and drops the nodes this leaves dead. Returns how many were fused.
pub(super) fn fuse_experts(graph: &mut Graph) -> Result<usize, RewriteError> {
    let order = graph.topo_order()?;
    let found: Vec<Experts> = order.into_iter().filter_map(|n| match_at(graph, n)).collect();
    for (i, m) in found.iter().enumerate() {
        let fused = emit(graph, &format!("canon/MoeExperts_{i}"), m)?;
        graph.replace_uses(m.out, fused);
        remove_dead(graph, m.sum);
    }
    if !found.is_empty() {
        let names: HashSet<String> = graph.node_indices().map(|n| graph.node(n).name.clone()).collect();
        graph
            .blocks
            .retain(|blk| blk.nodes.iter().all(|n| names.contains(n)));
        *graph = graph.compacted();
    }
    Ok(found.len())
}

/// The fixed shape of `t`, if it has one.
fn shape(g: &Graph, t: TensorId) -> Option<Vec<usize>> {
    g.tensor(t).ty.shape.as_fixed()
}

/// The op and inputs of the node that produces `t`.
fn produced(g: &Graph, t: TensorId) -> Option<(&Op, &[Option<TensorId>])> {
    let node = g.node(g.producer(t)?);
    Some((&node.op, &node.inputs))
}

/// Required input `slot` of a node's input list.
fn arg(inputs: &[Option<TensorId>], slot: usize) -> Option<TensorId> {
    inputs.get(slot).copied().flatten()
}

/// Ops that only re-label the shape of their first input, keeping
/// row-major element order.
fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
            | Op::Unary {
                func: UnaryOp::Identity
            }
    )
}

/// The first tensor of shape `want` on the chain of views that ends at `t`
/// (`t` itself included).
fn view_of(g: &Graph, mut t: TensorId, want: &[usize]) -> Option<TensorId> {
    loop {
        if shape(g, t).as_deref() == Some(want) {
            return Some(t);
        }
        match produced(g, t) {
            Some((op, inputs)) if is_view(op) => t = arg(inputs, 0)?,
            _ => return None,
        }
    }
}

/// The two inputs of a binary op `func` producing `t`, in both orders.
fn binary(g: &Graph, t: TensorId, func: BinaryOp) -> Option<[(TensorId, TensorId); 2]> {
    match produced(g, t)? {
        (Op::Binary { func: f }, [Some(a), Some(b)]) if *f == func => Some([(*a, *b), (*b, *a)]),
        _ => None,
    }
}

/// For `t = MatMul(GatherNd(w, idx), v)` (or `Gather`) with `v` of shape `[rows, n, 1]`:
/// the stacked weights `w` (shape `[e, m, n]`), the routing indices
/// `[t, k]` that `idx` views, and `v`. `n` is read from `w`.
fn gathered_matvec(
    g: &Graph,
    t: TensorId,
    tk: [usize; 2],
    m: usize,
) -> Option<(TensorId, TensorId, TensorId, usize)> {
    let rows = tk[0] * tk[1];
    let (Op::MatMul, [Some(gathered), Some(v)]) = produced(g, t)? else {
        return None;
    };
    // dynamo gathers by `GatherNd` with `[rows, 1]` indices, the legacy
    // exporter by `Gather` along axis 0 with `[rows]`.
    let (w, idx) = match produced(g, *gathered)? {
        (Op::GatherNd { batch_dims: 0 }, [Some(w), Some(idx)]) if shape(g, *idx)? == [rows, 1] => (w, idx),
        (Op::Gather { axis: 0 }, [Some(w), Some(idx)]) if shape(g, *idx)? == [rows] => (w, idx),
        _ => return None,
    };
    let [_, wm, n] = shape(g, *w)?[..] else {
        return None;
    };
    let fits = wm == m && shape(g, *gathered)? == [rows, m, n] && shape(g, *v)? == [rows, n, 1];
    let indices = view_of(g, *idx, &tk)?;
    let ok = fits && g.tensor(indices).ty.dtype == DType::I64;
    ok.then_some((*w, indices, *v, n))
}

/// The activation a node applies, as `MoeExperts` spells it.
fn activation(op: &Op) -> Option<Activation> {
    match op {
        Op::Silu => Some(Activation::Silu),
        Op::Gelu {
            approximate: GeluApprox::None,
        } => Some(Activation::Gelu),
        Op::Gelu {
            approximate: GeluApprox::Tanh,
        } => Some(Activation::GeluTanh),
        Op::Unary { func: UnaryOp::Relu } => Some(Activation::Relu),
        _ => None,
    }
}

/// For `t = up ⊙ act(gate)` where `gate, up` are the two halves of a
/// matrix along its last dim (a `Split`, as dynamo exports it, or two
/// `Slice`s, as the legacy exporter does): the matrix, the activation, and
/// whether the gate is the first half.
fn gated(g: &Graph, t: TensorId) -> Option<(TensorId, Activation, bool)> {
    binary(g, t, BinaryOp::Mul)?.into_iter().find_map(|(up, acted)| {
        let (op, inputs) = produced(g, acted)?;
        let act = activation(op)?;
        let gate = arg(inputs, 0)?;
        if up == gate {
            return None;
        }
        let (input, gate_first) = split_halves(g, gate, up).or_else(|| sliced_halves(g, gate, up))?;
        let [_, cols] = shape(g, input)?[..] else {
            return None;
        };
        let halves = shape(g, gate)? == shape(g, up)? && shape(g, gate)?.last() == Some(&(cols / 2));
        halves.then_some((input, act, gate_first))
    })
}

/// `gate` and `up` as the two outputs of one `Split` of a matrix along
/// its last dim: the matrix, and whether `gate` is the first.
fn split_halves(g: &Graph, gate: TensorId, up: TensorId) -> Option<(TensorId, bool)> {
    let split = g.producer(gate)?;
    if g.producer(up)? != split {
        return None;
    }
    let node = g.node(split);
    let Op::Split { axis, outputs: 2, .. } = node.op else {
        return None;
    };
    let input = arg(&node.inputs, 0)?;
    (axis == 1 || axis == -1).then_some((input, node.outputs[0] == gate))
}

/// `gate` and `up` as two `Slice`s of one matrix along its last dim that
/// together cover it: the matrix, and whether `gate` is the first half.
fn sliced_halves(g: &Graph, gate: TensorId, up: TensorId) -> Option<(TensorId, bool)> {
    let (a, gate_from) = column_slice(g, gate)?;
    let (b, up_from) = column_slice(g, up)?;
    let cols = *shape(g, a)?.last()? as i64;
    let covers = a == b && gate_from + up_from == cols / 2 && cols % 2 == 0;
    covers.then_some((a, gate_from == 0))
}

/// For `t = Slice(m, [lo], [lo + cols/2], [last axis])` of a matrix `m`,
/// with constant bounds and unit step: `m` and `lo` (0 or `cols/2`).
fn column_slice(g: &Graph, t: TensorId) -> Option<(TensorId, i64)> {
    let (Op::Slice, inputs) = produced(g, t)? else {
        return None;
    };
    let m = arg(inputs, 0)?;
    let [_, cols] = shape(g, m)?[..] else {
        return None;
    };
    let cols = cols as i64;
    let ints = |slot: usize| -> Option<Vec<i64>> {
        let v = g.tensor(arg(inputs, slot)?).data.as_deref()?;
        Some(v.as_i64()?.to_vec())
    };
    let (starts, ends) = (ints(1)?, ints(2)?);
    let axes = match arg(inputs, 3) {
        Some(_) => ints(3)?,
        None => vec![0],
    };
    let step_one = match arg(inputs, 4) {
        Some(_) => ints(4)? == [1],
        None => true,
    };
    let last_axis = axes == [1] || axes == [-1];
    let half = cols / 2;
    let lo = *starts.first()?;
    let hi = (*ends.first()?).min(cols);
    let ok = step_one && last_axis && starts.len() == 1 && (lo == 0 || lo == half) && hi == lo + half;
    ok.then_some((m, lo))
}

/// Matches the expert computation whose `Σ_k` is node `sum`.
fn match_at(g: &Graph, sum: NodeIndex) -> Option<Experts> {
    let node = g.node(sum);
    let Op::Reduce {
        kind: ReduceKind::Sum,
        axes: Some(axes),
        keepdims: false,
        ..
    } = &node.op
    else {
        return None;
    };
    let stacked = arg(&node.inputs, 0)?;
    if node.inputs.iter().skip(1).any(Option::is_some) {
        return None;
    }
    let [t, k, h] = shape(g, stacked)?[..] else {
        return None;
    };
    if !(axes[..] == [1] || axes[..] == [-2]) {
        return None;
    }
    let rows = t * k;
    // Σ_k (routing weight · expert output), slot by slot.
    let scaled = view_of(g, stacked, &[rows, h])?;
    let (expert_out, weights) = binary(g, scaled, BinaryOp::Mul)?.into_iter().find_map(|(y, w)| {
        (shape(g, y)? == [rows, h] && shape(g, w)? == [rows, 1]).then_some((y, view_of(g, w, &[t, k])?))
    })?;
    // Down projection of the gated hidden state.
    let down_mv = view_of(g, expert_out, &[rows, h, 1])?;
    let (down, indices, hidden_col, f) = gathered_matvec(g, down_mv, [t, k], h)?;
    let hidden = view_of(g, hidden_col, &[rows, f])?;
    let (projected, activation, gate_first) = gated(g, hidden)?;
    // Gate and up projections of each slot's token copy.
    let up_mv = view_of(g, projected, &[rows, 2 * f, 1])?;
    let (gate_up, up_indices, x_col, _) = gathered_matvec(g, up_mv, [t, k], 2 * f)?;
    if up_indices != indices || shape(g, gate_up)?[2] != h {
        return None;
    }
    let x = repeated_tokens(g, x_col, [t, k, h])?;
    let dtype = g.tensor(x).ty.dtype;
    let same = [weights, gate_up, down, node.outputs[0]]
        .iter()
        .all(|&w| g.tensor(w).ty.dtype == dtype);
    same.then_some(Experts {
        x,
        weights,
        indices,
        gate_up,
        gate_first,
        down,
        activation,
        hidden: f,
        out: node.outputs[0],
        sum,
    })
}

/// For `x_col` viewing each token of `x [t, h]` repeated for its `k`
/// slots: `x`. dynamo writes the repeat as `Expand(x[t, 1, h], [t, k, h])`,
/// the legacy exporter as `Tile`, which the importer spells as an `Expand`
/// of `x` with unit dims around it; either way it is an `Expand` (under
/// views) that broadcasts one unit axis to `k`, with `t` elements'
/// worth of dims before it and `h` after.
fn repeated_tokens(g: &Graph, x_col: TensorId, [t, k, h]: [usize; 3]) -> Option<TensorId> {
    let mut expanded = view_of(g, x_col, &[t, k, h])?;
    let single = loop {
        match produced(g, expanded)? {
            (Op::Expand, inputs) => break arg(inputs, 0)?,
            (op, inputs) if is_view(op) => expanded = arg(inputs, 0)?,
            _ => return None,
        }
    };
    let (from, to) = (shape(g, single)?, shape(g, expanded)?);
    if from.len() != to.len() {
        return None;
    }
    let broadcast: Vec<usize> = (0..to.len()).filter(|&i| from[i] != to[i]).collect();
    let [axis] = broadcast[..] else {
        return None;
    };
    let before: usize = to[..axis].iter().product();
    let after: usize = to[axis + 1..].iter().product();
    (from[axis] == 1 && to[axis] == k && before == t && after == h).then_some(())?;
    view_of(g, single, &[t, h])
}

/// Adds node `name` applying `op` to `inputs`; returns its (inferred) output.
fn add(g: &mut Graph, name: String, op: Op, inputs: &[TensorId]) -> Result<TensorId, RewriteError> {
    let placeholder = TensorType {
        dtype: DType::F32,
        shape: Shape(vec![]),
    };
    let out = g.add_tensor(format!("{name}_out0"), placeholder, Role::Activation, None);
    let idx = g.add_node(name, op, inputs.iter().map(|&t| Some(t)).collect(), vec![out])?;
    let ty = g.infer_node(idx)?.remove(0);
    g.tensor_mut(out).ty = ty;
    Ok(out)
}

/// `[e, m, n] → [e, n, m]`: exported `[out, in]` weights as `[in, out]`.
fn transposed(g: &mut Graph, name: String, w: TensorId) -> Result<TensorId, RewriteError> {
    add(
        g,
        name,
        Op::Transpose {
            perm: Some(vec![0, 2, 1]),
        },
        &[w],
    )
}

/// Rows `half·f .. (half+1)·f` of the stacked gate/up weights, as `[e, h, f]`.
fn half_rows(g: &mut Graph, name: &str, m: &Experts, half: usize) -> Result<TensorId, RewriteError> {
    let f = m.hidden as i64;
    let lo = half as i64 * f;
    let mut ints = |suffix: &str, v: i64| {
        let value = Value {
            dtype: DType::I64,
            shape: vec![1],
            data: Data::I64(vec![v]),
        };
        g.add_constant(format!("{name}_{suffix}"), value)
    };
    let (starts, ends, axes) = (ints("starts", lo), ints("ends", lo + f), ints("axes", 1));
    let rows = add(
        g,
        format!("{name}_slice"),
        Op::Slice,
        &[m.gate_up, starts, ends, axes],
    )?;
    transposed(g, format!("{name}_transpose"), rows)
}

/// Adds the weight-only nodes and the `MoeExperts` node for `m`; returns
/// the fused output.
fn emit(g: &mut Graph, name: &str, m: &Experts) -> Result<TensorId, RewriteError> {
    let (gate_half, up_half) = if m.gate_first { (0, 1) } else { (1, 0) };
    let w_gate = half_rows(g, &format!("{name}/w_gate"), m, gate_half)?;
    let w_in = half_rows(g, &format!("{name}/w_in"), m, up_half)?;
    let w_out = transposed(g, format!("{name}/w_out_transpose"), m.down)?;
    let op = Op::MoeExperts {
        activation: m.activation,
        sources: 1,
    };
    let inputs = [m.x, m.weights, m.indices, w_in, w_out, w_gate];
    add(g, name.to_string(), op, &inputs)
}

/// Removes `start` and, transitively, the producers it fed, as long as no
/// node or graph output still reads what they compute.
fn remove_dead(g: &mut Graph, start: NodeIndex) {
    let mut stack = vec![start];
    let mut removed = HashSet::new();
    while let Some(n) = stack.pop() {
        if removed.contains(&n) {
            continue;
        }
        let node = g.node(n);
        let read = node
            .outputs
            .iter()
            .any(|&t| g.outputs.contains(&t) || !g.consumers(t).is_empty());
        if read {
            continue;
        }
        let feeders: Vec<NodeIndex> = node
            .inputs
            .iter()
            .flatten()
            .filter_map(|&t| g.producer(t))
            .collect();
        g.remove_node(n);
        removed.insert(n);
        stack.extend(feeders);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::canonicalize;
    use autopar_import::onnx::{load_model, read_tensor_file};
    use std::collections::HashMap;
    use std::path::Path;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures");

    /// Values of `g`'s outputs for `inputs` (in `g.inputs` order), by `Op::eval`.
    fn run(g: &Graph, inputs: &[Value]) -> Vec<Value> {
        let mut values: HashMap<TensorId, Value> =
            g.inputs.iter().copied().zip(inputs.iter().cloned()).collect();
        for idx in g.topo_order().unwrap() {
            let node = g.node(idx);
            let args: Vec<Option<&Value>> = node
                .inputs
                .iter()
                .map(|t| t.map(|t| values.get(&t).or(g.tensor(t).data.as_deref()).unwrap()))
                .collect();
            let outs = node
                .op
                .eval(&args)
                .unwrap_or_else(|e| panic!("{}: {e}", node.name));
            values.extend(node.outputs.iter().copied().zip(outs));
        }
        g.outputs.iter().map(|t| values[t].clone()).collect()
    }

    #[test]
    fn mixtral_experts_fuse_per_layer_and_compute_the_same() {
        let canonical = fuses_and_computes_the_same("mixtral-tiny.dynamo");
        let ops = canonical.op_histogram();
        assert_eq!(ops.get("GatherNd"), Some(&1), "only the mask gather is left");
    }

    /// The legacy exporter's Mixtral repeats tokens by `Tile`, gathers
    /// expert weights by `Gather` and halves gate/up by two `Slice`s.
    #[test]
    fn legacy_exported_mixtral_experts_fuse_too() {
        let canonical = fuses_and_computes_the_same("mixtral-tiny.ts");
        let ops = canonical.op_histogram();
        assert_eq!(
            ops.get("Sigmoid"),
            None,
            "the experts' SiLU went into the fused op"
        );
    }

    /// Canonicalises fixture `stem`, checks it has one `MoeExperts` per
    /// layer and computes the reference outputs, and returns it.
    fn fuses_and_computes_the_same(stem: &str) -> Graph {
        let imported = load_model(Path::new(&format!("{FIXTURES}/models/{stem}.onnx"))).unwrap();
        let (canonical, report) = canonicalize(&imported).unwrap();
        let ops = canonical.op_histogram();
        assert_eq!(ops.get("MoeExperts"), Some(&2), "{stem}: {ops:?}");
        assert_eq!(report.ops_after, ops);

        let data = format!("{FIXTURES}/reference/{stem}/test_data_set_0");
        let inputs: Vec<Value> = (0..imported.inputs.len())
            .map(|i| {
                read_tensor_file(Path::new(&format!("{data}/input_{i}.pb")))
                    .unwrap()
                    .1
            })
            .collect();
        let (want, got) = (run(&imported, &inputs), run(&canonical, &inputs));
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.shape, g.shape);
            let scale = w.to_f64_vec().iter().fold(1.0f64, |m, x| m.max(x.abs()));
            for (a, b) in w.to_f64_vec().iter().zip(g.to_f64_vec()) {
                assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}");
            }
        }
        let want = read_tensor_file(Path::new(&format!("{data}/output_0.pb")))
            .unwrap()
            .1;
        let diff = want
            .to_f64_vec()
            .iter()
            .zip(got[0].to_f64_vec())
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff < 1e-4, "{stem}: {diff} from onnxruntime");
        canonical
    }
}

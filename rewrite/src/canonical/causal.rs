//! Recovering the `causal` flag of attention recognised in exported graphs.
//!
//! Exporters build the causal mask as data (a triangle combined with the
//! padding mask), so the fused `Attention` first gets it as a plain mask
//! input. This pass evaluates each mask with every graph input set to ones
//! (no padding) and, when the result hides exactly the keys after each query,
//! sets `causal: true` — the planner prices causal attention differently.
//! The mask input stays, so padding still applies; outputs change only in
//! query rows the mask hides completely (padding rows, whose values no
//! consumer reads).

use autopar_ir::{Data, Graph, NodeIndex, Op, Role, TensorId, Value};
use std::collections::{HashMap, HashSet};

/// Marks every `Attention` whose mask is the causal triangle as causal.
pub(super) fn mark_causal(graph: &mut Graph) {
    let candidates: Vec<(NodeIndex, Option<f64>, TensorId)> = graph
        .node_indices()
        .filter_map(|idx| {
            let node = graph.node(idx);
            match (&node.op, node.inputs.get(3).copied().flatten()) {
                (Op::Attention { scale, causal: false }, Some(mask)) => Some((idx, *scale, mask)),
                _ => None,
            }
        })
        .collect();
    for (idx, scale, mask) in candidates {
        if evaluate_without_padding(graph, mask).is_some_and(|m| hides_exactly_future_keys(&m)) {
            *graph.op_mut(idx) = Op::Attention { scale, causal: true };
        }
    }
}

/// The value of `target` with every graph input set to ones; `None` when a
/// needed tensor has no data or an unbound shape, or an op fails.
fn evaluate_without_padding(graph: &Graph, target: TensorId) -> Option<Value> {
    let needed = ancestors(graph, target);
    let mut values: HashMap<TensorId, Value> = HashMap::new();
    let order = graph.topo_order().ok()?;
    for idx in order.into_iter().filter(|n| needed.contains(n)) {
        let node = graph.node(idx);
        for t in node.inputs.iter().flatten() {
            if !values.contains_key(t) && graph.producer(*t).is_none() {
                values.insert(*t, leaf_value(graph, *t)?);
            }
        }
        let args: Vec<Option<&Value>> = node
            .inputs
            .iter()
            .map(|t| t.and_then(|t| values.get(&t)))
            .collect();
        let outputs = node.op.eval(&args).ok()?;
        for (&t, v) in node.outputs.iter().zip(outputs) {
            values.insert(t, v);
        }
    }
    match values.remove(&target) {
        Some(v) => Some(v),
        None => leaf_value(graph, target),
    }
}

/// Nodes the value of `target` depends on.
fn ancestors(graph: &Graph, target: TensorId) -> HashSet<NodeIndex> {
    let mut seen = HashSet::new();
    let mut stack: Vec<NodeIndex> = graph.producer(target).into_iter().collect();
    while let Some(n) = stack.pop() {
        if seen.insert(n) {
            stack.extend(
                graph
                    .node(n)
                    .inputs
                    .iter()
                    .flatten()
                    .filter_map(|&t| graph.producer(t)),
            );
        }
    }
    seen
}

/// Stored data for constants and parameters; ones for graph inputs.
fn leaf_value(graph: &Graph, t: TensorId) -> Option<Value> {
    let tensor = graph.tensor(t);
    if tensor.role != Role::Input {
        return tensor.data.as_deref().cloned();
    }
    let shape = tensor.ty.shape.resolve(&graph.bindings)?;
    let mut v = Value::zeros(tensor.ty.dtype, shape);
    match &mut v.data {
        Data::F32(d) => d.fill(1.0),
        Data::F64(d) => d.fill(1.0),
        Data::I64(d) => d.fill(1),
        Data::Bool(d) => d.fill(true),
        Data::Str(_) => return None,
    }
    Some(v)
}

/// True when, in every `[sq, sk]` slice of the mask (`sq == sk`), key `j`
/// is hidden from query `i` exactly when `j > i`. Hidden means `false` in a
/// boolean mask, or a very large negative number in an additive one.
fn hides_exactly_future_keys(mask: &Value) -> bool {
    let rank = mask.shape.len();
    if rank < 2 || mask.shape[rank - 1] != mask.shape[rank - 2] || mask.shape[rank - 1] < 2 {
        return false;
    }
    let n = mask.shape[rank - 1];
    let hidden: Vec<bool> = match &mask.data {
        Data::Bool(d) => d.iter().map(|&keep| !keep).collect(),
        Data::F32(_) | Data::F64(_) => mask.to_f64_vec().iter().map(|&x| x <= -1e30).collect(),
        _ => return false,
    };
    hidden
        .chunks(n * n)
        .all(|slice| slice.iter().enumerate().all(|(at, &h)| h == (at % n > at / n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bool_mask(n: usize, keep: impl Fn(usize, usize) -> bool) -> Value {
        let data = (0..n * n).map(|at| keep(at / n, at % n)).collect();
        Value::new(autopar_ir::DType::Bool, vec![1, 1, n, n], Data::Bool(data)).unwrap()
    }

    #[test]
    fn lower_triangle_is_causal() {
        assert!(hides_exactly_future_keys(&bool_mask(4, |i, j| j <= i)));
        let additive: Vec<f32> = (0..9)
            .map(|at| if at % 3 > at / 3 { f32::MIN } else { 0.0 })
            .collect();
        assert!(hides_exactly_future_keys(
            &Value::f32(vec![3, 3], additive).unwrap()
        ));
    }

    #[test]
    fn other_masks_are_not() {
        assert!(!hides_exactly_future_keys(&bool_mask(4, |_, _| true)));
        assert!(!hides_exactly_future_keys(&bool_mask(4, |i, j| j < i)));
        assert!(!hides_exactly_future_keys(
            &bool_mask(4, |i, j| j <= i && j + 2 > i)
        ));
        let padded: Vec<f32> = vec![0.0, f32::MIN, f32::MIN, f32::MIN];
        assert!(!hides_exactly_future_keys(
            &Value::f32(vec![2, 2], padded).unwrap()
        ));
    }
}

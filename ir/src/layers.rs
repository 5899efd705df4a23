//! Where a graph's nodes sit relative to its repeated layers
//! ([`Graph::blocks`]): the part before the layers and the part after. One
//! definition for every layer that places them (pipeline stages, the
//! per-op sharding's node sets, tied-weight copies).

use crate::{Graph, NodeIndex, Role, TensorId};
use std::collections::{HashMap, HashSet};

/// The nodes outside the repeated layers, split into those the first layer
/// depends on (embeddings, positions, masks) and the others (head, loss).
pub fn outside_layers(g: &Graph) -> (HashSet<NodeIndex>, HashSet<NodeIndex>) {
    let in_layers: HashSet<NodeIndex> = g
        .node_indices()
        .filter(|&i| g.blocks.iter().any(|b| b.nodes.contains(&g.node(i).name)))
        .collect();
    let first: HashSet<&str> = g
        .blocks
        .first()
        .map(|b| b.nodes.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let first_layer = g
        .node_indices()
        .filter(|&i| first.contains(g.node(i).name.as_str()))
        .collect();
    let pre = ancestors_outside_layers(g, first_layer, |i| in_layers.contains(&i));
    let post = g
        .node_indices()
        .filter(|i| !in_layers.contains(i) && !pre.contains(i))
        .collect();
    (pre, post)
}

/// The float parameters read both before the layers and after them (a
/// tied input embedding and output layer), given [`outside_layers`]'
/// `(pre, post)`: lowering trains each as two tied copies, and every layer
/// that prices or shards them asks here.
pub fn tied_parameters(g: &Graph, (pre, post): &(HashSet<NodeIndex>, HashSet<NodeIndex>)) -> Vec<TensorId> {
    if g.blocks.is_empty() {
        return Vec::new();
    }
    g.tensors()
        .filter(|(_, t)| t.role == Role::Parameter && t.ty.dtype.is_float())
        .map(|(id, _)| id)
        .filter(|&p| {
            let users = g.consumers(p);
            users.iter().any(|u| pre.contains(u)) && users.iter().any(|u| post.contains(u))
        })
        .collect()
}

/// Nodes outside the layers (`in_layers` says which are in) that the first
/// layer's nodes (`first_layer`) transitively depend on: embeddings,
/// position and mask computations.
pub fn ancestors_outside_layers(
    g: &Graph,
    first_layer: Vec<NodeIndex>,
    in_layers: impl Fn(NodeIndex) -> bool,
) -> HashSet<NodeIndex> {
    let mut stack = first_layer;
    let mut seen = HashSet::new();
    while let Some(i) = stack.pop() {
        for &x in g.node(i).inputs.iter().flatten() {
            if let Some(p) = g.producer(x) {
                if !in_layers(p) && seen.insert(p) {
                    stack.push(p);
                }
            }
        }
    }
    seen
}

/// Per tensor (by [`crate::TensorId::index`]): `seed`, then every output of
/// a node that reads a flagged tensor (only its float outputs when
/// `floats`), following `topo`.
pub fn flow_flags(
    graph: &Graph,
    topo: &[NodeIndex],
    seed: impl Fn(&crate::Tensor) -> bool,
    floats: bool,
) -> Vec<bool> {
    let mut flag: Vec<bool> = graph.tensors().map(|(_, t)| seed(t)).collect();
    for &idx in topo {
        let node = graph.node(idx);
        if node.inputs.iter().flatten().any(|t| flag[t.index()]) {
            for &t in &node.outputs {
                flag[t.index()] = !floats || graph.tensor(t).ty.dtype.is_float();
            }
        }
    }
    flag
}

/// Per tensor: an activation the layers hand on to each other, computed
/// from the graph's inputs and carrying a gradient (a float tensor with a
/// float parameter among its ancestors): the residual stream, not a mask
/// or a rotary table.
pub fn streams(graph: &Graph) -> Result<Vec<bool>, crate::GraphError> {
    let topo = graph.topo_order()?;
    let grad = flow_flags(
        graph,
        &topo,
        |t| t.role == crate::Role::Parameter && t.ty.dtype.is_float(),
        true,
    );
    let dynamic = flow_flags(graph, &topo, |t| t.role == crate::Role::Input, false);
    Ok(grad.iter().zip(&dynamic).map(|(&g, &d)| g && d).collect())
}

/// Whether a tensor crosses a layer boundary split along the sequence (its
/// dim 1) over `tp` ranks rather than whole: under sequence parallelism, a
/// stream ([`streams`]) of rank 3 or more whose sequence splits evenly, as
/// Megatron-LM keeps the residual stream between layers. The planner's
/// per-op sharding, the cost model and lowering all cross boundaries so.
pub fn crosses_sequence_split(stream: bool, dims: &[usize], tp: usize, sp: bool) -> bool {
    sp && tp > 1 && stream && dims.len() >= 3 && dims[1] % tp == 0
}

/// Which part of the graph each node belongs to: 0 before the layers,
/// `k + 1` the layer `k` (of [`Graph::blocks`]), `layers + 1` after. A
/// tensor whose producer and reader are in different parts crosses a
/// layer boundary.
pub fn parts(graph: &Graph) -> HashMap<NodeIndex, usize> {
    let (pre, _) = outside_layers(graph);
    let layer_of: HashMap<&str, usize> = graph
        .blocks
        .iter()
        .enumerate()
        .flat_map(|(k, b)| b.nodes.iter().map(move |n| (n.as_str(), k + 1)))
        .collect();
    let after = graph.blocks.len() + 1;
    graph
        .node_indices()
        .map(|i| {
            let part = match layer_of.get(graph.node(i).name.as_str()) {
                Some(&k) => k,
                None if pre.contains(&i) => 0,
                None => after,
            };
            (i, part)
        })
        .collect()
}

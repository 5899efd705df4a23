//! Where a graph's nodes sit relative to its repeated layers
//! ([`Graph::blocks`]): the part before the layers and the part after. One
//! definition for every layer that places them (pipeline stages, the
//! per-op sharding's node sets, tied-weight copies).

use crate::{Graph, NodeIndex};
use std::collections::HashSet;

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

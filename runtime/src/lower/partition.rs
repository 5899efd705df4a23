//! Which virtual pipeline stage runs each node of the training graph, and
//! in which phase: repeated layers go where the strategy puts them, the
//! nodes before the first layer to the first stage, the rest (head, loss)
//! to the last, and every backward node with the forward node it came from.

use super::schedule::Phase;
use super::training::TrainingGraph;
use autopar_ir::{Graph, NodeIndex};
use std::collections::{HashMap, HashSet};

/// The training graph's nodes grouped by (virtual stage, phase).
#[derive(Debug, Clone)]
pub struct Partition {
    /// Virtual stage and phase of every node.
    pub place: HashMap<NodeIndex, (usize, Phase)>,
    /// Nodes of each `(virtual stage, phase)`, in topological order.
    pub groups: HashMap<(usize, Phase), Vec<NodeIndex>>,
}

/// Why the graph cannot be split as asked.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PartitionError {
    #[error("the model has {have} repeated layers but the plan places {want}")]
    Layers { have: usize, want: usize },
    #[error("the model has no repeated layers, so it cannot be split into {0} pipeline stages")]
    NoLayers(usize),
    #[error(transparent)]
    Graph(#[from] autopar_ir::GraphError),
}

/// Places every node of `t` given each layer's virtual stage (`layer_vs`)
/// and the number of virtual stages.
pub fn partition(
    t: &TrainingGraph,
    layer_vs: &[usize],
    virtual_stages: usize,
) -> Result<Partition, PartitionError> {
    let g = &t.graph;
    let by_name: HashMap<&str, NodeIndex> = g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect();
    let last = virtual_stages - 1;
    if g.blocks.is_empty() && virtual_stages > 1 {
        return Err(PartitionError::NoLayers(virtual_stages));
    }
    if !g.blocks.is_empty() && g.blocks.len() != layer_vs.len() {
        return Err(PartitionError::Layers {
            have: g.blocks.len(),
            want: layer_vs.len(),
        });
    }
    let mut forward_vs: HashMap<NodeIndex, usize> = HashMap::new();
    for (block, &vs) in g.blocks.iter().zip(layer_vs) {
        for name in &block.nodes {
            if let Some(&i) = by_name.get(name.as_str()) {
                forward_vs.insert(i, vs);
            }
        }
    }
    let pre = ancestors_outside_layers(g, &forward_vs);
    let forward: HashSet<&str> = t.forward.iter().map(String::as_str).collect();
    let order = g.topo_order()?;
    let mut place = HashMap::new();
    for &i in &order {
        let name = g.node(i).name.as_str();
        let placed = if forward.contains(name) {
            let vs = forward_vs
                .get(&i)
                .copied()
                .unwrap_or(if pre.contains(&i) || g.blocks.is_empty() {
                    0
                } else {
                    last
                });
            (vs, Phase::Forward)
        } else {
            let vs = match t.origins.get(name).and_then(|o| by_name.get(o.as_str())) {
                Some(origin) => place.get(origin).map_or(last, |&(vs, _)| vs),
                // A gradient's identity output: with the node producing its value.
                None => g
                    .node(i)
                    .inputs
                    .iter()
                    .flatten()
                    .find_map(|&x| g.producer(x))
                    .and_then(|p| place.get(&p))
                    .map_or(last, |&(vs, _): &(usize, Phase)| vs),
            };
            (vs, Phase::Backward)
        };
        place.insert(i, placed);
    }
    let mut groups: HashMap<(usize, Phase), Vec<NodeIndex>> = HashMap::new();
    for &i in &order {
        groups.entry(place[&i]).or_default().push(i);
    }
    Ok(Partition { place, groups })
}

/// The nodes outside the repeated layers, split into those the first layer
/// depends on (embeddings, positions, masks) and the others (head, loss).
pub fn outside_layers(g: &Graph) -> (HashSet<NodeIndex>, HashSet<NodeIndex>) {
    let in_layers: HashMap<NodeIndex, usize> = g
        .node_indices()
        .filter(|&i| g.blocks.iter().any(|b| b.nodes.contains(&g.node(i).name)))
        .map(|i| (i, 0))
        .collect();
    let pre = ancestors_outside_layers(g, &in_layers);
    let post = g
        .node_indices()
        .filter(|i| !in_layers.contains_key(i) && !pre.contains(i))
        .collect();
    (pre, post)
}

/// Nodes outside the layers that the first layer (transitively) depends on:
/// embeddings, position and mask computations.
fn ancestors_outside_layers(g: &Graph, in_layers: &HashMap<NodeIndex, usize>) -> HashSet<NodeIndex> {
    let Some(first) = g.blocks.first() else {
        return HashSet::new();
    };
    let first: HashSet<&str> = first.nodes.iter().map(String::as_str).collect();
    let mut stack: Vec<NodeIndex> = g
        .node_indices()
        .filter(|&i| first.contains(g.node(i).name.as_str()))
        .collect();
    let mut seen = HashSet::new();
    while let Some(i) = stack.pop() {
        for &x in g.node(i).inputs.iter().flatten() {
            if let Some(p) = g.producer(x) {
                if !in_layers.contains_key(&p) && seen.insert(p) {
                    stack.push(p);
                }
            }
        }
    }
    seen
}

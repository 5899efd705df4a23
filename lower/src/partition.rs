//! Which virtual pipeline stage runs each node of the training graph, and
//! in which phase: repeated layers go where the strategy puts them, the
//! nodes before the first layer to the first stage, the rest (head, loss)
//! to the last, and every backward node with the forward node it came from.

use super::schedule::Phase;
use super::training::TrainingGraph;
use autopar_ir::layers::ancestors_outside_layers;
use autopar_ir::{Graph, NodeIndex};
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

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
    let names = NodeNames::new(g);
    let mut forward_vs: Vec<Option<usize>> = vec![None; names.bound()];
    for (block, &vs) in g.blocks.iter().zip(layer_vs) {
        for name in &block.nodes {
            if let Some(i) = names.last(name) {
                forward_vs[i.index()] = Some(vs);
            }
        }
    }
    let first_layer = names.named(g.blocks.first().map_or(&[], |b| b.nodes.as_slice()));
    let first_layer = g.node_indices().filter(|i| first_layer[i.index()]).collect();
    let pre = ancestors_outside_layers(g, first_layer, |i| forward_vs[i.index()].is_some());
    let forward = names.named(&t.forward);
    let order = g.topo_order()?;
    let mut place_of: Vec<Option<(usize, Phase)>> = vec![None; names.bound()];
    for &i in &order {
        let placed = if forward[i.index()] {
            let vs = forward_vs[i.index()].unwrap_or_else(|| {
                if pre.contains(&i) || g.blocks.is_empty() {
                    0
                } else {
                    last
                }
            });
            (vs, Phase::Forward)
        } else {
            let stage_of = |p: NodeIndex| place_of[p.index()].map(|(vs, _)| vs);
            let vs = match t.origins.get(&g.node(i).name).and_then(|o| names.last(o)) {
                Some(origin) => stage_of(origin).unwrap_or(last),
                // A gradient's identity output: with the node producing its value.
                None => g
                    .node(i)
                    .inputs
                    .iter()
                    .flatten()
                    .find_map(|&x| g.producer(x))
                    .and_then(stage_of)
                    .unwrap_or(last),
            };
            (vs, Phase::Backward)
        };
        place_of[i.index()] = Some(placed);
    }
    let mut place = HashMap::with_capacity(order.len());
    let mut groups: HashMap<(usize, Phase), Vec<NodeIndex>> = HashMap::new();
    for &i in &order {
        if let Some(placed) = place_of[i.index()] {
            place.insert(i, placed);
            groups.entry(placed).or_default().push(i);
        }
    }
    let gradients: HashSet<&str> = t.gradients.iter().map(|(_, grad)| grad.as_str()).collect();
    let is_gradient_output = |i: NodeIndex| {
        g.node(i)
            .outputs
            .iter()
            .any(|&x| gradients.contains(g.tensor(x).name.as_str()))
    };
    for ((_, phase), nodes) in &mut groups {
        if *phase == Phase::Backward {
            *nodes = hoist(g, nodes, is_gradient_output);
        }
    }
    Ok(Partition { place, groups })
}

/// `nodes` (in topological order) with every node `early` picks moved up to
/// just after the last of its inputs computed in `nodes`: a parameter's
/// gradient output then follows the node computing its value, so a rank
/// accumulates (and starts reducing) that gradient as soon as the backward
/// pass has it, not after the whole stage. The order stays topological: a
/// moved node only passes nodes computed after its inputs, and its
/// consumers came after its old place.
fn hoist(g: &Graph, nodes: &[NodeIndex], early: impl Fn(NodeIndex) -> bool) -> Vec<NodeIndex> {
    let here: HashSet<NodeIndex> = nodes.iter().copied().collect();
    let moved: HashSet<NodeIndex> = nodes.iter().copied().filter(|&i| early(i)).collect();
    // Moved node → its inputs' producers here not placed yet; producer → moved nodes waiting on it.
    let mut missing: HashMap<NodeIndex, usize> = HashMap::new();
    let mut waiting: HashMap<NodeIndex, Vec<NodeIndex>> = HashMap::new();
    let mut queue: VecDeque<NodeIndex> = VecDeque::new();
    for &i in nodes.iter().filter(|i| moved.contains(i)) {
        let producers: BTreeSet<NodeIndex> = g
            .node(i)
            .inputs
            .iter()
            .flatten()
            .filter_map(|&x| g.producer(x))
            .filter(|p| here.contains(p))
            .collect();
        if producers.is_empty() {
            queue.push_back(i);
            continue;
        }
        missing.insert(i, producers.len());
        for p in producers {
            waiting.entry(p).or_default().push(i);
        }
    }
    let mut rest = nodes.iter().copied().filter(|i| !moved.contains(i));
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(next) = queue.pop_front().or_else(|| rest.next()) {
        out.push(next);
        for w in waiting.remove(&next).unwrap_or_default() {
            let left = missing.get_mut(&w).expect("a moved node waits on its producers");
            *left -= 1;
            if *left == 0 {
                queue.push_back(w);
            }
        }
    }
    out
}

/// Node lookups by name, hashing each name once: graph names need not be
/// unique, so a name stands for its first node, and a lookup by name finds
/// its last.
struct NodeNames<'g> {
    /// By name: its first and last node.
    ends: HashMap<&'g str, (NodeIndex, NodeIndex)>,
    /// By node index: the first node with its name (NONE: no node).
    first: Vec<usize>,
}

impl<'g> NodeNames<'g> {
    fn new(g: &'g Graph) -> NodeNames<'g> {
        let bound = g.node_indices().map(|i| i.index() + 1).max().unwrap_or(0);
        let mut ends = HashMap::with_capacity(g.node_count());
        let mut first = vec![NONE; bound];
        for i in g.node_indices() {
            let e = ends.entry(g.node(i).name.as_str()).or_insert((i, i));
            e.1 = i;
            first[i.index()] = e.0.index();
        }
        NodeNames { ends, first }
    }

    /// One more than the largest node index.
    fn bound(&self) -> usize {
        self.first.len()
    }

    fn last(&self, name: &str) -> Option<NodeIndex> {
        self.ends.get(name).map(|&(_, last)| last)
    }

    /// Whether each node (by index) has one of `names`.
    fn named(&self, names: &[String]) -> Vec<bool> {
        let mut marked = vec![false; self.bound()];
        for (first, _) in names.iter().filter_map(|n| self.ends.get(n.as_str())) {
            marked[first.index()] = true;
        }
        self.first.iter().map(|&f| f != NONE && marked[f]).collect()
    }
}

/// Marks an index of no node in [`NodeNames`].
const NONE: usize = usize::MAX;

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_ir::{DType, Op, Role, Shape, TensorType, UnaryOp};

    #[test]
    fn a_repeated_node_name_stands_for_its_first_node_and_finds_its_last() {
        let mut g = Graph::new("g");
        let ty = TensorType {
            dtype: DType::F32,
            shape: Shape::fixed(&[2]),
        };
        let x = g.add_tensor("x", ty.clone(), Role::Input, None);
        let y = g.add_tensor("y", ty.clone(), Role::Activation, None);
        let z = g.add_tensor("z", ty.clone(), Role::Activation, None);
        let w = g.add_tensor("w", ty, Role::Activation, None);
        let neg = || Op::Unary { func: UnaryOp::Neg };
        let first = g.add_node("n", neg(), vec![Some(x)], vec![y]).unwrap();
        let other = g.add_node("m", neg(), vec![Some(y)], vec![z]).unwrap();
        let last = g.add_node("n", neg(), vec![Some(z)], vec![w]).unwrap();
        let names = NodeNames::new(&g);
        assert_eq!(names.last("n"), Some(last));
        assert_eq!(names.last("k"), None);
        assert_eq!(names.first[last.index()], first.index());
        let named = names.named(&["n".to_string()]);
        assert!(named[first.index()] && named[last.index()] && !named[other.index()]);
    }
}

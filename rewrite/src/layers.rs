//! Layer detection: finds the run of identical consecutive blocks of nodes
//! (the transformer layers) in a graph's topological order, so the planner
//! can price one layer and reuse it for its repeats.
//!
//! Only nodes that depend on the main graph input (the one most nodes depend
//! on: token ids) are considered, so side chains computed once and shared by
//! every layer (attention masks, weight preparation) do not break the first
//! layer's likeness. Nodes are sequenced by data-flow depth (longest path from the graph's
//! inputs), then by structure, so that each layer occupies a contiguous,
//! identically ordered stretch whatever order an importer or rewrite inserted
//! the nodes in. Two nodes look alike when their ops (attributes included),
//! input types and whether each input is computed or stored are equal; names are ignored. Among all runs of at least
//! two equal consecutive blocks, the one covering the most nodes wins; ties go
//! to more, shorter blocks, then to the earliest start.

use autopar_ir::{BinaryOp, Block, Graph, GraphError, Op, Role};
use std::collections::{HashMap, HashSet};

/// The detected repeat: `count` blocks of `len` nodes starting at `start` in
/// topological order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Repeat {
    start: usize,
    len: usize,
    count: usize,
}

/// Finds repeated blocks; empty when nothing repeats.
pub fn detect_blocks(graph: &Graph) -> Result<Vec<Block>, GraphError> {
    let topo = graph.topo_order()?;
    let topo_sigs = signatures(graph, &topo);
    let mut depth: HashMap<autopar_ir::NodeIndex, usize> = HashMap::new();
    for &idx in &topo {
        let d = graph
            .node(idx)
            .inputs
            .iter()
            .flatten()
            .filter_map(|&t| graph.producer(t))
            .map(|p| depth[&p] + 1)
            .max()
            .unwrap_or(0);
        depth.insert(idx, d);
    }
    let on_trunk = main_input_dependents(graph, &topo);
    let mut ranked: Vec<(usize, usize, usize)> = topo
        .iter()
        .enumerate()
        .filter(|(_, idx)| on_trunk.contains(idx))
        .map(|(pos, idx)| (depth[idx], topo_sigs[pos], pos))
        .collect();
    ranked.sort_unstable();
    let order: Vec<autopar_ir::NodeIndex> = ranked.iter().map(|&(_, _, pos)| topo[pos]).collect();
    let sigs: Vec<usize> = ranked.iter().map(|&(_, sig, _)| sig).collect();
    let Some(rep) = longest_repeat(&sigs) else {
        return Ok(vec![]);
    };
    Ok((0..rep.count)
        .map(|k| {
            let from = rep.start + k * rep.len;
            Block {
                nodes: order[from..from + rep.len]
                    .iter()
                    .map(|&n| graph.node(n).name.clone())
                    .collect(),
            }
        })
        .collect())
}

/// Nodes that depend on the graph input with the most dependents (all nodes
/// when the graph has no inputs).
fn main_input_dependents(graph: &Graph, topo: &[autopar_ir::NodeIndex]) -> HashSet<autopar_ir::NodeIndex> {
    let dependents_of = |input: autopar_ir::TensorId| -> HashSet<autopar_ir::NodeIndex> {
        let mut reached: HashSet<autopar_ir::TensorId> = HashSet::from([input]);
        let mut nodes = HashSet::new();
        for &idx in topo {
            let node = graph.node(idx);
            if node.inputs.iter().flatten().any(|t| reached.contains(t)) {
                nodes.insert(idx);
                reached.extend(node.outputs.iter().copied());
            }
        }
        nodes
    };
    graph
        .inputs
        .iter()
        .map(|&t| dependents_of(t))
        .max_by_key(HashSet::len)
        .unwrap_or_else(|| topo.iter().copied().collect())
}

/// Interned structural signature of each node in `order`.
fn signatures(graph: &Graph, order: &[autopar_ir::NodeIndex]) -> Vec<usize> {
    let mut interner: HashMap<String, usize> = HashMap::new();
    order
        .iter()
        .map(|&idx| {
            let node = graph.node(idx);
            let mut operands: Vec<String> = node
                .inputs
                .iter()
                .map(|t| match t {
                    Some(t) => {
                        let tensor = graph.tensor(*t);
                        let kind = match tensor.role {
                            Role::Activation | Role::Input => "a",
                            Role::Parameter | Role::Constant => "w",
                        };
                        format!("{kind}{}{}", tensor.ty.dtype, tensor.ty.shape)
                    }
                    None => "-".to_string(),
                })
                .collect();
            // Exporters emit `x·c` in one layer and `c·x` in the next.
            if is_commutative(&node.op) {
                operands.sort();
            }
            let key = format!(
                "{}|{}",
                serde_json::to_string(&node.op).unwrap_or_default(),
                operands.join("|")
            );
            let next = interner.len();
            *interner.entry(key).or_insert(next)
        })
        .collect()
}

fn is_commutative(op: &Op) -> bool {
    use BinaryOp::*;
    matches!(
        op,
        Op::Binary {
            func: Add | Mul | Max | Min | And | Or | Xor | Equal
        }
    )
}

/// The best run of equal consecutive blocks in `sigs`, in O(n²).
fn longest_repeat(sigs: &[usize]) -> Option<Repeat> {
    let n = sigs.len();
    let mut best: Option<Repeat> = None;
    for len in 1..=n / 2 {
        // run[j] = how many consecutive positions from j satisfy sigs[p] == sigs[p + len].
        let mut run = vec![0usize; n - len + 1];
        for j in (0..n - len).rev() {
            run[j] = if sigs[j] == sigs[j + len] {
                run[j + 1] + 1
            } else {
                0
            };
        }
        for (start, &matched) in run.iter().enumerate().take(n - len) {
            let count = 1 + matched / len;
            if count < 2 {
                continue;
            }
            let cand = Repeat { start, len, count };
            let better = match best {
                None => true,
                Some(b) => {
                    let (cov, bcov) = (count * len, b.count * b.len);
                    cov > bcov || (cov == bcov && (count > b.count || (count == b.count && start < b.start)))
                }
            };
            if better {
                best = Some(cand);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_layers_between_prelude_and_tail() {
        // prelude 7 8, three layers of 1 2 3 4, tail 9
        let s = [7, 8, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 9];
        assert_eq!(
            longest_repeat(&s),
            Some(Repeat {
                start: 2,
                len: 4,
                count: 3
            })
        );
    }

    #[test]
    fn prefers_covering_layers_over_a_short_inner_repeat() {
        // each layer has an inner triple (5 5 5), layers repeat twice
        let s = [5, 5, 5, 6, 7, 5, 5, 5, 6, 7];
        let r = longest_repeat(&s).unwrap();
        assert_eq!((r.len, r.count), (5, 2));
    }

    #[test]
    fn nothing_repeats() {
        assert_eq!(longest_repeat(&[1, 2, 3]), None);
        assert_eq!(longest_repeat(&[]), None);
    }
}

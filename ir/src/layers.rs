//! Layer detection: finds the run of identical consecutive blocks of nodes
//! (the transformer layers) in a graph's topological order, so the planner
//! can price one layer and reuse it for its repeats.
//!
//! Two nodes look alike when their ops (attributes included), input types
//! and input roles are equal; names are ignored. Among all runs of at least
//! two equal consecutive blocks, the one covering the most nodes wins; ties go
//! to more, shorter blocks, then to the earliest start.

use crate::{Block, Graph, GraphError, Role};
use std::collections::HashMap;

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
    let order = graph.topo_order()?;
    let sigs = signatures(graph, &order);
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

/// Interned structural signature of each node in `order`.
fn signatures(graph: &Graph, order: &[crate::NodeIndex]) -> Vec<usize> {
    let mut interner: HashMap<String, usize> = HashMap::new();
    order
        .iter()
        .map(|&idx| {
            let node = graph.node(idx);
            let mut key = serde_json::to_string(&node.op).unwrap_or_default();
            for t in &node.inputs {
                match t {
                    Some(t) => {
                        let tensor = graph.tensor(*t);
                        let role = match tensor.role {
                            Role::Activation | Role::Input => "a",
                            Role::Parameter => "p",
                            Role::Constant => "c",
                        };
                        key.push_str(&format!("|{role}{}{}", tensor.ty.dtype, tensor.ty.shape));
                    }
                    None => key.push_str("|-"),
                }
            }
            let next = interner.len();
            *interner.entry(key).or_insert(next)
        })
        .collect()
}

/// The best run of equal consecutive blocks in `sigs`, in O(n²).
fn longest_repeat(sigs: &[usize]) -> Option<Repeat> {
    let n = sigs.len();
    let mut best: Option<Repeat> = None;
    for len in 1..=n / 2 {
        // run[j] = how many consecutive positions from j satisfy sigs[p] == sigs[p + len].
        let mut run = vec![0usize; n - len + 1];
        for j in (0..n - len).rev() {
            run[j] = if sigs[j] == sigs[j + len] { run[j + 1] + 1 } else { 0 };
        }
        for start in 0..n - len {
            let count = 1 + run[start] / len;
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

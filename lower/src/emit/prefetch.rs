//! ZeRO-3's weight gathers, prefetched: a task gathers the weights of the
//! layer `Strategy::prefetch` layers ahead of the one it computes (FSDP's
//! prefetch), so a runtime with a communication stream gathers them beside
//! the current layer's computation. Layers are the graph's repeated blocks
//! (forward nodes by name, backward nodes by the forward node they came
//! from); what lies before or after them counts as a layer of its own.
//! Each weight is still gathered once per task, before its first use;
//! with `prefetch` 0, right before it.

use super::frees::Key;
use super::{Emitter, Layout};
use crate::program::Instr;
use autopar_ir::{NodeIndex, Role};
use std::collections::HashMap;

/// A task's weights in the order it first uses them, in runs of one layer.
#[derive(Default)]
pub(super) struct Segments {
    /// By weight ([`Key::name`]): its run.
    of: HashMap<u32, usize>,
    /// Each run's weights.
    runs: Vec<Vec<(Key, String)>>,
    /// Runs gathered so far: all below this one.
    next: usize,
}

impl Layout<'_> {
    /// The repeated layer `node` belongs to, if any.
    pub(super) fn layer(&self, node: NodeIndex) -> Option<usize> {
        self.layer_of.get(node.index()).copied().flatten()
    }

    /// `nodes`' weights in order of first use, in runs of one layer.
    pub(super) fn segments(&self, nodes: impl Iterator<Item = NodeIndex>) -> Segments {
        let g = &self.t.graph;
        let mut s = Segments::default();
        let mut layer = None;
        for node in nodes {
            let here = self.layer(node);
            for &x in g.node(node).inputs.iter().flatten() {
                let tensor = g.tensor(x);
                let key = self.key(x, None);
                if tensor.role != Role::Parameter || s.of.contains_key(&key.name) {
                    continue;
                }
                if s.runs.is_empty() || layer != here {
                    s.runs.push(Vec::new());
                    layer = here;
                }
                s.of.insert(key.name, s.runs.len() - 1);
                if let Some(run) = s.runs.last_mut() {
                    run.push((key, tensor.name.clone()));
                }
            }
        }
        s
    }
}

impl Emitter<'_, '_> {
    /// Before a node reads weight `key` (ZeRO-3): gathers what its layer
    /// and the `prefetch` layers after it need that is not gathered yet
    /// (only `key` without prefetch).
    pub(super) fn gather_ahead(&mut self, key: Key, name: &str) {
        let (s, ahead) = (&mut self.segments, self.l.s.prefetch);
        if let Some(&run) = s.of.get(&key.name).filter(|_| ahead > 0) {
            let upto = (run + ahead + 1).min(s.runs.len());
            let due: Vec<(Key, String)> = (s.next..upto).flat_map(|r| s.runs[r].clone()).collect();
            s.next = s.next.max(upto);
            for (key, name) in due {
                self.gather(key, &name);
            }
        }
        self.gather(key, name);
    }

    /// Gathers weight `key` unless this task already did.
    fn gather(&mut self, key: Key, name: &str) {
        if self.first_gather(key) {
            let group = self.dp_group(name);
            let param = name.to_string();
            self.push_def(Instr::GatherParam { param, group }, key);
        }
    }
}

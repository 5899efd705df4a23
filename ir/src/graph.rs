//! The model graph: ops as petgraph nodes, tensors in an arena beside them.
//!
//! A node reads and writes tensors by [`TensorId`]; a petgraph edge runs from
//! each tensor's producer to each consumer so that ordering and traversal come
//! from petgraph. Tensors without a producer are graph inputs, parameters or
//! constants. Architecture invariant: every edge is derived from node inputs;
//! edit through `Graph`'s methods, never through `nodes` directly.

use crate::op::{InferInput, Op, OpClass, OpError, TensorType};
use crate::{Bindings, Shape, Value};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Index of a tensor in [`Graph::tensors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TensorId(pub u32);

impl TensorId {
    /// Position in the tensor arena.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a tensor is to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Fed by the user at run time (token ids, masks).
    Input,
    /// Computed by a node.
    Activation,
    /// Trainable weight.
    Parameter,
    /// Fixed data (shape tensors, tables); never trained.
    Constant,
}

/// A tensor: name, static type, role and, for parameters and constants, its
/// data when known. `data == None` on a parameter means weightless (external
/// data that is absent, or a zoo model whose weights are never materialised).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub ty: TensorType,
    pub role: Role,
    pub data: Option<Arc<Value>>,
}

/// One op applied to tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    /// Positional inputs; `None` is an absent optional input.
    pub inputs: Vec<Option<TensorId>>,
    pub outputs: Vec<TensorId>,
}

/// A run of consecutive nodes that repeats (a transformer layer): found by
/// layer detection on imported graphs, recorded directly by the model zoo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Block {
    /// Names of the nodes of one instance, in topological order.
    pub nodes: Vec<String>,
}

/// Errors that name the node or tensor at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GraphError {
    #[error("node '{node}': input {slot} refers to tensor #{tensor}, which does not exist")]
    DanglingInput { node: String, slot: usize, tensor: u32 },
    #[error(
        "node '{node}': input {slot} ('{tensor}') has no producer and is not an input, parameter or constant"
    )]
    Unproduced {
        node: String,
        slot: usize,
        tensor: String,
    },
    #[error("tensor '{tensor}' is produced by both '{first}' and '{second}'")]
    TwoProducers {
        tensor: String,
        first: String,
        second: String,
    },
    #[error("node '{node}': produces {got} outputs, op {op} produces {expected}")]
    OutputCount {
        node: String,
        op: String,
        expected: usize,
        got: usize,
    },
    #[error("node '{node}': {source}")]
    Op { node: String, source: OpError },
    #[error(
        "node '{node}': output {slot} ('{tensor}') is recorded as {recorded} but the op gives {inferred}"
    )]
    ShapeMismatch {
        node: String,
        slot: usize,
        tensor: String,
        recorded: String,
        inferred: String,
    },
    #[error("graph has a cycle through node '{node}'")]
    Cycle { node: String },
    #[error("graph output '{tensor}' is never computed")]
    MissingOutput { tensor: String },
}

/// The model graph.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub name: String,
    nodes: StableDiGraph<Node, TensorId>,
    tensors: Vec<Tensor>,
    producers: Vec<Option<NodeIndex>>,
    /// Nodes that read a tensor before any node produced it (graphs may be
    /// built in any order); their edges are added when the producer arrives.
    early_readers: std::collections::HashMap<TensorId, Vec<NodeIndex>>,
    /// Graph inputs, in order.
    pub inputs: Vec<TensorId>,
    /// Graph outputs, in order.
    pub outputs: Vec<TensorId>,
    /// Repeated blocks (layers); see [`Block`].
    pub blocks: Vec<Block>,
    /// Default values of the symbolic dims (e.g. the zoo spec's `seq`), used
    /// when a caller binds none.
    pub bindings: Bindings,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Adds a tensor and returns its id.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
        role: Role,
        data: Option<Arc<Value>>,
    ) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor {
            name: name.into(),
            ty,
            role,
            data,
        });
        self.producers.push(None);
        id
    }

    /// Adds a constant tensor holding `value`.
    pub fn add_constant(&mut self, name: impl Into<String>, value: Value) -> TensorId {
        let ty = TensorType {
            dtype: value.dtype,
            shape: Shape::fixed(&value.shape),
        };
        self.add_tensor(name, ty, Role::Constant, Some(Arc::new(value)))
    }

    /// Adds a node reading `inputs` and writing `outputs` (which must not yet
    /// have a producer).
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<Option<TensorId>>,
        outputs: Vec<TensorId>,
    ) -> Result<NodeIndex, GraphError> {
        let name = name.into();
        for (slot, t) in inputs.iter().enumerate() {
            if let Some(t) = t {
                if t.index() >= self.tensors.len() {
                    return Err(GraphError::DanglingInput {
                        node: name,
                        slot,
                        tensor: t.0,
                    });
                }
            }
        }
        for &t in &outputs {
            if t.index() >= self.tensors.len() {
                return Err(GraphError::DanglingInput {
                    node: name,
                    slot: usize::MAX,
                    tensor: t.0,
                });
            }
            if let Some(p) = self.producers[t.index()] {
                return Err(GraphError::TwoProducers {
                    tensor: self.tensors[t.index()].name.clone(),
                    first: self.nodes[p].name.clone(),
                    second: name,
                });
            }
        }
        let idx = self.nodes.add_node(Node {
            name,
            op,
            inputs: inputs.clone(),
            outputs: outputs.clone(),
        });
        for &t in &outputs {
            self.producers[t.index()] = Some(idx);
        }
        for t in inputs.into_iter().flatten() {
            match self.producers[t.index()] {
                Some(p) => {
                    self.nodes.add_edge(p, idx, t);
                }
                None => self.early_readers.entry(t).or_default().push(idx),
            }
        }
        for &t in &outputs {
            for reader in self.early_readers.remove(&t).unwrap_or_default() {
                if self.nodes.contains_node(reader) {
                    self.nodes.add_edge(idx, reader, t);
                }
            }
        }
        Ok(idx)
    }

    /// Removes a node; its outputs lose their producer.
    pub fn remove_node(&mut self, idx: NodeIndex) -> Option<Node> {
        let node = self.nodes.remove_node(idx)?;
        for &t in &node.outputs {
            self.producers[t.index()] = None;
        }
        for readers in self.early_readers.values_mut() {
            readers.retain(|&r| r != idx);
        }
        Some(node)
    }

    /// Makes input `slot` of node `idx` read `new` (edges follow).
    pub fn set_input(&mut self, idx: NodeIndex, slot: usize, new: Option<TensorId>) {
        let Some(old) = self.nodes[idx].inputs.get(slot).copied() else {
            return;
        };
        self.nodes[idx].inputs[slot] = new;
        if let Some(old) = old {
            if !self.nodes[idx].inputs.contains(&Some(old)) {
                let stale: Vec<_> = self
                    .nodes
                    .edges_directed(idx, petgraph::Direction::Incoming)
                    .filter(|e| *e.weight() == old)
                    .map(|e| e.id())
                    .collect();
                for e in stale {
                    self.nodes.remove_edge(e);
                }
                if let Some(readers) = self.early_readers.get_mut(&old) {
                    readers.retain(|&r| r != idx);
                }
            }
        }
        if let Some(new) = new {
            match self.producers[new.index()] {
                Some(p) => {
                    self.nodes.add_edge(p, idx, new);
                }
                None => self.early_readers.entry(new).or_default().push(idx),
            }
        }
    }

    /// Makes every consumer of `old` (and the graph outputs) read `new` instead.
    pub fn replace_uses(&mut self, old: TensorId, new: TensorId) {
        let consumers = self.consumers(old);
        for c in consumers {
            let stale: Vec<_> = self
                .nodes
                .edges_directed(c, petgraph::Direction::Incoming)
                .filter(|e| *e.weight() == old)
                .map(|e| e.id())
                .collect();
            for e in stale {
                self.nodes.remove_edge(e);
            }
            for inp in self.nodes[c].inputs.iter_mut() {
                if *inp == Some(old) {
                    *inp = Some(new);
                }
            }
            match self.producers[new.index()] {
                Some(p) => {
                    self.nodes.add_edge(p, c, new);
                }
                None => self.early_readers.entry(new).or_default().push(c),
            }
        }
        for o in self.outputs.iter_mut() {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Nodes that read tensor `t`.
    pub fn consumers(&self, t: TensorId) -> Vec<NodeIndex> {
        match self.producers.get(t.index()).copied().flatten() {
            Some(p) => {
                let mut v: Vec<NodeIndex> = self
                    .nodes
                    .edges_directed(p, petgraph::Direction::Outgoing)
                    .filter(|e| *e.weight() == t)
                    .map(|e| e.target())
                    .collect();
                v.sort();
                v.dedup();
                v
            }
            None => self
                .nodes
                .node_indices()
                .filter(|&n| self.nodes[n].inputs.contains(&Some(t)))
                .collect(),
        }
    }

    /// The node that writes `t`, if any.
    pub fn producer(&self, t: TensorId) -> Option<NodeIndex> {
        self.producers.get(t.index()).copied().flatten()
    }

    /// A node by index.
    pub fn node(&self, idx: NodeIndex) -> &Node {
        &self.nodes[idx]
    }

    /// Mutable access to a node's op (attributes only; inputs and outputs
    /// change through [`Graph::replace_uses`]).
    pub fn op_mut(&mut self, idx: NodeIndex) -> &mut Op {
        &mut self.nodes[idx].op
    }

    /// All node indices in insertion order.
    pub fn node_indices(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.nodes.node_indices()
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.node_count()
    }

    /// A tensor by id.
    pub fn tensor(&self, t: TensorId) -> &Tensor {
        &self.tensors[t.index()]
    }

    /// Mutable access to a tensor.
    pub fn tensor_mut(&mut self, t: TensorId) -> &mut Tensor {
        &mut self.tensors[t.index()]
    }

    /// All tensors with their ids (including ones no node uses any more).
    pub fn tensors(&self) -> impl Iterator<Item = (TensorId, &Tensor)> {
        self.tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (TensorId(i as u32), t))
    }

    /// Nodes in a topological order (ties broken by insertion order, so the
    /// order is deterministic).
    pub fn topo_order(&self) -> Result<Vec<NodeIndex>, GraphError> {
        let mut indeg: BTreeMap<NodeIndex, usize> = self.nodes.node_indices().map(|n| (n, 0)).collect();
        for e in self.nodes.edge_references() {
            *indeg.get_mut(&e.target()).unwrap() += 1;
        }
        let mut ready: std::collections::BTreeSet<NodeIndex> =
            indeg.iter().filter(|(_, &d)| d == 0).map(|(&n, _)| n).collect();
        let mut order = Vec::with_capacity(indeg.len());
        while let Some(n) = ready.pop_first() {
            order.push(n);
            for e in self.nodes.edges_directed(n, petgraph::Direction::Outgoing) {
                let d = indeg.get_mut(&e.target()).unwrap();
                *d -= 1;
                if *d == 0 {
                    ready.insert(e.target());
                }
            }
        }
        if order.len() != indeg.len() {
            let stuck = indeg
                .keys()
                .find(|n| !order.contains(n))
                .map(|&n| self.nodes[n].name.clone())
                .unwrap_or_default();
            return Err(GraphError::Cycle { node: stuck });
        }
        Ok(order)
    }

    /// Infers the output types of node `idx` from its inputs' recorded types
    /// (and constant values).
    pub fn infer_node(&self, idx: NodeIndex) -> Result<Vec<TensorType>, GraphError> {
        let node = &self.nodes[idx];
        let inputs: Vec<Option<InferInput>> = node
            .inputs
            .iter()
            .map(|t| {
                t.map(|t| {
                    let tensor = &self.tensors[t.index()];
                    InferInput {
                        ty: &tensor.ty,
                        value: tensor.data.as_deref(),
                    }
                })
            })
            .collect();
        node.op.infer(&inputs).map_err(|source| GraphError::Op {
            node: node.name.clone(),
            source,
        })
    }

    /// Checks the graph: every input exists and is produced or fed, no
    /// cycles, output counts match ops, and every recorded output type equals
    /// what shape inference gives. Errors name the node.
    pub fn validate(&self) -> Result<(), GraphError> {
        for idx in self.topo_order()? {
            let node = &self.nodes[idx];
            for (slot, t) in node.inputs.iter().enumerate() {
                let Some(t) = t else { continue };
                let Some(tensor) = self.tensors.get(t.index()) else {
                    return Err(GraphError::DanglingInput {
                        node: node.name.clone(),
                        slot,
                        tensor: t.0,
                    });
                };
                if tensor.role == Role::Activation && self.producers[t.index()].is_none() {
                    return Err(GraphError::Unproduced {
                        node: node.name.clone(),
                        slot,
                        tensor: tensor.name.clone(),
                    });
                }
            }
            if node.outputs.len() != node.op.num_outputs() {
                return Err(GraphError::OutputCount {
                    node: node.name.clone(),
                    op: node.op.name(),
                    expected: node.op.num_outputs(),
                    got: node.outputs.len(),
                });
            }
            let inferred = self.infer_node(idx)?;
            for (slot, (&t, ty)) in node.outputs.iter().zip(&inferred).enumerate() {
                let recorded = &self.tensors[t.index()].ty;
                if recorded != ty {
                    return Err(GraphError::ShapeMismatch {
                        node: node.name.clone(),
                        slot,
                        tensor: self.tensors[t.index()].name.clone(),
                        recorded: format!("{}{}", recorded.dtype, recorded.shape),
                        inferred: format!("{}{}", ty.dtype, ty.shape),
                    });
                }
            }
        }
        for &o in &self.outputs {
            let t = &self.tensors[o.index()];
            if t.role == Role::Activation && self.producers[o.index()].is_none() {
                return Err(GraphError::MissingOutput {
                    tensor: t.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Count of nodes per op name, sorted by name.
    pub fn op_histogram(&self) -> BTreeMap<String, usize> {
        let mut h = BTreeMap::new();
        for n in self.nodes.node_weights() {
            *h.entry(n.op.name()).or_default() += 1;
        }
        h
    }

    /// Count of nodes per op class.
    pub fn class_histogram(&self) -> BTreeMap<OpClass, usize> {
        let mut h = BTreeMap::new();
        for n in self.nodes.node_weights() {
            *h.entry(n.op.class()).or_default() += 1;
        }
        h
    }

    /// Tensors used by at least one node or as a graph output.
    fn live_tensors(&self) -> Vec<bool> {
        let mut live = vec![false; self.tensors.len()];
        for n in self.nodes.node_weights() {
            for t in n.inputs.iter().flatten().chain(&n.outputs) {
                live[t.index()] = true;
            }
        }
        for t in self.inputs.iter().chain(&self.outputs) {
            live[t.index()] = true;
        }
        live
    }

    /// Elements of float parameters that the graph uses (weightless ones
    /// included: their shapes are known).
    pub fn float_parameter_elements(&self, bindings: &Bindings) -> u64 {
        let live = self.live_tensors();
        self.tensors
            .iter()
            .zip(live)
            .filter(|(t, live)| *live && t.role == Role::Parameter && t.ty.dtype.is_float())
            .filter_map(|(t, _)| t.ty.shape.numel(bindings))
            .sum()
    }

    /// Drops tensors that nothing uses and renumbers the rest, keeping order.
    /// Returns the graph with dense tensor ids (what serialisation expects).
    pub fn compacted(&self) -> Graph {
        let live = self.live_tensors();
        let mut remap = vec![None; self.tensors.len()];
        let mut g = Graph::new(self.name.clone());
        for (i, t) in self.tensors.iter().enumerate() {
            if live[i] {
                remap[i] = Some(g.add_tensor(t.name.clone(), t.ty.clone(), t.role, t.data.clone()));
            }
        }
        let map = |t: TensorId| remap[t.index()].expect("live tensor");
        for idx in self
            .topo_order()
            .unwrap_or_else(|_| self.nodes.node_indices().collect())
        {
            let n = &self.nodes[idx];
            g.add_node(
                n.name.clone(),
                n.op.clone(),
                n.inputs.iter().map(|t| t.map(map)).collect(),
                n.outputs.iter().map(|&t| map(t)).collect(),
            )
            .expect("remapped node is valid");
        }
        g.inputs = self.inputs.iter().map(|&t| map(t)).collect();
        g.outputs = self.outputs.iter().map(|&t| map(t)).collect();
        g.blocks = self.blocks.clone();
        g.bindings = self.bindings.clone();
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, DType, Shape, TensorType};

    fn ty() -> TensorType {
        TensorType {
            dtype: DType::F32,
            shape: Shape::fixed(&[2]),
        }
    }

    #[test]
    fn set_input_moves_the_read_and_its_edge() {
        let mut g = Graph::new("g");
        let (a, b, c) = (
            g.add_tensor("a", ty(), Role::Parameter, None),
            g.add_tensor("b", ty(), Role::Parameter, None),
            g.add_tensor("c", ty(), Role::Activation, None),
        );
        let add = Op::Binary { func: BinaryOp::Add };
        let first = g
            .add_node("first", add.clone(), vec![Some(a), Some(a)], vec![c])
            .unwrap();
        let out = g.add_tensor("out", ty(), Role::Activation, None);
        let second = g
            .add_node("second", add, vec![Some(c), Some(a)], vec![out])
            .unwrap();
        g.set_input(second, 1, Some(b));
        assert_eq!(g.consumers(a), vec![first]);
        assert_eq!(g.consumers(b), vec![second]);
        // Rewiring an activation input keeps the producer edge right.
        let d = g.add_tensor("d", ty(), Role::Activation, None);
        let third = g
            .add_node(
                "third",
                Op::Unary {
                    func: crate::UnaryOp::Neg,
                },
                vec![Some(a)],
                vec![d],
            )
            .unwrap();
        g.set_input(second, 0, Some(d));
        assert!(g.consumers(c).is_empty());
        assert_eq!(g.consumers(d), vec![second]);
        let order = g.topo_order().unwrap();
        let pos = |n| order.iter().position(|&x| x == n).unwrap();
        assert!(pos(third) < pos(second));
        g.validate().unwrap();
    }
}

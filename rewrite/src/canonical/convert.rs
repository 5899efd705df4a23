//! Graph ⇄ e-graph: import a graph (normalising attributes so that equal ops
//! hash equal), and extract the cheapest graph back out.

use super::analysis::{add_typed, Meta, EG};
use super::lang::{Head, ONode};
use super::RewriteError;
use autopar_ir::op::{Op, OpClass, TensorType};
use autopar_ir::{Graph, Role, Shape, TensorId};
use egg::{CostFunction, Extractor, Id, Language};
use std::collections::HashMap;

/// What the import remembers of the source graph, to reuse its names.
pub struct Imported {
    pub egraph: EG,
    /// One class per graph output.
    pub roots: Vec<Id>,
    /// Class of each original tensor, with the tensor's name.
    tensor_names: Vec<(Id, String)>,
    /// Class of each original single-output node, with the node's name and op.
    node_names: Vec<(Id, String, Op)>,
}

fn negative_axis(axis: i64, rank: usize) -> i64 {
    if axis >= 0 {
        axis - rank as i64
    } else {
        axis
    }
}

fn negative_axes(axes: &[i64], rank: usize) -> Vec<i64> {
    let mut a: Vec<i64> = axes.iter().map(|&x| negative_axis(x, rank)).collect();
    a.sort_unstable();
    a
}

/// Rewrites attributes into one canonical spelling (negative axes, explicit
/// perms, constant `axes` inputs folded into the attribute) so rules can match
/// exact heads. Returns the op and how many leading inputs it keeps.
fn normalize(op: &Op, graph: &Graph, inputs: &[Option<TensorId>]) -> (Op, usize) {
    let rank = |i: usize| {
        inputs
            .get(i)
            .copied()
            .flatten()
            .map(|t| graph.tensor(t).ty.shape.rank())
    };
    let value = |i: usize| {
        let t = graph.tensor(inputs.get(i).copied().flatten()?);
        match t.role {
            Role::Constant => t.data.clone(),
            _ => None,
        }
    };
    let n = inputs.len();
    match (op, rank(0)) {
        (Op::Softmax { axis }, Some(r)) => (
            Op::Softmax {
                axis: negative_axis(*axis, r),
            },
            n,
        ),
        (
            Op::TopK {
                axis,
                largest,
                sorted,
            },
            Some(r),
        ) => (
            Op::TopK {
                axis: negative_axis(*axis, r),
                largest: *largest,
                sorted: *sorted,
            },
            n,
        ),
        (Op::Gather { axis }, Some(r)) if *axis < 0 => (
            Op::Gather {
                axis: axis + r as i64,
            },
            n,
        ),
        (Op::Transpose { perm: None }, Some(r)) => (
            Op::Transpose {
                perm: Some((0..r).rev().collect()),
            },
            n,
        ),
        (
            Op::Reduce {
                kind,
                axes,
                keepdims,
                noop_with_empty_axes,
            },
            Some(r),
        ) => {
            let from_input = value(1).and_then(|v| v.as_i64().map(<[i64]>::to_vec));
            let folded = match (axes, from_input) {
                (Some(a), _) => Some((negative_axes(a, r), n)),
                (None, Some(a)) if !a.is_empty() => Some((negative_axes(&a, r), 1)),
                _ => None,
            };
            match folded {
                Some((a, keep)) => (
                    Op::Reduce {
                        kind: *kind,
                        axes: Some(a),
                        keepdims: *keepdims,
                        noop_with_empty_axes: *noop_with_empty_axes,
                    },
                    keep,
                ),
                None => (op.clone(), n),
            }
        }
        (Op::Reshape { allowzero: true }, _) => {
            match value(1).and_then(|v| v.as_i64().map(|s| s.contains(&0))) {
                Some(false) => (Op::Reshape { allowzero: false }, n),
                _ => (op.clone(), n),
            }
        }
        _ => (op.clone(), n),
    }
}

/// Builds the e-graph of `graph`, all outputs as roots.
pub fn import(graph: &Graph) -> Result<Imported, RewriteError> {
    let meta = Meta::new(graph.tensors().map(|(_, t)| t.clone()).collect());
    let mut egraph = EG::new(meta);
    let mut class: HashMap<TensorId, Id> = HashMap::new();
    let mut tensor_names = Vec::new();
    let mut node_names = Vec::new();
    let absent = egraph.add(ONode::absent());
    let class_of = |egraph: &mut EG, class: &HashMap<TensorId, Id>, t: TensorId| match class.get(&t) {
        Some(&id) => id,
        None => egraph.add(ONode::leaf(t.0)),
    };
    let order = graph.topo_order().map_err(RewriteError::Graph)?;
    for idx in order {
        let node = graph.node(idx);
        let (op, keep) = normalize(&node.op, graph, &node.inputs);
        // Trailing absent inputs carry no meaning; drop them so patterns see one arity.
        let keep = node.inputs[..keep]
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |p| p + 1);
        let children: Vec<Id> = node.inputs[..keep]
            .iter()
            .map(|t| match t {
                Some(t) => class_of(&mut egraph, &class, *t),
                None => absent,
            })
            .collect();
        let tys: Vec<TensorType> = node.outputs.iter().map(|&t| graph.tensor(t).ty.clone()).collect();
        let multi = op.num_outputs() != 1;
        let id = add_typed(&mut egraph, ONode::op(op.clone(), children), tys);
        if multi {
            for (i, &t) in node.outputs.iter().enumerate() {
                class.insert(t, egraph.add(ONode::get(i, id)));
            }
        } else {
            node_names.push((id, node.name.clone(), op));
            if let Some(&t) = node.outputs.first() {
                class.insert(t, id);
            }
        }
        for &t in &node.outputs {
            tensor_names.push((class[&t], graph.tensor(t).name.clone()));
        }
    }
    let roots = graph
        .outputs
        .iter()
        .map(|&t| class_of(&mut egraph, &class, t))
        .collect();
    for &t in &graph.inputs {
        class_of(&mut egraph, &class, t);
    }
    egraph.rebuild();
    Ok(Imported {
        egraph,
        roots,
        tensor_names,
        node_names,
    })
}

/// Extraction cost: canonical ops are cheap, data movement cheaper than
/// compute, leaves free; a subgraph costs the sum of its parts.
pub struct PreferCanonical;

impl CostFunction<ONode> for PreferCanonical {
    type Cost = f64;

    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &ONode, mut costs: C) -> f64 {
        let own = match enode.as_op() {
            None => 0.0,
            Some(Op::Gemm { .. } | Op::MatMul | Op::Softmax { .. } | Op::TopK { .. }) => 10.0,
            Some(op) => match op.class() {
                OpClass::Linear
                | OpClass::Attention
                | OpClass::Norm
                | OpClass::Activation
                | OpClass::Embedding
                | OpClass::MoeRouting => 1.0,
                OpClass::DataMovement => 2.0,
                _ => 10.0,
            },
        };
        enode.children().iter().fold(own, |acc, &c| acc + costs(c))
    }
}

struct Builder<'a> {
    egraph: &'a EG,
    extractor: Extractor<'a, PreferCanonical, ONode, Meta>,
    out: Graph,
    built: HashMap<Id, Vec<Option<TensorId>>>,
    leaves: HashMap<u32, TensorId>,
    tensor_names: HashMap<Id, String>,
    node_names: HashMap<Id, (String, Op)>,
    fresh: usize,
}

impl Builder<'_> {
    /// The tensors of class `id` (one per output), building producers first.
    fn build(&mut self, id: Id) -> Result<Vec<Option<TensorId>>, RewriteError> {
        let id = self.egraph.find(id);
        if let Some(t) = self.built.get(&id) {
            return Ok(t.clone());
        }
        let node = self.extractor.find_best_node(id).clone();
        let tensors = match &node.head {
            Head::Absent => vec![None],
            Head::Leaf(i) => vec![Some(self.leaf(*i))],
            Head::Get(i) => {
                let tuple = self.build(node.children[0])?;
                vec![tuple.get(*i).copied().flatten()]
            }
            Head::Op(_) => self.build_op(id, &node)?,
        };
        self.built.insert(id, tensors.clone());
        Ok(tensors)
    }

    fn leaf(&mut self, i: u32) -> TensorId {
        if let Some(&t) = self.leaves.get(&i) {
            return t;
        }
        let src = &self.egraph.analysis.leaves[i as usize];
        let t = self
            .out
            .add_tensor(src.name.clone(), src.ty.clone(), src.role, src.data.clone());
        self.leaves.insert(i, t);
        t
    }

    fn build_op(&mut self, id: Id, node: &ONode) -> Result<Vec<Option<TensorId>>, RewriteError> {
        let op = node
            .as_op()
            .cloned()
            .ok_or(RewriteError::Extraction { class: id.into() })?;
        let mut inputs = Vec::with_capacity(node.children.len());
        for &c in &node.children {
            inputs.push(self.build(c)?.first().copied().flatten());
        }
        // Trailing absent inputs are dropped, as ONNX does.
        while inputs.last() == Some(&None) {
            inputs.pop();
        }
        let n = op.num_outputs();
        let name = match self.node_names.get(&id) {
            Some((name, orig)) if *orig == op => name.clone(),
            _ => {
                self.fresh += 1;
                format!("canon/{}_{}", op.name(), self.fresh)
            }
        };
        let tys = &self.egraph[id].data.tys;
        let mut outputs = Vec::with_capacity(n);
        for i in 0..n {
            let out_class = if n == 1 {
                Some(id)
            } else {
                self.egraph.lookup(ONode::get(i, id))
            };
            let tname = out_class
                .and_then(|c| self.tensor_names.get(&self.egraph.find(c)).cloned())
                .unwrap_or_else(|| format!("{name}_out{i}"));
            let placeholder = tys.get(i).cloned().unwrap_or(TensorType {
                dtype: autopar_ir::DType::F32,
                shape: Shape(vec![]),
            });
            outputs.push(self.out.add_tensor(tname, placeholder, Role::Activation, None));
        }
        let idx = self
            .out
            .add_node(name, op, inputs, outputs.clone())
            .map_err(RewriteError::Graph)?;
        let inferred = self.out.infer_node(idx).map_err(RewriteError::Graph)?;
        for (&t, ty) in outputs.iter().zip(inferred) {
            self.out.tensor_mut(t).ty = ty;
        }
        Ok(outputs.into_iter().map(Some).collect())
    }
}

/// Extracts the cheapest graph for `imported`'s roots; inputs, bindings and
/// still-valid blocks come from `source`.
pub fn extract(imported: &Imported, source: &Graph) -> Result<Graph, RewriteError> {
    let egraph = &imported.egraph;
    let first = |pairs: &mut dyn Iterator<Item = (Id, String)>| {
        let mut m = HashMap::new();
        for (id, name) in pairs {
            m.entry(egraph.find(id)).or_insert(name);
        }
        m
    };
    let tensor_names = first(&mut imported.tensor_names.iter().cloned());
    let mut node_names = HashMap::new();
    for (id, name, op) in &imported.node_names {
        node_names
            .entry(egraph.find(*id))
            .or_insert((name.clone(), op.clone()));
    }
    let mut b = Builder {
        egraph,
        extractor: Extractor::new(egraph, PreferCanonical),
        out: Graph::new(source.name.clone()),
        built: HashMap::new(),
        leaves: HashMap::new(),
        tensor_names,
        node_names,
        fresh: 0,
    };
    let mut outputs = Vec::new();
    for (&root, &t) in imported.roots.iter().zip(&source.outputs) {
        let built = b.build(root)?;
        outputs.push(
            built
                .first()
                .copied()
                .flatten()
                .ok_or_else(|| RewriteError::MissingOutput {
                    tensor: source.tensor(t).name.clone(),
                })?,
        );
    }
    let inputs: Vec<TensorId> = source.inputs.iter().map(|t| b.leaf(t.0)).collect();
    let mut g = b.out;
    g.inputs = inputs;
    g.outputs = outputs;
    g.bindings = source.bindings.clone();
    let names: std::collections::HashSet<String> = g.node_indices().map(|n| g.node(n).name.clone()).collect();
    g.blocks = source
        .blocks
        .iter()
        .filter(|blk| blk.nodes.iter().all(|n| names.contains(n)))
        .cloned()
        .collect();
    Ok(g.compacted())
}

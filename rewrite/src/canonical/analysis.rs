//! The e-class analysis: static types, known constant values and leaf roles,
//! which rule conditions read (`is this a 2-D parameter`, `is this 0.5`).
//!
//! Nodes imported from the graph bring their recorded types; nodes that rules
//! add get theirs from [`Op::infer`]. Ops whose inputs are all known
//! constants (never parameters, whose data must not change) are evaluated and
//! the class gains a constant leaf, which folds leftover shape arithmetic.

use super::lang::{Head, ONode};
use autopar_ir::op::{InferInput, TensorType};
use autopar_ir::{Role, Tensor, Value};
use egg::{Analysis, DidMerge, EGraph, Id};
use std::sync::Arc;

/// The e-graph type used by the rewrites.
pub type EG = EGraph<ONode, Meta>;

/// Largest constant (in elements) that folding materialises.
const FOLD_LIMIT: usize = 1 << 16;

/// Analysis state: the leaf table and the types of the node being imported.
#[derive(Debug, Default)]
pub struct Meta {
    /// Tensors that leaves refer to: the source graph's tensors by id, then
    /// constants created by folding.
    pub leaves: Vec<Tensor>,
    /// Recorded output types for the node currently being added (taken by
    /// `make`); see [`add_typed`].
    pending: Option<Vec<TensorType>>,
}

impl Meta {
    /// Analysis state whose leaves are `leaves` (leaf `i` is `leaves[i]`).
    pub fn new(leaves: Vec<Tensor>) -> Meta {
        Meta {
            leaves,
            pending: None,
        }
    }
}

/// What is known about one e-class.
#[derive(Debug, Clone, Default)]
pub struct Info {
    /// Output types (one per output of a multi-output op); empty if unknown.
    pub tys: Vec<TensorType>,
    /// The value, when known: a stored tensor's data (parameters included,
    /// read but never folded) or a folded constant.
    pub value: Option<Arc<Value>>,
    /// Role of the tensor when the class holds a leaf (a folded constant
    /// counts as `Constant`).
    pub role: Option<Role>,
}

impl Info {
    /// The single output type, if known.
    pub fn ty(&self) -> Option<&TensorType> {
        match self.tys.as_slice() {
            [t] => Some(t),
            _ => None,
        }
    }

    /// The value of a one-element constant.
    pub fn scalar(&self) -> Option<f64> {
        let v = self.value.as_ref()?;
        (v.numel() == 1).then(|| v.to_f64_vec()[0])
    }
}

/// Adds `node` whose output types are already known (imported from a graph).
pub fn add_typed(egraph: &mut EG, node: ONode, tys: Vec<TensorType>) -> Id {
    egraph.analysis.pending = Some(tys);
    let id = egraph.add(node);
    egraph.analysis.pending = None;
    id
}

fn make_op(egraph: &EG, enode: &ONode, pending: Option<Vec<TensorType>>) -> Info {
    let Some(op) = enode.as_op() else {
        return Info::default();
    };
    let kids: Vec<&Info> = enode.children.iter().map(|&c| &egraph[c].data).collect();
    let absent: Vec<bool> = enode
        .children
        .iter()
        .map(|&c| egraph[c].nodes.iter().any(|n| n.head == Head::Absent))
        .collect();
    let tys = pending.unwrap_or_else(|| {
        let inputs: Option<Vec<Option<InferInput>>> = kids
            .iter()
            .zip(&absent)
            .map(|(k, &a)| {
                if a {
                    Some(None)
                } else {
                    k.ty().map(|ty| {
                        Some(InferInput {
                            ty,
                            value: k.value.as_deref(),
                        })
                    })
                }
            })
            .collect();
        inputs.and_then(|i| op.infer(&i).ok()).unwrap_or_default()
    });
    let all_constant = kids
        .iter()
        .zip(&absent)
        .all(|(k, &a)| a || (k.value.is_some() && k.role == Some(Role::Constant)));
    let small = tys.len() == 1
        && tys[0]
            .shape
            .as_fixed()
            .is_some_and(|s| s.iter().product::<usize>() <= FOLD_LIMIT);
    let value = if all_constant && small {
        let inputs: Vec<Option<&Value>> = kids.iter().map(|k| k.value.as_deref()).collect();
        op.eval(&inputs).ok().and_then(|mut v| v.pop()).map(Arc::new)
    } else {
        None
    };
    Info {
        tys,
        role: value.as_ref().map(|_| Role::Constant),
        value,
    }
}

impl Analysis<ONode> for Meta {
    type Data = Info;

    fn make(egraph: &mut EG, enode: &ONode, _id: Id) -> Info {
        let pending = egraph.analysis.pending.take();
        match &enode.head {
            Head::Leaf(i) => match egraph.analysis.leaves.get(*i as usize) {
                Some(t) => Info {
                    tys: vec![t.ty.clone()],
                    value: t.data.clone(),
                    role: Some(t.role),
                },
                None => Info::default(),
            },
            Head::Absent => Info::default(),
            Head::Get(i) => Info {
                tys: egraph[enode.children[0]]
                    .data
                    .tys
                    .get(*i)
                    .cloned()
                    .into_iter()
                    .collect(),
                ..Info::default()
            },
            Head::Op(_) => make_op(egraph, enode, pending),
        }
    }

    fn merge(&mut self, to: &mut Info, from: Info) -> DidMerge {
        let mut changed = DidMerge(false, false);
        if to.tys.is_empty() && !from.tys.is_empty() {
            to.tys = from.tys;
            changed.0 = true;
        } else if !from.tys.is_empty() && to.tys != from.tys {
            changed.1 = true;
        }
        if to.value.is_none() && from.value.is_some() {
            to.value = from.value;
            changed.0 = true;
        }
        if to.role.is_none() && from.role.is_some() {
            to.role = from.role;
            changed.0 = true;
        }
        changed
    }

    fn modify(egraph: &mut EG, id: Id) {
        let data = &egraph[id].data;
        let Some(value) = data.value.clone() else { return };
        if egraph[id].nodes.iter().any(|n| matches!(n.head, Head::Leaf(_))) {
            return;
        }
        let ty = match data.ty() {
            Some(t) => t.clone(),
            None => return,
        };
        let index = egraph.analysis.leaves.len() as u32;
        egraph.analysis.leaves.push(Tensor {
            name: format!("folded_{index}"),
            ty,
            role: Role::Constant,
            data: Some(value),
        });
        let leaf = egraph.add(ONode::leaf(index));
        egraph.union(id, leaf);
    }
}

//! Reverse-mode automatic differentiation as a graph transformation: the
//! backward pass is appended to the forward graph as ordinary IR nodes, so
//! the interpreter runs it, the cost model prices it, and lowering can split
//! it across ranks like any other op.
//!
//! The loss is `Σ_outputs sum(output · C_output)`: each float graph output
//! gets a cotangent input `C` (named `<output>.cotangent`) seeding its
//! gradient, which is how references computed with PyTorch are checked; a
//! training loss is one more op at the end of the forward graph whose output
//! is seeded with one.
//!
//! Each op's backward rule lives in `rules/`, one file per op family, and
//! builds the input gradients from the op's inputs, outputs and output
//! gradients with [`Ctx`] (`ctx.rs`), which also holds the helpers every
//! rule shares. Gradients reaching a tensor from several
//! consumers are summed. Only float tensors that depend on a parameter get
//! gradients.

mod ctx;
mod rules;
#[cfg(test)]
pub(crate) mod testing;

pub use ctx::Ctx;

use crate::{Graph, GraphError, NodeIndex, Op, OpError, Role, Shape, TensorId, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// The forward graph with its backward pass appended.
#[derive(Debug, Clone)]
pub struct Differentiated {
    /// Inputs: the forward inputs, then one cotangent per float output.
    /// Outputs: the forward outputs, then one gradient per parameter.
    pub graph: Graph,
    /// `(forward output name, cotangent input name)`.
    pub cotangents: Vec<(String, String)>,
    /// `(parameter name, gradient output name)`, in the order of the
    /// graph's outputs after the forward ones; parameters the loss does not
    /// depend on are absent.
    pub gradients: Vec<(String, String)>,
    /// Backward node name → the forward node whose rule emitted it, so
    /// lowering can place each backward node with its forward node (on the
    /// same pipeline stage). The per-parameter gradient identities are absent.
    pub origins: HashMap<String, String>,
}

/// Why a graph could not be differentiated; names the node.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    #[error("node '{node}': no backward rule for {op} yet")]
    Unsupported { node: String, op: String },
    #[error("node '{node}': {message}")]
    Rule { node: String, message: String },
    #[error("node '{node}': building its backward pass: {source}")]
    Op { node: String, source: OpError },
    #[error("the graph has no float output to differentiate")]
    NoLoss,
    #[error("tensor '{tensor}' has shape {shape} with an unbound symbol; bind batch and seq first")]
    Unbound { tensor: String, shape: String },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Appends the backward pass of `forward`. Symbolic dims are first bound
/// to the graph's default bindings (gradients of reshapes need concrete
/// shapes): bind the batch and sequence you will run before calling.
pub fn differentiate(forward: &Graph) -> Result<Differentiated, AutodiffError> {
    let mut graph = forward.clone();
    bind_dims(&mut graph)?;
    let order = graph.topo_order()?;
    let needs = needs_grad(&graph, &order);
    let mut grads: HashMap<TensorId, TensorId> = HashMap::new();
    let mut cotangents = Vec::new();
    for &out in &forward.outputs {
        let tensor = graph.tensor(out).clone();
        if !tensor.ty.dtype.is_float() || !needs.contains(&out) {
            continue;
        }
        let name = format!("{}.cotangent", tensor.name);
        let c = graph.add_tensor(name.clone(), tensor.ty.clone(), Role::Input, None);
        graph.inputs.push(c);
        cotangents.push((tensor.name.clone(), name));
        grads.insert(out, c);
    }
    if cotangents.is_empty() {
        return Err(AutodiffError::NoLoss);
    }
    let mut origins = HashMap::new();
    for &idx in order.iter().rev() {
        let node = graph.node(idx).clone();
        let out_grads: Vec<Option<TensorId>> = node.outputs.iter().map(|t| grads.get(t).copied()).collect();
        if out_grads.iter().all(Option::is_none) {
            continue;
        }
        let wants: Vec<bool> = node
            .inputs
            .iter()
            .map(|t| t.is_some_and(|t| needs.contains(&t)))
            .collect();
        if !wants.iter().any(|&w| w) {
            continue;
        }
        let mut ctx = Ctx::new(&mut graph, &node);
        let in_grads = rules::input_grads(&mut ctx, &node, &out_grads, &wants)?;
        for ((slot, input), g) in node.inputs.iter().enumerate().zip(in_grads) {
            let (Some(input), Some(g), true) = (*input, g, wants[slot]) else {
                continue;
            };
            let total = match grads.get(&input) {
                Some(&prev) => ctx.emit1(
                    Op::Binary {
                        func: crate::BinaryOp::Add,
                    },
                    &[prev, g],
                )?,
                None => g,
            };
            grads.insert(input, total);
        }
        for name in ctx.emitted() {
            origins.insert(name, node.name.clone());
        }
    }
    let mut gradients = Vec::new();
    let params: Vec<TensorId> = graph
        .tensors()
        .filter(|(_, t)| t.role == Role::Parameter && t.ty.dtype.is_float())
        .map(|(id, _)| id)
        .collect();
    for p in params {
        let Some(&g) = grads.get(&p) else { continue };
        let name = format!("{}.grad", graph.tensor(p).name);
        // An identity gives the gradient its own, predictable output name.
        let out = graph.add_tensor(name.clone(), graph.tensor(g).ty.clone(), Role::Activation, None);
        graph.add_node(
            format!("grad/{name}"),
            Op::Unary {
                func: crate::UnaryOp::Identity,
            },
            vec![Some(g)],
            vec![out],
        )?;
        graph.outputs.push(out);
        gradients.push((graph.tensor(p).name.clone(), name));
    }
    Ok(Differentiated {
        graph,
        cotangents,
        gradients,
        origins,
    })
}

/// Replaces every symbolic dim with its value from `graph.bindings`.
fn bind_dims(graph: &mut Graph) -> Result<(), AutodiffError> {
    let ids: Vec<TensorId> = graph.tensors().map(|(id, _)| id).collect();
    for id in ids {
        let tensor = graph.tensor(id);
        if !tensor.ty.shape.is_symbolic() {
            continue;
        }
        let dims = tensor
            .ty
            .shape
            .resolve(&graph.bindings)
            .ok_or_else(|| AutodiffError::Unbound {
                tensor: tensor.name.clone(),
                shape: tensor.ty.shape.to_string(),
            })?;
        graph.tensor_mut(id).ty.shape = Shape::fixed(&dims);
    }
    Ok(())
}

/// Float tensors that depend on a float parameter (including the parameters).
fn needs_grad(graph: &Graph, order: &[NodeIndex]) -> HashSet<TensorId> {
    let mut needs: HashSet<TensorId> = graph
        .tensors()
        .filter(|(_, t)| t.role == Role::Parameter && t.ty.dtype.is_float())
        .map(|(id, _)| id)
        .collect();
    for &idx in order {
        let node = graph.node(idx);
        if node.inputs.iter().flatten().any(|t| needs.contains(t)) {
            for &o in &node.outputs {
                if graph.tensor(o).ty.dtype.is_float() {
                    needs.insert(o);
                }
            }
        }
    }
    needs
}

/// Values of a differentiated graph's parameter gradients after a run,
/// by parameter name.
pub fn gradients_by_name(d: &Differentiated, outputs: &[Value]) -> BTreeMap<String, Arc<Value>> {
    let forward = d.graph.outputs.len() - d.gradients.len();
    d.gradients
        .iter()
        .zip(outputs.iter().skip(forward))
        .map(|((param, _), v)| (param.clone(), Arc::new(v.clone())))
        .collect()
}

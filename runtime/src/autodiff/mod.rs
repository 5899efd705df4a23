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
//! gradients with [`Ctx`]. Gradients reaching a tensor from several
//! consumers are summed. Only float tensors that depend on a parameter get
//! gradients.

mod rules;
#[cfg(test)]
pub(crate) mod testing;

use autopar_ir::{
    DType, Graph, GraphError, InferInput, Node, NodeIndex, Op, OpError, Role, Shape, TensorId, TensorType,
    Value,
};
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
        let mut ctx = Ctx {
            graph: &mut graph,
            node: &node,
            count: 0,
            emitted: Vec::new(),
        };
        let in_grads = rules::input_grads(&mut ctx, &node, &out_grads, &wants)?;
        for ((slot, input), g) in node.inputs.iter().enumerate().zip(in_grads) {
            let (Some(input), Some(g), true) = (*input, g, wants[slot]) else {
                continue;
            };
            let total = match grads.get(&input) {
                Some(&prev) => ctx.emit1(
                    Op::Binary {
                        func: autopar_ir::BinaryOp::Add,
                    },
                    &[prev, g],
                )?,
                None => g,
            };
            grads.insert(input, total);
        }
        for name in ctx.emitted {
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
                func: autopar_ir::UnaryOp::Identity,
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

/// What a backward rule builds with: the graph being extended and the
/// forward node whose gradients it computes.
pub struct Ctx<'a> {
    graph: &'a mut Graph,
    node: &'a Node,
    count: usize,
    emitted: Vec<String>,
}

impl Ctx<'_> {
    /// The type of `t`.
    pub fn ty(&self, t: TensorId) -> &TensorType {
        &self.graph.tensor(t).ty
    }

    /// The value of `t` if it is a constant (axes, shapes, scalars); never a
    /// parameter's current value, which training changes.
    pub fn value(&self, t: TensorId) -> Option<&Value> {
        let tensor = self.graph.tensor(t);
        (tensor.role == Role::Constant)
            .then_some(tensor.data.as_deref())
            .flatten()
    }

    /// The error for a case this rule does not handle, naming the node.
    pub fn unsupported(&self, what: &str) -> AutodiffError {
        AutodiffError::Rule {
            node: self.node.name.clone(),
            message: format!("backward of {} {what} is not supported", self.node.op.name()),
        }
    }

    /// Adds `op` on `inputs` to the graph; its outputs' types come from
    /// shape inference. Node and tensor names derive from the forward node.
    pub fn emit(&mut self, op: Op, inputs: &[Option<TensorId>]) -> Result<Vec<TensorId>, AutodiffError> {
        let graph = &*self.graph;
        let infer_inputs: Vec<Option<InferInput>> = inputs
            .iter()
            .map(|t| {
                t.map(|t| {
                    let tensor = graph.tensor(t);
                    InferInput {
                        ty: &tensor.ty,
                        value: tensor.data.as_deref(),
                    }
                })
            })
            .collect();
        let types = op.infer(&infer_inputs).map_err(|source| AutodiffError::Op {
            node: self.node.name.clone(),
            source,
        })?;
        self.count += 1;
        let base = format!("grad/{}/{}", self.node.name, self.count);
        let outputs: Vec<TensorId> = types
            .into_iter()
            .enumerate()
            .map(|(i, ty)| {
                self.graph
                    .add_tensor(format!("{base}.{i}"), ty, Role::Activation, None)
            })
            .collect();
        self.graph
            .add_node(base.clone(), op, inputs.to_vec(), outputs.clone())?;
        self.emitted.push(base);
        Ok(outputs)
    }

    /// [`Ctx::emit`] for an op with every input present and one output.
    pub fn emit1(&mut self, op: Op, inputs: &[TensorId]) -> Result<TensorId, AutodiffError> {
        let inputs: Vec<Option<TensorId>> = inputs.iter().copied().map(Some).collect();
        Ok(self.emit(op, &inputs)?[0])
    }

    /// A constant tensor.
    pub fn constant(&mut self, value: Value) -> TensorId {
        self.count += 1;
        let name = format!("grad/{}/const{}", self.node.name, self.count);
        self.graph.add_constant(name, value)
    }

    /// A 1-D `i64` constant (shapes, axes).
    pub fn ints(&mut self, values: &[i64]) -> TensorId {
        let v = Value::i64(vec![values.len()], values.to_vec()).unwrap_or_else(|_| Value::scalar_i64(0));
        self.constant(v)
    }

    /// A scalar constant of a float dtype.
    pub fn scalar(&mut self, dtype: DType, v: f64) -> TensorId {
        let value = match dtype {
            DType::F64 => Value::f64(vec![], vec![v]),
            _ => Value::f32(vec![], vec![v as f32]),
        };
        let value = value.unwrap_or_else(|_| Value::scalar_i64(0));
        let t = self.constant(value);
        if dtype == DType::F64 || dtype == DType::F32 {
            t
        } else {
            // Other float types: cast the f32 scalar.
            self.emit1(Op::cast(dtype), &[t]).unwrap_or(t)
        }
    }

    /// Sums `grad` (the gradient of a broadcast result) down to `target`'s
    /// shape: leading dims it lacks are summed away, dims where it has 1 are
    /// summed with keepdims. Numpy broadcasting rules.
    pub fn sum_to(&mut self, grad: TensorId, target: &TensorType) -> Result<TensorId, AutodiffError> {
        let from = self.ty(grad).shape.clone();
        if from == target.shape {
            return Ok(grad);
        }
        let (r, t) = (from.rank(), target.shape.rank());
        if t > r {
            return Err(self.unsupported("with a gradient of lower rank than its input"));
        }
        let lead = r - t;
        let mut axes: Vec<i64> = (0..lead as i64).collect();
        for (i, d) in target.shape.0.iter().enumerate() {
            let g = &from.0[lead + i];
            if d.fixed() == Some(1) && g.fixed() != Some(1) {
                axes.push((lead + i) as i64);
            }
        }
        let mut out = grad;
        if !axes.is_empty() {
            let axes_t = self.ints(&axes);
            out = self.emit1(
                Op::Reduce {
                    kind: autopar_ir::ReduceKind::Sum,
                    axes: None,
                    keepdims: true,
                    noop_with_empty_axes: false,
                },
                &[out, axes_t],
            )?;
        }
        if self.ty(out).shape != target.shape {
            out = self.reshape_like(out, &target.shape)?;
        }
        Ok(out)
    }

    /// `x` reshaped to `shape` (dims are fixed: [`differentiate`] binds them).
    pub fn reshape_like(&mut self, x: TensorId, shape: &Shape) -> Result<TensorId, AutodiffError> {
        let dims: Option<Vec<i64>> = shape.0.iter().map(|d| d.fixed().map(|n| n as i64)).collect();
        let Some(dims) = dims else {
            return Err(self.unsupported("on symbolic shapes"));
        };
        let target = self.ints(&dims);
        self.emit1(Op::Reshape { allowzero: false }, &[x, target])
    }
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

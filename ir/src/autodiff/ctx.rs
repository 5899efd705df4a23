//! [`Ctx`]: what a backward rule builds with, and the helpers every rule
//! shares (its seed, its inputs and outputs, casts and products), so rule
//! files need nothing from one another.

use super::AutodiffError;
use crate::{
    BinaryOp, DType, Graph, InferInput, Node, Op, ReduceKind, Role, Shape, TensorId, TensorType, Value,
};

/// What a backward rule builds with: the graph being extended and the
/// forward node whose gradients it computes.
pub struct Ctx<'a> {
    graph: &'a mut Graph,
    node: &'a Node,
    count: usize,
    emitted: Vec<String>,
}

impl<'a> Ctx<'a> {
    /// A context appending the backward nodes of `node` to `graph`.
    pub(super) fn new(graph: &'a mut Graph, node: &'a Node) -> Self {
        Ctx {
            graph,
            node,
            count: 0,
            emitted: Vec::new(),
        }
    }

    /// The names of the nodes emitted, for `Differentiated::origins`.
    pub(super) fn emitted(self) -> Vec<String> {
        self.emitted
    }

    /// The start of a rule: one empty gradient per forward input, and the
    /// gradient of the node's first output; `None` when no gradient reaches
    /// that output (the rule then returns [`Ctx::no_grads`]).
    pub fn seed(node: &Node, grads: &[Option<TensorId>]) -> Option<(Vec<Option<TensorId>>, TensorId)> {
        let g = grads.first().copied().flatten()?;
        Some((Ctx::no_grads(node), g))
    }

    /// No gradient for any of `node`'s inputs.
    pub fn no_grads(node: &Node) -> Vec<Option<TensorId>> {
        vec![None; node.inputs.len()]
    }

    /// Whether the gradient of input `i` is wanted.
    pub fn wanted(wants: &[bool], i: usize) -> bool {
        wants.get(i).copied().unwrap_or(false)
    }

    /// Input `i` of `node`, which the rule requires.
    pub fn input(node: &Node, i: usize) -> Result<TensorId, AutodiffError> {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| AutodiffError::Rule {
                node: node.name.clone(),
                message: format!("required input {i} is absent"),
            })
    }

    /// The first output of `node`.
    pub fn output(node: &Node) -> Result<TensorId, AutodiffError> {
        node.outputs.first().copied().ok_or_else(|| AutodiffError::Rule {
            node: node.name.clone(),
            message: "the node has no output".to_string(),
        })
    }

    /// Fixed dims of `t` (all fixed once `differentiate` has bound symbols).
    pub fn dims(&self, t: TensorId) -> Result<Vec<usize>, AutodiffError> {
        let shape = &self.ty(t).shape;
        shape
            .as_fixed()
            .ok_or_else(|| self.unsupported(&format!("on symbolic shape {shape}")))
    }

    /// `func(a, b)`.
    pub fn binary(&mut self, func: BinaryOp, a: TensorId, b: TensorId) -> Result<TensorId, AutodiffError> {
        self.emit1(Op::Binary { func }, &[a, b])
    }

    /// `x` as `dtype` (itself when it already is).
    pub fn cast_to(&mut self, x: TensorId, dtype: DType) -> Result<TensorId, AutodiffError> {
        if self.ty(x).dtype == dtype {
            Ok(x)
        } else {
            self.emit1(Op::cast(dtype), &[x])
        }
    }

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
                    kind: ReduceKind::Sum,
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

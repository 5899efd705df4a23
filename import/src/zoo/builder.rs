//! A thin graph builder for the zoo: adds weightless parameters and nodes
//! with their output types written out (the zoo knows every shape), keeps
//! `batch` and `seq` symbolic, and records the nodes of the open layer as a
//! [`Block`].

use autopar_ir::op::{Op, TensorType};
use autopar_ir::{Block, DType, Dim, Graph, GraphError, Role, Shape, TensorId, Value};
use std::collections::BTreeMap;

/// Name of the symbolic batch dim.
pub(super) const BATCH: &str = "batch";
/// Name of the symbolic sequence dim.
pub(super) const SEQ: &str = "seq";

/// Builds one zoo graph.
pub(super) struct Builder {
    g: Graph,
    /// Element type of parameters and activations.
    pub dtype: DType,
    /// Nodes of the layer being built, if one is open.
    block: Option<Vec<String>>,
    /// `Reshape` target constants by value, shared by all layers.
    shapes: BTreeMap<Vec<i64>, TensorId>,
}

impl Builder {
    /// An empty graph whose `batch`/`seq` bind to the spec's values by default.
    pub fn new(name: &str, dtype: DType, batch: usize, seq: usize) -> Builder {
        let mut g = Graph::new(name);
        g.bindings = [(BATCH.to_string(), batch), (SEQ.to_string(), seq)].into();
        Builder {
            g,
            dtype,
            block: None,
            shapes: BTreeMap::new(),
        }
    }

    /// `[batch, seq, tail...]`: the shape of a per-token tensor.
    pub fn tokens(&self, tail: &[usize]) -> Shape {
        let mut dims = vec![Dim::Sym(BATCH.into()), Dim::Sym(SEQ.into())];
        dims.extend(tail.iter().map(|&d| Dim::Fixed(d)));
        Shape(dims)
    }

    /// A per-token tensor type of the model dtype.
    pub fn token_type(&self, tail: &[usize]) -> TensorType {
        TensorType {
            dtype: self.dtype,
            shape: self.tokens(tail),
        }
    }

    /// A graph input of token indices, `i64[batch, seq]`.
    pub fn ids_input(&mut self, name: &str) -> TensorId {
        let ty = TensorType {
            dtype: DType::I64,
            shape: self.tokens(&[]),
        };
        let t = self.g.add_tensor(name, ty, Role::Input, None);
        self.g.inputs.push(t);
        t
    }

    /// A weightless tensor of the model dtype with fixed `dims`.
    fn weightless(&mut self, name: String, dims: &[usize], role: Role) -> TensorId {
        let ty = TensorType {
            dtype: self.dtype,
            shape: Shape::fixed(dims),
        };
        self.g.add_tensor(name, ty, role, None)
    }

    /// A trainable weight whose values are never materialised.
    pub fn param(&mut self, name: String, dims: &[usize]) -> TensorId {
        self.weightless(name, dims, Role::Parameter)
    }

    /// A fixed table (rotary caches) whose values are never materialised.
    pub fn constant_table(&mut self, name: &str, dims: &[usize]) -> TensorId {
        self.weightless(name.into(), dims, Role::Constant)
    }

    /// The `i64` shape constant `dims` (a `Reshape` target), added once.
    pub fn shape_const(&mut self, dims: &[i64]) -> TensorId {
        if let Some(&t) = self.shapes.get(dims) {
            return t;
        }
        let text: Vec<String> = dims.iter().map(i64::to_string).collect();
        let value = Value {
            dtype: DType::I64,
            shape: vec![dims.len()],
            data: autopar_ir::Data::I64(dims.to_vec()),
        };
        let t = self.g.add_constant(format!("shape.{}", text.join("_")), value);
        self.shapes.insert(dims.to_vec(), t);
        t
    }

    /// Adds node `name` with outputs of the given names and types.
    pub fn node(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[Option<TensorId>],
        outputs: Vec<(String, TensorType)>,
    ) -> Result<Vec<TensorId>, GraphError> {
        let outs: Vec<TensorId> = outputs
            .into_iter()
            .map(|(n, ty)| self.g.add_tensor(n, ty, Role::Activation, None))
            .collect();
        self.g.add_node(name, op, inputs.to_vec(), outs.clone())?;
        if let Some(block) = &mut self.block {
            block.push(name.to_string());
        }
        Ok(outs)
    }

    /// Adds node `name` with one output named like the node.
    pub fn op(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[TensorId],
        ty: TensorType,
    ) -> Result<TensorId, GraphError> {
        let inputs: Vec<Option<TensorId>> = inputs.iter().copied().map(Some).collect();
        let outs = self.node(name, op, &inputs, vec![(name.to_string(), ty)])?;
        Ok(outs[0])
    }

    /// `x[batch, seq, d_in] · name.weight[d_in, d_out] (+ name.bias)`.
    pub fn linear(
        &mut self,
        name: &str,
        x: TensorId,
        d_in: usize,
        d_out: usize,
        bias: bool,
    ) -> Result<TensorId, GraphError> {
        let w = self.param(format!("{name}.weight"), &[d_in, d_out]);
        self.linear_with(name, x, w, d_out, bias)
    }

    /// Like [`Builder::linear`] with an existing `weight[d_in, d_out]`.
    pub fn linear_with(
        &mut self,
        name: &str,
        x: TensorId,
        w: TensorId,
        d_out: usize,
        bias: bool,
    ) -> Result<TensorId, GraphError> {
        let b = bias.then(|| self.param(format!("{name}.bias"), &[d_out]));
        let ty = self.token_type(&[d_out]);
        let outs = self.node(
            name,
            Op::Linear,
            &[Some(x), Some(w), b],
            vec![(name.to_string(), ty)],
        )?;
        Ok(outs[0])
    }

    /// LayerNorm over the last dim with `name.weight` and `name.bias`.
    pub fn layer_norm(
        &mut self,
        name: &str,
        x: TensorId,
        width: usize,
        epsilon: f64,
    ) -> Result<TensorId, GraphError> {
        let scale = self.param(format!("{name}.weight"), &[width]);
        let bias = self.param(format!("{name}.bias"), &[width]);
        let ty = self.token_type(&[width]);
        self.op(name, Op::LayerNorm { axis: -1, epsilon }, &[x, scale, bias], ty)
    }

    /// RMSNorm over the last dim with `name.weight`.
    pub fn rms_norm(
        &mut self,
        name: &str,
        x: TensorId,
        width: usize,
        epsilon: f64,
    ) -> Result<TensorId, GraphError> {
        let scale = self.param(format!("{name}.weight"), &[width]);
        let ty = self.token_type(&[width]);
        self.op(name, Op::RmsNorm { axis: -1, epsilon }, &[x, scale], ty)
    }

    /// A one-input op (activation) on `[batch, seq, width]`, same shape out.
    pub fn unary(&mut self, name: &str, op: Op, x: TensorId, width: usize) -> Result<TensorId, GraphError> {
        let ty = self.token_type(&[width]);
        self.op(name, op, &[x], ty)
    }

    /// Element-wise `func(a, b)` of two `[batch, seq, width]` tensors.
    pub fn binary(
        &mut self,
        name: &str,
        func: autopar_ir::BinaryOp,
        a: TensorId,
        b: TensorId,
        width: usize,
    ) -> Result<TensorId, GraphError> {
        let ty = self.token_type(&[width]);
        self.op(name, Op::Binary { func }, &[a, b], ty)
    }

    /// Looks `ids[batch, seq]` up in a new `name.weight[rows, width]` table;
    /// returns the table (for a tied head) and the embeddings.
    pub fn embedding(
        &mut self,
        name: &str,
        ids: TensorId,
        rows: usize,
        width: usize,
    ) -> Result<(TensorId, TensorId), GraphError> {
        let table = self.param(format!("{name}.weight"), &[rows, width]);
        let ty = self.token_type(&[width]);
        let out = self.op(name, Op::Embedding, &[table, ids], ty)?;
        Ok((table, out))
    }

    /// Reshapes `x` to `[batch, seq, tail...]` through the target
    /// `[0, 0, tail...]` (0 copies a dim, so the symbolic dims pass).
    pub fn reshape_tokens(
        &mut self,
        name: &str,
        x: TensorId,
        tail: &[usize],
    ) -> Result<TensorId, GraphError> {
        let dims: Vec<i64> = [0, 0].into_iter().chain(tail.iter().map(|&d| d as i64)).collect();
        let target = self.shape_const(&dims);
        let ty = self.token_type(tail);
        self.op(name, Op::Reshape { allowzero: false }, &[x, target], ty)
    }

    /// Starts recording a layer's nodes.
    pub fn begin_block(&mut self) {
        self.block = Some(Vec::new());
    }

    /// Stores the open layer as a [`Block`].
    pub fn end_block(&mut self) {
        if let Some(nodes) = self.block.take() {
            self.g.blocks.push(Block { nodes });
        }
    }

    /// The finished graph with `outputs` as its outputs.
    pub fn finish(mut self, outputs: Vec<TensorId>) -> Graph {
        self.g.outputs = outputs;
        self.g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_adds_weightless_params_and_a_symbolic_output() {
        let mut b = Builder::new("t", DType::F32, 2, 8);
        let ids = b.ids_input("input_ids");
        let (_, x) = b.embedding("wte", ids, 10, 4).unwrap();
        b.begin_block();
        let y = b.linear("h.0.fc", x, 4, 6, true).unwrap();
        b.end_block();
        let g = b.finish(vec![y]);
        assert_eq!(g.tensor(y).ty.shape.to_string(), "[batch, seq, 6]");
        assert_eq!(
            g.blocks,
            vec![Block {
                nodes: vec!["h.0.fc".into()]
            }]
        );
        let bias = g.tensors().find(|(_, t)| t.name == "h.0.fc.bias").unwrap().1;
        assert_eq!((bias.role, bias.data.is_none()), (Role::Parameter, true));
        assert_eq!(g.float_parameter_elements(&g.bindings), 10 * 4 + 4 * 6 + 6);
        assert_eq!(
            g.bindings,
            [("batch".to_string(), 2), ("seq".to_string(), 8)].into()
        );
    }

    #[test]
    fn shape_constants_are_shared() {
        let mut b = Builder::new("t", DType::F32, 1, 8);
        let first = b.shape_const(&[0, 0, 4, 2]);
        assert_eq!(b.shape_const(&[0, 0, 4, 2]), first);
        assert_ne!(b.shape_const(&[0, 0, 8]), first);
        let g = b.finish(vec![]);
        let t = g.tensor(first);
        assert_eq!(
            (t.name.as_str(), t.ty.shape.to_string()),
            ("shape.0_0_4_2", "[4]".to_string())
        );
        assert_eq!(t.data.as_deref().and_then(Value::as_i64), Some(&[0, 0, 4, 2][..]));
    }
}

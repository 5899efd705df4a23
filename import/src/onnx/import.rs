//! ONNX `ModelProto` → [`Graph`].
//!
//! One pass over the (topologically sorted) ONNX nodes: each node becomes one
//! or a few [`Op`] nodes (see `ops`), every node is typed with [`Op::infer`]
//! as it is added and checked against the types the file records, and a
//! node whose inputs are all constants is evaluated and replaced by its
//! result (this folds exporters' Shape→Gather→Concat→Reshape chains). Dead
//! nodes are then dropped and the graph compacted and validated.

use super::ops::{converter, NodeCtx};
use super::proto::{GraphProto, ModelProto, TypeProtoTensor, ValueInfoProto};
use super::provenance::Origin;
use super::tensor::{dtype_from_code, is_external, tensor_type, tensor_value};
use super::ties::{Block, Copy};
use super::OnnxError;
use autopar_ir::op::{InferInput, Op, TensorType};
use autopar_ir::{Dim, Graph, Role, Shape, TensorId, Value};
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// Largest tensor (elements) that constant folding materialises; bigger
/// results stay as nodes so a hostile file cannot make the importer allocate
/// without bound.
const FOLD_LIMIT: u64 = 1 << 24;

/// Options for [`import_model_bytes`].
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Values for named graph inputs: each becomes a constant, so the nodes
    /// reading it can be typed and folded (the ONNX node-test runner feeds
    /// every input this way).
    pub feeds: BTreeMap<String, Value>,
    /// Sizes of the inputs' dynamic axes by role (see [`AXIS_ROLES`]):
    /// bound before any node is typed, so the `Shape` → `Gather` →
    /// `Range`/`ConstantOfShape` chains an exporter writes for them fold to
    /// constants. Unbound, they stay symbols named after their role.
    pub dims: BTreeMap<String, usize>,
}

/// The roles of the inputs' dynamic axes: dim 0 of every input is the
/// batch; dim 1 of an integer `[batch, seq]` input (token ids, masks) is the
/// sequence. An axis the exporter named alike elsewhere has the same role.
pub const AXIS_ROLES: [&str; 2] = ["batch", "seq"];

/// Reads and imports an ONNX model file. External data is not loaded: such
/// initializers become weightless parameters (shape and type, no data).
pub fn load_model(path: &Path) -> Result<Graph, OnnxError> {
    load_model_with(path, &ImportOptions::default())
}

/// [`load_model`] with options (the dynamic axes' sizes).
pub fn load_model_with(path: &Path, opts: &ImportOptions) -> Result<Graph, OnnxError> {
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut graph = import_model_bytes(&bytes, opts)?;
    if graph.name.is_empty() {
        graph.name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
    }
    Ok(graph)
}

/// Imports a serialized ONNX model.
pub fn import_model_bytes(bytes: &[u8], opts: &ImportOptions) -> Result<Graph, OnnxError> {
    let model = ModelProto::decode(bytes)?;
    let proto = model.graph.as_ref().ok_or(OnnxError::MissingGraph)?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or(OnnxError::MissingOpset)?;
    check_supported(proto)?;
    let mut b = Builder::new(proto);
    b.add_initializers(proto)?;
    let roles = axis_roles(proto);
    b.add_inputs(proto, &opts.feeds, &roles, &opts.dims)?;
    let mut unbound: Vec<String> = AXIS_ROLES
        .iter()
        .filter(|r| roles.values().any(|v| v == *r) && !opts.dims.contains_key(**r))
        .map(|r| r.to_string())
        .collect();
    unbound.dedup();
    for (i, node) in proto.node.iter().enumerate() {
        let base = if node.name.is_empty() {
            format!("{}_{i}", node.op_type)
        } else {
            node.name.clone()
        };
        let inputs = node
            .input
            .iter()
            .map(|inp| b.lookup_input(inp, &base, &node.op_type))
            .collect::<Result<Vec<_>, _>>()?;
        let ctx = NodeCtx::new(base, node, inputs, opset);
        let convert = converter(&node.op_type).ok_or_else(|| ctx.attrs.error("unsupported op"))?;
        convert(&mut b, &ctx).map_err(|e| match unbound.is_empty() {
            true => e,
            false => OnnxError::DynamicAxes {
                source: Box::new(e),
                axes: unbound.clone(),
            },
        })?;
        ctx.attrs.check_all_read()?;
    }
    b.finish(proto)
}

/// Fails with every unsupported op type (one node name each) at once.
fn check_supported(proto: &GraphProto) -> Result<(), OnnxError> {
    let mut seen = HashSet::new();
    let mut bad = Vec::new();
    for (i, n) in proto.node.iter().enumerate() {
        let default_domain = n.domain.is_empty() || n.domain == "ai.onnx";
        if default_domain && converter(&n.op_type).is_some() {
            continue;
        }
        let op = if default_domain {
            n.op_type.clone()
        } else {
            format!("{}:{}", n.domain, n.op_type)
        };
        if seen.insert(op.clone()) {
            let name = if n.name.is_empty() {
                format!("{}_{i}", n.op_type)
            } else {
                n.name.clone()
            };
            bad.push((op, name));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(OnnxError::UnsupportedOps(bad))
    }
}

/// The graph under construction plus the ONNX name space.
pub(crate) struct Builder {
    graph: Graph,
    /// ONNX value name → tensor.
    values: HashMap<String, TensorId>,
    node_names: HashSet<String>,
    tensor_names: HashSet<String>,
    /// Types the file records (value_info and graph outputs).
    declared: HashMap<String, TypeProtoTensor>,
}

impl Builder {
    pub(super) fn new(proto: &GraphProto) -> Builder {
        let declared = proto
            .value_info
            .iter()
            .chain(&proto.output)
            .filter_map(|vi| Some((vi.name.clone(), vi.r#type.as_ref()?.tensor_type.clone()?)))
            .collect();
        Builder {
            graph: Graph::new(proto.name.clone()),
            values: HashMap::new(),
            node_names: HashSet::new(),
            tensor_names: HashSet::new(),
            declared,
        }
    }

    /// Adds the initializers: float ones are parameters, except copies of
    /// an earlier one, which read it (see [`super::ties`]), and what the
    /// exporter records as buffers or folded from shapes alone (see
    /// [`super::provenance`]) or, without a record, what the data shows to
    /// be a folded constant (see [`super::buffers`]).
    pub(super) fn add_initializers(&mut self, proto: &GraphProto) -> Result<(), OnnxError> {
        let mut loaded = Vec::with_capacity(proto.initializer.len());
        for init in &proto.initializer {
            let ty = tensor_type(init)?;
            let data = tensor_value(init)?.map(Arc::new);
            if data.is_none() && !is_external(init) {
                return Err(OnnxError::BadTensor {
                    tensor: init.name.clone(),
                    message: "initializer holds no data".into(),
                });
            }
            loaded.push((ty, data));
        }
        let origins = super::provenance::origins(proto);
        let copies = super::ties::copies(&loaded.iter().map(|(_, d)| d.as_deref()).collect::<Vec<_>>());
        let mut ids = Vec::with_capacity(loaded.len());
        let mut values: Vec<Option<Arc<Value>>> = Vec::with_capacity(loaded.len());
        for ((init, (ty, data)), copy) in proto.initializer.iter().zip(loaded).zip(copies) {
            let origin = origins
                .get(init.name.as_str())
                .copied()
                .unwrap_or(Origin::Unknown);
            let id = match (copy, origin) {
                (_, Origin::Buffer | Origin::FoldedFromShapes) => {
                    self.new_tensor(&init.name, ty, Role::Constant, data.clone())
                }
                (Some(Copy::Same(j)), _) => ids[j],
                (Some(Copy::Transposed(j)), _) => self.transposed(&init.name, ids[j])?,
                (Some(Copy::Block(block)), _) => {
                    let (matrix, tied) = (data.as_deref(), values[block.of].as_deref());
                    let rest = block.rest(matrix.expect("matched on data"), tied.expect("matched on data"));
                    self.joined(&init.name, block, ids[block.of], rest)?
                }
                (None, Origin::FoldedFromState)
                    if data.as_deref().is_some_and(super::ties::repeats_leading_axis) =>
                {
                    self.expanded(&init.name, ty, data.as_deref().expect("checked"))?
                }
                (None, Origin::Parameter) if ty.dtype.is_float() => {
                    self.new_tensor(&init.name, ty, Role::Parameter, data.clone())
                }
                (None, _) => {
                    let buffer = data.as_deref().is_some_and(super::buffers::is_buffer);
                    let role = if ty.dtype.is_float() && !buffer {
                        Role::Parameter
                    } else {
                        Role::Constant
                    };
                    self.new_tensor(&init.name, ty, role, data.clone())
                }
            };
            self.define(&init.name, id)?;
            ids.push(id);
            values.push(data);
        }
        Ok(())
    }

    /// A transposed copy of a matrix weight: that weight, transposed.
    fn transposed(&mut self, name: &str, of: TensorId) -> Result<TensorId, OnnxError> {
        let op = Op::Transpose {
            perm: Some(vec![1, 0]),
        };
        Ok(self.emit(&format!("{name}/tied"), "Transpose", op, vec![Some(of)], &[])?[0])
    }

    /// A matrix with a tied block: the tied weight (transposed if the block
    /// is) joined to a parameter holding the rest, in the matrix's order.
    fn joined(&mut self, name: &str, block: Block, of: TensorId, rest: Value) -> Result<TensorId, OnnxError> {
        let tied = if block.transposed {
            self.transposed(name, of)?
        } else {
            of
        };
        let ty = TensorType {
            dtype: rest.dtype,
            shape: Shape::fixed(&rest.shape),
        };
        let own = self.new_tensor(name, ty, Role::Parameter, Some(Arc::new(rest)));
        let parts = if block.at_start { [tied, own] } else { [own, tied] };
        let op = Op::Concat {
            axis: block.axis as i64,
        };
        Ok(self.emit(
            &format!("{name}/joined"),
            "Concat",
            op,
            parts.map(Some).to_vec(),
            &[],
        )?[0])
    }

    /// A weight the exporter expanded over its leading axis: one slice,
    /// trained once, expanded back to the stored shape.
    fn expanded(&mut self, name: &str, ty: TensorType, v: &Value) -> Result<TensorId, OnnxError> {
        let mut shape = v.shape.clone();
        shape[0] = 1;
        let slice = Value::new(v.dtype, shape.clone(), super::ties::leading_slice(v)).expect("one slice");
        let ty = TensorType {
            dtype: ty.dtype,
            shape: Shape::fixed(&shape),
        };
        let one = self.new_tensor(name, ty, Role::Parameter, Some(Arc::new(slice)));
        let dims: Vec<i64> = v.shape.iter().map(|&d| d as i64).collect();
        let node = format!("{name}/expanded");
        let target = self.constant(
            &node,
            "",
            Value::i64(vec![dims.len()], dims).expect("a shape vector"),
        )?;
        Ok(self.emit(&node, "Expand", Op::Expand, vec![Some(one), Some(target)], &[])?[0])
    }

    fn add_inputs(
        &mut self,
        proto: &GraphProto,
        feeds: &BTreeMap<String, Value>,
        roles: &HashMap<String, &'static str>,
        dims: &BTreeMap<String, usize>,
    ) -> Result<(), OnnxError> {
        let input_names: HashSet<&str> = proto.input.iter().map(|vi| vi.name.as_str()).collect();
        if let Some(stray) = feeds.keys().find(|k| !input_names.contains(k.as_str())) {
            return Err(OnnxError::BadValueInfo {
                value: stray.clone(),
                message: "fed, but it is not a graph input".into(),
            });
        }
        for vi in &proto.input {
            let ty = bind_axes(value_info_type(vi)?, roles, dims);
            if let Some(v) = feeds.get(&vi.name) {
                let fed = TensorType {
                    dtype: v.dtype,
                    shape: Shape::fixed(&v.shape),
                };
                if let Some(mismatch) = type_mismatch(&ty, &fed) {
                    return Err(OnnxError::BadValueInfo {
                        value: vi.name.clone(),
                        message: format!("fed value {mismatch}"),
                    });
                }
                let id = self.new_tensor(&vi.name, fed, Role::Constant, Some(Arc::new(v.clone())));
                self.values.insert(vi.name.clone(), id);
            } else if !self.values.contains_key(&vi.name) {
                let id = self.new_tensor(&vi.name, ty, Role::Input, None);
                self.define(&vi.name, id)?;
                self.graph.inputs.push(id);
            }
        }
        Ok(())
    }

    /// The tensor an ONNX input name refers to (`None` for `""`).
    fn lookup_input(&self, name: &str, node: &str, op_type: &str) -> Result<Option<TensorId>, OnnxError> {
        if name.is_empty() {
            return Ok(None);
        }
        self.values
            .get(name)
            .copied()
            .map(Some)
            .ok_or_else(|| OnnxError::BadNode {
                node: node.to_string(),
                op_type: op_type.to_string(),
                message: format!(
                    "input '{name}' is not defined before this node (graph not topologically sorted?)"
                ),
            })
    }

    /// `base`, or `base_2`, `base_3`, ... if taken.
    fn unique(taken: &mut HashSet<String>, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 2;
        while !taken.insert(name.clone()) {
            name = format!("{base}_{k}");
            k += 1;
        }
        name
    }

    fn new_tensor(&mut self, name: &str, ty: TensorType, role: Role, data: Option<Arc<Value>>) -> TensorId {
        let name = Self::unique(&mut self.tensor_names, name);
        self.graph.add_tensor(name, ty, role, data)
    }

    /// Binds an ONNX value name (SSA: each name is defined once).
    fn define(&mut self, name: &str, id: TensorId) -> Result<(), OnnxError> {
        if self.values.insert(name.to_string(), id).is_some() {
            return Err(OnnxError::BadValueInfo {
                value: name.to_string(),
                message: "defined more than once".into(),
            });
        }
        Ok(())
    }

    /// The graph built so far.
    pub(super) fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The tensor an ONNX value name is bound to.
    pub(super) fn bound(&self, name: &str) -> Option<TensorId> {
        self.values.get(name).copied()
    }

    /// The static type of a tensor.
    pub(crate) fn ty(&self, t: TensorId) -> &TensorType {
        &self.graph.tensor(t).ty
    }

    /// Marks an initializer as a buffer, not a parameter: its data stays,
    /// it is neither counted nor trained (batch norm's running statistics).
    pub(crate) fn freeze(&mut self, t: TensorId) {
        let tensor = self.graph.tensor_mut(t);
        if tensor.role == Role::Parameter && tensor.data.is_some() {
            tensor.role = Role::Constant;
        }
    }

    /// The data of a constant tensor (not of a parameter: parameters train).
    pub(crate) fn const_value(&self, t: TensorId) -> Option<&Value> {
        let tensor = self.graph.tensor(t);
        match tensor.role {
            Role::Constant => tensor.data.as_deref(),
            _ => None,
        }
    }

    /// Adds a constant; `onnx_name` non-empty binds it as that ONNX value.
    pub(crate) fn constant(
        &mut self,
        node: &str,
        onnx_name: &str,
        value: Value,
    ) -> Result<TensorId, OnnxError> {
        let name = if onnx_name.is_empty() {
            format!("{node}/const")
        } else {
            onnx_name.to_string()
        };
        let ty = TensorType {
            dtype: value.dtype,
            shape: Shape::fixed(&value.shape),
        };
        let id = self.new_tensor(&name, ty, Role::Constant, Some(Arc::new(value)));
        if !onnx_name.is_empty() {
            self.define(onnx_name, id)?;
        }
        Ok(id)
    }

    /// Adds `op` as node `node`, typed by inference and folded when its
    /// inputs are constants. `outputs[i]` is the ONNX name to bind output `i`
    /// to, `""` for an internal tensor; missing trailing names are internal.
    pub(crate) fn emit(
        &mut self,
        node: &str,
        op_type: &str,
        op: Op,
        inputs: Vec<Option<TensorId>>,
        outputs: &[&str],
    ) -> Result<Vec<TensorId>, OnnxError> {
        let node_err = |message: String| OnnxError::BadNode {
            node: node.to_string(),
            op_type: op_type.to_string(),
            message,
        };
        let n_out = op.num_outputs();
        if let Some(extra) = outputs.iter().skip(n_out).find(|o| !o.is_empty()) {
            return Err(node_err(format!(
                "output '{extra}' is not supported ({} produces {n_out})",
                op.name()
            )));
        }
        let infer_inputs: Vec<Option<InferInput>> = inputs
            .iter()
            .map(|t| {
                t.map(|t| {
                    let tensor = self.graph.tensor(t);
                    InferInput {
                        ty: &tensor.ty,
                        value: tensor.data.as_deref(),
                    }
                })
            })
            .collect();
        let types = op.infer(&infer_inputs).map_err(|e| node_err(e.to_string()))?;
        if types.len() != n_out {
            return Err(node_err(format!(
                "inference gave {} outputs, expected {n_out}",
                types.len()
            )));
        }
        let names: Vec<String> = (0..n_out)
            .map(|i| match outputs.get(i) {
                Some(o) if !o.is_empty() => o.to_string(),
                _ => format!("{node}:{i}"),
            })
            .collect();
        for (name, ty) in names.iter().zip(&types) {
            if let Some(declared) = self.declared.get(name) {
                check_declared(node, name, declared, ty)?;
            }
        }
        let folded = self.fold(&op, &inputs, &types).map_err(node_err)?;
        let mut ids = Vec::with_capacity(n_out);
        for (i, (name, ty)) in names.iter().zip(types).enumerate() {
            let id = match &folded {
                Some(values) => self.new_tensor(name, ty, Role::Constant, Some(Arc::new(values[i].clone()))),
                None => self.new_tensor(name, ty, Role::Activation, None),
            };
            if outputs.get(i).is_some_and(|o| !o.is_empty()) {
                self.define(name, id)?;
            }
            ids.push(id);
        }
        if folded.is_none() {
            let name = Self::unique(&mut self.node_names, node);
            self.graph.add_node(name, op, inputs, ids.clone())?;
        }
        Ok(ids)
    }

    /// The op's outputs if it can be computed at import time: all inputs
    /// constant (never parameters), or a shape query on a static shape.
    fn fold(
        &self,
        op: &Op,
        inputs: &[Option<TensorId>],
        types: &[TensorType],
    ) -> Result<Option<Vec<Value>>, String> {
        let first_ty = inputs.first().copied().flatten().map(|t| self.ty(t));
        if let Some(v) = first_ty.and_then(|ty| static_shape_query(op, ty)) {
            return Ok(Some(vec![v]));
        }
        let values: Option<Vec<Option<&Value>>> = inputs
            .iter()
            .map(|t| match t {
                Some(t) => self.const_value(*t).map(Some),
                None => Some(None),
            })
            .collect();
        let Some(values) = values else { return Ok(None) };
        let size: Option<u64> = types.iter().map(|t| t.shape.numel(&Default::default())).sum();
        if size.is_none_or(|n| n > FOLD_LIMIT) {
            return Ok(None);
        }
        let out = op
            .eval(&values)
            .map_err(|e| format!("constant folding failed: {e}"))?;
        for (v, ty) in out.iter().zip(types) {
            if v.dtype != ty.dtype || Shape::fixed(&v.shape) != ty.shape {
                return Err(format!(
                    "constant folding gave {}{:?} but inference gave {}{}",
                    v.dtype, v.shape, ty.dtype, ty.shape
                ));
            }
        }
        if out.len() != types.len() {
            return Err(format!(
                "constant folding gave {} outputs, expected {}",
                out.len(),
                types.len()
            ));
        }
        Ok(Some(out))
    }

    /// Binds graph outputs, drops dead nodes, compacts and validates.
    fn finish(mut self, proto: &GraphProto) -> Result<Graph, OnnxError> {
        for vi in &proto.output {
            let id = self
                .values
                .get(&vi.name)
                .copied()
                .ok_or_else(|| OnnxError::BadValueInfo {
                    value: vi.name.clone(),
                    message: "graph output is never computed".into(),
                })?;
            self.graph.outputs.push(id);
        }
        let g = &mut self.graph;
        for idx in g.topo_order()?.into_iter().rev() {
            let node = g.node(idx);
            let dead = node
                .outputs
                .iter()
                .all(|t| !g.outputs.contains(t) && g.consumers(*t).is_empty());
            if dead {
                g.remove_node(idx);
            }
        }
        let graph = self.graph.compacted();
        graph.validate()?;
        Ok(graph)
    }
}

/// `Shape`/`Size` of a tensor whose shape is fully fixed, whatever its role.
fn static_shape_query(op: &Op, ty: &TensorType) -> Option<Value> {
    let dims = ty.shape.as_fixed()?;
    match op {
        Op::Shape { start, end } => {
            let rank = dims.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
            let (s, e) = (clamp(*start), clamp(end.unwrap_or(rank)));
            let picked: Vec<i64> = dims[s..e.max(s)].iter().map(|&d| d as i64).collect();
            Value::i64(vec![picked.len()], picked).ok()
        }
        Op::Size => Some(Value::scalar_i64(dims.iter().product::<usize>() as i64)),
        _ => None,
    }
}

/// The role ([`AXIS_ROLES`]) of each symbol the graph inputs' dims use.
fn axis_roles(proto: &GraphProto) -> HashMap<String, &'static str> {
    let mut roles = HashMap::new();
    for vi in &proto.input {
        let Ok(ty) = value_info_type(vi) else { continue };
        let dims = &ty.shape.0;
        let tokens = ty.dtype.is_int() && dims.len() == 2;
        for (i, role) in [(0, "batch"), (1, "seq")] {
            if let Some(Dim::Sym(s)) = dims.get(i).filter(|_| i == 0 || tokens) {
                roles.entry(s.clone()).or_insert(role);
            }
        }
    }
    roles
}

/// `ty` with each symbol that has a role renamed to it, or fixed at its
/// size in `dims`.
fn bind_axes(
    mut ty: TensorType,
    roles: &HashMap<String, &'static str>,
    dims: &BTreeMap<String, usize>,
) -> TensorType {
    for d in &mut ty.shape.0 {
        let Dim::Sym(s) = d else { continue };
        if let Some(&role) = roles.get(s.as_str()) {
            *d = dims
                .get(role)
                .map_or_else(|| Dim::Sym(role.into()), |&v| Dim::Fixed(v));
        }
    }
    ty
}

/// The tensor type a graph input's `ValueInfoProto` declares.
fn value_info_type(vi: &ValueInfoProto) -> Result<TensorType, OnnxError> {
    let tt = vi
        .r#type
        .as_ref()
        .and_then(|t| t.tensor_type.as_ref())
        .ok_or_else(|| OnnxError::BadValueInfo {
            value: vi.name.clone(),
            message: "is not a dense tensor".into(),
        })?;
    proto_type(&vi.name, tt)
}

/// A recorded `TypeProto.Tensor` as a tensor type; unknown dims become
/// symbols named after the value.
fn proto_type(name: &str, tt: &TypeProtoTensor) -> Result<TensorType, OnnxError> {
    let err = |message: String| OnnxError::BadValueInfo {
        value: name.to_string(),
        message,
    };
    let dtype = dtype_from_code(tt.elem_type, name)?;
    let shape = tt.shape.as_ref().ok_or_else(|| err("has no shape".into()))?;
    let dims = shape
        .dim
        .iter()
        .enumerate()
        .map(|(i, d)| match (&d.dim_value, &d.dim_param) {
            (Some(v), _) => usize::try_from(*v)
                .map(Dim::Fixed)
                .map_err(|_| err(format!("dimension {i} is negative ({v})"))),
            (None, Some(p)) if !p.is_empty() => Ok(Dim::Sym(p.clone())),
            _ => Ok(Dim::Sym(format!("{name}_dim{i}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TensorType {
        dtype,
        shape: Shape(dims),
    })
}

/// Why `actual` contradicts `declared` (a dtype, the rank or a fixed dim
/// differs), if it does; symbolic or unknown dims match anything.
fn type_mismatch(declared: &TensorType, actual: &TensorType) -> Option<String> {
    let dims_agree = declared.shape.rank() == actual.shape.rank()
        && declared
            .shape
            .0
            .iter()
            .zip(&actual.shape.0)
            .all(|(d, a)| !matches!((d, a), (Dim::Fixed(x), Dim::Fixed(y)) if x != y));
    (declared.dtype != actual.dtype || !dims_agree).then(|| {
        format!(
            "is {}{}, the model declares {}{}",
            actual.dtype, actual.shape, declared.dtype, declared.shape
        )
    })
}

/// Checks an inferred type against a recorded `TypeProto.Tensor` (element
/// type 0 or a missing shape record nothing to check).
fn check_declared(
    node: &str,
    tensor: &str,
    declared: &TypeProtoTensor,
    inferred: &TensorType,
) -> Result<(), OnnxError> {
    if declared.elem_type == 0 || declared.shape.is_none() {
        return Ok(());
    }
    let mismatch = |recorded: String| OnnxError::TypeMismatch {
        node: node.to_string(),
        tensor: tensor.to_string(),
        recorded,
        inferred: format!("{}{}", inferred.dtype, inferred.shape),
    };
    let recorded = proto_type(tensor, declared).map_err(|e| mismatch(e.to_string()))?;
    match type_mismatch(&recorded, inferred) {
        Some(_) => Err(mismatch(format!("{}{}", recorded.dtype, recorded.shape))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_ir::DType;

    fn ty(dims: Vec<Dim>) -> TensorType {
        TensorType {
            dtype: DType::F32,
            shape: Shape(dims),
        }
    }

    #[test]
    fn shape_queries_fold_on_static_shapes() {
        let t = ty(vec![2.into(), 3.into(), 4.into()]);
        let tail = Op::Shape { start: -2, end: None };
        assert_eq!(
            static_shape_query(&tail, &t),
            Some(Value::i64(vec![2], vec![3, 4]).unwrap())
        );
        let empty = Op::Shape {
            start: 2,
            end: Some(1),
        };
        assert_eq!(
            static_shape_query(&empty, &t),
            Some(Value::i64(vec![0], vec![]).unwrap())
        );
        assert_eq!(static_shape_query(&Op::Size, &t), Some(Value::scalar_i64(24)));
        let symbolic = ty(vec![Dim::Sym("batch".into()), 4.into()]);
        assert_eq!(static_shape_query(&Op::Size, &symbolic), None);
    }

    #[test]
    fn symbols_match_anything_fixed_dims_must_agree() {
        let declared = ty(vec![Dim::Sym("batch".into()), 4.into()]);
        assert_eq!(type_mismatch(&declared, &ty(vec![2.into(), 4.into()])), None);
        assert!(type_mismatch(&declared, &ty(vec![2.into(), 5.into()])).is_some());
        assert!(type_mismatch(&declared, &ty(vec![4.into()])).is_some());
    }
}

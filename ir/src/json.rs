//! autopar's JSON graph format (`"format": "autopar-graph", "version": 1`).
//!
//! A graph is written as flat lists: tensors (by position), nodes reading and
//! writing tensor positions, and the graph's inputs and outputs. Tensor data
//! travels as base64 of little-endian bytes (ONNX `raw_data` layout), so a
//! JSON file is a complete, self-contained model. `graph_schema()` gives the
//! JSON Schema generated from these types.

use crate::{Bindings, Block, DType, Graph, GraphError, Op, Role, Shape, TensorId, TensorType, Value};
use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The format tag every file carries.
pub const FORMAT: &str = "autopar-graph";
/// The version this build reads and writes.
pub const VERSION: u32 = 1;

/// A whole graph file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GraphDoc {
    /// Always `"autopar-graph"`.
    pub format: String,
    /// Format version; this build reads version 1.
    pub version: u32,
    pub name: String,
    /// Default values of symbolic dimensions.
    #[serde(default)]
    pub bindings: Bindings,
    pub tensors: Vec<TensorDoc>,
    pub nodes: Vec<NodeDoc>,
    /// Positions in `tensors` of the graph inputs.
    pub inputs: Vec<u32>,
    /// Positions in `tensors` of the graph outputs.
    pub outputs: Vec<u32>,
    /// Repeated blocks (layers), by node name.
    #[serde(default)]
    pub blocks: Vec<Block>,
}

/// One tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TensorDoc {
    pub name: String,
    pub dtype: DType,
    /// Dimensions: numbers, or names of symbolic dims (`"batch"`).
    pub shape: Shape,
    pub role: Role,
    /// Base64 of the little-endian element bytes; absent for activations,
    /// inputs and weightless parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// One node. `op` holds the op name under `"op"` and its attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeDoc {
    pub name: String,
    #[schemars(with = "Op")]
    pub op: serde_json::Value,
    /// Positions in `tensors`; `null` for an absent optional input.
    pub inputs: Vec<Option<u32>>,
    pub outputs: Vec<u32>,
}

/// Why a JSON graph could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("not a JSON graph document: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("\"format\" is '{0}', expected '{FORMAT}'")]
    Format(String),
    #[error("\"version\" is {0}; this build reads version {VERSION}")]
    Version(u32),
    #[error("node '{node}': {message}")]
    Node { node: String, message: String },
    #[error("tensor '{tensor}': {message}")]
    Tensor { tensor: String, message: String },
    #[error("graph {field}: tensor #{index} does not exist ({count} tensors)")]
    GraphRef {
        field: &'static str,
        index: u32,
        count: usize,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Converts a graph to its document form (tensor ids renumbered densely).
pub fn to_doc(graph: &Graph) -> GraphDoc {
    let g = graph.compacted();
    let b64 = base64::engine::general_purpose::STANDARD;
    let tensors = g
        .tensors()
        .map(|(_, t)| TensorDoc {
            name: t.name.clone(),
            dtype: t.ty.dtype,
            shape: t.ty.shape.clone(),
            role: t.role,
            data: t.data.as_ref().map(|v| b64.encode(v.to_le_bytes())),
        })
        .collect();
    let order = g.topo_order().expect("compacted graph is acyclic");
    let nodes = order
        .into_iter()
        .map(|idx| {
            let n = g.node(idx);
            NodeDoc {
                name: n.name.clone(),
                op: serde_json::to_value(&n.op).expect("ops serialise"),
                inputs: n.inputs.iter().map(|t| t.map(|t| t.0)).collect(),
                outputs: n.outputs.iter().map(|t| t.0).collect(),
            }
        })
        .collect();
    GraphDoc {
        format: FORMAT.into(),
        version: VERSION,
        name: g.name.clone(),
        bindings: g.bindings.clone(),
        tensors,
        nodes,
        inputs: g.inputs.iter().map(|t| t.0).collect(),
        outputs: g.outputs.iter().map(|t| t.0).collect(),
        blocks: g.blocks.clone(),
    }
}

/// Writes a graph as pretty JSON.
pub fn to_json(graph: &Graph) -> String {
    serde_json::to_string_pretty(&to_doc(graph)).expect("documents serialise")
}

/// Builds a graph from its document form, checking every reference, every
/// op, and (through [`Graph::validate`]) every shape.
pub fn from_doc(doc: &GraphDoc) -> Result<Graph, JsonError> {
    if doc.format != FORMAT {
        return Err(JsonError::Format(doc.format.clone()));
    }
    if doc.version != VERSION {
        return Err(JsonError::Version(doc.version));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut g = Graph::new(doc.name.clone());
    g.bindings = doc.bindings.clone();
    for t in &doc.tensors {
        let tensor_err = |message: String| JsonError::Tensor {
            tensor: t.name.clone(),
            message,
        };
        let data = match &t.data {
            None => None,
            Some(text) => {
                let bytes = b64
                    .decode(text)
                    .map_err(|e| tensor_err(format!("data is not base64: {e}")))?;
                let shape = t
                    .shape
                    .as_fixed()
                    .ok_or_else(|| tensor_err("a tensor with data needs a fixed shape".into()))?;
                let value =
                    Value::from_le_bytes(t.dtype, shape, &bytes).map_err(|e| tensor_err(e.to_string()))?;
                Some(Arc::new(value))
            }
        };
        if data.is_some() && matches!(t.role, Role::Activation | Role::Input) {
            return Err(tensor_err(format!("{:?} tensors carry no data", t.role)));
        }
        let ty = TensorType {
            dtype: t.dtype,
            shape: t.shape.clone(),
        };
        g.add_tensor(t.name.clone(), ty, t.role, data);
    }
    let count = doc.tensors.len();
    for n in &doc.nodes {
        let node_err = |message: String| JsonError::Node {
            node: n.name.clone(),
            message,
        };
        let op: Op = serde_json::from_value(n.op.clone()).map_err(|e| node_err(format!("bad op: {e}")))?;
        let check = |i: u32, what: &str| {
            if (i as usize) < count {
                Ok(TensorId(i))
            } else {
                Err(node_err(format!(
                    "{what} refers to tensor #{i}, which does not exist ({count} tensors)"
                )))
            }
        };
        let inputs = n
            .inputs
            .iter()
            .map(|t| t.map(|i| check(i, "an input")).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = n
            .outputs
            .iter()
            .map(|&i| check(i, "an output"))
            .collect::<Result<Vec<_>, _>>()?;
        g.add_node(n.name.clone(), op, inputs, outputs)?;
    }
    let refs = |field: &'static str, ids: &[u32]| {
        ids.iter()
            .map(|&index| {
                if (index as usize) < count {
                    Ok(TensorId(index))
                } else {
                    Err(JsonError::GraphRef { field, index, count })
                }
            })
            .collect::<Result<Vec<_>, _>>()
    };
    g.inputs = refs("inputs", &doc.inputs)?;
    g.outputs = refs("outputs", &doc.outputs)?;
    g.blocks = doc.blocks.clone();
    g.validate()?;
    Ok(g)
}

/// Reads a graph from JSON text.
pub fn from_json(text: &str) -> Result<Graph, JsonError> {
    let doc: GraphDoc = serde_json::from_str(text)?;
    from_doc(&doc)
}

/// The JSON Schema of the graph format, generated from the types above.
pub fn graph_schema() -> String {
    serde_json::to_string_pretty(&schemars::schema_for!(GraphDoc)).expect("schemas serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, Dim};

    fn tiny() -> Graph {
        let mut g = Graph::new("tiny");
        let ty = TensorType {
            dtype: DType::F32,
            shape: Shape(vec![Dim::Sym("batch".into()), 2.into()]),
        };
        let x = g.add_tensor("x", ty.clone(), Role::Input, None);
        let w = Value::f32(vec![2], vec![0.5, -1.0]).unwrap();
        let w = g.add_tensor(
            "w",
            TensorType {
                dtype: DType::F32,
                shape: Shape::fixed(&[2]),
            },
            Role::Parameter,
            Some(Arc::new(w)),
        );
        let y = g.add_tensor("y", ty, Role::Activation, None);
        g.add_node(
            "mul",
            Op::Binary { func: BinaryOp::Mul },
            vec![Some(x), Some(w)],
            vec![y],
        )
        .unwrap();
        g.inputs = vec![x];
        g.outputs = vec![y];
        g
    }

    #[test]
    fn documents_name_their_format_and_version() {
        let doc = to_doc(&tiny());
        assert_eq!((doc.format.as_str(), doc.version), ("autopar-graph", 1));
        assert_eq!(
            doc.nodes[0].op,
            serde_json::json!({"op": "Binary", "func": "Mul"})
        );
    }

    #[test]
    fn dangling_edge_names_the_node() {
        let mut doc = to_doc(&tiny());
        doc.nodes[0].inputs[1] = Some(99);
        let err = from_doc(&doc).unwrap_err().to_string();
        assert!(err.contains("node 'mul'") && err.contains("#99"), "{err}");
    }

    #[test]
    fn unknown_op_names_the_node() {
        let mut doc = to_doc(&tiny());
        doc.nodes[0].op = serde_json::json!({"op": "Frobnicate"});
        let err = from_doc(&doc).unwrap_err().to_string();
        assert!(err.contains("node 'mul'") && err.contains("Frobnicate"), "{err}");
    }

    #[test]
    fn wrong_format_and_version_are_refused() {
        let mut doc = to_doc(&tiny());
        doc.version = 7;
        assert!(from_doc(&doc).unwrap_err().to_string().contains("version 1"));
        doc.version = 1;
        doc.format = "onnx".into();
        assert!(from_doc(&doc).unwrap_err().to_string().contains("autopar-graph"));
    }

    #[test]
    fn schema_mentions_every_top_level_field() {
        let s = graph_schema();
        for field in [
            "format", "version", "tensors", "nodes", "inputs", "outputs", "blocks",
        ] {
            assert!(s.contains(&format!("\"{field}\"")), "{field}");
        }
    }
}

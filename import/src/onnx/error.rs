//! Import errors. Every variant names the file, node or tensor at fault so a
//! user can find it in a model viewer.

use autopar_ir::GraphError;

/// Why an ONNX model or tensor file could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid protobuf message (truncated, corrupt, or
    /// not protobuf at all).
    #[error("not an ONNX file: protobuf decoding failed: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A field the wire-level rewrite of a file could not read.
    #[error("malformed protobuf: {0}")]
    Wire(&'static str),
    /// The bytes decode but hold no graph: empty file or some other message.
    #[error("not an ONNX model: the file holds no graph (empty file, or not an ONNX ModelProto)")]
    MissingGraph,
    /// The model does not say which ai.onnx opset its nodes follow.
    #[error("ONNX model declares no ai.onnx opset version")]
    MissingOpset,
    /// An initializer, constant or tensor file is malformed or of an
    /// unsupported element type.
    #[error("tensor '{tensor}': {message}")]
    BadTensor { tensor: String, message: String },
    /// A graph input/output or value_info entry has an unusable type.
    #[error("value '{value}': {message}")]
    BadValueInfo { value: String, message: String },
    /// Ops the importer does not map: every one found, `(op_type, node name)`.
    #[error("unsupported ONNX ops: {}", format_unsupported(.0))]
    UnsupportedOps(Vec<(String, String)>),
    /// A supported op used in a way the importer cannot map (attribute
    /// value, output count, undefined input).
    #[error("node '{node}' ({op_type}): {message}")]
    BadNode {
        node: String,
        op_type: String,
        message: String,
    },
    /// Our inferred type disagrees with the type the ONNX file records.
    #[error("node '{node}': output '{tensor}' is recorded in the ONNX file as {recorded} but infers to {inferred}")]
    TypeMismatch {
        node: String,
        tensor: String,
        recorded: String,
        inferred: String,
    },
    /// A node needs a size the inputs' dynamic axes leave open.
    #[error("{source} (the model's inputs have dynamic axes {}: bind them with --batch and --seq)", .axes.join(", "))]
    DynamicAxes {
        #[source]
        source: Box<OnnxError>,
        axes: Vec<String>,
    },
    /// The graph built from the model failed a structural or typing check.
    #[error(transparent)]
    Graph(#[from] GraphError),
}

fn format_unsupported(ops: &[(String, String)]) -> String {
    ops.iter()
        .map(|(op, node)| format!("{op} (node '{node}')"))
        .collect::<Vec<_>>()
        .join(", ")
}

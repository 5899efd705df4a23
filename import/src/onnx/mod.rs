//! ONNX import: model files → [`autopar_ir::Graph`], and ONNX tensor files →
//! [`autopar_ir::Value`].
//!
//! The protobuf messages are hand-written prost structs (no protoc). Import
//! maps every ai.onnx node to the one op set, types each node by shape
//! inference, folds constant subgraphs and drops dead nodes; unsupported op
//! types are all reported in one error.

mod attrs;
mod buffers;
mod error;
mod import;
mod ops;
mod ops_attention;
mod ops_batch_norm;
mod ops_conv;
mod ops_pad;
pub mod proto;
mod provenance;
mod tensor;
mod ties;
mod weights_out;

pub use error::OnnxError;
pub use import::{import_model_bytes, load_model, load_model_with, ImportOptions, AXIS_ROLES};
pub use tensor::read_tensor_file;
pub use weights_out::with_trained_weights;

//! The ways a graph comes into autopar from outside: ONNX model and tensor
//! files ([`onnx`]), and transformer graphs built from a spec string such as
//! `gpt:layers=24,hidden=2304,...` ([`zoo`]). Both produce an
//! [`autopar_ir::Graph`] over the one op set.
//!
//! This crate is the API boundary for untrusted input (the ONNX importer is
//! fuzzed): malformed or unsupported input is an error naming the node, field
//! or key at fault, never a panic.
//!
//! Architecture invariant: `import` depends on `ir` only, and `ir` never
//! on `import`.

pub mod onnx;
pub mod zoo;

pub use onnx::{import_model_bytes, load_model, read_tensor_file, ImportOptions, OnnxError};
pub use zoo::{ModelSpec, ZooError};

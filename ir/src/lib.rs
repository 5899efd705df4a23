//! autopar's graph IR: the one op set, tensors with symbolic shapes, the
//! graph, and the ways a graph comes in (ONNX, JSON, the model zoo) and gets
//! cleaned up (egg rewrites, layer detection), and reverse-mode autodiff
//! over it (`autodiff`).
//!
//! Architecture invariant: `ir` knows nothing of devices, clusters or cost
//! numbers beyond each op's FLOPs and bytes.

pub mod autodiff;
mod dtype;
mod graph;
pub mod json;
mod layers;
pub mod lowp;
pub mod onnx;
pub mod op;
pub mod rewrite;
mod shape;
mod stats;
mod value;
pub mod zoo;

pub use dtype::DType;
pub use graph::{Block, Graph, GraphError, Node, Role, Tensor, TensorId};
pub use layers::detect_blocks;
pub use lowp::RoundMode;
pub use op::{
    Activation, BinaryOp, CommGroup, CommKind, Cost, GeluApprox, InferInput, Op, OpClass, OpError,
    ReduceKind, ScalarValue, TensorType, UnaryOp,
};
pub use petgraph::stable_graph::NodeIndex;
pub use rewrite::{canonicalize, compute_histogram, RewriteError, RewriteReport};
pub use shape::{Bindings, Dim, Shape};
pub use stats::{graph_cost, StatsError};
pub use value::{round_float, wrap_int, Data, Value, ValueError};
pub use zoo::{ModelSpec, ZooError};

//! autopar's graph IR: the one op set, tensors with symbolic shapes, the
//! graph and its JSON form, reverse-mode autodiff over it (`autodiff`) and
//! the reference interpreter every backend is checked against (`interp`).
//! Importers (`autopar-import`) and rewrites (`autopar-rewrite`) build on it.
//!
//! Architecture invariant: `ir` knows nothing of devices, clusters or cost
//! numbers beyond each op's FLOPs and bytes.

pub mod autodiff;
mod dtype;
mod graph;
pub mod interp;
pub mod json;
pub mod layers;
mod loss;
pub mod lowp;
mod objective;
pub mod op;
mod shape;
mod stats;
mod value;

pub use dtype::DType;
pub use graph::{Block, Graph, GraphError, Node, Role, Tensor, TensorId};
pub use loss::Loss;
pub use lowp::RoundMode;
pub use objective::Objective;
pub use op::{
    pool_divisors, Activation, BinaryOp, CommGroup, CommKind, ConvSizes, Cost, GeluApprox, InferInput, Op,
    OpClass, OpError, PoolKind, ReduceKind, ScalarValue, TensorType, UnaryOp, Window,
};
pub use petgraph::stable_graph::NodeIndex;
pub use shape::{Bindings, Dim, Shape};
pub use stats::{graph_cost, StatsError};
pub use value::{round_float, wrap_int, Data, Value, ValueError};

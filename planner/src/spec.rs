//! Sharding specifications, GSPMD/DTensor style: for each dim of a tensor,
//! which mesh axis splits it (or none), and whether the tensor is a pending
//! sum over a mesh axis. Plans record one per input and output of every op.

use serde::{Deserialize, Serialize};

/// How one dim of a tensor is laid out over the mesh.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum DimSpec {
    /// Every rank of the mesh holds the whole dim.
    Replicate,
    /// The named mesh axis splits the dim into equal parts.
    Shard(String),
}

/// How one tensor is laid out over the mesh.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TensorSpec {
    /// The tensor's name in the graph.
    pub tensor: String,
    /// One entry per dim.
    pub dims: Vec<DimSpec>,
    /// The mesh axis over which ranks hold partial sums still to be added, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<String>,
}

/// The sharding chosen for one op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OpSharding {
    /// The node's name in the graph.
    pub node: String,
    /// The op's name (`Linear`, `Attention`, ...).
    pub op: String,
    /// The strategy chosen among the op's sharding rules (`column`, `row`,
    /// `batch`, `heads`, `replicate`, ...).
    pub strategy: String,
    /// Layout each input is consumed in (absent optional inputs are `None`).
    pub inputs: Vec<Option<TensorSpec>>,
    /// Layout each output is produced in.
    pub outputs: Vec<TensorSpec>,
}

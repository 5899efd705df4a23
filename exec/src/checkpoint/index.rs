//! `index.json`: what a checkpoint directory holds. It names every file,
//! every tensor's global shape and type, how the tensor is cut into slices
//! and which flat range of which slice each file's piece is, so a reader
//! rebuilds the whole tensors without knowing the plan that wrote them.

use super::layout::Cut;
use crate::train::Optimizer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The `format` value of every index.
pub const FORMAT: &str = "autopar-checkpoint";
/// The index version this build writes and reads.
pub const VERSION: u32 = 1;

/// A checkpoint's index.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Index {
    pub format: String,
    pub version: u32,
    /// Steps completed; a resumed run continues with step `step + 1`.
    pub step: usize,
    /// The model as the run named it (a file or a spec): what `replan` and
    /// the weights' export read.
    pub model: String,
    /// Hash of the model's parameters' names, types and shapes: a resume
    /// of another model is refused.
    pub model_hash: String,
    /// `f32` or `f64`: what the tensors hold.
    pub precision: String,
    pub optimizer: Optimizer,
    /// Where the data streams and random numbers stand.
    pub data: DataPosition,
    /// The plan the run trained under.
    pub plan: serde_json::Value,
    /// One file per rank, in rank order.
    pub files: Vec<String>,
    /// Every parameter the run trained, by name.
    pub tensors: BTreeMap<String, TensorEntry>,
}

/// The run's random state: the data and the initial weights are functions
/// of the seed and the step, so the next step and the seed are all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    pub seed: u64,
    pub next_step: usize,
}

/// One parameter: its global layout and where its pieces are.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TensorEntry {
    /// The whole parameter's shape.
    pub shape: Vec<usize>,
    /// `F32` or `F64`.
    pub dtype: String,
    /// How ranks hold it sliced; absent where they hold it whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<CutEntry>,
    /// The model parameter this one is a tied copy of (pipeline or tensor
    /// parallelism keeps one for a tied embedding's second reader); not a
    /// parameter of the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_to: Option<String>,
    pub weight: Vec<Piece>,
    /// Optimizer state by slot name (`exp_avg`, `exp_avg_sq`, `momentum_buffer`).
    #[serde(default)]
    pub state: BTreeMap<String, Vec<Piece>>,
}

/// A tensor's cut: dim `axis` (of each of `blocks` equal blocks) into `parts` slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutEntry {
    pub axis: usize,
    pub blocks: usize,
    pub parts: usize,
}

impl From<Cut> for CutEntry {
    fn from(c: Cut) -> CutEntry {
        CutEntry {
            axis: c.axis,
            blocks: c.blocks,
            parts: c.parts,
        }
    }
}

/// Elements `[start, start + len)` of slice `slice`, flattened, stored in
/// `file` under `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub file: String,
    pub key: String,
    pub slice: usize,
    pub start: usize,
    pub len: usize,
}

/// The safetensors key of a piece: the parameter and what it holds
/// (`weight` or a state slot), then where it starts, so one file can hold
/// several pieces of one tensor.
pub(crate) fn piece_key(param: &str, role: &str, slice: usize, start: usize) -> String {
    format!("{param}/{role}/{slice}/{start}")
}

/// The file name of rank `rank`'s pieces.
pub(crate) fn rank_file(rank: usize) -> String {
    format!("rank-{rank}.safetensors")
}

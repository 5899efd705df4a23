//! Checkpoints: a run's weights and optimizer state, saved while it trains
//! and read back to resume it, under the same plan or another.
//!
//! `DIR/step-<S>/` holds one safetensors file per rank (`rank-<R>`: that
//! rank's pieces of weights and optimizer state) and `index.json` (see
//! [`index`]); `DIR/latest` names the newest complete one. Which rank
//! writes which piece is one function of the programs ([`layout`]); the
//! reader rebuilds whole tensors from the index alone ([`read`]), so a
//! resumed run cuts its own slices and shards from them as it does from
//! initial weights.

pub mod index;
pub(crate) mod layout;
mod read;
mod write;

pub use index::{DataPosition, Index, TensorEntry};
pub use read::{open, open_bytes, read_index, resolve, Restored};
pub use write::{safetensors_file, RunRecord, SavePolicy, Saver, Snapshot, INDEX, LATEST};

use autopar_ir::interp::Precision;
use autopar_lower::{Program, TrainingGraph};
use std::collections::BTreeMap;
use std::path::Path;

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
    #[error("checkpoint {path} lacks {what}")]
    Missing { path: String, what: String },
    #[error("{path}: no checkpoint (neither index.json nor latest)")]
    NoCheckpoint { path: String },
    #[error("{path} was not written within {waited_s} s: did a rank stop?")]
    Incomplete { path: String, waited_s: f64 },
    #[error("the checkpoint writer stopped unexpectedly")]
    WriterPanicked,
    #[error("{path} already holds a checkpoint of step {newest}, past this run's start (step {first_step}); resume from it (--resume {path}) or save to another folder")]
    Ahead {
        path: String,
        newest: usize,
        first_step: usize,
    },
}

impl CheckpointError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
        move |source| CheckpointError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// A hash of `g`'s parameters' names, types and shapes (not their values):
/// equal for every plan and every step of one model, so a checkpoint of
/// another model is refused.
pub fn model_hash(g: &autopar_ir::Graph) -> String {
    use sha2::Digest;
    let mut lines: Vec<String> = g
        .tensors()
        .filter(|(_, t)| t.role == autopar_ir::Role::Parameter)
        .map(|(_, t)| format!("{}\t{:?}\t{}\n", t.name, t.ty.dtype, t.ty.shape))
        .collect();
    lines.sort();
    let digest = sha2::Sha256::digest(lines.concat().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A piece a rank writes and its key in the rank's file.
pub(crate) type Keyed = (layout::Held, String);

/// The index's name of the type a run of `precision` holds its values in.
pub fn dtype_name(precision: Precision) -> &'static str {
    match precision {
        Precision::F32 => "F32",
        Precision::F64 => "F64",
    }
}

/// Every tensor of `t`'s training under `programs`: its global layout, and
/// the pieces each rank writes (`writes`, with their keys), as the index
/// lists them. `slot_names` are the optimizer's state slots; the pieces
/// hold values of the run's `precision`.
pub(crate) fn tensors(
    t: &TrainingGraph,
    programs: &[Program],
    slot_names: &[&str],
    precision: Precision,
) -> (BTreeMap<String, TensorEntry>, Vec<Vec<Keyed>>) {
    let writes = layout::writes(t, programs, slot_names.len());
    let tied: BTreeMap<&str, &str> = t.tied.iter().map(|(o, c)| (c.as_str(), o.as_str())).collect();
    let mut entries: BTreeMap<String, TensorEntry> = BTreeMap::new();
    let keyed: Vec<Vec<Keyed>> = writes
        .into_iter()
        .enumerate()
        .map(|(rank, held)| {
            held.into_iter()
                .filter_map(|h| {
                    let role = match h.role {
                        layout::Role::Weight => "weight",
                        layout::Role::Slot(k) => slot_names[k],
                    };
                    let key = index::piece_key(&h.param, role, h.slice, h.start);
                    let entry = match entries.entry(h.param.clone()) {
                        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::btree_map::Entry::Vacant(v) => {
                            let id = t.graph.tensors().find(|(_, x)| x.name == h.param)?.0;
                            let value = t.graph.tensor(id).data.as_ref()?;
                            v.insert(TensorEntry {
                                shape: value.shape.clone(),
                                dtype: dtype_name(precision).into(),
                                cut: layout::cut_of(t, &h.param).map(Into::into),
                                tied_to: tied.get(h.param.as_str()).map(|s| s.to_string()),
                                weight: Vec::new(),
                                state: BTreeMap::new(),
                            })
                        }
                    };
                    let piece = index::Piece {
                        file: index::rank_file(rank),
                        key: key.clone(),
                        slice: h.slice,
                        start: h.start,
                        len: h.len,
                    };
                    match h.role {
                        layout::Role::Weight => entry.weight.push(piece),
                        layout::Role::Slot(_) => entry.state.entry(role.to_string()).or_default().push(piece),
                    }
                    Some((h, key))
                })
                .collect()
        })
        .collect();
    (entries, keyed)
}

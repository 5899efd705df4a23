//! Reading a checkpoint back as whole tensors: every parameter's weight and
//! optimizer state rebuilt from the pieces the index lists, whatever plan
//! wrote them, so a run resumes under the same plan or another one (each
//! rank then cuts what it holds from the whole, as from initial weights).

use super::index::{CutEntry, Index, Piece, FORMAT, VERSION};
use super::write::{INDEX, LATEST};
use super::CheckpointError;
use crate::slices;
use autopar_ir::{DType, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A checkpoint read back: its index and every tensor whole.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The folder it was read from (`DIR/step-<S>`).
    pub dir: PathBuf,
    pub index: Index,
    weights: HashMap<String, Value>,
    states: HashMap<String, Vec<Value>>,
}

impl Restored {
    /// Parameter `param`'s whole weight.
    pub fn weight(&self, param: &str) -> Option<&Value> {
        self.weights.get(param)
    }

    /// Parameter `param`'s whole optimizer state, one value per slot in the
    /// optimizer's slot order (each shaped as the weight).
    pub fn state(&self, param: &str) -> Option<&[Value]> {
        self.states.get(param).map(Vec::as_slice)
    }

    /// The model's parameters (tied copies left out) and their weights, by name.
    pub fn model_weights(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.index
            .tensors
            .iter()
            .filter(|(_, e)| e.tied_to.is_none())
            .filter_map(|(name, _)| Some((name.as_str(), self.weights.get(name)?)))
    }
}

/// The checkpoint folder `path` names: `DIR/step-<S>` itself (it has an
/// index), or the newest complete one in `DIR`. That is the one `latest`
/// names, unless a writer was stopped between publishing a newer folder
/// and pointing `latest` at it; a `latest` naming no checkpoint is an error.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    if path.join(INDEX).exists() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join(LATEST);
    let named = match std::fs::read_to_string(&latest) {
        Ok(name) => {
            let dir = path.join(name.trim());
            if !dir.join(INDEX).exists() {
                return Err(CheckpointError::Missing {
                    path: dir.display().to_string(),
                    what: format!("its index ({} names it)", latest.display()),
                });
            }
            Some(dir)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(CheckpointError::io(&latest)(e)),
    };
    let newest = match path.is_dir() {
        true => super::write::published(path)?
            .last()
            .map(|&s| super::write::step_dir(path, s)),
        false => None,
    };
    match (named, newest) {
        (None, None) => Err(CheckpointError::NoCheckpoint {
            path: path.display().to_string(),
        }),
        (Some(named), None) => Ok(named),
        (_, Some(newest)) => Ok(newest),
    }
}

/// Reads the index of the checkpoint `path` names (see [`resolve`]).
pub fn read_index(path: &Path) -> Result<(PathBuf, Index), CheckpointError> {
    let dir = resolve(path)?;
    let file = dir.join(INDEX);
    let text = std::fs::read_to_string(&file).map_err(CheckpointError::io(&file))?;
    let format = |message: String| CheckpointError::Format {
        path: file.display().to_string(),
        message,
    };
    let index: Index = serde_json::from_str(&text).map_err(|e| format(e.to_string()))?;
    if index.format != FORMAT || index.version != VERSION {
        return Err(format(format!(
            "format '{}' version {}; this build reads '{FORMAT}' version {VERSION}",
            index.format, index.version
        )));
    }
    Ok((dir, index))
}

/// Reads the checkpoint `path` names and rebuilds every tensor whole.
pub fn open(path: &Path) -> Result<Restored, CheckpointError> {
    let (dir, index) = read_index(path)?;
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for name in &index.files {
        let file = dir.join(name);
        files.insert(
            name.clone(),
            std::fs::read(&file).map_err(CheckpointError::io(&file))?,
        );
    }
    let mut parsed = BTreeMap::new();
    for (name, bytes) in &files {
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| CheckpointError::Format {
            path: dir.join(name).display().to_string(),
            message: e.to_string(),
        })?;
        parsed.insert(name.as_str(), st);
    }
    let reader = Reader {
        dir: &dir,
        files: &parsed,
    };
    let mut weights = HashMap::new();
    let mut states = HashMap::new();
    let slots = index.optimizer.slot_names();
    for (name, entry) in &index.tensors {
        let dtype = match entry.dtype.as_str() {
            "F32" => DType::F32,
            "F64" => DType::F64,
            other => {
                return Err(CheckpointError::Format {
                    path: dir.join(INDEX).display().to_string(),
                    message: format!("tensor '{name}' has dtype '{other}' (expected F32 or F64)"),
                })
            }
        };
        let whole =
            |what: &str, pieces: &[Piece]| reader.whole(name, what, &entry.shape, dtype, entry.cut, pieces);
        weights.insert(name.clone(), whole("weight", &entry.weight)?);
        if !entry.state.is_empty() {
            let state = slots
                .iter()
                .map(|slot| match entry.state.get(*slot) {
                    Some(pieces) => whole(slot, pieces),
                    None => Err(CheckpointError::Missing {
                        path: dir.display().to_string(),
                        what: format!("optimizer state '{slot}' of '{name}'"),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?;
            states.insert(name.clone(), state);
        }
    }
    Ok(Restored {
        dir,
        index,
        weights,
        states,
    })
}

/// The parsed rank files of one checkpoint.
struct Reader<'a> {
    dir: &'a Path,
    files: &'a BTreeMap<&'a str, safetensors::SafeTensors<'a>>,
}

impl Reader<'_> {
    /// One tensor (`what` of `name`) whole, from its pieces: each slice's
    /// ranges in order, then the slices joined along the cut.
    fn whole(
        &self,
        name: &str,
        what: &str,
        shape: &[usize],
        dtype: DType,
        cut: Option<CutEntry>,
        pieces: &[Piece],
    ) -> Result<Value, CheckpointError> {
        let parts = cut.map_or(1, |c| c.parts.max(1));
        let numel: usize = shape.iter().product();
        if let Some(c) = cut {
            let cuts = c.axis < shape.len() && shape[c.axis] % (parts * c.blocks.max(1)) == 0;
            if !cuts || c.blocks == 0 {
                return Err(CheckpointError::Format {
                    path: self.dir.join(INDEX).display().to_string(),
                    message: format!("'{name}' of shape {shape:?} cannot be cut as {c:?}"),
                });
            }
        }
        let slice_numel = numel / parts;
        let missing = |detail: String| CheckpointError::Missing {
            path: self.dir.display().to_string(),
            what: format!("{what} of '{name}': {detail}"),
        };
        let mut slices_whole = Vec::with_capacity(parts);
        for slice in 0..parts {
            let mut mine: Vec<&Piece> = pieces.iter().filter(|p| p.slice == slice).collect();
            mine.sort_by_key(|p| p.start);
            let mut data: Vec<u8> = Vec::with_capacity(slice_numel * dtype.size_bytes());
            let mut next = 0;
            for p in mine {
                if p.start != next {
                    return Err(missing(format!(
                        "slice {slice} has no elements {next}..{}",
                        p.start
                    )));
                }
                let file = self
                    .files
                    .get(p.file.as_str())
                    .ok_or_else(|| missing(format!("file '{}' is not in the index's list", p.file)))?;
                let view = file
                    .tensor(&p.key)
                    .map_err(|_| missing(format!("'{}' has no tensor '{}'", p.file, p.key)))?;
                if view.shape() != [p.len] || view.data().len() != p.len * dtype.size_bytes() {
                    return Err(missing(format!(
                        "'{}' in '{}' is not {} elements",
                        p.key, p.file, p.len
                    )));
                }
                data.extend_from_slice(view.data());
                next += p.len;
            }
            if next != slice_numel {
                return Err(missing(format!(
                    "slice {slice} ends at {next} of {slice_numel} elements"
                )));
            }
            let mut local = shape.to_vec();
            if let Some(c) = cut {
                local[c.axis] /= parts;
            }
            let v = Value::from_le_bytes(dtype, local, &data).map_err(|e| missing(e.to_string()))?;
            slices_whole.push(v);
        }
        Ok(match cut {
            Some(c) => slices::join(&slices_whole, c.axis, c.blocks),
            None => slices_whole.pop().expect("one slice when the tensor is not cut"),
        })
    }
}

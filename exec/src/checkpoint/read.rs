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
    let index = parse_index(&dir, &text)?;
    Ok((dir, index))
}

/// The index `text` of the checkpoint in `dir`, checked: its format and
/// version, and file names that stay inside `dir`.
fn parse_index(dir: &Path, text: &str) -> Result<Index, CheckpointError> {
    let format = |message: String| CheckpointError::Format {
        path: dir.join(INDEX).display().to_string(),
        message,
    };
    let index: Index = serde_json::from_str(text).map_err(|e| format(e.to_string()))?;
    if index.format != FORMAT || index.version != VERSION {
        return Err(format(format!(
            "format '{}' version {}; this build reads '{FORMAT}' version {VERSION}",
            index.format, index.version
        )));
    }
    let plain = |name: &str| !name.is_empty() && !name.contains(['/', '\\']) && name != ".." && name != ".";
    if let Some(bad) = index.files.iter().find(|f| !plain(f)) {
        return Err(format(format!(
            "file '{bad}' is not a file name in the checkpoint's folder"
        )));
    }
    Ok(index)
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
    restore(dir, index, &files)
}

/// A checkpoint from its index text and its files' bytes, as if read from
/// `dir` (which names it in errors): the reader's whole logic without the
/// file system, for fuzzing.
pub fn open_bytes(
    dir: &Path,
    index: &str,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<Restored, CheckpointError> {
    let index = parse_index(dir, index)?;
    restore(dir.to_path_buf(), index, files)
}

/// Every tensor of `index` rebuilt whole from `files`.
fn restore(
    dir: PathBuf,
    index: Index,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<Restored, CheckpointError> {
    let available: usize = files.values().map(Vec::len).sum();
    for name in &index.files {
        if !files.contains_key(name) {
            return Err(CheckpointError::Missing {
                path: dir.display().to_string(),
                what: format!("file '{name}'"),
            });
        }
    }
    let mut parsed = BTreeMap::new();
    for (name, bytes) in files {
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| CheckpointError::Format {
            path: dir.join(name).display().to_string(),
            message: e.to_string(),
        })?;
        parsed.insert(name.as_str(), st);
    }
    let reader = Reader {
        dir: &dir,
        files: &parsed,
        available,
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
    /// Bytes in all the files: no tensor holds more.
    available: usize,
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
        let numel = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n.saturating_mul(dtype.size_bytes()) <= self.available)
            .ok_or_else(|| CheckpointError::Format {
                path: self.dir.join(INDEX).display().to_string(),
                message: format!("'{name}' of shape {shape:?} holds more than the checkpoint's files"),
            })?;
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
                if view.shape() != [p.len] || Some(view.data().len()) != p.len.checked_mul(dtype.size_bytes())
                {
                    return Err(missing(format!(
                        "'{}' in '{}' is not {} elements",
                        p.key, p.file, p.len
                    )));
                }
                data.extend_from_slice(view.data());
                next = next.saturating_add(p.len);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An index of one tensor `w` whose weight is `len` elements of `file`.
    fn index(file: &str, shape: &str, len: usize) -> String {
        format!(
            r#"{{"format":"{FORMAT}","version":{VERSION},"step":1,"model":"m","model_hash":"h","precision":"F32",
            "optimizer":{{"kind":"sgd","lr":0.1,"momentum":0.0,"weight_decay":0.0}},"data":{{"seed":0,"next_step":1}},
            "plan":null,"files":["{file}"],
            "tensors":{{"w":{{"shape":{shape},"dtype":"F32","weight":[{{"file":"{file}","key":"k","slice":0,"start":0,"len":{len}}}]}}}}}}"#
        )
    }

    fn files(name: &str) -> BTreeMap<String, Vec<u8>> {
        let bytes: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &bytes).unwrap();
        let file = safetensors::tensor::serialize(vec![("k", view)], None).unwrap();
        BTreeMap::from([(name.to_string(), file)])
    }

    #[test]
    fn an_index_reads_back_its_tensor_and_refuses_what_does_not_fit() {
        let dir = Path::new("ck/step-1");
        let ok = open_bytes(
            dir,
            &index("rank-0.safetensors", "[2]", 2),
            &files("rank-0.safetensors"),
        )
        .unwrap();
        assert_eq!(ok.weight("w").unwrap().to_f64_vec(), vec![1.0, 2.0]);
        // A file outside the folder, a shape past the files' bytes or past
        // usize, and a piece longer than its tensor: errors, not panics.
        let outside = open_bytes(dir, &index("../x", "[2]", 2), &files("../x")).unwrap_err();
        assert!(outside.to_string().contains("not a file name"), "{outside}");
        for (shape, len) in [
            ("[1000000000000]", 2),
            ("[4294967296, 4294967296, 16]", 2),
            ("[2]", usize::MAX),
        ] {
            let e = open_bytes(
                dir,
                &index("rank-0.safetensors", shape, len),
                &files("rank-0.safetensors"),
            );
            assert!(e.is_err(), "{shape} {len}");
        }
    }
}

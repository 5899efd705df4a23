//! Saving off the training critical path. At the end of a step a rank
//! copies its pieces to the host (a [`Snapshot`]) and goes on; a writer
//! thread per process writes them. Every file of step `S` is written into
//! `.step-S.partial/` (each synced and renamed into place); once every
//! rank's file is there the process of rank 0 adds the index, renames the
//! folder to `step-S` and then points `latest` at it. A published folder is
//! never written again, so a kill at any moment leaves `latest` naming a
//! complete checkpoint (or none). Older checkpoints beyond the `keep`
//! newest are removed after.

use super::index::{rank_file, DataPosition, Index, TensorEntry, FORMAT, VERSION};
use super::CheckpointError;
use super::Keyed;
use crate::train::Optimizer;
use autopar_ir::interp::Precision;
use autopar_ir::Data;
use autopar_ir::{DType, Value};
use autopar_lower::{Program, TrainingGraph};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The file in a checkpoint folder that names the newest complete checkpoint.
pub const LATEST: &str = "latest";
/// The index file in each `step-<S>` folder.
pub const INDEX: &str = "index.json";
/// How the writer's temporary files begin.
const TEMPORARY_PREFIX: &str = ".autopar-";
/// How an unpublished step folder's name ends.
const PARTIAL: &str = ".partial";

/// When and where a run saves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavePolicy {
    pub dir: PathBuf,
    /// Save after every `every` steps (and after the last).
    pub every: usize,
    /// Keep the newest `keep` checkpoints.
    pub keep: usize,
}

impl SavePolicy {
    /// Whether the run saves once `completed` of its `total` steps are done
    /// (`every` 0: after the last only).
    pub fn due(&self, completed: usize, total: usize) -> bool {
        completed == total || (self.every > 0 && completed % self.every == 0)
    }
}

/// What every checkpoint of a run records about the run.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// The model as the run named it (a file or a spec).
    pub model: String,
    pub model_hash: String,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub seed: u64,
    pub plan: serde_json::Value,
}

/// The record and every tensor's layout and pieces (the same at every step).
struct Header {
    record: RunRecord,
    tensors: BTreeMap<String, TensorEntry>,
}

/// One rank's pieces after step `completed`, on the host.
pub struct Snapshot {
    pub rank: usize,
    pub completed: usize,
    pub pieces: Vec<(String, Value)>,
}

/// A process's writer: takes snapshots from its ranks and publishes each
/// checkpoint once all of its files are written.
pub struct Saver {
    policy: SavePolicy,
    /// Each rank's pieces ([`super::layout::writes`]) and their keys.
    writes: Vec<Vec<Keyed>>,
    total_steps: usize,
    tx: Mutex<Option<mpsc::SyncSender<Snapshot>>>,
    worker: Mutex<Option<JoinHandle<Result<(), CheckpointError>>>>,
}

impl std::fmt::Debug for Saver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saver").field("policy", &self.policy).finish()
    }
}

impl Saver {
    /// Starts the writer of the ranks `local` (of `programs`) of a run of
    /// `t` from step `first_step` to `total_steps`; the process holding rank
    /// 0 publishes, waiting up to `wait` for other processes' files. A
    /// folder already holding a checkpoint past `first_step` is refused
    /// (published checkpoints are never overwritten).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        policy: SavePolicy,
        record: RunRecord,
        t: &TrainingGraph,
        programs: &[Program],
        local: Vec<usize>,
        first_step: usize,
        total_steps: usize,
        wait: Duration,
    ) -> Result<Saver, CheckpointError> {
        let slots = record.optimizer.slot_names();
        let (tensors, writes) = super::tensors(t, programs, slots, record.precision);
        let header = Header { record, tensors };
        std::fs::create_dir_all(&policy.dir).map_err(CheckpointError::io(&policy.dir))?;
        if let Some(&newest) = published(&policy.dir)?.last().filter(|&&s| s > first_step) {
            return Err(CheckpointError::Ahead {
                path: policy.dir.display().to_string(),
                newest,
                first_step,
            });
        }
        // What a killed run left unpublished; no rank saves before rank 0
        // has started (every step needs it), so nothing current is removed.
        if local.contains(&0) {
            remove_unpublished(&policy.dir);
        }
        // At most one checkpoint waits for the writer: a run that saves
        // faster than the disk takes it waits rather than piling up copies.
        let (tx, rx) = mpsc::sync_channel::<Snapshot>(local.len());
        let writer = Writer {
            policy: policy.clone(),
            header,
            ranks: writes.len(),
            local,
            wait,
        };
        let worker = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(CheckpointError::io(&policy.dir))?;
        Ok(Saver {
            policy,
            writes,
            total_steps,
            tx: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Whether ranks save after `completed` steps.
    pub fn due(&self, completed: usize) -> bool {
        self.policy.due(completed, self.total_steps)
    }

    /// The pieces `rank` writes, with their keys.
    pub(crate) fn writes_of(&self, rank: usize) -> &[Keyed] {
        self.writes.get(rank).map_or(&[], Vec::as_slice)
    }

    /// Hands a snapshot to the writer: at once, unless a whole checkpoint
    /// already waits to be written.
    pub fn submit(&self, snapshot: Snapshot) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            // A writer that stopped has an error for `finish` to report.
            let _ = tx.send(snapshot);
        }
    }

    /// Waits for every submitted checkpoint to be written and published.
    pub fn finish(&self) -> Result<(), CheckpointError> {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        match self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(worker) => worker.join().unwrap_or(Err(CheckpointError::WriterPanicked)),
            None => Ok(()),
        }
    }
}

/// The writer thread's state.
struct Writer {
    policy: SavePolicy,
    header: Header,
    ranks: usize,
    local: Vec<usize>,
    wait: Duration,
}

impl Writer {
    fn run(self, rx: mpsc::Receiver<Snapshot>) -> Result<(), CheckpointError> {
        let mut written: HashMap<usize, usize> = HashMap::new();
        for snapshot in rx {
            let dir = partial_dir(&self.policy.dir, snapshot.completed);
            std::fs::create_dir_all(&dir).map_err(CheckpointError::io(&dir))?;
            write_safetensors(&dir.join(rank_file(snapshot.rank)), &snapshot.pieces)?;
            let done = written.entry(snapshot.completed).or_default();
            *done += 1;
            if *done == self.local.len() && self.local.contains(&0) {
                self.publish(snapshot.completed)?;
            }
        }
        Ok(())
    }

    /// Writes the index of step `completed` once every rank's file is there,
    /// then points `latest` at it and removes what `keep` no longer keeps.
    fn publish(&self, completed: usize) -> Result<(), CheckpointError> {
        let dir = partial_dir(&self.policy.dir, completed);
        let files: Vec<String> = (0..self.ranks).map(rank_file).collect();
        let deadline = Instant::now() + self.wait;
        while let Some(missing) = files.iter().find(|f| !dir.join(f).exists()) {
            if Instant::now() >= deadline {
                return Err(CheckpointError::Incomplete {
                    path: dir.join(missing).display().to_string(),
                    waited_s: self.wait.as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = &self.header.record;
        let index = Index {
            format: FORMAT.into(),
            version: VERSION,
            step: completed,
            model: r.model.clone(),
            model_hash: r.model_hash.clone(),
            precision: super::dtype_name(r.precision).into(),
            optimizer: r.optimizer,
            data: DataPosition {
                seed: r.seed,
                next_step: completed,
            },
            plan: r.plan.clone(),
            files,
            tensors: self.header.tensors.clone(),
        };
        let json = serde_json::to_vec_pretty(&index).map_err(|e| CheckpointError::Format {
            path: dir.join(INDEX).display().to_string(),
            message: e.to_string(),
        })?;
        write_atomic(&dir.join(INDEX), &json)?;
        let done = step_dir(&self.policy.dir, completed);
        std::fs::rename(&dir, &done).map_err(CheckpointError::io(&done))?;
        sync_folder(&self.policy.dir);
        let name = format!("{}\n", step_name(completed));
        write_atomic(&self.policy.dir.join(LATEST), name.as_bytes())?;
        prune(&self.policy.dir, self.policy.keep)
    }
}

/// `step-<S>`.
pub(crate) fn step_name(completed: usize) -> String {
    format!("step-{completed}")
}

pub(super) fn step_dir(dir: &Path, completed: usize) -> PathBuf {
    dir.join(step_name(completed))
}

/// Where step `completed`'s files gather until it is published.
fn partial_dir(dir: &Path, completed: usize) -> PathBuf {
    dir.join(format!(".{}{PARTIAL}", step_name(completed)))
}

/// The steps of the published checkpoints in `dir`, ascending.
pub(super) fn published(dir: &Path) -> Result<Vec<usize>, CheckpointError> {
    let mut steps: Vec<usize> = std::fs::read_dir(dir)
        .map_err(CheckpointError::io(dir))?
        .filter_map(|e| {
            let e = e.ok()?;
            let step = e.file_name().to_str()?.strip_prefix("step-")?.parse().ok()?;
            e.path().join(INDEX).exists().then_some(step)
        })
        .collect();
    steps.sort_unstable();
    Ok(steps)
}

/// Syncs a folder's entries (best effort: not every file system can).
fn sync_folder(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// A tensor as safetensors reads it: its bytes borrowed where the host is
/// little-endian (no copy of a checkpoint's gigabytes), encoded otherwise.
struct Tensor<'a> {
    value: &'a Value,
    dtype: safetensors::Dtype,
}

impl<'a> Tensor<'a> {
    fn of(key: &str, value: &'a Value) -> Result<Tensor<'a>, String> {
        let dtype = match value.dtype {
            DType::F32 => safetensors::Dtype::F32,
            DType::F64 => safetensors::Dtype::F64,
            other => return Err(format!("'{key}' holds {other:?}, not f32 or f64")),
        };
        Ok(Tensor { value, dtype })
    }
}

impl safetensors::View for Tensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.value.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match &self.value.data {
            Data::F32(d) if cfg!(target_endian = "little") => Cow::Borrowed(bytemuck::cast_slice(d)),
            Data::F64(d) if cfg!(target_endian = "little") => Cow::Borrowed(bytemuck::cast_slice(d)),
            _ => Cow::Owned(self.value.to_le_bytes()),
        }
    }

    fn data_len(&self) -> usize {
        self.value.numel() * self.value.dtype.size_bytes()
    }
}

/// `tensors` (f32 or f64) as views safetensors writes.
fn views(tensors: &[(String, Value)]) -> Result<Vec<(&str, Tensor<'_>)>, String> {
    tensors
        .iter()
        .map(|(key, v)| Ok((key.as_str(), Tensor::of(key, v)?)))
        .collect()
}

/// A safetensors file of `tensors` (f32 or f64), or why not.
pub fn safetensors_file(tensors: &[(String, Value)]) -> Result<Vec<u8>, String> {
    safetensors::tensor::serialize(views(tensors)?, None).map_err(|e| e.to_string())
}

/// Writes `tensors` as a safetensors file at `path`, atomically (see
/// [`write_atomic`]), streaming each tensor's bytes to the file.
fn write_safetensors(path: &Path, tensors: &[(String, Value)]) -> Result<(), CheckpointError> {
    let views = views(tensors).map_err(|message| CheckpointError::Format {
        path: path.display().to_string(),
        message,
    })?;
    replace_atomically(path, |tmp| {
        safetensors::tensor::serialize_to_file(views, None, tmp)
            .map_err(|e| std::io::Error::other(e.to_string()))
    })
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, renames it
/// over `path` and syncs the folder: readers see the old file or the new
/// one, never part of one.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    replace_atomically(path, |tmp| std::fs::write(tmp, bytes))
}

/// Has `write` fill a temporary file beside `path`, then syncs it, makes it
/// readable as any file the user writes, renames it over `path` and syncs
/// the folder.
fn replace_atomically(
    path: &Path,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(TEMPORARY_PREFIX)
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(CheckpointError::io(dir))?;
    write(tmp.path()).map_err(CheckpointError::io(path))?;
    let file = std::fs::File::open(tmp.path()).map_err(CheckpointError::io(path))?;
    file.sync_all().map_err(CheckpointError::io(path))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path)
        .map_err(|e| CheckpointError::io(path)(e.error))?;
    sync_folder(dir);
    Ok(())
}

/// Removes what a killed run left unpublished in `dir`: partial step
/// folders and the writer's temporary files (by their names); best effort.
fn remove_unpublished(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".step-") && name.ends_with(PARTIAL) {
            let _ = std::fs::remove_dir_all(e.path());
        } else if name.starts_with(TEMPORARY_PREFIX) && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes published checkpoints beyond the `keep` newest.
fn prune(dir: &Path, keep: usize) -> Result<(), CheckpointError> {
    let steps = published(dir)?;
    for &step in steps.iter().rev().skip(keep.max(1)) {
        let path = step_dir(dir, step);
        std::fs::remove_dir_all(&path).map_err(CheckpointError::io(&path))?;
    }
    Ok(())
}

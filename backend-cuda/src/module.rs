//! The compiled kernels of one CUDA context, looked up by name, and the
//! `View` argument the strided kernels take. Sources are compiled by NVRTC
//! for the device's architecture on first use and the machine code cached on
//! disk (`$XDG_CACHE_HOME/autopar/kernels`, else `~/.cache/autopar/kernels`),
//! keyed by a hash of the source, the architecture and the NVRTC version, so
//! later runs skip the seconds of compilation.

use super::{kernels, nvrtc, CudaError};
use cudarc::driver::{CudaContext, CudaFunction, DeviceRepr};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Every kernel of every source, loaded into one context.
pub(crate) struct Kernels {
    functions: HashMap<String, CudaFunction>,
    arch: String,
}

impl Kernels {
    /// Compiles (or reads from the cache) every source for a device of
    /// `compute_capability` and loads all kernels into `ctx`. Needs libnvrtc
    /// even when everything is cached (its version is part of the key).
    pub(crate) fn load(ctx: &Arc<CudaContext>, compute_capability: (u32, u32)) -> Result<Self, CudaError> {
        let (major, minor) = compute_capability;
        let arch = format!("sm_{major}{minor}");
        let version = nvrtc::version()?;
        let cache = cache_dir();
        let names: Vec<&str> = kernels::SOURCES.iter().map(|(name, _)| *name).collect();
        let files: Vec<String> = names
            .iter()
            .map(|name| cache_file(name, &arch, version))
            .collect();
        let mut cubins: Vec<Option<Vec<u8>>> = files
            .iter()
            .map(|file| cache.as_ref().and_then(|dir| std::fs::read(dir.join(file)).ok()))
            .collect();
        let cached: Vec<bool> = cubins.iter().map(Option::is_some).collect();
        compile_missing(&names, &files, &mut cubins, &arch, cache.as_deref())?;

        let mut functions = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            let cubin = cubins[i].take().unwrap_or_default();
            let loaded = match load_source(ctx, name, cubin) {
                // A stale or damaged cache entry: compile afresh once.
                Err(_) if cached[i] => {
                    let mut fresh = vec![None];
                    compile_missing(&[name], &files[i..=i], &mut fresh, &arch, cache.as_deref())?;
                    load_source(ctx, name, fresh[0].take().unwrap_or_default())?
                }
                other => other?,
            };
            functions.extend(loaded);
        }
        Ok(Kernels { functions, arch })
    }

    /// The kernel `name` (see `kernels::kernel_names`).
    pub(crate) fn get(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self.functions
            .get(name)
            .cloned()
            .ok_or_else(|| CudaError::UnknownKernel {
                name: name.to_string(),
                arch: self.arch.clone(),
            })
    }
}

/// Compiles the sources whose `cubins` entry is empty and caches the results.
fn compile_missing(
    names: &[&str],
    files: &[String],
    cubins: &mut [Option<Vec<u8>>],
    arch: &str,
    cache: Option<&Path>,
) -> Result<(), CudaError> {
    let todo: Vec<usize> = (0..names.len()).filter(|&i| cubins[i].is_none()).collect();
    if todo.is_empty() {
        return Ok(());
    }
    let todo_names: Vec<&str> = todo.iter().map(|&i| names[i]).collect();
    for (i, (cubin, _)) in todo.into_iter().zip(nvrtc::compile_many(&todo_names, arch)?) {
        if let Some(dir) = cache {
            write_atomically(&dir.join(&files[i]), &cubin);
        }
        cubins[i] = Some(cubin);
    }
    Ok(())
}

/// Loads one source's CUBIN and looks up every kernel it must export.
fn load_source(
    ctx: &Arc<CudaContext>,
    name: &str,
    cubin: Vec<u8>,
) -> Result<Vec<(String, CudaFunction)>, CudaError> {
    let module = ctx
        .load_module(Ptx::from_binary(cubin))
        .map_err(|e| CudaError::Driver(format!("loading the kernels of {name}.cu: {e}")))?;
    kernels::kernel_names(name)
        .into_iter()
        .map(|kernel| {
            let f = module
                .load_function(&kernel)
                .map_err(|e| CudaError::Driver(format!("kernel {kernel} of {name}.cu: {e}")))?;
            Ok((kernel, f))
        })
        .collect()
}

/// The cache folder, created if needed; `None` when it cannot be.
fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = env("XDG_CACHE_HOME").or_else(|| env("HOME").map(|h| h.join(".cache")))?;
    let dir = base.join("autopar").join("kernels");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// `<source>-<arch>-<hash>.cubin`, the hash covering everything that
/// changes the machine code.
fn cache_file(source: &str, arch: &str, (major, minor): (i32, i32)) -> String {
    let text = kernels::full_source(source).unwrap_or_default();
    let key = [
        text.as_str(),
        arch,
        &format!("nvrtc {major}.{minor}"),
        &nvrtc::FLAGS.join(" "),
    ]
    .join("\0");
    format!("{source}-{arch}-{:016x}.cubin", fnv1a(key.as_bytes()))
}

/// 64-bit FNV-1a: stable across Rust versions, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes `path` through a temporary file and a rename, so concurrent
/// processes never read half a file. Failure only means no cache.
fn write_atomically(path: &Path, bytes: &[u8]) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_extension(format!("{}.{nanos}.tmp", std::process::id()));
    if std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .is_err()
    {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// A strided tensor as the kernels see it (`struct View` in `common.cuh`):
/// element `i` in row-major order over `dims` is at `offset(i)`. Passed to
/// kernels by value, 136 bytes (4 bytes of padding after `rank`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct View {
    rank: i32,
    dims: [i64; kernels::MAX_RANK],
    strides: [i64; kernels::MAX_RANK],
}

// SAFETY: #[repr(C)] plain integers, laid out as the CUDA struct.
unsafe impl DeviceRepr for View {}

impl View {
    /// `dims` with element strides `strides` (transposes, slices); `None`
    /// above [`kernels::MAX_RANK`] dimensions or when the lengths differ.
    pub(crate) fn new(dims: &[usize], strides: &[i64]) -> Option<View> {
        if dims.len() > kernels::MAX_RANK || strides.len() != dims.len() {
            return None;
        }
        let mut view = View {
            rank: dims.len() as i32,
            dims: [1; kernels::MAX_RANK],
            strides: [0; kernels::MAX_RANK],
        };
        for (d, (&n, &s)) in dims.iter().zip(strides).enumerate() {
            view.dims[d] = i64::try_from(n).ok()?;
            view.strides[d] = s;
        }
        Some(view)
    }

    /// A row-major tensor of shape `dims`.
    pub(crate) fn contiguous(dims: &[usize]) -> Option<View> {
        View::new(dims, &row_major_strides(dims))
    }

    /// A row-major tensor of shape `in_dims` read as `out_dims`, numpy
    /// style: dims align on the right, and a size-1 or missing dim repeats
    /// (stride 0). `None` when the shapes do not broadcast.
    pub(crate) fn broadcast(in_dims: &[usize], out_dims: &[usize]) -> Option<View> {
        let lead = out_dims.len().checked_sub(in_dims.len())?;
        let own = row_major_strides(in_dims);
        let strides = (0..out_dims.len())
            .map(|d| match d.checked_sub(lead) {
                None => Some(0),
                Some(j) if in_dims[j] == out_dims[d] => Some(own[j]),
                Some(j) if in_dims[j] == 1 => Some(0),
                Some(_) => None,
            })
            .collect::<Option<Vec<i64>>>()?;
        View::new(out_dims, &strides)
    }

    /// The same elements seen two ways, for collectives along an axis:
    /// `parts` tensors of shape `piece` stacked one after another (the
    /// layout NCCL gathers into and reduce-scatters from), and their
    /// concatenation along `axis`. Both views walk the same dims (`piece`
    /// with `axis` split into part and row), so a copy through them
    /// converts one layout into the other, either way. `None` when `axis`
    /// is not one of `piece`'s or the extra dim passes [`kernels::MAX_RANK`].
    pub(crate) fn stacked_and_concatenated(
        piece: &[usize],
        axis: usize,
        parts: usize,
    ) -> Option<(View, View)> {
        let mut whole = piece.to_vec();
        *whole.get_mut(axis)? *= parts;
        let (own, cat) = (row_major_strides(piece), row_major_strides(&whole));
        let numel: usize = piece.iter().product();
        let mut dims = piece.to_vec();
        dims.insert(axis, parts);
        let mut stacked = own.clone();
        stacked.insert(axis, numel as i64);
        let mut concatenated = cat.clone();
        concatenated.insert(axis, piece[axis] as i64 * cat[axis]);
        Some((View::new(&dims, &stacked)?, View::new(&dims, &concatenated)?))
    }

    /// Where element `i` lives: `view_offset` of `common.cuh`, in Rust.
    #[cfg(test)]
    pub(crate) fn offset(&self, mut i: i64) -> i64 {
        let mut off = 0;
        for d in (0..self.rank as usize).rev() {
            off += (i % self.dims[d]) * self.strides[d];
            i /= self.dims[d];
        }
        off
    }
}

/// Element strides of a row-major tensor of shape `dims`.
pub(crate) fn row_major_strides(dims: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(dims[d + 1] as i64);
    }
    strides
}

#[cfg(test)]
mod tests;

//! `View` offsets mirrored from `common.cuh` and the kernel cache key (no GPU
//! needed), plus numeric checks of every kernel family against
//! straightforward Rust references (`tests/*.rs`).
//! The numeric checks need a GPU; without one they print why and pass.

use super::*;
use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, ValidAsZeroBits};
use std::sync::{Mutex, MutexGuard, OnceLock};

mod attention;
mod elementwise;
mod nn;

#[test]
fn contiguous_offsets_are_the_element_index() {
    let v = View::contiguous(&[2, 3, 4]).unwrap();
    assert_eq!(
        (0..24).map(|i| v.offset(i)).collect::<Vec<_>>(),
        (0..24).collect::<Vec<_>>()
    );
    // Rank 0 (a scalar): one element at offset 0.
    assert_eq!(View::contiguous(&[]).unwrap().offset(0), 0);
}

#[test]
fn a_transposed_view_walks_the_input_in_output_order() {
    // in [2, 3] row-major, read as its transpose [3, 2]: strides [1, 3].
    let v = View::new(&[3, 2], &[1, 3]).unwrap();
    assert_eq!(
        (0..6).map(|i| v.offset(i)).collect::<Vec<_>>(),
        [0, 3, 1, 4, 2, 5]
    );
}

#[test]
fn broadcast_repeats_size_one_and_missing_dims_with_stride_zero() {
    // [3, 1] read as [2, 3, 2]: the leading dim is missing, the last repeats.
    let v = View::broadcast(&[3, 1], &[2, 3, 2]).unwrap();
    assert_eq!(v.strides[..3], [0, 1, 0]);
    assert_eq!(
        (0..12).map(|i| v.offset(i)).collect::<Vec<_>>(),
        [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]
    );
    assert_eq!(View::broadcast(&[2], &[3]), None, "2 does not broadcast to 3");
    assert_eq!(View::broadcast(&[1, 2], &[2]), None, "more dims than the output");
}

/// Copying stacked pieces through the two views gives their concatenation
/// along the axis (as `Op::Concat` computes it), for every axis.
#[test]
fn stacked_pieces_read_through_the_views_are_their_concatenation() {
    use autopar_ir::{Op, Value};
    let piece = [2usize, 3, 4];
    let parts = 3;
    let numel: usize = piece.iter().product();
    let stacked: Vec<f32> = (0..parts * numel).map(|i| i as f32).collect();
    for axis in 0..piece.len() {
        let (from, to) = View::stacked_and_concatenated(&piece, axis, parts).unwrap();
        let mut got = vec![f32::NAN; stacked.len()];
        for i in 0..stacked.len() as i64 {
            got[to.offset(i) as usize] = stacked[from.offset(i) as usize];
        }
        let pieces: Vec<Value> = stacked
            .chunks(numel)
            .map(|c| Value::f32(piece.to_vec(), c.to_vec()).unwrap())
            .collect();
        let refs: Vec<Option<&Value>> = pieces.iter().map(Some).collect();
        let expected = Op::Concat { axis: axis as i64 }.eval(&refs).unwrap().remove(0);
        assert_eq!(
            got,
            expected
                .to_f64_vec()
                .iter()
                .map(|&v| v as f32)
                .collect::<Vec<_>>(),
            "axis {axis}"
        );
    }
    assert!(View::stacked_and_concatenated(&[1; kernels::MAX_RANK], 0, 2).is_none());
    assert!(View::stacked_and_concatenated(&piece, 3, 2).is_none());
}

#[test]
fn views_above_max_rank_or_with_mismatched_strides_are_refused() {
    assert!(View::contiguous(&[1; kernels::MAX_RANK]).is_some());
    assert_eq!(View::contiguous(&[1; kernels::MAX_RANK + 1]), None);
    assert_eq!(View::new(&[2, 2], &[1]), None);
}

#[test]
fn view_has_the_layout_of_the_cuda_struct() {
    // int rank; 4 bytes padding; long long dims[8]; long long strides[8].
    assert_eq!(std::mem::size_of::<View>(), 136);
    assert_eq!(std::mem::align_of::<View>(), 8);
    assert_eq!(std::mem::offset_of!(View, dims), 8);
    assert_eq!(std::mem::offset_of!(View, strides), 72);
}

#[test]
fn fnv1a_matches_the_published_test_vectors() {
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn cache_files_differ_by_source_arch_and_compiler_version() {
    let base = cache_file("softmax", "sm_90", (12, 9));
    assert!(
        base.starts_with("softmax-sm_90-") && base.ends_with(".cubin"),
        "{base}"
    );
    assert_eq!(base, cache_file("softmax", "sm_90", (12, 9)));
    assert_ne!(base, cache_file("softmax", "sm_80", (12, 9)));
    assert_ne!(base, cache_file("softmax", "sm_90", (12, 8)));
    assert_ne!(base, cache_file("norm", "sm_90", (12, 9)));
}

#[test]
fn cache_writes_replace_the_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.cubin");
    write_atomically(&path, b"old");
    write_atomically(&path, b"new contents");
    assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
    let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(leftovers, 1, "no temporary files are left behind");
    // An unwritable place is not an error, only no cache.
    write_atomically(&dir.path().join("missing/x.cubin"), b"x");
}

// ---- GPU harness ----

/// The stream and kernels every numeric test shares.
pub(super) struct Gpu {
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
}

/// The GPU (kernels compiled once per test binary, tests serialised), or
/// `None` after [`crate::gpu_or_skip`] printed why the test is skipped
/// (or failed it under `AUTOPAR_REQUIRE_GPU=1`). A GPU whose context,
/// kernels or modules fail to load fails the test.
pub(super) fn gpu(test: &str) -> Option<MutexGuard<'static, Gpu>> {
    static GPU: OnceLock<Mutex<Gpu>> = OnceLock::new();
    let info = crate::gpu_or_skip(&format!("cuda kernel test '{test}'"))?;
    let shared = GPU.get_or_init(|| {
        let ctx = crate::device::context(0).unwrap_or_else(|e| panic!("context on {}: {e}", info.name));
        let kernels = Kernels::load(&ctx, info.compute_capability)
            .unwrap_or_else(|e| panic!("kernels for {}: {e}", info.name));
        Mutex::new(Gpu {
            stream: ctx.default_stream(),
            kernels,
        })
    });
    Some(shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// A storage type of the kernels, seen from the host.
pub(super) trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Unpin + Send + Sync + 'static {
    /// Kernel-name suffix.
    const SUFFIX: &'static str;
    /// Relative tolerance of results stored in this type.
    const TOL: f32;
    fn of(x: f32) -> Self;
    fn get(self) -> f32;
}

impl Elem for f32 {
    const SUFFIX: &'static str = "f32";
    const TOL: f32 = 2e-5;
    fn of(x: f32) -> Self {
        x
    }
    fn get(self) -> f32 {
        self
    }
}

/// bf16 bits (cudarc's own bf16 support is a feature we do not enable).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub(super) struct Bf16(u16);
// SAFETY: a plain u16 with the layout of __nv_bfloat16; all-zero bits is 0.0.
unsafe impl DeviceRepr for Bf16 {}
unsafe impl ValidAsZeroBits for Bf16 {}

impl Elem for Bf16 {
    const SUFFIX: &'static str = "bf16";
    const TOL: f32 = 1.6e-2;
    fn of(x: f32) -> Self {
        Bf16(half::bf16::from_f32(x).to_bits())
    }
    fn get(self) -> f32 {
        half::bf16::from_bits(self.0).to_f32()
    }
}

/// Launches kernel `$name` with `$cfg` and the listed argument references.
macro_rules! launch {
    ($g:expr, $name:expr, $cfg:expr; $($arg:expr),* $(,)?) => {{
        use cudarc::driver::PushKernelArg;
        let name: String = $name;
        let f = $g.kernels.get(&name).unwrap();
        // One statement, so temporaries among the arguments outlive the launch.
        // SAFETY: argument lists follow the kernel spec; buffers are sized by the tests.
        unsafe { $g.stream.launch_builder(&f)$(.arg($arg))*.launch($cfg) }
            .unwrap_or_else(|e| panic!("launching {name}: {e}"));
    }};
}
pub(super) use launch;

/// A grid-stride launch deliberately smaller than `n` threads when `n` is
/// large, so the loops are exercised.
pub(super) fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 3) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` per row.
pub(super) fn rows(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn up<T: Elem>(g: &Gpu, xs: &[f32]) -> CudaSlice<T> {
    let host: Vec<T> = xs.iter().map(|&x| T::of(x)).collect();
    g.stream.clone_htod(&host).unwrap()
}

pub(super) fn up_raw<T: DeviceRepr>(g: &Gpu, xs: &[T]) -> CudaSlice<T> {
    g.stream.clone_htod(xs).unwrap()
}

pub(super) fn down<T: Elem>(g: &Gpu, s: &CudaSlice<T>) -> Vec<f32> {
    g.stream
        .clone_dtoh(s)
        .unwrap()
        .into_iter()
        .map(Elem::get)
        .collect()
}

pub(super) fn down_raw<T: DeviceRepr>(g: &Gpu, s: &CudaSlice<T>) -> Vec<T> {
    g.stream.clone_dtoh(s).unwrap()
}

pub(super) fn zeros<T: DeviceRepr + ValidAsZeroBits>(g: &Gpu, n: usize) -> CudaSlice<T> {
    g.stream.alloc_zeros(n).unwrap()
}

/// The values as the device stores them in `T`.
pub(super) fn stored<T: Elem>(xs: &[f32]) -> Vec<f32> {
    xs.iter().map(|&x| T::of(x).get()).collect()
}

/// `n` pseudo-random values in [lo, hi) (xorshift; reproducible).
pub(super) fn random(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// Asserts |got − want| ≤ tol·(1 + |want|) elementwise (NaN equals NaN).
pub(super) fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "{what}[{i}]: got {g}, want {w} (tolerance {tol})");
    }
}

/// f64 results as f32, for comparisons.
pub(super) fn f32s(xs: &[f64]) -> Vec<f32> {
    xs.iter().map(|&x| x as f32).collect()
}

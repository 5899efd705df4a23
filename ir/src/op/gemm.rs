//! A bounds-checked wrapper around `matrixmultiply`'s GEMM over strided
//! matrix views, which the products, attention and the MoE kernels share,
//! and the one rule for splitting a product's rows over a rank's threads
//! ([`split_ways`]), which the products run and the simulator prices.

use super::context::invalid;
use super::numeric::Real;
use super::OpError;
use std::cell::Cell;

thread_local! {
    /// Threads this thread's products may use: a rank's share of the host.
    static PRODUCT_THREADS: Cell<usize> = const { Cell::new(1) };
}

/// Lets the products (`MatMul`, `Linear`, `Gemm`) evaluated on this thread
/// split their rows over `threads` threads (at least 1). The CPU backend
/// sets it on each rank's thread.
pub fn set_product_threads(threads: usize) {
    PRODUCT_THREADS.with(|t| t.set(threads.max(1)));
}

/// The threads this thread's products may use.
pub fn product_threads() -> usize {
    PRODUCT_THREADS.with(Cell::get)
}

/// Whether `op`'s kernel splits its product over this thread's
/// [`product_threads`] ([`split_ways`]): the plain products, whose kernels
/// call [`gemm_threaded`]. Attention splits by heads instead
/// ([`attention_ways`]); convolutions and experts run their products on
/// the rank's own thread. The simulator prices by these.
pub fn splits_over_threads(op: &super::Op) -> bool {
    matches!(op, super::Op::MatMul | super::Op::Linear | super::Op::Gemm { .. })
}

/// Multiply-adds a thread must be handed before a product is split for it:
/// about 50 µs of one core's work, well above waking a pool thread.
pub const MIN_MACS_PER_WAY: usize = 1 << 21;
/// Rows of `C` a thread must be handed (a few micro-kernel tiles).
const MIN_ROWS_PER_WAY: usize = 48;
/// A multiple of every micro-kernel's row count in `matrixmultiply` (4, 6,
/// 8 or 16): a way's first row starts a tile of the whole product, whose
/// edge tiles round differently from full ones.
const ROW_TILE: usize = 48;

/// How many ways a product `[m, k] · [k, n]` runs over `threads` threads:
/// as many as have [`MIN_MACS_PER_WAY`] and 48 rows each, at most
/// `threads`, each way a whole number of micro-kernel tiles. Every way
/// computes its rows of `C` exactly as the whole product would (the same
/// `k` order per element), so the result is the same bits however many
/// ways it runs.
pub fn split_ways(m: usize, n: usize, k: usize, threads: usize) -> usize {
    m.div_ceil(way_rows(m, n, k, threads).max(1)).max(1)
}

/// Rows of `C` each way of [`split_ways`] computes (the last fewer).
fn way_rows(m: usize, n: usize, k: usize, threads: usize) -> usize {
    let macs = m.saturating_mul(n).saturating_mul(k);
    let ways = threads
        .min(macs / MIN_MACS_PER_WAY)
        .min(m / MIN_ROWS_PER_WAY)
        .max(1);
    // Ways start on a whole micro-kernel tile of the undivided product, so
    // each way's tiles, and its one partial tile, are the product's own.
    m.div_ceil(ways).next_multiple_of(ROW_TILE)
}

/// How many ways attention (or its adjoint) over queries `q` `[b, hq, sq,
/// d]` and keys `k` `[b, hk, sk, d]` runs over `threads` threads: its
/// (batch, key/value head) groups in contiguous runs, as many as have
/// [`MIN_MACS_PER_WAY`] multiply-adds of the score product each, at most
/// `threads` and the groups. Each group is computed as on one thread, so
/// the bits do not depend on the ways. An adjoint that wants the mask's
/// gradient (`mask_grad`), which every group adds to, runs on one thread.
pub fn attention_ways(q: &[usize], k: &[usize], mask_grad: bool, threads: usize) -> usize {
    let ([b, hq, sq, d], [_, hk, sk, _], false) = (q, k, mask_grad) else {
        return 1;
    };
    let macs = [b, hq, sq, sk, d]
        .into_iter()
        .fold(1usize, |m, &x| m.saturating_mul(x));
    threads.min(b * hk).min(macs / MIN_MACS_PER_WAY).max(1)
}

/// Runs `f` over `groups` groups in `ways` contiguous runs on rayon's pool
/// (on this thread when `ways` is 1): each run gets its range of groups
/// and its part of each of `outputs`, which hold `per_group[i]` elements
/// per group.
pub(crate) fn in_group_runs<T: Send>(
    groups: usize,
    ways: usize,
    outputs: Vec<&mut [T]>,
    per_group: &[usize],
    f: impl Fn(std::ops::Range<usize>, Vec<&mut [T]>) -> Result<(), OpError> + Sync,
) -> Result<(), OpError> {
    if ways <= 1 || groups <= 1 || per_group.contains(&0) {
        return f(0..groups, outputs);
    }
    let per_run = groups.div_ceil(ways);
    let mut runs: Vec<Vec<&mut [T]>> = (0..groups.div_ceil(per_run)).map(|_| Vec::new()).collect();
    for (out, &n) in outputs.into_iter().zip(per_group) {
        for (run, part) in runs.iter_mut().zip(out.chunks_mut((per_run * n).max(1))) {
            run.push(part);
        }
    }
    let mut results: Vec<Result<(), OpError>> = runs.iter().map(|_| Ok(())).collect();
    let f = &f;
    rayon::scope(|s| {
        for ((i, parts), result) in runs.into_iter().enumerate().zip(results.iter_mut()) {
            let range = i * per_run..((i + 1) * per_run).min(groups);
            s.spawn(move |_| *result = f(range, parts));
        }
    });
    results.into_iter().collect()
}

/// A strided matrix view: element `(i, j)` is `data[off + i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A matrix stored row-major with row length `ld` from `off`; when
    /// `transposed`, the view is the transpose of the stored matrix.
    pub fn row_major(data: &'a [T], off: usize, ld: usize, transposed: bool) -> Self {
        if transposed {
            Mat {
                data,
                off,
                rs: 1,
                cs: ld,
            }
        } else {
            Mat {
                data,
                off,
                rs: ld,
                cs: 1,
            }
        }
    }

    /// True when a `rows × cols` view stays inside the buffer.
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || self.off + (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `C[m, n] (row-major at c_off) ← α·A[m, k]·B[k, n] + β·C`, via `matrixmultiply`.
/// Returns an error instead of touching memory out of bounds.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Real>(
    op: &str,
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: Mat<T>,
    b: Mat<T>,
    beta: T,
    c: &mut [T],
    c_off: usize,
) -> Result<(), OpError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if !a.fits(m, k) || !b.fits(k, n) || c_off + m * n > c.len() {
        return Err(invalid(op, "internal error: matrix view out of bounds"));
    }
    let cm = &mut c[c_off..c_off + m * n];
    if k == 0 {
        for x in cm.iter_mut() {
            *x = if beta == T::zero() { T::zero() } else { *x * beta };
        }
        return Ok(());
    }
    // SAFETY: `fits` checked that every element (i, l) of A, (l, j) of B and
    // (i, j) of C lies within its slice; C is a distinct `&mut` borrow.
    unsafe {
        T::raw_gemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr().add(a.off),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr().add(b.off),
            b.rs as isize,
            b.cs as isize,
            beta,
            cm.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    Ok(())
}

/// [`gemm`] with the rows of `C` split [`split_ways`] ways over this
/// thread's [`product_threads`]: the same bits as one call.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_threaded<T: Real>(
    op: &str,
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: Mat<T>,
    b: Mat<T>,
    beta: T,
    c: &mut [T],
    c_off: usize,
) -> Result<(), OpError> {
    let threads = product_threads();
    let ways = split_ways(m, n, k, threads);
    if ways == 1 {
        return gemm(op, m, k, n, alpha, a, b, beta, c, c_off);
    }
    if !a.fits(m, k) || c_off + m * n > c.len() {
        return Err(invalid(op, "internal error: matrix view out of bounds"));
    }
    let rows = way_rows(m, n, k, threads);
    let mut results: Vec<Result<(), OpError>> = (0..ways).map(|_| Ok(())).collect();
    let chunks = c[c_off..c_off + m * n].chunks_mut(rows * n);
    rayon::scope(|s| {
        for ((i, chunk), result) in chunks.enumerate().zip(results.iter_mut()) {
            let part = Mat {
                off: a.off + i * rows * a.rs,
                ..a
            };
            s.spawn(move |_| *result = gemm(op, chunk.len() / n, k, n, alpha, part, b, beta, chunk, 0));
        }
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_op_err;
    use super::*;

    /// Split over 2-5 threads, products of many shapes and layouts give
    /// one call's bits, in f32 and f64.
    #[test]
    fn threaded_products_are_the_same_bits() {
        fn check<T: Real>(to: fn(f64) -> T) {
            for &(m, k, n) in &[
                (97, 300, 129),
                (1000, 64, 70),
                (33, 1024, 256),
                (512, 512, 40),
                (300, 700, 90),
                (300, 3000, 64),
                (200, 4100, 300),
            ] {
                let a: Vec<T> = (0..m * k)
                    .map(|i| to(((i * 7919) % 1013) as f64 / 97.0 - 5.0))
                    .collect();
                let b: Vec<T> = (0..k * n)
                    .map(|i| to(((i * 104_729) % 2003) as f64 / 331.0 - 3.0))
                    .collect();
                for (ta, tb) in [(false, false), (true, false), (false, true)] {
                    let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
                    let am = Mat::row_major(&a[..], 0, lda, ta);
                    let bm = Mat::row_major(&b[..], 0, ldb, tb);
                    let mut one = vec![to(0.5); m * n];
                    set_product_threads(1);
                    gemm_threaded("G", m, k, n, to(1.5), am, bm, to(0.25), &mut one, 0).unwrap();
                    for threads in 2..=5 {
                        let mut split = vec![to(0.5); m * n];
                        set_product_threads(threads);
                        gemm_threaded("G", m, k, n, to(1.5), am, bm, to(0.25), &mut split, 0).unwrap();
                        assert!(one == split, "[{m}, {k}] x [{k}, {n}] over {threads} threads");
                    }
                    set_product_threads(1);
                }
            }
        }
        check::<f32>(|x| x as f32);
        check::<f64>(|x| x);
    }

    #[test]
    fn small_products_are_not_split() {
        assert_eq!(split_ways(32, 384, 128, 8), 1);
        assert_eq!(split_ways(8, 4096, 4096, 8), 1, "too few rows");
        assert_eq!(split_ways(512, 512, 512, 2), 2);
        assert_eq!(
            split_ways(512, 2048, 512, 64),
            6,
            "48 rows a way at least, in whole tiles"
        );
        assert_eq!(split_ways(1000, 70, 64, 2), 2);
        assert_eq!(split_ways(512, 2048, 512, 1), 1);
    }

    #[test]
    fn gemm_with_transposed_views() {
        // A = [[1,2],[3,4]], Bᵀ stored as [[5,7],[6,8]] → B = [[5,6],[7,8]].
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let bt = [5.0f32, 7.0, 6.0, 8.0];
        let mut c = vec![0.0f32; 4];
        let am = Mat::row_major(&a[..], 0, 2, false);
        let bm = Mat::row_major(&bt[..], 0, 2, true);
        gemm("G", 2, 2, 2, 1.0, am, bm, 0.0, &mut c, 0).unwrap();
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        let short = Mat::row_major(&a[..3], 0, 2, false);
        assert_op_err(
            gemm("G", 2, 2, 2, 1.0, short, bm, 0.0, &mut c, 0),
            "G",
            "internal error: matrix view out of bounds",
        );
    }
}

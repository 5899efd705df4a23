//! A bounds-checked wrapper around the `gemm` crate's GEMM over strided
//! matrix views, which the products, attention and the MoE kernels share,
//! and its split over a rank's threads by [`split_ways`]'s rule.

use super::context::invalid;
use super::movement::transposed;
use super::numeric::Real;
use super::threads::{kernel_threads, on_kernel_threads, row_ways, rows_group_alike, split_ways, way_rows};
use super::OpError;

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

/// `C[m, n] (row-major at c_off) ← α·A[m, k]·B[k, n] + β·C`, via the `gemm` crate.
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

/// Rows from which a product copies a `B` stored transposed row-major
/// before running ([`copies_transposed_b`]).
const TRANSPOSED_B_COPY_ROWS: usize = 256;

/// Whether a product of `m` rows and `n` columns whose `B` is stored
/// transposed (`Gemm` with `trans_b`: a weight read in a gradient) copies
/// `B` row-major first. The `gemm` crate runs such a product 15-35 %
/// slower than on a row-major `B`, and each way of a split packs all of
/// `B` again; from 256 rows the copy, once per product and split over the
/// threads, costs less than that (measured on `[m, k] · [k, 512]`
/// products, k from 512 to 8,192). The layout of `B` does not change the
/// bits of a product that wide ([`rows_group_alike`]). The cost models
/// price the copy.
pub fn copies_transposed_b(m: usize, n: usize) -> bool {
    m >= TRANSPOSED_B_COPY_ROWS && rows_group_alike(n)
}

/// [`gemm`] with the rows of `C` split [`split_ways`] ways over this
/// thread's [`kernel_threads`], after copying a transposed `B` row-major
/// where [`copies_transposed_b`] says: the same bits as one call.
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
    let threads = kernel_threads();
    let row_major_b;
    let stored = b.off + n * b.cs;
    let b = match b.rs == 1 && b.cs >= k && stored <= b.data.len() && copies_transposed_b(m, n) {
        true => {
            // `B` is the first `k` columns of the `[n, cs]` matrix stored at
            // `off`, transposed: the first `k` rows of its `[cs, n]` copy.
            let block = &b.data[b.off..stored];
            row_major_b = transposed(block, n, b.cs, row_ways(b.cs, block.len(), threads));
            Mat::row_major(&row_major_b[..], 0, n, false)
        }
        false => b,
    };
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
    let jobs = chunks
        .enumerate()
        .zip(results.iter_mut())
        .map(|((i, chunk), result)| {
            let part = Mat {
                off: a.off + i * rows * a.rs,
                ..a
            };
            move || *result = gemm(op, chunk.len() / n, k, n, alpha, part, b, beta, chunk, 0)
        })
        .collect();
    on_kernel_threads(jobs);
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_op_err;
    use super::super::threads::set_kernel_threads;
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
                (100, 2000, 65),
                (130, 600, 16),
                (49, 800, 300),
                (300, 900, 257),
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
                    set_kernel_threads(1);
                    gemm_threaded("G", m, k, n, to(1.5), am, bm, to(0.25), &mut one, 0).unwrap();
                    // A transposed `B` copied row-major gives the plain call's bits.
                    let mut plain = vec![to(0.5); m * n];
                    gemm("G", m, k, n, to(1.5), am, bm, to(0.25), &mut plain, 0).unwrap();
                    assert!(
                        one == plain,
                        "[{m}, {k}] x [{k}, {n}], copied: {}",
                        tb && copies_transposed_b(m, n)
                    );
                    for threads in 2..=5 {
                        let mut split = vec![to(0.5); m * n];
                        set_kernel_threads(threads);
                        gemm_threaded("G", m, k, n, to(1.5), am, bm, to(0.25), &mut split, 0).unwrap();
                        assert!(one == split, "[{m}, {k}] x [{k}, {n}] over {threads} threads");
                    }
                    set_kernel_threads(1);
                }
            }
        }
        check::<f32>(|x| x as f32);
        check::<f64>(|x| x);
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

//! Reference kernels of views, transposes and expands.

use super::super::broadcast::{broadcast_to, strided_index};
use super::super::context::EvalCtx;
use super::super::geometry::{strides, take};
use super::super::numeric::map_data;
use super::super::threads::in_group_runs;
use super::super::OpError;
use super::reshaped;
use crate::Value;

/// Reference kernel for the pure views (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`).
pub(super) fn eval_view(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    reshaped(cx, cx.input(0)?)
}

/// Reference kernel for `Transpose`.
pub(super) fn eval_transpose(cx: &EvalCtx, perm: Option<&[usize]>) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let rank = x.shape.len();
    let p = perm.map_or_else(|| (0..rank).rev().collect(), <[usize]>::to_vec);
    let out_shape = cx.out_shape(0)?;
    Ok(vec![Value {
        dtype: x.dtype,
        shape: out_shape,
        data: map_data!(&x.data, d => permute(d, &x.shape, &p, cx.row_ways)),
    }])
}

/// `data` (row-major, `shape`) with its axes permuted by `p`. The two
/// layouts transformers move most run without an index per element: a
/// permutation that keeps the last axis copies whole rows (heads split
/// from or merged into the hidden axis), one that swaps the last two
/// transposes cache-sized tiles (a weight read transposed); any other
/// gathers through an index. The tiled transpose runs its output rows in
/// `ways` runs over the rank's threads (`threads::row_split`).
fn permute<T: Clone + Send + Sync>(data: &[T], shape: &[usize], p: &[usize], ways: usize) -> Vec<T> {
    let rank = shape.len();
    let st = strides(shape);
    let out_shape: Vec<usize> = p.iter().map(|&a| shape[a]).collect();
    let src_strides: Vec<usize> = p.iter().map(|&a| st[a]).collect();
    let leading_fixed = |n: usize| (0..n).all(|a| p[a] == a);
    if rank >= 1 && p[rank - 1] == rank - 1 {
        let run = shape[rank - 1];
        let mut out = Vec::with_capacity(data.len());
        for_each_offset(&out_shape[..rank - 1], &src_strides[..rank - 1], |src| {
            out.extend_from_slice(&data[src..src + run]);
        });
        return out;
    }
    if rank >= 2 && p[rank - 2] == rank - 1 && p[rank - 1] == rank - 2 && leading_fixed(rank - 2) {
        let (m, n) = (shape[rank - 2], shape[rank - 1]);
        // Every element is written below; the copy only sizes the buffer.
        let mut out = data.to_vec();
        if m * n == 0 {
            return out;
        }
        let rows = data.len() / m;
        let _ = in_group_runs(rows, ways, vec![&mut out[..]], &[m], |r, mut dst| {
            // Output row `R` is column `R % n` of matrix `R / n`.
            let mut at = 0;
            let mut row = r.start;
            while row < r.end {
                let (b, j) = (row / n, row % n);
                let js = j..n.min(j + r.end - row);
                let len = js.len();
                transpose_tiles(
                    &data[b * m * n..(b + 1) * m * n],
                    m,
                    n,
                    js,
                    &mut dst[0][at..at + len * m],
                );
                at += len * m;
                row += len;
            }
            Ok(())
        });
        return out;
    }
    let idx = strided_index(
        &out_shape,
        &src_strides.iter().map(|&s| s as isize).collect::<Vec<_>>(),
        0,
    );
    take(data, &idx)
}

/// The `[n, m]` transpose of the row-major matrix `data[m, n]`, its output
/// rows in `ways` runs over the rank's threads.
pub(crate) fn transposed<T: Clone + Send + Sync>(data: &[T], m: usize, n: usize, ways: usize) -> Vec<T> {
    permute(data, &[m, n], &[1, 0], ways)
}

/// Calls `f` with the source offset of every index of `shape`, in row-major
/// order, where axis `a` steps `strides[a]` in the source.
fn for_each_offset(shape: &[usize], strides: &[usize], mut f: impl FnMut(usize)) {
    if shape.contains(&0) {
        return;
    }
    let mut index = vec![0; shape.len()];
    let mut offset = 0;
    loop {
        f(offset);
        let mut a = shape.len();
        loop {
            if a == 0 {
                return;
            }
            a -= 1;
            index[a] += 1;
            offset += strides[a];
            if index[a] < shape[a] {
                break;
            }
            offset -= strides[a] * shape[a];
            index[a] = 0;
        }
    }
}

/// Rows `js` of the `n × m` transpose of the row-major `m × n` `matrix`
/// into `dst`, a tile at a time so both sides stay in cache.
fn transpose_tiles<T: Clone>(matrix: &[T], m: usize, n: usize, js: std::ops::Range<usize>, dst: &mut [T]) {
    const TILE: usize = 8;
    for i0 in (0..m).step_by(TILE) {
        let rows = (m - i0).min(TILE);
        let block = &matrix[i0 * n..(i0 + rows) * n];
        for j0 in js.clone().step_by(TILE) {
            let cols = (js.end - j0).min(TILE);
            let first = j0 - js.start;
            // One tile: `rows` source rows read along, `cols` destination
            // rows written along, both within a few cache lines.
            for (c, d) in dst[first * m..(first + cols) * m].chunks_exact_mut(m).enumerate() {
                for (r, slot) in d[i0..i0 + rows].iter_mut().enumerate() {
                    *slot = block[r * n + j0 + c].clone();
                }
            }
        }
    }
}

/// Reference kernel for `Expand`.
pub(super) fn eval_expand(cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let out_shape = cx.out_shape(0)?;
    let data = map_data!(&x.data, d => broadcast_to(d, &x.shape, &out_shape));
    Ok(vec![Value {
        dtype: x.dtype,
        shape: out_shape,
        data,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every permutation of shapes up to rank 4 (with 1-sized and tile-
    /// straddling axes) against the plain index gather.
    #[test]
    fn permute_fast_paths_equal_the_index_gather() {
        fn perms(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut all = vec![];
            for p in perms(n - 1) {
                for at in 0..n {
                    let mut q = p.clone();
                    q.insert(at, n - 1);
                    all.push(q);
                }
            }
            all
        }
        let shapes: [&[usize]; 6] = [
            &[5],
            &[3, 70],
            &[33, 1],
            &[2, 3, 4],
            &[1, 35, 3, 2],
            &[2, 3, 33, 40],
        ];
        for shape in shapes {
            let n: usize = shape.iter().product();
            let data: Vec<i64> = (0..n as i64).collect();
            let st = strides(shape);
            for p in perms(shape.len()) {
                let out_shape: Vec<usize> = p.iter().map(|&a| shape[a]).collect();
                let idx = strided_index(
                    &out_shape,
                    &p.iter().map(|&a| st[a] as isize).collect::<Vec<_>>(),
                    0,
                );
                for ways in [1, 3] {
                    assert_eq!(
                        permute(&data, shape, &p, ways),
                        take(&data, &idx),
                        "{shape:?} {p:?} in {ways} runs"
                    );
                }
            }
        }
    }
}

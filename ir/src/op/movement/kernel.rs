//! Reference kernels of views, transposes and expands.

use super::super::broadcast::{broadcast_to, strided_index};
use super::super::context::EvalCtx;
use super::super::geometry::{strides, take};
use super::super::numeric::map_data;
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
        data: map_data!(&x.data, d => permute(d, &x.shape, &p)),
    }])
}

/// `data` (row-major, `shape`) with its axes permuted by `p`. The two
/// layouts transformers move most run without an index per element: a
/// permutation that keeps the last axis copies whole rows (heads split
/// from or merged into the hidden axis), one that swaps the last two
/// transposes cache-sized tiles (a weight read transposed); any other
/// gathers through an index.
fn permute<T: Clone>(data: &[T], shape: &[usize], p: &[usize]) -> Vec<T> {
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
        let mut out = Vec::with_capacity(data.len());
        for matrix in data.chunks(m * n) {
            transpose_tiles(matrix, m, n, &mut out);
        }
        return out;
    }
    let idx = strided_index(
        &out_shape,
        &src_strides.iter().map(|&s| s as isize).collect::<Vec<_>>(),
        0,
    );
    take(data, &idx)
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

/// Appends the `n × m` transpose of the row-major `m × n` `matrix` to
/// `out`, a tile at a time so both sides stay in cache.
fn transpose_tiles<T: Clone>(matrix: &[T], m: usize, n: usize, out: &mut Vec<T>) {
    const TILE: usize = 8;
    let start = out.len();
    out.extend_from_slice(matrix);
    let dst = &mut out[start..];
    for i0 in (0..m).step_by(TILE) {
        let rows = (m - i0).min(TILE);
        let block = &matrix[i0 * n..(i0 + rows) * n];
        for j0 in (0..n).step_by(TILE) {
            let cols = (n - j0).min(TILE);
            // One tile: `rows` source rows read along, `cols` destination
            // rows written along, both within a few cache lines.
            for (c, d) in dst[j0 * m..(j0 + cols) * m].chunks_exact_mut(m).enumerate() {
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
                assert_eq!(permute(&data, shape, &p), take(&data, &idx), "{shape:?} {p:?}");
            }
        }
    }
}

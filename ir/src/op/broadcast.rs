//! Numpy broadcasting, for symbolic shapes (inference) and for host buffers
//! (kernels), plus the strided index maps that every data-movement kernel
//! reduces to.

use super::context::{invalid, unsupported};
use super::geometry::strides;
use super::OpError;
use crate::{Dim, Shape};

/// The numpy broadcast of several shapes. Symbolic dims broadcast against 1
/// and against an equal symbol; a symbol against a fixed size `n ≠ 1` gives
/// `n` (the symbol must be 1 or `n` at run time). Two different symbols cannot
/// be expressed as one `Dim` and are reported as unsupported.
pub(crate) fn broadcast_shapes(op: &str, shapes: &[&Shape]) -> Result<Shape, OpError> {
    let rank = shapes.iter().map(|s| s.rank()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(rank);
    for pos in 0..rank {
        let mut acc = Dim::Fixed(1);
        for s in shapes {
            let Some(d) = (pos + s.rank()).checked_sub(rank).map(|i| &s.0[i]) else {
                continue;
            };
            acc = match (&acc, d) {
                (Dim::Fixed(1), _) => d.clone(),
                (_, Dim::Fixed(1)) => acc,
                (Dim::Fixed(a), Dim::Fixed(b)) if a == b => acc,
                (Dim::Fixed(_), Dim::Fixed(_)) => {
                    return Err(invalid(op, format!("shapes {} do not broadcast", show(shapes))))
                }
                (Dim::Sym(a), Dim::Sym(b)) if a == b => acc,
                (Dim::Sym(_), Dim::Sym(_)) => {
                    return Err(unsupported(
                        op,
                        format!("broadcasting different symbolic dims ({})", show(shapes)),
                    ))
                }
                (Dim::Fixed(_), Dim::Sym(_)) => acc,
                (Dim::Sym(_), Dim::Fixed(_)) => d.clone(),
            };
        }
        out.push(acc);
    }
    Ok(Shape(out))
}

fn show(shapes: &[&Shape]) -> String {
    shapes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Per-output-dim strides into a row-major tensor of `input` shape that is
/// broadcast (right-aligned) to `out`; broadcast dims get stride 0.
pub(crate) fn broadcast_strides(input: &[usize], out: &[usize]) -> Vec<isize> {
    let st = strides(input);
    let lead = out.len().saturating_sub(input.len());
    (0..out.len())
        .map(|d| match d.checked_sub(lead) {
            Some(i) if input[i] != 1 || out[d] == 1 => st[i] as isize,
            _ => 0,
        })
        .collect()
}

/// For every element of `out_shape` (row-major), the flat source index
/// `offset + Σ index_d · strides_d`. The caller guarantees the results lie
/// inside the source buffer.
pub(crate) fn strided_index(out_shape: &[usize], strides: &[isize], offset: isize) -> Vec<usize> {
    let n: usize = out_shape.iter().product();
    let mut idx = Vec::with_capacity(n);
    if n == 0 {
        return idx;
    }
    if out_shape.is_empty() {
        idx.push(offset as usize);
        return idx;
    }
    fill(out_shape, strides, offset, &mut idx);
    idx
}

fn fill(shape: &[usize], strides: &[isize], base: isize, idx: &mut Vec<usize>) {
    let (n, s) = (shape[0], strides[0]);
    if shape.len() == 1 {
        idx.extend((0..n as isize).map(|i| (base + i * s) as usize));
    } else {
        for i in 0..n as isize {
            fill(&shape[1..], &strides[1..], base + i * s, idx);
        }
    }
}

/// For every element of `out`, the flat index of its source in a tensor of
/// shape `input` broadcast to `out`.
pub(crate) fn source_index(input: &[usize], out: &[usize]) -> Vec<usize> {
    strided_index(out, &broadcast_strides(input, out), 0)
}

/// True when a tensor of shape `input` broadcast to `out` just repeats its
/// data: its dims, leading 1s stripped, equal the trailing dims of `out`.
fn repeats(input: &[usize], out: &[usize]) -> bool {
    let core = &input[input.iter().take_while(|&&d| d == 1).count()..];
    core.len() <= out.len() && core == &out[out.len() - core.len()..] && input.iter().product::<usize>() > 0
}

/// How many consecutive output elements each element of `input` fills
/// when it is `out` with its trailing dims (at least one) set to 1: a row
/// statistic broadcast back over its row (`x − max`, `x / sum`). `None`
/// otherwise.
fn spreads(input: &[usize], out: &[usize]) -> Option<usize> {
    let lead = out.len().checked_sub(input.len())?;
    let ones = input.iter().rev().take_while(|&&d| d == 1).count();
    let kept = input.len() - ones;
    let inner: usize = out[lead + kept..].iter().product();
    let fits = lead == 0 && ones > 0 && input[..kept] == out[..kept] && inner > 1;
    fits.then_some(inner)
}

/// `data` (of shape `input`) broadcast to `out`: a row statistic spread
/// over its rows or a tensor repeated whole is copied run by run, anything
/// else through an index per element.
pub(crate) fn broadcast_to<T: Clone>(data: &[T], input: &[usize], out: &[usize]) -> Vec<T> {
    let n: usize = out.iter().product();
    if let Some(inner) = spreads(input, out) {
        let mut c = Vec::with_capacity(n);
        for v in data {
            c.extend(std::iter::repeat_n(v.clone(), inner));
        }
        return c;
    }
    if repeats(input, out) {
        let mut c = Vec::with_capacity(n);
        while c.len() < n {
            let run = (n - c.len()).min(data.len());
            c.extend_from_slice(&data[..run]);
        }
        return c;
    }
    source_index(input, out)
        .iter()
        .map(|&i| data[i].clone())
        .collect()
}

/// Applies `f` element-wise over two inputs broadcast to `out` (inlined,
/// so a caller's vectorized code runs its loops).
#[inline(always)]
pub(crate) fn zip_broadcast<A: Copy, B: Copy, C>(
    a: (&[A], &[usize]),
    b: (&[B], &[usize]),
    out: &[usize],
    f: impl Fn(A, B) -> C,
) -> Vec<C> {
    let same = |s: &[usize]| s == out;
    match (a, b) {
        ((a, ash), (b, bsh)) if same(ash) && same(bsh) => a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect(),
        ((a, ash), (b, bsh)) if same(ash) && repeats(bsh, out) => {
            a.iter().zip(b.iter().cycle()).map(|(&x, &y)| f(x, y)).collect()
        }
        ((a, ash), (b, bsh)) if repeats(ash, out) && same(bsh) => {
            a.iter().cycle().zip(b).map(|(&x, &y)| f(x, y)).collect()
        }
        ((a, ash), (b, bsh)) if same(ash) && spreads(bsh, out).is_some() => {
            let inner = spreads(bsh, out).unwrap_or(1);
            let mut c = Vec::with_capacity(a.len());
            for (row, &y) in a.chunks(inner).zip(b) {
                c.extend(row.iter().map(|&x| f(x, y)));
            }
            c
        }
        ((a, ash), (b, bsh)) if spreads(ash, out).is_some() && same(bsh) => {
            let inner = spreads(ash, out).unwrap_or(1);
            let mut c = Vec::with_capacity(b.len());
            for (&x, row) in a.iter().zip(b.chunks(inner)) {
                c.extend(row.iter().map(|&y| f(x, y)));
            }
            c
        }
        ((a, ash), (b, bsh)) => {
            let ia = source_index(ash, out);
            let ib = source_index(bsh, out);
            ia.iter().zip(&ib).map(|(&i, &j)| f(a[i], b[j])).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(s: &str) -> Dim {
        Dim::Sym(s.into())
    }

    #[test]
    fn broadcasts_copy_what_the_index_gather_copies() {
        let data: Vec<usize> = (0..24).collect();
        for (input, out) in [
            (&[4, 1][..], &[4, 6][..]),
            (&[2, 3, 1], &[2, 3, 4]),
            (&[3, 1], &[2, 3, 5]),
            (&[1, 6], &[4, 6]),
            (&[6], &[2, 3, 6]),
            (&[2, 1, 3], &[2, 4, 3]),
            (&[1], &[5]),
        ] {
            let n = input.iter().product();
            let want: Vec<usize> = source_index(input, out).iter().map(|&i| data[i]).collect();
            assert_eq!(broadcast_to(&data[..n], input, out), want, "{input:?} → {out:?}");
        }
    }

    #[test]
    fn a_row_statistic_spreads_over_its_row() {
        assert_eq!(spreads(&[4, 1], &[4, 6]), Some(6));
        assert_eq!(spreads(&[2, 3, 1, 1], &[2, 3, 4, 5]), Some(20));
        assert_eq!(spreads(&[4, 6], &[4, 6]), None);
        assert_eq!(spreads(&[1, 6], &[4, 6]), None);
        assert_eq!(spreads(&[4, 1], &[2, 4, 6]), None);
        let (a, b) = ([1, 2, 3, 4, 5, 6], [10, 20]);
        let out = zip_broadcast((&a, &[2, 3]), (&b, &[2, 1]), &[2, 3], |x, y| x * 100 + y);
        assert_eq!(out, [110, 210, 310, 420, 520, 620]);
        let out = zip_broadcast((&b, &[2, 1]), (&a, &[2, 3]), &[2, 3], |x, y| x * 100 + y);
        assert_eq!(out, [1001, 1002, 1003, 2004, 2005, 2006]);
    }

    #[test]
    fn symbolic_broadcast() {
        let a = Shape(vec![sym("b"), sym("s"), 64.into()]);
        let b = Shape(vec![1.into(), 64.into()]);
        assert_eq!(broadcast_shapes("Add", &[&a, &b]).unwrap(), a);
        let c = Shape(vec![sym("b"), 1.into(), 1.into()]);
        assert_eq!(broadcast_shapes("Add", &[&a, &c]).unwrap(), a);
        let d = Shape(vec![sym("t"), 1.into(), 1.into()]);
        assert!(matches!(
            broadcast_shapes("Add", &[&a, &d]),
            Err(OpError::Unsupported { .. })
        ));
        let e = Shape::fixed(&[3, 65]);
        assert!(matches!(
            broadcast_shapes("Add", &[&a, &e]),
            Err(OpError::Invalid { .. })
        ));
    }

    #[test]
    fn broadcast_index_maps() {
        // [2,1] broadcast to [2,3]; [3] broadcast to [2,3].
        assert_eq!(source_index(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(source_index(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(source_index(&[], &[2]), vec![0, 0]);
        let sum = zip_broadcast(
            (&[1, 2][..], &[2, 1][..]),
            (&[10, 20, 30][..], &[3][..]),
            &[2, 3],
            |x, y| x + y,
        );
        assert_eq!(sum, vec![11, 21, 31, 12, 22, 32]);
        let rows = zip_broadcast(
            (&[1, 2, 3, 4][..], &[2, 2][..]),
            (&[10, 20][..], &[1, 2][..]),
            &[2, 2],
            |x, y| x + y,
        );
        assert_eq!(rows, vec![11, 22, 13, 24]);
        let scalar = zip_broadcast((&[5][..], &[][..]), (&[1, 2][..], &[2][..]), &[2], |x, y| x - y);
        assert_eq!(scalar, vec![4, 3]);
    }
}

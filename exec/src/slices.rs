//! Cutting a tensor along one dim into per-rank slices and putting the
//! slices back: how tensor-parallel weights are stored, and what gathers,
//! slices and reduce-scatters along a dim do to row-major data.

use autopar_ir::{Data, Value};

/// Rank `index`'s slice of `v` along `axis` (of each of `blocks` equal
/// blocks), out of `parts`.
pub fn take(v: &Value, axis: usize, blocks: usize, index: usize, parts: usize) -> Value {
    let mut shape = v.shape.clone();
    let d = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let block = d / blocks;
    let piece = block / parts;
    let ranges: Vec<(usize, usize)> = (0..outer)
        .flat_map(|o| (0..blocks).map(move |b| ((o * d + b * block + index * piece) * inner, piece * inner)))
        .collect();
    shape[axis] = d / parts;
    Value {
        dtype: v.dtype,
        shape,
        data: gather_ranges(&v.data, &ranges),
    }
}

/// The whole tensor from every rank's slice (in rank order): the inverse of [`take`].
pub fn join(pieces: &[Value], axis: usize, blocks: usize) -> Value {
    let parts = pieces.len();
    let first = &pieces[0];
    let mut shape = first.shape.clone();
    let local = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let piece = local / blocks;
    let mut order: Vec<(usize, usize, usize)> = Vec::new();
    for o in 0..outer {
        for b in 0..blocks {
            for r in 0..parts {
                order.push((r, (o * local + b * piece) * inner, piece * inner));
            }
        }
    }
    shape[axis] = local * parts;
    let data = match &first.data {
        Data::F32(_) => Data::F32(concat(pieces, &order, |v| match &v.data {
            Data::F32(x) => x.as_slice(),
            _ => &[],
        })),
        Data::F64(_) => Data::F64(concat(pieces, &order, |v| match &v.data {
            Data::F64(x) => x.as_slice(),
            _ => &[],
        })),
        Data::I64(_) => Data::I64(concat(pieces, &order, |v| match &v.data {
            Data::I64(x) => x.as_slice(),
            _ => &[],
        })),
        other => other.clone(),
    };
    Value {
        dtype: first.dtype,
        shape,
        data,
    }
}

fn concat<T: Clone>(
    pieces: &[Value],
    order: &[(usize, usize, usize)],
    view: impl Fn(&Value) -> &[T],
) -> Vec<T> {
    let mut out = Vec::with_capacity(order.iter().map(|o| o.2).sum());
    for &(r, start, len) in order {
        out.extend_from_slice(&view(&pieces[r])[start..start + len]);
    }
    out
}

fn gather_ranges(data: &Data, ranges: &[(usize, usize)]) -> Data {
    fn pick<T: Clone>(x: &[T], ranges: &[(usize, usize)]) -> Vec<T> {
        let mut out = Vec::with_capacity(ranges.iter().map(|r| r.1).sum());
        for &(start, len) in ranges {
            out.extend_from_slice(&x[start..start + len]);
        }
        out
    }
    match data {
        Data::F32(x) => Data::F32(pick(x, ranges)),
        Data::F64(x) => Data::F64(pick(x, ranges)),
        Data::I64(x) => Data::I64(pick(x, ranges)),
        Data::Bool(x) => Data::Bool(pick(x, ranges)),
        Data::Str(x) => Data::Str(pick(x, ranges)),
    }
}

/// A tensor of `rows` rows (dim 0), zero but for `v`'s rows moved by each
/// `(from, to, count)`: how a counted all-to-all packs the rows it sends
/// and spreads the rows it receives into blocks.
pub fn move_rows(v: &Value, moves: &[(usize, usize, usize)], rows: usize) -> Value {
    fn place<T: Clone + Default>(
        x: &[T],
        row: usize,
        moves: &[(usize, usize, usize)],
        rows: usize,
    ) -> Vec<T> {
        let mut out = vec![T::default(); rows * row];
        for &(from, to, count) in moves {
            out[to * row..(to + count) * row].clone_from_slice(&x[from * row..(from + count) * row]);
        }
        out
    }
    let row: usize = v.shape.iter().skip(1).product();
    let data = match &v.data {
        Data::F32(x) => Data::F32(place(x, row, moves, rows)),
        Data::F64(x) => Data::F64(place(x, row, moves, rows)),
        Data::I64(x) => Data::I64(place(x, row, moves, rows)),
        Data::Bool(x) => Data::Bool(place(x, row, moves, rows)),
        Data::Str(x) => Data::Str(place(x, row, moves, rows)),
    };
    let mut shape = v.shape.clone();
    shape[0] = rows;
    Value {
        dtype: v.dtype,
        shape,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_of_blocks_join_back() {
        // [2, 6] with 3 blocks of 2 columns, 2 parts: rank 0 gets columns 0, 2, 4.
        let v = Value::f32(vec![2, 6], (0..12).map(|x| x as f32).collect()).unwrap();
        let a = take(&v, 1, 3, 0, 2);
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, Data::F32(vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]));
        let b = take(&v, 1, 3, 1, 2);
        assert_eq!(join(&[a, b], 1, 3), v);
        let rows = take(&v, 0, 1, 1, 2);
        assert_eq!(rows.data, Data::F32((6..12).map(|x| x as f32).collect()));
        assert_eq!(join(&[take(&v, 0, 1, 0, 2), rows], 0, 1), v);
    }

    #[test]
    fn rows_move_into_zeroed_blocks() {
        let v = Value::f32(vec![3, 2], (1..7).map(|x| x as f32).collect()).unwrap();
        let spread = move_rows(&v, &[(0, 0, 1), (1, 2, 2)], 4);
        assert_eq!(spread.shape, vec![4, 2]);
        assert_eq!(
            spread.data,
            Data::F32(vec![1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 5.0, 6.0])
        );
        assert_eq!(move_rows(&spread, &[(0, 0, 1), (2, 1, 2)], 3), v);
    }
}

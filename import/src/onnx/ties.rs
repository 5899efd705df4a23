//! Tied weights an exporter split: the legacy exporter stores a tied
//! embedding twice (the table, and a transposed copy for the LM head), and
//! a dynamo export may repeat a shared layer's weights. Trained as two
//! parameters, the copies drift apart and the model is not PyTorch's. An
//! initializer whose data equals an earlier one's (or, for a matrix, its
//! transpose) is read as that one instead, so both uses train one weight.
//! The legacy exporter also folds concatenations: MobileBERT's LM head is
//! the transposed embedding table stacked on a dense weight, stored as one
//! matrix, so a matrix whose leading or trailing block copies an earlier
//! one is read as that one joined to a parameter holding the rest.
//!
//! Only tensors of rank ≥ 2 that are not constant-filled are matched:
//! equal zero biases or unit scales are independent parameters, but two
//! trained or randomly initialised matrices with equal bits are one weight.

use autopar_ir::{Data, Value};

/// How an initializer relates to an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Copy {
    /// The same data in the same shape.
    Same(usize),
    /// The transpose of the earlier matrix.
    Transposed(usize),
    /// A leading or trailing block along `axis` is a copy of the earlier
    /// matrix (of its transpose if `transposed`); the rest is its own.
    Block(Block),
}

/// Where a tied block sits in a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Block {
    pub of: usize,
    pub transposed: bool,
    pub axis: usize,
    pub at_start: bool,
}

impl Block {
    /// The matrix's values outside the block, in the matrix's layout.
    pub(super) fn rest(&self, matrix: &Value, tied: &Value) -> Value {
        let (rows, cols) = (matrix.shape[0], matrix.shape[1]);
        let len = if self.transposed {
            tied.shape[1 - self.axis]
        } else {
            tied.shape[self.axis]
        };
        let keep = |i: usize| {
            let along = [i / cols, i % cols][self.axis];
            let extent = [rows, cols][self.axis];
            if self.at_start {
                along >= len
            } else {
                along < extent - len
            }
        };
        let mut shape = matrix.shape.clone();
        shape[self.axis] -= len;
        let data = match &matrix.data {
            Data::F32(d) => Data::F32(
                d.iter()
                    .enumerate()
                    .filter(|(i, _)| keep(*i))
                    .map(|(_, x)| *x)
                    .collect(),
            ),
            Data::F64(d) => Data::F64(
                d.iter()
                    .enumerate()
                    .filter(|(i, _)| keep(*i))
                    .map(|(_, x)| *x)
                    .collect(),
            ),
            other => other.clone(),
        };
        Value::new(matrix.dtype, shape, data).expect("the rest fills the remaining block")
    }
}

/// An order-independent fingerprint: element count and the wrapping sum
/// of the elements' bit patterns (equal for a tensor and its transpose).
fn fingerprint(v: &Value) -> Option<(usize, u64)> {
    let sum = match &v.data {
        Data::F32(d) => d.iter().fold(0u64, |s, x| s.wrapping_add(u64::from(x.to_bits()))),
        Data::F64(d) => d.iter().fold(0u64, |s, x| s.wrapping_add(x.to_bits())),
        _ => return None,
    };
    Some((v.numel(), sum))
}

/// Whether every element is the same (a constant fill, never matched).
fn uniform(v: &Value) -> bool {
    match &v.data {
        Data::F32(d) => d.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()),
        Data::F64(d) => d.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()),
        _ => true,
    }
}

/// The bits of element `i` (floats only).
fn bits(v: &Value, i: usize) -> u64 {
    match &v.data {
        Data::F32(d) => u64::from(d[i].to_bits()),
        Data::F64(d) => d[i].to_bits(),
        _ => 0,
    }
}

/// `b` equals `a` transposed (both matrices).
fn transposed(a: &Value, b: &Value) -> bool {
    let (&[rows, cols], &[br, bc]) = (a.shape.as_slice(), b.shape.as_slice()) else {
        return false;
    };
    (br, bc) == (cols, rows)
        && (0..rows).all(|r| (0..cols).all(|c| bits(a, r * cols + c) == bits(b, c * rows + r)))
}

/// The block of matrix `m` that copies matrix `e` (or its transpose), if
/// one leads or trails `m` along an axis.
fn block_of(m: &Value, e: &Value, of: usize) -> Option<Block> {
    let (&[rows, cols], &[er, ec]) = (m.shape.as_slice(), e.shape.as_slice()) else {
        return None;
    };
    [false, true].into_iter().find_map(|transposed| {
        // The copy's shape as it sits in `m`, and its element (i, j).
        let (br, bc) = if transposed { (ec, er) } else { (er, ec) };
        let copy = |i: usize, j: usize| {
            if transposed {
                bits(e, j * ec + i)
            } else {
                bits(e, i * ec + j)
            }
        };
        [0, 1].into_iter().find_map(|axis| {
            let fits = if axis == 0 {
                bc == cols && br < rows
            } else {
                br == rows && bc < cols
            };
            if !fits {
                return None;
            }
            [true, false].into_iter().find_map(|at_start| {
                let (r0, c0) = match (axis, at_start) {
                    (_, true) => (0, 0),
                    (0, false) => (rows - br, 0),
                    _ => (0, cols - bc),
                };
                let equal = (0..br).all(|i| (0..bc).all(|j| bits(m, (r0 + i) * cols + c0 + j) == copy(i, j)));
                equal.then_some(Block {
                    of,
                    transposed,
                    axis,
                    at_start,
                })
            })
        })
    })
}

/// Whether a tensor repeats one slice along its leading axis, a slice that
/// is not a constant fill: a value the exporter expanded over the batch
/// (a class token, gathered position rows), which is one weight.
pub(super) fn repeats_leading_axis(v: &Value) -> bool {
    let Some((&first, rest)) = v.shape.split_first() else {
        return false;
    };
    let slice: usize = rest.iter().product();
    if first < 2 || rest.is_empty() || slice == 0 || !v.dtype.is_float() {
        return false;
    }
    let head = Value {
        dtype: v.dtype,
        shape: rest.to_vec(),
        data: leading_slice(v),
    };
    !uniform(&head) && (1..first).all(|k| (0..slice).all(|i| bits(v, k * slice + i) == bits(v, i)))
}

/// The first slice along the leading axis.
pub(super) fn leading_slice(v: &Value) -> Data {
    let slice: usize = v.shape.iter().skip(1).product();
    match &v.data {
        Data::F32(d) => Data::F32(d[..slice].to_vec()),
        Data::F64(d) => Data::F64(d[..slice].to_vec()),
        other => other.clone(),
    }
}

/// For each initializer (in file order), the earlier one it copies.
pub(super) fn copies(values: &[Option<&Value>]) -> Vec<Option<Copy>> {
    let mut seen: std::collections::HashMap<(usize, u64), Vec<usize>> = Default::default();
    // Earlier matrices that are weights of their own, for block copies.
    let mut matrices: Vec<usize> = Vec::new();
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let v = (*v).filter(|v| v.shape.len() >= 2 && v.dtype.is_float() && !uniform(v))?;
            let key = fingerprint(v)?;
            let earlier = seen.entry(key).or_default();
            let whole = earlier.iter().find_map(|&j| {
                let e = values[j]?;
                if e.dtype != v.dtype {
                    None
                } else if e.shape == v.shape && e.data == v.data {
                    Some(Copy::Same(j))
                } else if transposed(e, v) {
                    Some(Copy::Transposed(j))
                } else {
                    None
                }
            });
            let found = whole.or_else(|| {
                matrices.iter().find_map(|&j| {
                    let e = values[j]?;
                    (e.dtype == v.dtype)
                        .then(|| block_of(v, e, j))
                        .flatten()
                        .map(Copy::Block)
                })
            });
            if found.is_none() {
                earlier.push(i);
                if v.shape.len() == 2 {
                    matrices.push(i);
                }
            }
            found
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rows: usize, cols: usize, data: &[f32]) -> Value {
        Value::f32(vec![rows, cols], data.to_vec()).unwrap()
    }

    #[test]
    fn copies_and_transposed_copies_are_found_but_fills_are_not() {
        let a = m(2, 3, &[1., 2., 3., 4., 5., 6.]);
        let same = m(2, 3, &[1., 2., 3., 4., 5., 6.]);
        let t = m(3, 2, &[1., 4., 2., 5., 3., 6.]);
        let shuffled = m(3, 2, &[1., 2., 3., 4., 5., 6.]);
        let zeros = m(2, 2, &[0.; 4]);
        let values = [
            Some(&a),
            Some(&zeros),
            Some(&same),
            Some(&t),
            Some(&shuffled),
            Some(&zeros),
            None,
        ];
        assert_eq!(
            copies(&values),
            vec![
                None,
                None,
                Some(Copy::Same(0)),
                Some(Copy::Transposed(0)),
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn blocks_copying_an_earlier_matrix_are_found_with_the_rest() {
        let e = m(2, 3, &[1., 2., 3., 4., 5., 6.]);
        // [eᵀ; own row]: rows 0..3 copy e transposed.
        let stacked = m(4, 2, &[1., 4., 2., 5., 3., 6., 7., 8.]);
        // [own column | e]: the trailing columns copy e.
        let beside = m(2, 4, &[9., 1., 2., 3., 10., 4., 5., 6.]);
        let unrelated = m(4, 2, &[1., 4., 2., 5., 3., 7., 7., 8.]);
        let found = copies(&[Some(&e), Some(&stacked), Some(&beside), Some(&unrelated)]);
        let stacked_block = Block {
            of: 0,
            transposed: true,
            axis: 0,
            at_start: true,
        };
        let beside_block = Block {
            of: 0,
            transposed: false,
            axis: 1,
            at_start: false,
        };
        assert_eq!(
            found,
            vec![
                None,
                Some(Copy::Block(stacked_block)),
                Some(Copy::Block(beside_block)),
                None
            ]
        );
        assert_eq!(stacked_block.rest(&stacked, &e), m(1, 2, &[7., 8.]));
        assert_eq!(beside_block.rest(&beside, &e), m(2, 1, &[9., 10.]));
    }

    #[test]
    fn a_slice_repeated_along_the_leading_axis_is_one_weight() {
        let v = |shape: Vec<usize>, d: &[f32]| Value::f32(shape, d.to_vec()).unwrap();
        assert!(repeats_leading_axis(&v(vec![2, 1, 2], &[0.5, -1., 0.5, -1.])));
        assert!(!repeats_leading_axis(&v(vec![2, 1, 2], &[0.5, -1., 0.5, 1.])));
        // A fill (a zero bias) and a single slice are not.
        assert!(!repeats_leading_axis(&v(vec![2, 2], &[0., 0., 0., 0.])));
        assert!(!repeats_leading_axis(&v(vec![1, 2], &[0.5, -1.])));
        assert!(!repeats_leading_axis(&v(vec![4], &[0.5, 0.5, 0.5, 0.5])));
    }
}

//! Tied weights an exporter split: the legacy exporter stores a tied
//! embedding twice (the table, and a transposed copy for the LM head), and
//! a dynamo export may repeat a shared layer's weights. Trained as two
//! parameters, the copies drift apart and the model is not PyTorch's. An
//! initializer whose data equals an earlier one's (or, for a matrix, its
//! transpose) is read as that one instead, so both uses train one weight.
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

/// `b` equals `a` transposed (both matrices).
fn transposed(a: &Value, b: &Value) -> bool {
    let (&[rows, cols], &[br, bc]) = (a.shape.as_slice(), b.shape.as_slice()) else {
        return false;
    };
    if (br, bc) != (cols, rows) {
        return false;
    }
    let at = |v: &Value, i: usize| match &v.data {
        Data::F32(d) => u64::from(d[i].to_bits()),
        Data::F64(d) => d[i].to_bits(),
        _ => 0,
    };
    (0..rows).all(|r| (0..cols).all(|c| at(a, r * cols + c) == at(b, c * rows + r)))
}

/// For each initializer (in file order), the earlier one it copies.
pub(super) fn copies(values: &[Option<&Value>]) -> Vec<Option<Copy>> {
    let mut seen: std::collections::HashMap<(usize, u64), Vec<usize>> = Default::default();
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let v = (*v).filter(|v| v.shape.len() >= 2 && v.dtype.is_float() && !uniform(v))?;
            let key = fingerprint(v)?;
            let earlier = seen.entry(key).or_default();
            let found = earlier.iter().find_map(|&j| {
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
            if found.is_none() {
                earlier.push(i);
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
}

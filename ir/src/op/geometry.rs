//! Index arithmetic on shapes: strides, products, rows along an axis,
//! products of symbolic dims, and element and byte counts for costing.

use super::TensorType;
use crate::Dim;

/// Picks elements by flat index (indices come from validated shapes).
pub(crate) fn take<T: Clone>(data: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| data[i].clone()).collect()
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Product of `dims[range]` (1 for empty).
pub(crate) fn prod(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row geometry along one axis: `outer · inner` rows of `n` elements, each
/// starting at one of [`Rows::starts`] with elements `inner` apart.
pub(crate) struct Rows {
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
}

impl Rows {
    /// The rows of `shape` along `axis` (which must be in range).
    pub fn along(shape: &[usize], axis: usize) -> Rows {
        Rows {
            outer: prod(&shape[..axis]),
            n: shape[axis],
            inner: prod(&shape[axis + 1..]),
        }
    }

    /// Flat index of every row's first element, in row-major order of the
    /// remaining dims.
    pub fn starts(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.outer).flat_map(move |o| (0..self.inner).map(move |i| o * self.n * self.inner + i))
    }

    /// Flat index of element `j` of the row whose rank among [`Rows::starts`]
    /// is `r`, in a tensor whose axis has length `len` instead of `n`.
    pub fn at(&self, r: usize, j: usize, len: usize) -> usize {
        let (o, i) = (r / self.inner.max(1), r % self.inner.max(1));
        (o * len + j) * self.inner + i
    }
}

/// Product of dims that may be symbolic: fixed when all are fixed, the
/// symbol itself when it is the only one and the rest multiply to one,
/// `None` when the product cannot be written as a `Dim`.
pub(crate) fn dim_product(dims: &[Dim]) -> Option<Dim> {
    let mut fixed = 1usize;
    let mut sym = None;
    for d in dims {
        match d {
            Dim::Fixed(n) => fixed = fixed.saturating_mul(*n),
            Dim::Sym(_) if sym.is_some() => return if fixed == 0 { Some(Dim::Fixed(0)) } else { None },
            Dim::Sym(_) => sym = Some(d.clone()),
        }
    }
    match sym {
        None => Some(Dim::Fixed(fixed)),
        Some(_) if fixed == 0 => Some(Dim::Fixed(0)),
        Some(s) if fixed == 1 => Some(s),
        Some(_) => None,
    }
}

/// Element count for costing; shapes must be concrete (callers bind symbols
/// first), a symbolic dim counts as 0.
pub(crate) fn numel(t: &TensorType) -> f64 {
    t.shape.0.iter().map(|d| d.fixed().unwrap_or(0) as f64).product()
}

/// Dim `i` of a type for costing (0 when symbolic or missing).
pub(crate) fn dim(t: &TensorType, i: usize) -> f64 {
    t.shape.0.get(i).and_then(Dim::fixed).unwrap_or(0) as f64
}

/// Bytes of a tensor at concrete shape.
pub(crate) fn bytes(t: &TensorType) -> f64 {
    numel(t) * t.dtype.size_bits() as f64 / 8.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolic_products() {
        let b = Dim::Sym("b".into());
        assert_eq!(dim_product(&[b.clone(), Dim::Fixed(1)]), Some(b.clone()));
        assert_eq!(dim_product(&[Dim::Fixed(2), Dim::Fixed(3)]), Some(Dim::Fixed(6)));
        assert_eq!(dim_product(&[b.clone(), Dim::Fixed(2)]), None);
        assert_eq!(dim_product(&[b, Dim::Fixed(0)]), Some(Dim::Fixed(0)));
    }
}

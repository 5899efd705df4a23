//! Flat float buffers moved by the collectives, with the splitting,
//! joining and summing the ring algorithms need.

use std::fmt;

/// Flat float data moved by collectives. Only floats travel: gradients,
/// activations and parameters; integer tensors are never reduced.
#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// Two buffers that had to agree in element type and length did not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}, got {got}")]
pub struct LayoutMismatch {
    /// Layout of the buffer that was expected, e.g. `f32[12]`.
    pub expected: String,
    /// Layout of the buffer that arrived.
    pub got: String,
}

/// An element type collectives move (`f32` or `f64`), so each algorithm is
/// written once for both.
pub(crate) trait Element:
    bytemuck::Pod + std::ops::Add<Output = Self> + Send + Sync + 'static
{
    /// Name used in layouts (`f32[12]`).
    const NAME: &'static str;
    /// Wraps elements as a buffer.
    fn wrap(v: Vec<Self>) -> Buffer;
    /// The elements, if `b` holds this type (`b` back otherwise).
    fn unwrap(b: Buffer) -> Result<Vec<Self>, Buffer>;
    /// The value whose bytes in memory are this value's little-endian
    /// encoding (and back: the swap is its own inverse), for the wire.
    fn le_order(self) -> Self;
}

impl Element for f32 {
    const NAME: &'static str = "f32";
    fn wrap(v: Vec<f32>) -> Buffer {
        Buffer::F32(v)
    }
    fn unwrap(b: Buffer) -> Result<Vec<f32>, Buffer> {
        match b {
            Buffer::F32(v) => Ok(v),
            other => Err(other),
        }
    }
    fn le_order(self) -> f32 {
        f32::from_bits(self.to_bits().to_le())
    }
}

impl Element for f64 {
    const NAME: &'static str = "f64";
    fn wrap(v: Vec<f64>) -> Buffer {
        Buffer::F64(v)
    }
    fn unwrap(b: Buffer) -> Result<Vec<f64>, Buffer> {
        match b {
            Buffer::F64(v) => Ok(v),
            other => Err(other),
        }
    }
    fn le_order(self) -> f64 {
        f64::from_bits(self.to_bits().to_le())
    }
}

/// Evaluates `$body` with `$v` bound to the buffer's elements, whichever
/// their type (`$buf` may be a `Buffer`, `&Buffer` or `&mut Buffer`).
macro_rules! with_elements {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::collective::Buffer::F32($v) => $body,
            $crate::collective::Buffer::F64($v) => $body,
        }
    };
}
pub(crate) use with_elements;

impl From<Vec<f32>> for Buffer {
    fn from(v: Vec<f32>) -> Self {
        Buffer::F32(v)
    }
}

impl From<Vec<f64>> for Buffer {
    fn from(v: Vec<f64>) -> Self {
        Buffer::F64(v)
    }
}

impl fmt::Display for Buffer {
    /// The layout (`f32[12]`), which is what error messages need.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.dtype_name(), self.len())
    }
}

impl Buffer {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Buffer::F32(v) => v.len(),
            Buffer::F64(v) => v.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes per element (4 or 8): what a real link would carry.
    pub fn elem_size(&self) -> usize {
        match self {
            Buffer::F32(_) => 4,
            Buffer::F64(_) => 8,
        }
    }

    /// Bytes its allocation holds (what keeping it for reuse costs).
    pub fn capacity_bytes(&self) -> usize {
        with_elements!(self, v => v.capacity() * self.elem_size())
    }

    /// Bytes the buffer occupies on the wire; what the fabric counts.
    pub fn byte_len(&self) -> u64 {
        (self.len() * self.elem_size()) as u64
    }

    /// Element type name, for messages.
    pub fn dtype_name(&self) -> &'static str {
        match self {
            Buffer::F32(_) => "f32",
            Buffer::F64(_) => "f64",
        }
    }

    /// An empty buffer of the same element type (a placeholder that costs
    /// no allocation).
    pub fn empty_like(&self) -> Buffer {
        match self {
            Buffer::F32(_) => Buffer::F32(Vec::new()),
            Buffer::F64(_) => Buffer::F64(Vec::new()),
        }
    }

    /// Whether `other` has the same element type and length.
    pub fn same_layout(&self, other: &Buffer) -> bool {
        self.len() == other.len() && self.dtype_name() == other.dtype_name()
    }

    /// Checks that `got` has this buffer's layout (type and length).
    pub fn expect_layout(&self, got: &Buffer) -> Result<(), LayoutMismatch> {
        if self.same_layout(got) {
            Ok(())
        } else {
            Err(LayoutMismatch {
                expected: self.to_string(),
                got: got.to_string(),
            })
        }
    }

    /// Splits into `n` equal chunks; `None` when `n` is zero or does not
    /// divide `len()` (reduce-scatter and all-to-all need equal chunks).
    pub fn split_even(&self, n: usize) -> Option<Vec<Buffer>> {
        Some(self.cut(&Self::even_lengths(self.len(), n)?))
    }

    /// `n` equal chunk lengths of `len` elements; `None` when `n` is zero
    /// or does not divide `len`.
    pub fn even_lengths(len: usize, n: usize) -> Option<Vec<usize>> {
        (n > 0 && len % n == 0).then(|| vec![len / n; n])
    }

    /// Chunk lengths for splitting `len` elements as evenly as possible
    /// into `n` pieces (the first `len % n` get one more), so an all-reduce
    /// works on any tensor size.
    pub fn balanced_lengths(len: usize, n: usize) -> Vec<usize> {
        if n == 0 {
            return Vec::new();
        }
        (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
    }

    /// Consecutive pieces of `lengths`, which sum to `len()`.
    fn cut(&self, lengths: &[usize]) -> Vec<Buffer> {
        fn pieces<T: Clone>(v: &[T], lengths: &[usize], wrap: fn(Vec<T>) -> Buffer) -> Vec<Buffer> {
            let mut start = 0;
            lengths
                .iter()
                .map(|&l| {
                    let piece = wrap(v[start..start + l].to_vec());
                    start += l;
                    piece
                })
                .collect()
        }
        match self {
            Buffer::F32(v) => pieces(v, lengths, Buffer::F32),
            Buffer::F64(v) => pieces(v, lengths, Buffer::F64),
        }
    }

    /// Appends `other`'s elements; the element types must agree.
    pub fn append(&mut self, other: &Buffer) -> Result<(), LayoutMismatch> {
        match (self, other) {
            (Buffer::F32(o), Buffer::F32(v)) => o.extend_from_slice(v),
            (Buffer::F64(o), Buffer::F64(v)) => o.extend_from_slice(v),
            (mine, other) => {
                return Err(LayoutMismatch {
                    expected: format!("{}[..]", mine.dtype_name()),
                    got: other.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Concatenates pieces in order; every piece must have the first one's
    /// element type (`None` for an empty list or a mixed one).
    pub fn concat(pieces: &[Buffer]) -> Option<Buffer> {
        let mut out = pieces.first()?.empty_like();
        for p in pieces {
            out.append(p).ok()?;
        }
        Some(out)
    }

    /// Element-wise `self += other`; types and lengths must agree.
    pub fn add_assign(&mut self, other: &Buffer) -> Result<(), LayoutMismatch> {
        match (self, other) {
            (Buffer::F32(a), Buffer::F32(b)) if a.len() == b.len() => {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y)
            }
            (Buffer::F64(a), Buffer::F64(b)) if a.len() == b.len() => {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y)
            }
            (mine, other) => return mine.expect_layout(other),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_layout() {
        let a = Buffer::from(vec![1.0f32, 2.0, 3.0]);
        let b = Buffer::from(vec![1.0f64; 3]);
        assert_eq!((a.len(), a.byte_len(), b.byte_len()), (3, 12, 24));
        assert_eq!(a.to_string(), "f32[3]");
        assert!(!a.same_layout(&b));
        assert!(Buffer::F64(vec![]).is_empty());
        assert_eq!(
            a.expect_layout(&b).unwrap_err().to_string(),
            "expected f32[3], got f64[3]"
        );
    }

    #[test]
    fn split_and_concat_round_trip() {
        let a = Buffer::from(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let parts = a.split_even(3).unwrap();
        assert_eq!(parts[1], Buffer::from(vec![3.0f64, 4.0]));
        assert_eq!(Buffer::concat(&parts).unwrap(), a);
        assert!(a.split_even(4).is_none());
        assert!(a.split_even(0).is_none());
        assert_eq!(Buffer::even_lengths(6, 3), Some(vec![2; 3]));
        assert_eq!(Buffer::even_lengths(6, 0), None);
        assert!(Buffer::concat(&[a.clone(), Buffer::F32(vec![1.0])]).is_none());
        assert!(Buffer::concat(&[]).is_none());
    }

    #[test]
    fn balanced_lengths_give_the_remainder_to_the_first_chunks() {
        assert_eq!(Buffer::balanced_lengths(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(Buffer::balanced_lengths(2, 3), vec![1, 1, 0]);
        assert_eq!(Buffer::balanced_lengths(8, 4), vec![2; 4]);
    }

    #[test]
    fn add_assign_sums_and_rejects_mismatches() {
        let mut a = Buffer::from(vec![1.0f32, 2.0]);
        a.add_assign(&Buffer::from(vec![0.5f32, -2.0])).unwrap();
        assert_eq!(a, Buffer::from(vec![1.5f32, 0.0]));
        let mismatch = |got: &str| {
            Err(LayoutMismatch {
                expected: "f32[2]".into(),
                got: got.into(),
            })
        };
        assert_eq!(a.add_assign(&Buffer::from(vec![1.0f32])), mismatch("f32[1]"));
        assert_eq!(a.add_assign(&Buffer::from(vec![1.0f64, 2.0])), mismatch("f64[2]"));
    }
}

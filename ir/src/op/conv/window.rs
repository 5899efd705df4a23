//! The geometry a sliding window shares between convolutions and pools:
//! strides, explicit pads and dilations per spatial dim, the output length
//! they give, and the tap table kernels read through.

use super::super::context::invalid;
use super::super::OpError;
use serde::{Deserialize, Serialize};

/// Where a window reads, per spatial dim. The importer resolves ONNX's
/// `auto_pad` and ConvTranspose's `output_shape` into explicit pads, so one
/// shape rule serves every producer of these ops.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Window {
    /// Step between consecutive windows.
    pub strides: Vec<usize>,
    /// Zeros before each spatial dim, then after each (ONNX's order).
    pub pads: Vec<usize>,
    /// Step between a window's taps (1: contiguous).
    pub dilations: Vec<usize>,
}

impl Window {
    /// Unit strides and dilations, no padding, over `spatial` dims.
    pub fn plain(spatial: usize) -> Window {
        Window {
            strides: vec![1; spatial],
            pads: vec![0; 2 * spatial],
            dilations: vec![1; spatial],
        }
    }

    /// Spatial dims the window spans.
    pub fn rank(&self) -> usize {
        self.strides.len()
    }

    /// Checks the attribute lengths against `spatial` dims and that strides
    /// and dilations are positive.
    pub(crate) fn check(&self, op: &str, spatial: usize) -> Result<(), OpError> {
        if self.strides.len() != spatial || self.dilations.len() != spatial || self.pads.len() != 2 * spatial
        {
            return Err(invalid(
                op,
                format!(
                    "strides {:?}, dilations {:?} and pads {:?} must cover the {spatial} spatial dims (pads twice)",
                    self.strides, self.dilations, self.pads
                ),
            ));
        }
        if self.strides.contains(&0) || self.dilations.contains(&0) {
            return Err(invalid(op, "strides and dilations must be at least 1"));
        }
        Ok(())
    }

    /// Extent of a kernel of `k` taps in dim `i`, dilation included.
    pub(crate) fn span(&self, i: usize, k: usize) -> usize {
        self.dilations[i] * (k.max(1) - 1) + 1
    }

    /// Output length of dim `i` for an input of `len` and a kernel of `k`
    /// taps; `ceil` rounds a partial last window up (pools' `ceil_mode`),
    /// dropping a window that would start in the end padding. `None` when
    /// the kernel is longer than the padded input.
    pub(crate) fn out_len(&self, i: usize, len: usize, k: usize, ceil: bool) -> Option<usize> {
        let (begin, end) = (self.pads[i], self.pads[self.rank() + i]);
        let room = (len + begin + end).checked_sub(self.span(i, k))?;
        let s = self.strides[i];
        let mut out = if ceil { room.div_ceil(s) + 1 } else { room / s + 1 };
        if ceil && (out - 1) * s >= len + begin {
            out -= 1;
        }
        Some(out)
    }

    /// Output length of dim `i` of a transposed convolution: the input
    /// length whose convolution has `len` positions, plus `extra`.
    pub(crate) fn transposed_len(&self, i: usize, len: usize, k: usize, extra: usize) -> Option<usize> {
        let (begin, end) = (self.pads[i], self.pads[self.rank() + i]);
        (self.strides[i] * (len.max(1) - 1) + extra + self.span(i, k)).checked_sub(begin + end)
    }

    /// For each output position and kernel tap (row-major over the spatial
    /// dims, taps fastest), the flat input position it reads, or `None` in
    /// the padding. Kernels read every window through this one table, so
    /// the forward pass and both adjoints agree on which element a tap is.
    pub fn taps(&self, input: &[usize], kernel: &[usize], output: &[usize]) -> Vec<Option<usize>> {
        let taps: usize = kernel.iter().product();
        let outs: usize = output.iter().product();
        let mut table = Vec::with_capacity(outs * taps);
        let mut o = vec![0usize; output.len()];
        for _ in 0..outs {
            let mut t = vec![0usize; kernel.len()];
            for _ in 0..taps {
                let mut flat = Some(0usize);
                for i in 0..input.len() {
                    let pos = (o[i] * self.strides[i] + t[i] * self.dilations[i]).checked_sub(self.pads[i]);
                    flat = match (flat, pos) {
                        (Some(f), Some(p)) if p < input[i] => Some(f * input[i] + p),
                        _ => None,
                    };
                }
                table.push(flat);
                advance(&mut t, kernel);
            }
            advance(&mut o, output);
        }
        table
    }
}

/// Steps a row-major multi-index over `dims` (wrapping at the end).
pub(crate) fn advance(index: &mut [usize], dims: &[usize]) {
    for i in (0..index.len()).rev() {
        index[i] += 1;
        if index[i] < dims[i] {
            return;
        }
        index[i] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(strides: &[usize], pads: &[usize], dilations: &[usize]) -> Window {
        Window {
            strides: strides.to_vec(),
            pads: pads.to_vec(),
            dilations: dilations.to_vec(),
        }
    }

    #[test]
    fn output_lengths_follow_the_onnx_formula() {
        let w = window(&[2], &[1, 1], &[1]);
        assert_eq!(w.out_len(0, 5, 3, false), Some(3));
        // floor((5 + 2 - 3) / 2) + 1 = 3; ceil gives the same here.
        assert_eq!(w.out_len(0, 5, 3, true), Some(3));
        let w = window(&[2], &[0, 0], &[1]);
        assert_eq!(w.out_len(0, 6, 3, false), Some(2));
        assert_eq!(w.out_len(0, 6, 3, true), Some(3));
        // A dilated kernel of 3 taps spans 5.
        let w = window(&[1], &[0, 0], &[2]);
        assert_eq!(w.out_len(0, 7, 3, false), Some(3));
        assert_eq!(w.out_len(0, 4, 3, false), None);
        assert_eq!(window(&[2], &[1, 1], &[1]).transposed_len(0, 3, 3, 1), Some(6));
    }

    #[test]
    fn taps_mark_padding_and_follow_strides_and_dilations() {
        let w = window(&[2], &[1, 0], &[2]);
        // Input 5, kernel 2 (span 3): outputs at -1 and 1 → taps (-1, 1), (1, 3).
        let out = w.out_len(0, 5, 2, false).unwrap();
        assert_eq!(out, 2);
        assert_eq!(w.taps(&[5], &[2], &[out]), vec![None, Some(1), Some(1), Some(3)]);
        let w = Window::plain(2);
        let table = w.taps(&[2, 3], &[2, 2], &[1, 2]);
        assert_eq!(
            table,
            [0, 1, 3, 4, 1, 2, 4, 5].map(Some).to_vec(),
            "2-D taps are row-major, taps fastest"
        );
    }
}

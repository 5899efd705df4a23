//! The sizes of one convolution and the offsets its im2col products use,
//! declared once for the reference kernels and the CUDA backend.

/// One convolution seen from `Conv` (a transposed convolution is this view
/// run backwards): input `[n, c, ins...]`, weight `[m, c/groups, taps...]`,
/// output `[n, m, outs...]`, with the spatial dims flattened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvSizes {
    pub n: usize,
    pub c: usize,
    pub m: usize,
    pub groups: usize,
    pub ins: usize,
    pub outs: usize,
    pub taps: usize,
}

impl ConvSizes {
    /// The sizes of a convolution over `input` with `weight` into `output` (full shapes).
    pub fn new(input: &[usize], weight: &[usize], output: &[usize], groups: usize) -> ConvSizes {
        ConvSizes {
            n: input[0],
            c: input[1],
            m: weight[0],
            groups,
            ins: input[2..].iter().product(),
            outs: output[2..].iter().product(),
            taps: weight[2..].iter().product(),
        }
    }

    /// Input channels per group.
    pub fn cg(&self) -> usize {
        self.c / self.groups
    }

    /// Filters per group.
    pub fn mg(&self) -> usize {
        self.m / self.groups
    }

    /// Rows of a group's column matrix: its channels' taps.
    pub fn rows(&self) -> usize {
        self.cg() * self.taps
    }

    /// The first input plane of sample `s`, group `g`.
    pub fn plane0(&self, s: usize, g: usize) -> usize {
        s * self.c + g * self.cg()
    }

    /// Offset of sample `s`, group `g`'s first output plane.
    pub fn out_at(&self, s: usize, g: usize) -> usize {
        (s * self.m + g * self.mg()) * self.outs
    }

    /// Offset of group `g`'s filters in the weight.
    pub fn weight_at(&self, g: usize) -> usize {
        g * self.mg() * self.rows()
    }
}

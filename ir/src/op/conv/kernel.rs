//! Reference kernels of the convolutions: im2col (each sample's windows
//! gathered into a matrix through the [`Window`]'s tap table) and one GEMM
//! per sample and group. The three products — forward, input adjoint,
//! weight adjoint — serve `Conv`, `ConvTranspose` and `ConvGrad` alike.

use super::super::context::{finish, EvalCtx};
use super::super::gemm::{gemm, Mat};
use super::super::numeric::{float_kernel, Real};
use super::super::OpError;
use super::{ConvSizes, Window};
use crate::Value;

/// One convolution's sizes (see [`ConvSizes`]) and the input position of
/// each (output position, tap), `None` in the padding.
struct Geometry {
    size: ConvSizes,
    table: Vec<Option<usize>>,
}

impl Geometry {
    fn new(window: &Window, input: &[usize], weight: &[usize], output: &[usize], groups: usize) -> Geometry {
        Geometry {
            size: ConvSizes::new(input, weight, output, groups),
            table: window.taps(&input[2..], &weight[2..], &output[2..]),
        }
    }

    /// Group `g`'s windows of sample `s` as `col[(channel·taps + tap)·outs + position]`.
    fn gather<T: Real>(&self, x: &[T], s: usize, g: usize, col: &mut [T]) {
        let z = &self.size;
        for ci in 0..z.cg() {
            let plane = &x[(z.plane0(s, g) + ci) * z.ins..][..z.ins];
            for t in 0..z.taps {
                let row = &mut col[(ci * z.taps + t) * z.outs..][..z.outs];
                for (o, out) in row.iter_mut().enumerate() {
                    *out = self.table[o * z.taps + t].map_or(T::zero(), |p| plane[p]);
                }
            }
        }
    }

    /// Adds a window matrix back into sample `s`'s input planes (col2im).
    fn scatter<T: Real>(&self, col: &[T], s: usize, g: usize, dx: &mut [T]) {
        let z = &self.size;
        for ci in 0..z.cg() {
            let plane = &mut dx[(z.plane0(s, g) + ci) * z.ins..][..z.ins];
            for t in 0..z.taps {
                let row = &col[(ci * z.taps + t) * z.outs..][..z.outs];
                for (o, &v) in row.iter().enumerate() {
                    if let Some(p) = self.table[o * z.taps + t] {
                        plane[p] += v;
                    }
                }
            }
        }
    }

    /// `y = conv(x, w)`, no bias.
    fn forward<T: Real>(&self, op: &str, x: &[T], w: &[T]) -> Result<Vec<T>, OpError> {
        let z = &self.size;
        let (rows, mg, outs) = (z.rows(), z.mg(), z.outs);
        let mut y = vec![T::zero(); z.n * z.m * outs];
        let mut col = vec![T::zero(); rows * outs];
        for s in 0..z.n {
            for g in 0..z.groups {
                self.gather(x, s, g, &mut col);
                let a = Mat::row_major(w, z.weight_at(g), rows, false);
                let b = Mat::row_major(&col, 0, outs, false);
                gemm(
                    op,
                    mg,
                    rows,
                    outs,
                    T::one(),
                    a,
                    b,
                    T::zero(),
                    &mut y,
                    z.out_at(s, g),
                )?;
            }
        }
        Ok(y)
    }

    /// The input adjoint: `dx` from `dy` (a transposed convolution's forward).
    fn backward_data<T: Real>(&self, op: &str, dy: &[T], w: &[T]) -> Result<Vec<T>, OpError> {
        let z = &self.size;
        let (rows, mg, outs) = (z.rows(), z.mg(), z.outs);
        let mut dx = vec![T::zero(); z.n * z.c * z.ins];
        let mut col = vec![T::zero(); rows * outs];
        for s in 0..z.n {
            for g in 0..z.groups {
                let a = Mat::row_major(w, z.weight_at(g), rows, true);
                let b = Mat::row_major(dy, z.out_at(s, g), outs, false);
                gemm(op, rows, mg, outs, T::one(), a, b, T::zero(), &mut col, 0)?;
                self.scatter(&col, s, g, &mut dx);
            }
        }
        Ok(dx)
    }

    /// The weight adjoint: `dw = Σ_samples dy · windowsᵀ`.
    fn backward_weight<T: Real>(&self, op: &str, x: &[T], dy: &[T]) -> Result<Vec<T>, OpError> {
        let z = &self.size;
        let (rows, mg, outs) = (z.rows(), z.mg(), z.outs);
        let mut dw = vec![T::zero(); z.m * rows];
        let mut col = vec![T::zero(); rows * outs];
        for s in 0..z.n {
            for g in 0..z.groups {
                self.gather(x, s, g, &mut col);
                let a = Mat::row_major(dy, z.out_at(s, g), outs, false);
                let b = Mat::row_major(&col, 0, outs, true);
                gemm(
                    op,
                    mg,
                    outs,
                    rows,
                    T::one(),
                    a,
                    b,
                    T::one(),
                    &mut dw,
                    z.weight_at(g),
                )?;
            }
        }
        Ok(dw)
    }
}

/// Adds `bias[channel]` to every element of `y[n, channels, positions]`.
fn add_bias<T: Real>(y: &mut [T], bias: &[T], positions: usize) {
    let per_sample = bias.len() * positions;
    for sample in y.chunks_mut(per_sample.max(1)) {
        for (plane, &b) in sample.chunks_mut(positions.max(1)).zip(bias) {
            plane.iter_mut().for_each(|v| *v += b);
        }
    }
}

fn finish_conv<T: Real>(cx: &EvalCtx, mut y: Vec<T>, positions: usize) -> Result<Vec<T>, OpError> {
    if cx.opt(2).is_some() {
        add_bias(&mut y, cx.floats::<T>(2)?, positions);
    }
    Ok(y)
}

/// Reference kernel of `Conv`.
pub(super) fn eval_conv(cx: &EvalCtx, window: &Window, groups: usize) -> Result<Vec<Value>, OpError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let out = cx.out_shape(0)?;
    let geo = Geometry::new(window, &x.shape, &w.shape, &out, groups);
    let data = float_kernel!(cx.op, x, T => {
        let y = geo.forward(cx.op, cx.floats::<T>(0)?, cx.floats::<T>(1)?)?;
        finish_conv(cx, y, geo.size.outs)?
    });
    Ok(vec![finish(x.dtype, out, data)])
}

/// Reference kernel of `ConvTranspose`: the input adjoint of the
/// convolution whose input has this op's output shape.
pub(super) fn eval_transpose(cx: &EvalCtx, window: &Window, groups: usize) -> Result<Vec<Value>, OpError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let out = cx.out_shape(0)?;
    let geo = Geometry::new(window, &out, &w.shape, &x.shape, groups);
    let data = float_kernel!(cx.op, x, T => {
        let y = geo.backward_data(cx.op, cx.floats::<T>(0)?, cx.floats::<T>(1)?)?;
        finish_conv(cx, y, geo.size.ins)?
    });
    Ok(vec![finish(x.dtype, out, data)])
}

/// `ConvGrad(x, w, dout)` → `(dx, dw)` of `Conv` or, when `transpose`, of
/// `ConvTranspose` (whose convolution view swaps `x` and `dout`).
pub(super) fn grad<T: Real>(
    cx: &EvalCtx,
    window: &Window,
    groups: usize,
    transpose: bool,
) -> Result<Vec<Vec<T>>, OpError> {
    let (xv, wv, dyv) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let (x, w, dy) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?, cx.floats::<T>(2)?);
    if transpose {
        let geo = Geometry::new(window, &dyv.shape, &wv.shape, &xv.shape, groups);
        Ok(vec![
            geo.forward(cx.op, dy, w)?,
            geo.backward_weight(cx.op, dy, x)?,
        ])
    } else {
        let geo = Geometry::new(window, &xv.shape, &wv.shape, &dyv.shape, groups);
        Ok(vec![
            geo.backward_data(cx.op, dy, w)?,
            geo.backward_weight(cx.op, x, dy)?,
        ])
    }
}

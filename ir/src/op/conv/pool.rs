//! Reference kernels of `Pool` (max and average over each window) and its
//! adjoint `PoolGrad`, through the same tap table as the convolutions.

use super::super::context::{finish, EvalCtx};
use super::super::geometry::prod;
use super::super::numeric::{float_kernel, Real};
use super::super::OpError;
use super::{PoolKind, Window};
use crate::{Data, Value};

/// The windows of one pool over `x[n, c, ins...]` with output `[n, c, outs...]`.
struct Windows {
    planes: usize,
    ins: usize,
    outs: usize,
    taps: usize,
    table: Vec<Option<usize>>,
    /// The divisor of each output position's average.
    counts: Vec<usize>,
}

impl Windows {
    fn new(kind: PoolKind, kernel: &[usize], window: &Window, input: &[usize], output: &[usize]) -> Windows {
        let table = window.taps(&input[2..], kernel, &output[2..]);
        let taps = prod(kernel);
        let counts = divisors(kind, kernel, window, &input[2..], &output[2..]);
        Windows {
            planes: input[0] * input[1],
            ins: prod(&input[2..]),
            outs: prod(&output[2..]),
            taps,
            table,
            counts,
        }
    }

    /// The input positions window `o` reads.
    fn window(&self, o: usize) -> impl Iterator<Item = usize> + '_ {
        self.table[o * self.taps..][..self.taps].iter().flatten().copied()
    }

    /// The position of window `o`'s largest element in `plane` (the first
    /// of equal ones; a NaN wins, as it propagates), if the window reads any.
    fn arg_max<T: Real>(&self, plane: &[T], o: usize) -> Option<usize> {
        self.window(o).fold(None, |best, p| match best {
            Some(b) if plane[b].is_nan() || (!plane[p].is_nan() && plane[p] <= plane[b]) => Some(b),
            _ => Some(p),
        })
    }
}

/// Per output position of a pool over spatial dims `input` → `output`, what
/// an average divides its window's sum by: the taps inside the input, or
/// (`count_include_pad`) inside the padded input. Max pools ignore it. The
/// reference kernel and the CUDA kernels both take it from here.
pub fn divisors(
    kind: PoolKind,
    kernel: &[usize],
    window: &Window,
    input: &[usize],
    output: &[usize],
) -> Vec<usize> {
    match kind {
        PoolKind::Average {
            count_include_pad: true,
        } => padded_counts(window, kernel, input, output),
        _ => {
            let taps = prod(kernel).max(1);
            let table = window.taps(input, kernel, output);
            table.chunks(taps).map(|w| w.iter().flatten().count()).collect()
        }
    }
}

/// Per output position, the taps that fall inside the padded input (ONNX
/// `count_include_pad`): padding counts, a ceil-mode overhang past it does not.
fn padded_counts(window: &Window, kernel: &[usize], input: &[usize], output: &[usize]) -> Vec<usize> {
    let rank = kernel.len();
    let per_dim: Vec<Vec<usize>> = (0..rank)
        .map(|i| {
            let limit = input[i] + window.pads[i] + window.pads[rank + i];
            (0..output[i])
                .map(|o| {
                    (0..kernel[i])
                        .filter(|&t| o * window.strides[i] + t * window.dilations[i] < limit)
                        .count()
                })
                .collect()
        })
        .collect();
    let mut index = vec![0usize; rank];
    (0..prod(output))
        .map(|_| {
            let n = (0..rank).map(|i| per_dim[i][index[i]]).product();
            super::window::advance(&mut index, output);
            n
        })
        .collect()
}

fn pool_kernel<T: Real>(w: &Windows, kind: PoolKind, x: &[T]) -> Vec<T> {
    let mut y = vec![T::zero(); w.planes * w.outs];
    for (plane, out) in x.chunks(w.ins.max(1)).zip(y.chunks_mut(w.outs.max(1))) {
        for (o, v) in out.iter_mut().enumerate() {
            *v = match kind {
                PoolKind::Max => w.arg_max(plane, o).map_or(T::neg_infinity(), |p| plane[p]),
                PoolKind::Average { .. } => {
                    let sum: T = w.window(o).map(|p| plane[p]).sum();
                    sum / T::lit(w.counts[o].max(1) as f64)
                }
            };
        }
    }
    y
}

fn grad_kernel<T: Real>(w: &Windows, kind: PoolKind, x: &[T], dy: &[T]) -> Vec<T> {
    let mut dx = vec![T::zero(); w.planes * w.ins];
    let planes = x.chunks(w.ins.max(1)).zip(dy.chunks(w.outs.max(1)));
    for ((plane, grads), dplane) in planes.zip(dx.chunks_mut(w.ins.max(1))) {
        for (o, &g) in grads.iter().enumerate() {
            match kind {
                PoolKind::Max => {
                    if let Some(p) = w.arg_max(plane, o) {
                        dplane[p] += g;
                    }
                }
                PoolKind::Average { .. } => {
                    let share = g / T::lit(w.counts[o].max(1) as f64);
                    for p in w.window(o) {
                        dplane[p] += share;
                    }
                }
            }
        }
    }
    dx
}

/// Reference kernel of `Pool`.
pub(super) fn eval_pool(
    cx: &EvalCtx,
    kind: PoolKind,
    kernel: &[usize],
    window: &Window,
) -> Result<Vec<Value>, OpError> {
    let x = cx.input(0)?;
    let out = cx.out_shape(0)?;
    let w = Windows::new(kind, kernel, window, &x.shape, &out);
    // Integers (max only, as inference allows) pool exactly through f64.
    if let Some(ints) = x.as_i64() {
        let wide: Vec<f64> = ints.iter().map(|&v| v as f64).collect();
        let y = pool_kernel(&w, kind, &wide)
            .into_iter()
            .map(|v| v as i64)
            .collect();
        return Ok(vec![finish(x.dtype, out, Data::I64(y))]);
    }
    let data = float_kernel!(cx.op, x, T => pool_kernel(&w, kind, cx.floats::<T>(0)?));
    Ok(vec![finish(x.dtype, out, data)])
}

/// Reference kernel of `PoolGrad(x, dout)`: each output's gradient goes to
/// its window's maximum (max) or is shared over the window (average).
pub(super) fn eval_grad(
    cx: &EvalCtx,
    kind: PoolKind,
    kernel: &[usize],
    window: &Window,
) -> Result<Vec<Value>, OpError> {
    let (x, dy) = (cx.input(0)?, cx.input(1)?);
    let w = Windows::new(kind, kernel, window, &x.shape, &dy.shape);
    let data = float_kernel!(cx.op, x, T => grad_kernel(&w, kind, cx.floats::<T>(0)?, cx.floats::<T>(1)?));
    Ok(vec![finish(x.dtype, x.shape.clone(), data)])
}

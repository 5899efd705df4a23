//! Convolutions and pools on the GPU, read through the IR's tap table
//! (`Window::taps`, uploaded per node) so the device and the reference
//! kernels agree on every window: a convolution gathers each sample's group
//! of channels into columns (`im2col`) for one cuBLAS GEMM, its input
//! adjoint multiplies by the weight's transpose and adds the columns back
//! (`col2im`, into an f32 accumulator), its weight adjoint multiplies the
//! output gradient by the columns' transpose. A transposed convolution is
//! the input adjoint of the convolution with its weight, as on the host.
//! Pools reduce each window; averages divide by `pool_divisors`.

use super::fused::{finish, scratch};
use super::linalg::{gemm, Gemm};
use super::{float_arg, grid, launch, Gpu};
use crate::tensor::{upload, GpuTensor};
use crate::CudaError;
use autopar_ir::{pool_divisors, ConvSizes, Op, PoolKind, TensorType, Value, Window};

type Outputs = Result<Option<Vec<GpuTensor>>, CudaError>;

pub(super) fn eval(gpu: &Gpu, op: &Op, args: &[Option<&GpuTensor>], out: &[TensorType]) -> Outputs {
    let float = |i: usize| float_arg(args, i);
    let (Some(x), ty) = (float(0), &out[0]) else {
        return Ok(None);
    };
    match op {
        Op::Conv { window, groups } => {
            let Some(w) = float(1) else { return Ok(None) };
            let y = gpu.output(ty)?;
            let geo = Geometry::new(gpu, window, &x.shape, &w.shape, &y.shape, *groups)?;
            geo.forward(gpu, x, w, &y)?;
            add_bias(gpu, &y, float(2))?;
            Ok(Some(vec![y]))
        }
        Op::ConvTranspose { window, groups, .. } => {
            let Some(w) = float(1) else { return Ok(None) };
            let shape = super::fixed(ty)?;
            let geo = Geometry::new(gpu, window, &shape, &w.shape, &x.shape, *groups)?;
            let y = finish(gpu, geo.backward_data(gpu, x, w)?, ty)?;
            add_bias(gpu, &y, float(2))?;
            Ok(Some(vec![y]))
        }
        Op::ConvGrad {
            window,
            groups,
            transpose,
        } => {
            let (Some(w), Some(dy)) = (float(1), float(2)) else {
                return Ok(None);
            };
            let (dx, dw) = (gpu.output(&out[0])?, gpu.output(&out[1])?);
            if *transpose {
                let geo = Geometry::new(gpu, window, &dy.shape, &w.shape, &x.shape, *groups)?;
                geo.forward(gpu, dy, w, &dx)?;
                geo.backward_weight(gpu, dy, x, &dw)?;
                Ok(Some(vec![dx, dw]))
            } else {
                let geo = Geometry::new(gpu, window, &x.shape, &w.shape, &dy.shape, *groups)?;
                geo.backward_weight(gpu, x, dy, &dw)?;
                let dx = finish(gpu, geo.backward_data(gpu, dy, w)?, &out[0])?;
                Ok(Some(vec![dx, dw]))
            }
        }
        Op::Pool {
            kind, kernel, window, ..
        } => {
            let y = gpu.output(ty)?;
            let pool = Pool::new(gpu, *kind, kernel, window, &x.shape, &y.shape)?;
            pool.forward(gpu, x, &y)?;
            Ok(Some(vec![y]))
        }
        Op::PoolGrad { kind, kernel, window } => {
            let Some(dy) = float(1) else { return Ok(None) };
            let pool = Pool::new(gpu, *kind, kernel, window, &x.shape, &dy.shape)?;
            Ok(Some(vec![finish(gpu, pool.backward(gpu, x, dy)?, ty)?]))
        }
        // The other modules' ops.
        elementwise_ops!() | linalg_ops!() | fused_ops!() | host_ops!() => Ok(None),
    }
}

/// The tap table of `window` over spatial dims `input` → `output`, on the
/// device (−1 in the padding).
fn table(
    gpu: &Gpu,
    window: &Window,
    input: &[usize],
    kernel: &[usize],
    output: &[usize],
) -> Result<GpuTensor, CudaError> {
    let taps: Vec<i64> = window
        .taps(input, kernel, output)
        .into_iter()
        .map(|p| p.map_or(-1, |p| p as i64))
        .collect();
    let len = taps.len();
    let value = Value::i64(vec![len], taps).map_err(|e| CudaError::Driver(e.to_string()))?;
    upload(&gpu.stream, &value, gpu.precision)
}

/// One convolution's sizes (the IR's [`ConvSizes`]) and its tap table on the device.
struct Geometry {
    size: ConvSizes,
    table: GpuTensor,
}

impl Geometry {
    fn new(
        gpu: &Gpu,
        window: &Window,
        input: &[usize],
        weight: &[usize],
        output: &[usize],
        groups: usize,
    ) -> Result<Geometry, CudaError> {
        Ok(Geometry {
            size: ConvSizes::new(input, weight, output, groups),
            table: table(gpu, window, &input[2..], &weight[2..], &output[2..])?,
        })
    }

    /// A column buffer of one group of one sample, in the run's float storage.
    fn columns(&self, gpu: &Gpu) -> Result<GpuTensor, CudaError> {
        let shape = vec![self.size.rows(), self.size.outs];
        crate::tensor::allocate(&gpu.stream, autopar_ir::DType::F32, gpu.float(), shape, false)
    }

    /// Runs `im2col` (`dst` the columns, `src` the input) or `col2im` (`dst`
    /// the input's f32 accumulator, `src` the columns) for sample `s`, group
    /// `g`: both take the same arguments, typed by `src`.
    fn columns_kernel(
        &self,
        gpu: &Gpu,
        kernel: &str,
        (dst, src): (&GpuTensor, &GpuTensor),
        s: usize,
        g: usize,
    ) -> Result<(), CudaError> {
        let z = &self.size;
        let (pd, ps, pt) = (gpu.ptr(dst), gpu.ptr(src), gpu.ptr(&self.table));
        let (cg, ins, outs, taps) = (z.cg() as i64, z.ins as i64, z.outs as i64, z.taps as i64);
        let plane0 = z.plane0(s, g) as i64;
        let k = format!("{kernel}_{}", src.storage.suffix());
        launch!(
            gpu,
            k,
            grid(z.rows() * z.outs),
            pd,
            ps,
            pt,
            cg,
            ins,
            outs,
            taps,
            plane0
        )
    }

    /// Device address of element `at` of `t`.
    fn at(gpu: &Gpu, t: &GpuTensor, at: usize) -> u64 {
        gpu.ptr(t) + (at * t.storage.size()) as u64
    }

    /// `y = conv(x, w)` (no bias), into `y`.
    fn forward(&self, gpu: &Gpu, x: &GpuTensor, w: &GpuTensor, y: &GpuTensor) -> Result<(), CudaError> {
        let z = &self.size;
        let col = self.columns(gpu)?;
        for s in 0..z.n {
            for g in 0..z.groups {
                self.columns_kernel(gpu, "im2col", (&col, x), s, g)?;
                let (a, out) = (Self::at(gpu, w, z.weight_at(g)), Self::at(gpu, y, z.out_at(s, g)));
                gemm(gpu, a, gpu.ptr(&col), out, &Gemm::plain(z.mg(), z.outs, z.rows()))?;
            }
        }
        Ok(())
    }

    /// The input adjoint from `dy`, in a zeroed f32 accumulator of the input's shape.
    fn backward_data(&self, gpu: &Gpu, dy: &GpuTensor, w: &GpuTensor) -> Result<GpuTensor, CudaError> {
        let z = &self.size;
        let acc = scratch(gpu, vec![z.n, z.c, z.ins], true)?;
        let col = self.columns(gpu)?;
        let product = Gemm {
            trans_a: true,
            ..Gemm::plain(z.rows(), z.outs, z.mg())
        };
        for s in 0..z.n {
            for g in 0..z.groups {
                let (a, b) = (
                    Self::at(gpu, w, z.weight_at(g)),
                    Self::at(gpu, dy, z.out_at(s, g)),
                );
                gemm(gpu, a, b, gpu.ptr(&col), &product)?;
                self.columns_kernel(gpu, "col2im", (&acc, &col), s, g)?;
            }
        }
        Ok(acc)
    }

    /// The weight adjoint `dw = Σ_samples dy · windowsᵀ`, into `dw`.
    fn backward_weight(
        &self,
        gpu: &Gpu,
        x: &GpuTensor,
        dy: &GpuTensor,
        dw: &GpuTensor,
    ) -> Result<(), CudaError> {
        let z = &self.size;
        let col = self.columns(gpu)?;
        for s in 0..z.n {
            for g in 0..z.groups {
                self.columns_kernel(gpu, "im2col", (&col, x), s, g)?;
                let product = Gemm {
                    trans_b: true,
                    beta: if s == 0 { 0.0 } else { 1.0 },
                    ..Gemm::plain(z.mg(), z.rows(), z.outs)
                };
                let (a, c) = (
                    Self::at(gpu, dy, z.out_at(s, g)),
                    Self::at(gpu, dw, z.weight_at(g)),
                );
                gemm(gpu, a, gpu.ptr(&col), c, &product)?;
            }
        }
        Ok(())
    }
}

/// Adds a convolution's `bias[channels]` to `y[n, channels, ...]`.
fn add_bias(gpu: &Gpu, y: &GpuTensor, bias: Option<&GpuTensor>) -> Result<(), CudaError> {
    let Some(b) = bias else { return Ok(()) };
    let channels = y.shape[1] as i64;
    let positions = y.shape[2..].iter().product::<usize>() as i64;
    let n = y.numel() as i64;
    let (py, pb) = (gpu.ptr(y), gpu.ptr(b));
    let k = format!("channel_bias_{}", y.storage.suffix());
    launch!(gpu, k, grid(y.numel()), py, pb, channels, positions, n)
}

/// One pool over `x[n, c, ins...]` with output `[n, c, outs...]`.
struct Pool {
    kind: PoolKind,
    planes: usize,
    ins: usize,
    outs: usize,
    taps: usize,
    table: GpuTensor,
    divisors: GpuTensor,
}

impl Pool {
    fn new(
        gpu: &Gpu,
        kind: PoolKind,
        kernel: &[usize],
        window: &Window,
        input: &[usize],
        output: &[usize],
    ) -> Result<Pool, CudaError> {
        let divisors: Vec<i64> = pool_divisors(kind, kernel, window, &input[2..], &output[2..])
            .into_iter()
            .map(|d| d as i64)
            .collect();
        let len = divisors.len();
        let divisors = Value::i64(vec![len], divisors).map_err(|e| CudaError::Driver(e.to_string()))?;
        Ok(Pool {
            kind,
            planes: input[0] * input[1],
            ins: input[2..].iter().product(),
            outs: output[2..].iter().product(),
            taps: kernel.iter().product(),
            table: table(gpu, window, &input[2..], kernel, &output[2..])?,
            divisors: upload(&gpu.stream, &divisors, gpu.precision)?,
        })
    }

    fn sizes(&self) -> (i64, i64, i64, i64) {
        (
            self.planes as i64,
            self.ins as i64,
            self.outs as i64,
            self.taps as i64,
        )
    }

    /// The kernel of this pool's kind (`max_pool`, `avg_pool`) and pass
    /// (`fwd`, `bwd`) for `x`'s storage.
    fn kernel(&self, pass: &str, x: &GpuTensor) -> String {
        let kind = match self.kind {
            PoolKind::Max => "max",
            PoolKind::Average { .. } => "avg",
        };
        format!("{kind}_pool_{pass}_{}", x.storage.suffix())
    }

    fn forward(&self, gpu: &Gpu, x: &GpuTensor, y: &GpuTensor) -> Result<(), CudaError> {
        let (planes, ins, outs, taps) = self.sizes();
        let (py, px, pt, pd) = (
            gpu.ptr(y),
            gpu.ptr(x),
            gpu.ptr(&self.table),
            gpu.ptr(&self.divisors),
        );
        let cfg = grid(self.planes * self.outs);
        launch!(
            gpu,
            self.kernel("fwd", x),
            cfg,
            py,
            px,
            pt,
            pd,
            planes,
            ins,
            outs,
            taps
        )
    }

    /// The input's gradient in a zeroed f32 accumulator.
    fn backward(&self, gpu: &Gpu, x: &GpuTensor, dy: &GpuTensor) -> Result<GpuTensor, CudaError> {
        let (planes, ins, outs, taps) = self.sizes();
        let acc = scratch(gpu, x.shape.clone(), true)?;
        let (pa, px, pg) = (gpu.ptr(&acc), gpu.ptr(x), gpu.ptr(dy));
        let (pt, pd) = (gpu.ptr(&self.table), gpu.ptr(&self.divisors));
        let cfg = grid(self.planes * self.outs);
        launch!(
            gpu,
            self.kernel("bwd", x),
            cfg,
            pa,
            px,
            pg,
            pt,
            pd,
            planes,
            ins,
            outs,
            taps
        )?;
        Ok(acc)
    }
}

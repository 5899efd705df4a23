//! One training-graph node on the GPU: output types from the op's own shape
//! inference, then cuBLAS or an NVRTC kernel. Ops without a device kernel
//! return `None`, and the backend runs them on the host with the reference
//! kernels (correct, slower, and reported), so every graph runs.
//!
//! Every op is named once below: in the pattern of the module that has its
//! kernels, or in [`host_ops`] when it has none yet. The dispatch and each
//! module's own match are exhaustive over these patterns, so a new op fails
//! to compile until someone decides where it runs.

/// The ops `elementwise.rs` runs: element-wise functions and data movement.
macro_rules! elementwise_ops {
    () => {
        Op::Unary { .. }
            | Op::Binary { .. }
            | Op::Where
            | Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
            | Op::Transpose { .. }
            | Op::Expand
            | Op::Concat { .. }
            | Op::Split { .. }
    };
}

/// The ops `linalg.rs` runs through cuBLAS.
macro_rules! linalg_ops {
    () => {
        Op::MatMul | Op::Gemm { .. } | Op::Linear
    };
}

/// The ops `fused.rs` runs: reductions, norms, activations, softmax,
/// attention and gathers, with their adjoints.
macro_rules! fused_ops {
    () => {
        Op::Reduce { .. }
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::NormGrad { .. }
            | Op::Gelu { .. }
            | Op::Silu
            | Op::ActivationGrad { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::SoftmaxGrad { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
            | Op::Embedding
            | Op::Gather { .. }
            | Op::GatherGrad { .. }
            | Op::GatherElements { .. }
            | Op::GatherElementsGrad { .. }
    };
}

/// The ops `conv.rs` runs: convolutions and pools with their adjoints.
macro_rules! conv_ops {
    () => {
        Op::Conv { .. }
            | Op::ConvTranspose { .. }
            | Op::ConvGrad { .. }
            | Op::Pool { .. }
            | Op::PoolGrad { .. }
    };
}

/// The ops with no device kernel yet: the host's reference kernels run them.
macro_rules! host_ops {
    () => {
        Op::Clip
            | Op::RotaryEmbedding { .. }
            | Op::MoeRouter { .. }
            | Op::MoeExperts { .. }
            | Op::MoeExpertsGrad { .. }
            | Op::MoeSort { .. }
            | Op::MoeSlots { .. }
            | Op::Comm { .. }
            | Op::ArgMax { .. }
            | Op::TopK { .. }
            | Op::CumSum { .. }
            | Op::Slice
            | Op::Shape { .. }
            | Op::Size
            | Op::Trilu { .. }
            | Op::GatherNd { .. }
            | Op::GatherNdGrad { .. }
            | Op::ConstantOfShape { .. }
            | Op::Range
    };
}

mod conv;
mod elementwise;
mod fused;
pub(crate) mod linalg;

use super::module::{Kernels, View};
use super::tensor::{allocate, GpuTensor, Storage};
use super::CudaError;
use super::GpuPrecision;
use autopar_ir::{InferInput, Op, Shape, TensorType};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use std::cell::Cell;
use std::sync::Arc;

/// What kernels need: the rank's stream, its cuBLAS handle, the compiled
/// kernels and the compute type.
pub(crate) struct Gpu {
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub kernels: Arc<Kernels>,
    pub precision: GpuPrecision,
    pub indices: IndexCheck,
}

/// Where gathers report an index out of range, which they read as 0 (a
/// kernel cannot fail): a device word that the first such index sets to
/// the code of the node that read it, for the backend to read back.
pub(crate) struct IndexCheck {
    word: CudaSlice<i32>,
    /// The code the next gather reports (its node's, set by the backend).
    pub code: Cell<i32>,
}

/// Whether `op` runs as a gather that reports indices out of range.
pub(crate) fn gathers(op: &Op) -> bool {
    matches!(
        op,
        Op::Embedding
            | Op::Gather { .. }
            | Op::GatherGrad { .. }
            | Op::GatherElements { .. }
            | Op::GatherElementsGrad { .. }
    )
}

impl IndexCheck {
    pub fn new(stream: &Arc<CudaStream>) -> Result<IndexCheck, CudaError> {
        let word = stream
            .alloc_zeros::<i32>(1)
            .map_err(|e| CudaError::Driver(e.to_string()))?;
        Ok(IndexCheck {
            word,
            code: Cell::new(0),
        })
    }

    /// The word's address and the code to report, as gathers take them.
    fn args(&self, stream: &Arc<CudaStream>) -> (u64, i32) {
        (self.word.device_ptr(stream).0, self.code.get())
    }

    /// The code the first index out of range since the last call reported
    /// (0: none), clearing it. Waits for `stream`.
    pub fn take(&mut self, stream: &Arc<CudaStream>) -> Result<i32, CudaError> {
        let driver = |e: cudarc::driver::DriverError| CudaError::Driver(e.to_string());
        let got = stream.clone_dtoh(&self.word).map_err(driver)?;
        stream.synchronize().map_err(driver)?;
        if got[0] != 0 {
            stream.memset_zeros(&mut self.word).map_err(driver)?;
        }
        Ok(got[0])
    }
}

/// Launches kernel `$name` with `$cfg` and the given (already bound) arguments.
macro_rules! launch {
    ($gpu:expr, $name:expr, $cfg:expr $(, $arg:expr)* $(,)?) => {{
        let name: &str = &$name;
        let f = $gpu.kernels.get(name)?;
        let mut b = $gpu.stream.launch_builder(&f);
        $( cudarc::driver::PushKernelArg::arg(&mut b, &$arg); )*
        // SAFETY: argument lists follow kernels/*.cu (the kernel spec).
        unsafe { b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| CudaError::Driver(format!("launching {name}: {e}")))
    }};
}
pub(crate) use launch;

/// Threads per block of element-wise and per-row kernels.
pub(crate) const THREADS: u32 = 256;

/// A grid-stride launch over `n` elements.
pub(crate) fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 65_536) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row.
pub(crate) fn rows(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.max(1) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Gpu {
    /// The storage of float tensors in this run.
    pub fn float(&self) -> Storage {
        match self.precision {
            GpuPrecision::F32 => Storage::F32,
            GpuPrecision::Bf16 => Storage::Bf16,
        }
    }

    /// A new output tensor of type `ty` (fixed shape).
    pub fn output(&self, ty: &TensorType) -> Result<GpuTensor, CudaError> {
        let shape = fixed(ty)?;
        let storage = super::tensor::storage_of(ty.dtype, self.precision)
            .ok_or_else(|| CudaError::Driver(format!("{} outputs cannot live on the GPU", ty.dtype)))?;
        allocate(&self.stream, ty.dtype, storage, shape, false)
    }

    pub fn ptr(&self, x: &GpuTensor) -> u64 {
        x.ptr(&self.stream)
    }

    /// `y = x` element for element through views (transpose, expand, concat pieces).
    pub fn copy_view(
        &self,
        out: &GpuTensor,
        ov: View,
        x: &GpuTensor,
        xv: View,
        n: usize,
    ) -> Result<(), CudaError> {
        let (o, i, n) = (self.ptr(out), self.ptr(x), n as i64);
        let name = match x.storage {
            Storage::I64 => "copy_view_i64".to_string(),
            s => format!("copy_view_{}", s.suffix()),
        };
        launch!(self, name, grid(n as usize), o, ov, i, xv, n)
    }
}

fn fixed(ty: &TensorType) -> Result<Vec<usize>, CudaError> {
    ty.shape
        .0
        .iter()
        .map(|d| d.fixed())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CudaError::Driver(format!("output shape {} is not fixed", ty.shape)))
}

/// The node's output types from its inputs, by the op's own inference.
fn infer(op: &Op, args: &[Option<&GpuTensor>]) -> Result<Vec<TensorType>, CudaError> {
    let types: Vec<Option<(TensorType, Option<autopar_ir::Value>)>> = args
        .iter()
        .map(|a| {
            a.map(|x| {
                (
                    TensorType {
                        dtype: x.dtype,
                        shape: Shape::fixed(&x.shape),
                    },
                    x.host_ints(),
                )
            })
        })
        .collect();
    let inputs: Vec<Option<InferInput>> = types
        .iter()
        .map(|t| {
            t.as_ref().map(|(ty, v)| InferInput {
                ty,
                value: v.as_ref(),
            })
        })
        .collect();
    op.infer(&inputs).map_err(|e| CudaError::Driver(e.to_string()))
}

/// Runs `op` on the device, or `None` when it has no device kernel for
/// these operands.
pub(crate) fn eval(
    gpu: &Gpu,
    op: &Op,
    args: &[Option<&GpuTensor>],
) -> Result<Option<Vec<GpuTensor>>, CudaError> {
    // Every operand a kernel reads must be on the device in a known layout.
    let floats_ok = args
        .iter()
        .flatten()
        .all(|x| x.storage != Storage::F32 || gpu.float() == Storage::F32);
    if !floats_ok {
        return Ok(None);
    }
    // Ops whose shapes need values the device does not mirror run on the host.
    let Ok(out) = infer(op, args) else {
        return Ok(None);
    };
    match op {
        elementwise_ops!() => elementwise::eval(gpu, op, args, &out),
        linalg_ops!() => linalg::eval(gpu, op, args, &out),
        fused_ops!() => fused::eval(gpu, op, args, &out),
        conv_ops!() => conv::eval(gpu, op, args, &out),
        host_ops!() => Ok(None),
    }
}

/// The float operand `i`, if present and stored as a float.
pub(crate) fn float_arg<'a>(args: &[Option<&'a GpuTensor>], i: usize) -> Option<&'a GpuTensor> {
    args.get(i).copied().flatten().filter(|x| x.storage.is_float())
}

//! Matrix products on cuBLAS: `MatMul` (batched when both sides carry the
//! same batch, folded into one GEMM when only the left does), `Gemm` and
//! `Linear`, in f32 or bf16 with f32 accumulation.

use super::{Gpu, View};
use crate::tensor::{GpuTensor, Storage};
use crate::CudaError;
use autopar_ir::{Op, TensorType};
use cudarc::cublas::{result as blas, sys};
use std::ffi::c_void;

/// A row-major (batched) product `C = alpha·op(A)·op(B) + beta·C`; strides in elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub alpha: f32,
    pub beta: f32,
}

impl Gemm {
    /// `A·B` with no transposes, one matrix.
    pub(crate) fn plain(m: usize, n: usize, k: usize) -> Gemm {
        Gemm {
            trans_a: false,
            trans_b: false,
            m,
            n,
            k,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// Runs `g` on the rank's stream. cuBLAS is column-major, so the row-major
/// product is computed as `Cᵀ = op(B)ᵀ·op(A)ᵀ`.
pub(crate) fn gemm(gpu: &Gpu, a: u64, b: u64, c: u64, g: &Gemm) -> Result<(), CudaError> {
    let op = |t: bool| {
        if t {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let dtype = match gpu.float() {
        Storage::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        _ => sys::cudaDataType::CUDA_R_32F,
    };
    let int = |x: usize, what: &str| {
        i32::try_from(x)
            .map_err(|_| CudaError::Driver(format!("GEMM {what} {x} exceeds cuBLAS's 32-bit sizes")))
    };
    let (m, n, k, batch) = (
        int(g.m, "m")?,
        int(g.n, "n")?,
        int(g.k, "k")?,
        int(g.batch, "batch")?,
    );
    let lda = if g.trans_b { k } else { n };
    let ldb = if g.trans_a { m } else { k };
    let (alpha, beta) = (g.alpha, g.beta);
    // SAFETY: pointers are live device buffers of the sizes the shapes imply,
    // on the handle's stream; alpha/beta are host f32 (host pointer mode).
    unsafe {
        blas::gemm_strided_batched_ex(
            *gpu.blas.handle(),
            op(g.trans_b),
            op(g.trans_a),
            n,
            m,
            k,
            &alpha as *const f32 as *const c_void,
            b as *const c_void,
            dtype,
            lda,
            g.stride_b as i64,
            a as *const c_void,
            dtype,
            ldb,
            g.stride_a as i64,
            &beta as *const f32 as *const c_void,
            c as *mut c_void,
            dtype,
            n,
            g.stride_c as i64,
            batch,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| {
        CudaError::Driver(format!(
            "cuBLAS GEMM {}x{}x{} (batch {}): {e}",
            g.m, g.n, g.k, g.batch
        ))
    })
}

/// Writes `bias` broadcast over `y` (the `beta = 1` addend of a GEMM).
fn fill_with(gpu: &Gpu, y: &GpuTensor, bias: &GpuTensor) -> Result<bool, CudaError> {
    let (Some(iv), Some(ov)) = (View::broadcast(&bias.shape, &y.shape), View::contiguous(&y.shape)) else {
        return Ok(false);
    };
    gpu.copy_view(y, ov, bias, iv, y.numel())?;
    Ok(true)
}

pub(super) fn eval(
    gpu: &Gpu,
    op: &Op,
    args: &[Option<&GpuTensor>],
    out: &[TensorType],
) -> Result<Option<Vec<GpuTensor>>, CudaError> {
    let float = |i: usize| super::float_arg(args, i);
    let (Some(a), Some(b)) = (float(0), float(1)) else {
        return Ok(None);
    };
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || rb < 2 {
        return Ok(None);
    }
    // The product's shape, and the addend written into the output first
    // (then accumulated with `beta`).
    let (g, addend): (Gemm, Option<&GpuTensor>) = match op {
        Op::MatMul => {
            let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
            let (batch_a, batch_b) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
            let (na, nb): (usize, usize) = (batch_a.iter().product(), batch_b.iter().product());
            let g = if nb == 1 {
                // The right side is one matrix: fold the left's batch into its rows.
                Gemm::plain(na * m, n, k)
            } else if batch_a == batch_b || na == 1 {
                Gemm {
                    batch: nb,
                    stride_a: if na == 1 { 0 } else { m * k },
                    stride_b: k * n,
                    stride_c: m * n,
                    ..Gemm::plain(m, n, k)
                }
            } else {
                return Ok(None);
            };
            (g, None)
        }
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => {
            if ra != 2 || rb != 2 {
                return Ok(None);
            }
            let (m, k) = if *trans_a {
                (a.shape[1], a.shape[0])
            } else {
                (a.shape[0], a.shape[1])
            };
            let n = if *trans_b { b.shape[0] } else { b.shape[1] };
            let c = args.get(2).copied().flatten().filter(|_| *beta != 0.0);
            let g = Gemm {
                trans_a: *trans_a,
                trans_b: *trans_b,
                alpha: *alpha as f32,
                beta: if c.is_some() { *beta as f32 } else { 0.0 },
                ..Gemm::plain(m, n, k)
            };
            (g, c)
        }
        Op::Linear => {
            if rb != 2 || b.shape[0] == 0 {
                return Ok(None);
            }
            let (k, n) = (b.shape[0], b.shape[1]);
            let bias = args.get(2).copied().flatten();
            let g = Gemm {
                beta: if bias.is_some() { 1.0 } else { 0.0 },
                ..Gemm::plain(a.numel() / k, n, k)
            };
            (g, bias)
        }
        elementwise_ops!() | fused_ops!() | conv_ops!() | host_ops!() => return Ok(None),
    };
    // cuBLAS rejects empty products (zero leading dims); the host does them.
    if g.m == 0 || g.n == 0 || g.k == 0 || addend.is_some_and(|c| !c.storage.is_float()) {
        return Ok(None);
    }
    let y = gpu.output(&out[0])?;
    if let Some(c) = addend {
        if !fill_with(gpu, &y, c)? {
            return Ok(None);
        }
    }
    let (pa, pb, pc) = (gpu.ptr(a), gpu.ptr(b), gpu.ptr(&y));
    gemm(gpu, pa, pb, pc, &g)?;
    Ok(Some(vec![y]))
}

//! Reductions, normalisations, activations, softmax, flash attention and
//! the gathers with their scatter-add adjoints, as NVRTC kernels.

use super::elementwise::norm;
use super::{grid, launch, rows, Gpu, View};
use crate::kernels::{FLASH_BLOCK_K, FLASH_BLOCK_Q, FLASH_MAX_HEAD_DIM, FLASH_THREADS};
use crate::module::row_major_strides as strides;
use crate::tensor::{allocate, GpuTensor, Storage};
use crate::CudaError;
use autopar_ir::{Activation, DType, GeluApprox, Op, ReduceKind, TensorType};
use cudarc::driver::LaunchConfig;

/// A float scratch buffer (f32 whatever the run's precision).
pub(super) fn scratch(gpu: &Gpu, shape: Vec<usize>, zeroed: bool) -> Result<GpuTensor, CudaError> {
    allocate(&gpu.stream, DType::F32, Storage::F32, shape, zeroed)
}

/// Where a gather.cu kernel writes.
#[derive(Clone, Copy)]
enum Writes {
    /// A gather: a new output, one thread per element of it.
    Output,
    /// An adjoint's scatter-add: a zeroed f32 accumulator of the output's
    /// shape, cast to its type at the end; one thread per element read.
    Accumulator,
}

/// Runs one of gather.cu's kernels, which all read `src` through `idx`
/// over `(outer, indexed, axis length, inner)`, into the node's output of
/// type `ty` as `writes` says.
fn index_node(
    gpu: &Gpu,
    name: &str,
    (src, idx): (&GpuTensor, &GpuTensor),
    [outer, indexed, len, inner]: [i64; 4],
    ty: &TensorType,
    writes: Writes,
) -> Outputs {
    let (out, threads) = match writes {
        Writes::Output => {
            let y = gpu.output(ty)?;
            let n = y.numel();
            (y, n)
        }
        Writes::Accumulator => (scratch(gpu, super::fixed(ty)?, true)?, src.numel()),
    };
    let (po, ps, pi) = (gpu.ptr(&out), gpu.ptr(src), gpu.ptr(idx));
    let (fault, code) = gpu.indices.args(&gpu.stream);
    let k = format!("{name}_{}", suffix(src));
    launch!(
        gpu,
        k,
        grid(threads),
        po,
        ps,
        pi,
        outer,
        indexed,
        len,
        inner,
        fault,
        code
    )?;
    Ok(Some(vec![match writes {
        Writes::Output => out,
        Writes::Accumulator => finish(gpu, out, ty)?,
    }]))
}

/// An f32 accumulator as an output of type `ty`: itself in f32 runs, cast to bf16 otherwise.
pub(super) fn finish(gpu: &Gpu, acc: GpuTensor, ty: &TensorType) -> Result<GpuTensor, CudaError> {
    if gpu.float() == Storage::F32 {
        let shape = acc.shape.clone();
        return Ok(acc.alias(ty.dtype, shape));
    }
    let y = gpu.output(ty)?;
    let (o, i, n) = (gpu.ptr(&y), gpu.ptr(&acc), acc.numel() as i64);
    launch!(gpu, "cast_f32_bf16", grid(acc.numel()), o, i, n)?;
    Ok(y)
}

/// Product of `dims`.
fn prod(dims: &[usize]) -> i64 {
    dims.iter().product::<usize>() as i64
}

fn suffix(x: &GpuTensor) -> &'static str {
    x.storage.suffix()
}

/// The outputs of a node, or `None` to run it on the host.
type Outputs = Result<Option<Vec<GpuTensor>>, CudaError>;

/// A gather's (or its adjoint's) float operand and its i64 indices, if
/// both are there so.
fn gather_operands<'a>(args: &[Option<&'a GpuTensor>]) -> Option<(&'a GpuTensor, &'a GpuTensor)> {
    let idx = args
        .get(1)
        .copied()
        .flatten()
        .filter(|x| x.storage == Storage::I64)?;
    Some((super::float_arg(args, 0)?, idx))
}

/// Routes `op` to its family's launcher below (one per op, mirroring
/// `ir/src/op/<family>/`).
pub(super) fn eval(gpu: &Gpu, op: &Op, args: &[Option<&GpuTensor>], out: &[TensorType]) -> Outputs {
    let Some(x) = args.first().copied().flatten() else {
        return Ok(None);
    };
    let ty = &out[0];
    let float = x.storage.is_float();
    match op {
        Op::Reduce {
            kind,
            axes,
            noop_with_empty_axes,
            ..
        } if float => reduce_node(gpu, x, args, *kind, axes.as_deref(), *noop_with_empty_axes, ty),
        Op::LayerNorm { axis, epsilon } | Op::RmsNorm { axis, epsilon } if float => {
            let centre = matches!(op, Op::LayerNorm { .. });
            norm_forward(gpu, x, args, out, centre, *axis, *epsilon)
        }
        Op::NormGrad {
            axis,
            epsilon,
            centre,
        } if float => norm_backward(gpu, x, args, out, *centre, *axis, *epsilon),
        Op::Gelu { approximate } if float => gelu(gpu, x, ty, *approximate),
        Op::Silu if float => silu(gpu, x, ty),
        Op::ActivationGrad { activation } if float => activation_grad(gpu, x, args, ty, *activation),
        Op::Softmax { axis } | Op::LogSoftmax { axis } if float => {
            softmax(gpu, x, ty, *axis, matches!(op, Op::LogSoftmax { .. }))
        }
        Op::SoftmaxGrad { axis, log } if float => softmax_grad(gpu, x, args, ty, *axis, *log),
        // The flash kernels; mask and query positions operands 3 and 4
        // forward, 4 and 5 backward (`dout` is 3).
        Op::Attention { scale, causal } => Ok(match Flash::of(gpu, args, *scale, *causal, 3) {
            Some(f) => {
                let (o, _stats) = f.forward(gpu, ty)?;
                Some(vec![o])
            }
            None => None,
        }),
        Op::AttentionGrad {
            scale,
            causal,
            mask_grad: false,
        } => Ok(
            match (
                Flash::of(gpu, args, *scale, *causal, 4),
                super::float_arg(args, 3),
            ) {
                (Some(f), Some(dout)) if dout.shape == f.q.shape => Some(f.backward(gpu, dout, out)?),
                _ => None,
            },
        ),
        Op::Embedding => embedding(gpu, args, ty),
        Op::Gather { axis } => gather(gpu, args, ty, *axis),
        Op::GatherGrad { axis } => gather_grad(gpu, args, ty, *axis),
        Op::GatherElements { axis } => gather_elements(gpu, args, ty, *axis),
        Op::GatherElementsGrad { axis } => gather_elements_grad(gpu, args, ty, *axis),
        // Operands the kernels above do not take (integer inputs, a mask
        // gradient), and the other modules' ops.
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
        | Op::AttentionGrad { .. } => Ok(None),
        elementwise_ops!() | linalg_ops!() | conv_ops!() | host_ops!() => Ok(None),
    }
}

/// `Reduce`: the axes come from the attribute or, failing that, a constant
/// second operand; none at all reduces everything (or nothing, when
/// `noop_with_empty_axes`).
fn reduce_node(
    gpu: &Gpu,
    x: &GpuTensor,
    args: &[Option<&GpuTensor>],
    kind: ReduceKind,
    axes: Option<&[i64]>,
    noop_with_empty_axes: bool,
    ty: &TensorType,
) -> Outputs {
    let rank = x.shape.len();
    let listed: Vec<i64> = match axes {
        Some(a) => a.to_vec(),
        None => match args.get(1).copied().flatten() {
            Some(t) => match &t.ints {
                Some(v) => (**v).clone(),
                None => return Ok(None),
            },
            None => Vec::new(),
        },
    };
    let mut reduced: Vec<usize> = if listed.is_empty() {
        if noop_with_empty_axes {
            return Ok(Some(vec![x.alias(ty.dtype, x.shape.clone())]));
        }
        (0..rank).collect()
    } else {
        listed.iter().map(|&a| norm(a, rank)).collect()
    };
    reduced.sort_unstable();
    reduced.dedup();
    Ok(reduce(gpu, kind, x, &reduced, ty)?.map(|y| vec![y]))
}

/// `LayerNorm` (`centre`, with an optional bias) or `RmsNorm` over the dims
/// from `axis` on.
fn norm_forward(
    gpu: &Gpu,
    x: &GpuTensor,
    args: &[Option<&GpuTensor>],
    out: &[TensorType],
    centre: bool,
    axis: i64,
    epsilon: f64,
) -> Outputs {
    let float = |i: usize| super::float_arg(args, i);
    let Some(scale) = float(1) else { return Ok(None) };
    let axis = norm(axis, x.shape.len());
    let (rows_n, cols) = (prod(&x.shape[..axis]), prod(&x.shape[axis..]));
    if scale.numel() as i64 != cols || out.len() > 1 {
        return Ok(None);
    }
    let y = gpu.output(&out[0])?;
    let (py, px, pg, eps, null) = (gpu.ptr(&y), gpu.ptr(x), gpu.ptr(scale), epsilon as f32, 0u64);
    if centre {
        let pb = match float(2) {
            Some(b) if b.numel() as i64 == cols => gpu.ptr(b),
            Some(_) => return Ok(None),
            None => 0u64,
        };
        let k = format!("layernorm_fwd_{}", suffix(x));
        launch!(
            gpu,
            k,
            rows(rows_n as usize),
            py,
            null,
            null,
            px,
            pg,
            pb,
            rows_n,
            cols,
            eps
        )?;
    } else {
        let k = format!("rmsnorm_fwd_{}", suffix(x));
        launch!(gpu, k, rows(rows_n as usize), py, null, px, pg, rows_n, cols, eps)?;
    }
    Ok(Some(vec![y]))
}

/// `NormGrad`: (dx, dscale) of layer norm (`centre`) or RMS norm.
fn norm_backward(
    gpu: &Gpu,
    x: &GpuTensor,
    args: &[Option<&GpuTensor>],
    out: &[TensorType],
    centre: bool,
    axis: i64,
    epsilon: f64,
) -> Outputs {
    let float = |i: usize| super::float_arg(args, i);
    let (Some(scale), Some(dy)) = (float(1), float(2)) else {
        return Ok(None);
    };
    let axis = norm(axis, x.shape.len());
    let (rows_n, cols) = (prod(&x.shape[..axis]), prod(&x.shape[axis..]));
    if scale.numel() as i64 != cols || dy.storage != x.storage || out.len() != 2 {
        return Ok(None);
    }
    let (dx, gx) = (gpu.output(&out[0])?, gpu.output(&out[1])?);
    let (pdx, pgx, pdy) = (gpu.ptr(&dx), gpu.ptr(&gx), gpu.ptr(dy));
    let (px, pg, eps) = (gpu.ptr(x), gpu.ptr(scale), epsilon as f32);
    let kind = if centre { "layernorm" } else { "rmsnorm" };
    let k = format!("{kind}_bwd_{}", suffix(x));
    launch!(
        gpu,
        k,
        rows(rows_n as usize),
        pdx,
        pgx,
        pdy,
        px,
        pg,
        rows_n,
        cols,
        eps
    )?;
    Ok(Some(vec![dx, gx]))
}

/// `Gelu`, exact or with the tanh approximation.
fn gelu(gpu: &Gpu, x: &GpuTensor, ty: &TensorType, approximate: GeluApprox) -> Outputs {
    let y = gpu.output(ty)?;
    let (py, px, n) = (gpu.ptr(&y), gpu.ptr(x), x.numel() as i64);
    let tanh = i32::from(approximate == GeluApprox::Tanh);
    launch!(
        gpu,
        format!("gelu_fwd_{}", suffix(x)),
        grid(x.numel()),
        py,
        px,
        n,
        tanh
    )?;
    Ok(Some(vec![y]))
}

/// `Silu`.
fn silu(gpu: &Gpu, x: &GpuTensor, ty: &TensorType) -> Outputs {
    let y = gpu.output(ty)?;
    let (py, px, n) = (gpu.ptr(&y), gpu.ptr(x), x.numel() as i64);
    launch!(gpu, format!("silu_fwd_{}", suffix(x)), grid(x.numel()), py, px, n)?;
    Ok(Some(vec![y]))
}

/// `ActivationGrad` for SiLU and GELU (ReLU's runs on the host).
fn activation_grad(
    gpu: &Gpu,
    x: &GpuTensor,
    args: &[Option<&GpuTensor>],
    ty: &TensorType,
    activation: Activation,
) -> Outputs {
    let Some(dy) = super::float_arg(args, 1).filter(|dy| dy.storage == x.storage) else {
        return Ok(None);
    };
    let dx = gpu.output(ty)?;
    let (pdx, pdy, px, n) = (gpu.ptr(&dx), gpu.ptr(dy), gpu.ptr(x), x.numel() as i64);
    let k = |name: &str| format!("{name}_bwd_{}", suffix(x));
    match activation {
        Activation::Silu => launch!(gpu, k("silu"), grid(x.numel()), pdx, pdy, px, n)?,
        Activation::Gelu | Activation::GeluTanh => {
            let tanh = i32::from(activation == Activation::GeluTanh);
            launch!(gpu, k("gelu"), grid(x.numel()), pdx, pdy, px, n, tanh)?
        }
        Activation::Relu => return Ok(None),
    }
    Ok(Some(vec![dx]))
}

/// `Softmax` or `LogSoftmax` (`log`) over the last axis.
fn softmax(gpu: &Gpu, x: &GpuTensor, ty: &TensorType, axis: i64, log: bool) -> Outputs {
    let rank = x.shape.len();
    if norm(axis, rank) != rank - 1 {
        return Ok(None);
    }
    let y = gpu.output(ty)?;
    let cols = x.shape[rank - 1] as i64;
    let rows_n = x.numel() as i64 / cols.max(1);
    let log = i32::from(log);
    let (py, px) = (gpu.ptr(&y), gpu.ptr(x));
    launch!(
        gpu,
        format!("softmax_fwd_{}", suffix(x)),
        rows(rows_n as usize),
        py,
        px,
        rows_n,
        cols,
        log
    )?;
    Ok(Some(vec![y]))
}

/// `SoftmaxGrad` over the last axis, from the forward output `x`.
fn softmax_grad(
    gpu: &Gpu,
    x: &GpuTensor,
    args: &[Option<&GpuTensor>],
    ty: &TensorType,
    axis: i64,
    log: bool,
) -> Outputs {
    let rank = x.shape.len();
    let Some(dy) = super::float_arg(args, 1).filter(|dy| dy.storage == x.storage) else {
        return Ok(None);
    };
    if norm(axis, rank) != rank - 1 {
        return Ok(None);
    }
    let dx = gpu.output(ty)?;
    let cols = x.shape[rank - 1] as i64;
    let rows_n = x.numel() as i64 / cols.max(1);
    let (pdx, pdy, py, log) = (gpu.ptr(&dx), gpu.ptr(dy), gpu.ptr(x), i32::from(log));
    let k = format!("softmax_bwd_{}", suffix(x));
    launch!(gpu, k, rows(rows_n as usize), pdx, pdy, py, rows_n, cols, log)?;
    Ok(Some(vec![dx]))
}

/// `Embedding`: a row gather from a 2-d table.
fn embedding(gpu: &Gpu, args: &[Option<&GpuTensor>], ty: &TensorType) -> Outputs {
    let Some((table, ids)) = gather_operands(args) else {
        return Ok(None);
    };
    if table.shape.len() != 2 {
        return Ok(None);
    }
    // A row gather, so ids wrap and bound as the reference's do.
    let sizes = [
        1,
        ids.numel() as i64,
        table.shape[0] as i64,
        table.shape[1] as i64,
    ];
    index_node(gpu, "gather", (table, ids), sizes, ty, Writes::Output)
}

/// `Gather` along `axis`.
fn gather(gpu: &Gpu, args: &[Option<&GpuTensor>], ty: &TensorType, axis: i64) -> Outputs {
    let Some((data, idx)) = gather_operands(args) else {
        return Ok(None);
    };
    let (outer, len, inner) = split_at(&data.shape, norm(axis, data.shape.len()));
    let sizes = [outer, idx.numel() as i64, len, inner];
    index_node(gpu, "gather", (data, idx), sizes, ty, Writes::Output)
}

/// `GatherGrad`: `Gather`'s adjoint, a scatter-add into an f32 accumulator.
fn gather_grad(gpu: &Gpu, args: &[Option<&GpuTensor>], ty: &TensorType, axis: i64) -> Outputs {
    let Some((g, idx)) = gather_operands(args) else {
        return Ok(None);
    };
    let dims = super::fixed(ty)?;
    let (outer, len, inner) = split_at(&dims, norm(axis, dims.len()));
    let sizes = [outer, idx.numel() as i64, len, inner];
    index_node(gpu, "gather_grad", (g, idx), sizes, ty, Writes::Accumulator)
}

/// `GatherElements` along `axis`.
fn gather_elements(gpu: &Gpu, args: &[Option<&GpuTensor>], ty: &TensorType, axis: i64) -> Outputs {
    let Some((data, idx)) = gather_operands(args) else {
        return Ok(None);
    };
    let axis = norm(axis, data.shape.len());
    if !same_except(&data.shape, &idx.shape, axis) {
        return Ok(None);
    }
    let (outer, j, inner) = split_at(&idx.shape, axis);
    let sizes = [outer, j, data.shape[axis] as i64, inner];
    index_node(gpu, "gather_elements", (data, idx), sizes, ty, Writes::Output)
}

/// `GatherElementsGrad`: `GatherElements`' adjoint, a scatter-add into an
/// f32 accumulator.
fn gather_elements_grad(gpu: &Gpu, args: &[Option<&GpuTensor>], ty: &TensorType, axis: i64) -> Outputs {
    let Some((g, idx)) = gather_operands(args) else {
        return Ok(None);
    };
    let dims = super::fixed(ty)?;
    let axis = norm(axis, dims.len());
    if !same_except(&dims, &idx.shape, axis) || g.shape != idx.shape {
        return Ok(None);
    }
    let (outer, j, inner) = split_at(&idx.shape, axis);
    let sizes = [outer, j, dims[axis] as i64, inner];
    index_node(
        gpu,
        "gather_elements_grad",
        (g, idx),
        sizes,
        ty,
        Writes::Accumulator,
    )
}

/// `dims` as (outer, dims[axis], inner).
fn split_at(dims: &[usize], axis: usize) -> (i64, i64, i64) {
    (prod(&dims[..axis]), dims[axis] as i64, prod(&dims[axis + 1..]))
}

/// Whether `a` and `b` agree on every dim but `axis`.
fn same_except(a: &[usize], b: &[usize], axis: usize) -> bool {
    a.len() == b.len() && a.iter().zip(b).enumerate().all(|(i, (x, y))| i == axis || x == y)
}

/// Reduces `x` over the sorted axes `reduced`: kept dims become rows (by a
/// transposing copy when the reduced dims are not already the trailing ones).
fn reduce(
    gpu: &Gpu,
    kind: ReduceKind,
    x: &GpuTensor,
    reduced: &[usize],
    ty: &TensorType,
) -> Result<Option<GpuTensor>, CudaError> {
    let name = match kind {
        ReduceKind::Sum => "sum",
        ReduceKind::Mean => "mean",
        ReduceKind::Max => "max",
        ReduceKind::Min => "min",
        ReduceKind::Prod => return Ok(None),
    };
    let rank = x.shape.len();
    let kept: Vec<usize> = (0..rank).filter(|a| !reduced.contains(a)).collect();
    let cols = reduced.iter().map(|&a| x.shape[a]).product::<usize>() as i64;
    let rows_n = kept.iter().map(|&a| x.shape[a]).product::<usize>() as i64;
    let trailing = reduced
        .iter()
        .enumerate()
        .all(|(i, &a)| a == rank - reduced.len() + i);
    let moved;
    let input = if trailing {
        x
    } else {
        let order: Vec<usize> = kept.iter().chain(reduced).copied().collect();
        let dims: Vec<usize> = order.iter().map(|&a| x.shape[a]).collect();
        let own = strides(&x.shape);
        let s: Vec<i64> = order.iter().map(|&a| own[a]).collect();
        let (Some(iv), Some(ov)) = (View::new(&dims, &s), View::contiguous(&dims)) else {
            return Ok(None);
        };
        moved = allocate(&gpu.stream, x.dtype, x.storage, dims, false)?;
        gpu.copy_view(&moved, ov, x, iv, x.numel())?;
        &moved
    };
    let y = gpu.output(ty)?;
    let (py, px) = (gpu.ptr(&y), gpu.ptr(input));
    launch!(
        gpu,
        format!("reduce_rows_{name}_{}", suffix(x)),
        rows(rows_n as usize),
        py,
        px,
        rows_n,
        cols
    )?;
    Ok(Some(y))
}

/// The operands of a flash-attention call.
struct Flash<'a> {
    q: &'a GpuTensor,
    k: &'a GpuTensor,
    v: &'a GpuTensor,
    mask: FlashMask,
    scale: f32,
    causal: i32,
    dims: [i32; 6],
    /// The queries' positions under a causal mask (0 for none: query `i` at `i`).
    positions: u64,
}

/// A mask operand as the flash kernels read it (`FlashMask` in
/// attention.cu): a float pointer or a bool pointer (0 for none), element
/// strides over (batch, query head, query, key), and the keys it covers.
#[derive(Clone, Copy, Default)]
struct FlashMask {
    float: u64,
    bool: u64,
    strides: [i64; 4],
    len: i32,
}

impl FlashMask {
    /// `mask` broadcast to scores `[b, hq, sq, len]` (`len` its last dim,
    /// at most `sk`); `None` for shapes that do not broadcast.
    fn of(gpu: &Gpu, mask: &GpuTensor, scores: [usize; 4]) -> Option<FlashMask> {
        let (st, len) = mask_strides(&mask.shape, scores)?;
        let p = gpu.ptr(mask);
        let (float, bool) = match mask.storage {
            Storage::Bool => (0, p),
            s if s == gpu.float() => (p, 0),
            _ => return None,
        };
        Some(FlashMask {
            float,
            bool,
            strides: st,
            len: i32::try_from(len).ok()?,
        })
    }
}

/// Element strides of a contiguous mask of `shape` broadcast to scores
/// `[b, hq, sq, len]` (0 along broadcast dims), `len` being its last dim,
/// with `len`; `None` unless the mask has rank 1 to 4, `len ≤ sk` and every
/// other dim is 1 or the scores'.
fn mask_strides(shape: &[usize], [b, hq, sq, sk]: [usize; 4]) -> Option<([i64; 4], usize)> {
    let rank = shape.len();
    let len = *shape.last()?;
    if rank > 4 || len > sk {
        return None;
    }
    let target = [b, hq, sq, len];
    let own = strides(shape);
    let mut st = [0i64; 4];
    for (d, (&n, &s)) in shape.iter().zip(&own).enumerate() {
        let at = d + 4 - rank;
        match n {
            1 => {}
            n if n == target[at] => st[at] = s,
            _ => return None,
        }
    }
    Some((st, len))
}

/// Launches flash kernel `$name` with its own pointers `$arg`, then what
/// every flash kernel takes after them from `$flash`: the mask
/// (`FLASH_MASK_PARAMS` in attention.cu), `B, Hq, Hk, Sq, Sk, D`, `scale`,
/// `causal` and the query positions, in that order.
macro_rules! launch_flash {
    ($gpu:expr, $name:expr, $cfg:expr, $flash:expr; $($arg:expr),* $(,)?) => {{
        let flash: &Flash = $flash;
        let FlashMask {
            float: mf,
            bool: mb,
            strides: [msb, msh, msq, msk],
            len: mlen,
        } = flash.mask;
        let [b, hq, hk, sq, sk, d] = flash.dims;
        let (scale, causal, positions) = (flash.scale, flash.causal, flash.positions);
        launch!(
            $gpu, $name, $cfg, $($arg,)* mf, mb, msb, msh, msq, msk, mlen, b, hq, hk, sq, sk, d, scale, causal,
            positions
        )
    }};
}

impl<'a> Flash<'a> {
    /// `None` when the shapes (or the mask, operand `mask_at`, or the query
    /// positions after it) are outside the kernel's range (then the host
    /// runs the node).
    fn of(
        gpu: &Gpu,
        args: &[Option<&'a GpuTensor>],
        scale: Option<f64>,
        causal: bool,
        mask_at: usize,
    ) -> Option<Flash<'a>> {
        let float = |i: usize| super::float_arg(args, i);
        let (q, k, v) = (float(0)?, float(1)?, float(2)?);
        if q.shape.len() != 4 || k.shape.len() != 4 || v.shape != k.shape {
            return None;
        }
        let [b, hq, sq, d] = [q.shape[0], q.shape[1], q.shape[2], q.shape[3]];
        let [bk, hk, sk, dk] = [k.shape[0], k.shape[1], k.shape[2], k.shape[3]];
        if b != bk || d != dk || hk == 0 || hq % hk != 0 || d > FLASH_MAX_HEAD_DIM as usize {
            return None;
        }
        // Empty sequences and grids past the launch limit go to the host.
        if [b, hq, sq, sk, d].contains(&0) || b * hq > 65_535 {
            return None;
        }
        let mask = match args.get(mask_at).copied().flatten() {
            Some(m) => FlashMask::of(gpu, m, [b, hq, sq, sk])?,
            None => FlashMask::default(),
        };
        let positions = match args.get(mask_at + 1).copied().flatten() {
            Some(p) if p.storage == Storage::I64 && p.shape == [sq] => gpu.ptr(p),
            Some(_) => return None,
            None => 0,
        };
        let scale = scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32;
        let dims = [b, hq, hk, sq, sk, d].map(|x| x as i32);
        Some(Flash {
            q,
            k,
            v,
            mask,
            scale,
            causal: i32::from(causal),
            dims,
            positions,
        })
    }

    fn config(&self, block: usize, seq: i32) -> LaunchConfig {
        let [b, hq, ..] = self.dims;
        LaunchConfig {
            grid_dim: ((seq as usize).div_ceil(block) as u32, (b * hq) as u32, 1),
            block_dim: (FLASH_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The output and the rows' softmax statistics (for the backward pass).
    fn forward(&self, gpu: &Gpu, ty: &TensorType) -> Result<(GpuTensor, GpuTensor), CudaError> {
        let [b, hq, _, sq, _, _] = self.dims;
        let o = gpu.output(ty)?;
        let stats = scratch(gpu, vec![(b * hq * sq) as usize, 2], false)?;
        let (po, pl, pq, pk, pv) = (
            gpu.ptr(&o),
            gpu.ptr(&stats),
            gpu.ptr(self.q),
            gpu.ptr(self.k),
            gpu.ptr(self.v),
        );
        let k = format!("flash_attn_fwd_{}", suffix(self.q));
        let config = self.config(FLASH_BLOCK_Q as usize, sq);
        launch_flash!(gpu, k, config, self; po, pl, pq, pk, pv)?;
        Ok((o, stats))
    }

    /// (dq, dk, dv): the forward pass again for the output and statistics,
    /// the rows' `Σ o·dO`, then the tiled backward into f32 accumulators.
    fn backward(&self, gpu: &Gpu, dout: &GpuTensor, out: &[TensorType]) -> Result<Vec<GpuTensor>, CudaError> {
        let [b, hq, _, sq, sk, d] = self.dims;
        let (o, stats) = self.forward(gpu, &out[0])?;
        let rows_n = (b * hq * sq) as i64;
        let delta = scratch(gpu, vec![rows_n as usize], false)?;
        let (pdelta, po, pdo) = (gpu.ptr(&delta), gpu.ptr(&o), gpu.ptr(dout));
        let pre = format!("flash_attn_bwd_pre_{}", suffix(self.q));
        // One warp per row.
        launch!(gpu, pre, grid(rows_n as usize * 32), pdelta, po, pdo, rows_n, d)?;
        let dq = scratch(gpu, self.q.shape.clone(), true)?;
        let dk = scratch(gpu, self.k.shape.clone(), true)?;
        let dv = scratch(gpu, self.v.shape.clone(), true)?;
        let (pdq, pdk, pdv) = (gpu.ptr(&dq), gpu.ptr(&dk), gpu.ptr(&dv));
        let (pq, pk, pv, pl) = (gpu.ptr(self.q), gpu.ptr(self.k), gpu.ptr(self.v), gpu.ptr(&stats));
        let k = format!("flash_attn_bwd_{}", suffix(self.q));
        let config = self.config(FLASH_BLOCK_K as usize, sk);
        launch_flash!(gpu, k, config, self; pdq, pdk, pdv, pq, pk, pv, pdo, pl, pdelta)?;
        Ok(vec![
            finish(gpu, dq, &out[0])?,
            finish(gpu, dk, &out[1])?,
            finish(gpu, dv, &out[2])?,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::mask_strides;

    /// Masks broadcast to the scores `[b=2, hq=4, sq=5, sk=6]` as the
    /// reference broadcasts them (right-aligned, size-1 dims repeat).
    #[test]
    fn mask_strides_broadcast_like_the_reference() {
        let scores = [2, 4, 5, 6];
        assert_eq!(mask_strides(&[2, 1, 5, 6], scores), Some(([30, 0, 6, 1], 6)));
        assert_eq!(mask_strides(&[5, 6], scores), Some(([0, 0, 6, 1], 6)));
        assert_eq!(mask_strides(&[2, 4, 1, 6], scores), Some(([24, 6, 0, 1], 6)));
        // A mask shorter than the keys covers the first keys.
        assert_eq!(mask_strides(&[1, 5, 3], scores), Some(([0, 0, 3, 1], 3)));
        assert_eq!(mask_strides(&[6], scores), Some(([0, 0, 0, 1], 6)));
        assert_eq!(mask_strides(&[1, 1, 1, 1], scores), Some(([0, 0, 0, 0], 1)));
        // Longer than the keys, a dim that is neither 1 nor the scores', rank 5, rank 0.
        assert_eq!(mask_strides(&[5, 7], scores), None);
        assert_eq!(mask_strides(&[3, 5, 6], scores), None);
        assert_eq!(mask_strides(&[1, 2, 4, 5, 6], scores), None);
        assert_eq!(mask_strides(&[], scores), None);
    }
}

//! Element-wise ops and data movement: unary and broadcast binary
//! functions, `Where`, float casts, reshapes (aliases), transposes,
//! expands, concatenations and splits (strided copies).

use super::{grid, launch, Gpu};
use crate::module::{row_major_strides as strides, View};
use crate::tensor::{GpuTensor, Storage};
use crate::CudaError;
use autopar_ir::{BinaryOp, DType, Op, TensorType, UnaryOp};

fn unary_name(f: UnaryOp) -> Option<&'static str> {
    Some(match f {
        UnaryOp::Neg => "neg",
        UnaryOp::Abs => "abs",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Reciprocal => "reciprocal",
        UnaryOp::Exp => "exp",
        UnaryOp::Log => "log",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Erf => "erf",
        UnaryOp::Sigmoid => "sigmoid",
        UnaryOp::Sin => "sin",
        UnaryOp::Cos => "cos",
        UnaryOp::Relu => "relu",
        UnaryOp::Identity => "identity",
        UnaryOp::Not | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Sign => return None,
    })
}

fn binary_name(f: BinaryOp) -> Option<&'static str> {
    Some(match f {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Pow => "pow",
        BinaryOp::Mod => "mod",
        BinaryOp::Fmod => "fmod",
        BinaryOp::Max => "max",
        BinaryOp::Min => "min",
        _ => return None,
    })
}

/// The outputs of a node, or `None` to run it on the host.
type Outputs = Result<Option<Vec<GpuTensor>>, CudaError>;

/// Aliases the shape-only ops and free casts; routes the rest to a launcher
/// or copier below, one per op.
pub(super) fn eval(gpu: &Gpu, op: &Op, args: &[Option<&GpuTensor>], out: &[TensorType]) -> Outputs {
    let Some(x) = args.first().copied().flatten() else {
        return Ok(None);
    };
    let ty = &out[0];
    match op {
        // Shape-only ops alias the input buffer.
        Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } => {
            Ok(Some(vec![x.alias(ty.dtype, super::fixed(ty)?)]))
        }
        Op::Unary {
            func: UnaryOp::Identity,
        } => Ok(Some(vec![x.alias(ty.dtype, x.shape.clone())])),
        // A float cast is free when the stored type already rounds as the
        // target does (f32 storage to f32/f64; bf16 storage to anything wider).
        Op::Cast { to, .. } if casts_exactly(x.storage, *to) => Ok(Some(vec![x.alias(*to, x.shape.clone())])),
        Op::Unary { func } if x.storage.is_float() => unary(gpu, x, ty, *func),
        // Add, Mul, Max and Min may have more than two operands (the host folds them).
        Op::Binary { func } if args.len() == 2 => binary(gpu, x, args, ty, *func),
        Op::Where => select(gpu, x, args, ty),
        // Data movement below copies float tensors only (integer and boolean
        // ones are small index or mask tensors; the host moves them).
        Op::Transpose { .. } | Op::Expand | Op::Concat { .. } | Op::Split { .. }
            if !args.iter().flatten().all(|t| t.storage.is_float()) =>
        {
            Ok(None)
        }
        Op::Transpose { perm } => transpose(gpu, x, ty, perm.as_deref()),
        Op::Expand => expand(gpu, x, ty),
        Op::Concat { axis } => concat(gpu, args, ty, *axis),
        Op::Split { axis, .. } => split(gpu, x, out, *axis),
        // Operands the kernels above do not take, and the other modules' ops.
        Op::Unary { .. } | Op::Binary { .. } | Op::Cast { .. } => Ok(None),
        linalg_ops!() | fused_ops!() | conv_ops!() | host_ops!() => Ok(None),
    }
}

/// A float unary function with a kernel (the others run on the host).
fn unary(gpu: &Gpu, x: &GpuTensor, ty: &TensorType, func: UnaryOp) -> Outputs {
    Ok(match unary_name(func) {
        Some(name) => {
            let y = gpu.output(ty)?;
            let (o, i, n) = (gpu.ptr(&y), gpu.ptr(x), x.numel() as i64);
            launch!(
                gpu,
                format!("unary_{name}_{}", x.storage.suffix()),
                grid(x.numel()),
                o,
                i,
                n
            )?;
            Some(vec![y])
        }
        None => None,
    })
}

/// A broadcast float binary function of `x` and operand 1.
fn binary(gpu: &Gpu, x: &GpuTensor, args: &[Option<&GpuTensor>], ty: &TensorType, func: BinaryOp) -> Outputs {
    let (Some(name), Some(b)) = (binary_name(func), args.get(1).copied().flatten()) else {
        return Ok(None);
    };
    if !x.storage.is_float() || !b.storage.is_float() {
        return Ok(None);
    }
    let y = gpu.output(ty)?;
    let (Some(av), Some(bv)) = (
        View::broadcast(&x.shape, &y.shape),
        View::broadcast(&b.shape, &y.shape),
    ) else {
        return Ok(None);
    };
    let (o, pa, pb, n) = (gpu.ptr(&y), gpu.ptr(x), gpu.ptr(b), y.numel() as i64);
    let kernel = format!("binary_{name}_{}", y.storage.suffix());
    launch!(gpu, kernel, grid(y.numel()), o, pa, av, pb, bv, n)?;
    Ok(Some(vec![y]))
}

/// `Where`: condition `x` picks operand 1 or 2, all three broadcast.
fn select(gpu: &Gpu, x: &GpuTensor, args: &[Option<&GpuTensor>], ty: &TensorType) -> Outputs {
    let arg = |i: usize| args.get(i).copied().flatten();
    let (Some(a), Some(b)) = (arg(1), arg(2)) else {
        return Ok(None);
    };
    if !a.storage.is_float() || !b.storage.is_float() {
        return Ok(None);
    }
    let y = gpu.output(ty)?;
    let views = (
        View::broadcast(&x.shape, &y.shape),
        View::broadcast(&a.shape, &y.shape),
        View::broadcast(&b.shape, &y.shape),
    );
    let (Some(cv), Some(av), Some(bv)) = views else {
        return Ok(None);
    };
    let (o, pc, pa, pb, n) = (gpu.ptr(&y), gpu.ptr(x), gpu.ptr(a), gpu.ptr(b), y.numel() as i64);
    let kernel = format!("where_{}", y.storage.suffix());
    launch!(gpu, kernel, grid(y.numel()), o, pc, cv, pa, av, pb, bv, n)?;
    Ok(Some(vec![y]))
}

/// `Transpose` by a strided copy (no `perm` reverses the axes).
fn transpose(gpu: &Gpu, x: &GpuTensor, ty: &TensorType, perm: Option<&[usize]>) -> Outputs {
    let rank = x.shape.len();
    let perm: Vec<usize> = perm
        .map(<[usize]>::to_vec)
        .unwrap_or_else(|| (0..rank).rev().collect());
    let own = strides(&x.shape);
    let y = gpu.output(ty)?;
    let s: Vec<i64> = perm.iter().map(|&p| own[p]).collect();
    let (Some(iv), Some(ov)) = (View::new(&y.shape, &s), View::contiguous(&y.shape)) else {
        return Ok(None);
    };
    gpu.copy_view(&y, ov, x, iv, y.numel())?;
    Ok(Some(vec![y]))
}

/// `Expand` by a broadcasting copy.
fn expand(gpu: &Gpu, x: &GpuTensor, ty: &TensorType) -> Outputs {
    let y = gpu.output(ty)?;
    let (Some(iv), Some(ov)) = (View::broadcast(&x.shape, &y.shape), View::contiguous(&y.shape)) else {
        return Ok(None);
    };
    gpu.copy_view(&y, ov, x, iv, y.numel())?;
    Ok(Some(vec![y]))
}

/// `Concat`: each operand copied into its window of the output along `axis`.
fn concat(gpu: &Gpu, args: &[Option<&GpuTensor>], ty: &TensorType, axis: i64) -> Outputs {
    let y = gpu.output(ty)?;
    let axis = norm(axis, y.shape.len());
    let out_strides = strides(&y.shape);
    let mut at = 0usize;
    for piece in args.iter().flatten() {
        let Some(ov) = View::new(&piece.shape, &out_strides) else {
            return Ok(None);
        };
        let Some(iv) = View::contiguous(&piece.shape) else {
            return Ok(None);
        };
        let offset = at as i64 * out_strides[axis] * y.storage.size() as i64;
        let window = y.offset_view(offset as u64);
        gpu.copy_view(&window, ov, piece, iv, piece.numel())?;
        at += piece.shape[axis];
    }
    Ok(Some(vec![y]))
}

/// `Split`: each output copied from its window of `x` along `axis`.
fn split(gpu: &Gpu, x: &GpuTensor, out: &[TensorType], axis: i64) -> Outputs {
    let axis = norm(axis, x.shape.len());
    let in_strides = strides(&x.shape);
    let mut at = 0usize;
    let mut outs = Vec::with_capacity(out.len());
    for t in out {
        let y = gpu.output(t)?;
        let (Some(ov), Some(iv)) = (View::contiguous(&y.shape), View::new(&y.shape, &in_strides)) else {
            return Ok(None);
        };
        let offset = at as i64 * in_strides[axis] * x.storage.size() as i64;
        gpu.copy_view(&y, ov, &x.offset_view(offset as u64), iv, y.numel())?;
        at += y.shape[axis];
        outs.push(y);
    }
    Ok(Some(outs))
}

/// Whether casting values stored as `storage` to `to` leaves them unchanged.
fn casts_exactly(storage: Storage, to: DType) -> bool {
    match storage {
        Storage::F32 => matches!(to, DType::F32 | DType::F64),
        Storage::Bf16 => matches!(to, DType::Bf16 | DType::F32 | DType::F64),
        _ => false,
    }
}

/// A possibly negative axis as an index.
pub(crate) fn norm(axis: i64, rank: usize) -> usize {
    if axis < 0 {
        (axis + rank as i64) as usize
    } else {
        axis as usize
    }
}

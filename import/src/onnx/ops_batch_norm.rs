//! ONNX BatchNormalization from ops that have every facet already (means,
//! element-wise arithmetic): `y = (x − μ) / √(σ² + ε) · scale + bias` per
//! channel (dim 1).
//!
//! - Inference form (`training_mode = 0`, what an exporter writes for a
//!   model in eval mode): μ and σ² are the running statistics. They are
//!   buffers, not parameters: they are neither counted nor trained, so such
//!   a model trains with frozen statistics, as PyTorch fine-tunes a model
//!   in `eval()` mode.
//! - Training form (`training_mode = 1`): μ and σ² (biased) are the batch's,
//!   over every dim but the channels, and the optional outputs are the
//!   updated running statistics `running · momentum + batch · (1 − momentum)`.
//!   Under data parallelism each rank normalises by its own micro-batch's
//!   statistics (PyTorch's `BatchNorm` under DDP, not `SyncBatchNorm`), so a
//!   parallel run equals one device running the same micro-batches.

use super::import::Builder;
use super::ops::{float_scalar, ints_const, std_dev, sub_node, NodeCtx};
use super::OnnxError;
use autopar_ir::op::{BinaryOp, Op, ReduceKind};
use autopar_ir::TensorId;

fn binary(func: BinaryOp) -> Op {
    Op::Binary { func }
}

pub(crate) fn batch_norm(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let x = n.required(0)?;
    let (scale, bias, mean, var) = (n.required(1)?, n.required(2)?, n.required(3)?, n.required(4)?);
    let ty = b.ty(x).clone();
    let rank = ty.shape.rank();
    if rank < 2 {
        return Err(n.error(format!(
            "input must be [batch, channels, ...], got shape {}",
            ty.shape
        )));
    }
    let epsilon = f64::from(n.attrs.float_or("epsilon", 1e-5)?);
    let momentum = f64::from(n.attrs.float_or("momentum", 0.9)?);
    let training = n.attrs.flag("training_mode", false)?;
    // Per-channel operands as [C, 1, …] to broadcast over [N, C, …].
    let mut shape = vec![-1i64];
    shape.extend(std::iter::repeat_n(1, rank - 2));
    let channel_shape = ints_const(b, n, "channel_shape", shape)?;
    let per_channel = |b: &mut Builder, t: TensorId, name: &str| {
        sub_node(
            b,
            n,
            name,
            Op::Reshape { allowzero: false },
            vec![Some(t), Some(channel_shape)],
        )
    };
    let (centred, variance) = if training {
        let axes: Vec<i64> = std::iter::once(0).chain(2..rank as i64).collect();
        let axes = ints_const(b, n, "axes", axes)?;
        let mean_of = |b: &mut Builder, t: TensorId, name: &str, keepdims: bool| {
            let op = Op::Reduce {
                kind: ReduceKind::Mean,
                axes: None,
                keepdims,
                noop_with_empty_axes: false,
            };
            sub_node(b, n, name, op, vec![Some(t), Some(axes)])
        };
        let batch_mean = mean_of(b, x, "batch_mean", true)?;
        let centred = sub_node(
            b,
            n,
            "centred",
            binary(BinaryOp::Sub),
            vec![Some(x), Some(batch_mean)],
        )?;
        let square = sub_node(
            b,
            n,
            "square",
            binary(BinaryOp::Mul),
            vec![Some(centred), Some(centred)],
        )?;
        let batch_var = mean_of(b, square, "batch_var", true)?;
        // The running statistics' update, for the outputs that ask for it.
        let outputs = n.outputs();
        for (slot, running, batch, name) in [
            (1, mean, batch_mean, "running_mean"),
            (2, var, batch_var, "running_var"),
        ] {
            let Some(out) = outputs.get(slot).filter(|o| !o.is_empty()) else {
                continue;
            };
            let flat = ints_const(b, n, &format!("{name}_shape"), vec![-1])?;
            let batch = sub_node(
                b,
                n,
                &format!("{name}_batch"),
                Op::Reshape { allowzero: false },
                vec![Some(batch), Some(flat)],
            )?;
            let keep = b.constant(
                &n.sub(&format!("{name}_momentum")),
                "",
                float_scalar(ty.dtype, momentum),
            )?;
            let take = b.constant(
                &n.sub(&format!("{name}_rate")),
                "",
                float_scalar(ty.dtype, 1.0 - momentum),
            )?;
            let kept = sub_node(
                b,
                n,
                &format!("{name}_kept"),
                binary(BinaryOp::Mul),
                vec![Some(running), Some(keep)],
            )?;
            let taken = sub_node(
                b,
                n,
                &format!("{name}_taken"),
                binary(BinaryOp::Mul),
                vec![Some(batch), Some(take)],
            )?;
            b.emit(
                &n.sub(name),
                n.attrs.op_type(),
                binary(BinaryOp::Add),
                vec![Some(kept), Some(taken)],
                &[out],
            )?;
        }
        (centred, batch_var)
    } else {
        b.freeze(mean);
        b.freeze(var);
        let mean = per_channel(b, mean, "mean")?;
        let centred = sub_node(b, n, "centred", binary(BinaryOp::Sub), vec![Some(x), Some(mean)])?;
        (centred, per_channel(b, var, "var")?)
    };
    let std = std_dev(b, n, variance, float_scalar(ty.dtype, epsilon))?;
    let normed = sub_node(
        b,
        n,
        "normed",
        binary(BinaryOp::Div),
        vec![Some(centred), Some(std)],
    )?;
    let scale = per_channel(b, scale, "scale")?;
    let scaled = sub_node(
        b,
        n,
        "scaled",
        binary(BinaryOp::Mul),
        vec![Some(normed), Some(scale)],
    )?;
    let bias = per_channel(b, bias, "bias")?;
    let y = n.outputs().first().copied().unwrap_or_default();
    b.emit(
        n.name(),
        n.attrs.op_type(),
        binary(BinaryOp::Add),
        vec![Some(scaled), Some(bias)],
        &[y],
    )?;
    Ok(())
}

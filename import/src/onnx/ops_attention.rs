//! ONNX Attention-23 and RotaryEmbedding-23. Attention maps to the canonical
//! [`Op::Attention`] on 4-D `[batch, heads, seq, head_dim]` operands; the 3-D
//! form `[batch, seq, heads·head_dim]` is split into heads around it.

use super::import::Builder;
use super::ops::{ints_const, pass, single, sub_node, NodeCtx};
use super::OnnxError;
use autopar_ir::op::Op;
use autopar_ir::TensorId;

/// `[b, s, h·d]` → `[b, h, s, d]`.
fn split_heads(
    b: &mut Builder,
    n: &NodeCtx,
    tag: &str,
    x: TensorId,
    heads: usize,
) -> Result<TensorId, OnnxError> {
    let shape = ints_const(b, n, &format!("{tag}_shape"), vec![0, 0, heads as i64, -1])?;
    let split = sub_node(
        b,
        n,
        &format!("{tag}_split"),
        Op::Reshape { allowzero: false },
        vec![Some(x), Some(shape)],
    )?;
    let perm = Some(vec![0, 2, 1, 3]);
    sub_node(
        b,
        n,
        &format!("{tag}_heads"),
        Op::Transpose { perm },
        vec![Some(split)],
    )
}

/// ONNX `Attention` (opset 23) without KV cache, softcap or extra outputs.
pub(crate) fn attention(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    if (4..7).any(|i| n.input(i).is_some()) {
        return Err(n.error("past_key/past_value/nonpad_kv_seqlen inputs are not supported"));
    }
    let softcap = n.attrs.float_or("softcap", 0.0)?;
    if softcap != 0.0 {
        return Err(n.error(format!("softcap = {softcap} is not supported")));
    }
    for window in ["left_window_size", "right_window_size"] {
        let w = n.attrs.int_or(window, -1)?;
        if w >= 0 {
            return Err(n.error(format!("{window} = {w} (sliding window) is not supported")));
        }
    }
    // Precision hints, and the mode of the (unsupported) qk_matmul output.
    n.attrs.ignore(&["softmax_precision", "qk_matmul_output_mode"]);
    let op = Op::Attention {
        scale: n.attrs.float("scale")?.map(f64::from),
        causal: n.attrs.flag("is_causal", false)?,
    };
    let (q, k, v, mask) = (n.required(0)?, n.required(1)?, n.required(2)?, n.input(3));
    match b.ty(q).shape.rank() {
        4 => {
            n.attrs.ignore(&["q_num_heads", "kv_num_heads"]);
            single(b, n, op, vec![Some(q), Some(k), Some(v), mask])
        }
        3 => {
            let heads = |attr| match n.attrs.usize_or(attr, 0)? {
                0 => Err(n.error(format!("3-D inputs need the '{attr}' attribute"))),
                h => Ok(h),
            };
            let (hq, hk) = (heads("q_num_heads")?, heads("kv_num_heads")?);
            let q4 = split_heads(b, n, "q", q, hq)?;
            let k4 = split_heads(b, n, "k", k, hk)?;
            let v4 = split_heads(b, n, "v", v, hk)?;
            let y4 = sub_node(b, n, "attention", op, vec![Some(q4), Some(k4), Some(v4), mask])?;
            let perm = Some(vec![0, 2, 1, 3]);
            let y = sub_node(b, n, "merge", Op::Transpose { perm }, vec![Some(y4)])?;
            let shape = ints_const(b, n, "y_shape", vec![0, 0, -1])?;
            single(b, n, Op::Reshape { allowzero: false }, vec![Some(y), Some(shape)])
        }
        r => Err(n.error(format!("query of rank {r} is not supported (3-D or 4-D)"))),
    }
}

/// ONNX `RotaryEmbedding` (opset 23): `(x, cos_cache, sin_cache, position_ids?)`.
pub(crate) fn rotary(b: &mut Builder, n: &NodeCtx) -> Result<(), OnnxError> {
    let op = Op::RotaryEmbedding {
        interleaved: n.attrs.flag("interleaved", false)?,
        rotary_dim: n.attrs.usize_or("rotary_embedding_dim", 0)?,
        num_heads: n.attrs.usize_or("num_heads", 0)?,
    };
    pass(b, n, op)
}

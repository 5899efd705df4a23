//! Llama decoders (RMSNorm, rotary positions, grouped-query attention,
//! SwiGLU MLP, no biases) and their Mixtral-style MoE variant, whose MLP is
//! a top-k router over gated SiLU experts. Names follow HF without the
//! `model.` prefix: `embed_tokens`, `layers.{i}.input_layernorm`,
//! `layers.{i}.self_attn.{q,k,v,o}_proj`, `layers.{i}.mlp.{gate,up,down}_proj`
//! or `layers.{i}.block_sparse_moe.{gate,router,experts}` (expert weights
//! stacked as `experts.w1` gate `[e, h, f]`, `experts.w3` up `[e, h, f]`,
//! `experts.w2` down `[e, f, h]`, as in Mixtral), `norm`, `lm_head`.

use super::builder::Builder;
use super::layers::{Heads, Rope};
use super::spec::{LlamaConfig, MoeConfig};
use autopar_ir::op::{Activation, Op, TensorType};
use autopar_ir::{BinaryOp, DType, Graph, GraphError, TensorId};

/// RMSNorm epsilon of Llama 2/3 and Mixtral.
const EPSILON: f64 = 1e-5;

/// The graph of `c`; outputs logits `[batch, seq, vocab]`.
pub(super) fn build(c: &LlamaConfig, name: &str) -> Result<Graph, GraphError> {
    let mut b = Builder::new(name, c.dtype, c.batch, c.seq);
    let ids = b.ids_input("input_ids");
    let positions = b.ids_input("position_ids");
    let heads = Heads {
        q: c.heads,
        kv: c.kv_heads,
        dim: c.hidden / c.heads,
    };
    let rope = Rope::new(&mut b, c.seq, heads.dim, positions);
    let (table, mut x) = b.embedding("embed_tokens", ids, c.vocab, c.hidden)?;
    for i in 0..c.layers {
        b.begin_block();
        x = layer(&mut b, c, &heads, &rope, &format!("layers.{i}"), x)?;
        b.end_block();
    }
    let x = b.rms_norm("norm", x, c.hidden, EPSILON)?;
    let logits = b.lm_head(x, c.hidden, c.vocab, c.tied.then_some(table))?;
    Ok(b.finish(vec![logits]))
}

/// One decoder layer named `p` (`layers.3`).
fn layer(
    b: &mut Builder,
    c: &LlamaConfig,
    heads: &Heads,
    rope: &Rope,
    p: &str,
    x: TensorId,
) -> Result<TensorId, GraphError> {
    let h = c.hidden;
    let kv_width = heads.kv * heads.dim;
    let normed = b.rms_norm(&format!("{p}.input_layernorm"), x, h, EPSILON)?;
    let q = b.linear(&format!("{p}.self_attn.q_proj"), normed, h, h, false)?;
    let k = b.linear(&format!("{p}.self_attn.k_proj"), normed, h, kv_width, false)?;
    let v = b.linear(&format!("{p}.self_attn.v_proj"), normed, h, kv_width, false)?;
    let attn = b.attention(&format!("{p}.self_attn"), [q, k, v], heads, true, Some(rope))?;
    let out = b.linear(&format!("{p}.self_attn.o_proj"), attn, h, h, false)?;
    let x = b.binary(&format!("{p}.attn_residual"), BinaryOp::Add, x, out, h)?;
    let normed = b.rms_norm(&format!("{p}.post_attention_layernorm"), x, h, EPSILON)?;
    let mlp = match &c.moe {
        None => swiglu(b, &format!("{p}.mlp"), normed, h, c.ffn)?,
        Some(m) => experts(b, &format!("{p}.block_sparse_moe"), normed, c, m)?,
    };
    b.binary(&format!("{p}.mlp_residual"), BinaryOp::Add, x, mlp, h)
}

/// `down(silu(gate(x)) ⊙ up(x))`.
fn swiglu(b: &mut Builder, p: &str, x: TensorId, h: usize, ffn: usize) -> Result<TensorId, GraphError> {
    let gate = b.linear(&format!("{p}.gate_proj"), x, h, ffn, false)?;
    let act = b.unary(&format!("{p}.act"), Op::Silu, gate, ffn)?;
    let up = b.linear(&format!("{p}.up_proj"), x, h, ffn, false)?;
    let prod = b.binary(&format!("{p}.mul"), BinaryOp::Mul, act, up, ffn)?;
    b.linear(&format!("{p}.down_proj"), prod, ffn, h, false)
}

/// Router logits → top-k weights and indices → gated SiLU experts.
fn experts(
    b: &mut Builder,
    p: &str,
    x: TensorId,
    c: &LlamaConfig,
    m: &MoeConfig,
) -> Result<TensorId, GraphError> {
    let (h, f, e) = (c.hidden, c.ffn, m.experts);
    let logits = b.linear(&format!("{p}.gate"), x, h, e, false)?;
    let routed = vec![
        (format!("{p}.routing_weights"), b.token_type(&[m.top_k])),
        (
            format!("{p}.selected_experts"),
            TensorType {
                dtype: DType::I64,
                shape: b.tokens(&[m.top_k]),
            },
        ),
    ];
    let router = Op::MoeRouter { top_k: m.top_k };
    let routed = b.node(&format!("{p}.router"), router, &[Some(logits)], routed)?;
    let gate = b.param(format!("{p}.experts.w1"), &[e, h, f]);
    let down = b.param(format!("{p}.experts.w2"), &[e, f, h]);
    let up = b.param(format!("{p}.experts.w3"), &[e, h, f]);
    let op = Op::MoeExperts {
        activation: Activation::Silu,
        sources: 1,
    };
    let inputs = [x, routed[0], routed[1], up, down, gate];
    let ty = b.token_type(&[h]);
    b.op(&format!("{p}.experts"), op, &inputs, ty)
}

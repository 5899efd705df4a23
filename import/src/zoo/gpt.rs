//! GPT-2/GPT-3/Megatron decoders: learned positions, pre-LayerNorm layers
//! with a fused QKV projection and a GELU(tanh) MLP, biases everywhere.
//! Nodes of layer `i` are `h.{i}.ln_1`, `h.{i}.attn.qkv`, `h.{i}.attn.split`,
//! ..., `h.{i}.mlp.residual`; outside the layers `wte`, `wpe`, `embed.add`,
//! `ln_f` (with `final_norm`) and `lm_head`.

use super::builder::Builder;
use super::layers::Heads;
use super::spec::GptConfig;
use autopar_ir::op::{GeluApprox, Op};
use autopar_ir::{BinaryOp, Graph, GraphError, TensorId};

/// LayerNorm epsilon of GPT-2 and Megatron.
const EPSILON: f64 = 1e-5;

/// The graph of `c`; outputs logits `[batch, seq, vocab]`.
pub(super) fn build(c: &GptConfig, name: &str) -> Result<Graph, GraphError> {
    let mut b = Builder::new(name, c.dtype, c.batch, c.seq);
    let ids = b.ids_input("input_ids");
    let positions = b.ids_input("position_ids");
    let (wte, tokens) = b.embedding("wte", ids, c.vocab, c.hidden)?;
    let (_, places) = b.embedding("wpe", positions, c.seq, c.hidden)?;
    let mut x = b.binary("embed.add", BinaryOp::Add, tokens, places, c.hidden)?;
    let heads = Heads {
        q: c.heads,
        kv: c.heads,
        dim: c.hidden / c.heads,
    };
    for i in 0..c.layers {
        b.begin_block();
        x = layer(&mut b, c, &heads, &format!("h.{i}"), x)?;
        b.end_block();
    }
    if c.final_norm {
        x = b.layer_norm("ln_f", x, c.hidden, EPSILON)?;
    }
    let logits = b.lm_head(x, c.hidden, c.vocab, c.tied.then_some(wte))?;
    Ok(b.finish(vec![logits]))
}

/// One pre-LayerNorm decoder layer named `p` (`h.3`).
fn layer(
    b: &mut Builder,
    c: &GptConfig,
    heads: &Heads,
    p: &str,
    x: TensorId,
) -> Result<TensorId, GraphError> {
    let h = c.hidden;
    let normed = b.layer_norm(&format!("{p}.ln_1"), x, h, EPSILON)?;
    let qkv = b.linear(&format!("{p}.attn.qkv"), normed, h, 3 * h, true)?;
    let parts = ["q", "k", "v"].map(|r| (format!("{p}.attn.{r}"), b.token_type(&[h])));
    let split = Op::Split {
        axis: -1,
        split: None,
        outputs: 3,
    };
    let qkv = b.node(&format!("{p}.attn.split"), split, &[Some(qkv)], parts.to_vec())?;
    let attn = b.attention(&format!("{p}.attn"), [qkv[0], qkv[1], qkv[2]], heads, true, None)?;
    let proj = b.linear(&format!("{p}.attn.proj"), attn, h, h, true)?;
    let x = b.binary(&format!("{p}.attn.residual"), BinaryOp::Add, x, proj, h)?;
    let normed = b.layer_norm(&format!("{p}.ln_2"), x, h, EPSILON)?;
    let fc = b.linear(&format!("{p}.mlp.fc"), normed, h, c.ffn, true)?;
    let gelu = Op::Gelu {
        approximate: GeluApprox::Tanh,
    };
    let act = b.unary(&format!("{p}.mlp.gelu"), gelu, fc, c.ffn)?;
    let proj = b.linear(&format!("{p}.mlp.proj"), act, c.ffn, h, true)?;
    b.binary(&format!("{p}.mlp.residual"), BinaryOp::Add, x, proj, h)
}

//! BERT encoders (HF `BertModel` without the pooler): word, position and
//! token-type embeddings, post-LayerNorm layers with bidirectional attention
//! and an exact-GELU MLP. Names follow HF without the `bert.` prefix:
//! `embeddings.word_embeddings`, `encoder.layer.{i}.attention.self.query`,
//! `encoder.layer.{i}.attention.output.dense`, `encoder.layer.{i}.intermediate.dense`,
//! `encoder.layer.{i}.output.LayerNorm`, ...

use super::builder::Builder;
use super::layers::Heads;
use super::spec::BertConfig;
use autopar_ir::op::{GeluApprox, Op};
use autopar_ir::{BinaryOp, Graph, GraphError, TensorId};

/// LayerNorm epsilon of BERT.
const EPSILON: f64 = 1e-12;

/// The graph of `c`; outputs the last hidden state `[batch, seq, hidden]`.
pub(super) fn build(c: &BertConfig, name: &str) -> Result<Graph, GraphError> {
    let h = c.hidden;
    let mut b = Builder::new(name, c.dtype, c.batch, c.seq);
    let ids = b.ids_input("input_ids");
    let positions = b.ids_input("position_ids");
    let types = b.ids_input("token_type_ids");
    let (_, words) = b.embedding("embeddings.word_embeddings", ids, c.vocab, h)?;
    let (_, places) = b.embedding("embeddings.position_embeddings", positions, c.seq, h)?;
    let (_, kinds) = b.embedding("embeddings.token_type_embeddings", types, c.type_vocab, h)?;
    let sum = b.binary("embeddings.add_position", BinaryOp::Add, words, places, h)?;
    let sum = b.binary("embeddings.add_token_type", BinaryOp::Add, sum, kinds, h)?;
    let mut x = b.layer_norm("embeddings.LayerNorm", sum, h, EPSILON)?;
    let heads = Heads {
        q: c.heads,
        kv: c.heads,
        dim: h / c.heads,
    };
    for i in 0..c.layers {
        b.begin_block();
        x = layer(&mut b, c, &heads, &format!("encoder.layer.{i}"), x)?;
        b.end_block();
    }
    Ok(b.finish(vec![x]))
}

/// One post-LayerNorm encoder layer named `p` (`encoder.layer.3`).
fn layer(
    b: &mut Builder,
    c: &BertConfig,
    heads: &Heads,
    p: &str,
    x: TensorId,
) -> Result<TensorId, GraphError> {
    let h = c.hidden;
    let q = b.linear(&format!("{p}.attention.self.query"), x, h, h, true)?;
    let k = b.linear(&format!("{p}.attention.self.key"), x, h, h, true)?;
    let v = b.linear(&format!("{p}.attention.self.value"), x, h, h, true)?;
    let attn = b.attention(&format!("{p}.attention.self"), [q, k, v], heads, false, None)?;
    let out = b.linear(&format!("{p}.attention.output.dense"), attn, h, h, true)?;
    let sum = b.binary(
        &format!("{p}.attention.output.residual"),
        BinaryOp::Add,
        out,
        x,
        h,
    )?;
    let x = b.layer_norm(&format!("{p}.attention.output.LayerNorm"), sum, h, EPSILON)?;
    let up = b.linear(&format!("{p}.intermediate.dense"), x, h, c.ffn, true)?;
    let gelu = Op::Gelu {
        approximate: GeluApprox::None,
    };
    let act = b.unary(&format!("{p}.intermediate.gelu"), gelu, up, c.ffn)?;
    let down = b.linear(&format!("{p}.output.dense"), act, c.ffn, h, true)?;
    let sum = b.binary(&format!("{p}.output.residual"), BinaryOp::Add, down, x, h)?;
    b.layer_norm(&format!("{p}.output.LayerNorm"), sum, h, EPSILON)
}

//! Sub-layers the families share: multi-head attention around the canonical
//! `Attention` op (with optional rotary positions and grouped-query heads)
//! and the LM head (tied or not).

use super::builder::{Builder, BATCH, SEQ};
use autopar_ir::op::{Op, TensorType};
use autopar_ir::{Dim, GraphError, Shape, TensorId};

/// Head layout of one attention sub-layer.
pub(super) struct Heads {
    /// Query heads.
    pub q: usize,
    /// Key/value heads (`< q` for grouped-query attention).
    pub kv: usize,
    /// Size of one head.
    pub dim: usize,
}

/// Rotary position inputs shared by every layer: weightless `cos`/`sin`
/// caches of `seq` rows and the `position_ids` graph input.
pub(super) struct Rope {
    cos: TensorId,
    sin: TensorId,
    positions: TensorId,
}

impl Rope {
    /// Adds the caches (`[seq, head_dim/2]`, never materialised) for `positions`.
    pub fn new(b: &mut Builder, seq: usize, head_dim: usize, positions: TensorId) -> Rope {
        Rope {
            cos: b.constant_table("rope.cos_cache", &[seq, head_dim / 2]),
            sin: b.constant_table("rope.sin_cache", &[seq, head_dim / 2]),
            positions,
        }
    }
}

/// `[batch, heads, seq, dim]`.
fn head_major(heads: usize, dim: usize) -> Shape {
    Shape(vec![
        Dim::Sym(BATCH.into()),
        Dim::Fixed(heads),
        Dim::Sym(SEQ.into()),
        Dim::Fixed(dim),
    ])
}

/// The permutation between `[batch, seq, heads, dim]` and `[batch, heads, seq, dim]`.
fn swap_seq_heads() -> Op {
    Op::Transpose {
        perm: Some(vec![0, 2, 1, 3]),
    }
}

impl Builder {
    /// `x[batch, seq, n·d]` → `[batch, n, seq, d]` (Reshape with 0 = copy dim,
    /// so the symbolic dims pass, then Transpose).
    fn split_heads(
        &mut self,
        prefix: &str,
        role: &str,
        x: TensorId,
        n: usize,
        d: usize,
    ) -> Result<TensorId, GraphError> {
        let split = self.reshape_tokens(&format!("{prefix}.{role}_heads"), x, &[n, d])?;
        let ty = TensorType {
            dtype: self.dtype,
            shape: head_major(n, d),
        };
        self.op(
            &format!("{prefix}.{role}_transpose"),
            swap_seq_heads(),
            &[split],
            ty,
        )
    }

    /// Rotates `x[batch, heads, seq, dim]` by its positions.
    fn rotate(
        &mut self,
        name: &str,
        x: TensorId,
        heads: &Heads,
        n: usize,
        rope: &Rope,
    ) -> Result<TensorId, GraphError> {
        let op = Op::RotaryEmbedding {
            interleaved: false,
            rotary_dim: 0,
            num_heads: 0,
        };
        let ty = TensorType {
            dtype: self.dtype,
            shape: head_major(n, heads.dim),
        };
        self.op(name, op, &[x, rope.cos, rope.sin, rope.positions], ty)
    }

    /// Attention of projected `q[batch, seq, heads.q·dim]` and
    /// `k`, `v[batch, seq, heads.kv·dim]`; returns `[batch, seq, heads.q·dim]`.
    pub fn attention(
        &mut self,
        prefix: &str,
        qkv: [TensorId; 3],
        heads: &Heads,
        causal: bool,
        rope: Option<&Rope>,
    ) -> Result<TensorId, GraphError> {
        let [q, k, v] = qkv;
        let mut q = self.split_heads(prefix, "q", q, heads.q, heads.dim)?;
        let mut k = self.split_heads(prefix, "k", k, heads.kv, heads.dim)?;
        let v = self.split_heads(prefix, "v", v, heads.kv, heads.dim)?;
        if let Some(rope) = rope {
            q = self.rotate(&format!("{prefix}.q_rope"), q, heads, heads.q, rope)?;
            k = self.rotate(&format!("{prefix}.k_rope"), k, heads, heads.kv, rope)?;
        }
        let ty = TensorType {
            dtype: self.dtype,
            shape: head_major(heads.q, heads.dim),
        };
        let core = self.op(
            &format!("{prefix}.core"),
            Op::Attention { scale: None, causal },
            &[q, k, v],
            ty,
        )?;
        let ty = self.token_type(&[heads.q, heads.dim]);
        let back = self.op(&format!("{prefix}.out_transpose"), swap_seq_heads(), &[core], ty)?;
        self.reshape_tokens(&format!("{prefix}.merge"), back, &[heads.q * heads.dim])
    }

    /// Logits `[batch, seq, vocab]` from `x[batch, seq, hidden]`: a Linear
    /// with a new `lm_head.weight[hidden, vocab]`, or, when `tied` holds the
    /// embedding table `[vocab, hidden]`, a Linear reading that same
    /// parameter through `lm_head.transpose` (so it is counted once).
    pub fn lm_head(
        &mut self,
        x: TensorId,
        hidden: usize,
        vocab: usize,
        tied: Option<TensorId>,
    ) -> Result<TensorId, GraphError> {
        let weight = match tied {
            Some(table) => {
                let ty = TensorType {
                    dtype: self.dtype,
                    shape: Shape::fixed(&[hidden, vocab]),
                };
                self.op(
                    "lm_head.transpose",
                    Op::Transpose {
                        perm: Some(vec![1, 0]),
                    },
                    &[table],
                    ty,
                )?
            }
            None => self.param("lm_head.weight".into(), &[hidden, vocab]),
        };
        self.linear_with("lm_head", x, weight, vocab, false)
    }
}

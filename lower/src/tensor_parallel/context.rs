//! Context parallelism's own rules: token-wise ops run on the rank's
//! tokens, attention gathers the keys and values of the whole sequence.
//!
//! The rank's tokens are balanced for causal attention, as Megatron-Core
//! cuts them: the sequence is `2·parts` chunks and rank `r` holds chunks `r`
//! and `2·parts − 1 − r`, so each rank's queries see as many keys as any
//! other's. Every move along the sequence goes through that order
//! ([`Rewriter::balanced_comm`]): a slice takes the rank's two chunks, a
//! gather puts every rank's chunks back in sequence order; so everything
//! that reads across tokens sees the sequence as the model does.

use super::{Layout, Rewriter, TpError, WHOLE};
use autopar_ir::{CommGroup, CommKind, Graph, NodeIndex, Op, Role, TensorId, Value};
use std::collections::HashMap;

/// The balanced order's constants by sequence length (`order[k]`: the
/// position at place `k` of the ranks' chunks laid end to end; `inverse`
/// its inverse), and each layer's slice of the order (the rank's positions)
/// by (length, layer): a layer makes its own, so it is made again for its
/// backward pass rather than kept across the step.
#[derive(Default)]
pub(super) struct Orders {
    constants: HashMap<usize, (TensorId, TensorId)>,
    mine: HashMap<(usize, Option<usize>), TensorId>,
}

/// The sequence length context parallelism cuts: dim 1 of the per-token
/// inputs (0 without context parallelism).
pub(super) fn sequence(src: &Graph, per_token: Option<&[String]>) -> Result<usize, TpError> {
    let Some(names) = per_token else {
        return Ok(0);
    };
    let lengths: Vec<(String, usize)> = src
        .inputs
        .iter()
        .map(|&t| src.tensor(t))
        .filter(|t| names.contains(&t.name))
        .map(|t| {
            (
                t.name.clone(),
                t.ty.shape.0.get(1).and_then(|d| d.fixed()).unwrap_or(0),
            )
        })
        .collect();
    match lengths.first() {
        Some((_, n)) if lengths.iter().all(|(_, m)| m == n) => Ok(*n),
        Some(_) => Err(TpError::Node {
            node: lengths[0].0.clone(),
            message: format!("the per-token inputs differ in sequence length: {lengths:?}"),
        }),
        None => Ok(0),
    }
}

/// Rank-major places of the positions of `n` tokens cut into `2·parts`
/// chunks, rank `r` holding chunks `r` and `2·parts − 1 − r`.
fn balanced_order(n: usize, parts: usize) -> Vec<i64> {
    let chunk = n / (2 * parts);
    (0..parts)
        .flat_map(|r| [r, 2 * parts - 1 - r])
        .flat_map(|c| c * chunk..(c + 1) * chunk)
        .map(|p| p as i64)
        .collect()
}

impl Rewriter<'_> {
    /// The ops context parallelism treats differently from tensor
    /// parallelism; `None` for the shared rules.
    pub(super) fn context_node(
        &mut self,
        idx: NodeIndex,
        ins: &[Option<TensorId>],
        first: Layout,
    ) -> Result<Option<()>, TpError> {
        let n = self.src.node(idx).clone();
        let tokens = Layout::Split {
            axis: 1,
            blocks: WHOLE,
        };
        let is = |r: &Self, slot: usize, l: Layout| r.layout_of_slot(ins, slot) == Some(l);
        match &n.op {
            // Token-wise products and lookups: each rank its tokens (split
            // along the sequence, or along rows that flatten batch and sequence).
            Op::Linear | Op::MatMul if self.layout_of_slot(ins, 1).is_none() && self.rows_split(ins) => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(first))?;
            }
            Op::Embedding if is(self, 1, tokens) => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(tokens))?;
            }
            Op::RotaryEmbedding { num_heads, .. } => return self.context_rotary(idx, ins, *num_heads),
            // A tensor-parallel collective runs on the rank's tokens: along
            // the hidden, heads or vocabulary dim as it is; along the tokens'
            // own dim it splits or joins the rank's chunk among the
            // tensor-parallel ranks, which share it (they gather it back
            // before anything reads across tokens).
            Op::Comm {
                group: autopar_ir::CommGroup::Tensor,
                ..
            } if matches!(first, Layout::Split { .. }) => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(first))?;
            }
            // Routing and experts work token by token.
            Op::MoeRouter { .. } if self.rows_split(ins) => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(first))?;
            }
            Op::MoeExperts { .. } if self.rows_split(ins) && (1..3).all(|i| is(self, i, first)) => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(first))?;
            }
            Op::GatherElements { axis } if (0..2).all(|i| is(self, i, tokens)) && *axis != 1 => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(tokens))?;
            }
            Op::Attention { scale, causal } => return self.context_attention(idx, ins, *scale, *causal),
            // Reductions along other dims than the tokens' (a vocabulary-
            // parallel loss's maxima and sums): each rank its tokens.
            Op::Reduce {
                axes: Some(axes),
                keepdims,
                ..
            } if ins.len() == 1 => {
                let Layout::Split { axis, blocks } = first else {
                    return Ok(None);
                };
                let rank = self
                    .source_dims(self.src.node(idx).inputs[0].expect("one input"))
                    .len() as i64;
                let reduced: Vec<usize> = axes.iter().map(|&a| a.rem_euclid(rank.max(1)) as usize).collect();
                if reduced.contains(&axis) {
                    return Ok(None);
                }
                let axis = match keepdims {
                    true => axis,
                    false => axis - reduced.iter().filter(|&&a| a < axis).count(),
                };
                self.emit(
                    idx,
                    n.op.clone(),
                    ins.to_vec(),
                    Some(Layout::Split { axis, blocks }),
                )?;
            }
            // Sums over the sequence (the loss): each rank's share, then all-reduced.
            Op::Reduce {
                axes: None,
                keepdims: false,
                ..
            } if ins.len() == 1 && first == tokens => {
                let out = self.src.node(idx).outputs[0];
                let share = self.emit(idx, n.op.clone(), ins.to_vec(), None)?[0];
                let sum = self.comm(share, CommKind::AllReduce, 0, Layout::Replicated)?;
                self.map.insert(out, sum);
            }
            _ => return Ok(None),
        }
        Ok(Some(()))
    }

    /// Rotary positions: the rank's tokens at their own positions (position
    /// ids split with the tokens, or without ids the cache rows of the
    /// rank's positions).
    fn context_rotary(
        &mut self,
        idx: NodeIndex,
        ins: &[Option<TensorId>],
        num_heads: usize,
    ) -> Result<Option<()>, TpError> {
        let tokens = Layout::Split {
            axis: 1,
            blocks: WHOLE,
        };
        let is = |r: &Self, slot: usize, l: Layout| r.layout_of_slot(ins, slot) == Some(l);
        let seq_axis = if num_heads > 0 { 1 } else { 2 };
        let along = Layout::Split {
            axis: seq_axis,
            blocks: WHOLE,
        };
        if !is(self, 0, along) {
            return Ok(None);
        }
        let mut ins = ins.to_vec();
        match ins.get(3).copied().flatten() {
            Some(_) if is(self, 3, tokens) => {}
            Some(_) => return Ok(None),
            None => {
                for slot in [1, 2] {
                    let cache = ins[slot].expect("rotary cache");
                    let rows = Layout::Split {
                        axis: 0,
                        blocks: WHOLE,
                    };
                    ins[slot] = Some(self.comm(cache, CommKind::Slice, 0, rows)?);
                }
            }
        }
        let op = self.src.node(idx).op.clone();
        self.emit(idx, op, ins, Some(along))?;
        Ok(Some(()))
    }

    /// Attention on the rank's queries over every key: keys and values
    /// gathered along the sequence in order, a causal attention told its
    /// queries' positions (so a fused kernel still skips the hidden keys),
    /// any mask cut to the rank's query rows.
    fn context_attention(
        &mut self,
        idx: NodeIndex,
        ins: &[Option<TensorId>],
        scale: Option<f64>,
        causal: bool,
    ) -> Result<Option<()>, TpError> {
        let is = |r: &Self, slot: usize, l: Layout| r.layout_of_slot(ins, slot) == Some(l);
        let seq = Layout::Split {
            axis: 2,
            blocks: WHOLE,
        };
        if !(0..3).all(|i| is(self, i, seq)) {
            return Ok(None);
        }
        let k = self.comm(
            ins[1].expect("k"),
            CommKind::GatherForCompute,
            2,
            Layout::Replicated,
        )?;
        let v = self.comm(
            ins[2].expect("v"),
            CommKind::GatherForCompute,
            2,
            Layout::Replicated,
        )?;
        let keys = self.dims(k)[2];
        let mut mask = None;
        if let Some(Some(m)) = ins.get(3).copied() {
            let d = self.dims(m);
            let rows = d.len().checked_sub(2).map(|i| (i, d[i]));
            mask = Some(match (self.layout(m), rows) {
                (None | Some(Layout::Replicated), Some((_, 1))) => m,
                (None | Some(Layout::Replicated), Some((i, r))) if r == keys => self.comm(
                    m,
                    CommKind::Slice,
                    i,
                    Layout::Split {
                        axis: i,
                        blocks: WHOLE,
                    },
                )?,
                _ => return Ok(None),
            });
        }
        let positions = match causal {
            true => Some(self.rank_positions(keys, "attention keys")?),
            false => None,
        };
        let op = Op::Attention { scale, causal };
        let mut inputs = vec![ins[0], Some(k), Some(v), mask, positions];
        while inputs.last() == Some(&None) {
            inputs.pop();
        }
        self.emit(idx, op, inputs, Some(seq))?;
        Ok(Some(()))
    }

    /// `x` moved along the sequence (its dim `axis`) by `kind` through the
    /// balanced order. A slice of a tensor no gradient reaches through it
    /// (tokens, constants) or of one made from weights alone (a position
    /// table: no layout) gathers the rank's positions: the latter's
    /// gradient is the rank's rows with zeros elsewhere, a share the sum of
    /// weight gradients over the ranks completes. A slice of a float
    /// tensor computed from the step's data, or a reduce-scatter, puts it
    /// in the balanced order first; a gather puts the gathered chunks back
    /// in sequence order.
    pub(super) fn balanced_comm(
        &mut self,
        x: TensorId,
        kind: CommKind,
        axis: usize,
    ) -> Result<TensorId, TpError> {
        let parts = self.parts;
        let comm = |kind| Op::Comm {
            kind,
            axis: axis as i64,
            parts,
            group: CommGroup::Context,
        };
        let name = self.g.tensor(x).name.clone();
        let what = format!("{kind:?}").to_lowercase();
        let at = Op::Gather { axis: axis as i64 };
        match kind {
            CommKind::Slice if self.layout(x).is_none() || !self.carries_gradient(x) => {
                let mine = self.rank_positions(self.dims(x)[axis], &name)?;
                self.helper("own_rows", at, vec![Some(x), Some(mine)])
            }
            CommKind::Slice | CommKind::ReduceScatter => {
                let (order, _) = self.order(self.dims(x)[axis], &name)?;
                let ordered = self.helper("balanced", at, vec![Some(x), Some(order)])?;
                if let Some(l) = self.layout(x) {
                    self.layouts.insert(ordered, l);
                }
                self.helper(&what, comm(kind), vec![Some(ordered)])
            }
            CommKind::AllGather | CommKind::GatherForCompute => {
                let (_, inverse) = self.order(self.dims(x)[axis] * self.parts, &name)?;
                let joined = self.helper(&what, comm(kind), vec![Some(x)])?;
                self.helper("in_order", at, vec![Some(joined), Some(inverse)])
            }
            CommKind::AllReduce
            | CommKind::Copy
            | CommKind::AllToAll
            | CommKind::Dispatch
            | CommKind::Combine => {
                unreachable!("{kind:?} does not move along the sequence")
            }
        }
    }

    /// True for a float tensor other than a constant or an input: a
    /// gradient flows back through it.
    fn carries_gradient(&self, x: TensorId) -> bool {
        let t = self.g.tensor(x);
        t.ty.dtype.is_float() && !matches!(t.role, Role::Constant | Role::Input)
    }

    /// The balanced order of a sequence of `n` tokens and its inverse, as
    /// constants; `n` must be the sequence (`what` moves along it) and cut
    /// into `2·parts` chunks.
    fn order(&mut self, n: usize, what: &str) -> Result<(TensorId, TensorId), TpError> {
        if let Some(&c) = self.balanced.constants.get(&n) {
            return Ok(c);
        }
        if n != self.sequence {
            let message = format!(
                "context parallelism would move it along a dim of {n}, not along the sequence of {}",
                self.sequence
            );
            return Err(self.err(what, message));
        }
        if n % (2 * self.parts) != 0 {
            let message = format!(
                "context parallelism {} cuts the sequence into {} chunks (two per rank, balanced for causal attention), but {n} tokens do not divide into them",
                self.parts,
                2 * self.parts
            );
            return Err(self.err(what, message));
        }
        let order = balanced_order(n, self.parts);
        let mut inverse = vec![0i64; n];
        for (k, &p) in order.iter().enumerate() {
            inverse[p as usize] = k as i64;
        }
        let constant = |r: &mut Self, tag: &str, v: Vec<i64>| {
            r.g.add_constant(
                format!("{}/{tag}{n}", r.prefix()),
                Value::i64(vec![n], v).expect("1-D order"),
            )
        };
        let c = (constant(self, "order", order), constant(self, "inverse", inverse));
        self.balanced.constants.insert(n, c);
        Ok(c)
    }

    /// The positions of the rank's tokens in a sequence of `n` (its slice
    /// of the balanced order), made once per layer.
    fn rank_positions(&mut self, n: usize, what: &str) -> Result<TensorId, TpError> {
        if let Some(&m) = self.balanced.mine.get(&(n, self.block)) {
            return Ok(m);
        }
        let (order, _) = self.order(n, what)?;
        let op = Op::Comm {
            kind: CommKind::Slice,
            axis: 0,
            parts: self.parts,
            group: CommGroup::Context,
        };
        let mine = self.helper("positions", op, vec![Some(order)])?;
        self.layouts.insert(
            mine,
            Layout::Split {
                axis: 0,
                blocks: WHOLE,
            },
        );
        self.balanced.mine.insert((n, self.block), mine);
        Ok(mine)
    }

    /// True when input 0 is split along a dim before its last (the one a
    /// product contracts, a router or expert reads whole): each rank
    /// works on its own rows.
    fn rows_split(&self, ins: &[Option<TensorId>]) -> bool {
        let Some(x) = ins.first().copied().flatten() else {
            return false;
        };
        let rank = self.dims(x).len();
        matches!(self.layout(x), Some(Layout::Split { axis, .. }) if axis + 1 < rank)
    }
}

#[cfg(test)]
mod tests {
    use super::balanced_order;

    /// Rank `r` holds chunks `r` and `2·parts − 1 − r`, and under a causal
    /// mask every rank's queries see as many keys.
    #[test]
    fn balanced_chunks_give_every_rank_the_same_causal_work() {
        let order = balanced_order(16, 2);
        let want: Vec<i64> = [0..4, 12..16, 4..8, 8..12].into_iter().flatten().collect();
        assert_eq!(order, want);
        for parts in [2, 4, 8] {
            let n = 64 * parts;
            let order = balanced_order(n, parts);
            let work: Vec<i64> = order
                .chunks(n / parts)
                .map(|mine| mine.iter().map(|p| p + 1).sum())
                .collect();
            assert!(work.iter().all(|&w| w == work[0]), "{parts}: {work:?}");
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n as i64).collect::<Vec<_>>());
        }
    }
}

//! Executing the plan's per-op sharding. Each node the plan covers runs the
//! strategy the plan names, looked up in the ops' sharding rules
//! (declared beside each op in `autopar-ir`, checked against the plan by
//! [`sharding::planned_strategy`]), the same rules the planner's integer
//! program priced: every input is moved into the layout the strategy reads
//! ([`Rewriter::arrange`]: slice, all-gather, all-reduce, reduce-scatter),
//! inputs whose gradient the strategy leaves as shares are copied in, and
//! the op runs on the rank's pieces with its outputs in the strategy's
//! layouts. Lowering chooses nothing here; where the rules name a strategy
//! it cannot run yet, it says so and names the node.
//!
//! Running an op on its pieces is the op itself for most ops; the others
//! are named in [`Local`]: a target shape cut to the rank's part, a mean
//! over a split dim, rotary heads, the vocabulary-parallel embedding, the
//! rank's experts, and a row-parallel bias added once, after the sum.

use super::{Layout, Rewriter, TpError, WHOLE};
use autopar_ir::op::sharding::{Layout as Rule, Strategy};
use autopar_ir::{layers, BinaryOp, CommKind, Graph, NodeIndex, Op, ReduceKind, TensorId, Value};
use autopar_planner::sharding;
use autopar_planner::spec::OpSharding;
use std::collections::HashMap;

/// The plan's strategy for each node of `src` it covers, by node name. An
/// entry for a node of the first repeated layer covers the node at the same
/// place in every layer (the plan records one layer), which runs the
/// strategy of the same name on its own operands.
pub(super) fn resolve(
    src: &Graph,
    parts: usize,
    plan: &[OpSharding],
) -> Result<HashMap<String, Strategy>, TpError> {
    let index: HashMap<&str, NodeIndex> = src
        .node_indices()
        .map(|i| (src.node(i).name.as_str(), i))
        .collect();
    let place: HashMap<&str, usize> = src
        .blocks
        .first()
        .map(|b| b.nodes.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect())
        .unwrap_or_default();
    let mut out = HashMap::new();
    for entry in plan {
        let names: Vec<&str> = match place.get(entry.node.as_str()) {
            Some(&i) => src
                .blocks
                .iter()
                .filter_map(|b| b.nodes.get(i))
                .map(String::as_str)
                .collect(),
            None => vec![entry.node.as_str()],
        };
        for name in names {
            let fail = |message: String| TpError::Node {
                node: entry.node.clone(),
                message,
            };
            let Some(&idx) = index.get(name) else {
                return Err(fail(format!(
                    "the plan's sharding names node '{name}', which the model does not have (was the plan made for another model?)"
                )));
            };
            let op = src.node(idx).op.name();
            if op != entry.op {
                return Err(fail(format!(
                    "the plan's sharding says '{name}' is a {}, the model's is a {op}",
                    entry.op
                )));
            }
            let s = match name == entry.node {
                true => sharding::planned_strategy(src, idx, parts, entry)?,
                // A later layer's copy: exporters may order a commutative
                // op's operands differently from layer to layer.
                false => sharding::named_strategy(src, idx, parts, &entry.strategy)?,
            };
            out.insert(name.to_string(), s);
        }
    }
    Ok(out)
}

/// The layer boundaries of the source graph: a tensor read in another part
/// than its producer's (before the layers, a layer, after) is first moved
/// into the layout the plan's program priced it crossing in
/// ([`autopar_ir::layers::crosses_sequence_split`]), so every layer sends
/// what every other does.
pub(super) struct Boundaries {
    parts: HashMap<NodeIndex, usize>,
    streams: Vec<bool>,
}

impl Boundaries {
    pub(super) fn new(src: &Graph) -> Result<Boundaries, TpError> {
        Ok(Boundaries {
            parts: layers::parts(src),
            streams: layers::streams(src)?,
        })
    }
}

/// What running an op on the rank's pieces needs besides the op itself.
enum Local {
    /// The op as it is.
    Same,
    /// Input 1 is a target shape: cut its split dim to the rank's part.
    TargetShape,
    /// A mean over a split dim: the rank's mean over `parts` is its share.
    MeanShare,
    /// `num_heads` packed in the last dim: the rank's heads.
    RotaryHeads(usize),
    /// The rank's vocabulary rows of an embedding table.
    VocabRows,
    /// The rank's experts.
    RankExperts,
    /// A row-parallel product's bias (input 2), added once after the sum.
    BiasAfterSum,
    /// A split along the split dim: the rank's block of each piece.
    CutBlocks,
    /// A grouped convolution split by whole groups: the rank's groups.
    RankGroups,
}

/// How `op` runs under strategy `s` (`bias`: input 2 is present).
fn local_rule(op: &Op, s: &Strategy, bias: bool, rank: usize) -> Local {
    let sharded_out = matches!(s.outputs.first(), Some(Rule::Shard(_)));
    match op {
        Op::Split { axis, .. } if s.reads(0).0 == Rule::Shard(super::norm(*axis, rank)) => Local::CutBlocks,
        Op::Reshape { .. } | Op::Expand if sharded_out => Local::TargetShape,
        Op::Reduce {
            kind: ReduceKind::Mean,
            ..
        } if s.name.starts_with("reduce") => Local::MeanShare,
        Op::RotaryEmbedding { num_heads, .. } if *num_heads > 0 && s.name == "heads" => {
            Local::RotaryHeads(*num_heads)
        }
        Op::Embedding if s.name == "vocab" => Local::VocabRows,
        Op::MoeExperts { .. } if s.name == "expert" => Local::RankExperts,
        Op::Linear | Op::Gemm { .. } if s.name == "row" && bias => Local::BiasAfterSum,
        Op::Conv { .. } | Op::ConvTranspose { .. } if s.name == "groups" => Local::RankGroups,
        // The op computes on whatever piece it is given: named one by one
        // so a new op must say how it runs on a rank's pieces.
        Op::Reshape { .. }
        | Op::Expand
        | Op::Reduce { .. }
        | Op::RotaryEmbedding { .. }
        | Op::Embedding
        | Op::MoeExperts { .. }
        | Op::Linear
        | Op::Gemm { .. }
        | Op::MatMul
        | Op::Attention { .. }
        | Op::Binary { .. }
        | Op::Unary { .. }
        | Op::Where
        | Op::Clip
        | Op::Silu
        | Op::Gelu { .. }
        | Op::Cast { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::ArgMax { .. }
        | Op::TopK { .. }
        | Op::CumSum { .. }
        | Op::MoeRouter { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Transpose { .. }
        | Op::Split { .. }
        | Op::Concat { .. }
        | Op::Slice
        | Op::Trilu { .. }
        | Op::Gather { .. }
        | Op::GatherNd { .. }
        | Op::GatherElements { .. }
        | Op::AttentionGrad { .. }
        | Op::MoeExpertsGrad { .. }
        | Op::MoeSort { .. }
        | Op::MoeSlots { .. }
        | Op::NormGrad { .. }
        | Op::ActivationGrad { .. }
        | Op::SoftmaxGrad { .. }
        | Op::Comm { .. }
        | Op::GatherGrad { .. }
        | Op::GatherElementsGrad { .. }
        | Op::GatherNdGrad { .. }
        | Op::Shape { .. }
        | Op::Size
        | Op::ConstantOfShape { .. }
        | Op::Conv { .. }
        | Op::ConvTranspose { .. }
        | Op::Pool { .. }
        | Op::ConvGrad { .. }
        | Op::PoolGrad { .. }
        | Op::Range => Local::Same,
    }
}

impl Rewriter<'_> {
    /// Runs node `idx` under the plan's strategy `s`.
    pub(super) fn planned(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        s: &Strategy,
    ) -> Result<(), TpError> {
        let n = self.src.node(idx).clone();
        let blocks = self.planned_blocks(idx, s, &ins);
        let mut pieces = Vec::with_capacity(ins.len());
        for (slot, t) in ins.iter().enumerate() {
            let Some(t) = *t else {
                pieces.push(None);
                continue;
            };
            let t = match n.inputs[slot] {
                Some(source) => self.crossed(idx, source, t)?,
                None => t,
            };
            let shares = s.grad_partial.get(slot).copied().unwrap_or(false);
            pieces.push(Some(self.arrange(t, s.reads(slot).0, shares, blocks, &n.name)?));
        }
        let weights_only = ins.iter().flatten().all(|&t| self.layout(t).is_none());
        let layout = self.planned_layout(idx, s, blocks, weights_only)?;
        let rank = self.source_dims(n.outputs[0]).len();
        match local_rule(&n.op, s, ins.get(2).copied().flatten().is_some(), rank) {
            Local::CutBlocks => {
                let Op::Split { axis, outputs, .. } = n.op else {
                    return Err(self.err(&n.name, "not a split"));
                };
                let x = pieces[0].expect("split input");
                let blocks = match self.layout(x) {
                    Some(Layout::Split { blocks, .. }) => blocks,
                    _ => WHOLE,
                };
                if blocks != outputs || !self.equal_split(idx) {
                    return Err(self.err(
                        &n.name,
                        format!("splitting a tensor along its split dim needs {outputs} equal blocks per rank (the producer cut it into {blocks})"),
                    ));
                }
                let op = Op::Split {
                    axis,
                    split: None,
                    outputs,
                };
                self.emit(idx, op, vec![Some(x)], layout).map(drop)
            }
            Local::Same => self.emit(idx, n.op.clone(), pieces, layout).map(drop),
            Local::RankGroups => {
                let op = match n.op.clone() {
                    Op::Conv { window, groups } => Op::Conv {
                        window,
                        groups: groups / self.parts,
                    },
                    Op::ConvTranspose {
                        window,
                        groups,
                        output_padding,
                    } => Op::ConvTranspose {
                        window,
                        groups: groups / self.parts,
                        output_padding,
                    },
                    _ => return Err(self.err(&n.name, "only convolutions split by groups")),
                };
                self.emit(idx, op, pieces, layout).map(drop)
            }
            Local::TargetShape => {
                let Some(Layout::Split { axis, .. }) = layout else {
                    return Err(self.err(&n.name, "a reshape's target is cut only for a split output"));
                };
                let out_dims = self.source_dims(n.outputs[0]);
                pieces[1] = Some(self.local_shape(&out_dims, axis));
                self.emit(idx, n.op.clone(), pieces, layout).map(drop)
            }
            Local::MeanShare => self.mean_share(idx, pieces, layout),
            Local::RotaryHeads(heads) => {
                let Op::RotaryEmbedding {
                    interleaved,
                    rotary_dim,
                    ..
                } = n.op
                else {
                    return Err(self.err(&n.name, "not a rotary embedding"));
                };
                if heads % self.parts != 0 {
                    return Err(self.err(&n.name, format!("{heads} heads do not split {}-way", self.parts)));
                }
                let op = Op::RotaryEmbedding {
                    interleaved,
                    rotary_dim,
                    num_heads: heads / self.parts,
                };
                self.emit(idx, op, pieces, layout).map(drop)
            }
            Local::VocabRows => {
                let (Some(table), Some(ids)) = (pieces[0], pieces.get(1).copied().flatten()) else {
                    return Err(self.err(&n.name, "an embedding needs a table and ids"));
                };
                let vocab = self.source_dims(n.inputs[0].expect("table"))[0];
                self.vocab_rows(idx, table, ids, vocab)
            }
            Local::RankExperts => self.local_experts(idx, pieces),
            Local::BiasAfterSum => {
                let bias = pieces[2].take().expect("checked by `local`");
                let op = match n.op {
                    Op::Gemm {
                        alpha,
                        beta: 1.0,
                        trans_a,
                        trans_b,
                    } => Op::Gemm {
                        alpha,
                        beta: 0.0,
                        trans_a,
                        trans_b,
                    },
                    Op::Linear => Op::Linear,
                    _ => {
                        return Err(self.err(
                            &n.name,
                            "a row-parallel Gemm with beta other than 1 is not lowered",
                        ))
                    }
                };
                let outs = self.emit(idx, op, pieces, layout)?;
                self.pending.insert(outs[0], bias);
                Ok(())
            }
        }
    }

    /// `t` (the rewritten source tensor `source`) as node `idx` reads it
    /// across a layer boundary: in the boundary's layout when it crosses one.
    fn crossed(&mut self, idx: NodeIndex, source: TensorId, t: TensorId) -> Result<TensorId, TpError> {
        let Some(b) = &self.boundaries else { return Ok(t) };
        let Some(producer) = self.src.producer(source) else {
            return Ok(t);
        };
        if b.parts.get(&producer) == b.parts.get(&idx) || self.layout(t).is_none() {
            return Ok(t);
        }
        let dims = self.source_dims(source);
        let at = self.src.node(idx).name.clone();
        match layers::crosses_sequence_split(b.streams[source.index()], &dims, self.parts, self.sp) {
            true => self.arrange(t, Rule::Shard(1), false, WHOLE, &at),
            false => self.arrange(t, Rule::Replicate, false, WHOLE, &at),
        }
    }

    /// `t` in the layout `want` reads it in, with `blocks` blocks when split;
    /// `shares`: the reader's gradient for it is a share on each rank
    /// ([`autopar_ir::op::sharding::read_moves`]).
    fn arrange(
        &mut self,
        t: TensorId,
        want: Rule,
        shares: bool,
        blocks: usize,
        at: &str,
    ) -> Result<TensorId, TpError> {
        let name = self.g.tensor(t).name.clone();
        let have = match self.layout(t) {
            // Weights and constants are stored, or sliced as each reader reads them.
            None if want == Rule::Replicate && shares => return self.copied_in(t),
            None if want == Rule::Replicate => return Ok(t),
            None => match want {
                Rule::Shard(d) => return self.slice_weight(t, d, blocks, at),
                Rule::Replicate | Rule::Partial => {
                    return Err(self.err(at, format!("the plan reads weight '{name}' as a pending sum")))
                }
            },
            Some(Layout::Split { axis, blocks: b }) if want == Rule::Shard(axis) && b == blocks => return Ok(t),
            Some(Layout::Split { blocks: b, .. }) if b > WHOLE => {
                return Err(self.err(at, format!("'{name}' is split in {b} blocks; it cannot be moved")))
            }
            Some(Layout::Split { axis, .. }) => Rule::Shard(axis),
            Some(Layout::Replicated) => Rule::Replicate,
            Some(Layout::Partial) if want == Rule::Partial && self.pending.contains_key(&t) => {
                return Err(self.err(
                    at,
                    format!("'{name}' is a row-parallel sum with its bias still to add; the plan must reduce it first"),
                ))
            }
            Some(Layout::Partial) => Rule::Partial,
        };
        if let (Rule::Shard(d), true) = (want, blocks > WHOLE) {
            // Cut into blocks: whole first, then each block's slice.
            let whole = self.moved(t, have, Rule::Replicate, false, at)?;
            return self.block_slice(whole, d, blocks);
        }
        self.moved(t, have, want, shares, at)
    }

    /// `t`, laid out as `from`, moved into `to` for a reader whose gradient
    /// is a share when `shares`, by the comm ops the sharding rules name for
    /// it ([`sharding::read_moves`], what the cost model prices): sums
    /// reduced with any bias still to add.
    pub(super) fn moved(
        &mut self,
        t: TensorId,
        from: Rule,
        to: Rule,
        shares: bool,
        at: &str,
    ) -> Result<TensorId, TpError> {
        let Some(steps) = autopar_ir::op::sharding::read_moves(from, to, shares) else {
            let name = self.g.tensor(t).name.clone();
            return Err(self.err(
                at,
                format!("the plan reads '{name}' as a pending sum, but it is not one"),
            ));
        };
        let mut x = t;
        for (kind, axis) in steps {
            let split = Layout::Split { axis, blocks: WHOLE };
            x = match kind {
                CommKind::Slice => self.comm(x, kind, axis, split)?,
                CommKind::AllGather | CommKind::GatherForCompute => {
                    self.comm(x, kind, axis, Layout::Replicated)?
                }
                CommKind::AllReduce => self.settle(x, kind, axis, Layout::Replicated)?,
                CommKind::ReduceScatter => self.settle(x, kind, axis, split)?,
                CommKind::Copy => self.copied_in(x)?,
                CommKind::AllToAll | CommKind::Dispatch | CommKind::Combine => {
                    return Err(self.err(at, format!("{kind:?} is not a layout move")))
                }
            };
        }
        Ok(x)
    }

    /// The rank's slice of each of `blocks` equal blocks of the whole `x`
    /// along `axis` (one contiguous slice when `blocks` is 1): the blocks
    /// are split apart, sliced and joined again.
    pub(super) fn block_slice(
        &mut self,
        x: TensorId,
        axis: usize,
        blocks: usize,
    ) -> Result<TensorId, TpError> {
        let split = |blocks| Layout::Split { axis, blocks };
        if blocks == WHOLE {
            return self.comm(x, CommKind::Slice, axis, split(WHOLE));
        }
        let op = Op::Split {
            axis: axis as i64,
            split: None,
            outputs: blocks,
        };
        self.count += 1;
        let name = format!("{}/blocks{}", self.prefix(), self.count);
        let names: Vec<String> = (0..blocks).map(|b| format!("{name}.{b}")).collect();
        let pieces = self.add(name, op, vec![Some(x)], &names)?;
        let mut sliced = Vec::with_capacity(blocks);
        for piece in pieces {
            sliced.push(Some(self.comm(piece, CommKind::Slice, axis, split(WHOLE))?));
        }
        let joined = self.helper("joined", Op::Concat { axis: axis as i64 }, sliced)?;
        self.layouts.insert(joined, split(blocks));
        Ok(joined)
    }

    /// A pending sum `x` reduced by `kind` along `axis` into `layout`, with
    /// a row-parallel product's bias added once after the sum; one per
    /// tensor, kind and axis.
    pub(super) fn settle(
        &mut self,
        x: TensorId,
        kind: CommKind,
        axis: usize,
        layout: Layout,
    ) -> Result<TensorId, TpError> {
        if let Some(&y) = self.cache.get(&(x, kind, axis)) {
            return Ok(y);
        }
        let sum = self.comm(x, kind, axis, layout)?;
        let Some(&bias) = self.pending.get(&x) else {
            return Ok(sum);
        };
        let bias = match layout {
            Layout::Split { axis, blocks: WHOLE } => {
                let rank = self.dims(sum).len();
                let d = self.dims(bias);
                match (axis + d.len()).checked_sub(rank) {
                    Some(i) if d[i] > 1 => self.comm(
                        bias,
                        CommKind::Slice,
                        i,
                        Layout::Split {
                            axis: i,
                            blocks: WHOLE,
                        },
                    )?,
                    // Broadcast over the rank's rows: its gradient is a share.
                    _ => self.copied_in(bias)?,
                }
            }
            Layout::Split { .. } | Layout::Replicated | Layout::Partial => bias,
        };
        let y = self.helper(
            "bias",
            Op::Binary { func: BinaryOp::Add },
            vec![Some(sum), Some(bias)],
        )?;
        self.layouts.insert(y, layout);
        self.cache.insert((x, kind, axis), y);
        Ok(y)
    }

    /// Blocks of the split the strategy reads and writes: those of a
    /// block-split input it reads split; for a split along its split dim,
    /// one per piece; for a product whose output's
    /// only reader is an equal `Split` the plan runs along that dim (a
    /// fused projection), that split's count, so every rank gets matching
    /// blocks; else whole.
    fn planned_blocks(&self, idx: NodeIndex, s: &Strategy, ins: &[Option<TensorId>]) -> usize {
        let read = ins.iter().enumerate().find_map(|(slot, t)| {
            match (s.reads(slot).0, t.and_then(|t| self.layout(t))) {
                (Rule::Shard(_), Some(Layout::Split { blocks, .. })) if blocks > WHOLE => Some(blocks),
                _ => None,
            }
        });
        if let Some(b) = read {
            return b;
        }
        let node = self.src.node(idx);
        if let (Op::Split { axis, outputs, .. }, Rule::Shard(d)) = (&node.op, s.reads(0).0) {
            let rank = self.source_dims(node.outputs[0]).len();
            if super::norm(*axis, rank) == d && self.equal_split(idx) {
                return *outputs;
            }
        }
        let Some(&Rule::Shard(d)) = s.outputs.first() else {
            return WHOLE;
        };
        let out = self.src.node(idx).outputs[0];
        let consumers = self.src.consumers(out);
        let [c] = consumers.as_slice() else {
            return WHOLE;
        };
        let node = self.src.node(*c);
        let Op::Split { axis, outputs, .. } = node.op else {
            return WHOLE;
        };
        let dims = self.source_dims(out);
        let along = super::norm(axis, dims.len());
        let split_there = self
            .plan
            .get(&node.name)
            .is_some_and(|cs| cs.reads(0).0 == Rule::Shard(d));
        if along == d && split_there && self.equal_split(*c) && dims[d] % (outputs * self.parts) == 0 {
            outputs
        } else {
            WHOLE
        }
    }

    /// The layout of the node's outputs under `s` (`None`: computed from
    /// weights alone and replicated, as the unplanned rules leave them).
    fn planned_layout(
        &self,
        idx: NodeIndex,
        s: &Strategy,
        blocks: usize,
        weights_only: bool,
    ) -> Result<Option<Layout>, TpError> {
        let n = self.src.node(idx);
        let first = s.outputs.first().copied().unwrap_or(Rule::Replicate);
        if s.outputs.iter().any(|&o| o != first) {
            return Err(self.err(
                &n.name,
                format!("strategy '{}' lays its outputs out differently", s.name),
            ));
        }
        let moves_dims = matches!(
            n.op,
            Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } | Op::Expand
        );
        Ok(match first {
            Rule::Replicate if weights_only => None,
            Rule::Replicate => Some(Layout::Replicated),
            Rule::Partial => Some(Layout::Partial),
            Rule::Shard(axis) => {
                let rank = self.source_dims(n.outputs[0]).len();
                let cut = match n.op {
                    Op::Split { axis: a, .. } => super::norm(a, rank) == axis,
                    _ => false,
                };
                if blocks > WHOLE && moves_dims {
                    return Err(self.err(&n.name, "a block-split tensor cannot be reshaped"));
                }
                Some(Layout::Split {
                    axis,
                    blocks: if cut { WHOLE } else { blocks },
                })
            }
        })
    }

    /// A mean over a split dim: the rank's mean divided by the ranks is its
    /// share of the whole mean (a pending sum).
    fn mean_share(
        &mut self,
        idx: NodeIndex,
        pieces: Vec<Option<TensorId>>,
        layout: Option<Layout>,
    ) -> Result<(), TpError> {
        let n = self.src.node(idx).clone();
        let mean = self.helper("mean", n.op.clone(), pieces)?;
        let dtype = self.g.tensor(mean).ty.dtype;
        self.count += 1;
        let parts = self.g.add_constant(
            format!("{}/parts{}", self.prefix(), self.count),
            Value::scalar_i64(self.parts as i64),
        );
        let parts = self.helper("parts", Op::cast(dtype), vec![Some(parts)])?;
        let div = Op::Binary { func: BinaryOp::Div };
        self.emit(idx, div, vec![Some(mean), Some(parts)], layout)
            .map(drop)
    }

    /// `MoeExperts` on the rank's experts: routes to other ranks' experts
    /// are sent to a local one with weight zero, so the output is the
    /// rank's share of the sum over the chosen experts.
    fn local_experts(&mut self, idx: NodeIndex, mut pieces: Vec<Option<TensorId>>) -> Result<(), TpError> {
        let n = self.src.node(idx).clone();
        let (Some(weights), Some(indices), Some(w_in)) = (pieces[1], pieces[2], n.inputs[3]) else {
            return Err(self.err(&n.name, "experts need routing weights, indices and weights"));
        };
        let experts = self.source_dims(w_in)[0];
        let (local, inside) = self.local_ids(indices, experts)?;
        let dtype = self.g.tensor(weights).ty.dtype;
        let keep = self.helper("keep_routes", Op::cast(dtype), vec![Some(inside)])?;
        let mul = Op::Binary { func: BinaryOp::Mul };
        pieces[1] = Some(self.helper("local_routes", mul, vec![Some(weights), Some(keep)])?);
        pieces[2] = Some(local);
        self.emit(idx, n.op.clone(), pieces, Some(Layout::Partial))
            .map(drop)
    }
}

//! Context parallelism's own rules: token-wise ops run on the rank's
//! tokens, attention gathers the keys and values of the whole sequence.

use super::{Layout, Rewriter, TpError, WHOLE};
use autopar_ir::{BinaryOp, CommKind, NodeIndex, Op, TensorId, Value};

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
    /// gathered along the sequence, the causal mask (and any mask) cut to
    /// the rank's query rows.
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
        if causal {
            mask = Some(self.causal_rows(keys)?);
        }
        if let Some(Some(m)) = ins.get(3).copied() {
            let d = self.dims(m);
            let rows = d.len().checked_sub(2).map(|i| (i, d[i]));
            let own = match (self.layout(m), rows) {
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
            };
            let dtype = self.g.tensor(own).ty.dtype;
            mask = match mask {
                None => Some(own),
                Some(c) if dtype == autopar_ir::DType::Bool => Some(self.helper(
                    "mask_and",
                    Op::Binary { func: BinaryOp::And },
                    vec![Some(c), Some(own)],
                )?),
                Some(c) => Some(self.causal_added(c, own, dtype)?),
            };
        }
        let op = Op::Attention { scale, causal: false };
        self.emit(idx, op, vec![ins[0], Some(k), Some(v), mask], Some(seq))?;
        Ok(Some(()))
    }

    /// A float attention mask `own` of `dtype` with the causal mask `causal`
    /// (boolean, true where a query may see a key) added: masked places get
    /// minus infinity.
    fn causal_added(
        &mut self,
        causal: TensorId,
        own: TensorId,
        dtype: autopar_ir::DType,
    ) -> Result<TensorId, TpError> {
        let scalar = |v: f64| match dtype {
            autopar_ir::DType::F64 => Value::f64(vec![], vec![v]),
            _ => Value::f32(vec![], vec![v as f32]),
        };
        self.count += 1;
        let zero = self.g.add_constant(
            format!("{}/open{}", self.prefix(), self.count),
            scalar(0.0).expect("scalar"),
        );
        let shut = self.g.add_constant(
            format!("{}/shut{}", self.prefix(), self.count),
            scalar(f64::NEG_INFINITY).expect("scalar"),
        );
        let zero = self.helper("open", Op::cast(dtype), vec![Some(zero)])?;
        let shut = self.helper("shut", Op::cast(dtype), vec![Some(shut)])?;
        let bias = self.helper(
            "causal_bias",
            Op::Where,
            vec![Some(causal), Some(zero), Some(shut)],
        )?;
        self.helper(
            "mask_add",
            Op::Binary { func: BinaryOp::Add },
            vec![Some(own), Some(bias)],
        )
    }

    /// True for a float tensor computed from weights alone (no layout, not
    /// a constant): its gradient flows to weights, which context
    /// parallelism sums over its ranks.
    pub(super) fn weight_derived(&self, x: TensorId) -> bool {
        let t = self.g.tensor(x);
        self.layout(x).is_none() && t.ty.dtype.is_float() && t.role != autopar_ir::Role::Constant
    }

    /// The rank's rows along `axis` of weight-derived `x` (a position
    /// table looked up for the whole sequence), taken by a gather of the
    /// rank's row indices: its gradient is the rank's rows with zeros
    /// elsewhere, a share that the sum of weight gradients over the ranks
    /// completes (a slice's all-gathered gradient would be counted on
    /// every rank).
    pub(super) fn rows_of_weight(&mut self, x: TensorId, axis: usize) -> Result<TensorId, TpError> {
        let n = self.dims(x)[axis];
        self.count += 1;
        let all = self.g.add_constant(
            format!("{}/rows{}", self.prefix(), self.count),
            Value::i64(vec![n], (0..n as i64).collect()).expect("1-D rows"),
        );
        let rows = Layout::Split {
            axis: 0,
            blocks: WHOLE,
        };
        let op = Op::Comm {
            kind: CommKind::Slice,
            axis: 0,
            parts: self.parts,
            group: autopar_ir::CommGroup::Context,
        };
        let mine = self.helper("slice", op, vec![Some(all)])?;
        self.layouts.insert(mine, rows);
        self.helper(
            "own_rows",
            Op::Gather { axis: axis as i64 },
            vec![Some(x), Some(mine)],
        )
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

    /// The causal mask of the rank's queries over all `keys` keys
    /// (`[queries, keys]`, true where the key is not after the query),
    /// computed from positions: a `keys`-long constant, never the square.
    fn causal_rows(&mut self, keys: usize) -> Result<TensorId, TpError> {
        self.count += 1;
        let positions = self.g.add_constant(
            format!("{}/positions{}", self.prefix(), self.count),
            Value::i64(vec![keys], (0..keys as i64).collect()).expect("1-D positions"),
        );
        let rows = Layout::Split {
            axis: 0,
            blocks: WHOLE,
        };
        let mine = self.comm(positions, CommKind::Slice, 0, rows)?;
        let column = self.helper(
            "query_positions",
            Op::Unsqueeze { axes: Some(vec![-1]) },
            vec![Some(mine)],
        )?;
        let sees = Op::Binary {
            func: BinaryOp::GreaterOrEqual,
        };
        self.helper("causal", sees, vec![Some(column), Some(positions)])
    }
}

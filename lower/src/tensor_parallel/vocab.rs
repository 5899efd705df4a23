//! The vocabulary-parallel ends of a language model (Megatron-LM's
//! `VocabParallelEmbedding` and `vocab_parallel_cross_entropy`): each rank
//! of the group holds the rows `[r·V/p, (r+1)·V/p)` of the vocabulary.
//!
//! - An embedding looks up the ids in the rank's rows (the others read row
//!   0 and are zeroed), so its output is a pending sum ([`Layout::Partial`]),
//!   reduced where a non-linear op first reads it.
//! - A log-softmax over vocabulary-split logits subtracts a log-sum-exp
//!   built from the ranks' maxima (all-gathered, `[b, s, 1]` each) and the
//!   all-reduced sum of exponentials; it never gathers the logits.
//! - Picking the target's entry (`GatherElements` along the vocabulary)
//!   reads it on the rank that holds it, zeros elsewhere, and all-reduces.
//!
//! The per-rank graph is the same on every rank: a rank finds its rows by
//! slicing an `arange(V)` constant with a `Slice` comm op, never through a
//! rank-specific constant.

use super::{norm, Layout, Rewriter, TpError, WHOLE};
use autopar_ir::{BinaryOp, CommKind, DType, NodeIndex, Op, ReduceKind, TensorId, UnaryOp, Value};

impl Rewriter<'_> {
    /// The vocabulary-parallel rules; `None` where they do not apply (the
    /// shared rules run the node).
    pub(super) fn vocab_node(
        &mut self,
        idx: NodeIndex,
        ins: &[Option<TensorId>],
    ) -> Result<Option<()>, TpError> {
        let op = self.src.node(idx).op.clone();
        match op {
            Op::Embedding => self.embedding(idx, ins),
            Op::LogSoftmax { axis } => self.log_softmax(idx, ins, axis),
            Op::GatherElements { axis } => self.pick(idx, ins, axis),
            _ => Ok(None),
        }
    }

    /// The vocabulary axis a tensor is split on, if it is split whole along
    /// `axis`.
    fn split_on(&self, t: TensorId, axis: i64) -> Option<usize> {
        let a = norm(axis, self.dims(t).len());
        (self.layout(t)
            == Some(Layout::Split {
                axis: a,
                blocks: WHOLE,
            }))
        .then_some(a)
    }

    /// `Embedding(table, ids)` with the table stored as the rank's rows.
    fn embedding(&mut self, idx: NodeIndex, ins: &[Option<TensorId>]) -> Result<Option<()>, TpError> {
        let (Some(table), Some(ids)) = (ins[0], ins.get(1).copied().flatten()) else {
            return Ok(None);
        };
        let vocab = self.dims(table)[0];
        let ids_whole = self.layout(ids) == Some(Layout::Replicated);
        if !ids_whole || !self.stores_sliced(idx, 0) || vocab % self.parts != 0 {
            return Ok(None);
        }
        let name = self.src.node(idx).name.clone();
        let table = self.slice_weight(table, 0, WHOLE, &name)?;
        self.vocab_rows(idx, table, ids, vocab)?;
        Ok(Some(()))
    }

    /// `Embedding` of `ids` (whole) in the rank's rows `table` of a
    /// `vocab`-row table: ids outside its rows read row 0 and are zeroed,
    /// so the output is a pending sum.
    pub(super) fn vocab_rows(
        &mut self,
        idx: NodeIndex,
        table: TensorId,
        ids: TensorId,
        vocab: usize,
    ) -> Result<(), TpError> {
        let (local, inside) = self.local_ids(ids, vocab)?;
        let rows = self.helper("rows", Op::Embedding, vec![Some(table), Some(local)])?;
        let dtype = self.g.tensor(rows).ty.dtype;
        let keep = self.helper("keep", Op::cast(dtype), vec![Some(inside)])?;
        let keep = self.helper(
            "keep_rows",
            Op::Unsqueeze { axes: Some(vec![-1]) },
            vec![Some(keep)],
        )?;
        let mul = Op::Binary { func: BinaryOp::Mul };
        self.emit(idx, mul, vec![Some(rows), Some(keep)], Some(Layout::Partial))?;
        Ok(())
    }

    /// `log_softmax(x)` along the split vocabulary: `x − (m + log Σ exp(x − m))`
    /// with `m` the floor of the global maximum (any shift near the maximum
    /// keeps the exponentials finite; the floor has no gradient, so the
    /// backward pass stops there instead of flowing through the ranks'
    /// maxima) and the sum all-reduced. The
    /// log-sum-exp is copied into the split subtraction, so its gradient,
    /// a share on each rank, is all-reduced.
    fn log_softmax(
        &mut self,
        idx: NodeIndex,
        ins: &[Option<TensorId>],
        axis: i64,
    ) -> Result<Option<()>, TpError> {
        let Some(x) = ins[0] else { return Ok(None) };
        let Some(a) = self.split_on(x, axis) else {
            return Ok(None);
        };
        let reduce = |kind| Op::Reduce {
            kind,
            axes: Some(vec![a as i64]),
            keepdims: true,
            noop_with_empty_axes: false,
        };
        let local_max = self.helper("local_max", reduce(ReduceKind::Max), vec![Some(x)])?;
        let maxima = self.comm(local_max, CommKind::AllGather, a, Layout::Replicated)?;
        let global = self.helper("global_max", reduce(ReduceKind::Max), vec![Some(maxima)])?;
        let floor = Op::Unary { func: UnaryOp::Floor };
        let max = self.helper("max_floor", floor, vec![Some(global)])?;
        let sub = Op::Binary { func: BinaryOp::Sub };
        let shifted = self.helper("shifted", sub.clone(), vec![Some(x), Some(max)])?;
        let exp = self.helper("exp", Op::Unary { func: UnaryOp::Exp }, vec![Some(shifted)])?;
        let share = self.helper("sum_exp", reduce(ReduceKind::Sum), vec![Some(exp)])?;
        let sum = self.comm(share, CommKind::AllReduce, 0, Layout::Replicated)?;
        let log = self.helper("log_sum_exp", Op::Unary { func: UnaryOp::Log }, vec![Some(sum)])?;
        let add = Op::Binary { func: BinaryOp::Add };
        let lse = self.helper("lse", add, vec![Some(max), Some(log)])?;
        self.layouts.insert(lse, Layout::Replicated);
        let lse = self.copied_in(lse)?;
        let split = self.layout(x);
        self.emit(idx, sub, vec![Some(x), Some(lse)], split)?;
        Ok(Some(()))
    }

    /// `GatherElements(data, index)` along the split vocabulary with a
    /// whole index: each rank reads the entries it holds, zeros the rest,
    /// and the shares are all-reduced.
    fn pick(&mut self, idx: NodeIndex, ins: &[Option<TensorId>], axis: i64) -> Result<Option<()>, TpError> {
        let (Some(data), Some(index)) = (ins[0], ins.get(1).copied().flatten()) else {
            return Ok(None);
        };
        let Some(a) = self.split_on(data, axis) else {
            return Ok(None);
        };
        if self.layout(index).is_some_and(|l| l != Layout::Replicated) {
            return Ok(None);
        }
        let vocab = self.dims(data)[a] * self.parts;
        let (local, inside) = self.local_ids(index, vocab)?;
        let op = Op::GatherElements { axis: a as i64 };
        let picked = self.helper("picked", op, vec![Some(data), Some(local)])?;
        let dtype = self.g.tensor(picked).ty.dtype;
        let keep = self.helper("keep", Op::cast(dtype), vec![Some(inside)])?;
        let mul = Op::Binary { func: BinaryOp::Mul };
        let share = self.emit(idx, mul, vec![Some(picked), Some(keep)], None)?[0];
        let sum = self.comm(share, CommKind::AllReduce, 0, Layout::Replicated)?;
        self.map.insert(self.src.node(idx).outputs[0], sum);
        Ok(Some(()))
    }

    /// Token ids relative to the rank's first vocabulary row, with those
    /// outside its rows set to 0, and the mask of those inside.
    pub(super) fn local_ids(&mut self, ids: TensorId, vocab: usize) -> Result<(TensorId, TensorId), TpError> {
        let rows = vocab / self.parts;
        let int = |v: i64| Value::i64(vec![], vec![v]).expect("scalar");
        self.count += 1;
        let all = (0..vocab as i64).collect();
        let all = self.g.add_constant(
            format!("{}/vocab{}", self.prefix(), self.count),
            Value::i64(vec![vocab], all).expect("1-D ids"),
        );
        // Not cached across uses: an embedding and a loss at the two ends of
        // a pipeline each slice their own, so no ids cross stages.
        let mine = self.comm(
            all,
            CommKind::Slice,
            0,
            Layout::Split {
                axis: 0,
                blocks: WHOLE,
            },
        )?;
        let zero = self
            .g
            .add_constant(format!("{}/first{}", self.prefix(), self.count), int(0));
        let first = self.helper(
            "vocab_start",
            Op::Gather { axis: 0 },
            vec![Some(mine), Some(zero)],
        )?;
        let bin = |func| Op::Binary { func };
        let local = self.helper("local_ids", bin(BinaryOp::Sub), vec![Some(ids), Some(first)])?;
        let end = self
            .g
            .add_constant(format!("{}/rows{}", self.prefix(), self.count), int(rows as i64));
        let low = self.helper(
            "above_start",
            bin(BinaryOp::GreaterOrEqual),
            vec![Some(local), Some(zero)],
        )?;
        let high = self.helper("below_end", bin(BinaryOp::Less), vec![Some(local), Some(end)])?;
        let inside = self.helper("in_rows", bin(BinaryOp::And), vec![Some(low), Some(high)])?;
        let as_int = self.helper("in_rows_int", Op::cast(DType::I64), vec![Some(inside)])?;
        let local = self.helper("row_ids", bin(BinaryOp::Mul), vec![Some(local), Some(as_int)])?;
        Ok((local, inside))
    }

    /// A pending sum made whole for a non-linear reader: all-reduced, or
    /// under sequence parallelism reduce-scattered along the sequence (as a
    /// row-parallel linear's output is).
    pub(super) fn reduced(&mut self, x: TensorId) -> Result<TensorId, TpError> {
        let d = self.dims(x);
        if self.sp && d.len() >= 3 && d[1] % self.parts == 0 {
            let seq = Layout::Split {
                axis: 1,
                blocks: WHOLE,
            };
            return self.settle(x, CommKind::ReduceScatter, 1, seq);
        }
        self.settle(x, CommKind::AllReduce, 0, Layout::Replicated)
    }

    /// Settles pending sums before node `idx` reads them: sums and
    /// differences of pending sums stay pending (returns true: the node is
    /// done); any other reader gets them reduced in `ins`.
    pub(super) fn settle_partials(
        &mut self,
        idx: NodeIndex,
        ins: &mut [Option<TensorId>],
    ) -> Result<bool, TpError> {
        let layouts: Vec<Option<Layout>> = ins.iter().map(|t| t.and_then(|t| self.layout(t))).collect();
        if !layouts.contains(&Some(Layout::Partial)) {
            return Ok(false);
        }
        let op = self.src.node(idx).op.clone();
        let linear = matches!(
            op,
            Op::Binary {
                func: BinaryOp::Add | BinaryOp::Sub
            }
        );
        let all_pending = ins
            .iter()
            .zip(&layouts)
            .all(|(t, l)| t.is_none() || *l == Some(Layout::Partial));
        if linear && all_pending {
            self.emit(idx, op, ins.to_vec(), Some(Layout::Partial))?;
            return Ok(true);
        }
        for (slot, layout) in layouts.iter().enumerate() {
            if let (Some(Layout::Partial), Some(t)) = (layout, ins[slot]) {
                ins[slot] = Some(self.reduced(t)?);
            }
        }
        Ok(false)
    }
}

//! Linear layers: Megatron's column and row splits, fused projections cut
//! per block, and how a weight is stored or sliced for them.

use super::{norm, Layout, Rewriter, TpError, WeightSlice, WHOLE};
use autopar_ir::{BinaryOp, CommKind, NodeIndex, Op, Role, Shape, TensorId};

impl Rewriter<'_> {
    /// A linear layer: column-split on a whole input, row-split on a
    /// column-split one, whole when its dims do not divide.
    pub(super) fn linear(&mut self, idx: NodeIndex, ins: Vec<Option<TensorId>>) -> Result<(), TpError> {
        let name = self.src.node(idx).name.clone();
        let x = ins[0].ok_or_else(|| self.err(&name, "no input"))?;
        let w = ins[1].ok_or_else(|| self.err(&name, "no weight"))?;
        let bias = ins.get(2).copied().flatten();
        let wd = self.dims(w);
        let xd = self.dims(x);
        let last = xd.len() - 1;
        let p = self.parts;
        if self.layout(x)
            == Some(Layout::Split {
                axis: last,
                blocks: WHOLE,
            })
            && wd[0] % p == 0
        {
            // Row-split: each rank multiplies its rows; the shares are summed.
            let w = self.slice_weight(w, 0, WHOLE, &name)?;
            let out = self.src.node(idx).outputs[0];
            let share_name = format!("{}.share", self.src.tensor(out).name);
            let share = self.add(
                format!("{name}.share"),
                Op::Linear,
                vec![Some(x), Some(w), None],
                &[share_name],
            )?[0];
            let seq_split = self.sp && xd.len() >= 3 && xd[1] % p == 0;
            let (summed, layout) = if seq_split {
                let l = Layout::Split {
                    axis: 1,
                    blocks: WHOLE,
                };
                (self.comm(share, CommKind::ReduceScatter, 1, l)?, l)
            } else {
                (
                    self.comm(share, CommKind::AllReduce, 0, Layout::Replicated)?,
                    Layout::Replicated,
                )
            };
            let result = match bias {
                Some(b) => {
                    let b = if seq_split { self.copied_in(b)? } else { b };
                    let names = [self.src.tensor(out).name.clone()];
                    self.add(
                        name.clone(),
                        Op::Binary { func: BinaryOp::Add },
                        vec![Some(summed), Some(b)],
                        &names,
                    )?[0]
                }
                None => summed,
            };
            self.map.insert(out, result);
            self.layouts.insert(result, layout);
            return Ok(());
        }
        if wd[1] % p != 0 {
            return self.whole(idx, ins);
        }
        let blocks = self.qkv_blocks(idx, wd[1]);
        let stored = self.stores_sliced(idx, 1) && bias.is_none_or(|_| self.stores_sliced(idx, 2));
        if blocks > 1 && !stored {
            return self.whole(idx, ins);
        }
        // Column-split: the input whole on every rank, copied in.
        let x = match self.layout(x) {
            Some(Layout::Split { axis, blocks: WHOLE }) if self.sp && axis != last => {
                self.comm(x, CommKind::GatherForCompute, axis, Layout::Replicated)?
            }
            _ => {
                let whole = self.replicated(x, &name)?;
                self.copied_in(whole)?
            }
        };
        let w = self.slice_weight(w, 1, blocks, &name)?;
        let b = bias.map(|b| self.slice_weight(b, 0, blocks, &name)).transpose()?;
        self.emit(
            idx,
            Op::Linear,
            vec![Some(x), Some(w), b],
            Some(Layout::Split { axis: last, blocks }),
        )?;
        Ok(())
    }

    /// Blocks of a column split: `k` when the output's only consumer splits
    /// it into `k` equal parts along the last dim (a fused projection).
    fn qkv_blocks(&self, idx: NodeIndex, cols: usize) -> usize {
        let out = self.src.node(idx).outputs[0];
        let consumers = self.src.consumers(out);
        if let [c] = consumers.as_slice() {
            if let (Op::Split { axis, outputs, .. }, true) = (&self.src.node(*c).op, self.equal_split(*c)) {
                let rank = self.src.tensor(out).ty.shape.rank();
                if norm(*axis, rank) == rank - 1 && cols % (outputs * self.parts) == 0 {
                    return *outputs;
                }
            }
        }
        WHOLE
    }

    /// True when the `Split` node `idx` cuts into equal pieces (no sizes, or
    /// equal sizes as an attribute or a constant input).
    pub(super) fn equal_split(&self, idx: NodeIndex) -> bool {
        let n = self.src.node(idx);
        let Op::Split { split, .. } = &n.op else {
            return false;
        };
        let sizes: Option<Vec<i64>> = match (split, n.inputs.get(1).copied().flatten()) {
            (Some(s), _) => Some(s.clone()),
            (None, Some(t)) => match self.src.tensor(t).data.as_deref().and_then(|v| v.as_i64()) {
                Some(v) => Some(v.to_vec()),
                None => return false,
            },
            (None, None) => None,
        };
        sizes.is_none_or(|s| s.windows(2).all(|w| w[0] == w[1]))
    }

    /// True when input `slot` of `idx` is a parameter used by this node alone
    /// (so it can be stored sliced).
    pub(super) fn stores_sliced(&self, idx: NodeIndex, slot: usize) -> bool {
        let Some(Some(t)) = self.src.node(idx).inputs.get(slot).copied() else {
            return false;
        };
        self.src.tensor(t).role == Role::Parameter && self.src.consumers(t).len() == 1
    }

    /// The rank's slice of weight `w` along `axis`: stored sliced when only
    /// this node uses it (directly, or through a transpose of its own, as a
    /// tied head reads the embedding table), else sliced from the whole
    /// weight by comm ops (whose backward gathers the gradient).
    pub(super) fn slice_weight(
        &mut self,
        w: TensorId,
        axis: usize,
        blocks: usize,
        at: &str,
    ) -> Result<TensorId, TpError> {
        if self.g.tensor(w).role == Role::Parameter && self.sole_use(w) && !self.whole_stored(w) {
            self.store_sliced(w, axis, blocks, at)?;
            return Ok(w);
        }
        if let Some((param, param_axis)) = self.transposed_param(w, axis) {
            self.store_sliced(param, param_axis, blocks, at)?;
            let mut dims = self.dims(w);
            dims[axis] /= self.parts;
            self.g.tensor_mut(w).ty.shape = Shape::fixed(&dims);
            return Ok(w);
        }
        self.block_slice(w, axis, blocks)
    }

    /// True when parameter `t` must be stored whole.
    fn whole_stored(&self, t: TensorId) -> bool {
        self.stored_whole.contains(&self.g.tensor(t).name)
    }

    /// True when the source tensor named like `t` has one consumer.
    fn sole_use(&self, t: TensorId) -> bool {
        let name = &self.g.tensor(t).name;
        self.src
            .tensors()
            .find(|(_, s)| &s.name == name)
            .is_some_and(|(id, _)| self.src.consumers(id).len() == 1)
    }

    /// When `w` is a transpose, read only here, of a parameter read only by
    /// it: that parameter and its axis that becomes `w`'s `axis`.
    fn transposed_param(&self, w: TensorId, axis: usize) -> Option<(TensorId, usize)> {
        let node = self.g.node(self.g.producer(w)?);
        let Op::Transpose { perm } = &node.op else {
            return None;
        };
        let param = node.inputs.first().copied().flatten()?;
        let rank = self.dims(param).len();
        let perm = perm.clone().unwrap_or_else(|| (0..rank).rev().collect());
        let from = *perm.get(axis)?;
        let own = self.g.tensor(param).role == Role::Parameter
            && self.sole_use(param)
            && self.sole_use(w)
            && !self.whole_stored(param);
        own.then_some((param, from))
    }

    /// Stores parameter `w` as the rank's slice along `axis`.
    fn store_sliced(&mut self, w: TensorId, axis: usize, blocks: usize, at: &str) -> Result<(), TpError> {
        let name = self.g.tensor(w).name.clone();
        let mut dims = self.dims(w);
        if dims[axis] % (self.parts * blocks) != 0 {
            return Err(self.err(
                at,
                format!("weight '{name}' dim {axis} does not split {}-way", self.parts),
            ));
        }
        dims[axis] /= self.parts;
        self.g.tensor_mut(w).ty.shape = Shape::fixed(&dims);
        self.slices.insert(name, WeightSlice { axis, blocks });
        Ok(())
    }
}

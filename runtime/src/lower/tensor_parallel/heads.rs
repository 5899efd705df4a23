//! Where the split dim goes: attention on the heads its inputs carry, and
//! the reshapes, transposes and splits that move a split dim (or cut a
//! fused projection into its blocks).

use super::{norm, reshape_axis, Layout, Rewriter, TpError, WHOLE};
use autopar_ir::{NodeIndex, Op, TensorId, Value};

impl Rewriter<'_> {
    /// Attention on head-split queries, keys and values (a mask must not
    /// vary per head); anything else runs whole.
    pub(super) fn attention(&mut self, idx: NodeIndex, ins: Vec<Option<TensorId>>) -> Result<(), TpError> {
        let heads = Layout::Split {
            axis: 1,
            blocks: WHOLE,
        };
        let qkv_split = (0..3).all(|i| self.layout_of_slot(&ins, i) == Some(heads));
        let mask_ok = match ins.get(3).copied().flatten() {
            None => true,
            Some(m) => {
                let d = self.dims(m);
                d.len() < 3 || d[d.len() - 3] == 1
            }
        };
        if !(qkv_split && mask_ok) {
            return self.whole(idx, ins);
        }
        let mut ins = ins;
        if let Some(Some(m)) = ins.get(3).copied() {
            ins[3] = Some(self.copied_in(m)?);
        }
        self.emit(idx, self.src.node(idx).op.clone(), ins, Some(heads))?;
        Ok(())
    }

    /// A reshape carries a split dim to the output dim at the same offset.
    pub(super) fn reshape(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        allowzero: bool,
        first: Layout,
    ) -> Result<(), TpError> {
        let Layout::Split { axis, blocks: WHOLE } = first else {
            return self.whole(idx, ins);
        };
        let x = ins[0].expect("reshape input");
        // The whole dims: a split of one head per rank is 1 locally.
        let in_dims = self.source_dims(self.src.node(idx).inputs[0].expect("reshape input"));
        let out_dims = self.source_dims(self.src.node(idx).outputs[0]);
        let Some(j) = reshape_axis(&in_dims, axis, &out_dims, self.parts) else {
            return self.whole(idx, ins);
        };
        let mut local: Vec<i64> = out_dims.iter().map(|&d| d as i64).collect();
        local[j] /= self.parts as i64;
        self.count += 1;
        let c = self.g.add_constant(
            format!("tp/shape{}", self.count),
            Value::i64(vec![local.len()], local).expect("1-D shape"),
        );
        let split = Layout::Split {
            axis: j,
            blocks: WHOLE,
        };
        self.emit(
            idx,
            Op::Reshape { allowzero },
            vec![Some(x), Some(c)],
            Some(split),
        )?;
        Ok(())
    }

    pub(super) fn transpose(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        perm: Option<&[usize]>,
        first: Layout,
    ) -> Result<(), TpError> {
        match first {
            Layout::Split { axis, blocks } => {
                let rank = self.dims(ins[0].expect("transpose input")).len();
                let perm: Vec<usize> = perm.map_or_else(|| (0..rank).rev().collect(), <[usize]>::to_vec);
                let to = perm.iter().position(|&p| p == axis).unwrap_or(axis);
                let op = self.src.node(idx).op.clone();
                self.emit(idx, op, ins, Some(Layout::Split { axis: to, blocks }))?;
                Ok(())
            }
            Layout::Replicated | Layout::Partial => self.whole(idx, ins),
        }
    }

    /// A split along another dim keeps the split; a block-split tensor cut
    /// into its blocks gives pieces split alike.
    pub(super) fn split(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        axis: i64,
        outputs: usize,
        first: Layout,
    ) -> Result<(), TpError> {
        let rank = self.dims(ins[0].expect("split input")).len();
        let along = norm(axis, rank);
        match first {
            Layout::Split { axis: a, blocks } if a != along => {
                let op = self.src.node(idx).op.clone();
                self.emit(idx, op, ins, Some(Layout::Split { axis: a, blocks }))?;
                Ok(())
            }
            Layout::Split { axis: a, blocks } if blocks == outputs && self.equal_split(idx) => {
                let op = Op::Split {
                    axis,
                    split: None,
                    outputs,
                };
                let piece = Layout::Split {
                    axis: a,
                    blocks: WHOLE,
                };
                self.emit(idx, op, vec![ins[0]], Some(piece))?;
                Ok(())
            }
            Layout::Split { .. } | Layout::Replicated | Layout::Partial => self.whole(idx, ins),
        }
    }
}

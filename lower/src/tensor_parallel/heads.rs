//! Where the split dim goes: attention on the heads its inputs carry, and
//! the reshapes, transposes, splits, slices and concatenations that move
//! or keep a split dim (or cut a fused projection into its blocks).

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
        self.keep(idx, ins, heads)
    }

    /// A reshape carries a split dim to the output dim at the same offset.
    pub(super) fn reshape(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        allowzero: bool,
        first: Layout,
    ) -> Result<(), TpError> {
        let Layout::Split { axis, blocks } = first else {
            return self.whole(idx, ins);
        };
        let x = ins[0].expect("reshape input");
        // The whole dims: a split of one head per rank is 1 locally.
        let in_dims = self.source_dims(self.src.node(idx).inputs[0].expect("reshape input"));
        let out_dims = self.source_dims(self.src.node(idx).outputs[0]);
        let moved = match blocks {
            WHOLE => reshape_axis(&in_dims, axis, &out_dims, self.parts).map(|j| (j, WHOLE)),
            _ => None,
        };
        // Context parallelism keeps tokens split through a flattening of
        // batch and sequence (each rank its rows of every sequence).
        let blocked = || {
            self.context
                .then(|| blocked_reshape(&in_dims, (axis, blocks), &out_dims))
                .flatten()
        };
        let Some((j, blocks)) = moved.or_else(blocked) else {
            return self.whole(idx, ins);
        };
        let c = self.local_shape(&out_dims, j);
        let split = Layout::Split { axis: j, blocks };
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
                self.keep(idx, ins, Layout::Split { axis: to, blocks })
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
                self.keep(idx, ins, Layout::Split { axis: a, blocks })
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

    /// A slice along other dims than the split one keeps the split (an
    /// exported rotary embedding's halves of each head).
    pub(super) fn slice(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        first: Layout,
    ) -> Result<(), TpError> {
        let Layout::Split {
            axis: a,
            blocks: WHOLE,
        } = first
        else {
            return self.whole(idx, ins);
        };
        let rank = self.dims(ins[0].expect("slice input")).len();
        let ints = |slot: usize| -> Option<Vec<i64>> {
            let t = ins.get(slot).copied().flatten()?;
            self.g.tensor(t).data.as_deref()?.as_i64().map(<[i64]>::to_vec)
        };
        let axes: Option<Vec<usize>> = match (ints(3), ints(1)) {
            (Some(axes), _) => Some(axes.iter().map(|&x| norm(x, rank)).collect()),
            (None, Some(starts)) if ins.get(3).copied().flatten().is_none() => {
                Some((0..starts.len()).collect())
            }
            (None, _) => None,
        };
        let data_only = ins.iter().skip(1).flatten().all(|&t| self.layout(t).is_none());
        match axes {
            Some(axes) if data_only && !axes.contains(&a) => self.keep(idx, ins, first),
            _ => self.whole(idx, ins),
        }
    }

    /// Concatenating tensors split alike along another dim keeps the split.
    pub(super) fn concat(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        axis: i64,
    ) -> Result<(), TpError> {
        let layouts: Vec<Option<Layout>> = ins.iter().map(|t| t.and_then(|t| self.layout(t))).collect();
        let rank = self.source_dims(self.src.node(idx).outputs[0]).len();
        match layouts.first().copied().flatten() {
            Some(
                split @ Layout::Split {
                    axis: a,
                    blocks: WHOLE,
                },
            ) if a != norm(axis, rank) && layouts.iter().all(|&l| l == Some(split)) => {
                self.keep(idx, ins, split)
            }
            _ => self.whole(idx, ins),
        }
    }

    /// New unit dims leave a split dim split (a grouped-query attention's
    /// key/value heads before they are repeated).
    pub(super) fn unsqueeze(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        first: Layout,
    ) -> Result<(), TpError> {
        let n = self.src.node(idx);
        let in_dims = self.source_dims(n.inputs[0].expect("unsqueeze input"));
        let out_dims = self.source_dims(n.outputs[0]);
        let to = match first {
            Layout::Split { axis, blocks: WHOLE } => reshape_axis(&in_dims, axis, &out_dims, self.parts),
            Layout::Split { .. } | Layout::Replicated | Layout::Partial => None,
        };
        let Some(j) = to else {
            return self.whole(idx, ins);
        };
        let split = Layout::Split {
            axis: j,
            blocks: WHOLE,
        };
        self.keep(idx, ins, split)
    }

    /// Broadcasting other dims leaves a split dim split: the target shape
    /// takes the rank's part of it.
    pub(super) fn expand(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        first: Layout,
    ) -> Result<(), TpError> {
        let n = self.src.node(idx);
        let in_dims = self.source_dims(n.inputs[0].expect("expand input"));
        let out_dims = self.source_dims(n.outputs[0]);
        let Layout::Split { axis, blocks: WHOLE } = first else {
            return self.whole(idx, ins);
        };
        let j = axis + out_dims.len() - in_dims.len();
        let shape_is_data = ins
            .get(1)
            .copied()
            .flatten()
            .is_some_and(|t| self.layout(t).is_none());
        if out_dims[j] != in_dims[axis] || !shape_is_data {
            return self.whole(idx, ins);
        }
        let c = self.local_shape(&out_dims, j);
        let split = Layout::Split {
            axis: j,
            blocks: WHOLE,
        };
        self.emit(idx, Op::Expand, vec![ins[0], Some(c)], Some(split))?;
        Ok(())
    }

    /// A norm over dims after the split one runs on the rank's rows; its
    /// scale and shift are copied in (their gradients are shares).
    pub(super) fn row_norm(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        axis: i64,
        first: Layout,
    ) -> Result<(), TpError> {
        let rank = self.dims(ins[0].expect("norm input")).len();
        match first {
            Layout::Split {
                axis: a,
                blocks: WHOLE,
            } if a < norm(axis, rank) => {
                let mut ins = ins;
                for slot in ins.iter_mut().skip(1) {
                    if let Some(w) = *slot {
                        *slot = Some(self.copied_in(w)?);
                    }
                }
                self.keep(idx, ins, first)
            }
            Layout::Split { .. } | Layout::Replicated | Layout::Partial => self.whole(idx, ins),
        }
    }

    /// A softmax along another dim than the split one keeps the split.
    pub(super) fn softmax(
        &mut self,
        idx: NodeIndex,
        ins: Vec<Option<TensorId>>,
        axis: i64,
        first: Layout,
    ) -> Result<(), TpError> {
        let rank = self.dims(ins[0].expect("softmax input")).len();
        match first {
            Layout::Split { axis: a, .. } if a != norm(axis, rank) => self.keep(idx, ins, first),
            Layout::Split { .. } | Layout::Replicated | Layout::Partial => self.whole(idx, ins),
        }
    }

    /// Runs the node as it is, its outputs laid out as `layout`.
    fn keep(&mut self, idx: NodeIndex, ins: Vec<Option<TensorId>>, layout: Layout) -> Result<(), TpError> {
        let op = self.src.node(idx).op.clone();
        self.emit(idx, op, ins, Some(layout))?;
        Ok(())
    }

    /// A shape constant: `dims` with dim `j` cut to the rank's part.
    pub(super) fn local_shape(&mut self, dims: &[usize], j: usize) -> TensorId {
        let mut local: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        local[j] /= self.parts as i64;
        self.count += 1;
        self.g.add_constant(
            format!("{}/shape{}", self.prefix(), self.count),
            Value::i64(vec![local.len()], local).expect("1-D shape"),
        )
    }
}

/// Where a reshape takes a split dim that it merges with the dims before it
/// (`[b, s, h] → [b·s, h]` with `s` split: each of the `b` blocks of the
/// merged dim is split) or splits out again (`[b·s, h] → [b, s, h]`, the
/// merged dim split in `b` blocks): the output dim and its blocks.
fn blocked_reshape(
    input: &[usize],
    (axis, blocks): (usize, usize),
    output: &[usize],
) -> Option<(usize, usize)> {
    let after = |dims: &[usize], i: usize| -> usize { dims[i + 1..].iter().product() };
    let tail = after(input, axis);
    if blocks == WHOLE {
        // Merging: the output dim holding `input[..=axis]` flattened, the same dims after it.
        let merged: usize = input[..=axis].iter().product();
        let j = output.iter().position(|&d| d == merged)?;
        let outer: usize = input[..axis].iter().product();
        (output[..j].iter().all(|&d| d == 1) && after(output, j) == tail && outer > 1).then_some((j, outer))
    } else {
        // Splitting out: `blocks` outer rows, then the split dim.
        let j = output.iter().position(|&d| d * blocks == input[axis])?;
        let outer: usize = output[..j].iter().product();
        (outer == blocks * input[..axis].iter().product::<usize>() && after(output, j) == tail)
            .then_some((j, WHOLE))
    }
}

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
            // Token-wise products and lookups: each rank its tokens.
            Op::Linear | Op::MatMul if is(self, 0, tokens) && self.layout_of_slot(ins, 1).is_none() => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(tokens))?;
            }
            Op::Embedding if is(self, 1, tokens) => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(tokens))?;
            }
            Op::GatherElements { axis } if (0..2).all(|i| is(self, i, tokens)) && *axis != 1 => {
                self.emit(idx, n.op.clone(), ins.to_vec(), Some(tokens))?;
            }
            Op::Attention { scale, causal } => {
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
                if *causal {
                    let lower: Vec<bool> = (0..keys * keys).map(|i| i % keys <= i / keys).collect();
                    self.count += 1;
                    let c = self.g.add_constant(
                        format!("tp/causal{}", self.count),
                        Value::new(
                            autopar_ir::DType::Bool,
                            vec![keys, keys],
                            autopar_ir::Data::Bool(lower),
                        )
                        .expect("square mask"),
                    );
                    mask = Some(self.comm(
                        c,
                        CommKind::Slice,
                        0,
                        Layout::Split {
                            axis: 0,
                            blocks: WHOLE,
                        },
                    )?);
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
                    let is_bool = self.g.tensor(own).ty.dtype == autopar_ir::DType::Bool;
                    mask = match mask {
                        None => Some(own),
                        Some(c) if is_bool => Some(self.helper(
                            "mask_and",
                            Op::Binary { func: BinaryOp::And },
                            vec![Some(c), Some(own)],
                        )?),
                        Some(_) => return Ok(None),
                    };
                }
                let op = Op::Attention {
                    scale: *scale,
                    causal: false,
                };
                self.emit(idx, op, vec![ins[0], Some(k), Some(v), mask], Some(seq))?;
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
}

//! Tensor-parallel communication nodes (and those of context and expert
//! parallelism): on the backend's own collectives where it has them, else
//! through host memory and the fabric.

use super::{on_device, Failure, RankError, RankRun};
use crate::backend::{Backend, Order};
use crate::slices;
use autopar_comm::collective::values::{from_buffer, to_buffer};
use autopar_comm::collective::{Algorithm, Buffer};
use autopar_ir::{CommKind, Graph};
use autopar_lower::Buf;

impl<B: Backend> RankRun<'_, B> {
    /// A tensor-parallel communication node.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn collective(
        &mut self,
        node: &str,
        mb: usize,
        kind: CommKind,
        axis: usize,
        group: &[usize],
        tag: &str,
        what: &str,
    ) -> Result<(), Failure> {
        let g: &Graph = &self.t.graph;
        let idx = *self
            .nodes
            .get(node)
            .ok_or_else(|| RankError::NoNode(node.to_string()))?;
        let (input, output) = (g.node(idx).inputs[0], g.node(idx).outputs[0]);
        let out_name = g.tensor(output).name.clone();
        let input = input.ok_or_else(|| RankError::NoInput(node.to_string()))?;
        let held = self.input(input, mb)?;
        // A copy into the tensor-parallel region is its input, shared
        // ([`Op::passes_input`]).
        if g.node(idx).op.passes_input() {
            self.put(Buf::of(&out_name, mb), held);
            return Ok(());
        }
        let done = match kind {
            CommKind::AllReduce => {
                // The backend copies the input before summing in place if
                // it is shared, as it is here: the input stays readable.
                let mut y = held.clone();
                let summed = on_device(&mut self.dev, |d| d.all_reduce(&mut y, group, Order::Inline))?;
                summed.unwrap_or(false).then_some(y)
            }
            CommKind::AllGather | CommKind::GatherForCompute => {
                on_device(&mut self.dev, |d| d.gather_along(&held, group, axis))?.flatten()
            }
            CommKind::ReduceScatter => {
                on_device(&mut self.dev, |d| d.reduce_scatter_along(&held, group, axis))?.flatten()
            }
            CommKind::Copy | CommKind::Slice => None,
        };
        if let Some(y) = done {
            self.put(Buf::of(&out_name, mb), y);
            return Ok(());
        }
        let x = self.host(&held)?;
        let parts = group.len();
        let pos = group.iter().position(|&r| r == self.program.rank).unwrap_or(0);
        let y = match kind {
            CommKind::Copy => unreachable!("handled above"),
            CommKind::Slice => slices::take(&x, axis, 1, pos, parts),
            CommKind::AllReduce => {
                let mut b = to_buffer(&x);
                self.ep.all_reduce(group, &mut b, Algorithm::Ring, tag, what)?;
                from_buffer(b, x.dtype, x.shape.clone())?
            }
            CommKind::AllGather | CommKind::GatherForCompute => {
                let all = self.ep.all_gather(group, &to_buffer(&x), tag, what)?;
                let pieces = all
                    .split_even(parts)
                    .ok_or(RankError::UnevenGather)?
                    .into_iter()
                    .map(|b| from_buffer(b, x.dtype, x.shape.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                slices::join(&pieces, axis, 1)
            }
            CommKind::ReduceScatter => {
                let pieces: Vec<Buffer> = (0..parts)
                    .map(|r| to_buffer(&slices::take(&x, axis, 1, r, parts)))
                    .collect();
                let flat = Buffer::concat(&pieces).ok_or(RankError::NothingToScatter)?;
                let mine = self.ep.reduce_scatter(group, &flat, tag, what)?;
                let mut shape = x.shape.clone();
                shape[axis] /= parts;
                from_buffer(mine, x.dtype, shape)?
            }
        };
        self.put_host(Buf::of(&out_name, mb), y)
    }
}

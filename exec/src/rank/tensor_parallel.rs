//! Tensor-parallel communication nodes (and those of context and expert
//! parallelism): on the backend's own collectives where it has them, else
//! through host memory and the fabric.

use super::{on_device, Failure, RankError, RankRun};
use crate::backend::{Backend, Order};
use crate::slices;
use autopar_comm::collective::values::{from_buffer, to_buffer};
use autopar_comm::collective::{Algorithm, Buffer};
use autopar_ir::{CommKind, Graph, TensorId};
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
            // Data-dependent exchanges run on the host collectives.
            CommKind::Copy
            | CommKind::Slice
            | CommKind::AllToAll
            | CommKind::Dispatch
            | CommKind::Combine => None,
        };
        if let Some(y) = done {
            self.put(Buf::of(&out_name, mb), y);
            return Ok(());
        }
        let x = self.host(&held)?;
        let parts = group.len();
        let pos = group.iter().position(|&r| r == self.program.rank).unwrap_or(0);
        if matches!(kind, CommKind::AllToAll | CommKind::Dispatch | CommKind::Combine) && axis != 0 {
            return Err(RankError::AllToAllAxis(node.to_string()).into());
        }
        let counts = match kind.counted() {
            true => {
                let slots = &g.node(idx).inputs;
                let (sent, received) = (slots[1], slots[2]);
                Some((
                    self.rows(sent, node, mb, parts)?,
                    self.rows(received, node, mb, parts)?,
                ))
            }
            false => None,
        };
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
            CommKind::AllToAll => {
                let all = self.ep.all_to_all(group, &to_buffer(&x), tag, what)?;
                from_buffer(all, x.dtype, x.shape.clone())?
            }
            CommKind::Dispatch | CommKind::Combine => {
                let (sent, received) = counts.ok_or_else(|| RankError::NoInput(node.to_string()))?;
                let bad = || RankError::BadCounts(node.to_string());
                let row: usize = x.shape[1..].iter().product();
                let elements = |rows: &[usize]| rows.iter().map(|r| r * row).collect::<Vec<_>>();
                let dispatch = kind == CommKind::Dispatch;
                // Dispatch sends packed rows and receives into padded
                // blocks; Combine the reverse.
                let n = if dispatch { x.shape[0] } else { x.shape[0] / parts };
                let padded = |rows: &[usize]| rows.iter().all(|&r| r <= n);
                let packed = |rows: &[usize]| rows.iter().sum::<usize>() <= n;
                let fits = if dispatch {
                    packed(&sent) && sent.iter().sum::<usize>() == x.shape[0] && padded(&received)
                } else {
                    padded(&sent) && packed(&received)
                };
                if !fits {
                    return Err(bad().into());
                }
                // Dispatch sends its packed rows and spreads what arrives
                // into padded blocks; Combine packs its blocks' rows and
                // receives packed.
                let starts = |rows: &[usize]| {
                    rows.iter()
                        .scan(0, |at, &r| Some(std::mem::replace(at, *at + r)))
                        .collect::<Vec<_>>()
                };
                let blocks = |rows: &[usize]| -> Vec<(usize, usize, usize)> {
                    starts(rows)
                        .into_iter()
                        .zip(rows)
                        .enumerate()
                        .map(|(r, (at, &c))| (at, r * n, c))
                        .collect()
                };
                let data = match dispatch {
                    true => to_buffer(&x),
                    false => {
                        let moves: Vec<_> = blocks(&sent)
                            .into_iter()
                            .map(|(at, block, c)| (block, at, c))
                            .collect();
                        to_buffer(&slices::move_rows(&x, &moves, sent.iter().sum()))
                    }
                };
                let got =
                    self.ep
                        .all_to_all_v(group, &data, &elements(&sent), &elements(&received), tag, what)?;
                let total = received.iter().sum();
                let mut shape = x.shape.clone();
                shape[0] = total;
                let got = from_buffer(got, x.dtype, shape)?;
                match dispatch {
                    true => slices::move_rows(&got, &blocks(&received), parts * n),
                    false => slices::move_rows(&got, &[(0, 0, total)], n),
                }
            }
        };
        self.put_host(Buf::of(&out_name, mb), y)
    }
}

impl<B: Backend> RankRun<'_, B> {
    /// Rows per rank of a counted exchange's counts input `t`.
    fn rows(
        &mut self,
        t: Option<TensorId>,
        node: &str,
        mb: usize,
        parts: usize,
    ) -> Result<Vec<usize>, Failure> {
        let t = t.ok_or_else(|| RankError::NoInput(node.to_string()))?;
        let held = self.input(t, mb)?;
        let v = self.host(&held)?;
        v.as_i64()
            .and_then(|ints| rows_per_rank(ints, parts))
            .ok_or_else(|| RankError::BadCounts(node.to_string()).into())
    }
}

/// Rows per rank from a counted exchange's counts (`[parts, ..]`, summed
/// over the trailing dims); `None` for a negative count or a wrong shape.
fn rows_per_rank(counts: &[i64], parts: usize) -> Option<Vec<usize>> {
    if parts == 0 || counts.len() % parts != 0 {
        return None;
    }
    counts
        .chunks(counts.len() / parts)
        .map(|c| c.iter().map(|&n| usize::try_from(n).ok()).sum())
        .collect()
}

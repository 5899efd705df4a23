//! The collectives, as real algorithms over the fabric's point-to-point
//! messages: ring reduce-scatter and all-gather (and all-reduce as the two
//! in turn), pairwise-exchange all-to-all, chain broadcast and
//! parameter-server all-reduce. Internal messages carry sub-tags derived
//! from the caller's tag, one per step.
//!
//! The algorithms work in place on the caller's elements: a chunk is sent
//! as a copy of its slice (written straight to a socket between processes),
//! a partial sum or gathered chunk that arrives is forwarded as it is, and
//! every received vector goes back to the fabric's pool, so a collective
//! allocates nothing once the pool is warm.

use super::buffer::{with_elements, Element};
use super::{Algorithm, Buffer, Collective, CommError, Endpoint};
use std::ops::Range;

/// A validated group and this rank's position in it (ring order = group
/// order).
pub(super) struct Ring<'a> {
    group: &'a [usize],
    pub(super) pos: usize,
}

impl Ring<'_> {
    pub(super) fn n(&self) -> usize {
        self.group.len()
    }

    /// Global rank at `offset` positions after this one (wrapping).
    pub(super) fn after(&self, offset: usize) -> usize {
        self.group[(self.pos + offset) % self.n()]
    }

    /// Global rank at `offset` positions before this one (wrapping).
    pub(super) fn before(&self, offset: usize) -> usize {
        self.group[(self.pos + self.n() - offset % self.n()) % self.n()]
    }
}

impl Endpoint {
    /// Checks `group` (non-empty, distinct ranks on this fabric, including
    /// this one) and finds this rank's position in it.
    pub(super) fn ring<'a>(&self, group: &'a [usize], what: &str) -> Result<Ring<'a>, CommError> {
        let bad = |reason: String| CommError::BadGroup {
            rank: self.rank(),
            what: what.to_string(),
            group: group.to_vec(),
            reason,
        };
        if group.is_empty() {
            return Err(bad("it is empty".into()));
        }
        if let Some(&r) = group.iter().find(|&&r| r >= self.world()) {
            return Err(bad(format!("rank {r} is outside a world of {}", self.world())));
        }
        let mut sorted = group.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("rank {} appears twice", w[0])));
        }
        let pos = group
            .iter()
            .position(|&r| r == self.rank())
            .ok_or_else(|| CommError::NotInGroup {
                rank: self.rank(),
                what: what.to_string(),
                group: group.to_vec(),
            })?;
        Ok(Ring { group, pos })
    }

    /// Chunk boundaries: chunk `c` of a buffer split into `lengths` is
    /// `bounds[c]..bounds[c + 1]`.
    pub(super) fn bounds(lengths: &[usize]) -> Vec<usize> {
        std::iter::once(0)
            .chain(lengths.iter().scan(0, |end, &l| {
                *end += l;
                Some(*end)
            }))
            .collect()
    }

    /// The bounds of `len` elements in `n` equal chunks, or an error naming
    /// the uneven split (reduce-scatter and all-to-all need equal chunks).
    pub(super) fn even_bounds(&self, len: usize, n: usize, what: &str) -> Result<Vec<usize>, CommError> {
        Buffer::even_lengths(len, n)
            .map(|lengths| Self::bounds(&lengths))
            .ok_or_else(|| CommError::Uneven {
                rank: self.rank(),
                what: what.to_string(),
                len,
                parts: n,
            })
    }

    /// Sums `data` over `group` in place. Ring: reduce-scatter, then
    /// all-gather of the reduced chunks (any length; chunks differ by at most
    /// one element). Parameter server: everyone pushes to `group[0]`, which
    /// sums in group order and sends the result back. Either way each
    /// element is summed once by one rank, so all ranks get the same bits.
    pub fn all_reduce(
        &self,
        group: &[usize],
        data: &mut Buffer,
        algorithm: Algorithm,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let ring = self.ring(group, what)?;
        match algorithm {
            Algorithm::Tree => Err(CommError::Unsupported {
                rank: self.rank(),
                what: what.to_string(),
                collective: Collective::AllReduce,
                algorithm,
            }),
            _ if ring.n() == 1 => Ok(()),
            Algorithm::Ring => with_elements!(data, v => self.ring_all_reduce(&ring, v, AsIs, tag, what)),
            Algorithm::ParameterServer => {
                with_elements!(data, v => self.parameter_server_all_reduce(&ring, v, tag, what))
            }
        }
    }

    /// Sums `data` over `group` and returns this rank's share: position `p`
    /// gets chunk `p` of the sum. The length must divide by the group size.
    pub fn reduce_scatter(
        &self,
        group: &[usize],
        data: &Buffer,
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let ring = self.ring(group, what)?;
        let bounds = self.even_bounds(data.len(), ring.n(), what)?;
        with_elements!(data, v => {
            self.ring_reduce_scatter(&ring, v, &bounds, &AsIs, tag, what).map(Element::wrap)
        })
    }

    /// Concatenates every member's `chunk` in group order (all chunks must
    /// have the same type and length).
    pub fn all_gather(
        &self,
        group: &[usize],
        chunk: &Buffer,
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let ring = self.ring(group, what)?;
        let bounds = Self::bounds(&vec![chunk.len(); ring.n()]);
        with_elements!(chunk, v => {
            let mut all = vec![bytemuck::Zeroable::zeroed(); bounds[ring.n()]];
            all[span(&bounds, ring.pos)].copy_from_slice(v);
            self.ring_all_gather(&ring, &mut all, &bounds, &AsIs, tag, what)?;
            Ok(Element::wrap(all))
        })
    }

    /// Exchanges chunks: `data` is `n` equal chunks, chunk `j` goes to
    /// `group[j]`; chunk `i` of the result came from `group[i]`. Pairwise
    /// exchange: at step `s` send to `s` positions ahead, receive from `s`
    /// behind.
    pub fn all_to_all(
        &self,
        group: &[usize],
        data: &Buffer,
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let ring = self.ring(group, what)?;
        let bounds = self.even_bounds(data.len(), ring.n(), what)?;
        with_elements!(data, v => self.pairwise_all_to_all(&ring, v, &bounds, &bounds, tag, what).map(Element::wrap))
    }

    /// All-to-all of pieces of any length: `data` is the pieces for each
    /// member in group order, `send[i]` elements for position `i`, and the
    /// result the pieces received, `recv[i]` elements from position `i`, in
    /// group order. Every member's `send` must match its peers' `recv`
    /// (expert parallelism exchanges its counts first). Only the pieces
    /// travel, so the bytes sent are what was routed to other members.
    pub fn all_to_all_v(
        &self,
        group: &[usize],
        data: &Buffer,
        send: &[usize],
        recv: &[usize],
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let ring = self.ring(group, what)?;
        let total: usize = send.iter().sum();
        if send.len() != ring.n() || recv.len() != ring.n() || total != data.len() {
            return Err(CommError::Uneven {
                rank: self.rank(),
                what: what.to_string(),
                len: data.len(),
                parts: ring.n(),
            });
        }
        let (from, to) = (Self::bounds(send), Self::bounds(recv));
        with_elements!(data, v => self.pairwise_all_to_all(&ring, v, &from, &to, tag, what).map(Element::wrap))
    }

    /// Copies the buffer of the member at position `root` to every member,
    /// along a chain in group order starting at the root (each member but
    /// the last sends the whole buffer once). Every member passes a buffer of
    /// the root's type and length; non-roots' contents are replaced.
    pub fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        data: &mut Buffer,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let ring = self.ring(group, what)?;
        if root >= ring.n() {
            return Err(CommError::BadRoot {
                rank: self.rank(),
                what: what.to_string(),
                root,
                size: ring.n(),
            });
        }
        with_elements!(data, v => self.chain_broadcast(&ring, root, v, tag, what))
    }

    /// Ring all-reduce in place over chunks of balanced lengths, moving
    /// elements as `carrier` does.
    pub(super) fn ring_all_reduce<T: Element>(
        &self,
        ring: &Ring,
        data: &mut [T],
        carrier: impl Carrier<T>,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let bounds = Self::bounds(&Buffer::balanced_lengths(data.len(), ring.n()));
        let sum = self.ring_reduce_scatter(ring, data, &bounds, &carrier, tag, what)?;
        data[span(&bounds, ring.pos)].copy_from_slice(&sum);
        self.recycle(sum);
        self.ring_all_gather(ring, data, &bounds, &carrier, tag, what)
    }

    /// Ring reduce-scatter of `data`'s chunks (bounds every member agrees
    /// on); returns the sum of chunk `p`, this rank's position, as
    /// `carrier` settles it. At step `s` this rank sends its partial sum of
    /// chunk `p-s-1` to the next member (at step 0 its own chunk; later
    /// what it received the step before, with its term added) and receives
    /// the partial sum of chunk `p-s-2` from the previous one. Chunk `c` is
    /// summed along the ring starting at position `c+1`, the same order
    /// every run.
    pub(super) fn ring_reduce_scatter<T: Element>(
        &self,
        ring: &Ring,
        data: &[T],
        bounds: &[usize],
        carrier: &impl Carrier<T>,
        tag: &str,
        what: &str,
    ) -> Result<Vec<T>, CommError> {
        let (n, p) = (ring.n(), ring.pos);
        let (next, prev) = (ring.after(1), ring.before(1));
        let chunk = |c: usize| &data[span(bounds, c)];
        let mut partial: Option<Vec<T>> = None;
        for s in 0..n - 1 {
            let step_tag = format!("{tag}/rs{s}");
            let to = Hop {
                ep: self,
                peer: next,
                tag: &step_tag,
                what,
            };
            match partial.take() {
                None => carrier.send_slice(to, chunk((p + n - 1) % n))?,
                Some(sum) => carrier.send_vec(to, sum)?,
            }
            let own = chunk((p + 2 * n - s - 2) % n);
            let mut got = carrier.recv(Hop { peer: prev, ..to }, own.len())?;
            // Float addition commutes bitwise: received + own is own + received.
            got.iter_mut().zip(own).for_each(|(g, &x)| *g = *g + x);
            partial = Some(got);
        }
        let mut sum = partial.unwrap_or_else(|| chunk(p).to_vec());
        carrier.settle(&mut sum);
        Ok(sum)
    }

    /// Ring all-gather in place: `data` holds this rank's chunk `p` (of
    /// `bounds`) and ends holding every member's. At step `s` this rank
    /// forwards chunk `p-s` to the next member (its own at step 0, then the
    /// one it received the step before) and receives chunk `p-s-1`.
    pub(super) fn ring_all_gather<T: Element>(
        &self,
        ring: &Ring,
        data: &mut [T],
        bounds: &[usize],
        carrier: &impl Carrier<T>,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let (n, p) = (ring.n(), ring.pos);
        let (next, prev) = (ring.after(1), ring.before(1));
        let mut last: Option<Vec<T>> = None;
        for s in 0..n - 1 {
            let step_tag = format!("{tag}/ag{s}");
            let to = Hop {
                ep: self,
                peer: next,
                tag: &step_tag,
                what,
            };
            match last.take() {
                None => carrier.send_slice(to, &data[span(bounds, p)])?,
                Some(piece) => carrier.send_vec(to, piece)?,
            }
            let into = &mut data[span(bounds, (p + 2 * n - s - 1) % n)];
            let got = carrier.recv(Hop { peer: prev, ..to }, into.len())?;
            into.copy_from_slice(&got);
            last = Some(got);
        }
        if let Some(piece) = last {
            self.recycle(piece);
        }
        Ok(())
    }

    /// Pairwise-exchange all-to-all: chunk `i` of `data` (`from` bounds)
    /// goes to position `i`, and the chunk from position `i` fills `to`'s
    /// span `i` of the result.
    fn pairwise_all_to_all<T: Element>(
        &self,
        ring: &Ring,
        data: &[T],
        from: &[usize],
        to: &[usize],
        tag: &str,
        what: &str,
    ) -> Result<Vec<T>, CommError> {
        let (n, p) = (ring.n(), ring.pos);
        let mut out = vec![T::zeroed(); to.last().copied().unwrap_or(0)];
        out[span(to, p)].copy_from_slice(&data[span(from, p)]);
        for s in 1..n {
            let step_tag = format!("{tag}/a2a{s}");
            self.send_slice(ring.after(s), &step_tag, &data[span(from, (p + s) % n)], what)?;
            let into = &mut out[span(to, (p + n - s) % n)];
            let got = self.recv_elements::<T>(ring.before(s), &step_tag, into.len(), what)?;
            into.copy_from_slice(&got);
            self.recycle(got);
        }
        Ok(out)
    }

    /// Chain broadcast from position `root`; a member forwards the message
    /// it received as it is.
    fn chain_broadcast<T: Element>(
        &self,
        ring: &Ring,
        root: usize,
        data: &mut [T],
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let n = ring.n();
        let step_tag = format!("{tag}/bcast");
        let link = (ring.pos + n - root) % n; // position along the chain
        let last = link + 1 == n;
        if link == 0 {
            if !last {
                self.send_slice(ring.after(1), &step_tag, data, what)?;
            }
            return Ok(());
        }
        let got = self.recv_elements::<T>(ring.before(1), &step_tag, data.len(), what)?;
        data.copy_from_slice(&got);
        if last {
            self.recycle(got);
            Ok(())
        } else {
            self.send(ring.after(1), &step_tag, T::wrap(got), what)
        }
    }

    /// Parameter-server all-reduce with `group[0]` as the server: it sums
    /// its own buffer and then every other member's in group order, and
    /// sends the sum back to each.
    fn parameter_server_all_reduce<T: Element>(
        &self,
        ring: &Ring,
        data: &mut [T],
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let (push, pull) = (format!("{tag}/push"), format!("{tag}/pull"));
        let server = ring.group[0];
        if ring.pos == 0 {
            for &member in &ring.group[1..] {
                let got = self.recv_elements::<T>(member, &push, data.len(), what)?;
                data.iter_mut().zip(&got).for_each(|(x, &g)| *x = *x + g);
                self.recycle(got);
            }
            for &member in &ring.group[1..] {
                self.send_slice(member, &pull, data, what)?;
            }
        } else {
            self.send_slice(server, &push, data, what)?;
            let got = self.recv_elements::<T>(server, &pull, data.len(), what)?;
            data.copy_from_slice(&got);
            self.recycle(got);
        }
        Ok(())
    }
}

/// One message of a ring step: this rank's endpoint, the peer, the
/// step's tag and the instruction (for errors).
#[derive(Clone, Copy)]
pub(super) struct Hop<'a> {
    pub ep: &'a Endpoint,
    pub peer: usize,
    pub tag: &'a str,
    pub what: &'a str,
}

/// How a ring moves elements between members: as they are ([`AsIs`]),
/// or rounded to a 16-bit type and packed (`narrow.rs`).
pub(super) trait Carrier<T: Element> {
    /// Sends a copy of `data`.
    fn send_slice(&self, to: Hop, data: &[T]) -> Result<(), CommError>;
    /// Sends `data`, which it may reuse.
    fn send_vec(&self, to: Hop, data: Vec<T>) -> Result<(), CommError>;
    /// Receives `len` elements.
    fn recv(&self, from: Hop, len: usize) -> Result<Vec<T>, CommError>;
    /// Makes a rank's share of a sum what every member will read of it.
    fn settle(&self, sum: &mut [T]);
}

/// Elements moved as they are.
pub(super) struct AsIs;

impl<T: Element> Carrier<T> for AsIs {
    fn send_slice(&self, to: Hop, data: &[T]) -> Result<(), CommError> {
        to.ep.send_slice(to.peer, to.tag, data, to.what)
    }
    fn send_vec(&self, to: Hop, data: Vec<T>) -> Result<(), CommError> {
        to.ep.send(to.peer, to.tag, T::wrap(data), to.what)
    }
    fn recv(&self, from: Hop, len: usize) -> Result<Vec<T>, CommError> {
        from.ep.recv_elements(from.peer, from.tag, len, from.what)
    }
    fn settle(&self, _: &mut [T]) {}
}

/// Chunk `c`'s range within `bounds`.
pub(super) fn span(bounds: &[usize], c: usize) -> Range<usize> {
    bounds[c]..bounds[c + 1]
}

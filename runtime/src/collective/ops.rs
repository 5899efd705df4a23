//! The collectives, as real algorithms over the fabric's point-to-point
//! messages: ring reduce-scatter and all-gather (and all-reduce as the two
//! in turn), pairwise-exchange all-to-all, chain broadcast and
//! parameter-server all-reduce. Internal messages carry sub-tags derived
//! from the caller's tag, one per step.

use super::{Algorithm, Buffer, Collective, CommError, Endpoint, LayoutMismatch};

/// A validated group and this rank's position in it (ring order = group
/// order).
struct Ring<'a> {
    group: &'a [usize],
    pos: usize,
}

impl Ring<'_> {
    fn n(&self) -> usize {
        self.group.len()
    }

    /// Global rank at `offset` positions after this one (wrapping).
    fn after(&self, offset: usize) -> usize {
        self.group[(self.pos + offset) % self.n()]
    }

    /// Global rank at `offset` positions before this one (wrapping).
    fn before(&self, offset: usize) -> usize {
        self.group[(self.pos + self.n() - offset % self.n()) % self.n()]
    }
}

impl Endpoint {
    /// Checks `group` (non-empty, distinct ranks on this fabric, including
    /// this one) and finds this rank's position in it.
    fn ring<'a>(&self, group: &'a [usize], what: &str) -> Result<Ring<'a>, CommError> {
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

    fn mismatch(&self, peer: usize, what: &str, mismatch: LayoutMismatch) -> CommError {
        CommError::Mismatch {
            rank: self.rank(),
            what: what.to_string(),
            peer,
            mismatch,
        }
    }

    /// Checks that `got` (from `peer`) has `like`'s element type and `len`
    /// elements.
    fn expect(
        &self,
        like: &Buffer,
        len: usize,
        got: &Buffer,
        peer: usize,
        what: &str,
    ) -> Result<(), CommError> {
        if got.dtype_name() == like.dtype_name() && got.len() == len {
            return Ok(());
        }
        let mismatch = LayoutMismatch {
            expected: format!("{}[{len}]", like.dtype_name()),
            got: got.to_string(),
        };
        Err(self.mismatch(peer, what, mismatch))
    }

    /// Splits `data` into `n` equal chunks or reports it as uneven.
    fn split_even(&self, data: &Buffer, n: usize, what: &str) -> Result<Vec<Buffer>, CommError> {
        data.split_even(n).ok_or_else(|| CommError::Uneven {
            rank: self.rank(),
            what: what.to_string(),
            len: data.len(),
            parts: n,
        })
    }

    /// Concatenates `pieces` (already checked to share `like`'s type).
    fn join(&self, like: &Buffer, pieces: &[Buffer], peer: usize, what: &str) -> Result<Buffer, CommError> {
        let mut out = like.empty_like();
        for piece in pieces {
            out.append(piece).map_err(|m| self.mismatch(peer, what, m))?;
        }
        Ok(out)
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
            Algorithm::Ring => {
                let lengths = Buffer::balanced_lengths(data.len(), ring.n());
                let chunks = data.split_balanced(ring.n());
                let mine = self.ring_reduce_scatter(&ring, chunks, tag, what)?;
                *data = self.ring_all_gather(&ring, mine, data, &lengths, tag, what)?;
                Ok(())
            }
            Algorithm::ParameterServer => self.parameter_server_all_reduce(&ring, data, tag, what),
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
        let chunks = self.split_even(data, ring.n(), what)?;
        self.ring_reduce_scatter(&ring, chunks, tag, what)
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
        let lengths = vec![chunk.len(); ring.n()];
        self.ring_all_gather(&ring, chunk.clone(), chunk, &lengths, tag, what)
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
        let n = ring.n();
        let mut outgoing = self.split_even(data, n, what)?;
        let chunk_len = data.len() / n;
        let mut incoming = vec![data.empty_like(); n];
        incoming[ring.pos] = std::mem::replace(&mut outgoing[ring.pos], data.empty_like());
        for s in 1..n {
            let step_tag = format!("{tag}/a2a{s}");
            let to = (ring.pos + s) % n;
            let piece = std::mem::replace(&mut outgoing[to], data.empty_like());
            self.send(ring.after(s), &step_tag, piece, what)?;
            let from = ring.before(s);
            let got = self.recv(from, &step_tag, what)?;
            self.expect(data, chunk_len, &got, from, what)?;
            incoming[(ring.pos + n - s) % n] = got;
        }
        self.join(data, &incoming, ring.before(1), what)
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
        let n = ring.n();
        if root >= n {
            return Err(CommError::BadRoot {
                rank: self.rank(),
                what: what.to_string(),
                root,
                size: n,
            });
        }
        let step_tag = format!("{tag}/bcast");
        let link = (ring.pos + n - root) % n; // position along the chain
        if link > 0 {
            let prev = ring.before(1);
            let got = self.recv(prev, &step_tag, what)?;
            self.expect(data, data.len(), &got, prev, what)?;
            *data = got;
        }
        if link + 1 < n {
            self.send(ring.after(1), &step_tag, data.clone(), what)?;
        }
        Ok(())
    }

    /// Ring reduce-scatter of `chunks` (one per position, any lengths that
    /// all members agree on). At step `s` this rank sends chunk `p-s-1` (its
    /// partial sum) to the next member and adds its own contribution to the
    /// partial sum of chunk `p-s-2` from the previous one; after `n-1` steps
    /// it holds the full sum of chunk `p`. Chunk `c` is summed along the ring
    /// starting at position `c+1`, the same order every run.
    fn ring_reduce_scatter(
        &self,
        ring: &Ring,
        mut chunks: Vec<Buffer>,
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let (n, p) = (ring.n(), ring.pos);
        let (next, prev) = (ring.after(1), ring.before(1));
        for s in 0..n - 1 {
            let step_tag = format!("{tag}/rs{s}");
            // Each chunk is sent once and never needed again, so move it.
            let send_idx = (p + 2 * n - s - 1) % n;
            let empty = chunks[send_idx].empty_like();
            let partial = std::mem::replace(&mut chunks[send_idx], empty);
            self.send(next, &step_tag, partial, what)?;
            let got = self.recv(prev, &step_tag, what)?;
            // Float addition commutes bitwise, so local += received is the
            // received partial sum plus this rank's term.
            chunks[(p + 2 * n - s - 2) % n]
                .add_assign(&got)
                .map_err(|m| self.mismatch(prev, what, m))?;
        }
        Ok(chunks.swap_remove(p))
    }

    /// Ring all-gather: this rank holds `own` (chunk `p`); at step `s` it
    /// forwards chunk `p-s` to the next member and receives chunk `p-s-1`
    /// from the previous one, checked against `like`'s type and `lengths`.
    fn ring_all_gather(
        &self,
        ring: &Ring,
        own: Buffer,
        like: &Buffer,
        lengths: &[usize],
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let (n, p) = (ring.n(), ring.pos);
        let (next, prev) = (ring.after(1), ring.before(1));
        let mut pieces = vec![like.empty_like(); n];
        pieces[p] = own;
        for s in 0..n - 1 {
            let step_tag = format!("{tag}/ag{s}");
            self.send(next, &step_tag, pieces[(p + n - s) % n].clone(), what)?;
            let got = self.recv(prev, &step_tag, what)?;
            let idx = (p + 2 * n - s - 1) % n;
            self.expect(like, lengths[idx], &got, prev, what)?;
            pieces[idx] = got;
        }
        self.join(like, &pieces, prev, what)
    }

    /// Parameter-server all-reduce with `group[0]` as the server: it sums
    /// its own buffer and then every other member's in group order, and
    /// sends the sum back to each.
    fn parameter_server_all_reduce(
        &self,
        ring: &Ring,
        data: &mut Buffer,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let (push, pull) = (format!("{tag}/push"), format!("{tag}/pull"));
        let server = ring.group[0];
        if ring.pos == 0 {
            for &member in &ring.group[1..] {
                let got = self.recv(member, &push, what)?;
                data.add_assign(&got)
                    .map_err(|m| self.mismatch(member, what, m))?;
            }
            for &member in &ring.group[1..] {
                self.send(member, &pull, data.clone(), what)?;
            }
        } else {
            self.send(server, &push, data.clone(), what)?;
            let got = self.recv(server, &pull, what)?;
            self.expect(data, data.len(), &got, server, what)?;
            *data = got;
        }
        Ok(())
    }
}

//! Lossy gradient compression with error feedback: sums over a group that
//! send far fewer bytes than the gradients, each rank keeping what it did
//! not send ([`Feedback`]) and adding it to its next step's gradients, so
//! nothing is lost, only delayed (Karimireddy et al., 2019).
//!
//! - Top-k ([`Endpoint::all_reduce_topk`]): each rank sends its `k`
//!   largest-magnitude values with their indices to every other (an
//!   all-gather), and every rank adds the pieces up in group order.
//! - PowerSGD ([`Endpoint::all_reduce_powersgd`], Vogels et al., 2019): each
//!   matrix `M` of the buffer goes as `P = M·Q` (all-reduced, then
//!   orthonormalised) and `Q = Mᵀ·P` (all-reduced); the sum is
//!   approximated by `P·Qᵀ`, and `Q` warm-starts the next step. Vectors, and
//!   matrices the factors would not shrink, are summed whole in the first
//!   all-reduce.
//!
//! Every member ends with the same bits: the sums are the ring's, and what
//! each rank computes from them it computes alike. A group of one sends
//! nothing and changes nothing.

use super::{Buffer, CommError, Endpoint};
use autopar_cost_models::GradCompression;

/// What a rank did not send of one bucket, and PowerSGD's factors, carried
/// from step to step.
#[derive(Debug, Default)]
pub struct Feedback {
    residual: Vec<f64>,
    factors: Vec<Vec<f64>>,
    /// Reductions seen, for a warm-up.
    calls: u64,
}

/// The buffer's values in f64, and whether they were f32.
fn widen(data: &Buffer) -> (Vec<f64>, bool) {
    match data {
        Buffer::F32(v) => (v.iter().map(|&x| x as f64).collect(), true),
        Buffer::F64(v) => (v.clone(), false),
    }
}

/// `values` in the buffer type (`f32`: rounded).
fn narrow(values: &[f64], f32: bool) -> Buffer {
    match f32 {
        true => Buffer::F32(values.iter().map(|&x| x as f32).collect()),
        false => Buffer::F64(values.to_vec()),
    }
}

impl Feedback {
    /// Whether this reduction is one of the first `warmup`, which go
    /// uncompressed (PyTorch's `start_powerSGD_iter`); counts it.
    pub fn warming(&mut self, warmup: u32) -> bool {
        self.calls += 1;
        self.calls <= u64::from(warmup)
    }

    /// The gradients plus what this rank kept back last step.
    fn corrected(&mut self, data: &Buffer) -> (Vec<f64>, bool) {
        let (mut a, f32) = widen(data);
        if self.residual.len() != a.len() {
            self.residual = vec![0.0; a.len()];
        }
        for (x, e) in a.iter_mut().zip(&self.residual) {
            *x += e;
        }
        (a, f32)
    }
}

impl Endpoint {
    /// The values to compress (the gradients plus what was kept back) and
    /// whether they are f32; `None` where nothing would cross a wire (a
    /// group of one, an empty bucket), so `data` stays as it is.
    fn lossy_start(
        &self,
        group: &[usize],
        data: &Buffer,
        state: &mut Feedback,
        what: &str,
    ) -> Result<Option<(Vec<f64>, bool)>, CommError> {
        let ring = self.ring(group, what)?;
        Ok((ring.n() > 1 && !data.is_empty()).then(|| state.corrected(data)))
    }

    /// Sums `data` over `group` sending each rank's `kept` largest values
    /// (by magnitude; ties to the lower index) and their indices; the rest
    /// of each rank's values, and what rounding to the buffer type lost,
    /// wait in `state` for the next call.
    pub fn all_reduce_topk(
        &self,
        group: &[usize],
        data: &mut Buffer,
        kept: usize,
        state: &mut Feedback,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let Some((a, f32)) = self.lossy_start(group, data, state, what)? else {
            return Ok(());
        };
        let kept = kept.clamp(1, a.len());
        let mut order: Vec<usize> = (0..a.len()).collect();
        let larger = |i: &usize, j: &usize| a[*j].abs().total_cmp(&a[*i].abs()).then(i.cmp(j));
        order.select_nth_unstable_by(kept - 1, larger);
        let mut top = order[..kept].to_vec();
        top.sort_unstable();
        // Indices travel as the bits of the buffer's element type.
        let message = match f32 {
            true => Buffer::F32(
                top.iter()
                    .map(|&i| f32::from_bits(i as u32))
                    .chain(top.iter().map(|&i| a[i] as f32))
                    .collect(),
            ),
            false => Buffer::F64(
                top.iter()
                    .map(|&i| f64::from_bits(i as u64))
                    .chain(top.iter().map(|&i| a[i]))
                    .collect(),
            ),
        };
        state.residual.copy_from_slice(&a);
        let (sent, _) = widen(&message);
        for (&i, &v) in top.iter().zip(&sent[kept..]) {
            state.residual[i] = a[i] - v;
        }
        let all = self.all_gather(group, &message, tag, what)?;
        let mut sum = vec![0.0; a.len()];
        let pieces: Vec<(usize, f64)> = match &all {
            Buffer::F32(v) => v
                .chunks(2 * kept)
                .flat_map(|m| {
                    m[..kept]
                        .iter()
                        .zip(&m[kept..])
                        .map(|(i, &x)| (i.to_bits() as usize, x as f64))
                })
                .collect(),
            Buffer::F64(v) => v
                .chunks(2 * kept)
                .flat_map(|m| {
                    m[..kept]
                        .iter()
                        .zip(&m[kept..])
                        .map(|(i, &x)| (i.to_bits() as usize, x))
                })
                .collect(),
        };
        for (i, x) in pieces {
            if let Some(s) = sum.get_mut(i) {
                *s += x;
            }
        }
        *data = narrow(&sum, f32);
        Ok(())
    }

    /// Sums `data` over `group` by rank-`rank` PowerSGD: `shapes` are the
    /// `(rows, cols)` matrices the buffer holds one after another (a
    /// vector is `(len, 1)`). Two all-reduces: the factors `P` with every
    /// piece sent whole, then the factors `Q`.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce_powersgd(
        &self,
        group: &[usize],
        data: &mut Buffer,
        shapes: &[(usize, usize)],
        rank: u32,
        state: &mut Feedback,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let Some((a, f32)) = self.lossy_start(group, data, state, what)? else {
            return Ok(());
        };
        let r = rank as usize;
        let starts: Vec<usize> = shapes
            .iter()
            .scan(0, |at, &(m, n)| Some(std::mem::replace(at, *at + m * n)))
            .collect();
        let factored = |&(m, n): &(usize, usize)| GradCompression::factored(rank, m, n);
        if state.factors.len() != shapes.len() {
            state.factors = shapes
                .iter()
                .enumerate()
                .map(|(i, &(m, n))| match factored(&(m, n)) {
                    true => start_factor(i, n, r),
                    false => Vec::new(),
                })
                .collect();
        }
        // First all-reduce: P = M·Q of each factored matrix, the rest whole.
        let mut first = Vec::new();
        for (i, (&(m, n), &at)) in shapes.iter().zip(&starts).enumerate() {
            let piece = &a[at..at + m * n];
            match factored(&(m, n)) {
                true => first.extend(product(piece, &state.factors[i], m, n, r, false)),
                false => first.extend_from_slice(piece),
            }
        }
        let mut summed = narrow(&first, f32);
        self.all_reduce(
            group,
            &mut summed,
            super::Algorithm::Ring,
            &format!("{tag}/p"),
            what,
        )?;
        let (summed, _) = widen(&summed);
        // Second all-reduce: Q = Mᵀ·P of each, P orthonormalised.
        let (mut ps, mut second, mut at_first) = (Vec::new(), Vec::new(), 0);
        for (&(m, n), &at) in shapes.iter().zip(&starts) {
            let len = if factored(&(m, n)) { m * r } else { m * n };
            let part = summed[at_first..at_first + len].to_vec();
            at_first += len;
            if factored(&(m, n)) {
                let p = orthonormal(part, m, r);
                second.extend(product(&a[at..at + m * n], &p, m, n, r, true));
                ps.push(p);
            } else {
                ps.push(part);
            }
        }
        let qs = match second.is_empty() {
            true => Vec::new(),
            false => {
                let mut q = narrow(&second, f32);
                self.all_reduce(group, &mut q, super::Algorithm::Ring, &format!("{tag}/q"), what)?;
                widen(&q).0
            }
        };
        let members = group.len() as f64;
        let (mut out, mut at_q) = (vec![0.0; a.len()], 0);
        for (i, ((&(m, n), &at), p)) in shapes.iter().zip(&starts).zip(&ps).enumerate() {
            if !factored(&(m, n)) {
                out[at..at + m * n].copy_from_slice(p);
                state.residual[at..at + m * n].fill(0.0);
                continue;
            }
            let q = qs[at_q..at_q + n * r].to_vec();
            at_q += n * r;
            for row in 0..m {
                for col in 0..n {
                    let v: f64 = (0..r).map(|k| p[row * r + k] * q[col * r + k]).sum();
                    out[at + row * n + col] = v;
                    // This rank's share of what the approximation missed.
                    state.residual[at + row * n + col] = a[at + row * n + col] - v / members;
                }
            }
            state.factors[i] = q;
        }
        *data = narrow(&out, f32);
        Ok(())
    }
}

/// A first `Q` (`cols × r`), alike on every rank: pseudo-random in
/// [−1, 1) from the matrix's position (splitmix64).
fn start_factor(index: usize, cols: usize, r: usize) -> Vec<f64> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..cols * r)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// `M·Q` for `M` (`m × n`, row-major) and `Q` (`n × r`), an `m × r`
/// matrix; `transposed`: `Mᵀ·P` for `P` (`m × r`), an `n × r` one.
fn product(mat: &[f64], other: &[f64], m: usize, n: usize, r: usize, transposed: bool) -> Vec<f64> {
    let mut out = vec![0.0; if transposed { n } else { m } * r];
    for row in 0..m {
        for col in 0..n {
            let x = mat[row * n + col];
            let (to, from) = if transposed { (col, row) } else { (row, col) };
            for k in 0..r {
                out[to * r + k] += x * other[from * r + k];
            }
        }
    }
    out
}

/// The columns of `p` (`m × r`) made orthonormal, in order (modified
/// Gram–Schmidt); a column that vanishes stays zero.
fn orthonormal(mut p: Vec<f64>, m: usize, r: usize) -> Vec<f64> {
    for k in 0..r {
        for j in 0..k {
            let dot: f64 = (0..m).map(|i| p[i * r + k] * p[i * r + j]).sum();
            for i in 0..m {
                p[i * r + k] -= dot * p[i * r + j];
            }
        }
        let norm = (0..m).map(|i| p[i * r + k] * p[i * r + k]).sum::<f64>().sqrt();
        let scale = if norm > 1e-30 { 1.0 / norm } else { 0.0 };
        for i in 0..m {
            p[i * r + k] *= scale;
        }
    }
    p
}

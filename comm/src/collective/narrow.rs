//! Reductions that send their elements in a 16-bit float type (gradient
//! compression): ring reduce-scatter and all-reduce as in [`super::ops`],
//! with every value that crosses the wire rounded to the [`Wire`] type and
//! two of them packed in each 32-bit word, so a rank sends half the bytes
//! of an f32 reduction. Partial sums accumulate in the buffer's own type;
//! each rank's share of the sum is rounded to the wire type before anyone
//! reads it, so every member ends with the same bits.

use super::buffer::{with_elements, Element};
use super::ops::{span, Ring};
use super::{Buffer, CommError, Endpoint};
use half::{bf16, f16};

/// The 16-bit float type a compressed reduction sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    Bf16,
    F16,
}

impl Wire {
    /// The wire type of a 16-bit float `dtype` (`None` for any other).
    pub fn of(dtype: autopar_ir::DType) -> Option<Wire> {
        match dtype {
            autopar_ir::DType::Bf16 => Some(Wire::Bf16),
            autopar_ir::DType::F16 => Some(Wire::F16),
            _ => None,
        }
    }

    /// `x` rounded to the nearest value of this type, as its bits.
    fn bits(self, x: f64) -> u16 {
        match self {
            Wire::Bf16 => bf16::from_f64(x).to_bits(),
            Wire::F16 => f16::from_f64(x).to_bits(),
        }
    }

    /// The value of `bits` of this type.
    fn value(self, bits: u16) -> f64 {
        match self {
            Wire::Bf16 => bf16::from_bits(bits).to_f64(),
            Wire::F16 => f16::from_bits(bits).to_f64(),
        }
    }

    /// `x` rounded to this type and back.
    fn round<T: Float>(self, x: T) -> T {
        T::from_f64(self.value(self.bits(x.to_f64())))
    }

    /// `values` rounded to this type, two to a 32-bit word (the last word
    /// half empty for an odd count).
    fn pack<T: Float>(self, values: &[T]) -> Vec<f32> {
        values
            .chunks(2)
            .map(|pair| {
                let lo = self.bits(pair[0].to_f64()) as u32;
                let hi = pair.get(1).map_or(0, |x| self.bits(x.to_f64())) as u32;
                f32::from_bits(lo | hi << 16)
            })
            .collect()
    }

    /// The `len` values packed in `words`.
    fn unpack<T: Float>(self, words: &[f32], len: usize) -> Vec<T> {
        words
            .iter()
            .flat_map(|w| {
                let bits = w.to_bits();
                [bits as u16, (bits >> 16) as u16]
            })
            .take(len)
            .map(|b| T::from_f64(self.value(b)))
            .collect()
    }
}

/// A float element a compressed reduction can round.
pub(crate) trait Float: Element {
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}

impl Float for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
}

impl Float for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> f64 {
        x
    }
}

impl Endpoint {
    /// [`Endpoint::all_reduce`] on a ring sending `wire` values: every
    /// element ends as the same `wire` value on every member.
    pub fn all_reduce_narrow(
        &self,
        group: &[usize],
        data: &mut Buffer,
        wire: Wire,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let ring = self.ring(group, what)?;
        let bounds = Self::bounds(&Buffer::balanced_lengths(data.len(), ring.n()));
        with_elements!(data, v => {
            let own = self.narrow_reduce_scatter(&ring, v, &bounds, wire, tag, what)?;
            v[span(&bounds, ring.pos)].copy_from_slice(&own);
            self.narrow_all_gather(&ring, v, &bounds, wire, tag, what)
        })
    }

    /// [`Endpoint::reduce_scatter`] sending `wire` values: this rank's
    /// share of the sum, rounded to `wire`.
    pub fn reduce_scatter_narrow(
        &self,
        group: &[usize],
        data: &Buffer,
        wire: Wire,
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let ring = self.ring(group, what)?;
        let bounds = self.even_bounds(data.len(), ring.n(), what)?;
        with_elements!(data, v => {
            self.narrow_reduce_scatter(&ring, v, &bounds, wire, tag, what).map(Element::wrap)
        })
    }

    /// The ring reduce-scatter of [`Endpoint::ring_reduce_scatter`], each
    /// partial sum sent packed as `wire` values and added to the receiver's
    /// own term in `T`; returns this rank's chunk of the sum, rounded.
    fn narrow_reduce_scatter<T: Float>(
        &self,
        ring: &Ring,
        data: &[T],
        bounds: &[usize],
        wire: Wire,
        tag: &str,
        what: &str,
    ) -> Result<Vec<T>, CommError> {
        let (n, p) = (ring.n(), ring.pos);
        let (next, prev) = (ring.after(1), ring.before(1));
        let chunk = |c: usize| &data[span(bounds, c)];
        let mut partial: Option<Vec<T>> = None;
        for s in 0..n - 1 {
            let step_tag = format!("{tag}/rs{s}");
            let sent = match &partial {
                None => wire.pack(chunk((p + n - 1) % n)),
                Some(sum) => wire.pack(sum),
            };
            self.send(next, &step_tag, Buffer::F32(sent), what)?;
            let own = chunk((p + 2 * n - s - 2) % n);
            let words = self.recv_elements::<f32>(prev, &step_tag, own.len().div_ceil(2), what)?;
            let got: Vec<T> = wire.unpack(&words, own.len());
            self.recycle(words);
            partial = Some(got.iter().zip(own).map(|(&g, &x)| g + x).collect());
        }
        let sum = partial.unwrap_or_else(|| chunk(p).to_vec());
        Ok(sum.into_iter().map(|x| wire.round(x)).collect())
    }

    /// Ring all-gather of the rounded chunks, sent packed as `wire` values
    /// (exact: every chunk already is one).
    fn narrow_all_gather<T: Float>(
        &self,
        ring: &Ring,
        data: &mut [T],
        bounds: &[usize],
        wire: Wire,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let (n, p) = (ring.n(), ring.pos);
        let (next, prev) = (ring.after(1), ring.before(1));
        let mut last = p;
        for s in 0..n - 1 {
            let step_tag = format!("{tag}/ag{s}");
            self.send(
                next,
                &step_tag,
                Buffer::F32(wire.pack(&data[span(bounds, last)])),
                what,
            )?;
            let c = (p + 2 * n - s - 1) % n;
            let into = &mut data[span(bounds, c)];
            let words = self.recv_elements::<f32>(prev, &step_tag, into.len().div_ceil(2), what)?;
            into.copy_from_slice(&wire.unpack::<T>(&words, into.len()));
            self.recycle(words);
            last = c;
        }
        Ok(())
    }
}

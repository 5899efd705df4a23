//! Reductions that send their elements in a 16-bit float type (gradient
//! compression): the ring reduce-scatter and all-reduce of [`super::ops`]
//! with a [`GradCompression`] type as their carrier, which rounds every value that crosses
//! the wire to its type and packs two in each 32-bit word, so a rank sends
//! half the bytes of an f32 reduction. Partial sums accumulate in the
//! buffer's own type; each rank's share of the sum is rounded to the wire
//! type before anyone reads it, so every member ends with the same bits. A
//! group of one sends nothing and rounds nothing.

use super::buffer::{with_elements, Element};
use super::ops::{Carrier, Hop};
use super::{Buffer, CommError, Endpoint};
use autopar_cost_models::GradCompression;
use half::{bf16, f16};

/// The 16-bit float type a compressed reduction sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    Bf16,
    F16,
}

impl Half {
    /// The type a 16-bit compression sends; `None` for the lossy ones.
    pub fn of(c: GradCompression) -> Option<Half> {
        match c {
            GradCompression::Bf16 => Some(Half::Bf16),
            GradCompression::Fp16 => Some(Half::F16),
            GradCompression::PowerSgd { .. } | GradCompression::TopK { .. } => None,
        }
    }
}

/// A compressed reduction's carrier: the 16-bit float type it sends.
#[derive(Clone, Copy)]
struct Narrow(Half);

impl Narrow {
    /// `x` rounded to the nearest value of this type, as its bits.
    fn bits(self, x: f64) -> u16 {
        match self.0 {
            Half::Bf16 => bf16::from_f64(x).to_bits(),
            Half::F16 => f16::from_f64(x).to_bits(),
        }
    }

    /// The value of `bits` of this type.
    fn value(self, bits: u16) -> f64 {
        match self.0 {
            Half::Bf16 => bf16::from_bits(bits).to_f64(),
            Half::F16 => f16::from_bits(bits).to_f64(),
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

impl<T: Float> Carrier<T> for Narrow {
    fn send_slice(&self, to: Hop, data: &[T]) -> Result<(), CommError> {
        to.ep.send(to.peer, to.tag, Buffer::F32(self.pack(data)), to.what)
    }
    fn send_vec(&self, to: Hop, data: Vec<T>) -> Result<(), CommError> {
        self.send_slice(to, &data)?;
        to.ep.recycle(data);
        Ok(())
    }
    fn recv(&self, from: Hop, len: usize) -> Result<Vec<T>, CommError> {
        let words = from
            .ep
            .recv_elements::<f32>(from.peer, from.tag, len.div_ceil(2), from.what)?;
        let values = self.unpack(&words, len);
        from.ep.recycle(words);
        Ok(values)
    }
    fn settle(&self, sum: &mut [T]) {
        for x in sum {
            *x = self.round(*x);
        }
    }
}

impl Endpoint {
    /// [`Endpoint::all_reduce`] on a ring sending `wire` values: every
    /// element ends as the same `wire` value on every member.
    pub fn all_reduce_narrow(
        &self,
        group: &[usize],
        data: &mut Buffer,
        wire: Half,
        tag: &str,
        what: &str,
    ) -> Result<(), CommError> {
        let ring = self.ring(group, what)?;
        if ring.n() == 1 {
            // Nothing crosses a wire, nothing is rounded: as the plain ring.
            return Ok(());
        }
        with_elements!(data, v => self.ring_all_reduce(&ring, v, Narrow(wire), tag, what))
    }

    /// [`Endpoint::reduce_scatter`] sending `wire` values: this rank's
    /// share of the sum, rounded to `wire`.
    pub fn reduce_scatter_narrow(
        &self,
        group: &[usize],
        data: &Buffer,
        wire: Half,
        tag: &str,
        what: &str,
    ) -> Result<Buffer, CommError> {
        let ring = self.ring(group, what)?;
        let bounds = self.even_bounds(data.len(), ring.n(), what)?;
        if ring.n() == 1 {
            return Ok(data.clone());
        }
        with_elements!(data, v => {
            self.ring_reduce_scatter(&ring, v, &bounds, &Narrow(wire), tag, what).map(Element::wrap)
        })
    }
}

//! Low-precision float formats: the four float8 types, `float4e2m1` and the
//! exponent-only `float8e8m0` (ONNX element types 17–20, 23, 24).
//!
//! Values of these types are stored as `f32` holding exactly a representable
//! value (see [`crate::Value`]); this module converts between such `f32`s, the
//! formats' bit patterns, and wider floats with ONNX `Cast` semantics:
//! round-to-nearest-even, and out-of-range values either clamped to the
//! largest finite value (`saturate`) or turned into the format's infinity or
//! NaN. The rules follow ONNX's reference implementation (which uses
//! `ml_dtypes`), including its handling of formats without NaN or infinity.

use crate::DType;
use serde::{Deserialize, Serialize};

/// How `Cast` rounds to `float8e8m0` (ONNX attribute `round_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RoundMode {
    /// Any fraction rounds up to the next power of two (ONNX's default).
    #[default]
    Up,
    /// The fraction is dropped.
    Down,
    /// To the nearer power of two by mantissa bits (a fraction of ½ or more
    /// rounds up).
    Nearest,
}

impl RoundMode {
    /// Parses the ONNX attribute value (`"up"`, `"down"`, `"nearest"`).
    pub fn parse(s: &str) -> Option<RoundMode> {
        match s {
            "up" => Some(RoundMode::Up),
            "down" => Some(RoundMode::Down),
            "nearest" => Some(RoundMode::Nearest),
            _ => None,
        }
    }
}

/// What a format does with NaN, infinity and negative zero.
#[derive(Clone, Copy, PartialEq)]
enum Specials {
    /// IEEE-like: top exponent holds ±inf (mantissa 0) and NaNs (`float8e5m2`).
    Ieee,
    /// No infinity; NaN is all exponent and mantissa bits set (`float8e4m3fn`).
    Fn,
    /// No infinity, no negative zero; the one NaN is `0x80` (`*fnuz`).
    Fnuz,
    /// Neither infinity nor NaN; overflow always saturates (`float4e2m1`).
    Finite,
}

/// A sign/exponent/mantissa format of at most 8 bits.
#[derive(Clone, Copy)]
struct Format {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    specials: Specials,
}

impl Format {
    fn of(dtype: DType) -> Option<Format> {
        let f = |exp_bits, man_bits, bias, specials| Format {
            exp_bits,
            man_bits,
            bias,
            specials,
        };
        Some(match dtype {
            DType::F8E4M3Fn => f(4, 3, 7, Specials::Fn),
            DType::F8E4M3Fnuz => f(4, 3, 8, Specials::Fnuz),
            DType::F8E5M2 => f(5, 2, 15, Specials::Ieee),
            DType::F8E5M2Fnuz => f(5, 2, 16, Specials::Fnuz),
            DType::F4E2M1 => f(2, 1, 1, Specials::Finite),
            _ => return None,
        })
    }

    fn sign_bit(self) -> u8 {
        1 << (self.exp_bits + self.man_bits)
    }

    fn exp_mask(self) -> u8 {
        ((1u32 << self.exp_bits) - 1) as u8
    }

    fn man_mask(self) -> u8 {
        ((1u32 << self.man_bits) - 1) as u8
    }

    /// Bits of the largest finite magnitude.
    fn max_code(self) -> u8 {
        let all = self.sign_bit() - 1;
        match self.specials {
            // The top exponent is reserved for inf/NaN.
            Specials::Ieee => all - self.man_mask() - 1,
            // All ones is NaN.
            Specials::Fn => all - 1,
            Specials::Fnuz | Specials::Finite => all,
        }
    }

    /// Bits of a NaN with the given sign and, where the format has payloads,
    /// mantissa `payload` (the top mantissa bits of the source NaN).
    fn nan(self, negative: bool, payload: u8) -> u8 {
        let sign = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            Specials::Ieee => sign | (self.exp_mask() << self.man_bits) | (payload & self.man_mask()).max(1),
            Specials::Fn => sign | (self.sign_bit() - 1),
            Specials::Fnuz => 0x80,
            // No NaN: ml_dtypes (and so ONNX's reference) gives the zero of
            // the opposite sign.
            Specials::Finite => sign ^ self.sign_bit(),
        }
    }

    /// Bits for a value beyond the largest finite one (or infinite).
    fn overflow(self, negative: bool, saturate: bool) -> u8 {
        let sign = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            _ if saturate => sign | self.max_code(),
            Specials::Finite => sign | self.max_code(),
            Specials::Ieee => sign | (self.exp_mask() << self.man_bits),
            Specials::Fn => sign | (self.sign_bit() - 1),
            Specials::Fnuz => 0x80,
        }
    }

    /// Value of magnitude bits `mag` (no sign), as `f64`.
    fn magnitude(self, mag: u8) -> f64 {
        let exp = i32::from(mag >> self.man_bits);
        let man = f64::from(mag & self.man_mask());
        let m = self.man_bits as i32;
        if exp == 0 {
            man * 2f64.powi(1 - self.bias - m)
        } else {
            (man + f64::from(1u32 << m)) * 2f64.powi(exp - self.bias - m)
        }
    }

    fn encode(self, x: f64, saturate: bool) -> u8 {
        if x.is_nan() {
            let payload = (x.to_bits() >> (52 - self.man_bits)) as u8;
            return self.nan(x.is_sign_negative(), payload);
        }
        let negative = x.is_sign_negative();
        let sign = if negative { self.sign_bit() } else { 0 };
        let a = x.abs();
        if a.is_infinite() {
            return self.overflow(negative, saturate);
        }
        if a == 0.0 {
            return if self.specials == Specials::Fnuz { 0 } else { sign };
        }
        // Quantum at `a`'s binade (the subnormal quantum below the normal
        // range); scaling by a power of two is exact, so one rounding happens.
        let m = self.man_bits as i32;
        let emin = 1 - self.bias;
        let e = ((a.to_bits() >> 52) as i32) - 1023;
        let e = e.max(emin);
        let q = e - m;
        let n = (a * 2f64.powi(-q)).round_ties_even();
        if n * 2f64.powi(q) > self.magnitude(self.max_code()) {
            return self.overflow(negative, saturate);
        }
        // Exponent field and mantissa in one sum: a carry out of the
        // mantissa bumps the exponent, and subnormals have field 0.
        let mag = (((e + self.bias - 1) << m) + n as i32) as u8;
        if mag == 0 && self.specials == Specials::Fnuz {
            return 0;
        }
        sign | mag
    }

    fn decode(self, bits: u8) -> f32 {
        let bits = bits & (self.sign_bit() | (self.sign_bit() - 1));
        let negative = bits & self.sign_bit() != 0;
        let mag = bits & !self.sign_bit();
        let exp = (mag >> self.man_bits) & self.exp_mask();
        let man = mag & self.man_mask();
        let nan_or_inf = match self.specials {
            // The formats' only NaN codes: the canonical quiet NaN.
            Specials::Fnuz if bits == 0x80 => Some(f32::NAN),
            Specials::Fn if mag == self.sign_bit() - 1 => Some(f32::NAN),
            Specials::Ieee if exp == self.exp_mask() => Some(if man == 0 {
                f32::INFINITY
            } else {
                f32::from_bits(0x7f80_0000 | (u32::from(man) << (23 - self.man_bits)))
            }),
            _ => None,
        };
        let v = nan_or_inf.unwrap_or_else(|| self.magnitude(mag) as f32);
        if negative {
            -v
        } else {
            v
        }
    }
}

/// True for the types this module converts (`DType::is_lowp_float`).
pub(crate) fn is_lowp(dtype: DType) -> bool {
    dtype == DType::F8E8M0 || Format::of(dtype).is_some()
}

/// `x` as `float8e8m0` bits (ONNX `Cast` to `FLOAT8E8M0`). The input is
/// first rounded to `f32`, as the reference does; the sign is ignored; NaN
/// and infinity give NaN (`0xFF`) even when saturating; without `saturate`
/// a value rounding past 2^127 becomes NaN too.
pub fn e8m0_encode(x: f64, saturate: bool, mode: RoundMode) -> u8 {
    let bits = (x as f32).to_bits();
    let exp = (bits >> 23) & 0xff;
    if exp == 0xff {
        return 0xff;
    }
    let frac = bits & 0x7f_ffff;
    let up = match mode {
        RoundMode::Down => false,
        RoundMode::Up => frac != 0,
        RoundMode::Nearest => {
            let guard = frac & 0x40_0000 != 0;
            let rest = frac & 0x3f_ffff != 0;
            // The reference treats every normal input's last kept bit as 1,
            // so for them a set guard bit alone rounds up.
            guard && (rest || exp > 0)
        }
    };
    let up = up && !(saturate && exp == 0xfe);
    (exp + u32::from(up)) as u8
}

/// The value of `float8e8m0` bits: 2^(bits − 127), NaN for `0xFF`.
pub fn e8m0_decode(bits: u8) -> f32 {
    if bits == 0xff {
        f32::NAN
    } else {
        2f64.powi(i32::from(bits) - 127) as f32
    }
}

/// The bit pattern of `x` in low-precision float `dtype` (low bits of the
/// byte for `float4e2m1`), with ONNX `Cast` rounding; `None` when `dtype` is
/// not such a format. `round_mode` only matters for `float8e8m0`.
pub fn encode(dtype: DType, x: f64, saturate: bool, round_mode: RoundMode) -> Option<u8> {
    if dtype == DType::F8E8M0 {
        return Some(e8m0_encode(x, saturate, round_mode));
    }
    Format::of(dtype).map(|f| f.encode(x, saturate))
}

/// The value of bit pattern `bits` in low-precision float `dtype`; `None`
/// when `dtype` is not such a format. Bits above the format's width are
/// ignored.
pub fn decode(dtype: DType, bits: u8) -> Option<f32> {
    if dtype == DType::F8E8M0 {
        return Some(e8m0_decode(bits));
    }
    Format::of(dtype).map(|f| f.decode(bits))
}

/// `x` converted to low-precision float `dtype` as ONNX `Cast` does, as the
/// `f32` our storage holds; `x` itself for other types.
pub fn cast(dtype: DType, x: f64, saturate: bool, round_mode: RoundMode) -> f32 {
    match encode(dtype, x, saturate, round_mode).and_then(|b| decode(dtype, b)) {
        Some(v) => v,
        None => x as f32,
    }
}

/// The bits of a stored (already representable) value; exact, so
/// `e8m0`'s smallest value 2^-127 (an `f32` subnormal) keeps its code and a
/// NaN its payload (read from the `f32` bits, as widening may quiet it).
pub(crate) fn stored_bits(dtype: DType, x: f32) -> u8 {
    match Format::of(dtype) {
        Some(f) if x.is_nan() => f.nan(x.is_sign_negative(), (x.to_bits() >> (23 - f.man_bits)) as u8),
        _ => encode(dtype, f64::from(x), false, RoundMode::Down).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAT: bool = true;

    fn enc(dt: DType, x: f64, saturate: bool) -> u8 {
        encode(dt, x, saturate, RoundMode::Up).unwrap()
    }

    #[test]
    fn every_code_decodes_and_re_encodes_to_itself() {
        for dt in [
            DType::F8E4M3Fn,
            DType::F8E4M3Fnuz,
            DType::F8E5M2,
            DType::F8E5M2Fnuz,
            DType::F8E8M0,
        ] {
            for b in 0..=255u8 {
                let v = decode(dt, b).unwrap();
                assert_eq!(stored_bits(dt, v), b, "{dt} {b:#04x} = {v}");
            }
        }
        for b in 0..16u8 {
            let v = decode(DType::F4E2M1, b).unwrap();
            assert_eq!(stored_bits(DType::F4E2M1, v), b, "f4e2m1 {b:#x}");
        }
    }

    #[test]
    fn largest_and_smallest_values() {
        let max = |dt| decode(dt, enc(dt, f64::INFINITY, SAT)).unwrap();
        assert_eq!(max(DType::F8E4M3Fn), 448.0);
        assert_eq!(max(DType::F8E4M3Fnuz), 240.0);
        assert_eq!(max(DType::F8E5M2), 57344.0);
        assert_eq!(max(DType::F8E5M2Fnuz), 57344.0);
        assert_eq!(max(DType::F4E2M1), 6.0);
        // Smallest subnormals: 2^-9, 2^-10, 2^-16, 2^-17, 0.5.
        assert_eq!(decode(DType::F8E4M3Fn, 1), Some(2f32.powi(-9)));
        assert_eq!(decode(DType::F8E4M3Fnuz, 1), Some(2f32.powi(-10)));
        assert_eq!(decode(DType::F8E5M2, 1), Some(2f32.powi(-16)));
        assert_eq!(decode(DType::F8E5M2Fnuz, 1), Some(2f32.powi(-17)));
        assert_eq!(decode(DType::F4E2M1, 1), Some(0.5));
    }

    #[test]
    fn float4_values_in_code_order() {
        let all: Vec<f32> = (0..16).map(|b| decode(DType::F4E2M1, b).unwrap()).collect();
        assert_eq!(
            all,
            [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
        );
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        let c = |dt, x| cast(dt, x, SAT, RoundMode::Up);
        // e4m3fn near 1: step 1/8; 1 + 1/16 ties to 1, 1 + 3/16 ties to 1.25.
        assert_eq!(c(DType::F8E4M3Fn, 1.0625), 1.0);
        assert_eq!(c(DType::F8E4M3Fn, 1.1875), 1.25);
        assert_eq!(c(DType::F8E4M3Fn, 1.07), 1.125);
        // A tie just below the top binade carries into the exponent.
        assert_eq!(c(DType::F8E4M3Fn, 1.9375), 2.0);
        // Subnormal range: quantum 2^-9; 1.5 quanta ties to 2.
        assert_eq!(c(DType::F8E4M3Fn, 1.5 * 2f64.powi(-9)), 2f32.powi(-8));
        assert_eq!(c(DType::F8E4M3Fn, 0.5 * 2f64.powi(-9)), 0.0);
        // float4: 0.25 ties to 0, 0.75 to 1, 2.5 to 2, 5 to 4.
        let f4: Vec<f32> = [0.25, 0.75, 2.5, 5.0, 1.05, 0.48]
            .iter()
            .map(|&x| c(DType::F4E2M1, x))
            .collect();
        assert_eq!(f4, [0.0, 1.0, 2.0, 4.0, 1.0, 0.5]);
    }

    #[test]
    fn overflow_saturates_or_gives_inf_or_nan() {
        // 464 is the tie between 448 and the (NaN) code above it: stays 448.
        assert_eq!(enc(DType::F8E4M3Fn, 464.0, false), 0x7e);
        assert_eq!(enc(DType::F8E4M3Fn, 470.0, false), 0x7f);
        assert_eq!(enc(DType::F8E4M3Fn, 470.0, SAT), 0x7e);
        assert_eq!(enc(DType::F8E4M3Fn, -1e6, false), 0xff);
        assert_eq!(enc(DType::F8E4M3Fn, f64::NEG_INFINITY, SAT), 0xfe);
        assert_eq!(enc(DType::F8E4M3Fnuz, 248.0, false), 0x80);
        assert_eq!(enc(DType::F8E4M3Fnuz, -1e6, SAT), 0xff);
        assert_eq!(enc(DType::F8E5M2, 61439.0, false), 0x7b);
        assert_eq!(enc(DType::F8E5M2, 61440.0, false), 0x7c, "+inf");
        assert_eq!(enc(DType::F8E5M2, f64::NEG_INFINITY, false), 0xfc, "-inf");
        assert_eq!(enc(DType::F8E5M2, f64::INFINITY, SAT), 0x7b);
        assert_eq!(enc(DType::F8E5M2Fnuz, f64::INFINITY, false), 0x80);
        // float4 has neither: always the largest value.
        assert_eq!(enc(DType::F4E2M1, 1e6, false), 0x7);
        assert_eq!(enc(DType::F4E2M1, f64::NEG_INFINITY, false), 0xf);
    }

    #[test]
    fn nan_and_negative_zero() {
        assert_eq!(enc(DType::F8E4M3Fn, f64::NAN, SAT), 0x7f);
        assert_eq!(enc(DType::F8E4M3Fn, -f64::NAN, SAT), 0xff);
        assert_eq!(enc(DType::F8E4M3Fnuz, -f64::NAN, SAT), 0x80);
        assert_eq!(enc(DType::F8E5M2, f64::NAN, SAT), 0x7e);
        assert_eq!(enc(DType::F8E5M2, -f64::NAN, SAT), 0xfe);
        assert_eq!(enc(DType::F4E2M1, f64::NAN, SAT), 0x8);
        assert_eq!(enc(DType::F4E2M1, -f64::NAN, SAT), 0x0);
        assert!(decode(DType::F8E5M2Fnuz, 0x80).unwrap().is_nan());
        assert!(decode(DType::F8E4M3Fn, 0xff).unwrap().is_nan());
        assert_eq!(decode(DType::F8E5M2, 0xfc), Some(f32::NEG_INFINITY));
        // -0 and negative underflow: kept as -0, except in the fnuz formats.
        assert_eq!(enc(DType::F8E4M3Fn, -0.0, SAT), 0x80);
        assert_eq!(enc(DType::F8E5M2, -1e-7, SAT), 0x80);
        assert_eq!(enc(DType::F8E4M3Fnuz, -0.0, SAT), 0x00);
        assert_eq!(enc(DType::F8E5M2Fnuz, -1e-9, SAT), 0x00);
    }

    #[test]
    fn e8m0_round_modes() {
        let e = |x: f64, mode| e8m0_encode(x, SAT, mode);
        assert_eq!(e(1.0, RoundMode::Up), 127);
        assert_eq!(e(1.1, RoundMode::Up), 128);
        assert_eq!(e(1.1, RoundMode::Down), 127);
        assert_eq!(e(1.4, RoundMode::Nearest), 127);
        assert_eq!(e(1.5, RoundMode::Nearest), 128);
        assert_eq!(e(-4.0, RoundMode::Up), 129, "sign is ignored");
        assert_eq!(e(0.0, RoundMode::Up), 0);
        assert_eq!(e(0.124, RoundMode::Up), 124);
        assert_eq!(e(f64::INFINITY, RoundMode::Up), 0xff);
        // Past 2^127: saturate holds the largest code, otherwise NaN.
        assert_eq!(e(3.0 * 2f64.powi(126), RoundMode::Up), 0xfe);
        assert_eq!(e8m0_encode(3.0 * 2f64.powi(126), false, RoundMode::Up), 0xff);
        assert_eq!(e8m0_decode(127), 1.0);
        assert_eq!(e8m0_decode(0), 2f32.powi(-127));
        assert!(e8m0_decode(0xff).is_nan());
    }

    #[test]
    fn round_modes_parse() {
        assert_eq!(RoundMode::parse("nearest"), Some(RoundMode::Nearest));
        assert_eq!(RoundMode::parse("UP"), None);
    }
}

//! Element types. The numbering follows ONNX's `TensorProto.DataType` so that
//! importers and exporters convert without a lookup table.

use serde::{Deserialize, Serialize};

/// Element type of a tensor: ONNX's numeric types (float8, float4 and
/// 4-/2-bit integers included) and strings.
// Variants carry plain comments so the JSON Schema stays a list of names.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    U8,
    I8,
    U16,
    I16,
    I32,
    I64,
    Bool,
    F16,
    F64,
    U32,
    U64,
    Bf16,
    // `float8e4m3fn`: 4 exponent bits, 3 mantissa bits, no infinity.
    F8E4M3Fn,
    // `float8e4m3fnuz`: no infinity, no negative zero, one NaN.
    F8E4M3Fnuz,
    // `float8e5m2`: IEEE-like, with infinities.
    F8E5M2,
    // `float8e5m2fnuz`: no infinity, no negative zero, one NaN.
    F8E5M2Fnuz,
    // 4-bit unsigned integer, two per byte in `raw_data`.
    U4,
    // 4-bit signed integer, two per byte in `raw_data`.
    I4,
    // `float4e2m1`: 2 exponent bits, 1 mantissa bit, no infinity or NaN.
    F4E2M1,
    // `float8e8m0`: an unsigned power of two (MX scales).
    F8E8M0,
    // 2-bit unsigned integer, four per byte in `raw_data`.
    U2,
    // 2-bit signed integer, four per byte in `raw_data`.
    I2,
    // UTF-8 strings (ONNX `string_data`).
    String,
}

impl DType {
    /// Every element type, for parsing names and codes and for exhaustive tests.
    pub const ALL: [DType; 24] = [
        DType::F32,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::F16,
        DType::F64,
        DType::U32,
        DType::U64,
        DType::Bf16,
        DType::F8E4M3Fn,
        DType::F8E4M3Fnuz,
        DType::F8E5M2,
        DType::F8E5M2Fnuz,
        DType::U4,
        DType::I4,
        DType::F4E2M1,
        DType::F8E8M0,
        DType::U2,
        DType::I2,
        DType::String,
    ];

    /// The ONNX `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::Bf16 => 16,
            DType::String => 8,
            DType::F8E4M3Fn => 17,
            DType::F8E4M3Fnuz => 18,
            DType::F8E5M2 => 19,
            DType::F8E5M2Fnuz => 20,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F4E2M1 => 23,
            DType::F8E8M0 => 24,
            DType::U2 => 25,
            DType::I2 => 26,
        }
    }

    /// Inverse of [`DType::onnx_code`]; `None` for types autopar does not model
    /// (complex, 6-bit floats, and codes ONNX has not assigned).
    pub fn from_onnx_code(code: i32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.onnx_code() == code)
    }

    /// Bits per element as stored packed (ONNX `raw_data`); memory costs use
    /// this. A string counts as one 8-byte handle: its characters vary and
    /// strings never take part in training arithmetic.
    pub fn size_bits(self) -> usize {
        match self {
            DType::U2 | DType::I2 => 2,
            DType::U4 | DType::I4 | DType::F4E2M1 => 4,
            DType::U8 | DType::I8 | DType::Bool => 8,
            DType::F8E4M3Fn | DType::F8E4M3Fnuz | DType::F8E5M2 | DType::F8E5M2Fnuz | DType::F8E8M0 => 8,
            DType::U16 | DType::I16 | DType::F16 | DType::Bf16 => 16,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F64 | DType::I64 | DType::U64 | DType::String => 64,
        }
    }

    /// Bytes per element, rounded up: 1 for the 4- and 2-bit types (what one
    /// element costs alone). For whole tensors use [`DType::packed_bytes`].
    pub fn size_bytes(self) -> usize {
        self.size_bits().div_ceil(8)
    }

    /// Bytes that `n` elements occupy packed in ONNX `raw_data` (sub-byte
    /// types share bytes, the last one padded); `None` for strings, whose
    /// size depends on their contents.
    pub fn packed_bytes(self, n: usize) -> Option<usize> {
        if self == DType::String {
            return None;
        }
        n.checked_mul(self.size_bits()).map(|bits| bits.div_ceil(8))
    }

    /// True for floating-point types (the ones that carry trainable values).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::Bf16) || self.is_lowp_float()
    }

    /// The type normalisations and softmaxes compute their statistics in
    /// (ONNX's `stash_type`): `f32` for floats narrower than it, else the
    /// type itself.
    pub fn stash_type(self) -> DType {
        if matches!(self, DType::F16 | DType::Bf16) || self.is_lowp_float() {
            DType::F32
        } else {
            self
        }
    }

    /// True for the float types narrower than 16 bits (float8 variants,
    /// `float4e2m1`, `float8e8m0`), converted by [`crate::lowp`].
    pub fn is_lowp_float(self) -> bool {
        crate::lowp::is_lowp(self)
    }

    /// True for signed and unsigned integer types (not `Bool`).
    pub fn is_int(self) -> bool {
        use DType::*;
        matches!(
            self,
            U8 | I8 | U16 | I16 | I32 | I64 | U32 | U64 | U4 | I4 | U2 | I2
        )
    }

    /// Lower-case name as used in JSON and in messages.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::F16 => "f16",
            DType::F64 => "f64",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bf16 => "bf16",
            DType::F8E4M3Fn => "f8e4m3fn",
            DType::F8E4M3Fnuz => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2Fnuz => "f8e5m2fnuz",
            DType::U4 => "u4",
            DType::I4 => "i4",
            DType::F4E2M1 => "f4e2m1",
            DType::F8E8M0 => "f8e8m0",
            DType::U2 => "u2",
            DType::I2 => "i2",
            DType::String => "string",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_codes_round_trip() {
        let mut modelled = 0;
        for code in 0..32 {
            if let Some(dt) = DType::from_onnx_code(code) {
                assert_eq!(dt.onnx_code(), code);
                let json = serde_json::to_string(&dt).unwrap();
                assert_eq!(
                    json,
                    format!("\"{}\"", dt.name()),
                    "serde name is the display name"
                );
                modelled += 1;
            }
        }
        assert_eq!(modelled, 24);
        assert_eq!(DType::from_onnx_code(14), None, "complex is not modelled");
    }

    #[test]
    fn sub_byte_sizes() {
        assert_eq!((DType::I4.size_bits(), DType::I4.size_bytes()), (4, 1));
        assert_eq!(DType::U4.packed_bytes(5), Some(3));
        assert_eq!(DType::I2.packed_bytes(5), Some(2));
        assert_eq!(DType::F8E5M2.packed_bytes(5), Some(5));
        assert_eq!(DType::String.packed_bytes(5), None);
    }

    #[test]
    fn classes() {
        assert!(DType::F8E4M3Fn.is_float() && DType::F8E4M3Fn.is_lowp_float());
        assert!(!DType::Bf16.is_lowp_float());
        assert!(DType::I2.is_int() && !DType::I2.is_float());
        assert!(!DType::String.is_int() && !DType::String.is_float());
    }
}

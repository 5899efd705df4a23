//! Host tensor values: initializer data, constant-folding results and the
//! buffers of the CPU interpreter.
//!
//! Storage is by *computation class*, not by logical type, so kernels are
//! written once per class: `f16`/`bf16` and the float8/float4 types are held
//! as `f32` rounded to the logical type, every integer type (4- and 2-bit
//! ones included) as `i64` wrapped to its range (`u64` as its bit pattern),
//! strings as `String`s. `dtype` always names the logical type.
//!
//! Byte layout ([`Value::from_le_bytes`], [`Value::to_le_bytes`]) is ONNX
//! `raw_data`'s: little-endian, one byte per `bool` and float8, two 4-bit
//! elements per byte (low nibble first), four 2-bit elements per byte (lowest
//! bits first). ONNX has no raw layout for strings; ours writes each as its
//! UTF-8 byte length (`u32`, little-endian) followed by the bytes, so JSON
//! graphs carry string constants like any other.

use crate::lowp;
use crate::DType;
use half::{bf16, f16};

/// Element storage; see the module docs for which logical types map where.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
}

impl Data {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
            Data::Str(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dense, row-major host tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

/// Errors building a value from raw parts.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ValueError {
    #[error("{got} elements do not fill shape {shape:?} ({want} elements)")]
    ElementCount {
        shape: Vec<usize>,
        want: usize,
        got: usize,
    },
    #[error("{got} bytes is not a whole number of {dtype} elements for shape {shape:?}")]
    ByteCount {
        dtype: DType,
        shape: Vec<usize>,
        got: usize,
    },
    #[error("string bytes for shape {shape:?} are malformed: {message}")]
    StringBytes { shape: Vec<usize>, message: String },
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The storage class for a logical type, as an empty `Data`.
fn storage_for(dtype: DType, cap: usize) -> Data {
    match dtype {
        DType::F64 => Data::F64(Vec::with_capacity(cap)),
        dt if dt.is_float() => Data::F32(Vec::with_capacity(cap)),
        DType::Bool => Data::Bool(Vec::with_capacity(cap)),
        DType::String => Data::Str(Vec::with_capacity(cap)),
        _ => Data::I64(Vec::with_capacity(cap)),
    }
}

/// Wraps an integer to the range of `dtype` (two's complement), as a store
/// to that type would.
pub fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I16 => v as i16 as i64,
        DType::U16 => v as u16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U32 => v as u32 as i64,
        DType::U4 => v & 0xf,
        DType::I4 => (v << 60) >> 60,
        DType::U2 => v & 0x3,
        DType::I2 => (v << 62) >> 62,
        _ => v,
    }
}

/// Rounds an `f32` to the nearest value of a narrower float type, as
/// arithmetic in that type would: overflow gives infinity, or NaN in float8
/// types without one (`float4e2m1`, which has neither, saturates). Values
/// already of the type are returned unchanged.
pub fn round_float(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::Bf16 => bf16::from_f32(v).to_f32(),
        dt => lowp::cast(dt, f64::from(v), false, lowp::RoundMode::Nearest),
    }
}

/// Element `i` of a packed stream of `bits`-wide codes.
fn unpack(bytes: &[u8], bits: usize, i: usize) -> u8 {
    let at = i * bits;
    (bytes[at / 8] >> (at % 8)) & ((1u16 << bits) - 1) as u8
}

/// Packs `bits`-wide codes, lowest bits first; the last byte is zero-padded.
fn pack(codes: impl Iterator<Item = u8>, bits: usize, out: &mut Vec<u8>) {
    let per_byte = 8 / bits;
    let codes: Vec<u8> = codes.collect();
    for chunk in codes.chunks(per_byte) {
        let mask = ((1u16 << bits) - 1) as u8;
        out.push(
            chunk
                .iter()
                .enumerate()
                .fold(0u8, |b, (k, &c)| b | ((c & mask) << (k * bits))),
        );
    }
}

/// Decodes `n` length-prefixed UTF-8 strings filling `bytes` exactly.
fn strings_from_bytes(bytes: &[u8], n: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::with_capacity(n.min(bytes.len() / 4));
    let mut rest = bytes;
    for i in 0..n {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| format!("element {i}: missing length"))?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(format!("element {i}: {len} bytes announced, {} left", tail.len()));
        }
        let (text, tail) = tail.split_at(len);
        let text = std::str::from_utf8(text).map_err(|e| format!("element {i}: {e}"))?;
        out.push(text.to_string());
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes left after {n} elements", rest.len()));
    }
    Ok(out)
}

impl Value {
    /// Builds a value, checking the element count against the shape.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Data) -> Result<Value, ValueError> {
        let want = numel(&shape);
        if data.len() != want {
            return Err(ValueError::ElementCount {
                shape,
                want,
                got: data.len(),
            });
        }
        Ok(Value { dtype, shape, data })
    }

    /// An `f32` tensor.
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Result<Value, ValueError> {
        Value::new(DType::F32, shape, Data::F32(data))
    }

    /// An `f64` tensor.
    pub fn f64(shape: Vec<usize>, data: Vec<f64>) -> Result<Value, ValueError> {
        Value::new(DType::F64, shape, Data::F64(data))
    }

    /// An `i64` tensor.
    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Result<Value, ValueError> {
        Value::new(DType::I64, shape, Data::I64(data))
    }

    /// A tensor of integer type `dtype` from `i64` values (wrapped to its range).
    pub fn ints(dtype: DType, shape: Vec<usize>, data: Vec<i64>) -> Result<Value, ValueError> {
        let data = data.into_iter().map(|v| wrap_int(dtype, v)).collect();
        Value::new(dtype, shape, Data::I64(data))
    }

    /// A string tensor.
    pub fn strings(shape: Vec<usize>, data: Vec<String>) -> Result<Value, ValueError> {
        Value::new(DType::String, shape, Data::Str(data))
    }

    /// A scalar `i64`.
    pub fn scalar_i64(v: i64) -> Value {
        Value {
            dtype: DType::I64,
            shape: vec![],
            data: Data::I64(vec![v]),
        }
    }

    /// A tensor of `dtype` filled with zeros.
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Value {
        Value::filled(dtype, shape, false)
    }

    /// A tensor of `dtype` filled with ones (true; strings stay empty).
    pub fn ones(dtype: DType, shape: Vec<usize>) -> Value {
        Value::filled(dtype, shape, true)
    }

    fn filled(dtype: DType, shape: Vec<usize>, one: bool) -> Value {
        let n = numel(&shape);
        let data = match storage_for(dtype, 0) {
            Data::F32(_) => Data::F32(vec![f32::from(u8::from(one)); n]),
            Data::F64(_) => Data::F64(vec![f64::from(u8::from(one)); n]),
            Data::I64(_) => Data::I64(vec![i64::from(one); n]),
            Data::Bool(_) => Data::Bool(vec![one; n]),
            Data::Str(_) => Data::Str(vec![String::new(); n]),
        };
        Value { dtype, shape, data }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Decodes bytes in the layout of ONNX `raw_data` (see the module docs
    /// for sub-byte types and strings).
    pub fn from_le_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Value, ValueError> {
        let n = numel(&shape);
        let Some(want) = dtype.packed_bytes(n) else {
            return match strings_from_bytes(bytes, n) {
                Ok(v) => Ok(Value {
                    dtype,
                    shape,
                    data: Data::Str(v),
                }),
                Err(message) => Err(ValueError::StringBytes { shape, message }),
            };
        };
        if bytes.len() != want {
            return Err(ValueError::ByteCount {
                dtype,
                shape,
                got: bytes.len(),
            });
        }
        let bits = dtype.size_bits();
        let codes = || (0..n).map(|i| unpack(bytes, bits, i));
        let chunks = bytes.chunks_exact(dtype.size_bytes());
        let data = match dtype {
            DType::U4 | DType::I4 | DType::U2 | DType::I2 => {
                Data::I64(codes().map(|c| wrap_int(dtype, i64::from(c))).collect())
            }
            dt if dt.is_lowp_float() => {
                Data::F32(codes().map(|c| lowp::decode(dt, c).unwrap_or(f32::NAN)).collect())
            }
            DType::F32 => Data::F32(
                chunks
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F64 => Data::F64(
                chunks
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F16 => Data::F32(
                chunks
                    .map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f32())
                    .collect(),
            ),
            DType::Bf16 => Data::F32(
                chunks
                    .map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f32())
                    .collect(),
            ),
            DType::Bool => Data::Bool(bytes.iter().map(|&b| b != 0).collect()),
            DType::U8 => Data::I64(bytes.iter().map(|&b| b as i64).collect()),
            DType::I8 => Data::I64(bytes.iter().map(|&b| b as i8 as i64).collect()),
            DType::U16 => Data::I64(
                chunks
                    .map(|c| u16::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            DType::I16 => Data::I64(
                chunks
                    .map(|c| i16::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            DType::U32 => Data::I64(
                chunks
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            DType::I32 => Data::I64(
                chunks
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect(),
            ),
            _ => Data::I64(
                chunks
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
        };
        Ok(Value { dtype, shape, data })
    }

    /// Encodes the elements as little-endian bytes of the logical type
    /// (inverse of [`Value::from_le_bytes`]).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.dtype.packed_bytes(self.numel()).unwrap_or(0));
        let bits = self.dtype.size_bits();
        match (&self.data, self.dtype) {
            (Data::Str(v), _) => v.iter().for_each(|s| {
                out.extend((s.len() as u32).to_le_bytes());
                out.extend(s.as_bytes());
            }),
            (Data::F32(v), dt) if dt.is_lowp_float() => {
                pack(v.iter().map(|&x| lowp::stored_bits(dt, x)), bits, &mut out)
            }
            (Data::I64(v), _) if bits < 8 => pack(v.iter().map(|&x| x as u8), bits, &mut out),
            (Data::F32(v), DType::F16) => v.iter().for_each(|x| out.extend(f16::from_f32(*x).to_le_bytes())),
            (Data::F32(v), DType::Bf16) => v
                .iter()
                .for_each(|x| out.extend(bf16::from_f32(*x).to_le_bytes())),
            (Data::F32(v), _) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            (Data::F64(v), _) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            (Data::Bool(v), _) => out.extend(v.iter().map(|&b| b as u8)),
            (Data::I64(v), dt) => {
                let size = dt.size_bytes();
                v.iter().for_each(|x| out.extend(&x.to_le_bytes()[..size]))
            }
        }
        out
    }

    /// The elements as `f64` (any storage class; strings read as NaN); used
    /// for comparisons and for reading small constant tensors.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I64(v) if self.dtype == DType::U64 => v.iter().map(|&x| x as u64 as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&b| b as u8 as f64).collect(),
            Data::Str(v) => vec![f64::NAN; v.len()],
        }
    }

    /// The elements as `i64` if this is an integer tensor (shape arithmetic).
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I64(v) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn le_bytes_round_trip_every_dtype() {
        for dt in DType::ALL
            .into_iter()
            .filter(|d| d.size_bits() >= 8 && *d != DType::String)
        {
            let bytes: Vec<u8> = (0..3 * dt.size_bytes() as u8)
                .map(|b| {
                    if dt == DType::Bool {
                        b % 2
                    } else {
                        b.wrapping_mul(37)
                    }
                })
                .collect();
            let v = Value::from_le_bytes(dt, vec![3], &bytes).unwrap();
            assert_eq!(v.to_le_bytes(), bytes, "{dt}");
        }
    }

    #[test]
    fn sub_byte_ints_pack_low_bits_first() {
        let u4 = Value::from_le_bytes(DType::U4, vec![3], &[0x21, 0x03]).unwrap();
        assert_eq!(u4.as_i64().unwrap(), &[1, 2, 3]);
        let i4 = Value::ints(DType::I4, vec![3], vec![-8, 7, -1]).unwrap();
        assert_eq!(i4.to_le_bytes(), [0x78, 0x0f]);
        let i2 = Value::ints(DType::I2, vec![5], vec![-2, -1, 0, 1, 5]).unwrap();
        assert_eq!(i2.as_i64().unwrap(), &[-2, -1, 0, 1, 1]);
        assert_eq!(i2.to_le_bytes(), [0b01_00_11_10, 0x01]);
        assert_eq!(
            Value::from_le_bytes(DType::I2, vec![5], &i2.to_le_bytes()).unwrap(),
            i2
        );
        assert_eq!(
            Value::from_le_bytes(DType::U4, vec![3], &[0; 1]),
            Err(ValueError::ByteCount {
                dtype: DType::U4,
                shape: vec![3],
                got: 1
            })
        );
    }

    #[test]
    fn low_precision_floats_round_trip_every_code() {
        let all: Vec<u8> = (0..=255).collect();
        for dt in [
            DType::F8E4M3Fn,
            DType::F8E4M3Fnuz,
            DType::F8E5M2,
            DType::F8E5M2Fnuz,
            DType::F8E8M0,
            DType::F4E2M1,
        ] {
            let n = all.len() * 8 / dt.size_bits();
            let v = Value::from_le_bytes(dt, vec![n], &all).unwrap();
            assert_eq!(v.to_le_bytes(), all, "{dt}");
        }
        let f8 = Value::from_le_bytes(DType::F8E4M3Fn, vec![3], &[0x38, 0xc0, 0x7e]).unwrap();
        assert_eq!(f8.data, Data::F32(vec![1.0, -2.0, 448.0]));
        let f4 = Value::from_le_bytes(DType::F4E2M1, vec![2], &[0xf1]).unwrap();
        assert_eq!(f4.data, Data::F32(vec![0.5, -6.0]));
    }

    #[test]
    fn strings_round_trip_length_prefixed() {
        let v = Value::strings(vec![2], vec!["ab".into(), "é".into()]).unwrap();
        let bytes = v.to_le_bytes();
        assert_eq!(bytes, [2, 0, 0, 0, b'a', b'b', 2, 0, 0, 0, 0xc3, 0xa9]);
        assert_eq!(Value::from_le_bytes(DType::String, vec![2], &bytes).unwrap(), v);
        let err = |b: &[u8]| {
            Value::from_le_bytes(DType::String, vec![2], b)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&bytes[..9]).contains("element 1"));
        assert!(err(&[bytes.as_slice(), &[0]].concat()).contains("1 bytes left"));
        assert!(err(&[1, 0, 0, 0, 0xff, 0, 0, 0, 0]).contains("utf-8"));
        assert_eq!(
            Value::zeros(DType::String, vec![1]).data,
            Data::Str(vec![String::new()])
        );
    }

    #[test]
    fn wrong_byte_count_is_an_error() {
        assert_eq!(
            Value::from_le_bytes(DType::F32, vec![2], &[0; 7]),
            Err(ValueError::ByteCount {
                dtype: DType::F32,
                shape: vec![2],
                got: 7
            })
        );
        assert_eq!(
            Value::f32(vec![2, 2], vec![1.0]),
            Err(ValueError::ElementCount {
                shape: vec![2, 2],
                want: 4,
                got: 1
            })
        );
    }

    #[test]
    fn ints_wrap_to_their_type() {
        let v = Value::ints(DType::I8, vec![2], vec![127 + 1, -129]).unwrap();
        assert_eq!(v.as_i64().unwrap(), &[-128, 127]);
    }
}

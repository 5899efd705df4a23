//! Host tensor values: initializer data, constant-folding results and the
//! buffers of the CPU interpreter.
//!
//! Storage is by *computation class*, not by logical type, so kernels are
//! written once per class: `f16`/`bf16` are held as `f32` rounded to the
//! logical type, every integer type as `i64` wrapped to its range (`u64` as its
//! bit pattern). `dtype` always names the logical type.

use crate::DType;
use half::{bf16, f16};

/// Element storage; see the module docs for which logical types map where.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
}

impl Data {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
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
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The storage class for a logical type, as an empty `Data`.
fn storage_for(dtype: DType, cap: usize) -> Data {
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => Data::F32(Vec::with_capacity(cap)),
        DType::F64 => Data::F64(Vec::with_capacity(cap)),
        DType::Bool => Data::Bool(Vec::with_capacity(cap)),
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
        _ => v,
    }
}

/// Rounds an `f32` to the nearest value of a narrower float type.
pub fn round_float(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::Bf16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
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
        let n = numel(&shape);
        let data = match storage_for(dtype, 0) {
            Data::F32(_) => Data::F32(vec![0.0; n]),
            Data::F64(_) => Data::F64(vec![0.0; n]),
            Data::I64(_) => Data::I64(vec![0; n]),
            Data::Bool(_) => Data::Bool(vec![false; n]),
        };
        Value { dtype, shape, data }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Decodes little-endian bytes in the layout of ONNX `raw_data`
    /// (one byte per `bool`).
    pub fn from_le_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Value, ValueError> {
        let size = dtype.size_bytes();
        let n = numel(&shape);
        if bytes.len() != n * size {
            return Err(ValueError::ByteCount {
                dtype,
                shape,
                got: bytes.len(),
            });
        }
        let chunks = bytes.chunks_exact(size);
        let data = match dtype {
            DType::F32 => Data::F32(chunks.map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
            DType::F64 => Data::F64(chunks.map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()),
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
            DType::U16 => Data::I64(chunks.map(|c| u16::from_le_bytes(c.try_into().unwrap()) as i64).collect()),
            DType::I16 => Data::I64(chunks.map(|c| i16::from_le_bytes(c.try_into().unwrap()) as i64).collect()),
            DType::U32 => Data::I64(chunks.map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64).collect()),
            DType::I32 => Data::I64(chunks.map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect()),
            DType::U64 | DType::I64 => {
                Data::I64(chunks.map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect())
            }
        };
        Ok(Value { dtype, shape, data })
    }

    /// Encodes the elements as little-endian bytes of the logical type
    /// (inverse of [`Value::from_le_bytes`]).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.numel() * self.dtype.size_bytes());
        match (&self.data, self.dtype) {
            (Data::F32(v), DType::F16) => v.iter().for_each(|x| out.extend(f16::from_f32(*x).to_le_bytes())),
            (Data::F32(v), DType::Bf16) => v.iter().for_each(|x| out.extend(bf16::from_f32(*x).to_le_bytes())),
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

    /// The elements as `f64` (any storage class); used for comparisons and
    /// for reading small constant tensors.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I64(v) if self.dtype == DType::U64 => v.iter().map(|&x| x as u64 as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&b| b as u8 as f64).collect(),
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
        for dt in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::Bf16,
            DType::I8,
            DType::U8,
            DType::I16,
            DType::U16,
            DType::I32,
            DType::U32,
            DType::I64,
            DType::U64,
            DType::Bool,
        ] {
            let bytes: Vec<u8> = (0..3 * dt.size_bytes() as u8).map(|b| if dt == DType::Bool { b % 2 } else { b.wrapping_mul(37) }).collect();
            let v = Value::from_le_bytes(dt, vec![3], &bytes).unwrap();
            assert_eq!(v.to_le_bytes(), bytes, "{dt}");
        }
    }

    #[test]
    fn wrong_byte_count_is_an_error() {
        assert!(Value::from_le_bytes(DType::F32, vec![2], &[0; 7]).is_err());
        assert!(Value::f32(vec![2, 2], vec![1.0]).is_err());
    }

    #[test]
    fn ints_wrap_to_their_type() {
        let v = Value::ints(DType::I8, vec![2], vec![127 + 1, -129]).unwrap();
        assert_eq!(v.as_i64().unwrap(), &[-128, 127]);
    }
}

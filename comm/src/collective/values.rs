//! Host tensors as collective buffers and back: what a rank stages through
//! the fabric when its backend has no collectives of its own. Integer and
//! boolean tensors (masks, ids) travel as f64, exact below 2^53; ZeRO's
//! shards are the flattened tensor zero-padded to a multiple of the parts.

use super::Buffer;
use autopar_ir::{DType, Data, Value, ValueError};

/// Why a received buffer is not the tensor it should be.
#[derive(Debug, thiserror::Error)]
pub enum ValueMismatch {
    #[error("received {got} data for a {want} tensor")]
    Type { got: &'static str, want: DType },
    #[error(transparent)]
    Shape(#[from] ValueError),
}

/// The value's elements as a buffer (copied).
pub fn to_buffer(v: &Value) -> Buffer {
    match &v.data {
        Data::F32(x) => Buffer::F32(x.clone()),
        Data::F64(x) => Buffer::F64(x.clone()),
        Data::I64(x) => Buffer::F64(x.iter().map(|&i| i as f64).collect()),
        Data::Bool(x) => Buffer::F64(x.iter().map(|&b| f64::from(u8::from(b))).collect()),
        Data::Str(_) => Buffer::F64(Vec::new()),
    }
}

/// The value's elements as a buffer, moved (floats) or converted.
pub fn into_buffer(v: Value) -> Buffer {
    match v.data {
        Data::F32(x) => Buffer::F32(x),
        Data::F64(x) => Buffer::F64(x),
        data => to_buffer(&Value { data, ..v }),
    }
}

/// A `dtype` tensor of `shape` from buffer `b`.
pub fn from_buffer(b: Buffer, dtype: DType, shape: Vec<usize>) -> Result<Value, ValueMismatch> {
    let data = match (b, dtype) {
        (Buffer::F32(x), DType::F32) => Data::F32(x),
        (Buffer::F64(x), DType::F64) => Data::F64(x),
        (Buffer::F64(x), DType::Bool) => Data::Bool(x.iter().map(|&v| v != 0.0).collect()),
        (Buffer::F64(x), d) if !d.is_float() => Data::I64(x.iter().map(|&v| v as i64).collect()),
        (b, want) => {
            return Err(ValueMismatch::Type {
                got: b.dtype_name(),
                want,
            })
        }
    };
    Ok(Value::new(dtype, shape, data)?)
}

/// The flattened value padded with zeros to `len` elements.
pub fn padded_to(v: Value, len: usize) -> Buffer {
    let mut b = into_buffer(v);
    super::with_elements!(&mut b, x => x.resize(len, 0.0));
    b
}

/// The flattened value padded with zeros to a multiple of `parts`.
pub fn padded(v: Value, parts: usize) -> Buffer {
    let len = v.numel().div_ceil(parts) * parts;
    padded_to(v, len)
}

/// The first `numel(shape)` elements of a gathered, padded buffer.
pub fn unpad(b: Buffer, dtype: DType, shape: Vec<usize>) -> Result<Value, ValueMismatch> {
    let n: usize = shape.iter().product();
    let b = match b {
        Buffer::F32(mut x) => {
            x.truncate(n);
            Buffer::F32(x)
        }
        Buffer::F64(mut x) => {
            x.truncate(n);
            Buffer::F64(x)
        }
    };
    from_buffer(b, dtype, shape)
}

/// Elements `[start, start + len)` of the flattened float value (other
/// types whole), as a vector.
pub fn slice(v: &Value, start: usize, len: usize) -> Value {
    let data = match &v.data {
        Data::F32(x) => Data::F32(x[start..start + len].to_vec()),
        Data::F64(x) => Data::F64(x[start..start + len].to_vec()),
        other => other.clone(),
    };
    Value {
        dtype: v.dtype,
        shape: vec![len],
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_travel_as_f64_and_mismatches_are_named() {
        let ids = Value::ints(DType::I64, vec![3], vec![1, -2, 7]).unwrap();
        assert_eq!(from_buffer(to_buffer(&ids), DType::I64, vec![3]).unwrap(), ids);
        let e = from_buffer(Buffer::F32(vec![1.0]), DType::F64, vec![1]).unwrap_err();
        assert_eq!(e.to_string(), "received f32 data for a f64 tensor");
    }
}

//! Host tensors as collective buffers and back: what a rank stages through
//! the fabric when its backend has no collectives of its own. Integer and
//! boolean tensors (masks, ids) travel as f64, exact below 2^53; ZeRO's
//! shards are the flattened tensor zero-padded to a multiple of the parts.

use super::Buffer;
use autopar_ir::{DType, Data, Value, ValueError};
use autopar_lower::Shard;

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
fn padded_to(v: Value, len: usize) -> Buffer {
    let mut b = into_buffer(v);
    super::with_elements!(&mut b, x => x.resize(len, 0.0));
    b
}

/// The flattened value padded with zeros to a multiple of `parts`.
pub fn padded(v: Value, parts: usize) -> Buffer {
    let len = v.numel().div_ceil(parts) * parts;
    padded_to(v, len)
}

/// Part `shard.index` of the flattened value padded to a multiple of
/// `shard.parts`.
pub fn shard_of(v: &Value, shard: Shard) -> Value {
    let chunk = v.numel().div_ceil(shard.parts);
    let start = (shard.index * chunk).min(v.numel());
    let piece = padded_to(slice(v, start, chunk.min(v.numel() - start)), chunk);
    from_buffer(piece, v.dtype, vec![chunk]).unwrap_or_else(|_| v.clone())
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

/// Rebuilds a full gradient from one rank's whole copy or from every
/// rank's shard; `None` where shards are missing.
pub fn assemble(pieces: &[(Option<Shard>, Value)]) -> Option<Value> {
    if let Some((_, whole)) = pieces.iter().find(|(s, _)| s.is_none()) {
        return Some(whole.clone());
    }
    let mut sorted: Vec<&(Option<Shard>, Value)> = pieces.iter().collect();
    sorted.sort_by_key(|(s, _)| s.map(|s| s.index));
    let parts = sorted.first()?.0?.parts;
    // Several replicas (pipeline copies) may report the same shard: keep one per index.
    sorted.dedup_by_key(|(s, _)| s.map(|s| s.index));
    if sorted.len() != parts {
        return None;
    }
    let buffers: Vec<Buffer> = sorted.iter().map(|(_, v)| to_buffer(v)).collect();
    let b = Buffer::concat(&buffers)?;
    let n = b.len();
    from_buffer(b, sorted[0].1.dtype, vec![n]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_pad_and_gathers_unpad() {
        let v = Value::f32(vec![5], vec![1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        let parts: Vec<Value> = (0..2)
            .map(|index| shard_of(&v, Shard { index, parts: 2 }))
            .collect();
        assert_eq!(parts[1].to_f64_vec(), [4.0, 5.0, 0.0]);
        let shards: Vec<(Option<Shard>, Value)> = parts
            .iter()
            .enumerate()
            .map(|(index, p)| (Some(Shard { index, parts: 2 }), p.clone()))
            .collect();
        let all = assemble(&shards).unwrap();
        let back = unpad(into_buffer(all), DType::F32, vec![5]).unwrap();
        assert_eq!(back, v);
        assert_eq!(padded(v, 4).len(), 8);
    }

    #[test]
    fn integers_travel_as_f64_and_mismatches_are_named() {
        let ids = Value::ints(DType::I64, vec![3], vec![1, -2, 7]).unwrap();
        assert_eq!(from_buffer(to_buffer(&ids), DType::I64, vec![3]).unwrap(), ids);
        let e = from_buffer(Buffer::F32(vec![1.0]), DType::F64, vec![1]).unwrap_err();
        assert_eq!(e.to_string(), "received f32 data for a f64 tensor");
    }
}

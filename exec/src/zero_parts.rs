//! ZeRO's parts of a parameter: the flattened value, zero-padded to a
//! multiple of the group's size and cut evenly (part `index` of `parts`), and
//! the whole rebuilt from every member's part. The executor's own
//! bookkeeping, so the collectives only ever move the buffers.

use autopar_comm::collective::values::{from_buffer, padded_to, slice, to_buffer};
use autopar_comm::collective::Buffer;
use autopar_ir::Value;
use autopar_lower::Shard;

/// Part `shard.index` of the flattened value padded to a multiple of
/// `shard.parts`.
pub(crate) fn shard_of(v: &Value, shard: Shard) -> Value {
    let chunk = v.numel().div_ceil(shard.parts);
    let start = (shard.index * chunk).min(v.numel());
    let piece = padded_to(slice(v, start, chunk.min(v.numel() - start)), chunk);
    from_buffer(piece, v.dtype, vec![chunk]).unwrap_or_else(|_| v.clone())
}

/// Rebuilds a full gradient from one rank's whole copy or from every
/// rank's shard; `None` where shards are missing.
pub(crate) fn assemble(pieces: &[(Option<Shard>, Value)]) -> Option<Value> {
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
    use autopar_comm::collective::values::{into_buffer, padded, unpad};
    use autopar_ir::DType;

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
}

//! A gradient bucket as one flat buffer for one collective, and back. An
//! all-reduce's bucket is its gradients flattened and concatenated in
//! order. A reduce-scatter's is laid out so that each member's part of the
//! result is its ZeRO part of every gradient (flattened, zero-padded to a
//! multiple of the group's size, cut evenly: [`crate::zero_parts`]),
//! concatenated in order: one collective moves the bucket, each rank sends
//! what the members would send one by one, and optimizer steps and shards
//! stay per parameter. Public so that a backend's own collectives can lay
//! a bucket out alike.

use autopar_comm::collective::values::{from_buffer, into_buffer, padded, slice, ValueMismatch};
use autopar_comm::collective::Buffer;
use autopar_ir::{DType, Value};

/// Why a bucket cannot be laid out or cut back.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    #[error("a bucket's gradients must share one element type")]
    MixedTypes,
    #[error("an empty bucket")]
    Empty,
    #[error("a bucket of {got} elements cut into pieces of {want}")]
    Length { got: usize, want: usize },
    #[error(transparent)]
    Value(#[from] ValueMismatch),
}

/// `values` flattened and concatenated in order (an all-reduce's bucket).
pub fn concat(values: Vec<Value>) -> Result<Buffer, BucketError> {
    let buffers: Vec<Buffer> = values.into_iter().map(into_buffer).collect();
    joined(&buffers)
}

/// `values` laid out for a reduce-scatter over `parts` members: part `i`
/// is part `i` of every value, in order.
pub fn interleave(values: Vec<Value>, parts: usize) -> Result<Buffer, BucketError> {
    let cut: Vec<Vec<Buffer>> = values
        .into_iter()
        .map(|v| padded(v, parts).split_even(parts).ok_or(BucketError::Empty))
        .collect::<Result<_, _>>()?;
    let ordered: Vec<Buffer> = (0..parts)
        .flat_map(|i| cut.iter().map(move |pieces| pieces[i].clone()))
        .collect();
    joined(&ordered)
}

fn joined(buffers: &[Buffer]) -> Result<Buffer, BucketError> {
    match buffers {
        [] => Err(BucketError::Empty),
        _ => Buffer::concat(buffers).ok_or(BucketError::MixedTypes),
    }
}

/// A gathered bucket of weights back into each weight, whole but still
/// padded: `flat` holds `parts` members' parts, each that member's shard of
/// every weight in order, of `shard_lens` elements (a reduce-scatter's
/// layout, [`interleave`], read backwards).
pub fn ungather(
    flat: Buffer,
    dtype: DType,
    parts: usize,
    shard_lens: &[usize],
) -> Result<Vec<Buffer>, BucketError> {
    let (got, want) = (flat.len(), parts * shard_lens.iter().sum::<usize>());
    let cut = flat
        .split_even(parts)
        .filter(|_| got == want)
        .ok_or(BucketError::Length { got, want })?;
    let shapes: Vec<Vec<usize>> = shard_lens.iter().map(|&len| vec![len]).collect();
    let shards = cut
        .into_iter()
        .map(|part| split(part, dtype, &shapes))
        .collect::<Result<Vec<_>, _>>()?;
    (0..shard_lens.len())
        .map(|j| concat(shards.iter().map(|member| member[j].clone()).collect()))
        .collect()
}

/// Cuts `flat` into consecutive `dtype` values of `shapes`: an
/// all-reduced bucket into its gradients, or a member's part of a
/// reduce-scattered one into its part of each (shapes `[part length]`).
pub fn split(flat: Buffer, dtype: DType, shapes: &[Vec<usize>]) -> Result<Vec<Value>, BucketError> {
    let want: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    if flat.len() != want {
        return Err(BucketError::Length {
            got: flat.len(),
            want,
        });
    }
    let all = from_buffer(flat, dtype, vec![want])?;
    let mut start = 0;
    Ok(shapes
        .iter()
        .map(|shape| {
            let len = shape.iter().product();
            let piece = slice(&all, start, len);
            start += len;
            Value {
                shape: shape.clone(),
                ..piece
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zero_parts::shard_of;
    use autopar_lower::Shard;

    fn v(x: &[f32]) -> Value {
        Value::f32(vec![x.len()], x.to_vec()).unwrap()
    }

    #[test]
    fn a_member_s_part_is_its_shard_of_every_gradient() {
        let (a, b) = (v(&[1.0, 2.0, 3.0]), v(&[4.0, 5.0, 6.0, 7.0, 8.0]));
        let flat = interleave(vec![a.clone(), b.clone()], 2).unwrap();
        // a pads to 4, b to 6: each part is 2 + 3 elements.
        let parts = flat.split_even(2).unwrap();
        for (index, part) in parts.into_iter().enumerate() {
            let got = split(part, DType::F32, &[vec![2], vec![3]]).unwrap();
            let shard = Shard { index, parts: 2 };
            assert_eq!(got, [shard_of(&a, shard), shard_of(&b, shard)]);
        }
    }

    #[test]
    fn a_gathered_bucket_is_every_member_s_shards_of_each_weight() {
        let (a, b) = (v(&[1.0, 2.0, 3.0]), v(&[4.0, 5.0, 6.0, 7.0, 8.0]));
        let shard = |index| Shard { index, parts: 2 };
        // What each member sends: its shard of a, then of b (2 + 3 elements).
        let sent: Vec<Buffer> = (0..2)
            .map(|i| concat(vec![shard_of(&a, shard(i)), shard_of(&b, shard(i))]).unwrap())
            .collect();
        let gathered = Buffer::concat(&sent).unwrap();
        let whole = ungather(gathered, DType::F32, 2, &[2, 3]).unwrap();
        assert_eq!(whole[0], Buffer::F32(vec![1.0, 2.0, 3.0, 0.0]));
        assert_eq!(whole[1], Buffer::F32(vec![4.0, 5.0, 6.0, 7.0, 8.0, 0.0]));
        assert!(matches!(
            ungather(Buffer::F32(vec![0.0; 9]), DType::F32, 2, &[2, 3]),
            Err(BucketError::Length { got: 9, want: 10 })
        ));
    }

    #[test]
    fn an_all_reduce_bucket_splits_back_into_its_gradients() {
        let a = Value::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = v(&[5.0]);
        let flat = concat(vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(flat.len(), 5);
        assert_eq!(
            split(flat.clone(), DType::F32, &[vec![2, 2], vec![1]]).unwrap(),
            [a, b]
        );
        assert!(matches!(
            split(flat, DType::F32, &[vec![2]]),
            Err(BucketError::Length { got: 5, want: 2 })
        ));
    }
}

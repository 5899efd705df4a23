use super::super::testing::*;
use super::super::Op;
use crate::DType;

#[test]
fn gather_rows_and_columns_with_negative_indices() {
    let x = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ids = i64s(&[2, 1], &[2, -3]);
    assert_eq!(
        eval1(&Op::Gather { axis: 0 }, &[&x, &ids]),
        (vec![2, 1, 2], vec![5.0, 6.0, 1.0, 2.0])
    );
    let col = i64s(&[], &[-1]);
    assert_eq!(
        eval1(&Op::Gather { axis: 1 }, &[&x, &col]),
        (vec![3], vec![2.0, 4.0, 6.0])
    );
    assert_op_err(
        eval(&Op::Gather { axis: 0 }, &[&x, &i64s(&[1], &[3])]),
        "Gather",
        "index 3 is out of range for an axis of 3",
    );
    let t = infer(
        &Op::Gather { axis: 0 },
        &[ty(DType::F32, "v 8"), ty(DType::I64, "b s")],
    )
    .unwrap();
    assert_eq!(t[0], ty(DType::F32, "b s 8"));
}

#[test]
fn gather_elements() {
    let x = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let ids = i64s(&[2, 2], &[0, 0, 1, -2]);
    assert_eq!(
        eval1(&Op::GatherElements { axis: 1 }, &[&x, &ids]).1,
        vec![1.0, 1.0, 4.0, 3.0]
    );
    let rows = i64s(&[1, 2], &[1, 0]);
    assert_eq!(
        eval1(&Op::GatherElements { axis: 0 }, &[&x, &rows]).1,
        vec![3.0, 2.0]
    );
}

#[test]
fn gather_nd_with_batch_dims() {
    let x = ints(DType::I32, &[2, 2], &[0, 1, 2, 3]);
    let ids = i64s(&[2, 2], &[0, 0, 1, 1]);
    assert_eq!(
        eval1(&Op::GatherNd { batch_dims: 0 }, &[&x, &ids]),
        (vec![2], vec![0.0, 3.0])
    );
    let rows = i64s(&[2, 1], &[1, 0]);
    assert_eq!(
        eval1(&Op::GatherNd { batch_dims: 0 }, &[&x, &rows]),
        (vec![2, 2], vec![2.0, 3.0, 0.0, 1.0])
    );
    let x3 = ints(DType::I32, &[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
    let b = i64s(&[2, 1], &[1, 0]);
    assert_eq!(
        eval1(&Op::GatherNd { batch_dims: 1 }, &[&x3, &b]),
        (vec![2, 2], vec![2.0, 3.0, 4.0, 5.0])
    );
    assert_op_err(
        infer(
            &Op::GatherNd { batch_dims: 0 },
            &[ty(DType::F32, "2"), ty(DType::I64, "1 2")],
        ),
        "GatherNd",
        "indices [1, 2] do not fit data [2] with batch_dims 0",
    );
}

#[test]
fn embedding_lookup() {
    let table = f32s(&[3, 2], &[0.0, 0.1, 1.0, 1.1, 2.0, 2.1]);
    let ids = i64s(&[1, 2], &[2, 0]);
    assert_eq!(
        eval1(&Op::Embedding, &[&table, &ids]),
        (
            vec![1, 2, 2],
            [2.0f32, 2.1, 0.0, 0.1].iter().map(|&v| v as f64).collect()
        )
    );
    let t = infer(
        &Op::Embedding,
        &[ty(DType::F32, "50257 768"), ty(DType::I64, "b s")],
    )
    .unwrap();
    assert_eq!(t[0], ty(DType::F32, "b s 768"));
    assert_op_err(
        infer(
            &Op::Embedding,
            &[ty(DType::F32, "50257 768"), ty(DType::F32, "b s")],
        ),
        "Embedding",
        "input 1 must be an integer tensor, got f32",
    );
}

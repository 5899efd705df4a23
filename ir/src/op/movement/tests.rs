use super::super::testing::*;
use super::super::Op;
use super::*;
use crate::DType;

fn reshape_ty(x: &str, target: &[i64], allowzero: bool) -> Result<TensorType, OpError> {
    let t = i64s(&[target.len()], target);
    infer_with(
        &Op::Reshape { allowzero },
        &[
            (ty(DType::F32, x), None),
            (ty(DType::I64, &target.len().to_string()), Some(t)),
        ],
    )
    .map(|mut v| v.remove(0))
}

#[test]
fn reshape_symbolic_zero_and_minus_one() {
    assert_eq!(
        reshape_ty("b s 768", &[0, 0, 12, 64], false).unwrap(),
        ty(DType::F32, "b s 12 64")
    );
    assert_eq!(
        reshape_ty("b s 12 64", &[0, -1, 768], false).unwrap(),
        ty(DType::F32, "b s 768")
    );
    assert_eq!(
        reshape_ty("b 12 64", &[-1, 768], false).unwrap(),
        ty(DType::F32, "b 768")
    );
    assert_eq!(
        reshape_ty("2 3 4", &[-1, 4], false).unwrap(),
        ty(DType::F32, "6 4")
    );
    assert_eq!(reshape_ty("0 3", &[0, 3], true).unwrap(), ty(DType::F32, "0 3"));
    assert_op_err(
        reshape_ty("2 3 4", &[5, -1], false),
        "Reshape",
        "cannot reshape [2, 3, 4] to [5, -1]",
    );
    assert_op_err(
        reshape_ty("2 3", &[4, 2], false),
        "Reshape",
        "cannot reshape [2, 3] to [4, 2]",
    );
    assert_op_err(
        reshape_ty("b s 64", &[-1, 32], false),
        "Reshape",
        "inferring -1 for [b, s, 64] from [-1, 32] is not supported",
    );
    assert_op_err(
        reshape_ty("2 3", &[-1, -1], false),
        "Reshape",
        "more than one -1 in the target shape",
    );
    let no_value = infer(
        &Op::Reshape { allowzero: false },
        &[ty(DType::F32, "2 3"), ty(DType::I64, "2")],
    );
    assert!(matches!(no_value, Err(OpError::NotConstant { input: 1, .. })));
}

#[test]
fn reshape_eval_keeps_data() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let t = i64s(&[2], &[3, -1]);
    assert_eq!(
        eval1(&Op::Reshape { allowzero: false }, &[&x, &t]),
        (vec![3, 2], x.to_f64_vec())
    );
}

#[test]
fn transpose_permutes() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        eval1(&Op::Transpose { perm: None }, &[&x]),
        (vec![3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0])
    );
    let op = Op::Transpose {
        perm: Some(vec![0, 2, 1, 3]),
    };
    assert_eq!(
        infer(&op, &[ty(DType::F32, "b s 12 64")]).unwrap()[0],
        ty(DType::F32, "b 12 s 64")
    );
    assert_op_err(
        infer(
            &Op::Transpose {
                perm: Some(vec![0, 0]),
            },
            &[ty(DType::F32, "2 3")],
        ),
        "Transpose",
        "[0, 0] is not a permutation of 2 dims",
    );
}

#[test]
fn expand_broadcasts_both_ways() {
    let x = f32s(&[3, 1], &[1.0, 2.0, 3.0]);
    let s = i64s(&[3], &[2, 1, 2]);
    let (shape, out) = eval1(&Op::Expand, &[&x, &s]);
    assert_eq!(shape, vec![2, 3, 2]);
    assert_eq!(&out[..6], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    let sym = infer_with(
        &Op::Expand,
        &[
            (ty(DType::F32, "b 1"), None),
            (ty(DType::I64, "2"), Some(i64s(&[2], &[1, 4]))),
        ],
    );
    assert_eq!(sym.unwrap()[0], ty(DType::F32, "b 4"));
}

#[test]
fn squeeze_and_unsqueeze() {
    let sq = |axes: Option<Vec<i64>>, x: &str| {
        infer(&Op::Squeeze { axes }, &[ty(DType::F32, x)]).map(|mut v| v.remove(0))
    };
    assert_eq!(sq(None, "1 b 1 4").unwrap(), ty(DType::F32, "b 4"));
    assert_eq!(sq(Some(vec![-2]), "1 b 1 4").unwrap(), ty(DType::F32, "1 b 4"));
    assert_op_err(
        sq(Some(vec![3]), "1 b 1 4"),
        "Squeeze",
        "cannot squeeze axis 3 of size 4",
    );
    let axes = i64s(&[1], &[0]);
    let input = infer_with(
        &Op::Squeeze { axes: None },
        &[(ty(DType::F32, "1 3"), None), (ty(DType::I64, "1"), Some(axes))],
    );
    assert_eq!(input.unwrap()[0], ty(DType::F32, "3"));
    let un = Op::Unsqueeze {
        axes: Some(vec![0, -1]),
    };
    assert_eq!(
        infer(&un, &[ty(DType::F32, "b 3")]).unwrap()[0],
        ty(DType::F32, "1 b 3 1")
    );
    let x = f32s(&[2], &[1.0, 2.0]);
    let axes = i64s(&[2], &[2, 0]);
    assert_eq!(
        eval1(&Op::Unsqueeze { axes: None }, &[&x, &axes]).0,
        vec![1, 2, 1]
    );
    assert_op_err(
        infer(
            &Op::Unsqueeze {
                axes: Some(vec![0, 0]),
            },
            &[ty(DType::F32, "3")],
        ),
        "Unsqueeze",
        "axis 0 is repeated in [0, 0]",
    );
}

#[test]
fn flatten_axes() {
    let fl = |axis, x: &str| infer(&Op::Flatten { axis }, &[ty(DType::F32, x)]).map(|mut v| v.remove(0));
    assert_eq!(fl(1, "2 3 4").unwrap(), ty(DType::F32, "2 12"));
    assert_eq!(fl(0, "2 3 4").unwrap(), ty(DType::F32, "1 24"));
    assert_eq!(fl(3, "2 3 4").unwrap(), ty(DType::F32, "24 1"));
    assert_eq!(fl(-2, "b 3 4").unwrap(), ty(DType::F32, "b 12"));
    assert_op_err(
        fl(-1, "b 3 4"),
        "Flatten",
        "flattening [b, 3, 4] at axis -1 (symbolic product) is not supported",
    );
}

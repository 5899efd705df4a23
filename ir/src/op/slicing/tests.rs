use super::super::testing::*;
use super::super::Op;
use super::*;
use crate::DType;

#[test]
fn concat_along_negative_axis() {
    let a = f32s(&[2, 1], &[1.0, 2.0]);
    let b = f32s(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        eval1(&Op::Concat { axis: -1 }, &[&a, &b]),
        (vec![2, 3], vec![1.0, 3.0, 4.0, 2.0, 5.0, 6.0])
    );
    let t = infer(
        &Op::Concat { axis: 1 },
        &[ty(DType::F32, "b 2"), ty(DType::F32, "b 3")],
    )
    .unwrap();
    assert_eq!(t[0], ty(DType::F32, "b 5"));
    let t = infer(
        &Op::Concat { axis: 0 },
        &[ty(DType::F32, "s 2"), ty(DType::F32, "0 2")],
    )
    .unwrap();
    assert_eq!(t[0], ty(DType::F32, "s 2"));
    assert_op_err(
        infer(
            &Op::Concat { axis: 0 },
            &[ty(DType::F32, "s 2"), ty(DType::F32, "1 2")],
        ),
        "Concat",
        "concatenating symbolic dims is not supported",
    );
    assert_op_err(
        infer(
            &Op::Concat { axis: 0 },
            &[ty(DType::F32, "1 2"), ty(DType::F32, "1 3")],
        ),
        "Concat",
        "input 1 dim 1 is 3, expected 2",
    );
}

#[test]
fn split_uneven_and_given() {
    let x = f32s(&[7], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let op = Op::Split {
        axis: 0,
        split: None,
        outputs: 3,
    };
    let out = eval(&op, &[&x]).unwrap();
    let shapes: Vec<_> = out.iter().map(|v| v.shape.clone()).collect();
    assert_eq!(shapes, vec![vec![3], vec![3], vec![1]]);
    assert_eq!(out[2].to_f64_vec(), vec![6.0]);
    let sizes = i64s(&[2], &[2, 5]);
    let out = eval(
        &Op::Split {
            axis: -1,
            split: None,
            outputs: 2,
        },
        &[&x, &sizes],
    )
    .unwrap();
    assert_eq!(out[1].to_f64_vec(), vec![2.0, 3.0, 4.0, 5.0, 6.0]);
    let attr = Op::Split {
        axis: 0,
        split: Some(vec![3, 3]),
        outputs: 2,
    };
    assert_op_err(eval(&attr, &[&x]), "Split", "split sizes [3, 3] do not sum to 7");
    let m = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let cols = eval(
        &Op::Split {
            axis: 1,
            split: None,
            outputs: 2,
        },
        &[&m],
    )
    .unwrap();
    assert_eq!(cols[1].to_f64_vec(), vec![2.0, 4.0]);
}

fn slice(
    x: &Value,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> (Vec<usize>, Vec<f64>) {
    let v = |d: &[i64]| i64s(&[d.len()], d);
    let mut ins = vec![x.clone(), v(starts), v(ends)];
    ins.extend(axes.map(v));
    ins.extend(steps.map(v));
    eval1(&Op::Slice, &ins.iter().collect::<Vec<_>>())
}

#[test]
fn slice_clamps_and_steps() {
    let x = f32s(&[2, 4], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    assert_eq!(
        slice(&x, &[1, 0], &[2, 3], Some(&[0, 1]), Some(&[1, 2])),
        (vec![1, 2], vec![4.0, 6.0])
    );
    assert_eq!(
        slice(&x, &[-1], &[i64::MIN], Some(&[-1]), Some(&[-1])),
        (vec![2, 4], vec![3.0, 2.0, 1.0, 0.0, 7.0, 6.0, 5.0, 4.0])
    );
    assert_eq!(
        slice(&x, &[1], &[1000], Some(&[1]), None),
        (vec![2, 3], vec![1.0, 2.0, 3.0, 5.0, 6.0, 7.0])
    );
    assert_eq!(slice(&x, &[10], &[20], Some(&[1]), None).0, vec![2, 0]);
    assert_eq!(
        slice(&x, &[-3], &[-1], Some(&[1]), Some(&[1])).1,
        vec![1.0, 2.0, 5.0, 6.0]
    );
}

#[test]
fn slice_inference_on_symbolic_dims() {
    let c = |d: &[i64]| (ty(DType::I64, &d.len().to_string()), Some(i64s(&[d.len()], d)));
    let x = (ty(DType::F32, "b s 64"), None);
    let r = infer_with(
        &Op::Slice,
        &[x.clone(), c(&[0, 0]), c(&[i64::MAX, 32]), c(&[0, 2])],
    )
    .unwrap();
    assert_eq!(r[0], ty(DType::F32, "b s 32"));
    assert_op_err(
        infer_with(&Op::Slice, &[x.clone(), c(&[0]), c(&[4]), c(&[1])]),
        "Slice",
        "slicing symbolic dim 1 of [b, s, 64] is not supported",
    );
    assert_op_err(
        infer_with(&Op::Slice, &[x, c(&[0]), c(&[4]), c(&[2]), c(&[0])]),
        "Slice",
        "slice step 0",
    );
}

#[test]
fn trilu_keeps_triangles() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        eval1(&Op::Trilu { upper: true }, &[&x]).1,
        vec![1.0, 2.0, 3.0, 0.0, 5.0, 6.0]
    );
    assert_eq!(
        eval1(&Op::Trilu { upper: false }, &[&x]).1,
        vec![1.0, 0.0, 0.0, 4.0, 5.0, 0.0]
    );
    let k = i64s(&[], &[1]);
    assert_eq!(
        eval1(&Op::Trilu { upper: true }, &[&x, &k]).1,
        vec![0.0, 2.0, 3.0, 0.0, 0.0, 6.0]
    );
    let k = i64s(&[], &[-1]);
    assert_eq!(
        eval1(&Op::Trilu { upper: false }, &[&x, &k]).1,
        vec![0.0, 0.0, 0.0, 4.0, 0.0, 0.0]
    );
    assert_op_err(
        infer(&Op::Trilu { upper: true }, &[ty(DType::F32, "3")]),
        "Trilu",
        "input must have rank ≥ 2, got [3]",
    );
}

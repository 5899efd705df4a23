use super::super::testing::*;
use super::super::Op;
use super::*;
use crate::Data;

#[test]
fn shape_with_clamped_range() {
    let x = f32s(&[2, 3, 4], &[0.0; 24]);
    let sh = |start, end| {
        eval(&Op::Shape { start, end }, &[&x]).unwrap()[0]
            .as_i64()
            .unwrap()
            .to_vec()
    };
    assert_eq!(sh(0, None), vec![2, 3, 4]);
    assert_eq!(sh(-1, None), vec![4]);
    assert_eq!(sh(1, Some(-1)), vec![3]);
    assert_eq!(sh(-10, Some(10)), vec![2, 3, 4]);
    assert_eq!(sh(2, Some(1)), Vec::<i64>::new());
    let t = infer(&Op::Shape { start: 1, end: None }, &[ty(DType::F32, "b s 8")]).unwrap();
    assert_eq!(t[0], ty(DType::I64, "2"));
    assert_eq!(eval(&Op::Size, &[&x]).unwrap()[0], Value::scalar_i64(24));
}

#[test]
fn constant_of_shape() {
    let shape = i64s(&[2], &[2, 1]);
    let op = Op::ConstantOfShape {
        value: Some(ScalarValue {
            dtype: DType::I32,
            value: 7.0,
        }),
    };
    let out = eval(&op, &[&shape]).unwrap();
    assert_eq!(
        (
            out[0].dtype,
            out[0].shape.clone(),
            out[0].as_i64().unwrap().to_vec()
        ),
        (DType::I32, vec![2, 1], vec![7, 7])
    );
    let scalar = eval(&Op::ConstantOfShape { value: None }, &[&i64s(&[0], &[])]).unwrap();
    assert_eq!(scalar[0], Value::f32(vec![], vec![0.0]).unwrap());
    assert!(matches!(
        infer(&Op::ConstantOfShape { value: None }, &[ty(DType::I64, "2")]),
        Err(OpError::NotConstant { input: 0, .. })
    ));
}

#[test]
fn range_for_ints_and_floats() {
    let i = |v| ints(DType::I32, &[], &[v]);
    assert_eq!(
        eval1(&Op::Range, &[&i(10), &i(4), &i(-3)]),
        (vec![2], vec![10.0, 7.0])
    );
    let f = |v| f32s(&[], &[v]);
    assert_eq!(eval1(&Op::Range, &[&f(1.0), &f(2.0), &f(0.3)]).0, vec![4]);
    let h = |v| Value::new(DType::F16, vec![], Data::F32(vec![v])).unwrap();
    let out = eval(&Op::Range, &[&h(0.0), &h(0.5), &h(0.1)]).unwrap();
    assert_eq!(out[0].dtype, DType::F16);
    assert_eq!(out[0].to_f64_vec()[1], half::f16::from_f64(0.1).to_f64());
    assert_op_err(eval(&Op::Range, &[&i(0), &i(4), &i(0)]), "Range", "delta is zero");
    assert!(matches!(
        infer(
            &Op::Range,
            &[ty(DType::I64, ""), ty(DType::I64, ""), ty(DType::I64, "")]
        ),
        Err(OpError::NotConstant { .. })
    ));
}

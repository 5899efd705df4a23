use super::super::testing::*;
use super::super::Op;
use super::*;

fn bin(func: BinaryOp) -> Op {
    Op::Binary { func }
}

#[test]
fn add_broadcasts_column_against_row() {
    let a = f32s(&[2, 1], &[1.0, 2.0]);
    let b = f32s(&[3], &[10.0, 20.0, 30.0]);
    assert_eq!(
        eval1(&bin(BinaryOp::Add), &[&a, &b]),
        (vec![2, 3], vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0])
    );
}

#[test]
fn symbolic_broadcast_inference() {
    let out = infer(
        &bin(BinaryOp::Mul),
        &[ty(DType::F32, "b s 64"), ty(DType::F32, "64")],
    )
    .unwrap();
    assert_eq!(out[0], ty(DType::F32, "b s 64"));
    let cmp = infer(
        &bin(BinaryOp::Less),
        &[ty(DType::I64, "b 1"), ty(DType::I64, "s 1")],
    );
    assert_op_err(
        cmp,
        "Less",
        "broadcasting different symbolic dims ([b, 1] and [s, 1]) is not supported",
    );
    let cmp = infer(
        &bin(BinaryOp::Less),
        &[ty(DType::I64, "b 1"), ty(DType::I64, "1 4")],
    )
    .unwrap();
    assert_eq!(cmp[0], ty(DType::Bool, "b 4"));
}

#[test]
fn type_errors() {
    assert_op_err(
        infer(&bin(BinaryOp::Add), &[ty(DType::F32, "2"), ty(DType::I64, "2")]),
        "Add",
        "inputs 0 and 1 differ in type (f32 vs i64)",
    );
    assert_op_err(
        infer(&Op::Unary { func: UnaryOp::Not }, &[ty(DType::F32, "2")]),
        "Not",
        "input type f32 is not supported",
    );
    assert_op_err(
        infer(&Op::Unary { func: UnaryOp::Exp }, &[ty(DType::I32, "2")]),
        "Exp",
        "input type i32 is not supported",
    );
    assert!(matches!(
        infer(&bin(BinaryOp::Sub), &[ty(DType::F32, "2")]),
        Err(OpError::Arity { .. })
    ));
}

#[test]
fn integer_division_truncates_and_rejects_zero() {
    let a = ints(DType::I32, &[2], &[-7, 7]);
    let b = ints(DType::I32, &[2], &[2, -2]);
    assert_eq!(eval1(&bin(BinaryOp::Div), &[&a, &b]).1, vec![-3.0, -3.0]);
    let z = ints(DType::I32, &[1], &[0]);
    assert_op_err(
        eval(&bin(BinaryOp::Div), &[&a, &z]),
        "Div",
        "integer division by zero",
    );
}

#[test]
fn integers_wrap_and_u64_compares_unsigned() {
    let a = ints(DType::U8, &[1], &[250]);
    let b = ints(DType::U8, &[1], &[10]);
    assert_eq!(eval1(&bin(BinaryOp::Add), &[&a, &b]).1, vec![4.0]);
    let big = ints(DType::U64, &[1], &[-1]); // u64::MAX
    let one = ints(DType::U64, &[1], &[1]);
    let gt = eval(&bin(BinaryOp::Greater), &[&big, &one]).unwrap();
    assert_eq!(gt[0].data, Data::Bool(vec![true]));
    let max = eval(&bin(BinaryOp::Max), &[&big, &one]).unwrap();
    assert_eq!(max[0].as_i64().unwrap(), &[-1]);
}

/// ONNX `Mod`: the divisor's sign (Python's `%`) and, with `fmod=1`, the
/// dividend's (C's `fmod`), for integers and floats.
#[test]
fn remainders_take_the_divisors_or_the_dividends_sign() {
    let a = ints(DType::I32, &[4], &[-7, 7, -7, 6]);
    let b = ints(DType::I32, &[4], &[3, -3, -3, 3]);
    assert_eq!(
        eval1(&bin(BinaryOp::Mod), &[&a, &b]).1,
        vec![2.0, -2.0, -1.0, 0.0]
    );
    assert_eq!(
        eval1(&bin(BinaryOp::Fmod), &[&a, &b]).1,
        vec![-1.0, 1.0, -1.0, 0.0]
    );
    let x = f32s(&[3], &[-7.5, 7.5, 4.0]);
    let y = f32s(&[3], &[2.0, -2.0, 2.0]);
    assert_eq!(eval1(&bin(BinaryOp::Mod), &[&x, &y]).1, vec![0.5, -0.5, 0.0]);
    assert_eq!(eval1(&bin(BinaryOp::Fmod), &[&x, &y]).1, vec![-1.5, 1.5, 0.0]);
    let zero = ints(DType::I32, &[1], &[0]);
    assert!(eval(&bin(BinaryOp::Mod), &[&a, &zero]).is_err());
}

#[test]
fn pow_with_mixed_types() {
    let base = f32s(&[2], &[2.0, 3.0]);
    let e = i64s(&[1], &[2]);
    let out = eval(&bin(BinaryOp::Pow), &[&base, &e]).unwrap();
    assert_eq!((out[0].dtype, out[0].to_f64_vec()), (DType::F32, vec![4.0, 9.0]));
    let ib = ints(DType::I32, &[2], &[2, 3]);
    let half = f32s(&[1], &[0.5]);
    assert_eq!(eval1(&bin(BinaryOp::Pow), &[&ib, &half]).1, vec![1.0, 1.0]);
    let ie = ints(DType::I32, &[2], &[3, -1]);
    assert_eq!(eval1(&bin(BinaryOp::Pow), &[&ib, &ie]).1, vec![8.0, 0.0]);
}

#[test]
fn variadic_max_folds_left() {
    let (a, b, c) = (
        f32s(&[2], &[1.0, 5.0]),
        f32s(&[2], &[3.0, 2.0]),
        f32s(&[1], &[4.0]),
    );
    assert_eq!(eval1(&bin(BinaryOp::Max), &[&a, &b, &c]).1, vec![4.0, 5.0]);
}

#[test]
fn half_precision_results_are_rounded() {
    let a = Value::new(DType::F16, vec![1], Data::F32(vec![1.0])).unwrap();
    let b = Value::new(DType::F16, vec![1], Data::F32(vec![0.0004])).unwrap();
    let out = eval(&bin(BinaryOp::Add), &[&a, &b]).unwrap();
    assert_eq!((out[0].dtype, out[0].to_f64_vec()), (DType::F16, vec![1.0]));
}

#[test]
fn unary_functions() {
    let x = f32s(&[3], &[-1.0, 0.0, 2.0]);
    let run = |func| eval1(&Op::Unary { func }, &[&x]).1;
    assert_eq!(run(UnaryOp::Relu), vec![0.0, 0.0, 2.0]);
    assert_eq!(run(UnaryOp::Sign), vec![-1.0, 0.0, 1.0]);
    assert_close(&run(UnaryOp::Sigmoid), &[0.268941, 0.5, 0.880797], 1e-6);
    assert_close(&run(UnaryOp::Erf), &[-0.842701, 0.0, 0.995322], 1e-6);
    let i = ints(DType::I8, &[2], &[-128, 5]);
    assert_eq!(
        eval1(&Op::Unary { func: UnaryOp::Neg }, &[&i]).1,
        vec![-128.0, -5.0]
    );
    let b = bools(&[2], &[true, false]);
    assert_eq!(
        eval(&Op::Unary { func: UnaryOp::Not }, &[&b]).unwrap()[0].data,
        Data::Bool(vec![false, true])
    );
}

#[test]
fn where_broadcasts_all_three() {
    let c = bools(&[2, 1], &[true, false]);
    let x = f32s(&[2], &[1.0, 2.0]);
    let y = f32s(&[], &[0.0]);
    assert_eq!(
        eval1(&Op::Where, &[&c, &x, &y]),
        (vec![2, 2], vec![1.0, 2.0, 0.0, 0.0])
    );
    assert_op_err(
        infer(
            &Op::Where,
            &[ty(DType::F32, "2"), ty(DType::F32, "2"), ty(DType::F32, "2")],
        ),
        "Where",
        "condition must be bool",
    );
}

#[test]
fn cast_rules() {
    let x = f32s(&[4], &[1.7, -1.7, 300.0, 0.0]);
    let to = |to| eval(&Op::cast(to), &[&x]).unwrap().remove(0);
    assert_eq!(to(DType::I32).as_i64().unwrap(), &[1, -1, 300, 0]);
    assert_eq!(to(DType::U8).as_i64().unwrap(), &[1, 255, 44, 0]);
    assert_eq!(to(DType::Bool).data, Data::Bool(vec![true, true, true, false]));
    let h = f32s(&[1], &[1.0001]);
    assert_eq!(eval1(&Op::cast(DType::F16), &[&h]).1, vec![1.0]);
    let d = Value::f64(vec![1], vec![1.0 + 1.0 / 256.0]).unwrap();
    assert_eq!(eval1(&Op::cast(DType::Bf16), &[&d]).1, vec![1.0]);
    let b = bools(&[2], &[true, false]);
    assert_eq!(eval1(&Op::cast(DType::F64), &[&b]).1, vec![1.0, 0.0]);
    let big = ints(DType::I64, &[1], &[-1]);
    assert_eq!(
        eval(&Op::cast(DType::U64), &[&big]).unwrap()[0].to_f64_vec(),
        vec![u64::MAX as f64]
    );
}

#[test]
fn cast_to_low_precision_types() {
    let x = f32s(&[5], &[0.48, 1e6, f32::NAN, -17.0, f32::INFINITY]);
    let to = |to, saturate| {
        let op = Op::Cast {
            to,
            saturate,
            round_mode: RoundMode::Up,
        };
        eval1(&op, &[&x]).1
    };
    let sat = to(DType::F8E4M3Fn, true);
    assert_eq!((sat[0], sat[1], sat[3], sat[4]), (0.46875, 448.0, -16.0, 448.0));
    assert!(sat[2].is_nan());
    let e5m2 = to(DType::F8E5M2, false);
    assert_eq!((e5m2[1], e5m2[4]), (f64::INFINITY, f64::INFINITY));
    assert!(to(DType::F8E4M3Fnuz, false)[1].is_nan());
    // int4 truncates then wraps (-17 → -1); NaN/inf give 0.
    let i4 = eval(&Op::cast(DType::I4), &[&x]).unwrap().remove(0);
    assert_eq!(i4.as_i64().unwrap(), &[0, 0, 0, -1, 0]);
    let u2 = eval(&Op::cast(DType::U2), &[&ints(DType::I8, &[3], &[-1, 4, 6])]).unwrap();
    assert_eq!(u2[0].as_i64().unwrap(), &[3, 0, 2]);
    let e8 = |round_mode| {
        let op = Op::Cast {
            to: DType::F8E8M0,
            saturate: true,
            round_mode,
        };
        eval1(&op, &[&f32s(&[1], &[1.6])]).1
    };
    assert_eq!((e8(RoundMode::Up), e8(RoundMode::Down)), (vec![2.0], vec![1.0]));
}

#[test]
fn strings_compare_equal_and_nothing_else() {
    let s = |v: &[&str]| Value::strings(vec![v.len()], v.iter().map(|x| x.to_string()).collect()).unwrap();
    let (a, b) = (s(&["x", "y", "z"]), s(&["y"]));
    let out = eval(&bin(BinaryOp::Equal), &[&a, &b]).unwrap();
    assert_eq!(out[0].data, Data::Bool(vec![false, true, false]));
    let unsupported = |r: Result<Vec<Value>, OpError>| matches!(r, Err(OpError::Unsupported { .. }));
    assert!(unsupported(eval(&bin(BinaryOp::Less), &[&a, &b])));
    for op in [
        Op::cast(DType::F32),
        Op::Unary {
            func: UnaryOp::Identity,
        },
    ] {
        assert!(unsupported(eval(&op, &[&a])), "{op:?}");
    }
    assert!(unsupported(eval(
        &Op::cast(DType::String),
        &[&f32s(&[1], &[1.0])]
    )));
}

#[test]
fn clip_bounds() {
    let x = f32s(&[4], &[-2.0, 0.5, 3.0, f32::NAN]);
    let (lo, hi) = (f32s(&[], &[0.0]), f32s(&[], &[1.0]));
    let out = eval1(&Op::Clip, &[&x, &lo, &hi]).1;
    assert_eq!(&out[..3], &[0.0, 0.5, 1.0]);
    assert!(out[3].is_nan());
    let only_max = Op::Clip.eval(&[Some(&x), None, Some(&hi)]).unwrap();
    assert_eq!(&only_max[0].to_f64_vec()[..3], &[-2.0, 0.5, 1.0]);
    let i = ints(DType::I8, &[3], &[-100, 5, 100]);
    let (a, b) = (ints(DType::I8, &[], &[10]), ints(DType::I8, &[], &[0]));
    assert_eq!(
        eval1(&Op::Clip, &[&i, &a, &b]).1,
        vec![0.0, 0.0, 0.0],
        "min > max gives max"
    );
}

#[test]
fn activations() {
    let x = f32s(&[2], &[1.0, -1.0]);
    let gelu = |approximate| eval1(&Op::Gelu { approximate }, &[&x]).1;
    assert_close(&gelu(GeluApprox::None), &[0.841345, -0.158655], 1e-6);
    assert_close(&gelu(GeluApprox::Tanh), &[0.841192, -0.158808], 1e-6);
    assert_close(&eval1(&Op::Silu, &[&x]).1, &[0.731059, -0.268941], 1e-6);
}

#[test]
fn elementwise_cost() {
    let t = ty(DType::F32, "2 3");
    let c = Op::Binary { func: BinaryOp::Add }.cost(&[Some(&t), Some(&t)], &[&t]);
    assert_eq!(
        (c.forward_flops, c.backward_flops, c.bytes_read, c.bytes_written),
        (6.0, 6.0, 48.0, 24.0)
    );
    let b = ty(DType::Bool, "2 3");
    let c = Op::Binary { func: BinaryOp::Less }.cost(&[Some(&t), Some(&t)], &[&b]);
    assert_eq!(c.backward_flops, 0.0);
}

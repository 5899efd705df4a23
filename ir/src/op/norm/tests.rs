use super::super::testing::*;
use super::super::Op;
use super::*;
use crate::DType;

#[test]
fn softmax_and_log_softmax() {
    let x = f32s(&[1, 3], &[1.0, 2.0, 3.0]);
    assert_close(
        &eval1(&Op::Softmax { axis: -1 }, &[&x]).1,
        &[0.090031, 0.244728, 0.665241],
        1e-6,
    );
    assert_close(
        &eval1(&Op::LogSoftmax { axis: 1 }, &[&x]).1,
        &[-2.407606, -1.407606, -0.407606],
        1e-6,
    );
    let y = f32s(&[2, 2], &[0.0, 1.0, 0.0, 1.0]);
    assert_close(
        &eval1(&Op::Softmax { axis: 0 }, &[&y]).1,
        &[0.5, 0.5, 0.5, 0.5],
        1e-7,
    );
    assert_op_err(
        infer(&Op::Softmax { axis: 2 }, &[ty(DType::F32, "b s")]),
        "Softmax",
        "axis 2 is out of range for rank 2",
    );
}

#[test]
fn layer_norm_over_trailing_dims() {
    let op = Op::LayerNorm {
        axis: -1,
        epsilon: 0.0,
    };
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 2.0, 2.0, 2.0]);
    let scale = f32s(&[3], &[1.0, 1.0, 2.0]);
    let bias = f32s(&[3], &[0.0, 1.0, 0.0]);
    let out = eval1(&op, &[&x, &scale, &bias]).1;
    assert_close(&out[..3], &[-1.224745, 1.0, 2.449490], 1e-5);
    assert!(out[3].is_nan(), "zero variance with epsilon 0 divides by zero");
    let no_bias = eval1(
        &Op::LayerNorm {
            axis: 0,
            epsilon: 1e-5,
        },
        &[&x, &f32s(&[], &[1.0])],
    )
    .1;
    assert_close(&no_bias[3..], &[0.0, 0.0, 0.0], 1e-6);
    let sym = infer(&op, &[ty(DType::F32, "b s 8"), ty(DType::F32, "8")]).unwrap();
    assert_eq!(sym[0], ty(DType::F32, "b s 8"));
    assert_op_err(
        infer(&op, &[ty(DType::F32, "b s 8"), ty(DType::F32, "4")]),
        "LayerNorm",
        "shapes [8] and [4] do not broadcast",
    );
}

#[test]
fn rms_norm() {
    let op = Op::RmsNorm {
        axis: -1,
        epsilon: 0.0,
    };
    let x = f32s(&[1, 2], &[3.0, 4.0]);
    let scale = f32s(&[2], &[1.0, 2.0]);
    assert_close(&eval1(&op, &[&x, &scale]).1, &[0.848528, 2.262742], 1e-5);
    assert!(matches!(
        infer(&op, &[ty(DType::F32, "2")]),
        Err(OpError::Arity { .. })
    ));
}

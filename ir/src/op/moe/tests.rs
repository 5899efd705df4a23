use super::super::testing::*;
use super::super::Op;
use super::*;
use crate::Activation;

#[test]
fn router_picks_top_k_and_renormalises() {
    let logits = f32s(&[1, 3], &[1.0, 3.0, 2.0]);
    let out = eval(&Op::MoeRouter { top_k: 2 }, &[&logits]).unwrap();
    assert_close(&out[0].to_f64_vec(), &[0.731059, 0.268941], 1e-6);
    assert_eq!(out[1].as_i64().unwrap(), &[1, 2]);
    let types = infer(&Op::MoeRouter { top_k: 2 }, &[ty(DType::F32, "t 8")]).unwrap();
    assert_eq!(types, vec![ty(DType::F32, "t 2"), ty(DType::I64, "t 2")]);
    assert_op_err(
        infer(&Op::MoeRouter { top_k: 9 }, &[ty(DType::F32, "t 8")]),
        "MoeRouter",
        "top_k 9 must be in 1..=8",
    );
}

#[test]
fn experts_weighted_sum() {
    let op = Op::MoeExperts {
        activation: Activation::Relu,
    };
    let x = f32s(&[1, 1], &[3.0]);
    let w = f32s(&[1, 2], &[0.5, 0.25]);
    let ids = i64s(&[1, 2], &[0, 1]);
    let w_in = f32s(&[2, 1, 1], &[1.0, 2.0]);
    let w_out = f32s(&[2, 1, 1], &[1.0, 10.0]);
    // 0.5·relu(3·1)·1 + 0.25·relu(3·2)·10
    assert_eq!(eval1(&op, &[&x, &w, &ids, &w_in, &w_out]).1, vec![16.5]);
    let gate = f32s(&[2, 1, 1], &[0.0, -1.0]);
    // Gated: relu(x·gate) ⊙ (x·w_in) → both experts give zero.
    assert_eq!(eval1(&op, &[&x, &w, &ids, &w_in, &w_out, &gate]).1, vec![0.0]);
    let bad = i64s(&[1, 2], &[0, 2]);
    assert_op_err(
        eval(&op, &[&x, &w, &bad, &w_in, &w_out]),
        "MoeExperts",
        "expert index 2 is outside 0..2",
    );
}

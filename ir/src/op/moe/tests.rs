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
        sources: 1,
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

#[test]
fn sort_orders_assignments_by_expert_and_slots_number_them() {
    // Three tokens, two assignments each, over four experts.
    let ids = i64s(&[3, 2], &[2, 0, 0, 3, 2, 1]);
    let out = eval(
        &Op::MoeSort {
            experts: 4,
            capacity: None,
        },
        &[&ids],
    )
    .unwrap();
    // Sorted rows: expert 0 (tokens 0, 1), 1 (token 2), 2 (tokens 0, 2), 3 (token 1).
    assert_eq!(out[0].as_i64().unwrap(), &[0, 1, 2, 0, 2, 1]);
    assert_eq!(out[1].as_i64().unwrap(), &[3, 0, 1, 5, 4, 2]);
    assert_eq!(out[2].as_i64().unwrap(), &[2, 1, 2, 1]);
    assert_op_err(
        eval(
            &Op::MoeSort {
                experts: 2,
                capacity: None,
            },
            &[&ids],
        ),
        "MoeSort",
        "expert index 2 is outside 0..2",
    );
    // A capacity of one: each expert keeps its first assignment.
    let out = eval(
        &Op::MoeSort {
            experts: 4,
            capacity: Some(1),
        },
        &[&ids],
    )
    .unwrap();
    assert_eq!(out[0].as_i64().unwrap(), &[0, 2, 0, 1]);
    assert_eq!(out[1].as_i64().unwrap(), &[2, 0, -1, 3, -1, 1]);
    assert_eq!(out[2].as_i64().unwrap(), &[1, 1, 1, 1]);
    // Two blocks of three rows, two local experts: [1 of e0, 1 of e1], [0, 2].
    let counts = i64s(&[2, 2], &[1, 1, 0, 2]);
    let slots = eval(&Op::MoeSlots { rows: 3 }, &[&counts]).unwrap();
    assert_eq!(slots[0].as_i64().unwrap(), &[0, 1, -1, 1, 1, -1]);
    assert_op_err(
        eval(&Op::MoeSlots { rows: 1 }, &[&counts]),
        "MoeSlots",
        "a block of 2 rows overflows 1",
    );
}

#[test]
fn experts_skip_padding_and_count_only_routed_rows() {
    let op = |sources| Op::MoeExperts {
        activation: Activation::Relu,
        sources,
    };
    let x = f32s(&[2, 1], &[3.0, 5.0]);
    let w = f32s(&[2, 1], &[1.0, 1.0]);
    let w_in = f32s(&[1, 1, 1], &[2.0]);
    let w_out = f32s(&[1, 1, 1], &[1.0]);
    let ids = i64s(&[2, 1], &[0, -1]);
    let out = eval(&op(1), &[&x, &w, &ids, &w_in, &w_out]).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![6.0, 0.0]);
    let types: Vec<TensorType> = [("2 1", DType::F32), ("2 1", DType::F32), ("2 1", DType::I64)]
        .iter()
        .map(|(s, d)| ty(*d, s))
        .chain([ty(DType::F32, "1 1 1"), ty(DType::F32, "1 1 1")])
        .collect();
    let refs: Vec<Option<&TensorType>> = types.iter().map(Some).collect();
    let (one, two) = (experts_flops(&refs, 1), experts_flops(&refs, 2));
    assert_eq!(one.0, 2.0 * two.0);
}

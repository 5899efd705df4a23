use super::super::testing::*;
use super::super::Op;
use super::*;

#[test]
fn matmul_2d() {
    let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32s(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    assert_eq!(
        eval1(&Op::MatMul, &[&a, &b]),
        (vec![2, 2], vec![58.0, 64.0, 139.0, 154.0])
    );
}

#[test]
fn matmul_batch_broadcast_and_1d_promotion() {
    // a: [2,1,2,2] (two identity-scaled matrices), b: [3,2,2].
    let a = f32s(&[2, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.0]);
    let b = f32s(&[3, 2, 2], &(0..12).map(|i| i as f32).collect::<Vec<_>>());
    let (shape, out) = eval1(&Op::MatMul, &[&a, &b]);
    assert_eq!(shape, vec![2, 3, 2, 2]);
    assert_eq!(&out[..4], &[0.0, 1.0, 2.0, 3.0]);
    assert_eq!(&out[20..], &[16.0, 18.0, 20.0, 22.0]);
    let v = f32s(&[3], &[1.0, 1.0, 1.0]);
    let m = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(eval1(&Op::MatMul, &[&v, &m]), (vec![2], vec![9.0, 12.0]));
    let mt = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(eval1(&Op::MatMul, &[&mt, &v]), (vec![2], vec![6.0, 15.0]));
    assert_eq!(eval1(&Op::MatMul, &[&v, &v]), (vec![], vec![3.0]));
}

#[test]
fn matmul_integers_and_f64() {
    let a = ints(DType::I32, &[1, 2], &[2, 3]);
    let b = ints(DType::I32, &[2, 1], &[4, 5]);
    assert_eq!(eval1(&Op::MatMul, &[&a, &b]).1, vec![23.0]);
    let a = Value::f64(vec![1, 2], vec![0.5, 0.25]).unwrap();
    let b = Value::f64(vec![2, 1], vec![2.0, 4.0]).unwrap();
    let out = eval(&Op::MatMul, &[&a, &b]).unwrap();
    assert_eq!((out[0].dtype, out[0].to_f64_vec()), (DType::F64, vec![2.0]));
}

#[test]
fn matmul_symbolic_inference_and_errors() {
    let out = infer(&Op::MatMul, &[ty(DType::F32, "b s 64"), ty(DType::F32, "64 128")]).unwrap();
    assert_eq!(out[0], ty(DType::F32, "b s 128"));
    let out = infer(
        &Op::MatMul,
        &[ty(DType::F32, "b h s d"), ty(DType::F32, "b h d t")],
    )
    .unwrap();
    assert_eq!(out[0], ty(DType::F32, "b h s t"));
    assert_op_err(
        infer(&Op::MatMul, &[ty(DType::F32, "2 3"), ty(DType::F32, "4 5")]),
        "MatMul",
        "contraction dims differ (3 vs 4)",
    );
    assert_op_err(
        infer(&Op::MatMul, &[ty(DType::F32, ""), ty(DType::F32, "4 5")]),
        "MatMul",
        "scalar operands are not allowed",
    );
}

#[test]
fn gemm_transposes_scales_and_broadcasts_bias() {
    let op = Op::Gemm {
        alpha: 2.0,
        beta: 0.5,
        trans_a: true,
        trans_b: true,
    };
    let a = f32s(&[2, 1], &[1.0, 2.0]); // aᵀ = [[1, 2]]
    let b = f32s(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]); // bᵀ columns
    let c = f32s(&[3], &[2.0, 4.0, 6.0]);
    assert_eq!(eval1(&op, &[&a, &b, &c]), (vec![1, 3], vec![3.0, 6.0, 9.0]));
    let plain = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: false,
    };
    assert_op_err(
        infer(
            &plain,
            &[ty(DType::F32, "2 3"), ty(DType::F32, "3 4"), ty(DType::F32, "3")],
        ),
        "Gemm",
        "shapes [2, 4] and [3] do not broadcast",
    );
    assert_eq!(
        infer(
            &plain,
            &[
                ty(DType::F32, "m 3"),
                ty(DType::F32, "3 4"),
                ty(DType::F32, "1 4")
            ]
        )
        .unwrap()[0],
        ty(DType::F32, "m 4")
    );
}

#[test]
fn linear_with_bias() {
    let out = infer(
        &Op::Linear,
        &[
            ty(DType::F32, "b s 4"),
            ty(DType::F32, "4 8"),
            ty(DType::F32, "8"),
        ],
    )
    .unwrap();
    assert_eq!(out[0], ty(DType::F32, "b s 8"));
    let x = f32s(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let w = f32s(&[2, 1], &[1.0, 10.0]);
    let bias = f32s(&[1], &[0.5]);
    assert_eq!(
        eval1(&Op::Linear, &[&x, &w, &bias]),
        (vec![1, 2, 1], vec![21.5, 43.5])
    );
    assert_op_err(
        infer(&Op::Linear, &[ty(DType::F32, "b 5"), ty(DType::F32, "4 8")]),
        "Linear",
        "contraction dims differ (5 vs 4)",
    );
}

#[test]
fn product_costs() {
    let (a, b, o) = (
        ty(DType::F32, "2 3"),
        ty(DType::F32, "3 4"),
        ty(DType::F32, "2 4"),
    );
    let c = Op::MatMul.cost(&[Some(&a), Some(&b)], &[&o]);
    assert_eq!((c.forward_flops, c.backward_flops), (48.0, 96.0));
    assert_eq!((c.bytes_read, c.bytes_written), (72.0, 32.0));
}

/// A batch times one shared matrix runs as one product when each matrix's
/// rows are whole tiles, and gives each matrix's own product's bits, on
/// one thread and split over three.
#[test]
fn batches_joined_into_one_product_keep_each_matrix_bits() {
    let data = |len: usize, seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed) % 1013) as f32 / 97.0 - 5.0)
            .collect()
    };
    assert_eq!(matmul_rows(&[3, 64, 300], &[300, 40]), 64, "too narrow to join");
    assert_eq!(matmul_rows(&[3, 64, 300], &[3, 300, 90]), 64, "a matrix each");
    for (batch, m, k, n) in [
        (3usize, 64usize, 300usize, 90usize),
        (3, 60, 300, 90),
        (4, 7, 1100, 65),
    ] {
        let (a, b) = (data(batch * m * k, 1), data(k * n, 2));
        assert_eq!(matmul_rows(&[batch, m, k], &[k, n]), batch * m, "joined");
        let bv = f32s(&[k, n], &b);
        for threads in [1, 3] {
            super::super::set_kernel_threads(threads);
            let joined = eval(&Op::MatMul, &[&f32s(&[batch, m, k], &a), &bv]).unwrap();
            for i in 0..batch {
                let one = f32s(&[m, k], &a[i * m * k..(i + 1) * m * k]);
                let own = eval(&Op::MatMul, &[&one, &bv]).unwrap()[0].to_f64_vec();
                let part = &joined[0].to_f64_vec()[i * m * n..(i + 1) * m * n];
                assert!(
                    own == part,
                    "[{batch}, {m}, {k}] x [{k}, {n}]: matrix {i} on {threads} threads"
                );
            }
        }
    }
    super::super::set_kernel_threads(1);
}

use super::super::testing::*;
use super::super::Op;
use super::*;
use crate::Data;

fn reduce(kind: ReduceKind, axes: Option<Vec<i64>>, keepdims: bool) -> Op {
    Op::Reduce {
        kind,
        axes,
        keepdims,
        noop_with_empty_axes: false,
    }
}

#[test]
fn reduce_with_attribute_and_input_axes() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        eval1(&reduce(ReduceKind::Sum, Some(vec![1]), true), &[&x]),
        (vec![2, 1], vec![6.0, 15.0])
    );
    assert_eq!(
        eval1(&reduce(ReduceKind::Mean, Some(vec![-2]), false), &[&x]),
        (vec![3], vec![2.5, 3.5, 4.5])
    );
    let axes = i64s(&[1], &[0]);
    assert_eq!(
        eval1(&reduce(ReduceKind::Max, None, false), &[&x, &axes]),
        (vec![3], vec![4.0, 5.0, 6.0])
    );
    assert_eq!(
        eval1(&reduce(ReduceKind::Prod, None, false), &[&x]),
        (vec![], vec![720.0])
    );
    let noop = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: None,
        keepdims: true,
        noop_with_empty_axes: true,
    };
    let empty = i64s(&[0], &[]);
    assert_eq!(eval1(&noop, &[&x, &empty]).1, x.to_f64_vec());
}

#[test]
fn reduce_inference_needs_constant_axes() {
    let op = reduce(ReduceKind::Sum, None, true);
    let r = infer(&op, &[ty(DType::F32, "b s 8"), ty(DType::I64, "1")]);
    assert!(matches!(r, Err(OpError::NotConstant { input: 1, .. })));
    let r = infer_with(
        &op,
        &[
            (ty(DType::F32, "b s 8"), None),
            (ty(DType::I64, "1"), Some(i64s(&[1], &[-1]))),
        ],
    );
    assert_eq!(r.unwrap()[0], ty(DType::F32, "b s 1"));
    assert_op_err(
        infer(
            &reduce(ReduceKind::Sum, Some(vec![3]), true),
            &[ty(DType::F32, "b s 8")],
        ),
        "ReduceSum",
        "axis 3 is out of range for rank 3",
    );
}

#[test]
fn reduce_empty_sets_ints_and_bools() {
    let e = f32s(&[2, 0], &[]);
    assert_eq!(
        eval1(&reduce(ReduceKind::Sum, Some(vec![1]), false), &[&e]).1,
        vec![0.0, 0.0]
    );
    assert_eq!(
        eval1(&reduce(ReduceKind::Max, Some(vec![1]), false), &[&e]).1,
        vec![f64::NEG_INFINITY; 2]
    );
    let i = ints(DType::I8, &[2], &[100, 100]);
    assert_eq!(eval1(&reduce(ReduceKind::Sum, None, false), &[&i]).1, vec![-56.0]);
    let b = bools(&[2], &[false, true]);
    assert_eq!(
        eval(&reduce(ReduceKind::Max, None, false), &[&b]).unwrap()[0].data,
        Data::Bool(vec![true])
    );
}

#[test]
fn argmax_ties() {
    let x = f32s(&[2, 3], &[1.0, 3.0, 3.0, 5.0, 0.0, 5.0]);
    let op = |select_last_index| Op::ArgMax {
        axis: -1,
        keepdims: true,
        select_last_index,
    };
    assert_eq!(eval1(&op(false), &[&x]), (vec![2, 1], vec![1.0, 0.0]));
    assert_eq!(eval1(&op(true), &[&x]).1, vec![2.0, 2.0]);
}

#[test]
fn topk_sorted_with_stable_ties() {
    let x = f32s(&[2, 4], &[1.0, 3.0, 3.0, 2.0, 4.0, 1.0, 2.0, 1.0]);
    let k = i64s(&[1], &[2]);
    let op = |largest| Op::TopK {
        axis: -1,
        largest,
        sorted: true,
    };
    let out = eval(&op(true), &[&x, &k]).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![3.0, 3.0, 4.0, 2.0]);
    assert_eq!(out[1].as_i64().unwrap(), &[1, 2, 0, 2]);
    let out = eval(&op(false), &[&x, &k]).unwrap();
    assert_eq!(out[1].as_i64().unwrap(), &[0, 3, 1, 3]);
    let col = eval(
        &Op::TopK {
            axis: 0,
            largest: true,
            sorted: true,
        },
        &[&x, &i64s(&[1], &[1])],
    )
    .unwrap();
    assert_eq!(col[0].to_f64_vec(), vec![4.0, 3.0, 3.0, 2.0]);
    let u = ints(DType::U64, &[2], &[1, -1]);
    let top = eval(&op(true), &[&u, &i64s(&[1], &[1])]).unwrap();
    assert_eq!(top[1].as_i64().unwrap(), &[1]);
    assert!(matches!(
        infer(&op(true), &[ty(DType::F32, "b 8"), ty(DType::I64, "1")]),
        Err(OpError::NotConstant { .. })
    ));
}

#[test]
fn cumsum_variants() {
    let x = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let axis = i64s(&[], &[0]);
    let op = |exclusive, reverse| Op::CumSum { exclusive, reverse };
    assert_eq!(
        eval1(&op(false, false), &[&x, &axis]).1,
        vec![1.0, 3.0, 6.0, 10.0]
    );
    assert_eq!(eval1(&op(true, false), &[&x, &axis]).1, vec![0.0, 1.0, 3.0, 6.0]);
    assert_eq!(eval1(&op(false, true), &[&x, &axis]).1, vec![10.0, 9.0, 7.0, 4.0]);
    assert_eq!(eval1(&op(true, true), &[&x, &axis]).1, vec![9.0, 7.0, 4.0, 0.0]);
    let m = ints(DType::I32, &[2, 2], &[1, 2, 3, 4]);
    assert_eq!(
        eval1(&op(false, false), &[&m, &i64s(&[], &[-1])]).1,
        vec![1.0, 3.0, 3.0, 7.0]
    );
}

/// The fast paths (trailing dims reduced by runs, leading dims by rows)
/// give the bits of the general fold: f64 steps over the elements in
/// memory order, rounded once.
#[test]
fn reductions_by_runs_and_rows_fold_in_memory_order() {
    let shape = [3usize, 4, 5];
    let data: Vec<f32> = (0..60).map(|i| ((i * 7919) % 113) as f32 / 7.3 - 6.1).collect();
    let x = f32s(&shape, &data);
    for axes in [vec![0], vec![0, 1], vec![2], vec![1, 2], vec![1]] {
        for kind in [
            ReduceKind::Sum,
            ReduceKind::Mean,
            ReduceKind::Max,
            ReduceKind::Prod,
        ] {
            let axes64: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
            let got = eval(&reduce(kind, Some(axes64), false), &[&x]).unwrap();
            let Data::F32(got) = &got[0].data else {
                panic!("f32 out")
            };
            // The general fold, written out.
            let kept: Vec<usize> = (0..3).filter(|a| !axes.contains(a)).collect();
            let outn: usize = kept.iter().map(|&a| shape[a]).product();
            let (init, step) = float_step(kind);
            let mut acc = vec![init; outn];
            for (i, &v) in data.iter().enumerate() {
                let index = [i / 20, (i / 5) % 4, i % 5];
                let o = kept.iter().fold(0, |o, &a| o * shape[a] + index[a]);
                acc[o] = step(acc[o], v as f64);
            }
            let want: Vec<u32> = float_results(kind, acc, (60 / outn) as f64)
                .iter()
                .map(|&v| (v as f32).to_bits())
                .collect();
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{kind:?} over {axes:?}");
        }
    }
}

use super::super::testing::*;
use super::super::Op;
use super::*;

fn attn(causal: bool) -> Op {
    Op::Attention { scale: None, causal }
}

#[test]
fn single_query_default_scale() {
    let q = f32s(&[1, 1, 1, 2], &[1.0, 0.0]);
    let k = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let v = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    // scores [1/√2, 0] → softmax [0.66976, 0.33024].
    assert_close(&eval1(&attn(false), &[&q, &k, &v]).1, &[0.669762, 0.330238], 1e-6);
}

#[test]
fn causal_and_bool_masks() {
    let q = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 1.0, 0.0]);
    let k = f32s(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let v = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let out = eval1(&attn(true), &[&q, &k, &v]).1;
    assert_close(&out[..2], &[1.0, 2.0], 1e-6);
    // Keep only key 1 for query 0; mask everything for query 1 → zeros.
    let mask = bools(&[2, 2], &[false, true, false, false]);
    assert_close(
        &eval1(&attn(false), &[&q, &k, &v, &mask]).1,
        &[3.0, 4.0, 0.0, 0.0],
        1e-6,
    );
    // A float mask shorter than the key length: missing keys are masked.
    let short = f32s(&[1], &[0.0]);
    assert_close(
        &eval1(&attn(false), &[&q, &k, &v, &short]).1,
        &[1.0, 2.0, 1.0, 2.0],
        1e-6,
    );
}

#[test]
fn grouped_query_heads_share_kv() {
    let q = f32s(&[1, 2, 1, 1], &[1.0, 1.0]);
    let k = f32s(&[1, 1, 2, 1], &[0.0, 0.0]);
    let v = f32s(&[1, 1, 2, 1], &[2.0, 4.0]);
    assert_close(&eval1(&attn(false), &[&q, &k, &v]).1, &[3.0, 3.0], 1e-6);
}

#[test]
fn attention_inference() {
    let t = |s| ty(DType::F32, s);
    let out = infer(&attn(true), &[t("b 4 s 8"), t("b 2 t 8"), t("b 2 t 16")]).unwrap();
    assert_eq!(out[0], t("b 4 s 16"));
    assert_op_err(
        infer(&attn(true), &[t("b 3 s 8"), t("b 2 t 8"), t("b 2 t 8")]),
        "Attention",
        "3 query heads are not a multiple of 2 key heads",
    );
    assert_op_err(
        infer(&attn(true), &[t("b 2 s 8"), t("b 2 t 4"), t("b 2 t 8")]),
        "Attention",
        "query and key head sizes differ (8 vs 4)",
    );
    let mask = ty(DType::Bool, "s t");
    assert!(infer(&attn(false), &[t("b 2 s 8"), t("b 2 t 8"), t("b 2 t 8"), mask]).is_ok());
    let bad = ty(DType::I64, "s t");
    assert_op_err(
        infer(&attn(false), &[t("b 2 s 8"), t("b 2 t 8"), t("b 2 t 8"), bad]),
        "Attention",
        "mask must be bool or f32, got i64",
    );
}

/// Query positions hide exactly the keys after each query's position: the
/// same output, bit for bit, as an explicit keep-mask of those keys, for
/// query rows out of order (a context-parallel rank's balanced chunks),
/// with and without another mask; and they need a causal attention.
#[test]
fn query_positions_hide_the_keys_after_each_query() {
    use crate::autodiff::testing::random;
    let (q, k, v) = (
        random(&[2, 2, 4, 3], 1),
        random(&[2, 1, 8, 3], 2),
        random(&[2, 1, 8, 3], 3),
    );
    let at = [0i64, 1, 6, 7];
    let positions = i64s(&[4], &at);
    let keep: Vec<bool> = at.iter().flat_map(|&p| (0..8).map(move |j| j <= p)).collect();
    let explicit = bools(&[4, 8], &keep);
    let by_positions = attn(true).eval(&[Some(&q), Some(&k), Some(&v), None, Some(&positions)]);
    let by_mask = eval(&attn(false), &[&q, &k, &v, &explicit]).unwrap();
    assert_eq!(by_positions.unwrap()[0].to_f64_vec(), by_mask[0].to_f64_vec());
    // With a padding mask as well: both hide their keys.
    let pad = bools(&[8], &[true, false, true, true, true, true, true, true]);
    let both: Vec<bool> = keep.iter().enumerate().map(|(i, &k)| k && i % 8 != 1).collect();
    let got = eval(&attn(true), &[&q, &k, &v, &pad, &positions]).unwrap();
    let want = eval(&attn(false), &[&q, &k, &v, &bools(&[4, 8], &both)]).unwrap();
    assert_eq!(got[0].to_f64_vec(), want[0].to_f64_vec());
    let t = |s| ty(DType::F32, s);
    let (qt, kt) = (t("b 2 4 3"), t("b 1 8 3"));
    let none = ty(DType::Bool, "8");
    assert_op_err(
        infer(
            &attn(false),
            &[
                qt.clone(),
                kt.clone(),
                kt.clone(),
                none.clone(),
                ty(DType::I64, "4"),
            ],
        ),
        "Attention",
        "query positions (input 4) need a causal attention",
    );
    assert_op_err(
        infer(&attn(true), &[qt, kt.clone(), kt, none, ty(DType::I64, "5")]),
        "Attention",
        "query positions and queries differ (5 vs 4)",
    );
}

#[test]
fn attention_cost_counts_full_scores() {
    let (q, o) = (ty(DType::F32, "2 4 8 16"), ty(DType::F32, "2 4 8 16"));
    let c = attn(true).cost(&[Some(&q), Some(&q), Some(&q)], &[&o]);
    let scores = 2.0 * 4.0 * 8.0 * 8.0;
    assert_eq!(c.forward_flops, 4.0 * scores * 16.0 + 5.0 * scores);
}

fn rope(interleaved: bool, num_heads: usize) -> Op {
    Op::RotaryEmbedding {
        interleaved,
        rotary_dim: 0,
        num_heads,
    }
}

#[test]
fn rotary_halves_and_interleaved() {
    let x = f32s(&[1, 1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let cos = f32s(&[2, 2], &[9.0, 9.0, 0.0, 1.0]);
    let sin = f32s(&[2, 2], &[9.0, 9.0, 1.0, 0.0]);
    let pos = i64s(&[1, 1], &[1]);
    assert_eq!(
        eval1(&rope(false, 0), &[&x, &cos, &sin, &pos]).1,
        vec![-3.0, 2.0, 1.0, 4.0]
    );
    assert_eq!(
        eval1(&rope(true, 0), &[&x, &cos, &sin, &pos]).1,
        vec![-2.0, 1.0, 3.0, 4.0]
    );
    let x3 = f32s(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(
        eval1(&rope(false, 1), &[&x3, &cos, &sin, &pos]).1,
        vec![-3.0, 2.0, 1.0, 4.0]
    );
    let far = i64s(&[1, 1], &[2]);
    assert_op_err(
        eval(&rope(false, 0), &[&x, &cos, &sin, &far]),
        "RotaryEmbedding",
        "position id 2 is outside the cache of 2",
    );
    assert_op_err(
        infer(
            &rope(false, 0),
            &[
                ty(DType::F32, "b 3 8"),
                ty(DType::F32, "p 4"),
                ty(DType::F32, "p 4"),
            ],
        ),
        "RotaryEmbedding",
        "3-D input needs num_heads",
    );
}

/// Deterministic values in [-1, 1) of `shape`, in f64.
fn noise(shape: &[usize], seed: usize) -> Value {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|i| (((i + 1) * (7919 + seed * 104_729)) % 2003) as f64 / 1001.5 - 1.0)
        .collect();
    Value::f64(shape.to_vec(), data).unwrap()
}

/// Attention by its definition, in f64: every key scored (hidden ones
/// `-inf`), a softmax per query row, the weighted values.
fn by_definition(q: &Value, k: &Value, v: &Value, causal: bool) -> Vec<f64> {
    let (qd, kd, vd) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let [b, hq, sq, d] = q.shape[..] else { panic!() };
    let (hk, sk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
    let mut out = vec![0.0; b * hq * sq * dv];
    for bi in 0..b {
        for h in 0..hq {
            let kh = bi * hk + h / (hq / hk);
            for i in 0..sq {
                let qi = &qd[((bi * hq + h) * sq + i) * d..][..d];
                let scores: Vec<f64> = (0..sk)
                    .map(|j| match causal && j > i {
                        true => f64::NEG_INFINITY,
                        false => {
                            let kj = &kd[(kh * sk + j) * d..][..d];
                            qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                        }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for c in 0..dv {
                        out[((bi * hq + h) * sq + i) * dv + c] += w / sum * vd[(kh * sk + j) * dv + c];
                    }
                }
            }
        }
    }
    out
}

/// Query rows in several blocks (causal ones reading only the keys their
/// block sees), grouped heads, more keys than queries: the definition's
/// values.
#[test]
fn blocks_of_query_rows_compute_attention() {
    for (causal, sq, sk) in [
        (true, 150, 150),
        (false, 150, 150),
        (false, 70, 170),
        (true, 130, 200),
    ] {
        let (q, k, v) = (
            noise(&[2, 4, sq, 8], 1),
            noise(&[2, 2, sk, 8], 2),
            noise(&[2, 2, sk, 3], 3),
        );
        let got = eval1(&attn(causal), &[&q, &k, &v]).1;
        assert_close(&got, &by_definition(&q, &k, &v, causal), 1e-12);
    }
}

/// Over several blocks of query rows, the adjoint is the derivative of
/// `Σ out · dout`: central differences along a direction in q, k and v.
#[test]
fn the_adjoint_over_blocks_of_rows_is_the_derivative() {
    let (q, k, v, dout) = (
        noise(&[1, 2, 140, 4], 1),
        noise(&[1, 1, 140, 4], 2),
        noise(&[1, 1, 140, 3], 3),
        noise(&[1, 2, 140, 3], 4),
    );
    let grad = Op::AttentionGrad {
        scale: None,
        causal: true,
        mask_grad: false,
    };
    let grads = eval(&grad, &[&q, &k, &v, &dout]).unwrap();
    let loss = |x: &[&Value]| -> f64 {
        let out = eval1(&attn(true), x).1;
        out.iter().zip(dout.to_f64_vec()).map(|(o, g)| o * g).sum()
    };
    let inputs = [&q, &k, &v];
    for (slot, g) in grads.iter().enumerate() {
        let u = noise(&inputs[slot].shape, 10 + slot).to_f64_vec();
        let moved = |eps: f64| {
            let base = inputs[slot].to_f64_vec();
            let data = base.iter().zip(&u).map(|(x, d)| x + eps * d).collect();
            Value::f64(inputs[slot].shape.clone(), data).unwrap()
        };
        let (up, down) = (moved(1e-5), moved(-1e-5));
        let mut at = inputs;
        at[slot] = &up;
        let f_up = loss(&at);
        at[slot] = &down;
        let numeric = (f_up - loss(&at)) / 2e-5;
        let analytic: f64 = g.to_f64_vec().iter().zip(&u).map(|(a, b)| a * b).sum();
        assert!(
            (numeric - analytic).abs() <= 1e-7 * analytic.abs().max(1.0),
            "input {slot}: {numeric} vs {analytic}"
        );
    }
}

/// Attention and its adjoint split over a rank's threads by (batch,
/// key/value head) groups give one thread's bits.
#[test]
fn attention_over_threads_gives_one_threads_bits() {
    let f32s_of = |v: Value| {
        let d: Vec<f32> = v.to_f64_vec().iter().map(|&x| x as f32).collect();
        f32s(&v.shape, &d)
    };
    let (q, k, v, dout) = (
        f32s_of(noise(&[2, 4, 256, 32], 1)),
        f32s_of(noise(&[2, 2, 256, 32], 2)),
        f32s_of(noise(&[2, 2, 256, 16], 3)),
        f32s_of(noise(&[2, 4, 256, 16], 4)),
    );
    assert_eq!(crate::op::attention_ways(&q.shape, &k.shape, false, 3), 3);
    let grad = Op::AttentionGrad {
        scale: None,
        causal: true,
        mask_grad: false,
    };
    let run = |threads: usize| {
        crate::op::set_kernel_threads(threads);
        let out = eval(&attn(true), &[&q, &k, &v]).unwrap();
        let grads = eval(&grad, &[&q, &k, &v, &dout]).unwrap();
        crate::op::set_kernel_threads(1);
        out.into_iter().chain(grads).map(|x| x.data).collect::<Vec<_>>()
    };
    assert!(run(1) == run(3));
}

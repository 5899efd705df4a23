//! elementwise.cu, reduce.cu and gather.cu against Rust references (GPU only).

use super::*;

/// erf by its Maclaurin series (|x| ≤ 3 here), accurate to f64 rounding.
pub(super) fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..80 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn unary_reference(op: &str, x: f64) -> f64 {
    match op {
        "neg" => -x,
        "exp" => x.exp(),
        "log" => x.ln(),
        "sqrt" => x.sqrt(),
        "rsqrt" => 1.0 / x.sqrt(),
        "reciprocal" => 1.0 / x,
        "tanh" => x.tanh(),
        "sigmoid" => 1.0 / (1.0 + (-x).exp()),
        "relu" => x.max(0.0),
        "abs" => x.abs(),
        "erf" => erf(x),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "identity" => x,
        _ => panic!("no reference for unary {op}"),
    }
}

fn check_unary<T: Elem>(g: &Gpu) {
    let n = 1000;
    for op in kernels::UNARY_OPS {
        let positive = matches!(*op, "log" | "sqrt" | "rsqrt" | "reciprocal");
        let x = stored::<T>(&random(n, 1, if positive { 0.1 } else { -3.0 }, 3.0));
        let input = up::<T>(g, &x);
        let mut out = zeros::<T>(g, n);
        let n64 = n as i64;
        launch!(g, format!("unary_{op}_{}", T::SUFFIX), grid(n); &mut out, &input, &n64);
        let want: Vec<f32> = x.iter().map(|&v| unary_reference(op, v as f64) as f32).collect();
        assert_close(
            &format!("unary_{op}_{}", T::SUFFIX),
            &down(g, &out),
            &want,
            T::TOL,
        );
    }
}

#[test]
fn unary_kernels_match_std_math() {
    let Some(g) = gpu("unary") else { return };
    check_unary::<f32>(&g);
    check_unary::<Bf16>(&g);
}

fn binary_reference(op: &str, a: f64, b: f64) -> f64 {
    match op {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a * b,
        "div" => a / b,
        "pow" => a.powf(b),
        "max" => a.max(b),
        "min" => a.min(b),
        "eq" => (a == b) as u8 as f64,
        "lt" => (a < b) as u8 as f64,
        "gt" => (a > b) as u8 as f64,
        _ => panic!("no reference for binary {op}"),
    }
}

/// a [4, 1, 6] and b [5, 1] broadcast to [4, 5, 6]; comparisons on a few
/// integers so that equality happens.
fn check_binary<T: Elem>(g: &Gpu) {
    let (da, db, dout) = ([4, 1, 6], [5, 1], [4, 5, 6]);
    let n = 120;
    let (av, bv) = (
        View::broadcast(&da, &dout).unwrap(),
        View::broadcast(&db, &dout).unwrap(),
    );
    let n64 = n as i64;
    let ops = kernels::BINARY_OPS
        .iter()
        .map(|op| ("binary", op))
        .chain(kernels::COMPARE_OPS.iter().map(|op| ("compare", op)));
    for (family, op) in ops {
        let compare = family == "compare";
        let gen = |len, seed| -> Vec<f32> {
            let r = random(len, seed, 0.5, 2.0);
            stored::<T>(&if compare {
                r.iter().map(|v| (v * 2.0).floor()).collect()
            } else {
                r
            })
        };
        let (a, b) = (gen(24, 2), gen(5, 3));
        let (a_dev, b_dev) = (up::<T>(g, &a), up::<T>(g, &b));
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let (x, y) = (a[av.offset(i as i64) as usize], b[bv.offset(i as i64) as usize]);
                binary_reference(op, x as f64, y as f64) as f32
            })
            .collect();
        // Independent index check of the broadcast: element (i, j, k).
        assert_eq!(av.offset(((3 * 5) + 2) * 6 + 4), 3 * 6 + 4);
        assert_eq!(bv.offset(((3 * 5) + 2) * 6 + 4), 2);
        let name = format!("{family}_{op}_{}", T::SUFFIX);
        let got = if compare {
            let mut out = zeros::<u8>(g, n);
            launch!(g, name.clone(), grid(n); &mut out, &a_dev, &av, &b_dev, &bv, &n64);
            down_raw(g, &out).into_iter().map(f32::from).collect()
        } else {
            let mut out = zeros::<T>(g, n);
            launch!(g, name.clone(), grid(n); &mut out, &a_dev, &av, &b_dev, &bv, &n64);
            down(g, &out)
        };
        assert_close(&name, &got, &want, T::TOL);
    }
}

#[test]
fn binary_and_compare_kernels_broadcast_through_views() {
    let Some(g) = gpu("binary") else { return };
    check_binary::<f32>(&g);
    check_binary::<Bf16>(&g);
}

/// copy_view: a [3, 4, 5] tensor transposed to [5, 3, 4], once into a
/// contiguous output and once into the first 4 columns of a [5, 3, 8] buffer.
fn check_copy_view<T: Elem>(g: &Gpu) {
    let x = stored::<T>(&random(60, 4, -1.0, 1.0));
    let input = up::<T>(g, &x);
    let iv = View::new(&[5, 3, 4], &[1, 20, 5]).unwrap();
    let n = 60i64;
    let want: Vec<f32> = (0..5)
        .flat_map(|c| (0..3).flat_map(move |a| (0..4).map(move |b| (a, b, c))))
        .map(|(a, b, c)| x[a * 20 + b * 5 + c])
        .collect();
    let name = format!("copy_view_{}", T::SUFFIX);
    let mut out = zeros::<T>(g, 60);
    let ov = View::contiguous(&[5, 3, 4]).unwrap();
    launch!(g, name.clone(), grid(60); &mut out, &ov, &input, &iv, &n);
    assert_close(&name, &down(g, &out), &want, 0.0);

    let mut wide = zeros::<T>(g, 120);
    let ov = View::new(&[5, 3, 4], &[24, 8, 1]).unwrap();
    launch!(g, name.clone(), grid(60); &mut wide, &ov, &input, &iv, &n);
    let got = down(g, &wide);
    let want_wide: Vec<f32> = (0..120)
        .map(|i| if i % 8 < 4 { want[(i / 8) * 4 + i % 8] } else { 0.0 })
        .collect();
    assert_close(&format!("{name} (strided out)"), &got, &want_wide, 0.0);
}

fn check_where_fill_accumulate<T: Elem>(g: &Gpu) {
    let dout = [4, 5, 6];
    let n = 120usize;
    let n64 = n as i64;
    let c: Vec<u8> = vec![1, 0, 0, 1, 1, 0];
    let (a, b) = (
        stored::<T>(&random(n, 5, -1.0, 1.0)),
        stored::<T>(&random(6, 6, -1.0, 1.0)),
    );
    let (cv, av, bv) = (
        View::broadcast(&[1, 6], &dout).unwrap(),
        View::contiguous(&dout).unwrap(),
        View::broadcast(&[6], &dout).unwrap(),
    );
    let (c_dev, a_dev, b_dev) = (up_raw(g, &c), up::<T>(g, &a), up::<T>(g, &b));
    let mut out = zeros::<T>(g, n);
    launch!(g, format!("where_{}", T::SUFFIX), grid(n); &mut out, &c_dev, &cv, &a_dev, &av, &b_dev, &bv, &n64);
    let want: Vec<f32> = (0..n)
        .map(|i| if c[i % 6] == 1 { a[i] } else { b[i % 6] })
        .collect();
    assert_close("where", &down(g, &out), &want, 0.0);

    launch!(g, format!("fill_{}", T::SUFFIX), grid(n); &mut out, &n64, &2.5f32);
    assert_close("fill", &down(g, &out), &vec![2.5; n], 0.0);
    launch!(g, format!("add_inplace_{}", T::SUFFIX), grid(n); &mut out, &a_dev, &n64);
    let sum: Vec<f32> = a.iter().map(|v| v + 2.5).collect();
    assert_close("add_inplace", &down(g, &out), &sum, T::TOL);
    let mut scaled = zeros::<T>(g, n);
    launch!(g, format!("scale_{}", T::SUFFIX), grid(n); &mut scaled, &a_dev, &n64, &-3.0f32);
    let want: Vec<f32> = a.iter().map(|v| v * -3.0).collect();
    assert_close("scale", &down(g, &scaled), &want, T::TOL);
}

#[test]
fn copies_selects_fills_and_accumulation() {
    let Some(g) = gpu("copy_view/where/fill") else {
        return;
    };
    check_copy_view::<f32>(&g);
    check_copy_view::<Bf16>(&g);
    check_where_fill_accumulate::<f32>(&g);
    check_where_fill_accumulate::<Bf16>(&g);
}

#[test]
fn casts_round_to_nearest_even_and_truncate_to_integers() {
    let Some(g) = gpu("casts") else { return };
    // Two exact ties between bf16 neighbours (1 + 2⁻⁸, 1 + 3·2⁻⁸) check the rounding.
    let x = vec![
        1.0f32,
        -2.7,
        3.9,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        65504.0,
        -0.0,
    ];
    let n = x.len() as i64;
    let dev = up_raw(&g, &x);
    let mut bf = zeros::<Bf16>(&g, x.len());
    launch!(g, "cast_f32_bf16".into(), grid(x.len()); &mut bf, &dev, &n);
    let bits: Vec<u16> = down_raw(&g, &bf).into_iter().map(|b| b.0).collect();
    let want: Vec<u16> = x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
    assert_eq!(bits, want, "cast_f32_bf16");
    let mut back = zeros::<f32>(&g, x.len());
    launch!(g, "cast_bf16_f32".into(), grid(x.len()); &mut back, &bf, &n);
    assert_eq!(down_raw(&g, &back), stored::<Bf16>(&x), "cast_bf16_f32");

    let mut ints = zeros::<i64>(&g, x.len());
    launch!(g, "cast_f32_i64".into(), grid(x.len()); &mut ints, &dev, &n);
    assert_eq!(
        down_raw(&g, &ints),
        [1, -2, 3, 1, 1, 65504, 0],
        "cast_f32_i64 truncates"
    );
    let big = up_raw(&g, &[-3i64, (1 << 40) + 1, 7]);
    let mut floats = zeros::<f32>(&g, 3);
    launch!(g, "cast_i64_f32".into(), grid(3); &mut floats, &big, &3i64);
    assert_eq!(
        down_raw(&g, &floats),
        [-3.0, ((1i64 << 40) + 1) as f32, 7.0],
        "cast_i64_f32"
    );
    let flags = up_raw(&g, &[0u8, 1, 1, 0]);
    let mut as_f = zeros::<f32>(&g, 4);
    launch!(g, "cast_bool_f32".into(), grid(4); &mut as_f, &flags, &4i64);
    assert_eq!(down_raw(&g, &as_f), [0.0, 1.0, 1.0, 0.0], "cast_bool_f32");
}

fn check_reduce<T: Elem>(g: &Gpu) {
    let (r, c) = (5usize, 1000usize);
    let x = stored::<T>(&random(r * c, 7, -1.0, 1.0));
    let input = up::<T>(g, &x);
    for op in kernels::REDUCE_OPS {
        let mut out = zeros::<T>(g, r);
        launch!(g, format!("reduce_rows_{op}_{}", T::SUFFIX), rows(r, 128); &mut out, &input, &(r as i64), &(c as i64));
        let want: Vec<f32> = x
            .chunks(c)
            .map(|row| {
                let row = row.iter().map(|&v| v as f64);
                (match *op {
                    "sum" => row.sum::<f64>(),
                    "mean" => row.sum::<f64>() / c as f64,
                    "max" => row.fold(f64::NEG_INFINITY, f64::max),
                    _ => row.fold(f64::INFINITY, f64::min),
                }) as f32
            })
            .collect();
        assert_close(
            &format!("reduce_rows_{op}_{}", T::SUFFIX),
            &down(g, &out),
            &want,
            T::TOL,
        );
    }
}

#[test]
fn row_reductions_cover_rows_longer_than_the_block() {
    let Some(g) = gpu("reduce") else { return };
    check_reduce::<f32>(&g);
    check_reduce::<Bf16>(&g);
}

/// data [2, 5, 3] gathered along the middle axis; indices wrap once when
/// negative, and read 0 and report the kernel's code when still out of range.
fn check_gather<T: Elem>(g: &Gpu) {
    let (outer, axis, inner) = (2usize, 5usize, 3usize);
    let data = stored::<T>(&random(outer * axis * inner, 8, -1.0, 1.0));
    let data_dev = up::<T>(g, &data);
    let at = |o: usize, ix: i64, k: usize| -> Option<usize> {
        let ix = if ix < 0 { ix + axis as i64 } else { ix };
        (0..axis as i64)
            .contains(&ix)
            .then(|| (o * axis + ix as usize) * inner + k)
    };
    let dims = (outer as i64, axis as i64, inner as i64);

    // gather / gather_grad: one index per position along the axis.
    let idx = vec![4i64, -1, 0, 2, 7, 1, 1, -4];
    let n_idx = idx.len();
    let idx_dev = up_raw(g, &idx);
    let mut out = zeros::<T>(g, outer * n_idx * inner);
    let total = outer * n_idx * inner;
    // Index 7 is out of range: the first kernel to meet it leaves its code.
    let mut fault = zeros::<i32>(g, 1);
    launch!(g, format!("gather_{}", T::SUFFIX), grid(total); &mut out, &data_dev, &idx_dev, &dims.0, &(n_idx as i64), &dims.1, &dims.2, &mut fault, &7i32);
    assert_eq!(down_raw(g, &fault), [7]);
    let coords = |i: usize, mid: usize| (i / (mid * inner), (i / inner) % mid, i % inner);
    let want: Vec<f32> = (0..total)
        .map(|i| {
            let (o, j, k) = coords(i, n_idx);
            at(o, idx[j], k).map_or(0.0, |a| data[a])
        })
        .collect();
    assert_close("gather", &down(g, &out), &want, 0.0);

    let grad = stored::<T>(&random(total, 9, -1.0, 1.0));
    let grad_dev = up::<T>(g, &grad);
    let mut acc = zeros::<f32>(g, data.len());
    launch!(g, format!("gather_grad_{}", T::SUFFIX), grid(total); &mut acc, &grad_dev, &idx_dev, &dims.0, &(n_idx as i64), &dims.1, &dims.2, &mut fault, &8i32);
    assert_eq!(down_raw(g, &fault), [7], "the first code stays");
    let mut want = vec![0f32; data.len()];
    for (i, &gv) in grad.iter().enumerate() {
        let (o, j, k) = coords(i, n_idx);
        if let Some(a) = at(o, idx[j], k) {
            want[a] += gv;
        }
    }
    assert_close("gather_grad", &down_raw(g, &acc), &want, 1e-6);

    // gather_elements / grad: one index per output element, j_len 4.
    let j_len = 4;
    let total = outer * j_len * inner;
    let eidx: Vec<i64> = random(total, 10, -5.0, 5.0)
        .iter()
        .map(|v| v.floor() as i64)
        .collect();
    let eidx_dev = up_raw(g, &eidx);
    let mut out = zeros::<T>(g, total);
    // Every index is in range after wrapping: nothing is reported.
    let mut fault = zeros::<i32>(g, 1);
    launch!(g, format!("gather_elements_{}", T::SUFFIX), grid(total); &mut out, &data_dev, &eidx_dev, &dims.0, &(j_len as i64), &dims.1, &dims.2, &mut fault, &9i32);
    let want: Vec<f32> = (0..total)
        .map(|i| {
            let (o, _, k) = coords(i, j_len);
            at(o, eidx[i], k).map_or(0.0, |a| data[a])
        })
        .collect();
    assert_close("gather_elements", &down(g, &out), &want, 0.0);
    let mut acc = zeros::<f32>(g, data.len());
    let egrad = up::<T>(g, &grad[..total]);
    launch!(g, format!("gather_elements_grad_{}", T::SUFFIX), grid(total); &mut acc, &egrad, &eidx_dev, &dims.0, &(j_len as i64), &dims.1, &dims.2, &mut fault, &9i32);
    assert_eq!(down_raw(g, &fault), [0]);
    let mut want = vec![0f32; data.len()];
    for i in 0..total {
        let (o, _, k) = coords(i, j_len);
        want[at(o, eidx[i], k).unwrap()] += grad[i];
    }
    assert_close("gather_elements_grad", &down_raw(g, &acc), &want, 1e-6);
}

#[test]
fn gathers_and_their_scatter_add_gradients() {
    let Some(g) = gpu("gather") else { return };
    check_gather::<f32>(&g);
    check_gather::<Bf16>(&g);
}

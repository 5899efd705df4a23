//! norm.cu, activation.cu, softmax.cu and optimizer.cu
//! against f64 Rust references (GPU only).

use super::elementwise::erf;
use super::*;

/// Row statistics and outputs of LayerNorm (`centre`) or RMSNorm in f64.
struct NormRef {
    y: Vec<f64>,
    mean: Vec<f64>,
    rstd: Vec<f64>,
}

fn norm_reference(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    cols: usize,
    centre: bool,
    eps: f64,
) -> NormRef {
    let mut r = NormRef {
        y: Vec::new(),
        mean: Vec::new(),
        rstd: Vec::new(),
    };
    for row in x.chunks(cols) {
        let mean = if centre {
            row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64
        } else {
            0.0
        };
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (c, &v) in row.iter().enumerate() {
            r.y.push((v as f64 - mean) * rstd * gamma[c] as f64 + beta.map_or(0.0, |b| b[c] as f64));
        }
        r.mean.push(mean);
        r.rstd.push(rstd);
    }
    r
}

/// dx and dy·x̂ of LayerNorm/RMSNorm by the textbook formulas.
fn norm_grad_reference(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    st: &NormRef,
    cols: usize,
    centre: bool,
) -> (Vec<f64>, Vec<f64>) {
    let (mut dx, mut gx) = (Vec::new(), Vec::new());
    for (r, (row, drow)) in x.chunks(cols).zip(dy.chunks(cols)).enumerate() {
        let xhat: Vec<f64> = row
            .iter()
            .map(|&v| (v as f64 - st.mean[r]) * st.rstd[r])
            .collect();
        let g: Vec<f64> = drow
            .iter()
            .zip(gamma)
            .map(|(&d, &w)| d as f64 * w as f64)
            .collect();
        let mean_g = if centre {
            g.iter().sum::<f64>() / cols as f64
        } else {
            0.0
        };
        let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / cols as f64;
        for c in 0..cols {
            dx.push(st.rstd[r] * (g[c] - mean_g - xhat[c] * mean_gx));
            gx.push(drow[c] as f64 * xhat[c]);
        }
    }
    (dx, gx)
}

fn check_norms<T: Elem>(g: &Gpu) {
    let (r, c, eps) = (6usize, 300usize, 1e-5f32);
    let (r64, c64) = (r as i64, c as i64);
    let x = stored::<T>(&random(r * c, 20, -2.0, 3.0));
    let gamma = stored::<T>(&random(c, 21, 0.5, 1.5));
    let beta = stored::<T>(&random(c, 22, -0.5, 0.5));
    let dy = stored::<T>(&random(r * c, 23, -1.0, 1.0));
    let (x_d, gamma_d, beta_d, dy_d) = (
        up::<T>(g, &x),
        up::<T>(g, &gamma),
        up::<T>(g, &beta),
        up::<T>(g, &dy),
    );
    let null = 0u64;
    for centre in [true, false] {
        let kind = if centre { "layernorm" } else { "rmsnorm" };
        let want = norm_reference(&x, &gamma, centre.then_some(&beta[..]), c, centre, eps as f64);
        let (mut y, mut mean, mut rstd) = (zeros::<T>(g, r * c), zeros::<f32>(g, r), zeros::<f32>(g, r));
        let name = format!("{kind}_fwd_{}", T::SUFFIX);
        if centre {
            launch!(g, name.clone(), rows(r, 128); &mut y, &mut mean, &mut rstd, &x_d, &gamma_d, &beta_d, &r64, &c64, &eps);
            assert_close(
                &format!("{name} mean"),
                &down_raw(g, &mean),
                &f32s(&want.mean),
                1e-5,
            );
        } else {
            launch!(g, name.clone(), rows(r, 128); &mut y, &mut rstd, &x_d, &gamma_d, &r64, &c64, &eps);
        }
        assert_close(&name, &down(g, &y), &f32s(&want.y), T::TOL);
        assert_close(
            &format!("{name} rstd"),
            &down_raw(g, &rstd),
            &f32s(&want.rstd),
            1e-5,
        );

        let (dx_want, gx_want) = norm_grad_reference(&dy, &x, &gamma, &want, c, centre);
        let (mut dx, mut gx) = (zeros::<T>(g, r * c), zeros::<T>(g, r * c));
        let name = format!("{kind}_bwd_{}", T::SUFFIX);
        launch!(g, name.clone(), rows(r, 128); &mut dx, &mut gx, &dy_d, &x_d, &gamma_d, &r64, &c64, &eps);
        assert_close(&name, &down(g, &dx), &f32s(&dx_want), T::TOL * 2.0);
        assert_close(
            &format!("{name} dy·x̂"),
            &down(g, &gx),
            &f32s(&gx_want),
            T::TOL * 2.0,
        );
        // Without the product (a null pointer): dx alone.
        let mut dx_only = zeros::<T>(g, r * c);
        launch!(g, name.clone(), rows(r, 128); &mut dx_only, &null, &dy_d, &x_d, &gamma_d, &r64, &c64, &eps);
        assert_close(
            &format!("{name} without dy·x̂"),
            &down(g, &dx_only),
            &f32s(&dx_want),
            T::TOL * 2.0,
        );
    }
    // LayerNorm without beta and without the statistics outputs.
    let want = norm_reference(&x, &gamma, None, c, true, eps as f64);
    let mut y = zeros::<T>(g, r * c);
    launch!(g, format!("layernorm_fwd_{}", T::SUFFIX), rows(r, 64); &mut y, &null, &null, &x_d, &gamma_d, &null, &r64, &c64, &eps);
    assert_close("layernorm_fwd without beta", &down(g, &y), &f32s(&want.y), T::TOL);
}

#[test]
fn layernorm_and_rmsnorm_forward_and_backward() {
    let Some(g) = gpu("norm") else { return };
    check_norms::<f32>(&g);
    check_norms::<Bf16>(&g);
}

fn gelu(x: f64, tanh: bool) -> f64 {
    if tanh {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Central difference of `f` at `x`: an independent check of the
/// hand-derived backward kernels.
fn slope(f: impl Fn(f64) -> f64, x: f64) -> f64 {
    let h = 1e-6;
    (f(x + h) - f(x - h)) / (2.0 * h)
}

/// Kernel family, its function in f64, and the `tanh_approx` flag if it takes one.
type Activation = (&'static str, Box<dyn Fn(f64) -> f64>, Option<i32>);

fn check_activations<T: Elem>(g: &Gpu) {
    let n = 1000usize;
    let n64 = n as i64;
    let x = stored::<T>(&random(n, 30, -4.0, 4.0));
    let dy = stored::<T>(&random(n, 31, -1.0, 1.0));
    let (x_d, dy_d) = (up::<T>(g, &x), up::<T>(g, &dy));
    let mut cases: Vec<Activation> = vec![("silu", Box::new(silu), None)];
    for tanh in [0, 1] {
        cases.push(("gelu", Box::new(move |v| gelu(v, tanh == 1)), Some(tanh)));
    }
    for (kind, f, flag) in cases {
        let (mut y, mut dx) = (zeros::<T>(g, n), zeros::<T>(g, n));
        let (fwd, bwd) = (
            format!("{kind}_fwd_{}", T::SUFFIX),
            format!("{kind}_bwd_{}", T::SUFFIX),
        );
        match flag {
            Some(tanh) => {
                launch!(g, fwd.clone(), grid(n); &mut y, &x_d, &n64, &tanh);
                launch!(g, bwd.clone(), grid(n); &mut dx, &dy_d, &x_d, &n64, &tanh);
            }
            None => {
                launch!(g, fwd.clone(), grid(n); &mut y, &x_d, &n64);
                launch!(g, bwd.clone(), grid(n); &mut dx, &dy_d, &x_d, &n64);
            }
        }
        let y_want: Vec<f32> = x.iter().map(|&v| f(v as f64) as f32).collect();
        let dx_want: Vec<f32> = x
            .iter()
            .zip(&dy)
            .map(|(&v, &d)| (d as f64 * slope(&f, v as f64)) as f32)
            .collect();
        assert_close(&format!("{fwd} {flag:?}"), &down(g, &y), &y_want, T::TOL);
        assert_close(&format!("{bwd} {flag:?}"), &down(g, &dx), &dx_want, T::TOL * 2.0);
    }
}

#[test]
fn gelu_and_silu_match_their_definitions_and_slopes() {
    let Some(g) = gpu("activation") else { return };
    check_activations::<f32>(&g);
    check_activations::<Bf16>(&g);
}

fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
}

fn check_softmax<T: Elem>(g: &Gpu) {
    let (r, c) = (4usize, 777usize);
    let (r64, c64) = (r as i64, c as i64);
    let x = stored::<T>(&random(r * c, 40, -5.0, 5.0));
    let dy = stored::<T>(&random(r * c, 41, -1.0, 1.0));
    let (x_d, dy_d) = (up::<T>(g, &x), up::<T>(g, &dy));
    for log in [0i32, 1] {
        let want: Vec<f32> = x
            .chunks(c)
            .flat_map(|row| {
                let lse = log_sum_exp(row);
                row.iter().map(move |&v| if log == 1 { v as f64 - lse } else { (v as f64 - lse).exp() } as f32)
            })
            .collect();
        let mut y = zeros::<T>(g, r * c);
        launch!(g, format!("softmax_fwd_{}", T::SUFFIX), rows(r, 256); &mut y, &x_d, &r64, &c64, &log);
        let got = down(g, &y);
        assert_close(&format!("softmax_fwd log={log}"), &got, &want, T::TOL);

        // Backward from the stored y.
        let dx_want: Vec<f32> = got
            .chunks(c)
            .zip(dy.chunks(c))
            .flat_map(|(yr, dr)| {
                let total: f64 = if log == 1 {
                    dr.iter().map(|&d| d as f64).sum()
                } else {
                    yr.iter().zip(dr).map(|(&a, &b)| a as f64 * b as f64).sum()
                };
                yr.iter().zip(dr).map(move |(&yv, &d)| {
                    (if log == 1 {
                        d as f64 - (yv as f64).exp() * total
                    } else {
                        yv as f64 * (d as f64 - total)
                    }) as f32
                })
            })
            .collect();
        let mut dx = zeros::<T>(g, r * c);
        launch!(g, format!("softmax_bwd_{}", T::SUFFIX), rows(r, 256); &mut dx, &dy_d, &y, &r64, &c64, &log);
        assert_close(
            &format!("softmax_bwd log={log}"),
            &down(g, &dx),
            &dx_want,
            T::TOL * 2.0,
        );
    }
}

fn check_cross_entropy<T: Elem>(g: &Gpu) {
    let (r, vocab) = (5usize, 1000usize);
    let logits = stored::<T>(&random(r * vocab, 42, -4.0, 4.0));
    let targets = vec![3i64, -100, 999, 0, 500];
    let dloss = vec![0.5f32, 1.0, 2.0, -1.0, 0.25];
    let (l_d, t_d, dl_d) = (up::<T>(g, &logits), up_raw(g, &targets), up_raw(g, &dloss));
    let lse_want: Vec<f64> = logits.chunks(vocab).map(log_sum_exp).collect();
    let loss_want: Vec<f32> = (0..r)
        .map(|i| {
            if targets[i] < 0 {
                0.0
            } else {
                (lse_want[i] - logits[i * vocab + targets[i] as usize] as f64) as f32
            }
        })
        .collect();
    let (mut loss, mut lse) = (zeros::<f32>(g, r), zeros::<f32>(g, r));
    let (r64, v64) = (r as i64, vocab as i64);
    launch!(g, format!("cross_entropy_fwd_{}", T::SUFFIX), rows(r, 256); &mut loss, &mut lse, &l_d, &t_d, &r64, &v64);
    assert_close("cross_entropy_fwd loss", &down_raw(g, &loss), &loss_want, 1e-5);
    assert_close(
        "cross_entropy_fwd lse",
        &down_raw(g, &lse),
        &f32s(&lse_want),
        1e-5,
    );

    let want: Vec<f32> = (0..r * vocab)
        .map(|i| {
            let (row, col) = (i / vocab, i % vocab);
            if targets[row] < 0 {
                return 0.0;
            }
            let p = (logits[i] as f64 - lse_want[row]).exp();
            ((p - (col as i64 == targets[row]) as u8 as f64) * dloss[row] as f64) as f32
        })
        .collect();
    let mut dlogits = zeros::<T>(g, r * vocab);
    launch!(g, format!("cross_entropy_bwd_{}", T::SUFFIX), rows(r, 256); &mut dlogits, &l_d, &lse, &t_d, &dl_d, &r64, &v64);
    assert_close("cross_entropy_bwd", &down(g, &dlogits), &want, T::TOL);
}

#[test]
fn softmax_log_softmax_and_cross_entropy() {
    let Some(g) = gpu("softmax") else { return };
    check_softmax::<f32>(&g);
    check_softmax::<Bf16>(&g);
    check_cross_entropy::<f32>(&g);
    check_cross_entropy::<Bf16>(&g);
}

/// AdamW and SGD replayed in f32 with the kernels' (and the CPU oracle's)
/// order of operations: the results must be bit-identical.
fn check_optimizers<T: Elem>(g: &Gpu) {
    let n = 1000usize;
    let n64 = n as i64;
    let master = random(n, 50, -1.0, 1.0);
    let grad = stored::<T>(&random(n, 51, -0.1, 0.1));
    let m0 = random(n, 52, -0.01, 0.01);
    let v0 = random(n, 53, 0.0, 1e-4);
    let (lr, b1, b2, eps, wd, t) = (1e-3f32, 0.9f32, 0.999f32, 1e-8f32, 0.1f32, 3);
    let step_size = lr / (1.0 - b1.powi(t));
    let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
    let decay = 1.0 - lr * wd;
    // As the CPU oracle forms them: in f64, then rounded.
    let (w1, rest1) = ((1.0 - b1 as f64) as f32, (1.0 - (1.0 - b1 as f64)) as f32);
    let w2 = (1.0 - b2 as f64) as f32;

    let (mut master_d, mut m_d, mut v_d) = (up_raw(g, &master), up_raw(g, &m0), up_raw(g, &v0));
    let (grad_d, mut param_d) = (up::<T>(g, &grad), zeros::<T>(g, n));
    launch!(g, format!("adamw_{}", T::SUFFIX), grid(n);
        &mut master_d, &mut param_d, &mut m_d, &mut v_d, &grad_d, &n64,
        &step_size, &bc2_sqrt, &w1, &rest1, &b2, &w2, &eps, &decay);
    let mut want = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let gr = grad[i];
        let p = master[i] * decay;
        let m = if w1.abs() < 0.5 {
            m0[i] + w1 * (gr - m0[i])
        } else {
            gr - (gr - m0[i]) * rest1
        };
        let v = v0[i] * b2 + w2 * gr * gr;
        let denom = v.sqrt() / bc2_sqrt + eps;
        want.0.push(p - step_size * m / denom);
        want.1.push(m);
        want.2.push(v);
    }
    assert_eq!(down_raw(g, &master_d), want.0, "adamw master");
    assert_eq!(down_raw(g, &m_d), want.1, "adamw m");
    assert_eq!(down_raw(g, &v_d), want.2, "adamw v");
    assert_eq!(down(g, &param_d), stored::<T>(&want.0), "adamw param");

    // SGD with momentum and weight decay, then plain SGD (no buffer).
    let (momentum, buf0) = (0.9f32, random(n, 54, -0.01, 0.01));
    let (mut master_d, mut buf_d, mut param_d) = (up_raw(g, &master), up_raw(g, &buf0), zeros::<T>(g, n));
    launch!(g, format!("sgd_{}", T::SUFFIX), grid(n); &mut master_d, &mut param_d, &mut buf_d, &grad_d, &n64, &lr, &momentum, &wd);
    let (mut p_want, mut b_want) = (Vec::new(), Vec::new());
    for i in 0..n {
        let b = buf0[i] * momentum + (grad[i] + wd * master[i]);
        b_want.push(b);
        p_want.push(master[i] - lr * b);
    }
    assert_eq!(down_raw(g, &master_d), p_want, "sgd master");
    assert_eq!(down_raw(g, &buf_d), b_want, "sgd momentum buffer");
    assert_eq!(down(g, &param_d), stored::<T>(&p_want), "sgd param");
    let mut master_d = up_raw(g, &master);
    launch!(g, format!("sgd_{}", T::SUFFIX), grid(n); &mut master_d, &mut param_d, &0u64, &grad_d, &n64, &lr, &0.0f32, &0.0f32);
    let plain: Vec<f32> = (0..n).map(|i| master[i] - lr * grad[i]).collect();
    assert_eq!(down_raw(g, &master_d), plain, "sgd without momentum");
}

#[test]
fn optimizers_match_the_cpu_oracle_bit_for_bit() {
    let Some(g) = gpu("optimizer") else { return };
    check_optimizers::<f32>(&g);
    check_optimizers::<Bf16>(&g);
    // f32 parameters may alias the master copy.
    let n = 100usize;
    let master = random(n, 55, -1.0, 1.0);
    let grad = random(n, 56, -0.1, 0.1);
    let (master_d, grad_d) = (up_raw(&g, &master), up_raw(&g, &grad));
    launch!(g, "sgd_f32".to_string(), grid(n); &master_d, &master_d, &0u64, &grad_d, &(n as i64), &0.5f32, &0.0f32, &0.0f32);
    let want: Vec<f32> = (0..n).map(|i| master[i] - 0.5 * grad[i]).collect();
    assert_eq!(
        down_raw(&g, &master_d),
        want,
        "sgd_f32 with param aliasing master"
    );
}

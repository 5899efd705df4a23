//! attention.cu against naive attention in f64 (GPU only): shapes that are
//! not multiples of the tiles, grouped-query heads, both head-dimension
//! specialisations, causal masks (upper-left aligned, as `Op::Attention`)
//! with Sq < Sk and Sq > Sk.

use super::*;

#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    hq: usize,
    hk: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
}

impl Dims {
    fn visible(&self, i: usize, j: usize) -> bool {
        !self.causal || j <= i
    }
    /// Offsets of row i of q (b, h) and row j of k/v (b, kv head of h).
    fn q_at(&self, b: usize, h: usize, i: usize) -> usize {
        ((b * self.hq + h) * self.sq + i) * self.d
    }
    fn kv_at(&self, b: usize, h: usize, j: usize) -> usize {
        ((b * self.hk + h / (self.hq / self.hk)) * self.sk + j) * self.d
    }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Softmax probabilities P[b, h, i, j] (0 where masked), the output and lse.
fn forward(q: &[f32], k: &[f32], v: &[f32], s: Dims, scale: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut p, mut o, mut lse) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..s.b {
        for h in 0..s.hq {
            for i in 0..s.sq {
                let qi = &q[s.q_at(b, h, i)..][..s.d];
                let scores: Vec<f64> = (0..s.sk)
                    .map(|j| {
                        let kj = &k[s.kv_at(b, h, j)..][..s.d];
                        if s.visible(i, j) {
                            scale * dot(qi, kj)
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l = if m == f64::NEG_INFINITY {
                    f64::NEG_INFINITY
                } else {
                    m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
                };
                let row: Vec<f64> = scores
                    .iter()
                    .map(|&x| if l.is_finite() { (x - l).exp() } else { 0.0 })
                    .collect();
                for c in 0..s.d {
                    o.push((0..s.sk).map(|j| row[j] * v[s.kv_at(b, h, j) + c] as f64).sum());
                }
                p.extend(row);
                lse.push(l);
            }
        }
    }
    (p, o, lse)
}

/// dq, dk, dv from P, dO and delta = rowsum(o·dO).
#[allow(clippy::too_many_arguments)]
fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
    p: &[f64],
    delta: &[f32],
    s: Dims,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for b in 0..s.b {
        for h in 0..s.hq {
            for i in 0..s.sq {
                let row = (b * s.hq + h) * s.sq + i;
                let (qa, doi) = (s.q_at(b, h, i), &d_o[s.q_at(b, h, i)..][..s.d]);
                for j in 0..s.sk {
                    let pij = p[row * s.sk + j];
                    let ka = s.kv_at(b, h, j);
                    let ds = pij * (dot(doi, &v[ka..][..s.d]) - delta[row] as f64);
                    for c in 0..s.d {
                        dq[qa + c] += scale * ds * k[ka + c] as f64;
                        dk[ka + c] += scale * ds * q[qa + c] as f64;
                        dv[ka + c] += pij * doi[c] as f64;
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}

fn flash_grid(len: usize, block: u32, heads: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (len.div_ceil(block as usize) as u32, heads as u32, 1),
        block_dim: (kernels::FLASH_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check_case<T: Elem>(g: &Gpu, s: Dims, seed: u64) {
    let what = format!("flash attention {} {s:?}", T::SUFFIX);
    let (nq, nk) = (s.b * s.hq * s.sq * s.d, s.b * s.hk * s.sk * s.d);
    let q = stored::<T>(&random(nq, seed, -1.0, 1.0));
    let k = stored::<T>(&random(nk, seed + 1, -1.0, 1.0));
    let v = stored::<T>(&random(nk, seed + 2, -1.0, 1.0));
    let d_o = stored::<T>(&random(nq, seed + 3, -1.0, 1.0));
    let scale = 1.0 / (s.d as f32).sqrt();
    let (q_d, k_d, v_d, do_d) = (up::<T>(g, &q), up::<T>(g, &k), up::<T>(g, &v), up::<T>(g, &d_o));
    let rows_n = s.b * s.hq * s.sq;
    let ints = [s.b, s.hq, s.hk, s.sq, s.sk, s.d].map(|x| x as i32);
    let causal = s.causal as i32;

    let (mut o, mut lse) = (zeros::<T>(g, nq), zeros::<f32>(g, rows_n));
    let heads = s.b * s.hq;
    launch!(g, format!("flash_attn_fwd_{}", T::SUFFIX), flash_grid(s.sq, kernels::FLASH_BLOCK_Q, heads);
        &mut o, &mut lse, &q_d, &k_d, &v_d, &ints[0], &ints[1], &ints[2], &ints[3], &ints[4], &ints[5], &scale, &causal);
    let (p, o_want, lse_want) = forward(&q, &k, &v, s, scale as f64);
    assert_close(&format!("{what}: o"), &down(g, &o), &f32s(&o_want), T::TOL);
    assert_close(
        &format!("{what}: lse"),
        &down_raw(g, &lse),
        &f32s(&lse_want),
        1e-5,
    );

    let o_got = down(g, &o);
    let mut delta = zeros::<f32>(g, rows_n);
    launch!(g, format!("flash_attn_bwd_pre_{}", T::SUFFIX), rows(rows_n, 256); &mut delta, &o, &do_d, &(rows_n as i64), &ints[5]);
    let delta_want: Vec<f32> = (0..rows_n)
        .map(|r| dot(&o_got[r * s.d..][..s.d], &d_o[r * s.d..][..s.d]) as f32)
        .collect();
    let delta_got = down_raw(g, &delta);
    assert_close(&format!("{what}: delta"), &delta_got, &delta_want, 1e-5);

    let (mut dq, mut dk, mut dv) = (zeros::<f32>(g, nq), zeros::<f32>(g, nk), zeros::<f32>(g, nk));
    launch!(g, format!("flash_attn_bwd_{}", T::SUFFIX), flash_grid(s.sk, kernels::FLASH_BLOCK_K, heads);
        &mut dq, &mut dk, &mut dv, &q_d, &k_d, &v_d, &do_d, &lse, &delta,
        &ints[0], &ints[1], &ints[2], &ints[3], &ints[4], &ints[5], &scale, &causal);
    let (dq_want, dk_want, dv_want) = backward(&q, &k, &v, &d_o, &p, &delta_got, s, scale as f64);
    // Gradients stay in float: only accumulation order and exp2 differ.
    assert_close(&format!("{what}: dq"), &down_raw(g, &dq), &f32s(&dq_want), 1e-4);
    assert_close(&format!("{what}: dk"), &down_raw(g, &dk), &f32s(&dk_want), 1e-4);
    assert_close(&format!("{what}: dv"), &down_raw(g, &dv), &f32s(&dv_want), 1e-4);
}

fn check<T: Elem>(g: &Gpu) {
    let base = Dims {
        b: 2,
        hq: 4,
        hk: 2,
        sq: 37,
        sk: 45,
        d: 40,
        causal: true,
    };
    check_case::<T>(g, base, 60);
    check_case::<T>(
        g,
        Dims {
            sq: 45,
            sk: 37,
            d: 96,
            ..base
        },
        70,
    );
    check_case::<T>(
        g,
        Dims {
            d: 96,
            causal: false,
            ..base
        },
        80,
    );
    check_case::<T>(
        g,
        Dims {
            b: 1,
            hq: 2,
            hk: 2,
            sq: 33,
            sk: 33,
            d: 128,
            causal: true,
        },
        90,
    );
    check_case::<T>(
        g,
        Dims {
            b: 1,
            hq: 3,
            hk: 1,
            sq: 1,
            sk: 70,
            d: 64,
            causal: false,
        },
        100,
    );
}

#[test]
fn flash_attention_forward_and_backward() {
    let Some(g) = gpu("attention") else { return };
    check::<f32>(&g);
    check::<Bf16>(&g);
}

//! attention.cu against naive attention in f64 (GPU only): shapes that are
//! not multiples of the tiles, grouped-query heads, both head-dimension
//! specialisations, causal masks (upper-left aligned, as `Op::Attention`)
//! with Sq < Sk and Sq > Sk, causal masks at given query positions (a
//! context-parallel rank's two chunks), and mask operands: an additive float mask with
//! -inf entries, a fully masked row and a row of -3.4e38 (as exported
//! models build them), and a 2-D bool mask shorter than the keys.

use super::*;
use cudarc::driver::DevicePtr;

#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    hq: usize,
    hk: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
    mask: MaskCase,
    /// Causal at given query positions: the first half of the queries at
    /// the first positions, the rest at the last keys (as a context-parallel
    /// rank's balanced chunks see them).
    positions: bool,
}

/// The mask operand of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum MaskCase {
    None,
    /// Float `[b, 1, sq, sk]`, added to the scores.
    Float,
    /// Bool `[sq, sk - 3]`: keys past it masked.
    Bool,
}

/// A case's mask as the kernels take it: its values (floats, or 0/1 for
/// bool), element strides over (batch, head, query, key) and key length.
struct MaskData {
    values: Vec<f32>,
    strides: [i64; 4],
    len: usize,
}

impl MaskData {
    fn new(s: Dims, seed: u64) -> Option<MaskData> {
        match s.mask {
            MaskCase::None => None,
            MaskCase::Float => {
                let mut values = random(s.b * s.sq * s.sk, seed, -2.0, 2.0);
                for (at, x) in values.iter_mut().enumerate() {
                    let (i, j) = (at / s.sk % s.sq, at % s.sk);
                    if j % 7 == 3 || i == 1 {
                        *x = f32::NEG_INFINITY;
                    } else if i == 2 {
                        *x = f32::MIN;
                    }
                }
                let strides = [(s.sq * s.sk) as i64, 0, s.sk as i64, 1];
                Some(MaskData {
                    values,
                    strides,
                    len: s.sk,
                })
            }
            MaskCase::Bool => {
                let len = s.sk - 3;
                let values = (0..s.sq * len)
                    .map(|at| {
                        let (i, j) = (at / len, at % len);
                        f32::from(u8::from(i > 0 && (i + 2 * j) % 5 != 0))
                    })
                    .collect();
                Some(MaskData {
                    values,
                    strides: [0, 0, len as i64, 1],
                    len,
                })
            }
        }
    }

    /// The bias of score (b, h, i, j), as `Op::Attention` adds it.
    fn bias(&self, kind: MaskCase, [b, h, i, j]: [usize; 4]) -> f64 {
        if j >= self.len {
            return f64::NEG_INFINITY;
        }
        let st = self.strides;
        let x =
            self.values[(b as i64 * st[0] + h as i64 * st[1] + i as i64 * st[2] + j as i64 * st[3]) as usize];
        match kind {
            MaskCase::Bool if x == 0.0 => f64::NEG_INFINITY,
            MaskCase::Bool => 0.0,
            _ => x as f64,
        }
    }
}

impl Dims {
    /// The position of query `i`.
    fn position(&self, i: usize) -> usize {
        match self.positions {
            true if i >= self.sq / 2 => self.sk - (self.sq - i),
            _ => i,
        }
    }
    fn visible(&self, i: usize, j: usize) -> bool {
        !self.causal || j <= self.position(i)
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
fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: Dims,
    scale: f64,
    mask: Option<&MaskData>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut p, mut o, mut lse) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..s.b {
        for h in 0..s.hq {
            for i in 0..s.sq {
                let qi = &q[s.q_at(b, h, i)..][..s.d];
                let scores: Vec<f64> = (0..s.sk)
                    .map(|j| {
                        let kj = &k[s.kv_at(b, h, j)..][..s.d];
                        let bias = mask.map_or(0.0, |m| m.bias(s.mask, [b, h, i, j]));
                        if s.visible(i, j) {
                            scale * dot(qi, kj) + bias
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                // exp(x - m) / sum rather than exp(x - lse): a row of -3.4e38
                // biases would lose ln(sum) in m + ln(sum).
                let sum: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                let l = if m == f64::NEG_INFINITY {
                    f64::NEG_INFINITY
                } else {
                    m + sum.ln()
                };
                let row: Vec<f64> = scores
                    .iter()
                    .map(|&x| if m.is_finite() { (x - m).exp() / sum } else { 0.0 })
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
    let at: Vec<i64> = (0..s.sq).map(|i| s.position(i) as i64).collect();
    let positions = s.positions.then(|| up_raw::<i64>(g, &at));
    let qpos = positions.as_ref().map_or(0, |p| p.device_ptr(&g.stream).0);
    // The mask as stored on the device (floats in T, bools as bytes).
    let mask = MaskData::new(s, seed + 4).map(|mut m| {
        if s.mask == MaskCase::Float {
            m.values = stored::<T>(&m.values);
        }
        m
    });
    let mask_f = mask
        .as_ref()
        .filter(|_| s.mask == MaskCase::Float)
        .map(|m| up::<T>(g, &m.values));
    let mask_b = mask
        .as_ref()
        .filter(|_| s.mask == MaskCase::Bool)
        .map(|m| up_raw::<u8>(g, &m.values.iter().map(|&x| x as u8).collect::<Vec<_>>()));
    let mf = mask_f.as_ref().map_or(0, |m| m.device_ptr(&g.stream).0);
    let mb = mask_b.as_ref().map_or(0, |m| m.device_ptr(&g.stream).0);
    let (ms, mlen) = mask.as_ref().map_or(([0; 4], 0), |m| (m.strides, m.len as i32));

    let (mut o, mut stats) = (zeros::<T>(g, nq), zeros::<f32>(g, 2 * rows_n));
    let heads = s.b * s.hq;
    launch!(g, format!("flash_attn_fwd_{}", T::SUFFIX), flash_grid(s.sq, kernels::FLASH_BLOCK_Q, heads);
        &mut o, &mut stats, &q_d, &k_d, &v_d, &mf, &mb, &ms[0], &ms[1], &ms[2], &ms[3], &mlen,
        &ints[0], &ints[1], &ints[2], &ints[3], &ints[4], &ints[5], &scale, &causal, &qpos);
    let (p, o_want, lse_want) = forward(&q, &k, &v, s, scale as f64, mask.as_ref());
    assert_close(&format!("{what}: o"), &down(g, &o), &f32s(&o_want), T::TOL);
    let lse: Vec<f32> = down_raw(g, &stats).chunks(2).map(|ml| ml[0] + ml[1]).collect();
    assert_close(&format!("{what}: lse"), &lse, &f32s(&lse_want), 1e-5);

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
        &mut dq, &mut dk, &mut dv, &q_d, &k_d, &v_d, &do_d, &stats, &delta,
        &mf, &mb, &ms[0], &ms[1], &ms[2], &ms[3], &mlen,
        &ints[0], &ints[1], &ints[2], &ints[3], &ints[4], &ints[5], &scale, &causal, &qpos);
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
        mask: MaskCase::None,
        positions: false,
    };
    check_case::<T>(g, base, 60);
    // Two runs of query positions far apart, over more keys than a tile:
    // whole tiles of keys are hidden from one run and not the other.
    check_case::<T>(
        g,
        Dims {
            sq: 70,
            sk: 140,
            positions: true,
            ..base
        },
        65,
    );
    check_case::<T>(
        g,
        Dims {
            sq: 70,
            sk: 140,
            d: 96,
            positions: true,
            mask: MaskCase::Float,
            ..base
        },
        66,
    );
    check_case::<T>(
        g,
        Dims {
            mask: MaskCase::Float,
            ..base
        },
        110,
    );
    check_case::<T>(
        g,
        Dims {
            causal: false,
            d: 96,
            mask: MaskCase::Bool,
            ..base
        },
        120,
    );
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
            mask: MaskCase::Float,
            positions: false,
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
            mask: MaskCase::None,
            positions: false,
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

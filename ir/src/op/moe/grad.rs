//! `MoeExpertsGrad(x, weights, indices, w_in, w_out, dout, w_gate?)` →
//! `(dx, dweights, dw_in, dw_out, dw_gate?)`: the adjoint of `MoeExperts`.
//! Per expert, over the `n` assignments routed to it (rows `xs`, routing
//! weights `ω`): the pre-activations `a = xs·w_in` (and `g = xs·w_gate`)
//! and hidden `hid = act(a)` (or `act(g) ⊙ a`) are recomputed; then
//! `dweights = ⟨dout, hid·w_out⟩`, `dY = ω·dout`, `dw_out += hidᵀ·dY`,
//! `dhid = dY·w_outᵀ`, `da = dhid ⊙ act′(a)` (or `dhid ⊙ act(g)` with
//! `dg = dhid ⊙ a ⊙ act′(g)`), `dw_in += xsᵀ·da`, `dw_gate += xsᵀ·dg` and
//! `dx += da·w_inᵀ + dg·w_gateᵀ`.

use super::super::adjoint::check_grad_like;
use super::super::context::{invalid, EvalCtx, InferCtx};
use super::super::elementwise::activate;
use super::super::elementwise::grad::derivative as activation_grad;
use super::super::gemm::{gemm, Mat};
use super::super::geometry::{dim, numel};
use super::super::moe::infer_experts;
use super::super::numeric::Real;
use super::super::{Activation, OpError, TensorType};

/// Element-wise FLOPs per hidden unit of one assignment (activation and
/// its derivative).
const HIDDEN_FLOPS: f64 = 8.0;

/// Types of the gradients of `x`, `weights`, `w_in`, `w_out` and, when
/// `gated`, `w_gate`, after checking the forward inputs as `MoeExperts`
/// does and `dout` against its output.
pub(super) fn infer(cx: &InferCtx, gated: bool) -> Result<Vec<TensorType>, OpError> {
    cx.arity(6, 7)?;
    if cx.opt(6).is_some() != gated {
        let why = if gated {
            "gated experts need w_gate (input 6)"
        } else {
            "w_gate (input 6) is given but gated is false"
        };
        return Err(invalid(cx.op, why));
    }
    let forward = [cx.opt(0), cx.opt(1), cx.opt(2), cx.opt(3), cx.opt(4), cx.opt(6)];
    let n = if gated { 6 } else { 5 };
    let out = infer_experts(&InferCtx {
        op: cx.op,
        inputs: &forward[..n],
    })?;
    check_grad_like(cx, 5, &out[0])?;
    let grads: &[usize] = if gated { &[0, 1, 3, 4, 6] } else { &[0, 1, 3, 4] };
    grads.iter().map(|&i| cx.ty(i).cloned()).collect()
}

/// Reference kernel: `[dx, dweights, dw_in, dw_out, dw_gate?]`.
pub(super) fn kernel<T: Real>(cx: &EvalCtx, act: Activation) -> Result<Vec<Vec<T>>, OpError> {
    let (idv, winv) = (cx.input(2)?, cx.input(3)?);
    let (x, w, dout) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?, cx.floats::<T>(5)?);
    let (w_in, w_out) = (cx.floats::<T>(3)?, cx.floats::<T>(4)?);
    let gate = cx.opt(6).map(|_| cx.floats::<T>(6)).transpose()?;
    let ids = idv.as_i64().unwrap_or_default();
    let (e, h, f) = (winv.shape[0], winv.shape[1], winv.shape[2]);
    let k = idv.shape.last().copied().unwrap_or(1).max(1);
    let slots = assignments(cx.op, ids, e)?;
    let experts = Experts {
        op: cx.op,
        act,
        w_in,
        w_out,
        gate,
        h,
        f,
    };
    let mut dx = vec![T::zero(); x.len()];
    let mut dw = vec![T::zero(); w.len()];
    let mut grads = WeightGrads {
        w_in: vec![T::zero(); w_in.len()],
        w_out: vec![T::zero(); w_out.len()],
        gate: vec![T::zero(); gate.map_or(0, <[T]>::len)],
    };
    let token = |s: usize| (s / k) * h..(s / k + 1) * h;
    for (ex, list) in slots.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
        let xs: Vec<T> = list.iter().flat_map(|&s| x[token(s)].iter().copied()).collect();
        let dys: Vec<T> = list
            .iter()
            .flat_map(|&s| dout[token(s)].iter().map(move |&g| g * w[s]))
            .collect();
        let fwd = experts.recompute(ex, list.len(), &xs)?;
        // Routing weights: the expert's unweighted output against dout.
        let y = experts.output(ex, &fwd)?;
        for (&s, yr) in list.iter().zip(y.chunks(h.max(1))) {
            dw[s] = dout[token(s)].iter().zip(yr).map(|(&g, &v)| g * v).sum();
        }
        let dxs = experts.backward(ex, &xs, &dys, &fwd, &mut grads)?;
        for (&s, dr) in list.iter().zip(dxs.chunks(h.max(1))) {
            for (o, &v) in dx[token(s)].iter_mut().zip(dr) {
                *o += v;
            }
        }
    }
    let mut out = vec![dx, dw, grads.w_in, grads.w_out];
    if gate.is_some() {
        out.push(grads.gate);
    }
    Ok(out)
}

/// The assignments (flat routing slots) of each of the `e` experts, in slot
/// order; −1 is padding, routed nowhere, and any other index outside `0..e`
/// is an error naming it.
pub(super) fn assignments(op: &str, ids: &[i64], e: usize) -> Result<Vec<Vec<usize>>, OpError> {
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); e];
    for (slot, &id) in ids.iter().enumerate().filter(|(_, &id)| id != -1) {
        let ex = usize::try_from(id)
            .ok()
            .filter(|&ex| ex < e)
            .ok_or_else(|| invalid(op, format!("expert index {id} is outside 0..{e}")))?;
        slots[ex].push(slot);
    }
    Ok(slots)
}

/// The experts' weights (`[e, h, f]` in, gate; `[e, f, h]` out) and
/// activation, which every phase of one expert's adjoint reads.
struct Experts<'a, T> {
    op: &'a str,
    act: Activation,
    w_in: &'a [T],
    w_out: &'a [T],
    gate: Option<&'a [T]>,
    h: usize,
    f: usize,
}

/// One expert's forward values over its `n` assignments, recomputed:
/// pre-activations `a` (and gate `g`) and the hidden `hid`, each `[n, f]`.
struct Forward<T> {
    n: usize,
    a: Vec<T>,
    g: Option<Vec<T>>,
    hid: Vec<T>,
}

/// The weight gradients, summed over experts.
struct WeightGrads<T> {
    w_in: Vec<T>,
    w_out: Vec<T>,
    gate: Vec<T>,
}

impl<T: Real> Experts<'_, T> {
    /// `a = xs·w_in`, `g = xs·w_gate` and `hid = act(a)` (or `act(g) ⊙ a`).
    fn recompute(&self, ex: usize, n: usize, xs: &[T]) -> Result<Forward<T>, OpError> {
        let (act, h, f) = (self.act, self.h, self.f);
        let fo = ex * h * f;
        let xm = Mat::row_major(xs, 0, h, false);
        let mut a = vec![T::zero(); n * f];
        gemm(
            self.op,
            n,
            h,
            f,
            T::one(),
            xm,
            Mat::row_major(self.w_in, fo, f, false),
            T::zero(),
            &mut a,
            0,
        )?;
        let g = match self.gate {
            Some(gw) => {
                let mut g = vec![T::zero(); n * f];
                gemm(
                    self.op,
                    n,
                    h,
                    f,
                    T::one(),
                    xm,
                    Mat::row_major(gw, fo, f, false),
                    T::zero(),
                    &mut g,
                    0,
                )?;
                Some(g)
            }
            None => None,
        };
        let hid: Vec<T> = match &g {
            Some(g) => a.iter().zip(g).map(|(&a, &g)| a * activate(act, g)).collect(),
            None => a.iter().map(|&a| activate(act, a)).collect(),
        };
        Ok(Forward { n, a, g, hid })
    }

    /// The expert's unweighted output `hid·w_out`, `[n, h]`.
    fn output(&self, ex: usize, fwd: &Forward<T>) -> Result<Vec<T>, OpError> {
        let (h, f, n) = (self.h, self.f, fwd.n);
        let wo = ex * f * h;
        let hm = Mat::row_major(&fwd.hid[..], 0, f, false);
        let mut y = vec![T::zero(); n * h];
        gemm(
            self.op,
            n,
            f,
            h,
            T::one(),
            hm,
            Mat::row_major(self.w_out, wo, h, false),
            T::zero(),
            &mut y,
            0,
        )?;
        Ok(y)
    }

    /// From the weighted output gradient `dys`: adds the expert's slices of
    /// `dw_out`, `dw_in` and `dw_gate` into `grads` and returns its rows of
    /// `dx` (`da·w_inᵀ + dg·w_gateᵀ`), `[n, h]`.
    fn backward(
        &self,
        ex: usize,
        xs: &[T],
        dys: &[T],
        fwd: &Forward<T>,
        grads: &mut WeightGrads<T>,
    ) -> Result<Vec<T>, OpError> {
        let (act, h, f, n) = (self.act, self.h, self.f, fwd.n);
        let (fo, wo) = (ex * h * f, ex * f * h);
        let (a, g) = (&fwd.a, &fwd.g);
        let xt = Mat::row_major(xs, 0, h, true);
        let dym = Mat::row_major(dys, 0, h, false);
        let ht = Mat::row_major(&fwd.hid[..], 0, f, true);
        gemm(
            self.op,
            f,
            n,
            h,
            T::one(),
            ht,
            dym,
            T::one(),
            &mut grads.w_out,
            wo,
        )?;
        let mut dhid = vec![T::zero(); n * f];
        gemm(
            self.op,
            n,
            h,
            f,
            T::one(),
            dym,
            Mat::row_major(self.w_out, wo, h, true),
            T::zero(),
            &mut dhid,
            0,
        )?;
        let (da, dg): (Vec<T>, Option<Vec<T>>) = match g {
            Some(g) => (
                dhid.iter().zip(g).map(|(&d, &g)| d * activate(act, g)).collect(),
                Some(
                    dhid.iter()
                        .zip(g)
                        .zip(a)
                        .map(|((&d, &g), &a)| d * a * activation_grad(act, g))
                        .collect(),
                ),
            ),
            None => (
                dhid.iter()
                    .zip(a)
                    .map(|(&d, &a)| d * activation_grad(act, a))
                    .collect(),
                None,
            ),
        };
        let dam = Mat::row_major(&da[..], 0, f, false);
        gemm(self.op, h, n, f, T::one(), xt, dam, T::one(), &mut grads.w_in, fo)?;
        let mut dxs = vec![T::zero(); n * h];
        gemm(
            self.op,
            n,
            f,
            h,
            T::one(),
            dam,
            Mat::row_major(self.w_in, fo, f, true),
            T::zero(),
            &mut dxs,
            0,
        )?;
        if let (Some(dg), Some(gw)) = (&dg, self.gate) {
            let dgm = Mat::row_major(&dg[..], 0, f, false);
            gemm(self.op, h, n, f, T::one(), xt, dgm, T::one(), &mut grads.gate, fo)?;
            gemm(
                self.op,
                n,
                f,
                h,
                T::one(),
                dgm,
                Mat::row_major(gw, fo, f, true),
                T::one(),
                &mut dxs,
                0,
            )?;
        }
        Ok(dxs)
    }
}

/// FLOPs: each assignment's products recomputed (two, three when gated)
/// and their gradients (twice as many), plus the element-wise work.
pub(super) fn flops(inputs: &[Option<&TensorType>], sources: usize) -> f64 {
    let get = |i: usize| inputs.get(i).copied().flatten();
    let (Some(x), Some(ids), Some(win)) = (get(0), get(2), get(3)) else {
        return 0.0;
    };
    let share = sources.max(1) as f64;
    let assignments = numel(ids) / share;
    let (h, f) = (dim(win, 1), dim(win, 2));
    let products = if get(6).is_some() { 3.0 } else { 2.0 };
    3.0 * assignments * products * 2.0 * h * f + assignments * f * HIDDEN_FLOPS + numel(x) * 4.0 / share
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::{assert_close, assert_op_err, eval, f32s, i64s, infer, ty};
    use super::super::super::Op;
    use super::Activation;
    use crate::DType;

    fn op(gated: bool) -> Op {
        Op::MoeExpertsGrad {
            activation: Activation::Relu,
            gated,
            sources: 1,
        }
    }

    #[test]
    fn infers_gradient_types_and_checks_gating() {
        let t = |s| ty(DType::F32, s);
        let ids = ty(DType::I64, "t 2");
        let base = [t("t 4"), t("t 2"), ids, t("3 4 8"), t("3 8 4"), t("t 4")];
        assert_eq!(
            infer(&op(false), &base).unwrap(),
            vec![t("t 4"), t("t 2"), t("3 4 8"), t("3 8 4")]
        );
        let mut gated = base.to_vec();
        gated.push(t("3 4 8"));
        assert_eq!(infer(&op(true), &gated).unwrap().len(), 5);
        assert_op_err(
            infer(&op(true), &base),
            "MoeExpertsGrad",
            "gated experts need w_gate (input 6)",
        );
        assert_op_err(
            infer(&op(false), &gated),
            "MoeExpertsGrad",
            "w_gate (input 6) is given but gated is false",
        );
        let mut bad = base.to_vec();
        bad[5] = t("t 5");
        assert_op_err(
            infer(&op(false), &bad),
            "MoeExpertsGrad",
            "output gradient (input 5) is f32[t, 5] but the forward output is f32[t, 4]",
        );
    }

    #[test]
    fn one_token_two_experts() {
        // Forward (see MoeExperts' test): 0.5·relu(3·1)·1 + 0.25·relu(3·2)·10.
        let x = f32s(&[1, 1], &[3.0]);
        let w = f32s(&[1, 2], &[0.5, 0.25]);
        let ids = i64s(&[1, 2], &[0, 1]);
        let w_in = f32s(&[2, 1, 1], &[1.0, 2.0]);
        let w_out = f32s(&[2, 1, 1], &[1.0, 10.0]);
        let dout = f32s(&[1, 1], &[1.0]);
        let out = eval(&op(false), &[&x, &w, &ids, &w_in, &w_out, &dout]).unwrap();
        // dx = 0.5·1·1 + 0.25·10·2; dweights = expert outputs [3, 60];
        // dw_in = ω·w_out·x; dw_out = ω·hid.
        assert_close(&out[0].to_f64_vec(), &[5.5], 1e-6);
        assert_close(&out[1].to_f64_vec(), &[3.0, 60.0], 1e-6);
        assert_close(&out[2].to_f64_vec(), &[1.5, 7.5], 1e-6);
        assert_close(&out[3].to_f64_vec(), &[1.5, 1.5], 1e-6);
        // Gated with relu(x·gate) = [0, 0] for gate [-1, -1]: no gradient to
        // w_in or x through the (dead) gate, and the outputs are zero.
        let gate = f32s(&[2, 1, 1], &[-1.0, -1.0]);
        let out = eval(&op(true), &[&x, &w, &ids, &w_in, &w_out, &dout, &gate]).unwrap();
        assert_eq!(out.len(), 5);
        assert!(out.iter().all(|o| o.to_f64_vec().iter().all(|&v| v == 0.0)));
        let bad = i64s(&[1, 2], &[0, 2]);
        assert_op_err(
            eval(&op(false), &[&x, &w, &bad, &w_in, &w_out, &dout]),
            "MoeExpertsGrad",
            "expert index 2 is outside 0..2",
        );
    }
}

//! Optimizers applied elementwise to flat slices.
//!
//! Every update reads only element `i` of the parameter, gradient and state
//! (plus scalars that depend on the step number), so a ZeRO shard, a
//! sub-range of a parameter, is stepped on its own and gives exactly the
//! bits that stepping the whole parameter gives. The arithmetic follows
//! PyTorch's single-tensor `torch.optim.AdamW` and `torch.optim.SGD`, in the
//! same order, so a trajectory can be compared with PyTorch's.

use autopar_ir::interp::Precision;
use autopar_ir::{Data, Value};
use std::ops::{Add, Div, Mul, Sub};

/// Learning rate of `adamw` when a spec names none (`autopar run --lr`'s
/// default). Lower than PyTorch's 1e-3 because, without warm-up or
/// gradient clipping, wider models diverge above it: the zoo GPT
/// `gpt:layers=4,hidden=512,heads=8,vocab=8192,seq=256` (16.9M parameters)
/// on synthetic rows climbs from 9.0 to 106 within 7 steps at 3e-3 and
/// spikes to 26.7 at 1e-3, but falls to 2.5 in 20 steps at 3e-4. Tiny
/// models learn slowly at it: a 2-layer, 64-wide GPT wants 3e-3 for a
/// loss that falls clearly in 10 steps.
pub const DEFAULT_ADAMW_LR: f64 = 3e-4;
/// Learning rate of `sgd` when a spec names none.
pub const DEFAULT_SGD_LR: f64 = 1e-2;

/// An optimizer and its hyperparameters; serialisable so a run's manifest
/// records exactly what trained it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Optimizer {
    /// SGD with heavy-ball momentum (no dampening, no Nesterov) and coupled
    /// (L2) weight decay, as PyTorch's `SGD`: `d = g + wd·p`,
    /// `buf = momentum·buf + d`, `p -= lr·buf`.
    Sgd {
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    },
    /// Adam with decoupled weight decay (Loshchilov & Hutter), as PyTorch's
    /// `AdamW`.
    AdamW {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

/// Why an optimizer spec or step was rejected.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptimError {
    #[error("unknown optimizer '{0}' (expected adamw or sgd)")]
    Unknown(String),
    #[error("optimizer spec '{spec}': {message}")]
    Spec { spec: String, message: String },
    #[error("optimizer steps count from 1; got step 0")]
    StepZero,
    #[error("{what} has {got} elements but the parameter has {want}")]
    Length {
        what: &'static str,
        want: usize,
        got: usize,
    },
    #[error("optimizer state is kept in {state:?} but the parameter is stepped in {param:?}")]
    Precision { state: Precision, param: Precision },
    #[error("optimizer state has {got} slots per element, this optimizer needs {want}")]
    Slots { want: usize, got: usize },
}

/// AdamW's factors for one update, formed once in f64 so that every
/// backend rounds the same numbers (the CPU to its master type, the GPU
/// to f32) and their updates agree by construction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Corrections {
    /// `lr / (1 − β₁ᵗ)`: the step size with the first moment's bias correction.
    pub step_size: f64,
    /// `√(1 − β₂ᵗ)`: the second moment's bias correction, under its root.
    pub bc2_sqrt: f64,
    /// `1 − lr·weight_decay`: the decoupled decay of the weights.
    pub decay: f64,
}

/// Whether a parameter of rank `param_rank` should get weight decay.
///
/// The convention of GPT-2/nanoGPT and most LLM recipes: matrices (linear
/// weights, embeddings) decay; 1-D parameters (biases and the scales of
/// LayerNorm/RMSNorm) do not, since shrinking them towards zero only fights
/// the normalisation. The caller applies it by stepping such parameters
/// with an optimizer whose `weight_decay` is zero ([`Optimizer::without_decay`]).
pub fn decays(param_rank: usize) -> bool {
    param_rank >= 2
}

impl Optimizer {
    /// AdamW with the GPT-3 / nanoGPT recipe: betas (0.9, 0.95), eps 1e-8,
    /// weight decay 0.1. β₂ = 0.95 rather than PyTorch's 0.999 keeps the
    /// second moment responsive, which large-model training found stabler.
    pub fn adamw(lr: f64) -> Self {
        Optimizer::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }

    /// Plain SGD: no momentum, no weight decay (the simplest baseline, and
    /// stateless, so it costs no optimizer memory).
    pub fn sgd(lr: f64) -> Self {
        Optimizer::Sgd {
            lr,
            momentum: 0.0,
            weight_decay: 0.0,
        }
    }

    /// Parses a CLI spec: `adamw` or `sgd`, optionally followed by
    /// `:key=value,...` overrides of [`Optimizer::adamw`] /
    /// [`Optimizer::sgd`]'s defaults. Keys: `lr`, `wd` (both), `beta1`,
    /// `beta2`, `eps` (adamw), `momentum` (sgd).
    /// Example: `adamw:lr=3e-4,wd=0`.
    pub fn parse(s: &str) -> Result<Self, OptimError> {
        let (name, overrides) = s.split_once(':').unwrap_or((s, ""));
        let mut opt = match name.trim() {
            "adamw" => Optimizer::adamw(DEFAULT_ADAMW_LR),
            "sgd" => Optimizer::sgd(DEFAULT_SGD_LR),
            other => return Err(OptimError::Unknown(other.to_string())),
        };
        let spec_error = |message: String| OptimError::Spec {
            spec: s.to_string(),
            message,
        };
        for item in overrides.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| spec_error(format!("'{item}' is not key=value")))?;
            let value: f64 = value
                .trim()
                .parse()
                .map_err(|_| spec_error(format!("'{value}' is not a number")))?;
            *opt.field(key.trim())
                .ok_or_else(|| spec_error(format!("no key '{key}' for {name}")))? = value;
        }
        opt.validate().map_err(spec_error)?;
        Ok(opt)
    }

    /// The hyperparameter a spec key names, for [`Optimizer::parse`].
    fn field(&mut self, key: &str) -> Option<&mut f64> {
        match (self, key) {
            (Optimizer::Sgd { lr, .. } | Optimizer::AdamW { lr, .. }, "lr") => Some(lr),
            (Optimizer::Sgd { weight_decay, .. } | Optimizer::AdamW { weight_decay, .. }, "wd") => {
                Some(weight_decay)
            }
            (Optimizer::Sgd { momentum, .. }, "momentum") => Some(momentum),
            (Optimizer::AdamW { beta1, .. }, "beta1") => Some(beta1),
            (Optimizer::AdamW { beta2, .. }, "beta2") => Some(beta2),
            (Optimizer::AdamW { eps, .. }, "eps") => Some(eps),
            _ => None,
        }
    }

    /// Checks the ranges under which the updates are well defined; the
    /// message names the hyperparameter, its value and its range.
    pub fn validate(&self) -> Result<(), String> {
        let check = |name: &str, v: f64, ok: bool, range: &str| {
            if ok && v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} = {v} is out of range ({range})"))
            }
        };
        let unit = "in [0, 1)";
        match *self {
            Optimizer::Sgd {
                lr,
                momentum,
                weight_decay,
            } => {
                check("lr", lr, lr >= 0.0, "a finite number ≥ 0")?;
                check("momentum", momentum, (0.0..1.0).contains(&momentum), unit)?;
                check("wd", weight_decay, weight_decay >= 0.0, "a finite number ≥ 0")
            }
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                check("lr", lr, lr >= 0.0, "a finite number ≥ 0")?;
                check("beta1", beta1, (0.0..1.0).contains(&beta1), unit)?;
                check("beta2", beta2, (0.0..1.0).contains(&beta2), unit)?;
                check("eps", eps, eps > 0.0, "a finite number > 0")?;
                check("wd", weight_decay, weight_decay >= 0.0, "a finite number ≥ 0")
            }
        }
    }

    /// Floats of state per parameter element (memory accounting and
    /// [`State::new`]): AdamW keeps two moments, SGD one momentum buffer
    /// when it has momentum, none otherwise.
    pub fn state_slots(&self) -> usize {
        match *self {
            Optimizer::AdamW { .. } => 2,
            Optimizer::Sgd { momentum, .. } => usize::from(momentum != 0.0),
        }
    }

    /// The names of its state slots, in [`State`]'s order (PyTorch's names,
    /// so a checkpoint's tensors say what they hold).
    pub fn slot_names(&self) -> &'static [&'static str] {
        match *self {
            Optimizer::AdamW { .. } => &["exp_avg", "exp_avg_sq"],
            Optimizer::Sgd { momentum, .. } if momentum != 0.0 => &["momentum_buffer"],
            Optimizer::Sgd { .. } => &[],
        }
    }

    /// The same optimizer with weight decay off: what parameters for which
    /// [`decays`] is false are stepped with.
    pub fn without_decay(self) -> Self {
        match self {
            Optimizer::Sgd { lr, momentum, .. } => Optimizer::Sgd {
                lr,
                momentum,
                weight_decay: 0.0,
            },
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                ..
            } => Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay: 0.0,
            },
        }
    }

    /// AdamW's bias corrections and decay at update `step` (1-based);
    /// `None` for SGD, which has none.
    pub fn corrections(&self, step: u64) -> Option<Corrections> {
        match *self {
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                weight_decay,
                ..
            } => {
                let t = step as f64;
                Some(Corrections {
                    step_size: lr / (1.0 - beta1.powf(t)),
                    bc2_sqrt: (1.0 - beta2.powf(t)).sqrt(),
                    decay: 1.0 - lr * weight_decay,
                })
            }
            Optimizer::Sgd { .. } => None,
        }
    }

    /// Applies update number `step` (1-based) to an `f32` master copy.
    pub fn step_f32(
        &self,
        state: &mut State,
        step: u64,
        param: &mut [f32],
        grad: &[f32],
    ) -> Result<(), OptimError> {
        self.step(state, step, param, grad)
    }

    /// Applies update number `step` (1-based) to an `f64` master copy.
    pub fn step_f64(
        &self,
        state: &mut State,
        step: u64,
        param: &mut [f64],
        grad: &[f64],
    ) -> Result<(), OptimError> {
        self.step(state, step, param, grad)
    }

    /// The update, written once for both master precisions.
    fn step<T: Master>(
        &self,
        state: &mut State,
        step: u64,
        param: &mut [T],
        grad: &[T],
    ) -> Result<(), OptimError> {
        if step == 0 {
            return Err(OptimError::StepZero);
        }
        for (what, got) in [("gradient", grad.len()), ("optimizer state", state.len)] {
            if got != param.len() {
                return Err(OptimError::Length {
                    what,
                    want: param.len(),
                    got,
                });
            }
        }
        let state_precision = state.precision();
        let slots = T::slots(state).ok_or(OptimError::Precision {
            state: state_precision,
            param: T::PRECISION,
        })?;
        if slots.len() != self.state_slots() {
            return Err(OptimError::Slots {
                want: self.state_slots(),
                got: slots.len(),
            });
        }
        match *self {
            Optimizer::Sgd {
                lr,
                momentum,
                weight_decay,
            } => {
                let (lr, mu, wd) = (T::of(lr), T::of(momentum), T::of(weight_decay));
                let mut buf = slots.first_mut();
                for (i, (p, &g)) in param.iter_mut().zip(grad).enumerate() {
                    let mut d = if weight_decay != 0.0 { g + wd * *p } else { g };
                    if let Some(buf) = buf.as_mut() {
                        buf[i] = buf[i] * mu + d;
                        d = buf[i];
                    }
                    *p = *p - lr * d;
                }
            }
            Optimizer::AdamW {
                beta1, beta2, eps, ..
            } => {
                let Some(c) = self.corrections(step) else {
                    unreachable!("AdamW has corrections")
                };
                let (step_size, bc2_sqrt) = (T::of(c.step_size), T::of(c.bc2_sqrt));
                let (decay, b2, eps) = (T::of(c.decay), T::of(beta2), T::of(eps));
                let (w1, w2) = (1.0 - beta1, T::of(1.0 - beta2));
                let [m, v] = slots else {
                    unreachable!("slot count checked above")
                };
                for (((p, &g), m), v) in param.iter_mut().zip(grad).zip(m.iter_mut()).zip(v.iter_mut()) {
                    *p = *p * decay;
                    *m = lerp(*m, g, w1);
                    *v = *v * b2 + w2 * g * g;
                    let denom = v.sqrt() / bc2_sqrt + eps;
                    *p = *p - step_size * *m / denom;
                }
            }
        }
        Ok(())
    }
}

/// `a + w·(b − a)`, in PyTorch's two-sided form (exact at both ends).
fn lerp<T: Master>(a: T, b: T, w: f64) -> T {
    if w.abs() < 0.5 {
        a + T::of(w) * (b - a)
    } else {
        b - (b - a) * T::of(1.0 - w)
    }
}

/// Optimizer state for one parameter, or one shard of it: `state_slots`
/// buffers of `len` floats. It is kept in the master copy's precision (f32
/// or f64) whatever type the weights are computed in, so mixed-precision
/// training keeps full-precision moments.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    len: usize,
    slots: Slots,
}

/// The state buffers, in one precision.
#[derive(Debug, Clone, PartialEq)]
enum Slots {
    F32(Vec<Vec<f32>>),
    F64(Vec<Vec<f64>>),
}

impl State {
    /// Zeroed state for `len` elements stepped by `optimizer`, in `precision`.
    pub fn new(optimizer: &Optimizer, len: usize, precision: Precision) -> State {
        let n = optimizer.state_slots();
        let slots = match precision {
            Precision::F32 => Slots::F32(vec![vec![0.0; len]; n]),
            Precision::F64 => Slots::F64(vec![vec![0.0; len]; n]),
        };
        State { len, slots }
    }

    /// Parameter elements this state covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it covers no elements (an empty shard).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The precision it is kept in.
    pub fn precision(&self) -> Precision {
        match self.slots {
            Slots::F32(_) => Precision::F32,
            Slots::F64(_) => Precision::F64,
        }
    }

    /// Its slots as flat host values (a checkpoint's).
    pub fn to_values(&self) -> Vec<Value> {
        let values: Vec<Result<Value, _>> = match &self.slots {
            Slots::F32(s) => s.iter().map(|v| Value::f32(vec![self.len], v.clone())).collect(),
            Slots::F64(s) => s.iter().map(|v| Value::f64(vec![self.len], v.clone())).collect(),
        };
        values
            .into_iter()
            .map(|v| v.expect("a slot holds len elements"))
            .collect()
    }

    /// The state holding `slots` (as [`State::to_values`] gave them) for
    /// `optimizer`, in `precision`; `None` where they do not fit: another
    /// slot count, unequal lengths, or another precision.
    pub fn from_values(optimizer: &Optimizer, slots: &[Value], precision: Precision) -> Option<State> {
        let len = slots.first().map_or(0, Value::numel);
        if slots.len() != optimizer.state_slots() || slots.iter().any(|v| v.numel() != len) {
            return None;
        }
        let slots = match precision {
            Precision::F32 => Slots::F32(
                slots
                    .iter()
                    .map(|v| match &v.data {
                        Data::F32(d) => Some(d.clone()),
                        _ => None,
                    })
                    .collect::<Option<_>>()?,
            ),
            Precision::F64 => Slots::F64(
                slots
                    .iter()
                    .map(|v| match &v.data {
                        Data::F64(d) => Some(d.clone()),
                        _ => None,
                    })
                    .collect::<Option<_>>()?,
            ),
        };
        Some(State { len, slots })
    }

    /// Bytes it occupies (memory checks against the cost model).
    pub fn bytes(&self) -> usize {
        match &self.slots {
            Slots::F32(s) => s.len() * self.len * 4,
            Slots::F64(s) => s.len() * self.len * 8,
        }
    }
}

/// A master-copy float type: the arithmetic the updates need and access to
/// the state buffers of its precision.
trait Master: Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> {
    const PRECISION: Precision;
    fn of(x: f64) -> Self;
    fn sqrt(self) -> Self;
    fn slots(state: &mut State) -> Option<&mut [Vec<Self>]>;
}

impl Master for f32 {
    const PRECISION: Precision = Precision::F32;
    fn of(x: f64) -> Self {
        x as f32
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn slots(state: &mut State) -> Option<&mut [Vec<Self>]> {
        match &mut state.slots {
            Slots::F32(s) => Some(s),
            Slots::F64(_) => None,
        }
    }
}

impl Master for f64 {
    const PRECISION: Precision = Precision::F64;
    fn of(x: f64) -> Self {
        x
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn slots(state: &mut State) -> Option<&mut [Vec<Self>]> {
        match &mut state.slots {
            Slots::F64(s) => Some(s),
            Slots::F32(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps a one-element f64 parameter through `grads`, returning it after each step.
    fn trajectory(opt: Optimizer, p0: f64, grads: &[f64]) -> Vec<f64> {
        let mut state = State::new(&opt, 1, Precision::F64);
        let mut p = [p0];
        (1..)
            .zip(grads)
            .map(|(t, &g)| {
                opt.step_f64(&mut state, t, &mut p, &[g]).unwrap();
                p[0]
            })
            .collect()
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn adamw_matches_hand_computed_steps() {
        let opt = Optimizer::AdamW {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        // Step 1: p = 1·(1 − 0.01) = 0.99; m̂ = 0.5, v̂ = 0.25;
        //         p −= 0.1 · 0.5 / (0.5 + 1e-8) → 0.890000002.
        // Step 2: p = 0.890000002·0.99; m = 0.02, v = 0.00031225;
        //         m̂ = 0.02/0.19, v̂ = 0.00031225/0.001999 → 0.8544662986878463.
        assert_close(
            &trajectory(opt, 1.0, &[0.5, -0.25]),
            &[0.890000002, 0.8544662986878463],
        );
    }

    #[test]
    fn sgd_matches_hand_computed_steps() {
        let opt = Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.01,
        };
        // Step 1: d = 0.5 + 0.01 = 0.51, buf = 0.51, p = 1 − 0.051.
        // Step 2: d = −0.25 + 0.00949, buf = 0.459 − 0.24051 = 0.21849, p = 0.949 − 0.021849.
        assert_close(&trajectory(opt, 1.0, &[0.5, -0.25]), &[0.949, 0.927151]);
        assert_close(&trajectory(Optimizer::sgd(0.5), 1.0, &[0.5, 0.5]), &[0.75, 0.5]);
    }

    #[test]
    fn stepping_halves_equals_stepping_the_whole_bitwise() {
        let n = 37;
        let param0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let grads: Vec<Vec<f32>> = (0..3)
            .map(|t| (0..n).map(|i| ((i * 7 + t) as f32 * 0.11).cos()).collect())
            .collect();
        let momentum = Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.01,
        };
        for opt in [Optimizer::adamw(0.01), momentum] {
            let mut whole = param0.clone();
            let mut whole_state = State::new(&opt, n, Precision::F32);
            let cut = 16;
            let mut halves = param0.clone();
            let (lo, hi) = halves.split_at_mut(cut);
            let mut lo_state = State::new(&opt, cut, Precision::F32);
            let mut hi_state = State::new(&opt, n - cut, Precision::F32);
            for (t, g) in (1..).zip(&grads) {
                opt.step_f32(&mut whole_state, t, &mut whole, g).unwrap();
                opt.step_f32(&mut lo_state, t, lo, &g[..cut]).unwrap();
                opt.step_f32(&mut hi_state, t, hi, &g[cut..]).unwrap();
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&whole), bits(&halves), "{opt:?}");
            assert_ne!(whole, param0, "{opt:?} moved nothing");
        }
    }

    #[test]
    fn specs_parse_with_overrides() {
        assert_eq!(Optimizer::parse("adamw"), Ok(Optimizer::adamw(DEFAULT_ADAMW_LR)));
        assert_eq!(Optimizer::parse("sgd"), Ok(Optimizer::sgd(DEFAULT_SGD_LR)));
        assert_eq!(
            Optimizer::parse("adamw:lr=3e-4, wd=0"),
            Ok(Optimizer::adamw(3e-4).without_decay())
        );
        assert_eq!(
            Optimizer::parse("sgd:momentum=0.9"),
            Ok(Optimizer::Sgd {
                lr: DEFAULT_SGD_LR,
                momentum: 0.9,
                weight_decay: 0.0
            })
        );
    }

    #[test]
    fn manifests_record_the_kind_and_every_hyperparameter() {
        let json = serde_json::to_string(&Optimizer::sgd(0.5)).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"sgd","lr":0.5,"momentum":0.0,"weight_decay":0.0}"#
        );
        let adamw = Optimizer::adamw(3e-4);
        assert_eq!(
            serde_json::from_str::<Optimizer>(&serde_json::to_string(&adamw).unwrap()).unwrap(),
            adamw
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let message = |s: &str| Optimizer::parse(s).unwrap_err().to_string();
        assert_eq!(
            message("adam"),
            "unknown optimizer 'adam' (expected adamw or sgd)"
        );
        assert_eq!(
            message("sgd:beta1=0.9"),
            "optimizer spec 'sgd:beta1=0.9': no key 'beta1' for sgd"
        );
        assert_eq!(
            message("adamw:lr"),
            "optimizer spec 'adamw:lr': 'lr' is not key=value"
        );
        assert_eq!(
            message("adamw:lr=x"),
            "optimizer spec 'adamw:lr=x': 'x' is not a number"
        );
        assert_eq!(
            message("adamw:beta2=1"),
            "optimizer spec 'adamw:beta2=1': beta2 = 1 is out of range (in [0, 1))"
        );
    }

    #[test]
    fn state_slots_and_bytes() {
        let momentum = Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
        };
        assert_eq!(Optimizer::adamw(1e-3).state_slots(), 2);
        assert_eq!(momentum.state_slots(), 1);
        assert_eq!(Optimizer::sgd(0.1).state_slots(), 0);
        assert_eq!(
            State::new(&Optimizer::adamw(1e-3), 10, Precision::F32).bytes(),
            80
        );
        assert_eq!(State::new(&momentum, 10, Precision::F64).bytes(), 80);
        assert!(decays(2) && !decays(1) && !decays(0));
    }

    #[test]
    fn mismatched_steps_are_errors() {
        let opt = Optimizer::adamw(1e-3);
        let mut state = State::new(&opt, 2, Precision::F32);
        let mut p = [0.0f32; 2];
        assert_eq!(
            opt.step_f32(&mut state, 0, &mut p, &[0.0; 2]),
            Err(OptimError::StepZero)
        );
        assert_eq!(
            opt.step_f32(&mut state, 1, &mut p, &[0.0; 3]),
            Err(OptimError::Length {
                what: "gradient",
                want: 2,
                got: 3
            })
        );
        assert_eq!(
            opt.step_f64(&mut state, 1, &mut [0.0; 2], &[0.0; 2]),
            Err(OptimError::Precision {
                state: Precision::F32,
                param: Precision::F64
            })
        );
        let mut sgd_state = State::new(&Optimizer::sgd(0.1), 2, Precision::F32);
        assert_eq!(
            opt.step_f32(&mut sgd_state, 1, &mut p, &[0.0; 2]),
            Err(OptimError::Slots { want: 2, got: 0 })
        );
    }

    #[test]
    fn adamw_corrections_follow_the_step_and_sgd_has_none() {
        let opt = Optimizer::AdamW {
            lr: 0.5,
            beta1: 0.5,
            beta2: 0.75,
            eps: 1e-8,
            weight_decay: 0.5,
        };
        let table: Vec<(f64, f64, f64)> = [1, 2]
            .iter()
            .map(|&t| {
                opt.corrections(t)
                    .map(|c| (c.step_size, c.bc2_sqrt, c.decay))
                    .unwrap()
            })
            .collect();
        assert_eq!(table, [(1.0, 0.5, 0.75), (0.5 / 0.75, 0.4375f64.sqrt(), 0.75)]);
        assert_eq!(Optimizer::sgd(0.1).corrections(1), None);
    }
}

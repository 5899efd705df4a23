//! `ActivationGrad(x, dout)` → `dx = dout · act'(x)`: the adjoint of `Gelu`
//! (exact or tanh) and `Silu`, one element-wise pass where the composed
//! derivative takes eight to fifteen, each over the widest activations of
//! a transformer layer (the MLP's hidden width).

use super::super::adjoint::check_grad_like;
use super::super::context::{EvalCtx, InferCtx};
use super::super::elementwise::infer_activation;
use super::super::geometry::numel;
use super::super::numeric::{zip_map_v, Real};
use super::super::{Activation, OpError, TensorType};
use super::kernel::{gelu_tanh_arg, sigmoid};

/// FLOPs per element: the derivative (a transcendental and a few products)
/// and the product with `dout`.
const ACTIVATION_GRAD_FLOPS: f64 = 10.0;

/// The derivative of an activation function at `x`.
#[inline(always)]
pub(crate) fn derivative<T: Real>(act: Activation, x: T) -> T {
    let half = T::lit(0.5);
    match act {
        Activation::Silu => {
            let s = sigmoid(x);
            s * (T::one() + x * (T::one() - s))
        }
        Activation::Relu if x > T::zero() => T::one(),
        Activation::Relu => T::zero(),
        Activation::Gelu => {
            let cdf = half * (T::one() + (x * T::lit(std::f64::consts::FRAC_1_SQRT_2)).erf());
            let pdf = (-half * x * x).exp_v() * T::lit(1.0 / (2.0 * std::f64::consts::PI).sqrt());
            cdf + x * pdf
        }
        // With s = ½(1 + tanh u) = σ(2u): s + x·2s(1 − s)·u'(x).
        Activation::GeluTanh => {
            let (c, a) = (T::lit((2.0 / std::f64::consts::PI).sqrt()), T::lit(0.044715));
            let s = sigmoid(T::lit(2.0) * gelu_tanh_arg(x));
            s + T::lit(2.0) * x * s * (T::one() - s) * c * (T::one() + T::lit(3.0) * a * x * x)
        }
    }
}

/// Type of `dx`: `x`'s, after checking `dout` against it.
pub(super) fn infer(cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
    cx.arity(2, 2)?;
    let forward = [cx.opt(0)];
    let out = infer_activation(&InferCtx {
        op: cx.op,
        inputs: &forward,
    })?;
    check_grad_like(cx, 1, &out[0])?;
    Ok(out)
}

/// Reference kernel: `[dx]`.
pub(super) fn kernel<T: Real>(cx: &EvalCtx, act: Activation) -> Result<Vec<Vec<T>>, OpError> {
    let (x, dout) = (cx.floats::<T>(0)?, cx.floats::<T>(1)?);
    // The function chosen once outside the loop, so each loop is small
    // enough to inline and vectorize.
    let grads = match act {
        Activation::Silu => zip_map_v(x, dout, cx.row_ways, |v, d| d * derivative(Activation::Silu, v)),
        Activation::Relu => zip_map_v(x, dout, cx.row_ways, |v, d| d * derivative(Activation::Relu, v)),
        Activation::Gelu => zip_map_v(x, dout, cx.row_ways, |v, d| d * derivative(Activation::Gelu, v)),
        Activation::GeluTanh => zip_map_v(x, dout, cx.row_ways, |v, d| {
            d * derivative(Activation::GeluTanh, v)
        }),
    };
    Ok(vec![grads])
}

/// FLOPs of `ActivationGrad` over `x`.
pub(super) fn flops(x: Option<&TensorType>) -> f64 {
    x.map_or(0.0, numel) * ACTIVATION_GRAD_FLOPS
}

#[cfg(test)]
mod tests {
    use super::super::super::testing::{assert_close, eval, f32s, infer, ty};
    use super::super::super::Op;
    use super::super::kernel::activate;
    use super::{derivative, Activation};
    use crate::DType;

    const ALL: [Activation; 4] = [
        Activation::Silu,
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Relu,
    ];

    #[test]
    fn derivatives_match_differences() {
        for act in ALL {
            for x in [-2.5f64, -0.3, 0.4, 1.7] {
                let eps = 1e-6;
                let want = (activate(act, x + eps) - activate(act, x - eps)) / (2.0 * eps);
                assert!((derivative(act, x) - want).abs() < 1e-8, "{act:?} at {x}");
            }
        }
    }

    #[test]
    fn dx_is_dout_times_the_derivative() {
        let x = f32s(&[2, 2], &[-1.5, -0.2, 0.3, 2.0]);
        let dout = f32s(&[2, 2], &[1.0, -2.0, 0.5, 3.0]);
        for activation in ALL {
            let op = Op::ActivationGrad { activation };
            let got = eval(&op, &[&x, &dout]).unwrap()[0].to_f64_vec();
            let want: Vec<f64> = [(-1.5, 1.0), (-0.2, -2.0), (0.3, 0.5), (2.0, 3.0)]
                .iter()
                .map(|&(v, d): &(f32, f32)| (d * derivative(activation, v)) as f64)
                .collect();
            assert_close(&got, &want, 1e-6);
        }
        let op = Op::ActivationGrad {
            activation: Activation::Silu,
        };
        let x = ty(DType::F32, "b 8");
        assert_eq!(infer(&op, &[x.clone(), x.clone()]).unwrap(), vec![x.clone()]);
        let wrong = infer(&op, &[x, ty(DType::F64, "b 8")]);
        assert!(wrong.unwrap_err().to_string().contains("output gradient"));
    }
}

//! Finite-difference checks of backward rules: a one-op graph whose float
//! inputs are parameters, differentiated and run in f64, against central
//! differences of `L = Σ output · C`.

use super::differentiate;
use crate::{Graph, InferInput, Op, Role, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Runs `graph` on `feeds` through the reference interpreter; the graphs
/// checked here are f64 throughout, so `Precision::F32` widens nothing.
pub fn run(graph: &Graph, feeds: &BTreeMap<String, Value>) -> Vec<Value> {
    crate::interp::run(graph, feeds, crate::interp::Precision::F32).unwrap_or_else(|e| panic!("{e}"))
}

/// Deterministic pseudo-random numbers in [-1, 1).
pub fn noise(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// An f64 tensor of `shape` filled with [`noise`].
pub fn random(shape: &[usize], seed: u64) -> Value {
    let n = shape.iter().product();
    Value::f64(shape.to_vec(), noise(n, seed)).expect("shape matches data")
}

/// The graph `op(inputs)`: float inputs are parameters, others and those
/// listed in `constants` are constants.
/// A graph of `op` alone on `inputs`, whose `constants` get no gradient.
pub fn one_op(op: &Op, inputs: &[Option<Value>], constants: &[usize]) -> Graph {
    let mut g = Graph::new("check");
    let ids: Vec<Option<crate::TensorId>> = inputs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_ref().map(|v| {
                let ty = crate::TensorType {
                    dtype: v.dtype,
                    shape: crate::Shape::fixed(&v.shape),
                };
                let role = if v.dtype.is_float() && !constants.contains(&i) {
                    Role::Parameter
                } else {
                    Role::Constant
                };
                g.add_tensor(format!("in{i}"), ty, role, Some(Arc::new(v.clone())))
            })
        })
        .collect();
    let infer: Vec<Option<InferInput>> = inputs
        .iter()
        .zip(&ids)
        .map(|(v, id)| {
            v.as_ref().zip(*id).map(|(v, id)| InferInput {
                ty: &g.tensor(id).ty,
                value: Some(v),
            })
        })
        .collect();
    let types = op.infer(&infer).expect("the op accepts the inputs");
    let outs: Vec<_> = types
        .into_iter()
        .enumerate()
        .map(|(i, ty)| g.add_tensor(format!("out{i}"), ty, Role::Activation, None))
        .collect();
    g.add_node("op", op.clone(), ids, outs.clone())
        .expect("valid node");
    g.outputs = outs
        .into_iter()
        .filter(|&o| g.tensor(o).ty.dtype.is_float())
        .collect();
    g
}

/// `Σ outputs · C` of `graph` with parameter `which` replaced by `value`.
fn loss(graph: &Graph, cotangents: &[Vec<f64>], which: &str, value: &Value) -> f64 {
    let mut g = graph.clone();
    let id = g
        .tensors()
        .find(|(_, t)| t.name == which)
        .map(|(id, _)| id)
        .expect("parameter exists");
    g.tensor_mut(id).data = Some(Arc::new(value.clone()));
    let outs = run(&g, &BTreeMap::new());
    outs.iter()
        .zip(cotangents)
        .map(|(o, c)| o.to_f64_vec().iter().zip(c).map(|(a, b)| a * b).sum::<f64>())
        .sum()
}

/// Checks every float input's gradient of `op` at `inputs` against central
/// differences (relative error ≤ `tol`, relative to the largest gradient).
pub fn check_op(op: &Op, inputs: &[Option<Value>], tol: f64) {
    check_op_with_constants(op, inputs, &[], tol);
}

/// [`check_op`] with the float inputs listed in `constants` held constant
/// (masks, rotary caches): they get no gradient and are not checked.
pub fn check_op_with_constants(op: &Op, inputs: &[Option<Value>], constants: &[usize], tol: f64) {
    let graph = one_op(op, inputs, constants);
    let d = differentiate(&graph).expect("differentiates");
    let cotangents: Vec<Vec<f64>> = graph
        .outputs
        .iter()
        .enumerate()
        .map(|(i, &o)| {
            let n = graph
                .tensor(o)
                .ty
                .shape
                .as_fixed()
                .expect("fixed")
                .iter()
                .product();
            noise(n, 1000 + i as u64)
        })
        .collect();
    let mut feeds = BTreeMap::new();
    for ((out, name), c) in d.cotangents.iter().zip(&cotangents) {
        let o = graph
            .outputs
            .iter()
            .find(|&&t| graph.tensor(t).name == *out)
            .expect("output");
        let shape = graph.tensor(*o).ty.shape.as_fixed().expect("fixed");
        feeds.insert(name.clone(), Value::f64(shape, c.clone()).expect("shape"));
    }
    let outs = run(&d.graph, &feeds);
    let grads = super::gradients_by_name(&d, &outs);
    for (i, v) in inputs.iter().enumerate() {
        let Some(v) = v
            .as_ref()
            .filter(|v| v.dtype.is_float() && !constants.contains(&i))
        else {
            continue;
        };
        let name = format!("in{i}");
        let got = grads
            .get(&name)
            .unwrap_or_else(|| panic!("no gradient for input {i}"))
            .to_f64_vec();
        let base = v.to_f64_vec();
        let eps = 1e-6;
        let mut want = vec![0.0; base.len()];
        for (k, w) in want.iter_mut().enumerate() {
            let mut plus = base.clone();
            plus[k] += eps;
            let mut minus = base.clone();
            minus[k] -= eps;
            let p = Value::f64(v.shape.clone(), plus).expect("shape");
            let m = Value::f64(v.shape.clone(), minus).expect("shape");
            *w = (loss(&graph, &cotangents, &name, &p) - loss(&graph, &cotangents, &name, &m)) / (2.0 * eps);
        }
        let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs())).max(1e-12);
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f64, |a, (g, w)| a.max((g - w).abs()))
            / scale;
        assert!(
            err <= tol,
            "{}: input {i}: relative error {err:e}\n got {got:?}\nwant {want:?}",
            op.name()
        );
    }
}

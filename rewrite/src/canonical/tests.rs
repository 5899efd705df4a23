//! Hand-built exporter spellings in, canonical ops out.

use super::{canonicalize, compute_histogram};
use autopar_ir::op::{BinaryOp, GeluApprox, Op, ReduceKind, TensorType, UnaryOp};
use autopar_ir::{DType, Graph, Role, Shape, TensorId, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A graph under construction; every node's output type is inferred.
struct Build(Graph);

impl Build {
    fn new() -> Build {
        Build(Graph::new("t"))
    }

    fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> TensorId {
        let ty = TensorType {
            dtype,
            shape: Shape::fixed(shape),
        };
        let t = self.0.add_tensor(name, ty, Role::Input, None);
        self.0.inputs.push(t);
        t
    }

    fn param(&mut self, name: &str, shape: &[usize]) -> TensorId {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0).collect();
        let v = Value::f32(shape.to_vec(), data).unwrap();
        let ty = TensorType {
            dtype: DType::F32,
            shape: Shape::fixed(shape),
        };
        self.0.add_tensor(name, ty, Role::Parameter, Some(Arc::new(v)))
    }

    fn scalar(&mut self, v: f32) -> TensorId {
        self.0
            .add_constant(format!("c{v}"), Value::f32(vec![], vec![v]).unwrap())
    }

    fn ints(&mut self, v: &[i64]) -> TensorId {
        self.0
            .add_constant("shape", Value::i64(vec![v.len()], v.to_vec()).unwrap())
    }

    fn op(&mut self, op: Op, inputs: &[TensorId]) -> TensorId {
        let n = self.0.node_count();
        let placeholder = TensorType {
            dtype: DType::F32,
            shape: Shape(vec![]),
        };
        let out = self
            .0
            .add_tensor(format!("t{n}"), placeholder, Role::Activation, None);
        let inputs = inputs.iter().map(|&t| Some(t)).collect();
        let idx = self.0.add_node(format!("n{n}"), op, inputs, vec![out]).unwrap();
        let ty = self.0.infer_node(idx).unwrap().remove(0);
        self.0.tensor_mut(out).ty = ty;
        out
    }

    fn bin(&mut self, func: BinaryOp, a: TensorId, b: TensorId) -> TensorId {
        self.op(Op::Binary { func }, &[a, b])
    }

    fn un(&mut self, func: UnaryOp, a: TensorId) -> TensorId {
        self.op(Op::Unary { func }, &[a])
    }

    /// Canonicalises with `out` as the only output; returns the compute
    /// histogram and the rewritten graph.
    fn canon(mut self, out: TensorId) -> (BTreeMap<String, usize>, Graph) {
        self.0.outputs = vec![out];
        self.0.validate().unwrap();
        let (g, report) = canonicalize(&self.0).unwrap();
        assert_eq!(report.stop_reason, "Saturated");
        (compute_histogram(&g), g)
    }
}

fn hist(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

#[test]
fn matmul_plus_bias_becomes_linear() {
    let mut b = Build::new();
    let x = b.input("x", DType::F32, &[2, 3, 4]);
    let w = b.param("w", &[4, 5]);
    let bias = b.param("b", &[5]);
    let mm = b.op(Op::MatMul, &[x, w]);
    let y = b.bin(BinaryOp::Add, bias, mm);
    let (h, g) = b.canon(y);
    assert_eq!(h, hist(&[("Linear", 1)]));
    assert_eq!(g.node_count(), 1);
}

#[test]
fn flattened_gemm_with_transposed_weight_becomes_one_linear_and_a_weight_transpose() {
    let mut b = Build::new();
    let x = b.input("x", DType::F32, &[2, 3, 4]);
    let w = b.param("w", &[5, 4]);
    let bias = b.param("b", &[5]);
    let flat_shape = b.ints(&[-1, 4]);
    let flat = b.op(Op::Reshape { allowzero: false }, &[x, flat_shape]);
    let gemm = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    let y2 = b.op(gemm, &[flat, w, bias]);
    let back = b.ints(&[2, 3, 5]);
    let y = b.op(Op::Reshape { allowzero: false }, &[y2, back]);
    let (h, g) = b.canon(y);
    assert_eq!(h, hist(&[("Linear", 1)]));
    assert_eq!(g.op_histogram(), hist(&[("Linear", 1), ("Transpose", 1)]));
}

#[test]
fn erf_and_tanh_gelu_spellings_are_recognised() {
    let mut b = Build::new();
    let x = b.input("x", DType::F32, &[2, 8]);
    // TorchScript: ((x · (erf(x / √2) + 1)) · 0.5)
    let r2 = b.scalar(std::f32::consts::SQRT_2);
    let one = b.scalar(1.0);
    let half = b.scalar(0.5);
    let d = b.bin(BinaryOp::Div, x, r2);
    let e = b.un(UnaryOp::Erf, d);
    let e1 = b.bin(BinaryOp::Add, e, one);
    let xe = b.bin(BinaryOp::Mul, x, e1);
    let g1 = b.bin(BinaryOp::Mul, xe, half);
    // tanh form on the result: (g·0.5) · (1 + tanh(√(2/π)·(g + 0.044715·g³)))
    let three = b.scalar(3.0);
    let c = b.scalar(0.044715);
    let k = b.scalar((2.0f32 / std::f32::consts::PI).sqrt());
    let gh = b.bin(BinaryOp::Mul, g1, half);
    let cube = b.bin(BinaryOp::Pow, g1, three);
    let cc = b.bin(BinaryOp::Mul, cube, c);
    let inner = b.bin(BinaryOp::Add, g1, cc);
    let scaled = b.bin(BinaryOp::Mul, inner, k);
    let th = b.un(UnaryOp::Tanh, scaled);
    let th1 = b.bin(BinaryOp::Add, th, one);
    let y = b.bin(BinaryOp::Mul, gh, th1);
    let (h, g) = b.canon(y);
    assert_eq!(h, hist(&[("Gelu", 2)]));
    let approx: Vec<_> = g
        .node_indices()
        .filter_map(|n| match g.node(n).op {
            Op::Gelu { approximate } => Some(approximate),
            _ => None,
        })
        .collect();
    assert_eq!(approx, vec![GeluApprox::None, GeluApprox::Tanh]);
}

#[test]
fn rms_norm_with_div_and_identity_casts() {
    let mut b = Build::new();
    let x = b.input("x", DType::F32, &[2, 3, 8]);
    let w = b.param("w", &[8]);
    let xc = b.op(Op::cast(DType::F32), &[x]);
    let two = b.scalar(2.0);
    let eps = b.scalar(1e-6);
    let one = b.scalar(1.0);
    let p = b.bin(BinaryOp::Pow, xc, two);
    let mean = Op::Reduce {
        kind: ReduceKind::Mean,
        axes: Some(vec![2]),
        keepdims: true,
        noop_with_empty_axes: false,
    };
    let m = b.op(mean, &[p]);
    let a = b.bin(BinaryOp::Add, m, eps);
    let s = b.un(UnaryOp::Sqrt, a);
    let r = b.bin(BinaryOp::Div, one, s);
    let n = b.bin(BinaryOp::Mul, xc, r);
    let nc = b.op(Op::cast(DType::F32), &[n]);
    let y = b.bin(BinaryOp::Mul, w, nc);
    let (h, g) = b.canon(y);
    assert_eq!(h, hist(&[("RmsNorm", 1)]));
    assert_eq!(g.node_count(), 1);
}

#[test]
fn silu_and_embedding() {
    let mut b = Build::new();
    let ids = b.input("ids", DType::I64, &[2, 3]);
    let table = b.param("table", &[10, 4]);
    let e = b.op(Op::Gather { axis: 0 }, &[table, ids]);
    let sg = b.un(UnaryOp::Sigmoid, e);
    let y = b.bin(BinaryOp::Mul, sg, e);
    let (h, _) = b.canon(y);
    assert_eq!(h, hist(&[("Embedding", 1), ("Silu", 1)]));
}

#[test]
fn transposes_compose_and_identities_vanish() {
    let mut b = Build::new();
    let x = b.input("x", DType::F32, &[2, 3, 4]);
    let t1 = b.op(
        Op::Transpose {
            perm: Some(vec![1, 2, 0]),
        },
        &[x],
    );
    let t2 = b.op(
        Op::Transpose {
            perm: Some(vec![0, 2, 1]),
        },
        &[t1],
    );
    let t3 = b.op(
        Op::Transpose {
            perm: Some(vec![1, 0, 2]),
        },
        &[t2],
    );
    let s = b.ints(&[6, 4]);
    let r1 = b.op(Op::Reshape { allowzero: false }, &[t3, s]);
    let s2 = b.ints(&[24]);
    let y = b.op(Op::Reshape { allowzero: false }, &[r1, s2]);
    let (_, g) = b.canon(y);
    assert_eq!(g.op_histogram(), hist(&[("Reshape", 1)]));
}

#[test]
fn attention_chain_becomes_one_op_with_its_mask() {
    let mut b = Build::new();
    let q = b.input("q", DType::F32, &[1, 2, 4, 8]);
    let k = b.input("k", DType::F32, &[1, 4, 2, 8]); // [b, s, h, d]
    let v = b.input("v", DType::F32, &[1, 2, 4, 8]);
    let mask = b.input("mask", DType::F32, &[1, 1, 4, 4]);
    let kt = b.op(
        Op::Transpose {
            perm: Some(vec![0, 2, 3, 1]),
        },
        &[k],
    );
    let scores = b.op(Op::MatMul, &[q, kt]);
    let sc = b.scalar(0.125);
    let scaled = b.bin(BinaryOp::Mul, scores, sc);
    let masked = b.bin(BinaryOp::Add, scaled, mask);
    let p = b.op(Op::Softmax { axis: 3 }, &[masked]);
    let y = b.op(Op::MatMul, &[p, v]);
    let (h, g) = b.canon(y);
    assert_eq!(h, hist(&[("Attention", 1)]));
    assert_eq!(g.op_histogram(), hist(&[("Attention", 1), ("Transpose", 1)]));
    let att = g
        .node_indices()
        .find(|&n| g.node(n).op.name() == "Attention")
        .unwrap();
    assert_eq!(
        g.node(att).op,
        Op::Attention {
            scale: Some(0.125),
            causal: false
        }
    );
    let tr = g
        .node_indices()
        .find(|&n| g.node(n).op.name() == "Transpose")
        .unwrap();
    assert_eq!(
        g.node(tr).op,
        Op::Transpose {
            perm: Some(vec![0, 2, 1, 3])
        }
    );
}

#[test]
fn expanded_layer_norm_becomes_layer_norm() {
    let mut b = Build::new();
    let x = b.input("x", DType::F32, &[2, 8]);
    let w = b.param("w", &[8]);
    let bias = b.param("b", &[8]);
    let two = b.scalar(2.0);
    let eps = b.scalar(1e-5);
    let mean = Op::Reduce {
        kind: ReduceKind::Mean,
        axes: Some(vec![-1]),
        keepdims: true,
        noop_with_empty_axes: false,
    };
    let mu = b.op(mean.clone(), &[x]);
    let d = b.bin(BinaryOp::Sub, x, mu);
    let sq = b.bin(BinaryOp::Pow, d, two);
    let var = b.op(mean, &[sq]);
    let ve = b.bin(BinaryOp::Add, var, eps);
    let sd = b.un(UnaryOp::Sqrt, ve);
    let n = b.bin(BinaryOp::Div, d, sd);
    let nw = b.bin(BinaryOp::Mul, n, w);
    let y = b.bin(BinaryOp::Add, nw, bias);
    let (_, g) = b.canon(y);
    assert_eq!(g.op_histogram(), hist(&[("LayerNorm", 1)]));
}

#[test]
fn where_keep_mask_attention_passes_the_boolean_mask() {
    let mut b = Build::new();
    let q = b.input("q", DType::F32, &[1, 2, 4, 8]);
    let kt = b.input("kt", DType::F32, &[1, 2, 8, 4]);
    let v = b.input("v", DType::F32, &[1, 2, 4, 8]);
    let keep = b.input("keep", DType::Bool, &[1, 1, 4, 4]);
    let lowest = b.scalar(f32::MIN);
    let scores = b.op(Op::MatMul, &[q, kt]);
    let masked = b.op(Op::Where, &[keep, scores, lowest]);
    let p = b.op(Op::Softmax { axis: -1 }, &[masked]);
    let y = b.op(Op::MatMul, &[p, v]);
    let (_, g) = b.canon(y);
    assert_eq!(g.op_histogram(), hist(&[("Attention", 1), ("Transpose", 1)]));
    let att = g
        .node_indices()
        .find(|&n| g.node(n).op.name() == "Attention")
        .unwrap();
    let mask = g.node(att).inputs[3].unwrap();
    assert_eq!(g.tensor(mask).name, "keep");
    assert_eq!(
        g.node(att).op,
        Op::Attention {
            scale: Some(1.0),
            causal: false
        }
    );
}

#[test]
fn softmax_topk_renormalise_becomes_moe_router() {
    let mut b = Build::new();
    let logits = b.input("logits", DType::F32, &[6, 4]);
    let k = b.0.add_constant("k", Value::i64(vec![1], vec![2]).unwrap());
    let p = b.op(Op::Softmax { axis: 1 }, &[logits]);
    let topk = Op::TopK {
        axis: -1,
        largest: true,
        sorted: true,
    };
    let ty = |dtype| TensorType {
        dtype,
        shape: Shape::fixed(&[6, 2]),
    };
    let vals = b.0.add_tensor("vals", ty(DType::F32), Role::Activation, None);
    let idx = b.0.add_tensor("idx", ty(DType::I64), Role::Activation, None);
    b.0.add_node("topk", topk, vec![Some(p), Some(k)], vec![vals, idx])
        .unwrap();
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: Some(vec![1]),
        keepdims: true,
        noop_with_empty_axes: false,
    };
    let total = b.op(sum, &[vals]);
    let weights = b.bin(BinaryOp::Div, vals, total);
    b.0.outputs = vec![weights, idx];
    let (g, _) = canonicalize(&b.0).unwrap();
    assert_eq!(g.op_histogram(), hist(&[("MoeRouter", 1)]));
    let router = g.node_indices().next().unwrap();
    assert_eq!(g.node(router).op, Op::MoeRouter { top_k: 2 });
    assert_eq!(g.outputs, g.node(router).outputs);
}

#[test]
fn reshape_with_copied_dims_is_not_folded_into_its_input() {
    let mut b = Build::new();
    let x = b.input("x", DType::F32, &[2, 3, 4]);
    let s1 = b.ints(&[6, 4]);
    let r1 = b.op(Op::Reshape { allowzero: false }, &[x, s1]);
    let s2 = b.ints(&[0, 2, 2]);
    let y = b.op(Op::Reshape { allowzero: false }, &[r1, s2]);
    let (_, g) = b.canon(y);
    assert_eq!(g.op_histogram(), hist(&[("Reshape", 2)]));
}

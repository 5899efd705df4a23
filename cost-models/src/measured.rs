//! Predicted time of one node on the CPU backend, from a calibration that
//! `autopar profile --backend cpu` wrote: what a simulator of CPU runs adds
//! up, and what the profiler fits its per-op rates against.

use crate::{Calibration, Device};
use autopar_ir::interp::{run_dtype, Precision};
use autopar_ir::op::copies_transposed_b;
use autopar_ir::{DType, Dim, GeluApprox, Graph, NodeIndex, Op, Shape, TensorId, TensorType, UnaryOp};

/// What a node's time is predicted from: the kernel it runs, the dtype the
/// kernel computes in, and its forward FLOPs and bytes read plus written
/// (from [`Op::cost`]) at the types the kernel sees in a run at `precision`
/// (an `f64` run widens `f32` tensors, so they count 8 bytes an element).
/// [`Calibration::measured_op_time`] takes these.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeWork {
    /// [`Op::name`], refined where the interpreter runs loops of very
    /// different speed under one op: for binary element-wise ops whose
    /// inputs are broadcast, ` (repeat)` when one input is cycled over the
    /// other (a scalar, or trailing dims) and ` (strided)` when elements are
    /// gathered through index tables; ` (last axis)` for reductions over
    /// the innermost axis, whose one running sum per output serialises the
    /// loop; ` (bias)` for `Linear` and `Gemm` with a bias, which is
    /// broadcast into the output before the product.
    pub kernel: String,
    pub dtype: DType,
    pub flops: f64,
    /// As [`Op::cost`] counts them, except for views (`Reshape`, `Squeeze`,
    /// `Unsqueeze`, `Flatten`), which cost no bytes on a device but which the
    /// interpreter copies: their input's bytes read and output's written.
    pub bytes: f64,
}

/// The work of node `idx` of `graph` (dims resolved through the graph's
/// bindings) in a run at `precision`. The compute dtype is that of the first
/// float input, else of the first float output, else of the first output
/// (integer and boolean ops).
pub fn node_work(graph: &Graph, idx: NodeIndex, precision: Precision) -> NodeWork {
    let node = graph.node(idx);
    let run_type = |t: TensorId| {
        let ty = resolved(graph, t);
        TensorType {
            dtype: run_dtype(ty.dtype, precision),
            shape: ty.shape,
        }
    };
    let inputs: Vec<Option<TensorType>> = node.inputs.iter().map(|t| t.map(run_type)).collect();
    let outputs: Vec<TensorType> = node.outputs.iter().map(|&t| run_type(t)).collect();
    let dtype = inputs
        .iter()
        .flatten()
        .chain(&outputs)
        .map(|t| t.dtype)
        .find(|d| d.is_float())
        .or_else(|| outputs.first().map(|t| t.dtype))
        .unwrap_or(DType::F32);
    let output_refs: Vec<&TensorType> = outputs.iter().collect();
    let is_view = matches!(
        node.op,
        Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. }
    );
    let cost = if is_view {
        let copy = Op::Unary {
            func: UnaryOp::Identity,
        };
        copy.cost(&[inputs.first().and_then(Option::as_ref)], &output_refs)
    } else {
        node.op.cost(
            &inputs.iter().map(Option::as_ref).collect::<Vec<_>>(),
            &output_refs,
        )
    };
    let mut kernel = node.op.name();
    match (&node.op, &inputs[..], outputs.first()) {
        (Op::Binary { .. }, [Some(a), Some(b), ..], Some(out)) => {
            kernel += broadcast_loop(&a.shape, &b.shape, &out.shape);
        }
        (Op::Linear | Op::Gemm { .. }, [_, _, Some(_), ..], _) => kernel += " (bias)",
        (Op::ActivationGrad { activation }, _, _) => kernel += &format!(" ({activation:?})"),
        (
            Op::Gelu {
                approximate: GeluApprox::Tanh,
            },
            _,
            _,
        ) => kernel += " (tanh)",
        (Op::Reduce { axes, .. }, [Some(x), ..], _)
            if reduces_last_axis(graph, idx, axes.as_deref(), &x.shape) =>
        {
            kernel += " (last axis)";
        }
        _ => {}
    }
    NodeWork {
        kernel,
        dtype,
        flops: cost.forward_flops,
        bytes: cost.bytes_read + cost.bytes_written,
    }
}

/// `t`'s type with its dims bound where the graph binds them.
fn resolved(graph: &Graph, t: TensorId) -> TensorType {
    let ty = &graph.tensor(t).ty;
    let shape = ty
        .shape
        .resolve(&graph.bindings)
        .map_or_else(|| ty.shape.clone(), |dims| Shape::fixed(&dims));
    TensorType {
        dtype: ty.dtype,
        shape,
    }
}

/// Which loop the interpreter's binary kernels run for inputs of shapes `a`
/// and `b` broadcast to `out` (see [`NodeWork::kernel`]): the plain one when
/// both are `out`, ` (repeat)` when one is `out` and the other's dims
/// (leading ones stripped) are `out`'s trailing dims, else ` (strided)`.
fn broadcast_loop(a: &Shape, b: &Shape, out: &Shape) -> &'static str {
    let repeats = |s: &Shape| {
        let core = &s.0[s.0.iter().take_while(|d| **d == Dim::Fixed(1)).count()..];
        core.len() <= out.0.len() && core == &out.0[out.0.len() - core.len()..]
    };
    match (a == out, b == out) {
        (true, true) => "",
        (true, false) if repeats(b) => " (repeat)",
        (false, true) if repeats(a) => " (repeat)",
        _ => " (strided)",
    }
}

/// Whether reduction node `idx` (axes from its attribute `axes`, else its
/// constant second input, else all) sums over the last axis of its input
/// `x`, and that axis is longer than one.
fn reduces_last_axis(graph: &Graph, idx: NodeIndex, axes: Option<&[i64]>, x: &Shape) -> bool {
    let rank = x.0.len() as i64;
    if rank == 0 || x.0.last() == Some(&Dim::Fixed(1)) {
        return false;
    }
    let from_input = graph.node(idx).inputs.get(1).copied().flatten().map(|t| {
        let data = graph.tensor(t).data.as_ref();
        data.and_then(|v| v.as_i64().map(<[i64]>::to_vec))
            .unwrap_or_default()
    });
    match axes.map(<[i64]>::to_vec).or(from_input) {
        Some(axes) if !axes.is_empty() => axes.iter().any(|&a| a == -1 || a == rank - 1),
        _ => true,
    }
}

/// `[m, n, k]` of the GEMMs a matmul-family node runs (per batch entry or
/// expert), which the calibration's matmul grid is looked up at; `None` for
/// other ops.
pub fn gemm_shape(graph: &Graph, idx: NodeIndex) -> Option<[f64; 3]> {
    let node = graph.node(idx);
    let dims = |slot: usize| -> Option<Vec<f64>> {
        let t = node.inputs.get(slot).copied().flatten()?;
        let ty = resolved(graph, t);
        ty.shape
            .as_fixed()
            .map(|d| d.into_iter().map(|x| x as f64).collect())
    };
    let out: Vec<f64> = resolved(graph, *node.outputs.first()?)
        .shape
        .as_fixed()?
        .into_iter()
        .map(|x| x as f64)
        .collect();
    let a = dims(0)?;
    let n = *out.last()?;
    let rows = out.iter().product::<f64>() / n.max(1.0);
    match &node.op {
        Op::Linear => Some([rows, n, *a.last()?]),
        Op::MatMul => {
            // The rows of each product the kernel runs.
            let shape = |slot: usize| -> Option<Vec<usize>> {
                resolved(graph, node.inputs.get(slot).copied().flatten()?)
                    .shape
                    .as_fixed()
            };
            let m = autopar_ir::op::matmul_rows(&shape(0)?, &shape(1)?) as f64;
            Some([m, n, *a.last()?])
        }
        Op::Gemm { trans_a, .. } => Some([rows, n, if *trans_a { a[0] } else { *a.last()? }]),
        Op::MoeExperts { .. } | Op::MoeExpertsGrad { .. } => {
            let assignments: f64 = dims(2)?.iter().product();
            match dims(3)?[..] {
                [experts, hidden, ffn] => Some([assignments / experts.max(1.0), ffn, hidden]),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Ops the matmul grid prices (GEMMs, including the grouped expert GEMMs);
/// every other op gets a measured rate.
pub fn priced_as_matmul(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul | Op::Linear | Op::Gemm { .. } | Op::MoeExperts { .. } | Op::MoeExpertsGrad { .. }
    )
}

/// Seconds node `idx` of `graph` is predicted to take on the CPU backend
/// at `precision` (one `Op::eval`): the per-kernel overhead, plus for
/// GEMMs their FLOPs at the matmul grid's rate and any measured extra (a
/// broadcast bias), for other ops the measured rate of their kernel nearest
/// in size, or, for a kernel the profile never met, its bytes at streaming
/// bandwidth. `device` gives the peaks used where `cal` has no
/// measurements.
pub fn node_time(
    cal: &Calibration,
    device: &Device,
    graph: &Graph,
    idx: NodeIndex,
    precision: Precision,
) -> f64 {
    let w = node_work(graph, idx, precision);
    let measured = cal.measured_op_time(&w.kernel, w.dtype, w.flops, w.bytes);
    let compute = match gemm_shape(graph, idx) {
        Some(shape) => {
            let peak = device.matmul_peak(w.dtype).unwrap_or(0.0);
            let copy = transposed_b_copy(&graph.node(idx).op, w.dtype, shape);
            gemm_seconds(cal, peak, w.dtype, w.flops, shape)
                + measured.unwrap_or(0.0)
                + copy / cal.memory_rate(device.memory_bandwidth)
        }
        None => measured.unwrap_or_else(|| w.bytes / cal.memory_rate(device.memory_bandwidth)),
    };
    cal.kernel_overhead_s + compute
}

/// Bytes read and written copying the transposed `B` of a `[m, n, k]`
/// product row-major before it runs, where the kernel does
/// (`ir::op::copies_transposed_b`); 0 for any other product.
fn transposed_b_copy(op: &Op, dtype: DType, [m, n, k]: [f64; 3]) -> f64 {
    match op {
        Op::Gemm { trans_b: true, .. } if copies_transposed_b(m as usize, n as usize) => {
            2.0 * k * n * dtype.size_bits() as f64 / 8.0
        }
        _ => 0.0,
    }
}

/// `flops` of GEMMs of `[m, n, k]` at the calibration's rate (0 when it
/// has no rate).
pub fn gemm_seconds(cal: &Calibration, peak: f64, dtype: DType, flops: f64, [m, n, k]: [f64; 3]) -> f64 {
    let rate = cal.matmul_rate(peak, dtype, m, n, k);
    if rate > 0.0 {
        flops / rate
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::{MatmulSample, OpRate};
    use autopar_ir::{Activation, BinaryOp, Role};
    use std::collections::BTreeMap;

    fn tensor(g: &mut Graph, name: &str, dims: &[usize]) -> TensorId {
        let ty = TensorType {
            dtype: DType::F32,
            shape: Shape::fixed(dims),
        };
        g.add_tensor(name, ty, Role::Activation, None)
    }

    /// A graph with one node of `op` on inputs of `dims` producing `out`.
    fn single(op: Op, dims: &[&[usize]], out: &[usize]) -> (Graph, NodeIndex) {
        let mut g = Graph::new("g");
        let inputs = dims
            .iter()
            .enumerate()
            .map(|(i, d)| Some(tensor(&mut g, &format!("x{i}"), d)))
            .collect();
        let y = tensor(&mut g, "y", out);
        let idx = g.add_node("n", op, inputs, vec![y]).unwrap();
        (g, idx)
    }

    fn mul() -> Op {
        Op::Binary { func: BinaryOp::Mul }
    }

    #[test]
    fn node_work_counts_widened_bytes_and_the_compute_dtype() {
        let (g, idx) = single(Op::Unary { func: UnaryOp::Exp }, &[&[2, 3]], &[2, 3]);
        let expected = NodeWork {
            kernel: "Exp".into(),
            dtype: DType::F32,
            flops: 6.0,
            bytes: 48.0,
        };
        assert_eq!(node_work(&g, idx, Precision::F32), expected);
        let f64_work = node_work(&g, idx, Precision::F64);
        assert_eq!((f64_work.dtype, f64_work.bytes), (DType::F64, 96.0));
    }

    #[test]
    fn kernels_name_the_interpreters_loop() {
        let kernel = |op: Op, dims: &[&[usize]], out: &[usize]| {
            let (g, idx) = single(op, dims, out);
            node_work(&g, idx, Precision::F32).kernel
        };
        assert_eq!(kernel(mul(), &[&[4, 3], &[4, 3]], &[4, 3]), "Mul");
        assert_eq!(kernel(mul(), &[&[4, 3], &[]], &[4, 3]), "Mul (repeat)");
        assert_eq!(kernel(mul(), &[&[1, 3], &[4, 3]], &[4, 3]), "Mul (repeat)");
        assert_eq!(kernel(mul(), &[&[4, 3], &[4, 1]], &[4, 3]), "Mul (strided)");
        assert_eq!(kernel(mul(), &[&[4, 1], &[1, 3]], &[4, 3]), "Mul (strided)");
        assert_eq!(
            kernel(Op::Linear, &[&[4, 3], &[3, 2], &[2]], &[4, 2]),
            "Linear (bias)"
        );
        assert_eq!(kernel(Op::Linear, &[&[4, 3], &[3, 2]], &[4, 2]), "Linear");
        let sum = |axes: &[i64]| Op::Reduce {
            kind: autopar_ir::ReduceKind::Sum,
            axes: Some(axes.to_vec()),
            keepdims: true,
            noop_with_empty_axes: false,
        };
        assert_eq!(kernel(sum(&[-1]), &[&[4, 3]], &[4, 1]), "ReduceSum (last axis)");
        assert_eq!(kernel(sum(&[1]), &[&[4, 3]], &[4, 1]), "ReduceSum (last axis)");
        assert_eq!(kernel(sum(&[0]), &[&[4, 3]], &[1, 3]), "ReduceSum");
        assert_eq!(kernel(sum(&[1]), &[&[4, 1]], &[4, 1]), "ReduceSum");
        let grad = |activation| Op::ActivationGrad { activation };
        let pair: &[&[usize]] = &[&[4, 3], &[4, 3]];
        assert_eq!(
            kernel(grad(Activation::Gelu), pair, &[4, 3]),
            "ActivationGrad (Gelu)"
        );
        assert_eq!(
            kernel(grad(Activation::Silu), pair, &[4, 3]),
            "ActivationGrad (Silu)"
        );
        let gelu = |approximate| Op::Gelu { approximate };
        assert_eq!(kernel(gelu(GeluApprox::None), &[&[4, 3]], &[4, 3]), "Gelu");
        assert_eq!(kernel(gelu(GeluApprox::Tanh), &[&[4, 3]], &[4, 3]), "Gelu (tanh)");
    }

    #[test]
    fn views_count_the_copy_the_interpreter_makes() {
        let (g, idx) = single(Op::Reshape { allowzero: false }, &[&[4, 3], &[2]], &[12]);
        assert_eq!(node_work(&g, idx, Precision::F32).bytes, 96.0);
    }

    #[test]
    fn gemm_shapes_per_op() {
        let (g, idx) = single(Op::Linear, &[&[2, 5, 3], &[3, 7]], &[2, 5, 7]);
        assert_eq!(gemm_shape(&g, idx), Some([10.0, 7.0, 3.0]));
        let (g, idx) = single(Op::MatMul, &[&[2, 5, 3], &[2, 3, 7]], &[2, 5, 7]);
        assert_eq!(gemm_shape(&g, idx), Some([5.0, 7.0, 3.0]));
        // A batch against one shared matrix wide enough that its rows round
        // alike however they are grouped: one product.
        let (g, idx) = single(Op::MatMul, &[&[2, 5, 3], &[3, 70]], &[2, 5, 70]);
        assert_eq!(gemm_shape(&g, idx), Some([10.0, 70.0, 3.0]));
        let (g, idx) = single(Op::MatMul, &[&[2, 32, 3], &[3, 7]], &[2, 32, 7]);
        assert_eq!(gemm_shape(&g, idx), Some([32.0, 7.0, 3.0]));
        let (g, idx) = single(mul(), &[&[4, 3], &[4, 3]], &[4, 3]);
        assert_eq!(gemm_shape(&g, idx), None);
    }

    #[test]
    fn node_time_adds_overhead_to_grid_measured_or_streaming_time() {
        let device = Device {
            name: "cpu".into(),
            peak_flops: BTreeMap::new(),
            memory_bytes: 1e9,
            memory_bandwidth: 1e3,
            sustained_fraction: 1.0,
        };
        let mut cal = Calibration {
            kernel_overhead_s: 1.0,
            ops: vec![OpRate {
                op: "Linear (bias)".into(),
                dtype: DType::F32,
                at_bytes: None,
                bytes_per_s: Some(100.0),
                flops_per_s: None,
            }],
            ..Calibration::default()
        };
        cal.memory.measured_bytes_per_s = Some(8.0);
        cal.matmul.measured = vec![MatmulSample {
            m: 4,
            n: 2,
            k: 3,
            dtype: DType::F32,
            flops_per_s: 4.0,
        }];
        // Not measured: 144 bytes at 8 B/s.
        let (g, idx) = single(mul(), &[&[4, 3], &[4, 3]], &[4, 3]);
        assert_eq!(node_time(&cal, &device, &g, idx, Precision::F32), 1.0 + 18.0);
        // 2·4·2·3 = 48 FLOPs at 4 FLOP/s, no extra.
        let (g, idx) = single(Op::Linear, &[&[4, 3], &[3, 2]], &[4, 2]);
        assert_eq!(node_time(&cal, &device, &g, idx, Precision::F32), 1.0 + 12.0);
        // With a bias: 56 FLOPs, and 112 bytes at the bias rate.
        let (g, idx) = single(Op::Linear, &[&[4, 3], &[3, 2], &[2]], &[4, 2]);
        assert_eq!(
            node_time(&cal, &device, &g, idx, Precision::F32),
            1.0 + 14.0 + 1.12
        );
        // A weight read transposed by 256 rows or more is copied row-major
        // first: 2 · 70 · 80 · 4 bytes more at 8 B/s.
        cal.ops.clear();
        let gemm = |trans_b| Op::Gemm {
            alpha: 1.0,
            beta: 0.0,
            trans_a: false,
            trans_b,
        };
        let time = |rows: usize, trans_b: bool| {
            let b: &[usize] = if trans_b { &[80, 70] } else { &[70, 80] };
            let (g, idx) = single(gemm(trans_b), &[&[rows, 70], b], &[rows, 80]);
            node_time(&cal, &device, &g, idx, Precision::F32)
        };
        assert_eq!(time(256, true) - time(256, false), 2.0 * 70.0 * 80.0 * 4.0 / 8.0);
        assert_eq!(time(255, true), time(255, false), "too few rows to copy");
    }
}

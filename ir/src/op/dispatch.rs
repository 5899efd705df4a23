//! Per-op dispatch of shape inference, cost and evaluation to the family
//! files. Evaluation first re-runs shape inference on the concrete input
//! values, so every kernel sees validated inputs and fixed output shapes.

use super::elementwise::{self as ew, ElementwiseKind};
use super::kernel_util::{bytes, invalid, unsupported, EvalCtx, InferCtx};
use super::norm::NormKind;
use super::{attention, generate, indexing, linalg, moe, movement, norm, reduce, slicing};
use super::{BinaryOp, Cost, InferInput, Op, OpError, TensorType};
use crate::{DType, Data, Shape, Value};

impl Op {
    /// Output types from input types (and constant input values). Works
    /// with symbolic dims wherever the result is still determined; ops whose
    /// output shape depends on a value return `OpError::NotConstant` without it.
    pub fn infer(&self, inputs: &[Option<InferInput>]) -> Result<Vec<TensorType>, OpError> {
        let name = self.name();
        let cx = InferCtx { op: &name, inputs };
        let is_string = |t: &Option<InferInput>| t.is_some_and(|t| t.ty.dtype == DType::String);
        if let Some(i) = inputs
            .iter()
            .position(is_string)
            .filter(|_| !self.takes_strings())
        {
            return Err(unsupported(
                &name,
                format!("string input {i} (only Equal, Shape and Size take strings)"),
            ));
        }
        match self {
            Op::Unary { func } => ew::infer_unary(&cx, *func),
            Op::Binary { func } => ew::infer_binary(&cx, *func),
            Op::Where => ew::infer_where(&cx),
            Op::Cast { to, .. } => ew::infer_cast(&cx, *to),
            Op::Clip => ew::infer_clip(&cx),
            Op::Silu | Op::Gelu { .. } => ew::infer_activation(&cx),
            Op::MatMul => linalg::infer_matmul(&cx),
            Op::Gemm { trans_a, trans_b, .. } => linalg::infer_gemm(&cx, *trans_a, *trans_b),
            Op::Linear => linalg::infer_linear(&cx),
            Op::Softmax { axis } | Op::LogSoftmax { axis } => norm::infer_softmax(&cx, *axis),
            Op::LayerNorm { axis, .. } => norm::infer_norm(&cx, *axis, true),
            Op::RmsNorm { axis, .. } => norm::infer_norm(&cx, *axis, false),
            Op::Attention { .. } => attention::infer_attention(&cx),
            Op::RotaryEmbedding {
                rotary_dim,
                num_heads,
                ..
            } => attention::infer_rotary(&cx, *rotary_dim, *num_heads),
            Op::MoeRouter { top_k } => moe::infer_router(&cx, *top_k),
            Op::MoeExperts { .. } => moe::infer_experts(&cx),
            Op::AttentionGrad { .. }
            | Op::MoeExpertsGrad { .. }
            | Op::NormGrad { .. }
            | Op::ActivationGrad { .. }
            | Op::SoftmaxGrad { .. } => super::grad::infer(&cx, self),
            Op::Comm {
                kind, axis, parts, ..
            } => super::collective::infer(&cx, *kind, *axis, *parts),
            Op::Reduce {
                kind,
                axes,
                keepdims,
                noop_with_empty_axes,
            } => reduce::infer_reduce(&cx, *kind, axes.as_deref(), *keepdims, *noop_with_empty_axes),
            Op::ArgMax { axis, keepdims, .. } => reduce::infer_argmax(&cx, *axis, *keepdims),
            Op::TopK { axis, .. } => reduce::infer_topk(&cx, *axis),
            Op::CumSum { .. } => reduce::infer_cumsum(&cx),
            Op::Reshape { allowzero } => movement::infer_reshape(&cx, *allowzero),
            Op::Transpose { perm } => movement::infer_transpose(&cx, perm.as_deref()),
            Op::Expand => movement::infer_expand(&cx),
            Op::Squeeze { axes } => movement::infer_squeeze(&cx, axes.as_deref()),
            Op::Unsqueeze { axes } => movement::infer_unsqueeze(&cx, axes.as_deref()),
            Op::Flatten { axis } => movement::infer_flatten(&cx, *axis),
            Op::Concat { axis } => slicing::infer_concat(&cx, *axis),
            Op::Split { axis, split, outputs } => {
                slicing::infer_split(&cx, *axis, split.as_deref(), *outputs)
            }
            Op::Slice => slicing::infer_slice(&cx),
            Op::Trilu { .. } => slicing::infer_trilu(&cx),
            Op::Shape { start, end } => generate::infer_shape(&cx, *start, *end),
            Op::Size => generate::infer_size(&cx),
            Op::Gather { axis } => indexing::infer_gather(&cx, *axis),
            Op::GatherElements { axis } => indexing::infer_gather_elements(&cx, *axis),
            Op::GatherNd { batch_dims } => indexing::infer_gather_nd(&cx, *batch_dims),
            Op::Embedding => indexing::infer_embedding(&cx),
            Op::GatherGrad { .. } | Op::GatherElementsGrad { .. } | Op::GatherNdGrad { .. } => {
                super::scatter::infer(&cx, self)
            }
            Op::ConstantOfShape { value } => generate::infer_constant_of_shape(&cx, *value),
            Op::Range => generate::infer_range(&cx),
        }
    }

    /// The ops defined on string tensors: comparing them for equality, and
    /// reading their shape.
    fn takes_strings(&self) -> bool {
        matches!(
            self,
            Op::Binary {
                func: BinaryOp::Equal
            } | Op::Shape { .. }
                | Op::Size
        )
    }

    /// Forward/backward FLOPs and bytes at concrete input and output shapes.
    /// Shapes must be fixed (bind symbols first); a symbolic dim counts as 0.
    /// Pure views (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`) and
    /// metadata ops (`Shape`, `Size`) move no bytes.
    pub fn cost(&self, inputs: &[Option<&TensorType>], outputs: &[&TensorType]) -> Cost {
        let input = |i: usize| inputs.get(i).copied().flatten();
        let first_out = outputs.first().copied();
        let elementwise = |kind| first_out.map_or((0.0, 0.0), |o| ew::flops(kind, inputs.len(), o));
        let (forward_flops, backward_flops) = match self {
            Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast { .. } | Op::Clip => {
                elementwise(ElementwiseKind::Plain)
            }
            Op::Silu => elementwise(ElementwiseKind::Silu),
            Op::Gelu { .. } => elementwise(ElementwiseKind::Gelu),
            Op::MatMul | Op::Linear => first_out.map_or((0.0, 0.0), |o| {
                let bias = if matches!(self, Op::Linear) && input(2).is_some() {
                    1.0
                } else {
                    0.0
                };
                linalg::product_flops(o, linalg::contraction(input(0), false), bias)
            }),
            Op::Gemm { trans_a, .. } => first_out.map_or((0.0, 0.0), |o| {
                let extra = if input(2).is_some() { 2.0 } else { 1.0 };
                linalg::product_flops(o, linalg::contraction(input(0), *trans_a), extra)
            }),
            Op::Softmax { .. } | Op::LogSoftmax { .. } => norm::flops(NormKind::Softmax, input(0)),
            Op::LayerNorm { .. } => norm::flops(NormKind::Layer, input(0)),
            Op::RmsNorm { .. } => norm::flops(NormKind::Rms, input(0)),
            Op::Attention { .. } => attention::attention_flops(inputs),
            Op::RotaryEmbedding { .. } => attention::rotary_flops(input(0)),
            Op::MoeRouter { .. } => norm::flops(NormKind::Softmax, input(0)),
            Op::MoeExperts { .. } => moe::experts_flops(inputs),
            Op::AttentionGrad { .. }
            | Op::MoeExpertsGrad { .. }
            | Op::NormGrad { .. }
            | Op::ActivationGrad { .. }
            | Op::SoftmaxGrad { .. } => super::grad::flops(self, inputs),
            Op::Comm { .. } => (0.0, 0.0),
            Op::Reduce { .. } | Op::CumSum { .. } => reduce::flops(input(0), true),
            Op::ArgMax { .. } | Op::TopK { .. } => reduce::flops(input(0), false),
            Op::GatherGrad { .. } | Op::GatherElementsGrad { .. } | Op::GatherNdGrad { .. } => {
                super::scatter::flops(input(0))
            }
            _ => (0.0, 0.0),
        };
        let metadata_only = matches!(
            self,
            Op::Reshape { .. }
                | Op::Squeeze { .. }
                | Op::Unsqueeze { .. }
                | Op::Flatten { .. }
                | Op::Shape { .. }
                | Op::Size
        );
        let (bytes_read, bytes_written) = if metadata_only {
            (0.0, 0.0)
        } else {
            (
                inputs.iter().flatten().map(|t| bytes(t)).sum(),
                outputs.iter().map(|t| bytes(t)).sum(),
            )
        };
        Cost {
            forward_flops,
            backward_flops,
            bytes_read,
            bytes_written,
        }
    }

    /// Reference evaluation on host values. Inputs are checked (storage
    /// class against dtype, element count against shape) and typed through
    /// [`Op::infer`] before the kernel runs.
    pub fn eval(&self, inputs: &[Option<&Value>]) -> Result<Vec<Value>, OpError> {
        let name = self.name();
        let types = inputs
            .iter()
            .enumerate()
            .map(|(i, v)| v.map(|v| checked_type(&name, i, v)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let infer_inputs: Vec<Option<InferInput>> = types
            .iter()
            .zip(inputs)
            .map(|(t, v)| t.as_ref().map(|ty| InferInput { ty, value: *v }))
            .collect();
        let out = self.infer(&infer_inputs)?;
        let cx = EvalCtx {
            op: &name,
            inputs,
            out: &out,
        };
        match self {
            Op::Unary { func } => ew::eval_unary(&cx, *func),
            Op::Binary { func } => ew::eval_binary(&cx, *func),
            Op::Where => ew::eval_where(&cx),
            Op::Cast {
                to,
                saturate,
                round_mode,
            } => ew::eval_cast(&cx, *to, *saturate, *round_mode),
            Op::Clip => ew::eval_clip(&cx),
            Op::Silu => ew::eval_activation(&cx, ew::activation_of(None)),
            Op::Gelu { approximate } => ew::eval_activation(&cx, ew::activation_of(Some(*approximate))),
            Op::MatMul => linalg::eval_matmul(&cx),
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => linalg::eval_gemm(&cx, *alpha, *beta, *trans_a, *trans_b),
            Op::Linear => linalg::eval_linear(&cx),
            Op::Softmax { axis } => norm::eval_softmax(&cx, *axis, false),
            Op::LogSoftmax { axis } => norm::eval_softmax(&cx, *axis, true),
            Op::LayerNorm { axis, epsilon } => norm::eval_norm(&cx, *axis, *epsilon, true),
            Op::RmsNorm { axis, epsilon } => norm::eval_norm(&cx, *axis, *epsilon, false),
            Op::Attention { scale, causal } => attention::eval_attention(&cx, *scale, *causal),
            Op::RotaryEmbedding {
                interleaved,
                rotary_dim,
                num_heads,
            } => attention::eval_rotary(&cx, *interleaved, *rotary_dim, *num_heads),
            Op::MoeRouter { top_k } => moe::eval_router(&cx, *top_k),
            Op::MoeExperts { activation } => moe::eval_experts(&cx, *activation),
            Op::AttentionGrad { .. }
            | Op::MoeExpertsGrad { .. }
            | Op::NormGrad { .. }
            | Op::ActivationGrad { .. }
            | Op::SoftmaxGrad { .. } => super::grad::eval(&cx, self),
            Op::Comm { kind, .. } => super::collective::eval(&cx, *kind),
            Op::Reduce {
                kind,
                axes,
                noop_with_empty_axes,
                ..
            } => reduce::eval_reduce(&cx, *kind, axes.as_deref(), *noop_with_empty_axes),
            Op::ArgMax {
                axis,
                select_last_index,
                ..
            } => reduce::eval_argmax(&cx, *axis, *select_last_index),
            Op::TopK { axis, largest, .. } => reduce::eval_topk(&cx, *axis, *largest),
            Op::CumSum { exclusive, reverse } => reduce::eval_cumsum(&cx, *exclusive, *reverse),
            Op::Reshape { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Flatten { .. } => {
                movement::eval_view(&cx)
            }
            Op::Transpose { perm } => movement::eval_transpose(&cx, perm.as_deref()),
            Op::Expand => movement::eval_expand(&cx),
            Op::Concat { axis } => slicing::eval_concat(&cx, *axis),
            Op::Split { axis, .. } => slicing::eval_split(&cx, *axis),
            Op::Slice => slicing::eval_slice(&cx),
            Op::Trilu { upper } => slicing::eval_trilu(&cx, *upper),
            Op::Shape { start, end } => generate::eval_shape(&cx, *start, *end),
            Op::Size => generate::eval_size(&cx),
            Op::Gather { axis } => indexing::eval_gather(&cx, *axis),
            Op::GatherElements { axis } => indexing::eval_gather_elements(&cx, *axis),
            Op::GatherNd { batch_dims } => indexing::eval_gather_nd(&cx, *batch_dims),
            Op::Embedding => indexing::eval_gather(&cx, 0),
            Op::GatherGrad { .. } | Op::GatherElementsGrad { .. } | Op::GatherNdGrad { .. } => {
                super::scatter::eval(&cx, self)
            }
            Op::ConstantOfShape { value } => generate::eval_constant_of_shape(&cx, *value),
            Op::Range => generate::eval_range(&cx),
        }
    }
}

/// The type of an input value, after checking that its storage class fits
/// its dtype and its element count its shape.
fn checked_type(op: &str, i: usize, v: &Value) -> Result<TensorType, OpError> {
    let class_ok = match &v.data {
        Data::F32(_) => v.dtype.is_float() && v.dtype != DType::F64,
        Data::F64(_) => v.dtype == DType::F64,
        Data::Bool(_) => v.dtype == DType::Bool,
        Data::I64(_) => v.dtype.is_int(),
        Data::Str(_) => v.dtype == DType::String,
    };
    if !class_ok {
        return Err(invalid(
            op,
            format!("input {i}: {} value has the wrong storage class", v.dtype),
        ));
    }
    let want: usize = v.shape.iter().product();
    if v.data.len() != want {
        return Err(invalid(
            op,
            format!("input {i}: {} elements for shape {:?}", v.data.len(), v.shape),
        ));
    }
    Ok(TensorType {
        dtype: v.dtype,
        shape: Shape::fixed(&v.shape),
    })
}

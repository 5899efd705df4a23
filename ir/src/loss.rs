//! The losses training appends on a model's output, as graph nodes named
//! `loss/…`: a cross-entropy over the output's last dim (tokens'
//! vocabulary or classes; weighted by the masked positions for mlm) and a
//! squared error. Lowering appends them to the training graph and the cost
//! model prices the same nodes ([`Loss::standalone`]), so the loss a plan
//! prices is the loss a run computes.
//!
//! Each is a sum divided by a constant count, the global batch's terms, so
//! the micro-batches' losses add up to the global mean. A cross-entropy's
//! log-softmax and pick are what tensor parallelism turns into the
//! vocabulary-parallel cross-entropy.

use crate::{
    BinaryOp, DType, Dim, Graph, GraphError, Op, ReduceKind, Role, Shape, TensorId, TensorType, Value,
};
use serde::{Deserialize, Serialize};

/// The loss on a model's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// `−Σ log_softmax(output)[target] / count` over the last dim: next
    /// tokens, target tokens or classes.
    #[default]
    CrossEntropy,
    /// The cross-entropy at the positions a 0/1 weight marks (masked LM).
    MaskedCrossEntropy,
    /// `Σ (output − values)² / count`.
    SquaredError,
}

impl Loss {
    /// The loss `objective` trains; where none is known, a cross-entropy
    /// (the common loss, which a plan made before the objective was chosen
    /// prices).
    pub fn of(objective: Option<crate::Objective>) -> Loss {
        objective.map_or(Loss::CrossEntropy, crate::Objective::loss)
    }

    /// What it reads beside the output: the targets, and the weights of a
    /// masked cross-entropy. A cross-entropy's targets are one index per
    /// row of the output's last dim; its weights have that dim 1.
    pub fn target_types(self, output: &TensorType) -> (TensorType, Option<TensorType>) {
        let dims = &output.shape.0;
        let rows = Shape(dims[..dims.len().saturating_sub(1)].to_vec());
        let mut one = dims.clone();
        if let Some(last) = one.last_mut() {
            *last = Dim::Fixed(1);
        }
        let index = TensorType {
            dtype: DType::I64,
            shape: rows,
        };
        let weights = TensorType {
            dtype: output.dtype,
            shape: Shape(one),
        };
        match self {
            Loss::CrossEntropy => (index, None),
            Loss::MaskedCrossEntropy => (index, Some(weights)),
            Loss::SquaredError => (output.clone(), None),
        }
    }

    /// Appends the loss on `output` against `targets` (and `weights`, which
    /// a masked cross-entropy needs), divided by `count`; the scalar loss.
    pub fn append(
        self,
        g: &mut Graph,
        output: TensorId,
        targets: TensorId,
        weights: Option<TensorId>,
        count: usize,
    ) -> Result<TensorId, GraphError> {
        match self {
            Loss::CrossEntropy => cross_entropy(g, output, targets, None, count),
            Loss::MaskedCrossEntropy => {
                let weights = weights.expect("a masked cross-entropy reads its weights");
                cross_entropy(g, output, targets, Some(weights), count)
            }
            Loss::SquaredError => squared_error(g, output, targets, count),
        }
    }

    /// The loss alone on an output of type `output`: a graph whose inputs
    /// are the output, the targets and any weights, and whose one output is
    /// the loss. What the cost model prices.
    pub fn standalone(self, output: &TensorType) -> Graph {
        let mut g = Graph::new("loss");
        let (targets_ty, weights_ty) = self.target_types(output);
        let input = |g: &mut Graph, name: &str, ty: TensorType| {
            let t = g.add_tensor(name, ty, Role::Input, None);
            g.inputs.push(t);
            t
        };
        let out = input(&mut g, "output", output.clone());
        let targets = input(&mut g, "targets", targets_ty);
        let weights = weights_ty.map(|ty| input(&mut g, "weights", ty));
        let loss = self
            .append(&mut g, out, targets, weights, 1)
            .expect("the loss's own types fit its nodes");
        g.outputs.push(loss);
        g
    }

    /// Its name, as plans spell it.
    pub fn name(self) -> &'static str {
        match self {
            Loss::CrossEntropy => "cross_entropy",
            Loss::MaskedCrossEntropy => "masked_cross_entropy",
            Loss::SquaredError => "squared_error",
        }
    }

    /// Whether it reads the output's last dim as classes (a cross-entropy:
    /// tensor parallelism runs it on vocabulary-split logits).
    pub fn over_classes(self) -> bool {
        match self {
            Loss::CrossEntropy | Loss::MaskedCrossEntropy => true,
            Loss::SquaredError => false,
        }
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// `−Σ weights · log_softmax(logits)[targets] / count`, the log-softmax
/// over the last dim; `targets` has the logits' shape without it, and
/// `weights` (where given) the logits' shape with it 1.
fn cross_entropy(
    g: &mut Graph,
    logits: TensorId,
    targets: TensorId,
    weights: Option<TensorId>,
    count: usize,
) -> Result<TensorId, GraphError> {
    let lt = g.tensor(logits).ty.clone();
    let dtype = lt.dtype;
    let rank = lt.shape.rank();
    let log_probs = node(
        g,
        "log_softmax",
        Op::LogSoftmax { axis: -1 },
        vec![logits],
        lt.clone(),
    )?;
    let mut picked_dims = lt.shape.0.clone();
    picked_dims[rank - 1] = Dim::Fixed(1);
    let picked_shape = Shape(picked_dims);
    // Reshape's 0 keeps the targets' own dim: `[d0, …, 1]`.
    let mut keep = vec![0; rank];
    keep[rank - 1] = 1;
    let shape_const = g.add_constant(
        "loss/index_shape",
        Value::i64(vec![rank], keep).expect("one entry per dim"),
    );
    let index = node(
        g,
        "targets",
        Op::Reshape { allowzero: false },
        vec![targets, shape_const],
        TensorType {
            dtype: DType::I64,
            shape: picked_shape.clone(),
        },
    )?;
    let picked_ty = TensorType {
        dtype,
        shape: picked_shape,
    };
    let mut picked = node(
        g,
        "picked",
        Op::GatherElements { axis: -1 },
        vec![log_probs, index],
        picked_ty.clone(),
    )?;
    if let Some(w) = weights {
        let mul = Op::Binary { func: BinaryOp::Mul };
        picked = node(g, "weighted", mul, vec![picked, w], picked_ty)?;
    }
    mean(g, picked, -(count as f64))
}

/// `Σ (output − values)² / count`.
fn squared_error(
    g: &mut Graph,
    output: TensorId,
    values: TensorId,
    count: usize,
) -> Result<TensorId, GraphError> {
    let ty = g.tensor(output).ty.clone();
    let sub = Op::Binary { func: BinaryOp::Sub };
    let error = node(g, "error", sub, vec![output, values], ty.clone())?;
    let mul = Op::Binary { func: BinaryOp::Mul };
    let squared = node(g, "squared", mul, vec![error, error], ty)?;
    mean(g, squared, count as f64)
}

/// `Σ terms / denominator`, a scalar named `loss/mean`.
fn mean(g: &mut Graph, terms: TensorId, denominator: f64) -> Result<TensorId, GraphError> {
    let dtype = g.tensor(terms).ty.dtype;
    let scalar = TensorType {
        dtype,
        shape: Shape(vec![]),
    };
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: None,
        keepdims: false,
        noop_with_empty_axes: false,
    };
    let total = node(g, "sum", sum, vec![terms], scalar.clone())?;
    let count = g.add_constant(
        "loss/count",
        Value::f32(vec![], vec![denominator as f32]).expect("scalar"),
    );
    let count = match dtype {
        DType::F32 => count,
        _ => node(g, "count_cast", Op::cast(dtype), vec![count], scalar.clone())?,
    };
    let div = Op::Binary { func: BinaryOp::Div };
    node(g, "mean", div, vec![total, count], scalar)
}

/// Adds node `loss/{name}` and its one output, of the same name.
fn node(
    g: &mut Graph,
    name: &str,
    op: Op,
    inputs: Vec<TensorId>,
    ty: TensorType,
) -> Result<TensorId, GraphError> {
    let out = g.add_tensor(format!("loss/{name}"), ty, Role::Activation, None);
    g.add_node(
        format!("loss/{name}"),
        op,
        inputs.into_iter().map(Some).collect(),
        vec![out],
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> TensorType {
        TensorType {
            dtype: DType::F32,
            shape: Shape::fixed(&[2, 3, 5]),
        }
    }

    #[test]
    fn a_standalone_loss_reads_the_output_and_its_targets() {
        let g = Loss::MaskedCrossEntropy.standalone(&logits());
        let types: Vec<String> = g
            .inputs
            .iter()
            .map(|&t| g.tensor(t).ty.shape.to_string())
            .collect();
        assert_eq!(types, ["[2, 3, 5]", "[2, 3]", "[2, 3, 1]"]);
        assert_eq!(g.tensor(g.outputs[0]).ty.shape.rank(), 0);
        let ops: Vec<&str> = g.node_indices().map(|i| g.node(i).name.as_str()).collect();
        for want in ["loss/log_softmax", "loss/picked", "loss/weighted", "loss/mean"] {
            assert!(ops.contains(&want), "{ops:?}");
        }
    }

    #[test]
    fn a_squared_error_reads_values_shaped_as_the_output() {
        let out = TensorType {
            dtype: DType::F32,
            shape: Shape::fixed(&[4, 1]),
        };
        let (values, weights) = Loss::SquaredError.target_types(&out);
        assert_eq!((values, weights), (out.clone(), None));
        let g = Loss::SquaredError.standalone(&out);
        assert!(g
            .node_indices()
            .all(|i| !matches!(g.node(i).op, Op::LogSoftmax { .. })));
        assert!(!Loss::SquaredError.over_classes() && Loss::CrossEntropy.over_classes());
    }

    #[test]
    fn losses_are_named_in_snake_case() {
        for loss in [Loss::CrossEntropy, Loss::MaskedCrossEntropy, Loss::SquaredError] {
            assert_eq!(serde_json::to_string(&loss).unwrap(), format!("\"{loss}\""));
        }
    }
}

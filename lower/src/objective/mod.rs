//! Training objectives: what a model is trained to do, which decides how
//! each of its inputs is fed ([`Feed`]), which loss reads its output and
//! what one row of a batch holds ([`Task`], the one description the data
//! layer makes rows from).
//!
//! Every loss is a sum over the micro-batch divided by the count of the
//! same terms in the global batch ([`Task::terms_per_row`] × rows), so
//! the losses of all micro-batches of all ranks add up to the global mean
//! and a parallel run reports one rank's losses.

mod head;
mod inputs;

pub(crate) use head::attach;
pub use inputs::Feed;

use super::TrainingError;
pub use autopar_ir::Objective;
use autopar_ir::{DType, Graph, Op};

/// The objective the graph's inputs and outputs call for, where they
/// leave no doubt: an integer input named as a decoder's is seq2seq; a
/// token input otherwise is next-token prediction; float inputs alone
/// are regression when the output is `[batch]` or `[batch, 1]`, else
/// classification over a `[batch, classes]` output.
///
/// An encoder is not inferred as `mlm`: whether attention is
/// bidirectional is not reliably visible in an exported graph (the
/// causal mask of some exports is not recognised, see
/// [`bidirectional`]), and guessing wrong would silently train a
/// decoder as a masked LM. Encoders ask for it with `--objective mlm`.
pub fn infer_objective(g: &Graph) -> Result<Objective, TrainingError> {
    let inputs: Vec<&autopar_ir::Tensor> = g.inputs.iter().map(|&t| g.tensor(t)).collect();
    let tokens = || inputs.iter().filter(|t| inputs::is_token_input(t));
    if tokens().any(|t| inputs::is_decoder(t)) {
        return Ok(Objective::Seq2Seq);
    }
    if tokens().next().is_some() {
        return Ok(Objective::Lm);
    }
    let floats = inputs.iter().any(|t| t.ty.dtype.is_float());
    let outputs: Vec<&autopar_ir::Tensor> = g
        .outputs
        .iter()
        .map(|&t| g.tensor(t))
        .filter(|t| t.ty.dtype.is_float())
        .collect();
    if let ([out], true) = (outputs.as_slice(), floats) {
        let dims = &out.ty.shape.0;
        match dims.len() {
            1 => return Ok(Objective::Regress),
            2 if dims[1].fixed() == Some(1) => return Ok(Objective::Regress),
            2 if dims[1].fixed().is_some() => return Ok(Objective::Classify),
            _ => {}
        }
    }
    Err(TrainingError::NoObjective {
        inputs: describe(g, &g.inputs),
        outputs: describe(g, &g.outputs),
    })
}

/// The objective a plan of `g` is made for: `given` (an `--objective`, or
/// a plan's being replanned), else the one `run` infers; `None` for a
/// model no objective is inferred for (it runs only with `--objective`;
/// until then it is priced with a cross-entropy, [`Loss::of`]).
pub fn planned_objective(g: &Graph, given: Option<Objective>) -> Option<Objective> {
    given.or_else(|| infer_objective(g).ok())
}

/// What a run of plan `p` on `g` trains: the objective the plan was made
/// for, else the one `g` calls for.
pub fn plan_objective(p: &autopar_planner::Plan, g: &Graph) -> Result<Objective, TrainingError> {
    p.inputs.objective.map_or_else(|| infer_objective(g), Ok)
}

/// Whether the graph has attention and none of it is causal: an encoder,
/// or a decoder whose causal mask was not recognised. Next-token prediction
/// on an encoder lets every position see its target, so the CLI says so
/// and names `--objective mlm`.
pub fn bidirectional(g: &Graph) -> bool {
    let causal: Vec<bool> = g
        .node_indices()
        .filter_map(|i| match g.node(i).op {
            Op::Attention { causal, .. } => Some(causal),
            _ => None,
        })
        .collect();
    !causal.is_empty() && causal.iter().all(|c| !c)
}

/// What one row of a training batch holds, with the sizes the training
/// graph reads: the data layer makes exactly these rows.
#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    /// `seq` tokens, each with the next one as its target.
    Lm { seq: usize, vocab: usize },
    /// `source` tokens for the encoder and `target` tokens to predict; the
    /// decoder reads the targets shifted right by one (teacher forcing).
    Seq2Seq {
        source: usize,
        target: usize,
        vocab: usize,
    },
    /// `seq` tokens of which `masked` are replaced by `mask_token`; the
    /// targets are the original tokens and only the masked ones count.
    Mlm {
        seq: usize,
        vocab: usize,
        masked: usize,
        mask_token: i64,
    },
    /// Features for each of `inputs` and one class of `classes`.
    Classify {
        inputs: Vec<FeatureInput>,
        classes: usize,
    },
    /// Features for each of `inputs` and `outputs` real-valued targets.
    Regress {
        inputs: Vec<FeatureInput>,
        outputs: usize,
    },
}

/// A model input fed with features: its name, type and one row's shape
/// (its shape without the batch dim).
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureInput {
    pub name: String,
    pub dtype: DType,
    pub row: Vec<usize>,
}

impl Task {
    pub fn objective(&self) -> Objective {
        match self {
            Task::Lm { .. } => Objective::Lm,
            Task::Seq2Seq { .. } => Objective::Seq2Seq,
            Task::Mlm { .. } => Objective::Mlm,
            Task::Classify { .. } => Objective::Classify,
            Task::Regress { .. } => Objective::Regress,
        }
    }

    /// The loss terms one row contributes: its targets (tokens, masked
    /// tokens, the one label) or, for regression, its output values. The
    /// loss divides by this times the global batch's rows.
    pub fn terms_per_row(&self) -> usize {
        match self {
            Task::Lm { seq, .. } => *seq,
            Task::Seq2Seq { target, .. } => *target,
            Task::Mlm { masked, .. } => *masked,
            Task::Classify { .. } => 1,
            Task::Regress { outputs, .. } => *outputs,
        }
    }

    /// What throughput counts per row, and its name: the tokens a row
    /// feeds (encoder and decoder), or one sample.
    pub fn throughput_unit(&self) -> (usize, &'static str) {
        match self {
            Task::Lm { seq, .. } | Task::Mlm { seq, .. } => (*seq, "tokens"),
            Task::Seq2Seq { source, target, .. } => (source + target, "tokens"),
            Task::Classify { .. } | Task::Regress { .. } => (1, "samples"),
        }
    }
}

/// `'name' shape` of each tensor, for messages.
fn describe(g: &Graph, tensors: &[autopar_ir::TensorId]) -> String {
    let all: Vec<String> = tensors
        .iter()
        .map(|&t| {
            let t = g.tensor(t);
            format!("'{}' {} {}", t.name, t.ty.dtype, t.ty.shape)
        })
        .collect();
    match all.is_empty() {
        true => "none".into(),
        false => all.join(", "),
    }
}

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
use autopar_ir::{DType, Graph, Loss, Op};

/// What a model is trained to do (`autopar run --objective`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Next-token prediction on a token stream.
    Lm,
    /// Sequence to sequence with teacher forcing: the decoder reads the
    /// targets shifted right by one.
    Seq2Seq,
    /// Masked language modelling: some tokens are masked and predicted.
    Mlm,
    /// Classification of features into the output's classes.
    Classify,
    /// Regression of the output onto real-valued targets (squared error).
    Regress,
}

impl Objective {
    /// The names `--objective` accepts, in declaration order.
    pub const NAMES: &'static [&'static str] = &["lm", "seq2seq", "mlm", "classify", "regress"];

    /// The objective's name, as the flag spells it.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Lm => "lm",
            Objective::Seq2Seq => "seq2seq",
            Objective::Mlm => "mlm",
            Objective::Classify => "classify",
            Objective::Regress => "regress",
        }
    }

    /// The loss it trains: what lowering appends and the cost model prices.
    pub fn loss(self) -> Loss {
        match self {
            Objective::Lm | Objective::Seq2Seq | Objective::Classify => Loss::CrossEntropy,
            Objective::Mlm => Loss::MaskedCrossEntropy,
            Objective::Regress => Loss::SquaredError,
        }
    }

    /// Whether it trains on token streams (rather than features and labels).
    pub fn on_tokens(self) -> bool {
        match self {
            Objective::Lm | Objective::Seq2Seq | Objective::Mlm => true,
            Objective::Classify | Objective::Regress => false,
        }
    }

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
    pub fn infer(g: &Graph) -> Result<Objective, TrainingError> {
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
}

/// The loss a plan of `g` prices: `given` (an `--objective`'s, or a plan's
/// being replanned), else the one of the objective `run` infers. A model
/// no objective is inferred for runs only with `--objective`; until one is
/// given it is priced with the common loss, a cross-entropy.
pub fn priced_loss(g: &Graph, given: Option<Loss>) -> Loss {
    given.unwrap_or_else(|| Objective::infer(g).map(Objective::loss).unwrap_or_default())
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

impl std::str::FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            Objective::Lm,
            Objective::Seq2Seq,
            Objective::Mlm,
            Objective::Classify,
            Objective::Regress,
        ]
        .into_iter()
        .find(|o| o.name() == s)
        .ok_or_else(|| {
            format!(
                "unknown objective '{s}' (expected {})",
                Objective::NAMES.join(", ")
            )
        })
    }
}

impl std::fmt::Display for Objective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
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

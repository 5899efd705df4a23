//! Training objectives: what a model is trained to do, and the loss each
//! trains ([`Objective::loss`]). Lowering decides from it how inputs are
//! fed and what a row of data holds; the cost model prices its loss; a
//! plan records it, so a run and a simulation of the plan train what was
//! priced.

use crate::Loss;

/// What a model is trained to do (`autopar run --objective`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
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

//! How each model input is fed under an objective, decided from its name
//! and type: masks, positions and token types as every objective feeds
//! them, then the objective's own inputs (tokens, the decoder's tokens,
//! features). An input no rule covers is an error naming it and the flag
//! that would feed it.

use super::Objective;
use crate::TrainingError;
use autopar_ir::{Graph, Tensor};

/// What a data input of the training graph is fed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Feed {
    /// Token ids: the stream's tokens (lm), the source (seq2seq), the
    /// tokens with some masked (mlm).
    Tokens,
    /// The decoder's tokens: the targets shifted right by one (seq2seq).
    DecoderTokens,
    /// The loss's integer targets: the next tokens (lm), the target tokens
    /// (seq2seq), the original tokens (mlm), the class (classify).
    Targets,
    /// The loss's real-valued targets (regress).
    Values,
    /// One at a masked token, else zero: the loss's weights (mlm).
    Masked,
    /// A row's features for this input (classify, regress).
    Features,
    /// All ones (attention masks: training rows are never padded).
    Ones,
    /// All zeros (token-type ids).
    Zeros,
    /// `0..seq` on every row.
    Positions,
    /// The loss's cotangent: one.
    Seed,
}

impl Feed {
    /// Whether it holds one value per token of the sequence context
    /// parallelism splits.
    pub fn per_token(self) -> bool {
        match self {
            Feed::Tokens | Feed::Targets | Feed::Masked | Feed::Positions | Feed::Zeros => true,
            Feed::DecoderTokens | Feed::Values | Feed::Features | Feed::Ones | Feed::Seed => false,
        }
    }
}

/// How each of the model's inputs is fed under `objective`.
pub(super) fn feeds(g: &Graph, objective: Objective) -> Result<Vec<(String, Feed)>, TrainingError> {
    let mut feeds = Vec::new();
    let (mut tokens, mut decoder) = (false, false);
    for &t in &g.inputs {
        let tensor = g.tensor(t);
        let token = is_token_input(tensor);
        let feed = match (common_feed(tensor), objective) {
            (Some(feed), _) => feed,
            (None, Objective::Seq2Seq) if token && is_decoder(tensor) && !decoder => {
                decoder = true;
                Feed::DecoderTokens
            }
            (None, Objective::Lm | Objective::Mlm | Objective::Seq2Seq)
                if token && !is_decoder(tensor) && !tokens =>
            {
                tokens = true;
                Feed::Tokens
            }
            (None, Objective::Classify | Objective::Regress) => Feed::Features,
            (None, _) => return Err(unfed(tensor, objective)),
        };
        feeds.push((tensor.name.clone(), feed));
    }
    Ok(feeds)
}

/// Masks, positions and token types, fed alike under every objective.
fn common_feed(t: &Tensor) -> Option<Feed> {
    let name = t.name.to_ascii_lowercase();
    if name.contains("mask") {
        Some(Feed::Ones)
    } else if name.contains("position") {
        Some(Feed::Positions)
    } else if name.contains("type") {
        Some(Feed::Zeros)
    } else {
        None
    }
}

/// An integer `[batch, seq]` input that is not a mask, position or type.
pub(super) fn is_token_input(t: &Tensor) -> bool {
    !t.ty.dtype.is_float() && t.ty.shape.rank() == 2 && common_feed(t).is_none()
}

/// Named as an encoder-decoder's decoder input (`decoder_input_ids`).
pub(super) fn is_decoder(t: &Tensor) -> bool {
    t.name.to_ascii_lowercase().contains("decoder")
}

/// The error for an input `objective` does not feed, naming the flag
/// that would.
fn unfed(t: &Tensor, objective: Objective) -> TrainingError {
    let hint = if t.ty.dtype.is_float() {
        "float features are fed under --objective classify or --objective regress".to_string()
    } else if is_token_input(t) && is_decoder(t) && objective != Objective::Seq2Seq {
        "decoder inputs are fed under --objective seq2seq".to_string()
    } else {
        format!(
            "under --objective classify or regress, --data FILE.safetensors holding a tensor '{}' feeds it",
            t.name
        )
    };
    TrainingError::UnknownInput {
        input: t.name.clone(),
        ty: format!("{} {}", t.ty.dtype, t.ty.shape),
        objective,
        hint,
    }
}

//! The model zoo: transformer graphs (GPT, Llama, Mixtral-style MoE, BERT)
//! built from a spec string such as
//! `gpt:layers=24,hidden=2304,heads=24,vocab=51200,seq=2048`, so the planner
//! can be run on published models without their weights.
//!
//! Graphs use the canonical ops (`Linear`, `Embedding`, `LayerNorm`,
//! `RmsNorm`, `Attention`, ...), keep `batch` and `seq` symbolic (bound by
//! default in [`autopar_ir::Graph::bindings`]), never materialise weights
//! (parameters are weightless `Role::Parameter` tensors, rotary caches
//! weightless `Role::Constant` ones) and record one [`autopar_ir::Block`] per layer.
//! Names follow HF: `h.3.attn.qkv` (GPT), `layers.3.self_attn.q_proj`
//! (Llama/MoE), `encoder.layer.3.attention.self.query` (BERT); every node of
//! layer `i` starts with that layer's prefix (`h.3.`), parameters add
//! `.weight`/`.bias`. See [`spec`] for the keys of each family.

mod bert;
mod builder;
mod gpt;
mod layers;
mod llama;
pub mod spec;

pub use spec::{BertConfig, GptConfig, LlamaConfig, ModelSpec, MoeConfig};

use autopar_ir::{Graph, GraphError};

/// Why a spec could not be parsed or built; every variant names the family
/// and key (or the graph node) at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ZooError {
    #[error("unknown model family '{family}' (expected gpt, llama, moe or bert)")]
    UnknownFamily { family: String },
    #[error("{family}: item '{item}' is not key=value")]
    BadItem { family: String, item: String },
    #[error("{family}: unknown key '{key}' (expected one of {expected})")]
    UnknownKey {
        family: String,
        key: String,
        expected: String,
    },
    #[error("{family}: key '{key}' given twice")]
    DuplicateKey { family: String, key: String },
    #[error("{family}: missing required key '{key}'")]
    MissingKey { family: String, key: String },
    #[error("{family}: key '{key}': '{value}' is not {expected}")]
    BadValue {
        family: String,
        key: String,
        value: String,
        expected: &'static str,
    },
    #[error("{family}: key '{key}': {message}")]
    Invalid {
        family: String,
        key: String,
        message: String,
    },
    #[error("building {model}: {source}")]
    Graph { model: String, source: Box<GraphError> },
}

impl ModelSpec {
    /// The model's graph: symbolic `batch`/`seq`, weightless parameters, one
    /// block per layer. Named by the canonical spec string.
    pub fn build(&self) -> Result<Graph, ZooError> {
        let name = self.to_string();
        let built = match self {
            ModelSpec::Gpt(c) => gpt::build(c, &name),
            ModelSpec::Llama(c) => llama::build(c, &name),
            ModelSpec::Bert(c) => bert::build(c, &name),
        };
        built.map_err(|source| ZooError::Graph {
            model: name,
            source: Box::new(source),
        })
    }
}

/// Parses `spec` and builds its graph (the CLI's one-step path).
pub fn build(spec: &str) -> Result<Graph, ZooError> {
    spec.parse::<ModelSpec>()?.build()
}

//! Resolving the `MODEL` argument every command takes: an `.onnx` file, an
//! autopar `.json` graph, or a model-zoo spec string (`gpt:layers=...`).

use anyhow::{bail, Context, Result};
use autopar_import::{onnx, zoo::ModelSpec};
use autopar_ir::{json, Bindings, Graph};
use autopar_rewrite::{canonicalize, detect_blocks};
use std::path::Path;

/// Where a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Onnx,
    Json,
    Zoo,
}

/// A loaded model graph and its origin.
#[derive(Debug, Clone)]
pub struct Model {
    pub graph: Graph,
    pub source: Source,
}

/// Sizes for an ONNX model's dynamic input axes (`--batch`, `--seq`, or
/// the plan's micro-batch and sequence), bound at import so the shape
/// arithmetic the exporter wrote for them folds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Axes {
    pub batch: Option<usize>,
    pub seq: Option<usize>,
    /// The batch to bind only if the export cannot keep its batch axis
    /// symbolic (its shape arithmetic reads the batch size); a symbolic
    /// batch lets the planner choose the micro-batch.
    pub batch_if_needed: Option<usize>,
}

/// The sequence length a model with a dynamic sequence axis trains and is
/// planned at when neither `--seq` nor a plan gives one.
pub const DEFAULT_DYNAMIC_SEQ: usize = 128;

impl Axes {
    /// The axes to plan or train at: the given sizes, else
    /// [`DEFAULT_DYNAMIC_SEQ`] tokens and a batch left to the plan, or of
    /// one row where the export needs it bound (a model with static axes
    /// keeps its own).
    pub fn training(batch: Option<usize>, seq: Option<usize>) -> Axes {
        Axes {
            batch,
            seq: Some(seq.unwrap_or(DEFAULT_DYNAMIC_SEQ)),
            batch_if_needed: Some(1),
        }
    }

    /// The axes a plan was made at: its micro-batch and sequence.
    pub fn of_plan(p: &autopar_planner::Plan) -> Axes {
        Axes::training(Some(p.parallel.micro_batch), p.inputs.seq)
    }

    fn import_options(self) -> onnx::ImportOptions {
        let dims = [("batch", self.batch), ("seq", self.seq)]
            .into_iter()
            .filter_map(|(role, v)| Some((role.to_string(), v?)))
            .collect();
        onnx::ImportOptions {
            dims,
            ..Default::default()
        }
    }
}

/// Loads `model`: a path ending in `.onnx` or `.json`, else a zoo spec.
pub fn load(model: &str) -> Result<Model> {
    load_with(model, Axes::default())
}

/// [`load`] with the sizes of an ONNX model's dynamic axes.
pub fn load_with(model: &str, axes: Axes) -> Result<Model> {
    let path = Path::new(model);
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("onnx") => {
            let graph = match onnx::load_model_with(path, &axes.import_options()) {
                Err(onnx::OnnxError::DynamicAxes { axes: open, .. })
                    if axes.batch.is_none() && axes.batch_if_needed.is_some() && open.iter().any(|a| a == "batch") =>
                {
                    let bound = Axes {
                        batch: axes.batch_if_needed,
                        ..axes
                    };
                    onnx::load_model_with(path, &bound.import_options())
                }
                other => other,
            }
            .with_context(|| model.to_string())?;
            Ok(Model {
                graph,
                source: Source::Onnx,
            })
        }
        Some("json") => {
            let text = std::fs::read_to_string(path).with_context(|| format!("{model}: cannot read"))?;
            let graph = json::from_json(&text).with_context(|| model.to_string())?;
            Ok(Model {
                graph,
                source: Source::Json,
            })
        }
        _ if model.contains(':') => {
            let spec: ModelSpec = model.parse().with_context(|| format!("model spec '{model}'"))?;
            let graph = spec.build().with_context(|| format!("model spec '{model}'"))?;
            Ok(Model {
                graph,
                source: Source::Zoo,
            })
        }
        _ => bail!("{model}: not an .onnx or .json file, nor a model spec like 'gpt:layers=12,hidden=768,heads=12,vocab=50257,seq=1024'"),
    }
}

/// Refuses a `--seq` longer than a zoo model has positions (its spec's
/// `seq`: the rows of its position tables), which training would index
/// past; other models say so themselves where their sequence is fixed.
pub fn check_seq(model: &str, m: &Model, seq: Option<usize>) -> Result<()> {
    let positions = match m.source {
        Source::Zoo => m.graph.bindings.get("seq").copied(),
        Source::Onnx | Source::Json => None,
    };
    if let (Some(seq), Some(positions)) = (seq, positions) {
        if seq > positions {
            bail!("--seq {seq}: the model spec '{model}' has {positions} positions (its seq); --seq must be at most {positions}");
        }
    }
    Ok(())
}

/// The model in canonical ops with its repeated layers found: zoo graphs are
/// built that way; imported graphs are canonicalised and searched for layers.
pub fn canonical(m: &Model) -> Result<Graph> {
    Ok(match m.source {
        Source::Zoo => m.graph.clone(),
        Source::Onnx | Source::Json => {
            let mut g = canonicalize(&m.graph)?.0;
            g.blocks = detect_blocks(&g)?;
            g
        }
    })
}

/// The graph's default bindings with `--batch` / `--seq` overrides applied.
pub fn bindings(graph: &Graph, batch: Option<usize>, seq: Option<usize>) -> Bindings {
    let mut b = graph.bindings.clone();
    if let Some(batch) = batch {
        b.insert("batch".into(), batch);
    }
    if let Some(seq) = seq {
        b.insert("seq".into(), seq);
    }
    b
}

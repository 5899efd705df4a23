//! `autopar export-weights`: a checkpoint's trained weights out of autopar —
//! as a safetensors file of whole tensors named as the model's parameters
//! (an ONNX model's initializer names, so they map back to the PyTorch
//! module), or as the original ONNX file with its initializers trained.

use crate::output;
use anyhow::{bail, Context, Result};
use autopar_exec::checkpoint::{self, Restored};
use autopar_ir::Value;
use std::collections::HashMap;
use std::path::Path;

/// What was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exported {
    /// The checkpoint folder read (`DIR/step-<S>`).
    pub checkpoint: String,
    pub step: usize,
    pub output: String,
    /// Parameters written (tied copies are their originals).
    pub parameters: usize,
    pub elements: u64,
}

/// Writes the weights of the checkpoint `dir` names to `out`: `.onnx`
/// (the model `model`, else the one the run trained, with trained
/// initializers) or `.safetensors`.
pub fn run(dir: &Path, out: &Path, model: Option<&str>) -> Result<Exported> {
    output::check_folder(out)?;
    let restored = checkpoint::open(dir).with_context(|| dir.display().to_string())?;
    let weights: Vec<(&str, &Value)> = restored.model_weights().collect();
    let bytes = match out.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => safetensors_file(&weights)?,
        Some("onnx") => onnx_file(&restored, &weights, model)?,
        _ => bail!(
            "{}: write .safetensors (the weights) or .onnx (the model with trained weights)",
            out.display()
        ),
    };
    output::write_atomic(out, &bytes)?;
    Ok(Exported {
        checkpoint: restored.dir.display().to_string(),
        step: restored.index.step,
        output: out.display().to_string(),
        parameters: weights.len(),
        elements: weights.iter().map(|(_, v)| v.numel() as u64).sum(),
    })
}

/// One line for people.
pub fn render(e: &Exported) -> String {
    format!(
        "wrote {}: {} parameters ({} elements) trained to step {} ({})\n",
        e.output, e.parameters, e.elements, e.step, e.checkpoint
    )
}

fn safetensors_file(weights: &[(&str, &Value)]) -> Result<Vec<u8>> {
    let tensors: Vec<(String, Value)> = weights
        .iter()
        .map(|(n, v)| (n.to_string(), (*v).clone()))
        .collect();
    checkpoint::safetensors_file(&tensors).map_err(anyhow::Error::msg)
}

fn onnx_file(restored: &Restored, weights: &[(&str, &Value)], model: Option<&str>) -> Result<Vec<u8>> {
    let model = model.unwrap_or(&restored.index.model);
    if !model.ends_with(".onnx") {
        bail!("the checkpoint's model '{model}' is not an ONNX file; write .safetensors, or give --model FILE.onnx");
    }
    let bytes = std::fs::read(model).with_context(|| format!("{model}: cannot read the model"))?;
    let trained: HashMap<String, Value> = weights
        .iter()
        .map(|(n, v)| (n.to_string(), (*v).clone()))
        .collect();
    autopar_import::onnx::with_trained_weights(&bytes, &trained).with_context(|| model.to_string())
}

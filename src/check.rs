//! `autopar check`: runs a model on the CPU interpreter with the inputs of an
//! ONNX backend-test folder (`input_*.pb`) and compares with its
//! `output_*.pb`, proving the import (and the rewrites) compute what
//! onnxruntime computes. With `--grads DIR` it also differentiates the model
//! (loss = Σ output · cotangent) and compares every parameter gradient with
//! a reference folder (`manifest.json`, `cotangent.pb`, one `.pb` per
//! initializer, as PyTorch's float64 autograd wrote them).

use crate::model;
use anyhow::{bail, Context, Result};
use autopar_import::onnx::read_tensor_file;
use autopar_ir::interp::{self, Precision};
use autopar_ir::Value;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Relative tolerance (max |error| / max |reference|) `check` accepts.
pub const TOLERANCE: f64 = 1e-4;

/// Relative tolerance for gradients computed in f64.
pub const GRAD_TOLERANCE_F64: f64 = 1e-6;

/// Agreement of one output.
#[derive(Debug, Clone, Serialize)]
pub struct OutputCheck {
    pub name: String,
    pub max_abs_error: f64,
    pub max_rel_error: f64,
    pub ok: bool,
}

/// The result of a check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub model: String,
    pub rewrite: bool,
    pub precision: String,
    pub tolerance: f64,
    pub outputs: Vec<OutputCheck>,
    /// Parameter gradients against the reference, when asked.
    pub gradients: Vec<OutputCheck>,
    pub gradient_tolerance: Option<f64>,
    pub ok: bool,
}

/// Reads `dir/<prefix>_<i>.pb` for i = 0, 1, ... until one is missing.
fn read_numbered(dir: &Path, prefix: &str) -> Result<Vec<(String, Value)>> {
    let mut out = vec![];
    loop {
        let path: PathBuf = dir.join(format!("{prefix}_{}.pb", out.len()));
        if !path.exists() {
            break;
        }
        out.push(read_tensor_file(&path).with_context(|| path.display().to_string())?);
    }
    if out.is_empty() {
        bail!(
            "{}: no {prefix}_0.pb (expected the ONNX backend-test layout)",
            dir.display()
        );
    }
    Ok(out)
}

/// The sizes of a model's dynamic axes that the test data gives: the rows
/// and length of its first `[batch, seq]` integer input, else the rows of
/// its first input.
fn data_axes(inputs: &[(String, Value)]) -> model::Axes {
    let tokens = inputs
        .iter()
        .find(|(_, v)| v.dtype.is_int() && v.shape.len() == 2);
    match tokens.or(inputs.first()) {
        Some((_, v)) => model::Axes {
            batch: v.shape.first().copied(),
            seq: tokens.and_then(|(_, v)| v.shape.get(1).copied()),
            ..Default::default()
        },
        None => model::Axes::default(),
    }
}

/// Runs the check; `grads` adds the gradient check against that folder.
pub fn run(
    model_arg: &str,
    data: &Path,
    rewrite: bool,
    precision: Precision,
    grads: Option<&Path>,
) -> Result<CheckReport> {
    let inputs = read_numbered(data, "input")?;
    let m = model::load_with(model_arg, data_axes(&inputs))?;
    let graph = if rewrite {
        autopar_rewrite::canonicalize(&m.graph)?.0
    } else {
        m.graph
    };
    let expected = read_numbered(data, "output")?;
    let mut feeds = BTreeMap::new();
    for (i, (name, value)) in inputs.into_iter().enumerate() {
        // Backend-test files name their tensor; fall back to graph input order.
        let name = if name.is_empty() {
            let Some(&t) = graph.inputs.get(i) else {
                bail!("{}: input_{i}.pb has no graph input to feed", data.display());
            };
            graph.tensor(t).name.clone()
        } else {
            name
        };
        feeds.insert(name, value);
    }
    let actual = interp::run(&graph, &feeds, precision).with_context(|| format!("running {model_arg}"))?;
    if actual.len() != expected.len() {
        bail!(
            "{model_arg} has {} outputs but {} holds {}",
            actual.len(),
            data.display(),
            expected.len()
        );
    }
    let mut outputs = vec![];
    for (i, (a, (name, e))) in actual.iter().zip(&expected).enumerate() {
        let name = if name.is_empty() {
            graph.tensor(graph.outputs[i]).name.clone()
        } else {
            name.clone()
        };
        let Some(c) = interp::compare(a, e) else {
            bail!(
                "output '{name}': shape {:?} differs from the reference {:?}",
                a.shape,
                e.shape
            );
        };
        outputs.push(OutputCheck {
            name,
            max_abs_error: c.max_abs,
            max_rel_error: c.max_rel,
            ok: c.within(TOLERANCE),
        });
    }
    let (gradients, gradient_tolerance) = match grads {
        Some(dir) => {
            let tol = match precision {
                Precision::F64 => GRAD_TOLERANCE_F64,
                Precision::F32 => TOLERANCE,
            };
            (check_gradients(&graph, feeds, dir, precision, tol)?, Some(tol))
        }
        None => (vec![], None),
    };
    Ok(CheckReport {
        model: model_arg.to_string(),
        rewrite,
        precision: format!("{precision:?}").to_lowercase(),
        tolerance: TOLERANCE,
        ok: outputs.iter().all(|o| o.ok) && gradients.iter().all(|g| g.ok),
        outputs,
        gradients,
        gradient_tolerance,
    })
}

/// The parts of a reference gradients folder's `manifest.json` used here.
#[derive(serde::Deserialize)]
struct Manifest {
    grads: BTreeMap<String, ManifestGrad>,
    cotangent: ManifestCotangent,
}

#[derive(serde::Deserialize)]
struct ManifestGrad {
    file: String,
    /// `tied-partial`: one of the initializers an exporter split a tied
    /// weight into, holding that use's share of its gradient.
    #[serde(default)]
    tie: Option<String>,
    /// `derived-constant`: computed from a buffer, not a weight (a rotary
    /// table); the importer keeps such initializers constant.
    #[serde(default)]
    relation: Option<String>,
}

#[derive(serde::Deserialize)]
struct ManifestCotangent {
    file: String,
    for_output: String,
}

/// Differentiates `graph`, runs it on `feeds` plus the reference
/// cotangent, and compares each parameter gradient the manifest lists.
fn check_gradients(
    graph: &autopar_ir::Graph,
    mut feeds: BTreeMap<String, Value>,
    dir: &Path,
    precision: Precision,
    tolerance: f64,
) -> Result<Vec<OutputCheck>> {
    let manifest_path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path)
        .with_context(|| format!("{}: cannot read", manifest_path.display()))?;
    let manifest: Manifest =
        serde_json::from_str(&text).with_context(|| manifest_path.display().to_string())?;
    let d = autopar_ir::autodiff::differentiate(graph)?;
    let Some((_, cotangent_input)) = d
        .cotangents
        .iter()
        .find(|(output, _)| *output == manifest.cotangent.for_output)
    else {
        bail!(
            "{}: the cotangent is for output '{}', which the model does not have as a float output",
            manifest_path.display(),
            manifest.cotangent.for_output
        );
    };
    let cotangent_path = dir.join(&manifest.cotangent.file);
    let (_, cotangent) =
        read_tensor_file(&cotangent_path).with_context(|| cotangent_path.display().to_string())?;
    feeds.insert(cotangent_input.clone(), cotangent);
    // Outputs without a reference cotangent get zeros.
    for (output, input) in &d.cotangents {
        if *output != manifest.cotangent.for_output {
            let t = d.graph.inputs.iter().find(|&&t| d.graph.tensor(t).name == *input);
            if let Some(&t) = t {
                let ty = &d.graph.tensor(t).ty;
                let dims = ty.shape.as_fixed().unwrap_or_default();
                feeds.insert(input.clone(), Value::zeros(ty.dtype, dims));
            }
        }
    }
    let outs = interp::run(&d.graph, &feeds, precision).context("running the backward pass")?;
    let computed = autopar_ir::autodiff::gradients_by_name(&d, &outs);
    let mut references = vec![];
    let mut merged = vec![];
    for (name, entry) in &manifest.grads {
        let path = dir.join(&entry.file);
        let (_, reference) = read_tensor_file(&path).with_context(|| path.display().to_string())?;
        if entry.relation.as_deref() == Some("derived-constant") && !computed.contains_key(name) {
            continue;
        }
        let partial = entry.tie.as_deref() == Some("tied-partial");
        match partial && !computed.contains_key(name) {
            // The importer read this copy as the weight it copies: its
            // share joins that weight's reference below.
            true => merged.push(reference),
            false => references.push((name, reference, partial)),
        }
    }
    for share in merged {
        let target = references.iter_mut().find(|(_, r, partial)| {
            *partial && (r.shape == share.shape || transposed_shape(&r.shape, &share.shape))
        });
        let Some((name, total, _)) = target else {
            bail!("{}: a tied share has no weight to join", manifest_path.display());
        };
        let share = match total.shape == share.shape {
            true => share.to_f64_vec(),
            false => transpose(&share),
        };
        let sum: Vec<f64> = total.to_f64_vec().iter().zip(share).map(|(a, b)| a + b).collect();
        *total = Value::f64(total.shape.clone(), sum).with_context(|| format!("the tied weight '{name}'"))?;
    }
    let references: Vec<(&String, Value)> = references.into_iter().map(|(n, r, _)| (n, r)).collect();
    // A gradient that is zero in exact arithmetic (a bias that shifts every
    // softmax input of a row equally) is rounding noise on both sides, so an
    // error below one unit in the last place of the largest gradient passes
    // whatever its relative size.
    let largest = references
        .iter()
        .flat_map(|(_, r)| r.to_f64_vec())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let epsilon = match precision {
        Precision::F64 => f64::EPSILON,
        Precision::F32 => f64::from(f32::EPSILON),
    };
    let noise = epsilon * largest;
    let mut checks = vec![];
    for (name, reference) in references {
        let check = match computed.get(name) {
            Some(value) => match interp::compare(value, &reference) {
                Some(c) => OutputCheck {
                    name: name.clone(),
                    max_abs_error: c.max_abs,
                    max_rel_error: c.max_rel,
                    ok: c.within(tolerance) || c.max_abs <= noise,
                },
                None => bail!(
                    "gradient of '{name}': shape {:?} differs from the reference {:?}",
                    value.shape,
                    reference.shape
                ),
            },
            None => OutputCheck {
                name: name.clone(),
                max_abs_error: f64::INFINITY,
                max_rel_error: f64::INFINITY,
                ok: false,
            },
        };
        checks.push(check);
    }
    Ok(checks)
}

/// Whether matrices of shapes `a` and `b` are each other's transpose.
fn transposed_shape(a: &[usize], b: &[usize]) -> bool {
    matches!((a, b), (&[r, c], &[br, bc]) if (r, c) == (bc, br))
}

/// A matrix's elements in its transpose's row-major order.
fn transpose(m: &Value) -> Vec<f64> {
    let (rows, cols) = (m.shape[0], m.shape[1]);
    let v = m.to_f64_vec();
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| (r, c)))
        .map(|(r, c)| v[r * cols + c])
        .collect()
}

/// Renders the report for people.
pub fn render(r: &CheckReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} ({}, {}, tolerance rel {:e})",
        r.model,
        if r.rewrite { "rewritten" } else { "as imported" },
        r.precision,
        r.tolerance
    );
    for o in &r.outputs {
        let _ = writeln!(
            s,
            "  {:<24} max abs {:.3e}  max rel {:.3e}  {}",
            o.name,
            o.max_abs_error,
            o.max_rel_error,
            if o.ok { "ok" } else { "FAIL" }
        );
    }
    if let Some(tol) = r.gradient_tolerance {
        // Gradients that pass only as rounding noise around zero.
        let noise = r
            .gradients
            .iter()
            .filter(|g| g.ok && g.max_rel_error > tol)
            .count();
        let worst = r
            .gradients
            .iter()
            .filter(|g| g.max_rel_error <= tol || !g.ok)
            .map(|g| g.max_rel_error)
            .fold(0.0f64, f64::max);
        let failed: Vec<&OutputCheck> = r.gradients.iter().filter(|g| !g.ok).collect();
        let _ = writeln!(
            s,
            "  gradients: {} parameters, worst max rel {:.3e} (tolerance {:e}; {} zero up to rounding), {} failed",
            r.gradients.len(),
            worst,
            tol,
            noise,
            failed.len()
        );
        for g in failed {
            let _ = writeln!(s, "    {:<40} max rel {:.3e}  FAIL", g.name, g.max_rel_error);
        }
    }
    let _ = writeln!(s, "{}", if r.ok { "PASS" } else { "FAIL" });
    s
}

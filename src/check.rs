//! `autopar check`: runs a model on the CPU interpreter with the inputs of an
//! ONNX backend-test folder (`input_*.pb`) and compares with its
//! `output_*.pb`, proving the import (and the rewrites) compute what
//! onnxruntime computes.

use crate::model;
use anyhow::{bail, Context, Result};
use autopar_ir::{onnx::read_tensor_file, Value};
use autopar_runtime::cpu::{self, Precision};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Relative tolerance (max |error| / max |reference|) `check` accepts.
pub const TOLERANCE: f64 = 1e-4;

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

/// Runs the check.
pub fn run(model_arg: &str, data: &Path, rewrite: bool, precision: Precision) -> Result<CheckReport> {
    let m = model::load(model_arg)?;
    let graph = if rewrite {
        autopar_ir::canonicalize(&m.graph)?.0
    } else {
        m.graph
    };
    let inputs = read_numbered(data, "input")?;
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
    let actual = cpu::run(&graph, &feeds, precision).with_context(|| format!("running {model_arg}"))?;
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
        let Some(c) = cpu::compare(a, e) else {
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
    Ok(CheckReport {
        model: model_arg.to_string(),
        rewrite,
        precision: format!("{precision:?}").to_lowercase(),
        tolerance: TOLERANCE,
        ok: outputs.iter().all(|o| o.ok),
        outputs,
    })
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
    let _ = writeln!(s, "{}", if r.ok { "PASS" } else { "FAIL" });
    s
}

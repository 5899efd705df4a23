//! `autopar convert`: any model input to autopar's JSON graph format.

use crate::{model, output};
use anyhow::Result;
use std::path::Path;

/// Converts `model` (optionally canonicalised) and writes JSON to `out`.
pub fn run(model: &str, out: &Path, rewrite: bool) -> Result<()> {
    output::check_folder(out)?;
    let m = model::load(model)?;
    let graph = if rewrite {
        autopar_rewrite::canonicalize(&m.graph)?.0
    } else {
        m.graph
    };
    output::write_atomic(out, autopar_ir::json::to_json(&graph).as_bytes())
}

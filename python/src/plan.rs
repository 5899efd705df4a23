//! `autopar.plan`, `autopar.load_plan` and the plan object: `autopar plan`,
//! `explain`, `export` and `report` on a plan held in memory.

use crate::{error, keywords};
use autopar::{export, output, plan as cli, report};
use pyo3::prelude::*;
use std::path::PathBuf;

/// A parallel plan (the plan file's contents).
#[pyclass(frozen, module = "autopar._native")]
pub struct Plan(autopar_planner::Plan);

#[pymethods]
impl Plan {
    /// Reads a plan file's JSON text.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Plan> {
        let plan = autopar_planner::Plan::from_json(text).map_err(|e| error(e.into()))?;
        Ok(Plan(plan))
    }

    /// The plan file's text, as `autopar plan -o` writes it.
    fn to_json(&self) -> PyResult<String> {
        cli::file_text(&self.0).map_err(error)
    }

    /// `autopar explain`'s text.
    fn explain(&self) -> String {
        cli::explain(&self.0)
    }

    /// The plan as `tool`'s configuration, and what the tool cannot
    /// express; written to `path` when given, as `autopar export` does.
    #[pyo3(signature = (tool, path))]
    fn export(&self, tool: &str, path: Option<PathBuf>) -> PyResult<(String, Vec<String>)> {
        let tool = keywords::tool(tool)?;
        let e = match path {
            Some(path) => export::write(&self.0, tool, &path).map_err(error)?,
            None => export::export(&self.0, tool),
        };
        Ok((e.text, e.caveats))
    }

    /// Writes the plan file, atomically, as `autopar plan -o` does.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        let write = || {
            output::check_folder(&path)?;
            output::write_atomic(&path, cli::file_text(&self.0)?.as_bytes())
        };
        write().map_err(error)
    }

    /// Writes the HTML report, as `autopar report` does (simulated without
    /// holding the GIL); returns what the page could not show, and why.
    fn report(&self, py: Python<'_>, path: PathBuf) -> PyResult<Vec<String>> {
        let written = py.detach(|| report::write(&self.0, &path)).map_err(error)?;
        Ok(written.notes)
    }

    fn __eq__(&self, other: &Plan) -> bool {
        self.0 == other.0
    }
}

/// Reads a plan file, as `autopar explain` and `export` do.
#[pyfunction]
pub fn load_plan(path: PathBuf) -> PyResult<Plan> {
    cli::load(&path).map(Plan).map_err(error)
}

/// `autopar plan`: the fastest plan that fits, searched without holding
/// the GIL. Every argument is a flag of the command; the Python layer gives
/// the defaults.
#[pyfunction]
#[pyo3(signature = (
    model, *, cluster, gpus, global_batch, seq, max_memory_fraction, top, attention, dropout,
    moe_capacity_factor, objective, calibration, tp_comm_overlap, allow_lossy_compression, verify
))]
#[allow(clippy::too_many_arguments)]
pub fn plan(
    py: Python<'_>,
    model: String,
    cluster: String,
    gpus: usize,
    global_batch: usize,
    seq: Option<usize>,
    max_memory_fraction: f64,
    top: usize,
    attention: &str,
    dropout: bool,
    moe_capacity_factor: Option<f64>,
    objective: Option<&str>,
    calibration: Option<PathBuf>,
    tp_comm_overlap: bool,
    allow_lossy_compression: bool,
    verify: usize,
) -> PyResult<Plan> {
    let request = cli::Request {
        model,
        cluster,
        gpus,
        global_batch,
        seq,
        max_memory_fraction,
        top,
        attention: keywords::parse(attention)?,
        dropout,
        moe_capacity_factor: keywords::capacity_factor(moe_capacity_factor)?,
        objective: keywords::parse_opt(objective)?,
        calibration,
        // `make` does not write: the Python side saves where it is told.
        output: PathBuf::new(),
        limits: autopar_planner::DegreeLimits {
            lossy_compression: allow_lossy_compression,
            ..autopar_planner::DegreeLimits::RUNNABLE
        },
        tp_comm_overlap,
        verify,
    };
    py.detach(|| cli::make(&request, &|_, _| {}))
        .map(Plan)
        .map_err(error)
}

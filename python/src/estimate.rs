//! `autopar.estimate`: `autopar estimate --json` for one configuration.

use crate::{error, keywords};
use autopar::estimate::{self as cli, Request};
use pyo3::prelude::*;
use std::path::PathBuf;

/// `autopar estimate`'s report as JSON text, priced without holding the
/// GIL. Every argument is a flag of the command (`from_` is `--from TOOL
/// FILE`); the Python layer gives the defaults.
#[pyfunction]
#[pyo3(signature = (
    model, *, cluster, gpus, tp, pp, dp, virtual_stages, sp, cp, ep, zero, global_batch, from_,
    micro_batch, seq, recompute, schedule, attention, dropout, moe_capacity_factor, objective,
    overlap_grad_reduce, grad_bucket_mib, tp_comm_overlap, overlap_param_gather, f32_main_grads,
    f32_cross_entropy, grad_compression, mesh_order, calibration
))]
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    py: Python<'_>,
    model: String,
    cluster: String,
    gpus: usize,
    tp: usize,
    pp: usize,
    dp: Option<usize>,
    virtual_stages: Option<usize>,
    sp: bool,
    cp: usize,
    ep: usize,
    zero: u8,
    global_batch: Option<usize>,
    from_: Option<(String, PathBuf)>,
    micro_batch: Option<usize>,
    seq: Option<usize>,
    recompute: &str,
    schedule: &str,
    attention: &str,
    dropout: bool,
    moe_capacity_factor: Option<f64>,
    objective: Option<&str>,
    overlap_grad_reduce: bool,
    grad_bucket_mib: u32,
    tp_comm_overlap: bool,
    overlap_param_gather: bool,
    f32_main_grads: bool,
    f32_cross_entropy: bool,
    grad_compression: Option<&str>,
    mesh_order: &str,
    calibration: Option<PathBuf>,
) -> PyResult<String> {
    let from = from_.as_ref().map(|(tool, file)| (tool.as_str(), file.as_path()));
    let settings = cli::settings_from(from).map_err(error)?;
    let global_batch = cli::global_batch(global_batch, settings.as_ref()).map_err(error)?;
    let request = Request {
        model,
        cluster,
        gpus,
        tp,
        pp,
        dp,
        virtual_stages,
        layers_per_chunk: None,
        sp,
        cp,
        ep,
        zero,
        global_batch,
        micro_batch,
        seq,
        recompute: keywords::parse(recompute)?,
        schedule: keywords::parse(schedule)?,
        attention: keywords::parse(attention)?,
        dropout,
        moe_capacity_factor: keywords::capacity_factor(moe_capacity_factor)?,
        objective: keywords::parse_opt(objective)?,
        overlap_grad_reduce,
        grad_bucket_mib,
        tp_comm_overlap,
        overlap_param_gather,
        f32_main_grads,
        f32_cross_entropy,
        grad_compression: keywords::parse_opt(grad_compression)?,
        mesh_order: keywords::parse(mesh_order)?,
        calibration,
    };
    let request = match &settings {
        Some(s) => request.with(s),
        None => request,
    };
    let report = py.detach(|| cli::run(&request)).map_err(error)?;
    serde_json::to_string(&report).map_err(|e| error(e.into()))
}

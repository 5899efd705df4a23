//! Reading the CLI's keyword flags from Python strings and numbers, with
//! the messages the CLI gives for them.

use crate::Error;
use autopar::export::Tool;
use pyo3::PyResult;
use std::str::FromStr;

/// A keyword (`fused`, `1f1b`, `selective`, `bf16`, ...) through the same
/// `FromStr` the CLI's flags and plan files use, with its message.
pub fn parse<T: FromStr<Err = String>>(value: &str) -> PyResult<T> {
    value.parse().map_err(Error::new_err)
}

/// [`parse`] of a keyword that may be absent.
pub fn parse_opt<T: FromStr<Err = String>>(value: Option<&str>) -> PyResult<Option<T>> {
    value.map(parse).transpose()
}

/// A tool to export to: `megatron`, `torchtitan` or `deepspeed`.
pub fn tool(name: &str) -> PyResult<Tool> {
    Tool::named(name).map_err(Error::new_err)
}

/// A MoE capacity factor, as the CLI's `--moe-capacity-factor` requires.
pub fn capacity_factor(cf: Option<f64>) -> PyResult<Option<f64>> {
    cf.map(|cf| autopar::limits::capacity_factor(cf).map_err(Error::new_err))
        .transpose()
}

//! `autopar._native`: the autopar library behind the `autopar` Python
//! package. Each function here is a CLI command's library call with the
//! flags as arguments; defaults, dicts and torch modules live in the Python
//! layer (`autopar/__init__.py`), so this side stays a thin, typed bridge.

mod estimate;
mod keywords;
mod plan;

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

create_exception!(
    autopar,
    Error,
    PyValueError,
    "A request autopar refuses, or a failure while serving it; the message is the one the `autopar` command prints after `error: `."
);

/// The error as `autopar::errors::one_line` words it, so Python and the
/// command line say the same thing.
fn error(e: anyhow::Error) -> PyErr {
    Error::new_err(autopar::errors::one_line(&e))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add("DEFAULT_VERIFY", autopar::plan::DEFAULT_VERIFY)?;
    m.add("DEFAULT_BUCKET_MIB", autopar_cost_models::DEFAULT_BUCKET_MIB)?;
    m.add_class::<plan::Plan>()?;
    m.add_function(wrap_pyfunction!(plan::plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::load_plan, m)?)?;
    m.add_function(wrap_pyfunction!(estimate::estimate, m)?)?;
    Ok(())
}

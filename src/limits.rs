//! The size flags, checked before any work: each at least 1 and at most the
//! limit of the layer it feeds (the planner's [`autopar_planner::limits`]
//! for what a plan holds, the cluster's [`autopar_cost_models::MAX_GPUS`]),
//! or, for what only this host runs, [`MAX_LOCAL_RANKS`]. A refusal names
//! the flag, the value and the limit.

use anyhow::{bail, Result};
pub use autopar_cost_models::MAX_GPUS;
pub use autopar_planner::limits::{MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_RANKS, MAX_SEQ};

/// Ranks one `autopar run` process runs as threads (without a launcher).
/// Each holds its program, its share of the model and a thread stack; a
/// host has far fewer cores, so beyond this the run only thrashes.
pub const MAX_LOCAL_RANKS: usize = 1024;

/// `value` of `flag` if it is at least 1 and at most `limit`, which
/// `limit_name` names.
pub fn size(flag: &str, value: usize, limit: usize, limit_name: &str) -> Result<usize> {
    if value == 0 {
        bail!("{flag} must be at least 1");
    }
    if value > limit {
        bail!("{flag} {value} is above the limit of {limit} ({limit_name})");
    }
    Ok(value)
}

/// [`size`] of a flag that may be absent.
pub fn size_opt(flag: &str, value: Option<usize>, limit: usize, limit_name: &str) -> Result<Option<usize>> {
    value.map(|v| size(flag, v, limit, limit_name)).transpose()
}

/// `--seq`, when given.
pub fn seq(value: Option<usize>) -> Result<Option<usize>> {
    size_opt("--seq", value, MAX_SEQ, "MAX_SEQ")
}

/// `--global-batch`.
pub fn global_batch(value: usize) -> Result<usize> {
    size("--global-batch", value, MAX_GLOBAL_BATCH, "MAX_GLOBAL_BATCH")
}

/// `--gpus`.
pub fn gpus(value: usize) -> Result<usize> {
    size("--gpus", value, MAX_GPUS, "MAX_GPUS")
}

/// A MoE capacity factor (`--moe-capacity-factor`): a positive finite number.
pub fn capacity_factor(cf: f64) -> Result<f64, String> {
    if cf.is_finite() && cf > 0.0 {
        Ok(cf)
    } else {
        Err(format!(
            "'{cf}' is not a capacity factor (a positive number, such as 1.25)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_name_the_flag_and_the_limit() {
        assert_eq!(size("--x", 5, 5, "MAX_X").unwrap(), 5);
        assert_eq!(
            size("--x", 0, 5, "MAX_X").unwrap_err().to_string(),
            "--x must be at least 1"
        );
        assert_eq!(
            size("--x", 6, 5, "MAX_X").unwrap_err().to_string(),
            "--x 6 is above the limit of 5 (MAX_X)"
        );
        assert_eq!(seq(None).unwrap(), None);
        assert!(global_batch(MAX_GLOBAL_BATCH + 1).is_err());
        assert!(gpus(usize::MAX).is_err());
    }
}

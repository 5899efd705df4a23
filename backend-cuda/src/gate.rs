//! The one place a test decides "GPU present, or skip". A GPU test that
//! returns early without a GPU is green and says nothing, so every skip
//! prints one line naming the test and the reason, and on a machine that
//! must have a GPU (`scripts/gpu-check.sh`) `AUTOPAR_REQUIRE_GPU=1` turns the
//! skip into a failure, as `AUTOPAR_REQUIRE_NVRTC=1` does for the kernel
//! compiler.

use super::{probe, DeviceInfo};
use std::io::Write;

/// The environment variable that makes a missing GPU fail the test.
const REQUIRE_GPU: &str = "AUTOPAR_REQUIRE_GPU";

/// Device 0 for the GPU test named `test`, or `None` after printing that the
/// test is skipped and why.
///
/// # Panics
/// With `AUTOPAR_REQUIRE_GPU=1` and no usable GPU, naming the test and the
/// reason, so that a run which was meant to exercise the GPU cannot pass by
/// skipping.
pub fn gpu_or_skip(test: &str) -> Option<DeviceInfo> {
    let why = match probe(0) {
        Ok(info) => return Some(info),
        Err(why) => why,
    };
    let required = std::env::var(REQUIRE_GPU).is_ok_and(|v| v == "1");
    assert!(!required, "{REQUIRE_GPU}=1 but {test} found no GPU: {why}");
    // Straight to stderr: the test harness captures `eprintln!`, and a skip
    // must show in a normal run. A failed write loses only this notice.
    let line = format!("skipped {test}: no GPU ({why})\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The smallest GPU test: what the switch is checked on.
    const CHILD: &str = "gate::tests::a_gpu_test_runs_or_skips";

    #[test]
    fn a_gpu_test_runs_or_skips() {
        if let Some(info) = gpu_or_skip(CHILD) {
            assert!(info.devices > info.ordinal, "{info:?}");
        }
    }

    /// [`CHILD`] run alone by this test binary, with `AUTOPAR_REQUIRE_GPU`
    /// set to `require` (or unset): whether it passed, and its output.
    fn child(require: Option<&str>) -> (bool, String) {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([CHILD, "--exact", "--nocapture", "--test-threads=1"]);
        match require {
            Some(v) => cmd.env(REQUIRE_GPU, v),
            None => cmd.env_remove(REQUIRE_GPU),
        };
        let out = cmd.output().unwrap();
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(log.contains("running 1 test"), "{CHILD} did not run:\n{log}");
        (out.status.success(), log)
    }

    /// Without a GPU the switch fails the test with the reason; with one
    /// (a GPU machine, where this runs too) the test runs and passes.
    /// Unset, or anything but `1`, a missing GPU is a visible skip.
    #[test]
    fn the_require_switch_turns_a_skip_into_a_failure() {
        let gpu = probe(0);
        let (passed, log) = child(Some("1"));
        match &gpu {
            Ok(info) => {
                assert!(passed, "{info:?}:\n{log}");
                assert!(!log.contains("skipped"), "{log}");
            }
            Err(why) => {
                assert!(!passed, "a missing GPU passed under {REQUIRE_GPU}=1:\n{log}");
                let reason = format!("{REQUIRE_GPU}=1 but {CHILD} found no GPU: {why}");
                assert!(log.contains(&reason), "expected '{reason}' in:\n{log}");
            }
        }
        for require in [None, Some("0")] {
            let (passed, log) = child(require);
            assert!(passed, "{require:?}:\n{log}");
            let skipped = format!("skipped {CHILD}: no GPU (");
            assert_eq!(log.contains(&skipped), gpu.is_err(), "{require:?}:\n{log}");
        }
    }
}

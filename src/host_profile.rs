//! This host's CPU profile for predicting `autopar run --backend cpu`: the
//! nominal `cpu` preset (a made-up core's peak and bandwidth) can be off by a
//! factor of two on a real host, so the first run that needs a prediction
//! measures the host (`autopar profile --backend cpu`, a few seconds) and
//! caches the calibration; later runs read it.
//!
//! The cache file is named after what makes it valid — the CPU model, the
//! logical core count, the autopar version and the precisions measured —
//! so another host, a resized VM or a new version measures again. It is
//! an ordinary calibration file (`--calibration` takes it), written
//! atomically; a file that does not parse, or lacks a measured figure, is
//! measured again, never an error. [`NOMINAL_VAR`] skips all of it.

use crate::output;
use anyhow::{bail, Result};
use autopar_cost_models::Calibration;
use autopar_ir::DType;
use serde::Serialize;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Folder of the cache, before [`XDG_CACHE_VAR`] and the home folder.
pub const CACHE_DIR_VAR: &str = "AUTOPAR_CACHE_DIR";
const XDG_CACHE_VAR: &str = "XDG_CACHE_HOME";
/// `1`: predict CPU runs from the nominal `cpu` preset, without measuring
/// or reading a host profile; `0` or unset: use the host profile.
pub const NOMINAL_VAR: &str = "AUTOPAR_NOMINAL_CPU";

/// Which figures a run's predicted step time comes from (the report's
/// `plan.prediction_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PredictionSource {
    /// The plan's per-rank programs simulated with this host's cached profile.
    HostProfile,
    /// The programs simulated with the `--calibration` file.
    CalibrationFile,
    /// The plan's own estimate, from the nominal figures of its cluster preset.
    Nominal,
}

/// What a host profile is valid for: it is measured again when any of these changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKey {
    /// The CPU model from `/proc/cpuinfo` (the architecture where there is none).
    pub cpu: String,
    pub cores: usize,
    /// The autopar version and the profiler's revision, whose figures these are.
    pub version: String,
    /// The precisions whose per-op rates the profile holds.
    pub precisions: Vec<DType>,
}

impl HostKey {
    /// This host, as the CPU backend's profiler measures it (f32 and f64 rates).
    pub fn this_host() -> HostKey {
        HostKey {
            cpu: autopar_cpu::profile::cpu_model().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            version: format!(
                "{}+p{}",
                env!("CARGO_PKG_VERSION"),
                autopar_cpu::profile::REVISION
            ),
            precisions: vec![DType::F32, DType::F64],
        }
    }

    /// The cache file's name: `cpu-<model>-<n>cores-autopar<version>-<precisions>.json`,
    /// every part reduced to lower-case letters, digits, dots and dashes.
    pub fn file_name(&self) -> String {
        let precisions: Vec<String> = self.precisions.iter().map(DType::to_string).collect();
        format!(
            "cpu-{}-{}cores-autopar{}-{}.json",
            slug(&self.cpu),
            self.cores,
            slug(&self.version),
            precisions.join("-")
        )
    }
}

/// `text` in lower case with every run of other characters than letters,
/// digits and dots made one dash (a file name on every file system).
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '.' {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

/// The cache folder: [`CACHE_DIR_VAR`], else `$XDG_CACHE_HOME/autopar`, else
/// `~/.cache/autopar` (`None` without a home folder); `var` reads the
/// environment (empty values count as unset, as the XDG spec says).
pub fn cache_dir(var: &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    set(CACHE_DIR_VAR)
        .or_else(|| set(XDG_CACHE_VAR).map(|d| d.join("autopar")))
        .or_else(|| set("HOME").map(|h| h.join(".cache").join("autopar")))
}

/// Whether [`NOMINAL_VAR`] asks for nominal figures.
pub fn nominal_requested() -> Result<bool> {
    nominal_switch(std::env::var(NOMINAL_VAR).ok().as_deref())
}

/// [`NOMINAL_VAR`]'s value (`None`: unset) as a switch.
fn nominal_switch(value: Option<&str>) -> Result<bool> {
    match value {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => bail!(
            "{NOMINAL_VAR}='{other}' is invalid: expected 1 (predict CPU runs from nominal figures) or 0"
        ),
    }
}

/// The cached profile at `path` when it is one this run can price with: a
/// calibration file with every figure the profiler measures. Anything else
/// (missing, unreadable, corrupt, an older format) is `None`.
pub fn read_cached(path: &Path, key: &HostKey) -> Option<Calibration> {
    let cal = Calibration::load(path).ok()?;
    let measured = |dtype: DType| {
        cal.matmul.measured.iter().any(|s| s.dtype == dtype) && cal.ops.iter().any(|r| r.dtype == dtype)
    };
    let complete = key.precisions.iter().all(|&d| measured(d))
        && cal.memory.measured_bytes_per_s.is_some()
        && cal.network.measured_intra_node_bytes_per_s.is_some()
        && cal.network.measured_intra_node_latency_s.is_some()
        && !cal.threads.is_empty()
        && cal.interpreter.is_some_and(|c| c.collective_overhead_s.is_some());
    complete.then_some(cal)
}

/// This host's profile from the cache in `dir`, or measured by `measure`
/// and cached there. `None` when it can be neither read nor measured; a
/// cache that cannot be written only costs the next run a measurement.
/// `notice` is told when measuring starts, and why a step fails.
pub fn load_or_measure(
    dir: Option<&Path>,
    key: &HostKey,
    measure: impl FnOnce() -> Result<Calibration>,
    notice: &dyn Fn(&str),
) -> Option<Calibration> {
    let path = dir.map(|d| d.join(key.file_name()));
    if let Some(cal) = path.as_deref().and_then(|p| read_cached(p, key)) {
        return Some(cal);
    }
    let whereto = path
        .as_deref()
        .map_or("not cached: no cache folder".to_string(), |p| {
            format!("cached in {}", p.display())
        });
    notice(&format!(
        "measuring this host's CPU for the step prediction, once ({whereto}; {NOMINAL_VAR}=1 skips it)"
    ));
    let cal = match measure() {
        Ok(cal) => cal,
        Err(e) => {
            notice(&format!(
                "could not profile this host ({e:#}); predicting from nominal figures"
            ));
            return None;
        }
    };
    if let Some(path) = &path {
        let written = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                let text = serde_json::to_string_pretty(&cal)? + "\n";
                output::write_atomic(path, text.as_bytes())
            });
        if let Err(e) = written {
            notice(&format!("could not cache the host profile: {e:#}"));
        }
    }
    Some(cal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_cost_models::calibration::{InterpreterCost, MatmulSample, OpRate, ThreadSlowdown};
    use std::cell::Cell;
    use std::collections::HashMap;

    fn key() -> HostKey {
        HostKey {
            cpu: "AMD EPYC 9654 96-Core Processor".into(),
            cores: 2,
            version: "0.1.0".into(),
            precisions: vec![DType::F32, DType::F64],
        }
    }

    /// A calibration with every figure the profiler measures, for `key`'s precisions.
    fn measured(about: &str) -> Calibration {
        let mut cal = Calibration {
            about: about.into(),
            ..Calibration::default()
        };
        for dtype in [DType::F32, DType::F64] {
            cal.matmul.measured.push(MatmulSample {
                m: 8,
                n: 8,
                k: 8,
                dtype,
                flops_per_s: 1e10,
            });
            cal.ops.push(OpRate {
                op: "Add".into(),
                dtype,
                at_bytes: Some(1e3),
                bytes_per_s: Some(1e9),
                flops_per_s: None,
            });
        }
        cal.memory.measured_bytes_per_s = Some(2e10);
        cal.network.measured_intra_node_bytes_per_s = Some(4e9);
        cal.network.measured_intra_node_latency_s = Some(2e-5);
        cal.threads = vec![ThreadSlowdown {
            threads: 1,
            slowdown: 1.0,
        }];
        cal.interpreter = Some(InterpreterCost {
            node_factor: 1.0,
            instruction_overhead_s: 3e-7,
            collective_overhead_s: Some(2e-5),
        });
        cal
    }

    #[test]
    fn the_cache_folder_is_autopars_then_xdgs_then_the_homes() {
        let dir = |vars: &[(&str, &str)]| {
            let vars: HashMap<String, OsString> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), OsString::from(v)))
                .collect();
            cache_dir(&|name| vars.get(name).cloned())
        };
        let all = [(CACHE_DIR_VAR, "/c"), (XDG_CACHE_VAR, "/x"), ("HOME", "/h")];
        assert_eq!(dir(&all), Some(PathBuf::from("/c")));
        assert_eq!(dir(&all[1..]), Some(PathBuf::from("/x/autopar")));
        assert_eq!(dir(&all[2..]), Some(PathBuf::from("/h/.cache/autopar")));
        // Empty values are unset.
        assert_eq!(
            dir(&[(CACHE_DIR_VAR, ""), (XDG_CACHE_VAR, ""), ("HOME", "/h")]),
            Some(PathBuf::from("/h/.cache/autopar"))
        );
        assert_eq!(dir(&[]), None);
    }

    #[test]
    fn the_file_name_carries_what_makes_a_profile_valid() {
        let k = key();
        assert_eq!(
            k.file_name(),
            "cpu-amd-epyc-9654-96-core-processor-2cores-autopar0.1.0-f32-f64.json"
        );
        let differs = |edit: &dyn Fn(&mut HostKey)| {
            let mut other = key();
            edit(&mut other);
            other.file_name() != k.file_name()
        };
        assert!(differs(&|k| k.cpu = "Intel Xeon".into()));
        assert!(differs(&|k| k.cores = 4));
        assert!(differs(&|k| k.version = "0.2.0".into()));
        assert!(differs(&|k| k.precisions = vec![DType::F32]));
    }

    #[test]
    fn a_profile_is_measured_once_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("nested").join("autopar");
        let calls = Cell::new(0);
        let measure = || {
            calls.set(calls.get() + 1);
            Ok(measured("first"))
        };
        let first = load_or_measure(Some(&folder), &key(), measure, &|_| {}).unwrap();
        assert_eq!(calls.get(), 1);
        let file = folder.join(key().file_name());
        assert_eq!(read_cached(&file, &key()), Some(first.clone()));
        let again = load_or_measure(Some(&folder), &key(), || panic!("measured again"), &|_| {});
        assert_eq!(again, Some(first));
        // No temp files are left beside it.
        assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 1);
    }

    #[test]
    fn a_corrupt_or_incomplete_cache_is_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(key().file_name());
        let mut incomplete = measured("no interpreter cost");
        incomplete.interpreter = None;
        let mut one_precision = measured("no f64");
        one_precision.ops.retain(|r| r.dtype == DType::F32);
        let mut no_latency = measured("from before latencies were measured");
        no_latency.network.measured_intra_node_latency_s = None;
        let mut no_collective_cost = measured("from before collectives were measured in a run");
        no_collective_cost.interpreter = no_collective_cost.interpreter.map(|c| InterpreterCost {
            collective_overhead_s: None,
            ..c
        });
        for stale in [
            "{\"format\": \"autopar-calibration/1\", \"matmul\": ".to_string(),
            "not json at all".to_string(),
            "{\"format\": \"autopar-calibration/0\"}".to_string(),
            serde_json::to_string(&incomplete).unwrap(),
            serde_json::to_string(&one_precision).unwrap(),
            serde_json::to_string(&no_latency).unwrap(),
            serde_json::to_string(&no_collective_cost).unwrap(),
        ] {
            std::fs::write(&file, &stale).unwrap();
            let notices = std::cell::RefCell::new(Vec::new());
            let cal = load_or_measure(Some(dir.path()), &key(), || Ok(measured("fresh")), &|n| {
                notices.borrow_mut().push(n.to_string())
            });
            assert_eq!(cal.map(|c| c.about), Some("fresh".to_string()), "{stale}");
            assert!(notices.borrow()[0].contains("measuring this host"), "{notices:?}");
            assert_eq!(
                read_cached(&file, &key()).map(|c| c.about),
                Some("fresh".into()),
                "{stale}"
            );
        }
    }

    #[test]
    fn a_failed_measurement_or_an_unwritable_cache_is_no_error() {
        let notices = std::cell::RefCell::new(Vec::new());
        let note = |n: &str| notices.borrow_mut().push(n.to_string());
        let failed = load_or_measure(None, &key(), || bail!("no timer"), &note);
        assert_eq!(failed, None);
        assert!(notices.borrow()[1].contains("no timer"), "{notices:?}");
        // A file where the cache folder should be: measured, used, not cached.
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        let cal = load_or_measure(Some(&blocker), &key(), || Ok(measured("fresh")), &note);
        assert_eq!(cal.map(|c| c.about), Some("fresh".into()));
        assert!(
            notices.borrow().last().unwrap().contains("could not cache"),
            "{notices:?}"
        );
    }

    #[test]
    fn the_nominal_switch_takes_1_or_0() {
        for (value, expected) in [
            (None, Some(false)),
            (Some("1"), Some(true)),
            (Some("0"), Some(false)),
            (Some(""), Some(false)),
            (Some("yes"), None),
        ] {
            let got = nominal_switch(value);
            match expected {
                Some(e) => assert_eq!(got.unwrap(), e, "{value:?}"),
                None => assert!(
                    got.unwrap_err().to_string().contains("AUTOPAR_NOMINAL_CPU='yes'"),
                    "{value:?}"
                ),
            }
        }
    }
}

//! Efficiency assumptions: how much of a device's peak FLOP/s, memory
//! bandwidth and link bandwidth real kernels and collectives reach.
//!
//! The defaults are documented assumptions for NVIDIA data-centre GPUs with
//! cuBLAS and NCCL (see each field). A calibration JSON file
//! (`autopar-calibration/1`) overrides any subset of them; `autopar profile`
//! writes one with measured absolute rates for a host, which then replace the
//! `fraction × hardware peak` products.

use autopar_ir::DType;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Format tag written into and required from calibration files.
pub const FORMAT: &str = "autopar-calibration/1";

/// Efficiencies the compute and communication models apply to hardware peaks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Calibration {
    /// Always [`FORMAT`].
    pub format: String,
    /// Where the numbers come from (free text).
    pub about: String,
    pub matmul: MatmulEfficiency,
    pub memory: MemoryEfficiency,
    pub network: NetworkEfficiency,
    /// Fixed cost per kernel launch, seconds (host launch plus tail effects).
    pub kernel_overhead_s: f64,
    /// Measured rates of individual ops (the CPU backend's kernels, from
    /// `autopar profile --backend cpu`); see [`Calibration::measured_op_time`].
    /// Empty (and left out of the file) when not measured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<OpRate>,
    /// How much slower each thread computes when this many run at once
    /// (shared caches, memory bandwidth, hyper-threads); see
    /// [`Calibration::thread_slowdown`]. Empty (and left out) when not measured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadSlowdown>,
    /// What an interpreter adds to its kernels inside a real step (the CPU
    /// backend); absent (and left out) when not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<InterpreterCost>,
}

/// An interpreter's cost beyond its kernels' timing loops, measured in a
/// traced training step: kernels run `node_factor` times slower than alone
/// (fresh buffers, colder caches), each instruction adds
/// `instruction_overhead_s` of bookkeeping between kernels, and each
/// data-parallel collective `collective_overhead_s` beyond the link model
/// (handing it to the communication stream, staging its buffers through
/// host memory, storing what it returns).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InterpreterCost {
    pub node_factor: f64,
    pub instruction_overhead_s: f64,
    /// Absent in profiles measured before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_overhead_s: Option<f64>,
}

/// Per-thread time of a kernel mix with `threads` threads running it at
/// once, over its time alone; with more threads than cores, over its time
/// alone times `threads / cores` (its share of a core), so that what is
/// left is the cost of taking turns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThreadSlowdown {
    pub threads: usize,
    pub slowdown: f64,
}

/// The measured speed of one op's kernel in one dtype, on nodes of about
/// one size.
///
/// Its time on a node is `max(flops / flops_per_s, bytes / bytes_per_s)`
/// over the rates present, plus the per-kernel overhead, where `flops` and
/// `bytes` are what `Op::cost` reports for the node (forward FLOPs; bytes
/// read plus written, counted at the dtypes the kernel computes in). The
/// profiler records whichever of the two measures predicts the op's
/// instances best; at least one is present.
///
/// Speed per byte changes with size as tensors outgrow the caches, so an op
/// may have several rates, each measured on nodes of about `at_bytes`; the
/// one nearest a node's bytes (in log scale) prices it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpRate {
    /// `Op::name()`: `Mul`, `Erf`, `LayerNorm`, `ReduceSum`, ...
    pub op: String,
    /// The dtype the kernel computes in (an `f64` run's widened tensors are `f64`).
    pub dtype: DType,
    /// Typical bytes of the nodes measured; absent: any size (a rate with a
    /// size is preferred).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_bytes: Option<f64>,
    /// Bytes read plus written per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_s: Option<f64>,
    /// Forward FLOPs per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_per_s: Option<f64>,
}

/// Matrix-multiply throughput as a function of shape.
///
/// Without measurements the rate is `peak × peak_fraction × Π_d d/(d + half_dim)`
/// over the three GEMM dims `m, n, k`: large GEMMs approach `peak_fraction` of
/// peak, and a dim of `half_dim` halves the rate (tile under-use, low
/// arithmetic intensity). Measured samples, when present for the dtype, win:
/// the sample nearest in `log m, log n, log k` gives the rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MatmulEfficiency {
    pub peak_fraction: f64,
    pub half_dim: f64,
    pub measured: Vec<MatmulSample>,
}

/// One measured GEMM rate: `[m, k] × [k, n]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MatmulSample {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    pub flops_per_s: f64,
}

/// Memory-bound kernels (element-wise, normalisation, softmax, optimizer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryEfficiency {
    /// Share of the device's memory bandwidth streaming kernels reach.
    pub bandwidth_fraction: f64,
    /// Measured streaming bandwidth, bytes/s; replaces `bandwidth_fraction × peak`.
    pub measured_bytes_per_s: Option<f64>,
}

/// Collectives and point-to-point transfers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkEfficiency {
    /// Share of the intra-node link bandwidth collectives reach.
    pub intra_node_fraction: f64,
    /// Share of the inter-node link bandwidth collectives reach.
    pub inter_node_fraction: f64,
    /// Measured intra-node collective bandwidth per rank and direction,
    /// bytes/s; replaces `intra_node_fraction × link bandwidth`.
    pub measured_intra_node_bytes_per_s: Option<f64>,
    /// Measured inter-node collective bandwidth per rank and direction
    /// (one rank per node in each ring, every ring at once), bytes/s;
    /// replaces `inter_node_fraction × link bandwidth`.
    pub measured_inter_node_bytes_per_s: Option<f64>,
    /// Measured seconds per message of an intra-node ring (the alpha of the
    /// alpha-beta model); replaces the link's latency. Between threads of
    /// one process it is a wake-up and a hand-off, tens of times the
    /// nominal figure, and ZeRO-3's per-tensor gathers pay it many times.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_intra_node_latency_s: Option<f64>,
    /// The same between nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_inter_node_latency_s: Option<f64>,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            format: FORMAT.into(),
            about: "built-in defaults: documented efficiency assumptions".into(),
            matmul: MatmulEfficiency::default(),
            memory: MemoryEfficiency::default(),
            network: NetworkEfficiency::default(),
            // The GPU-side gap between dependent kernels (launches are
            // asynchronous, so host launch latency is mostly hidden) plus
            // each kernel's partially idle ramp and tail.
            kernel_overhead_s: 2e-6,
            ops: Vec::new(),
            threads: Vec::new(),
            interpreter: None,
        }
    }
}

impl Default for MatmulEfficiency {
    fn default() -> Self {
        MatmulEfficiency {
            // Large bf16 GEMMs of training shapes sustain about 72 % of the
            // datasheet dense peak: cuBLAS reaches 80-85 % of the peak at the
            // clock it runs, and sustained training load holds the clock
            // below the boost clock the peak is quoted at (power capping).
            peak_fraction: 0.72,
            // Tensor-core tiles are 128-256 wide; a dim of 64 (a typical head
            // dim) leaves most of a tile's work unused.
            half_dim: 64.0,
            measured: Vec::new(),
        }
    }
}

impl Default for MemoryEfficiency {
    fn default() -> Self {
        // Streaming kernels reach 80-90 % of HBM bandwidth; fused element-wise
        // chains in training frameworks are at the low end.
        MemoryEfficiency {
            bandwidth_fraction: 0.8,
            measured_bytes_per_s: None,
        }
    }
}

impl Default for NetworkEfficiency {
    fn default() -> Self {
        // NCCL bus bandwidth: about 80 % of NVLink per-direction bandwidth
        // inside a node and about 90 % of InfiniBand line rate across nodes.
        NetworkEfficiency {
            intra_node_fraction: 0.8,
            inter_node_fraction: 0.9,
            measured_intra_node_bytes_per_s: None,
            measured_inter_node_bytes_per_s: None,
            measured_intra_node_latency_s: None,
            measured_inter_node_latency_s: None,
        }
    }
}

/// Why a calibration file could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CalibrationError {
    #[error("{origin}: cannot read: {message}")]
    Io { origin: String, message: String },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: field '{field}': {message}")]
    Field {
        origin: String,
        field: String,
        message: String,
    },
}

impl Calibration {
    /// How much slower each of `threads` concurrent threads computes than
    /// one alone: the measurement for the largest count not above
    /// `threads` (1 when none was measured).
    pub fn thread_slowdown(&self, threads: usize) -> f64 {
        self.threads
            .iter()
            .filter(|t| t.threads <= threads)
            .max_by_key(|t| t.threads)
            .map_or(1.0, |t| t.slowdown.max(1.0))
    }

    /// Reads a calibration JSON file; absent fields keep their defaults.
    pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| CalibrationError::Io {
            origin: origin.clone(),
            message: e.to_string(),
        })?;
        Calibration::from_json(&text, &origin)
    }

    /// Parses and validates calibration JSON; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Calibration, CalibrationError> {
        let cal: Calibration = serde_json::from_str(text).map_err(|e| CalibrationError::Parse {
            origin: origin.into(),
            message: e.to_string(),
        })?;
        cal.validate(origin)?;
        Ok(cal)
    }

    fn validate(&self, origin: &str) -> Result<(), CalibrationError> {
        let field = |field: &str, message: String| CalibrationError::Field {
            origin: origin.into(),
            field: field.into(),
            message,
        };
        if self.format != FORMAT {
            return Err(field(
                "format",
                format!("expected '{FORMAT}', found '{}'", self.format),
            ));
        }
        let fractions = [
            ("matmul.peak_fraction", self.matmul.peak_fraction),
            ("memory.bandwidth_fraction", self.memory.bandwidth_fraction),
            ("network.intra_node_fraction", self.network.intra_node_fraction),
            ("network.inter_node_fraction", self.network.inter_node_fraction),
        ];
        for (name, v) in fractions {
            if !(v > 0.0 && v <= 1.0) {
                return Err(field(name, format!("must be in (0, 1], found {v}")));
            }
        }
        for (i, t) in self.threads.iter().enumerate() {
            if t.threads == 0 || !(t.slowdown.is_finite() && t.slowdown > 0.0) {
                return Err(field(
                    &format!("threads[{i}]"),
                    "needs threads >= 1 and a positive, finite slowdown".into(),
                ));
            }
        }
        let positive = [
            ("matmul.half_dim", Some(self.matmul.half_dim), true),
            ("kernel_overhead_s", Some(self.kernel_overhead_s), true),
            (
                "memory.measured_bytes_per_s",
                self.memory.measured_bytes_per_s,
                false,
            ),
            (
                "network.measured_intra_node_bytes_per_s",
                self.network.measured_intra_node_bytes_per_s,
                false,
            ),
            (
                "network.measured_inter_node_bytes_per_s",
                self.network.measured_inter_node_bytes_per_s,
                false,
            ),
            (
                "network.measured_intra_node_latency_s",
                self.network.measured_intra_node_latency_s,
                true,
            ),
            (
                "network.measured_inter_node_latency_s",
                self.network.measured_inter_node_latency_s,
                true,
            ),
        ];
        for (name, v, zero_ok) in positive {
            if let Some(v) = v {
                let ok = if zero_ok { v >= 0.0 } else { v > 0.0 };
                if !ok || !v.is_finite() {
                    return Err(field(
                        name,
                        format!("must be a finite positive number, found {v}"),
                    ));
                }
            }
        }
        for (i, s) in self.matmul.measured.iter().enumerate() {
            if s.m == 0 || s.n == 0 || s.k == 0 || !(s.flops_per_s > 0.0 && s.flops_per_s.is_finite()) {
                return Err(field(
                    &format!("matmul.measured[{i}]"),
                    "needs positive m, n, k and flops_per_s".into(),
                ));
            }
        }
        for (i, r) in self.ops.iter().enumerate() {
            let rates = [r.bytes_per_s, r.flops_per_s];
            let valid = |v: f64| v > 0.0 && v.is_finite();
            if r.op.is_empty()
                || rates.iter().all(Option::is_none)
                || !rates.iter().chain(&[r.at_bytes]).flatten().all(|&v| valid(v))
            {
                return Err(field(
                    &format!("ops[{i}]"),
                    "needs an op name, a positive bytes_per_s or flops_per_s, and a positive at_bytes if any"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Seconds the measured kernel of `op_name` in `dtype` takes on a node
    /// with `flops` forward FLOPs moving `bytes` bytes (see [`OpRate`]; the
    /// rate measured nearest in size), without the per-kernel overhead (add
    /// `kernel_overhead_s`). `None` when that op and dtype were not measured.
    pub fn measured_op_time(&self, op_name: &str, dtype: DType, flops: f64, bytes: f64) -> Option<f64> {
        let log = |x: f64| x.max(1.0).ln();
        let rate = self
            .ops
            .iter()
            .filter(|r| r.op == op_name && r.dtype == dtype)
            .min_by(|a, b| {
                let distance = |r: &OpRate| r.at_bytes.map_or(f64::INFINITY, |s| (log(s) - log(bytes)).abs());
                distance(a).total_cmp(&distance(b))
            })?;
        let by_flops = rate.flops_per_s.map_or(0.0, |r| flops / r);
        let by_bytes = rate.bytes_per_s.map_or(0.0, |r| bytes / r);
        Some(by_flops.max(by_bytes))
    }

    /// Achieved FLOP/s of an `[m, k] × [k, n]` product in `dtype` on a
    /// device whose peak for it is `peak`.
    pub fn matmul_rate(&self, peak: f64, dtype: DType, m: f64, n: f64, k: f64) -> f64 {
        let log = |x: f64| x.max(1.0).ln();
        let nearest = self
            .matmul
            .measured
            .iter()
            .filter(|s| s.dtype == dtype)
            .map(|s| {
                let d = (log(s.m as f64) - log(m)).powi(2)
                    + (log(s.n as f64) - log(n)).powi(2)
                    + (log(s.k as f64) - log(k)).powi(2);
                (d, s.flops_per_s)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, rate)) = nearest {
            return rate;
        }
        let h = self.matmul.half_dim;
        let shape = [m, n, k].iter().map(|&d| d / (d + h)).product::<f64>();
        peak * self.matmul.peak_fraction * shape
    }

    /// Achieved streaming bandwidth on a device with `peak` bytes/s.
    pub fn memory_rate(&self, peak: f64) -> f64 {
        self.memory
            .measured_bytes_per_s
            .unwrap_or(peak * self.memory.bandwidth_fraction)
    }

    /// `link` with the achievable bandwidth, and the measured latency where
    /// there is one, for its level.
    pub fn effective_link(&self, link: crate::Link, intra_node: bool) -> crate::Link {
        let n = &self.network;
        let (bandwidth, latency) = if intra_node {
            (
                n.measured_intra_node_bytes_per_s
                    .unwrap_or(link.bandwidth * n.intra_node_fraction),
                n.measured_intra_node_latency_s,
            )
        } else {
            (
                n.measured_inter_node_bytes_per_s
                    .unwrap_or(link.bandwidth * n.inter_node_fraction),
                n.measured_inter_node_latency_s,
            )
        };
        crate::Link {
            bandwidth,
            latency: latency.unwrap_or(link.latency),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_through_json() {
        let cal = Calibration::default();
        let text = serde_json::to_string(&cal).unwrap();
        assert_eq!(Calibration::from_json(&text, "x").unwrap(), cal);
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let cal = Calibration::from_json(
            r#"{"format": "autopar-calibration/1", "memory": {"bandwidth_fraction": 0.5}}"#,
            "c.json",
        )
        .unwrap();
        assert_eq!(cal.memory.bandwidth_fraction, 0.5);
        assert_eq!(cal.matmul, MatmulEfficiency::default());
    }

    /// A measured rate replaces fraction × link bandwidth, and a measured
    /// latency the link's, each at its own level only.
    #[test]
    fn measured_network_figures_replace_the_links() {
        let link = crate::Link {
            bandwidth: 100e9,
            latency: 5e-6,
        };
        let mut cal = Calibration::default();
        assert_eq!(cal.effective_link(link, true).bandwidth, 80e9);
        assert_eq!(cal.effective_link(link, false).bandwidth, 90e9);
        cal.network.measured_intra_node_bytes_per_s = Some(150e9);
        cal.network.measured_inter_node_bytes_per_s = Some(20e9);
        assert_eq!(cal.effective_link(link, true).bandwidth, 150e9);
        assert_eq!(
            cal.effective_link(link, false),
            crate::Link {
                bandwidth: 20e9,
                ..link
            }
        );
        cal.network.measured_intra_node_latency_s = Some(2e-5);
        assert_eq!(cal.effective_link(link, true).latency, 2e-5);
        assert_eq!(cal.effective_link(link, false).latency, 5e-6);
        cal.network.measured_inter_node_latency_s = Some(3e-5);
        assert_eq!(cal.effective_link(link, false).latency, 3e-5);
        let text = serde_json::to_string(&cal).unwrap();
        assert_eq!(Calibration::from_json(&text, "x").unwrap(), cal);
        for field in ["measured_inter_node_bytes_per_s", "measured_intra_node_latency_s"] {
            let json = format!(r#"{{"format": "autopar-calibration/1", "network": {{"{field}": -1}}}}"#);
            let err = Calibration::from_json(&json, "c.json").unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let err = Calibration::from_json(
            r#"{"format": "autopar-calibration/1", "network": {"inter_node_fraction": 1.5}}"#,
            "c.json",
        )
        .unwrap_err();
        assert!(err.to_string().contains("network.inter_node_fraction"), "{err}");
        let err = Calibration::from_json(r#"{"format": "v0"}"#, "c.json").unwrap_err();
        assert!(err.to_string().contains("format"), "{err}");
        let err = Calibration::from_json(r#"{"matmull": {}}"#, "c.json").unwrap_err();
        assert!(err.to_string().contains("matmull"), "{err}");
    }

    fn rate(op: &str, dtype: DType, bytes_per_s: Option<f64>, flops_per_s: Option<f64>) -> OpRate {
        OpRate {
            op: op.into(),
            dtype,
            at_bytes: None,
            bytes_per_s,
            flops_per_s,
        }
    }

    #[test]
    fn op_rates_round_trip_and_are_left_out_when_empty() {
        let mut cal = Calibration::default();
        assert!(!serde_json::to_string(&cal).unwrap().contains("\"ops\""));
        cal.ops = vec![
            OpRate {
                at_bytes: Some(1e6),
                ..rate("Erf", DType::F32, Some(4e8), None)
            },
            rate("Attention", DType::F64, None, Some(2e9)),
        ];
        let text = serde_json::to_string_pretty(&cal).unwrap();
        assert_eq!(Calibration::from_json(&text, "x").unwrap(), cal);
    }

    #[test]
    fn a_file_without_op_rates_still_loads() {
        let cal = Calibration::from_json(
            r#"{"format": "autopar-calibration/1", "about": "old profile", "kernel_overhead_s": 1e-6,
                "memory": {"measured_bytes_per_s": 5e9}}"#,
            "old.json",
        )
        .unwrap();
        assert!(cal.ops.is_empty());
        assert_eq!(cal.measured_op_time("Add", DType::F32, 1.0, 12.0), None);
    }

    #[test]
    fn bad_op_rates_are_named() {
        for ops in [
            r#"[{"op": "Erf", "dtype": "f32"}]"#,
            r#"[{"op": "Erf", "dtype": "f32", "bytes_per_s": 0}]"#,
            r#"[{"op": "", "dtype": "f32", "bytes_per_s": 1e9}]"#,
            r#"[{"op": "Erf", "dtype": "f32", "bytes_per_s": 1e9, "at_bytes": 0}]"#,
            r#"[{"op": "Mul", "dtype": "f32", "bytes_per_s": 1e9}, {"op": "Erf", "dtype": "f32", "flops_per_s": -1}]"#,
        ] {
            let text = format!(r#"{{"format": "autopar-calibration/1", "ops": {ops}}}"#);
            let err = Calibration::from_json(&text, "c.json").unwrap_err();
            assert!(err.to_string().contains("ops["), "{ops}: {err}");
        }
        let err = Calibration::from_json(
            r#"{"format": "autopar-calibration/1", "ops": [{"op": "Erf", "dtype": "f32", "bytes_per_s": 1, "speed": 2}]}"#,
            "c.json",
        )
        .unwrap_err();
        assert!(err.to_string().contains("speed"), "{err}");
    }

    #[test]
    fn thread_slowdown_takes_the_nearest_count_below() {
        let cal = Calibration {
            threads: vec![
                ThreadSlowdown {
                    threads: 1,
                    slowdown: 1.0,
                },
                ThreadSlowdown {
                    threads: 2,
                    slowdown: 1.5,
                },
            ],
            ..Calibration::default()
        };
        assert_eq!(cal.thread_slowdown(1), 1.0);
        assert_eq!(cal.thread_slowdown(2), 1.5);
        assert_eq!(cal.thread_slowdown(8), 1.5);
        assert_eq!(Calibration::default().thread_slowdown(4), 1.0);
        let bad = r#"{"format": "autopar-calibration/1", "threads": [{"threads": 0, "slowdown": 1.0}]}"#;
        let err = Calibration::from_json(bad, "t.json").unwrap_err();
        assert!(err.to_string().contains("threads[0]"), "{err}");
    }

    #[test]
    fn measured_op_time_takes_the_slower_of_bytes_and_flops() {
        let cal = Calibration {
            ops: vec![
                rate("Erf", DType::F32, Some(100.0), None),
                rate("Erf", DType::F64, Some(50.0), None),
                rate("Attention", DType::F32, Some(1000.0), Some(10.0)),
            ],
            ..Calibration::default()
        };
        assert_eq!(cal.measured_op_time("Erf", DType::F32, 7.0, 300.0), Some(3.0));
        assert_eq!(cal.measured_op_time("Erf", DType::F64, 7.0, 300.0), Some(6.0));
        // FLOP-bound, then byte-bound.
        assert_eq!(
            cal.measured_op_time("Attention", DType::F32, 50.0, 1000.0),
            Some(5.0)
        );
        assert_eq!(
            cal.measured_op_time("Attention", DType::F32, 5.0, 4000.0),
            Some(4.0)
        );
        assert_eq!(cal.measured_op_time("Erf", DType::Bf16, 7.0, 300.0), None);
        assert_eq!(cal.measured_op_time("Tanh", DType::F32, 7.0, 300.0), None);
    }

    #[test]
    fn the_rate_measured_nearest_in_size_prices_a_node() {
        let sized = |at_bytes: f64, bytes_per_s: f64| OpRate {
            at_bytes: Some(at_bytes),
            ..rate("ReduceSum", DType::F32, Some(bytes_per_s), None)
        };
        let cal = Calibration {
            ops: vec![
                rate("ReduceSum", DType::F32, Some(1.0), None),
                sized(1e3, 100.0),
                sized(1e6, 10.0),
            ],
            ..Calibration::default()
        };
        let time = |bytes| cal.measured_op_time("ReduceSum", DType::F32, 0.0, bytes);
        assert_eq!(time(500.0), Some(5.0));
        assert_eq!(time(2e4), Some(200.0));
        assert_eq!(time(5e4), Some(5e3));
        assert_eq!(time(1e9), Some(1e8));
    }

    #[test]
    fn matmul_rate_saturates_with_size_and_prefers_measurements() {
        let mut cal = Calibration::default();
        let peak = 100.0;
        let big = cal.matmul_rate(peak, DType::Bf16, 1e6, 1e6, 1e6);
        assert!((big - 72.0).abs() < 0.1);
        let at_half = cal.matmul_rate(peak, DType::Bf16, 1e9, 1e9, 64.0);
        assert!((at_half - 36.0).abs() < 0.01);
        cal.matmul.measured = vec![
            MatmulSample {
                m: 64,
                n: 64,
                k: 64,
                dtype: DType::F32,
                flops_per_s: 1.0,
            },
            MatmulSample {
                m: 1024,
                n: 1024,
                k: 1024,
                dtype: DType::F32,
                flops_per_s: 7.0,
            },
        ];
        assert_eq!(cal.matmul_rate(peak, DType::F32, 900.0, 1200.0, 1000.0), 7.0);
        assert_eq!(cal.matmul_rate(peak, DType::F32, 50.0, 70.0, 64.0), 1.0);
        // No sample for this dtype: the curve.
        assert!((cal.matmul_rate(peak, DType::Bf16, 1e6, 1e6, 1e6) - 72.0).abs() < 0.1);
    }
}

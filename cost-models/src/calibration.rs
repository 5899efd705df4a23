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
        Ok(())
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

    /// `link` with the achievable bandwidth for its level.
    pub fn effective_link(&self, link: crate::Link, intra_node: bool) -> crate::Link {
        let bandwidth = if intra_node {
            self.network
                .measured_intra_node_bytes_per_s
                .unwrap_or(link.bandwidth * self.network.intra_node_fraction)
        } else {
            link.bandwidth * self.network.inter_node_fraction
        };
        crate::Link { bandwidth, ..link }
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

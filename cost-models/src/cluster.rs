//! Cluster descriptions: which device every rank has and how ranks talk,
//! per link level (inside a node, between nodes).
//!
//! A cluster comes from a preset name (`dgx-a100-80g`, `dgx-h100`,
//! `hgx-h200`, `p3-v100`, `cpu`) or a TOML file in the same format as the
//! preset files in `presets/` (units are in the key names:
//! `memory_gib`, `memory_bandwidth_gb_s`, `peak_tflops`, `bandwidth_gb_s` per
//! GPU and direction, `latency_us`). Ranks fill nodes in order: rank `r` is on
//! node `r / gpus_per_node`.

use autopar_ir::DType;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

const GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;

/// The most devices a cluster may have (nodes × GPUs per node, or
/// `--gpus`): above the largest training clusters built (about 200,000
/// GPUs). Plans list every rank, and the search and layout grow with the
/// count, so a larger number is a typo, refused before any work.
pub const MAX_GPUS: usize = 1 << 18;

/// One accelerator (or, for the `cpu` preset, one CPU rank).
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub name: String,
    /// Dense peak FLOP/s per element type.
    pub peak_flops: BTreeMap<DType, f64>,
    /// Memory per device in bytes.
    pub memory_bytes: f64,
    /// Memory bandwidth in bytes/s.
    pub memory_bandwidth: f64,
    /// How much of the datasheet peak the device's matrix units sustain
    /// against the A100 the default calibration was fitted on (SC'21
    /// Table 1): 1 there; below 1 where sustained load holds the clock
    /// further below the boost clock the peak is quoted at.
    pub sustained_fraction: f64,
}

impl Device {
    /// Peak FLOP/s for `dtype`, if the device lists it (the datasheet's:
    /// the denominator of MFU).
    pub fn peak(&self, dtype: DType) -> Option<f64> {
        self.peak_flops.get(&dtype).copied()
    }

    /// The peak GEMMs in `dtype` run against: the datasheet's, sustained.
    pub fn matmul_peak(&self, dtype: DType) -> Option<f64> {
        self.peak(dtype).map(|p| p * self.sustained_fraction)
    }
}

/// One link level: what a GPU can send (and, at the same time, receive).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Bytes/s per GPU in each direction.
    pub bandwidth: f64,
    /// Seconds per message (the alpha of alpha-beta models).
    pub latency: f64,
}

/// A homogeneous cluster of `nodes × gpus_per_node` devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub nodes: usize,
    pub gpus_per_node: usize,
    pub device: Device,
    pub intra_node: Link,
    pub inter_node: Link,
}

/// Why a cluster description could not be used; names the file or preset and field.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ClusterError {
    #[error("unknown cluster preset '{0}' (presets: {presets}; or give a .toml file)", presets = PRESET_NAMES.join(", "))]
    UnknownPreset(String),
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: field '{field}': {message}")]
    Field {
        origin: String,
        field: String,
        message: String,
    },
    #[error("{origin}: cannot read: {message}")]
    Io { origin: String, message: String },
    #[error(
        "{cluster}: --gpus {gpus} is neither at most one node ({per_node} GPUs) nor a whole number of nodes"
    )]
    Gpus {
        cluster: String,
        gpus: usize,
        per_node: usize,
    },
    #[error("{cluster}: --gpus {gpus} is more than a cluster may have ({MAX_GPUS})")]
    TooManyGpus { cluster: String, gpus: usize },
}

/// Names accepted by [`Cluster::preset`].
pub const PRESET_NAMES: [&str; 5] = ["dgx-a100-80g", "dgx-h100", "hgx-h200", "p3-v100", "cpu"];

fn preset_text(name: &str) -> Option<&'static str> {
    Some(match name {
        "dgx-a100-80g" => include_str!("presets/dgx-a100-80g.toml"),
        "dgx-h100" => include_str!("presets/dgx-h100.toml"),
        "hgx-h200" => include_str!("presets/hgx-h200.toml"),
        "p3-v100" => include_str!("presets/p3-v100.toml"),
        _ => return None,
    })
}

/// The TOML layout (see the preset files).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    name: String,
    gpus_per_node: usize,
    #[serde(default = "one")]
    nodes: usize,
    device: DeviceFile,
    intra_node: LinkFile,
    inter_node: LinkFile,
}

fn one() -> usize {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceFile {
    name: String,
    memory_gib: f64,
    memory_bandwidth_gb_s: f64,
    peak_tflops: BTreeMap<DType, f64>,
    #[serde(default = "unit")]
    sustained_fraction: f64,
}

fn unit() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkFile {
    bandwidth_gb_s: f64,
    latency_us: f64,
}

impl Cluster {
    /// A preset by name; `cpu` describes this host.
    pub fn preset(name: &str) -> Result<Cluster, ClusterError> {
        if name == "cpu" {
            return Ok(host_cpu());
        }
        let text = preset_text(name).ok_or_else(|| ClusterError::UnknownPreset(name.to_string()))?;
        Cluster::from_toml(text, &format!("preset '{name}'"))
    }

    /// A preset name, or the path of a TOML file.
    pub fn load(arg: &str) -> Result<Cluster, ClusterError> {
        if !arg.ends_with(".toml") {
            return Cluster::preset(arg);
        }
        let text = std::fs::read_to_string(Path::new(arg)).map_err(|e| ClusterError::Io {
            origin: arg.to_string(),
            message: e.to_string(),
        })?;
        Cluster::from_toml(&text, arg)
    }

    /// Parses and validates a TOML description; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Cluster, ClusterError> {
        let file: ClusterFile = toml::from_str(text).map_err(|e| ClusterError::Parse {
            origin: origin.to_string(),
            message: e.message().to_string(),
        })?;
        let field = |field: &str, message: &str| ClusterError::Field {
            origin: origin.to_string(),
            field: field.to_string(),
            message: message.to_string(),
        };
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(field(name, &format!("must be a positive number, got {v}")))
            }
        };
        if file.gpus_per_node == 0 {
            return Err(field("gpus_per_node", "must be at least 1"));
        }
        if file.nodes == 0 {
            return Err(field("nodes", "must be at least 1"));
        }
        if file.gpus_per_node.saturating_mul(file.nodes) > MAX_GPUS {
            let gpus = file.gpus_per_node.saturating_mul(file.nodes);
            return Err(field(
                "nodes",
                &format!("nodes × gpus_per_node = {gpus} is more than a cluster may have ({MAX_GPUS})"),
            ));
        }
        if file.device.peak_tflops.is_empty() {
            return Err(field("device.peak_tflops", "lists no element type"));
        }
        let mut peak_flops = BTreeMap::new();
        for (dtype, tflops) in &file.device.peak_tflops {
            peak_flops.insert(
                *dtype,
                positive(&format!("device.peak_tflops.{dtype}"), *tflops)? * 1e12,
            );
        }
        let sustained = file.device.sustained_fraction;
        if !(sustained.is_finite() && sustained > 0.0 && sustained <= 1.0) {
            return Err(field(
                "device.sustained_fraction",
                &format!("must be a share of the peak in (0, 1], got {sustained}"),
            ));
        }
        let link = |name: &str, l: &LinkFile| -> Result<Link, ClusterError> {
            let latency = l.latency_us;
            if !(latency.is_finite() && latency >= 0.0) {
                return Err(field(
                    &format!("{name}.latency_us"),
                    "must be a non-negative number",
                ));
            }
            Ok(Link {
                bandwidth: positive(&format!("{name}.bandwidth_gb_s"), l.bandwidth_gb_s)? * GB,
                latency: latency / 1e6,
            })
        };
        Ok(Cluster {
            name: file.name,
            nodes: file.nodes,
            gpus_per_node: file.gpus_per_node,
            device: Device {
                name: file.device.name,
                peak_flops,
                memory_bytes: positive("device.memory_gib", file.device.memory_gib)? * GIB,
                memory_bandwidth: positive(
                    "device.memory_bandwidth_gb_s",
                    file.device.memory_bandwidth_gb_s,
                )? * GB,
                sustained_fraction: sustained,
            },
            intra_node: link("intra_node", &file.intra_node)?,
            inter_node: link("inter_node", &file.inter_node)?,
        })
    }

    /// Resizes to `gpus` devices: a partial single node when `gpus` is at
    /// most one node, else whole nodes.
    pub fn with_gpus(mut self, gpus: usize) -> Result<Cluster, ClusterError> {
        let per_node = self.gpus_per_node;
        if gpus > MAX_GPUS {
            return Err(ClusterError::TooManyGpus {
                cluster: self.name,
                gpus,
            });
        }
        if gpus == 0 || (gpus > per_node && gpus % per_node != 0) {
            return Err(ClusterError::Gpus {
                cluster: self.name,
                gpus,
                per_node,
            });
        }
        if gpus <= per_node {
            self.nodes = 1;
            self.gpus_per_node = gpus;
        } else {
            self.nodes = gpus / per_node;
        }
        Ok(self)
    }

    /// Total devices.
    pub fn gpus(&self) -> usize {
        self.nodes * self.gpus_per_node
    }

    /// The node that rank `rank` is on.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.gpus_per_node
    }
}

/// Threads each of `ranks` ranks running on this host gets by default: an
/// equal share of its cores, at least one. The CPU backend splits a rank's
/// large products over them and the simulator prices them so.
pub fn host_threads_per_rank(ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks.max(1)).max(1)
}

/// This host as a one-node cluster of one rank per core. Peak and bandwidth
/// are nominal (2.5 GHz, two 8-lane f32 FMAs per cycle, 20 GB/s memory,
/// 10 GB/s between ranks through shared memory) until a calibration file
/// measured by `autopar profile` replaces them; memory is the host's.
fn host_cpu() -> Cluster {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let f32_flops = 2.5e9 * 32.0;
    let memory_bytes = host_memory_bytes().unwrap_or(16.0 * GIB);
    let shared_memory = Link {
        bandwidth: 10.0 * GB,
        latency: 1e-6,
    };
    Cluster {
        name: "cpu".into(),
        nodes: 1,
        gpus_per_node: cores,
        device: Device {
            name: "host CPU core".into(),
            peak_flops: BTreeMap::from([(DType::F32, f32_flops), (DType::F64, f32_flops / 2.0)]),
            memory_bytes,
            memory_bandwidth: 20.0 * GB,
            sustained_fraction: 1.0,
        },
        intra_node: shared_memory,
        inter_node: shared_memory,
    }
}

/// `MemTotal` from `/proc/meminfo`, where there is one.
fn host_memory_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_loads() {
        for name in PRESET_NAMES {
            let c = Cluster::preset(name).unwrap();
            assert!(c.gpus() >= 1 && c.device.peak(DType::F32).is_some(), "{name}");
        }
    }

    #[test]
    fn a100_preset_has_the_published_figures() {
        let c = Cluster::preset("dgx-a100-80g").unwrap();
        assert_eq!(c.device.peak(DType::Bf16), Some(312e12));
        assert_eq!(c.device.memory_bytes, 80.0 * GIB);
        assert_eq!(c.intra_node.bandwidth, 300e9);
        assert_eq!(c.inter_node.bandwidth, 25e9);
        assert_eq!(c.inter_node.latency, 5e-6);
    }

    #[test]
    fn hopper_gemms_run_at_a_sustained_share_of_the_datasheet_peak() {
        for name in ["dgx-h100", "hgx-h200"] {
            let d = Cluster::preset(name).unwrap().device;
            assert_eq!(d.peak(DType::Bf16), Some(989e12), "{name}");
            let sustained = d.matmul_peak(DType::Bf16).unwrap();
            assert!((sustained - 0.78 * 989e12).abs() < 1e6, "{name}");
        }
        let a100 = Cluster::preset("dgx-a100-80g").unwrap().device;
        assert_eq!(a100.matmul_peak(DType::Bf16), Some(312e12));
        let text = preset_text("dgx-h100")
            .unwrap()
            .replace("sustained_fraction = 0.78", "sustained_fraction = 1.5");
        let err = Cluster::from_toml(&text, "c.toml").unwrap_err().to_string();
        assert!(err.contains("device.sustained_fraction"), "{err}");
    }

    #[test]
    fn gpus_size_whole_nodes_or_one_partial_node() {
        let c = Cluster::preset("dgx-h100").unwrap();
        let big = c.clone().with_gpus(3072).unwrap();
        assert_eq!((big.nodes, big.gpus_per_node, big.gpus()), (384, 8, 3072));
        assert_eq!(big.node_of(17), 2);
        let small = c.clone().with_gpus(4).unwrap();
        assert_eq!((small.nodes, small.gpus_per_node), (1, 4));
        let err = c.clone().with_gpus(12).unwrap_err().to_string();
        assert!(err.contains("--gpus 12"), "{err}");
        let err = c.with_gpus(0).unwrap_err();
        assert!(
            matches!(
                err,
                ClusterError::Gpus {
                    gpus: 0,
                    per_node: 8,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("--gpus 0"), "{err}");
    }

    #[test]
    fn bad_descriptions_name_the_field() {
        let good = include_str!("presets/dgx-a100-80g.toml");
        let err = |text: &str| Cluster::from_toml(text, "my.toml").unwrap_err().to_string();
        let e = err(&good.replace("memory_gib = 80", "memory_gib = -80"));
        assert!(e.contains("my.toml") && e.contains("device.memory_gib"), "{e}");
        let e = err(&good.replace("gpus_per_node = 8", "gpus_per_node = 0"));
        assert!(e.contains("gpus_per_node"), "{e}");
        let e = err(&good.replace("latency_us = 5.0", "latncy_us = 5.0"));
        assert!(e.contains("latncy_us"), "{e}");
        let e = err(&good.replace("bf16 = 312.0", "bf17 = 312.0"));
        assert!(e.contains("bf17"), "{e}");
        let e = err("name = ");
        assert!(e.starts_with("my.toml: "), "{e}");
        let e = err(&good.replace(
            "gpus_per_node = 8",
            "gpus_per_node = 8\nnodes = 2305843009213693952",
        ));
        assert!(
            e.contains("field 'nodes'") && e.contains(&MAX_GPUS.to_string()),
            "{e}"
        );
    }

    #[test]
    fn absurd_gpu_counts_are_refused_naming_the_limit() {
        let c = Cluster::preset("dgx-h100").unwrap();
        assert!(c.clone().with_gpus(MAX_GPUS).is_ok());
        let e = c.with_gpus(usize::MAX - 7).unwrap_err().to_string();
        assert!(
            e.contains("--gpus 18446744073709551608") && e.contains(&MAX_GPUS.to_string()),
            "{e}"
        );
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = Cluster::load("dgx-a200").unwrap_err().to_string();
        assert!(e.contains("dgx-a200") && e.contains("hgx-h200"), "{e}");
        let e = Cluster::load("/no/such/cluster.toml").unwrap_err().to_string();
        assert!(e.contains("/no/such/cluster.toml"), "{e}");
    }
}

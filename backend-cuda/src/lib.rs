//! The CUDA backend: per-rank [`Program`](autopar_lower::Program)s executed on
//! NVIDIA GPUs with cuBLAS GEMMs, kernels compiled at run time by NVRTC from
//! the `.cu` sources in `kernels/`, and NCCL collectives (or an in-process
//! path for ranks that share one GPU).
//!
//! Everything CUDA is loaded at run time (cudarc's dynamic loading), so the
//! `cuda` feature builds on machines with no CUDA at all; every entry point
//! checks that the libraries and a device are there and returns
//! [`CudaError`] instead of letting the loader panic. Without the feature the
//! same entry points exist and say the binary was built without CUDA, so no
//! `cfg` leaks out of this crate.
//!
//! Architecture invariant: only this crate links cudarc; the rank
//! interpreter (`autopar-exec`) reaches the GPU only through the `Backend`
//! trait implemented here.

mod gate;
pub mod kernels;
pub mod memory;
mod runner;

pub use gate::gpu_or_skip;
pub use runner::CudaRunner;
#[cfg(feature = "cuda")]
pub use {device_comms::CommsError, meetings::MeetingError, nvrtc::NvrtcError};

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
mod bandwidth;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod device_comms;
#[cfg(feature = "cuda")]
mod meetings;
#[cfg(feature = "cuda")]
pub(crate) mod module;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
mod nvrtc;
#[cfg(feature = "cuda")]
mod ops;
#[cfg(feature = "cuda")]
mod profile;
#[cfg(feature = "cuda")]
mod run;
#[cfg(feature = "cuda")]
mod same_device;
#[cfg(feature = "cuda")]
mod tensor;

/// Why the CUDA backend cannot do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("this binary was built without CUDA support (rebuild with `--features cuda`)")]
    NotBuilt,
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    #[error("no GPU: {0}")]
    NoDevice(String),
    #[error("{library} not found: {hint}")]
    MissingLibrary { library: &'static str, hint: String },
    #[error("compiling kernel source '{source_name}' for {arch}: {log}")]
    Compile {
        source_name: String,
        arch: String,
        log: String,
    },
    #[error("{0}")]
    Driver(String),
    #[error("no CUDA kernel named '{name}' was compiled for {arch} (the names are in backend-cuda/src/kernels.rs)")]
    UnknownKernel { name: String, arch: String },
    /// An NVRTC call failed outside a compile (reading its version).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// Collectives between GPUs, or setting them up, failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Comms(#[from] CommsError),
}

/// What [`probe`] found: the device a rank would run on.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability, e.g. (9, 0) for H100/H200.
    pub compute_capability: (u32, u32),
    pub memory_bytes: u64,
    pub devices: usize,
}

/// Checks that the CUDA driver is loadable and device `ordinal` exists.
pub fn probe(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    #[cfg(feature = "cuda")]
    {
        device::probe(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(CudaError::NotBuilt)
    }
}

/// Register use of one compiled kernel, from ptxas.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelReport {
    pub source: String,
    pub kernel: String,
    pub registers: u32,
    pub spill_store_bytes: u64,
    pub spill_load_bytes: u64,
}

/// Compiles every kernel source to machine code for `arch` (e.g. `sm_90`)
/// with NVRTC, which needs no GPU, and reports each kernel's registers and
/// spills.
pub fn compile_all(arch: &str) -> Result<Vec<KernelReport>, CudaError> {
    #[cfg(feature = "cuda")]
    {
        nvrtc::compile_all(arch)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = arch;
        Err(CudaError::NotBuilt)
    }
}

/// How float tensors are stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuPrecision {
    /// Everything in f32: results match the CPU backend closely.
    #[default]
    F32,
    /// bf16 weights and activations, f32 master weights and optimizer state.
    Bf16,
}

/// How to train on the GPU.
#[derive(Debug, Clone, Default)]
pub struct CudaOptions {
    pub precision: GpuPrecision,
    /// The device every rank of this process runs on.
    pub device: usize,
}

/// A CUDA run: the same report as the CPU backend's, plus the device and
/// the nodes that had no device kernel and ran on the host.
#[derive(Debug, Clone)]
pub struct CudaReport {
    pub train: autopar_exec::TrainReport,
    pub device: DeviceInfo,
    /// Op name → nodes of that op run on the host, summed over ranks and steps.
    pub host_nodes: std::collections::BTreeMap<String, usize>,
    /// Per rank: the planned arena of its transient buffers and its model
    /// state (weights, gradients, optimizer), from [`memory::plan_memory`]
    /// at the run's float type.
    pub planned: Vec<memory::MemoryPlan>,
    /// How the ranks' all-reduces ran: "NCCL 2.21.5", or host-staged and why.
    pub collectives: String,
    /// The most bytes the run's tensors held at once on this process's GPU
    /// (every rank it ran), measured from the driver's memory pool; `None`
    /// on a device without memory pools.
    pub measured_peak_bytes: Option<u64>,
    /// The planned bytes (arena and model state) of the ranks this process
    /// ran, to hold the measured peak against.
    pub planned_here_bytes: u64,
}

/// Runs `programs` (one per rank) on one GPU: every rank is a thread with
/// its own stream and cuBLAS handle on device `cuda.device`, and ranks talk
/// through the in-process fabric (host-staged), so any plan (DP, TP, PP,
/// ZeRO, EP) runs on a single GPU.
pub fn train(
    t: &autopar_lower::TrainingGraph,
    programs: &[autopar_lower::Program],
    data: &autopar_exec::train::Data,
    opts: &autopar_exec::TrainOptions,
    cuda: &CudaOptions,
    progress: &(dyn Fn(&autopar_exec::StepReport) + Sync),
) -> Result<CudaReport, autopar_exec::ExecError> {
    #[cfg(feature = "cuda")]
    {
        run::train(t, programs, data, opts, cuda, progress)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (t, programs, data, opts, cuda, progress);
        Err(autopar_exec::ExecError::Backend(CudaError::NotBuilt.to_string()))
    }
}

/// Runs this process's one rank of `programs` on GPU `cuda.device`, its
/// peers in other processes reached through `endpoint` (one process per
/// GPU, as a launcher starts them). All-reduces and ZeRO's reduce-scatters
/// and gathers run on NCCL when every rank has its own GPU and NCCL is
/// installed (`AUTOPAR_NCCL=0` turns it off); the rest is host-staged over
/// TCP.
/// Rank 0 gets the run's report, with the host-run nodes of its own rank;
/// every rank gets its own trace.
pub fn train_rank(
    t: &autopar_lower::TrainingGraph,
    programs: &[autopar_lower::Program],
    endpoint: autopar_comm::collective::Endpoint,
    data: &autopar_exec::train::Data,
    opts: &autopar_exec::TrainOptions,
    cuda: &CudaOptions,
    progress: &(dyn Fn(&autopar_exec::StepReport) + Sync),
) -> Result<autopar_exec::RankResult<CudaReport>, autopar_exec::ExecError> {
    #[cfg(feature = "cuda")]
    {
        run::train_rank(t, programs, endpoint, data, opts, cuda, progress)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (t, programs, endpoint, data, opts, cuda, progress);
        Err(autopar_exec::ExecError::Backend(CudaError::NotBuilt.to_string()))
    }
}

/// Measures GPU `ordinal` (GEMM rates, streaming bandwidth, launch cost)
/// as a calibration file for the cost models, with `network`'s figures
/// where the job measured them ([`profile_network`]). `quick` checks the
/// machinery with small shapes.
pub fn profile(
    ordinal: usize,
    quick: bool,
    network: Option<NetworkProfile>,
) -> Result<autopar_cost_models::Calibration, CudaError> {
    #[cfg(feature = "cuda")]
    {
        profile::profile(ordinal, quick, network)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, quick, network);
        Err(CudaError::NotBuilt)
    }
}

/// NCCL all-reduce bandwidth inside and between the nodes of a launched
/// job (bytes each rank sends per second), or why it was not measured.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkProfile {
    pub intra_node_bytes_per_s: Option<f64>,
    pub inter_node_bytes_per_s: Option<f64>,
    /// How it was measured, or why not.
    pub about: String,
}

impl NetworkProfile {
    /// No figures, for `why`.
    pub fn unmeasured(why: String) -> NetworkProfile {
        NetworkProfile {
            intra_node_bytes_per_s: None,
            inter_node_bytes_per_s: None,
            about: format!("collective bandwidth not measured ({why})"),
        }
    }
}

/// Measures NCCL bandwidth between the job's GPUs from this process's GPU
/// `ordinal`; every process of a launched job calls it with its endpoint
/// at the same point, and all get the same figures.
pub fn profile_network(
    ordinal: usize,
    endpoint: &autopar_comm::collective::Endpoint,
    quick: bool,
) -> Result<NetworkProfile, CudaError> {
    #[cfg(feature = "cuda")]
    {
        bandwidth::profile_network(ordinal, endpoint, quick)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, endpoint, quick);
        Err(CudaError::NotBuilt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_exec::train::{Optimizer, TokenSource};
    use autopar_exec::TrainOptions;
    use autopar_ir::interp::Precision;
    use autopar_lower::{for_strategy, lower, Objective, Strategy};

    /// Every entry point says why there is no GPU (no driver, or a build
    /// without CUDA) instead of panicking in the library loader.
    #[test]
    fn without_a_gpu_every_entry_point_is_an_error() {
        if probe(0).is_ok() {
            eprintln!("skipped without_a_gpu_every_entry_point_is_an_error: this machine has a GPU");
            return;
        }
        let why = probe(0).unwrap_err();
        let expected = if cfg!(feature = "cuda") {
            "no CUDA driver"
        } else {
            "without CUDA"
        };
        assert!(why.to_string().contains(expected), "{why}");
        assert!(profile(0, true, None).unwrap_err().to_string().contains(expected));
        let g = autopar_import::zoo::build("gpt:layers=1,hidden=16,heads=2,vocab=32,seq=4").unwrap();
        let s = Strategy::new(1, 1, 1, 1, 1);
        let t = for_strategy(&g, &s, 4, Objective::Lm).unwrap();
        let programs = lower(&t, &s).unwrap();
        let opts = TrainOptions::new(Precision::F32, Optimizer::sgd(0.1), 1);
        let data = TokenSource::synthetic(32, 1).into();
        let err = train(&t, &programs, &data, &opts, &CudaOptions::default(), &|_| {}).unwrap_err();
        assert!(err.to_string().contains(expected), "{err}");
        // One rank per process: a world of one needs no peers.
        let endpoint = autopar_comm::collective::fabric(1, opts.timeout).remove(0);
        let err = train_rank(
            &t,
            &programs,
            endpoint,
            &data,
            &opts,
            &CudaOptions::default(),
            &|_| {},
        )
        .unwrap_err();
        assert!(err.to_string().contains(expected), "{err}");
        if !cfg!(feature = "cuda") {
            assert!(matches!(compile_all("sm_90"), Err(CudaError::NotBuilt)));
        }
    }
}

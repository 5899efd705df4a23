//! Guarded access to the CUDA driver: cudarc panics when `libcuda` is
//! missing, so every path into it starts here.

use super::{CudaError, DeviceInfo};
use cudarc::driver::{result, sys, CudaContext};
use std::sync::Arc;

/// Loads the driver library and initialises it, or says why not.
pub(crate) fn driver() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver(
            "libcuda.so was not found (is the NVIDIA driver installed, and is this a GPU machine?)".into(),
        ));
    }
    result::init().map_err(|e| CudaError::NoDriver(format!("cuInit failed: {e}")))
}

/// The number of visible devices.
pub(crate) fn device_count() -> Result<usize, CudaError> {
    driver()?;
    let n = result::device::get_count().map_err(|e| CudaError::NoDevice(format!("cuDeviceGetCount: {e}")))?;
    if n <= 0 {
        return Err(CudaError::NoDevice("the driver sees no CUDA device".into()));
    }
    Ok(n as usize)
}

/// A context on device `ordinal`.
pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(CudaError::NoDevice(format!(
            "device {ordinal} asked for, but only {n} visible (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)"
        )));
    }
    CudaContext::new(ordinal)
        .map_err(|e| CudaError::Driver(format!("creating a context on device {ordinal}: {e}")))
}

pub(crate) fn probe(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    let devices = device_count()?;
    let ctx = context(ordinal)?;
    let attr = |a| ctx.attribute(a).map_err(|e| CudaError::Driver(e.to_string()));
    use sys::CUdevice_attribute::*;
    let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32;
    let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32;
    let name = ctx.name().map_err(|e| CudaError::Driver(e.to_string()))?;
    let memory_bytes = ctx.total_mem().map_err(|e| CudaError::Driver(e.to_string()))? as u64;
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: (major, minor),
        memory_bytes,
        devices,
    })
}

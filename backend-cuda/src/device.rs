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

/// The most bytes in use at once in device `ctx`'s default memory pool
/// since the last [`reset_pool_peak`]: every tensor of the run is a
/// stream-ordered allocation from that pool (cuBLAS workspaces, NCCL
/// buffers and kernel images are not). `None` on a device without pools.
pub(crate) fn pool_peak(ctx: &CudaContext) -> Result<Option<u64>, CudaError> {
    let Some(pool) = default_pool(ctx)? else {
        return Ok(None);
    };
    let mut peak: u64 = 0;
    // SAFETY: a valid pool; USED_MEM_HIGH is a cuuint64_t.
    unsafe {
        result::mem_pool::get_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            (&mut peak as *mut u64).cast(),
        )
    }
    .map_err(|e| CudaError::Driver(format!("reading the memory pool's peak: {e}")))?;
    Ok(Some(peak))
}

/// Starts [`pool_peak`] afresh (from what is in use now).
pub(crate) fn reset_pool_peak(ctx: &CudaContext) -> Result<(), CudaError> {
    let Some(pool) = default_pool(ctx)? else {
        return Ok(());
    };
    let mut zero: u64 = 0;
    // SAFETY: a valid pool; the driver takes 0 to reset a high watermark.
    unsafe {
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            (&mut zero as *mut u64).cast(),
        )
    }
    .map_err(|e| CudaError::Driver(format!("resetting the memory pool's peak: {e}")))
}

/// The device's default memory pool, where it has one.
fn default_pool(ctx: &CudaContext) -> Result<Option<sys::CUmemoryPool>, CudaError> {
    let pools = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .map_err(|e| CudaError::Driver(e.to_string()))?;
    if pools == 0 {
        return Ok(None);
    }
    // SAFETY: the context's device is a device handle from the driver.
    unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
        .map(Some)
        .map_err(|e| CudaError::Driver(format!("the device's memory pool: {e}")))
}

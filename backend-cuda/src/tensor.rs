//! Device tensors: a buffer in GPU memory with the logical dtype and shape
//! of the graph tensor it holds, and conversions to and from host values.
//! Float tensors are stored in the run's compute type (f32, or bf16 under
//! mixed precision); integers as i64; booleans as one byte.

use super::{CudaError, GpuPrecision};
use autopar_ir::{DType, Data, Value};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// The element type of a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Storage {
    F32,
    Bf16,
    I64,
    Bool,
}

impl Storage {
    pub fn size(self) -> usize {
        match self {
            Storage::F32 => 4,
            Storage::Bf16 => 2,
            Storage::I64 => 8,
            Storage::Bool => 1,
        }
    }

    /// The kernel name suffix of a float storage.
    pub fn suffix(self) -> &'static str {
        match self {
            Storage::Bf16 => "bf16",
            _ => "f32",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Storage::F32 | Storage::Bf16)
    }
}

/// Integer tensors up to this many elements keep a host copy, so shape,
/// axes and index operands never need a device round trip.
const HOST_MIRROR_MAX: usize = 64;

/// A tensor on the device. Buffers are shared between views (reshapes
/// alias), so in-place updates first check that nobody else holds them.
pub struct GpuTensor {
    pub(crate) buf: Arc<CudaSlice<u8>>,
    /// Bytes from the buffer's start (windows into concatenations and splits).
    pub(crate) offset: u64,
    pub(crate) dtype: DType,
    pub(crate) storage: Storage,
    pub(crate) shape: Vec<usize>,
    pub(crate) ints: Option<Arc<Vec<i64>>>,
    /// A bf16 weight's initial value in f32, which seeds its f32 master copy
    /// at the first optimizer step (then dropped).
    pub(crate) seed: Option<Arc<CudaSlice<f32>>>,
}

impl GpuTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> usize {
        self.numel() * self.storage.size()
    }

    /// The raw device address (kernels take plain pointers).
    pub(crate) fn ptr(&self, stream: &Arc<CudaStream>) -> u64 {
        let (p, _sync) = self.buf.device_ptr(stream);
        p + self.offset
    }

    /// The same buffer seen `bytes` further on (same shape; only kernels
    /// that are told how much to touch may use it).
    pub(crate) fn offset_view(&self, bytes: u64) -> GpuTensor {
        GpuTensor {
            offset: self.offset + bytes,
            ..self.alias(self.dtype, self.shape.clone())
        }
    }

    /// The same buffer with another shape (reshape, squeeze, identity).
    pub(crate) fn alias(&self, dtype: DType, shape: Vec<usize>) -> GpuTensor {
        GpuTensor {
            buf: self.buf.clone(),
            offset: self.offset,
            dtype,
            storage: self.storage,
            shape,
            ints: self.ints.clone(),
            seed: self.seed.clone(),
        }
    }

    /// The host value of a small integer tensor, when mirrored.
    pub(crate) fn host_ints(&self) -> Option<Value> {
        let ints = self.ints.as_ref()?;
        Value::ints(self.dtype, self.shape.clone(), (**ints).clone()).ok()
    }
}

/// The storage of a logical dtype under `precision`, if the device holds it.
pub(crate) fn storage_of(dtype: DType, precision: GpuPrecision) -> Option<Storage> {
    if dtype.is_float() {
        return Some(match precision {
            GpuPrecision::F32 => Storage::F32,
            GpuPrecision::Bf16 => Storage::Bf16,
        });
    }
    match dtype {
        DType::Bool => Some(Storage::Bool),
        DType::String => None,
        _ => Some(Storage::I64),
    }
}

fn driver(e: impl std::fmt::Display) -> CudaError {
    CudaError::Driver(e.to_string())
}

/// A tensor over a whole new buffer.
fn over(buf: CudaSlice<u8>, dtype: DType, storage: Storage, shape: Vec<usize>) -> GpuTensor {
    GpuTensor {
        buf: Arc::new(buf),
        offset: 0,
        dtype,
        storage,
        shape,
        ints: None,
        seed: None,
    }
}

/// A new device tensor, zero-filled when `zeroed` (accumulators), else
/// uninitialised (every kernel that produces a tensor writes all of it).
pub(crate) fn allocate(
    stream: &Arc<CudaStream>,
    dtype: DType,
    storage: Storage,
    shape: Vec<usize>,
    zeroed: bool,
) -> Result<GpuTensor, CudaError> {
    let bytes = (shape.iter().product::<usize>() * storage.size()).max(1);
    let buf = if zeroed {
        stream.alloc_zeros::<u8>(bytes)
    } else {
        // SAFETY: the caller writes the whole tensor before reading it.
        unsafe { stream.alloc::<u8>(bytes) }
    }
    .map_err(driver)?;
    Ok(over(buf, dtype, storage, shape))
}

/// Copies a host value to the device in `precision`.
pub(crate) fn upload(
    stream: &Arc<CudaStream>,
    v: &Value,
    precision: GpuPrecision,
) -> Result<GpuTensor, CudaError> {
    let storage = storage_of(v.dtype, precision)
        .ok_or_else(|| CudaError::Driver(format!("{} tensors cannot be held on the GPU", v.dtype)))?;
    let bytes: Vec<u8> = match (&v.data, storage) {
        (Data::F32(x), Storage::F32) => x.iter().flat_map(|f| f.to_le_bytes()).collect(),
        (Data::F64(x), Storage::F32) => x.iter().flat_map(|&f| (f as f32).to_le_bytes()).collect(),
        (Data::F32(x), Storage::Bf16) => x
            .iter()
            .flat_map(|&f| half::bf16::from_f32(f).to_le_bytes())
            .collect(),
        (Data::F64(x), Storage::Bf16) => x
            .iter()
            .flat_map(|&f| half::bf16::from_f64(f).to_le_bytes())
            .collect(),
        (Data::I64(x), Storage::I64) => x.iter().flat_map(|i| i.to_le_bytes()).collect(),
        (Data::Bool(x), Storage::Bool) => x.iter().map(|&b| u8::from(b)).collect(),
        _ => {
            return Err(CudaError::Driver(format!(
                "cannot hold {} data as {storage:?}",
                v.dtype
            )))
        }
    };
    let bytes = if bytes.is_empty() { vec![0u8] } else { bytes };
    let buf = stream.clone_htod(&bytes).map_err(driver)?;
    let ints = match &v.data {
        Data::I64(x) if x.len() <= HOST_MIRROR_MAX => Some(Arc::new(x.clone())),
        _ => None,
    };
    Ok(GpuTensor {
        ints,
        ..over(buf, v.dtype, storage, v.shape.clone())
    })
}

/// Copies a device tensor back as a host value (floats as f32).
pub(crate) fn download(stream: &Arc<CudaStream>, x: &GpuTensor) -> Result<Value, CudaError> {
    if let Some(v) = x.host_ints() {
        return Ok(v);
    }
    let mut bytes = stream.clone_dtoh(&*x.buf).map_err(driver)?;
    stream.synchronize().map_err(driver)?;
    let start = x.offset as usize;
    bytes.truncate(start + x.bytes());
    bytes.drain(..start);
    let n = x.numel();
    let data = match x.storage {
        Storage::F32 => Data::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        Storage::Bf16 => Data::F32(
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        Storage::I64 => Data::I64(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8-byte chunk")))
                .collect(),
        ),
        Storage::Bool => Data::Bool(bytes.iter().map(|&b| b != 0).collect()),
    };
    // Floats come back as f32 data under their own dtype (f64, which the
    // device holds as f32, comes back as f32).
    let dtype = if x.dtype == DType::F64 {
        DType::F32
    } else {
        x.dtype
    };
    debug_assert_eq!(data_len(&data), n);
    Value::new(dtype, x.shape.clone(), data).map_err(|e| CudaError::Driver(e.to_string()))
}

fn data_len(d: &Data) -> usize {
    match d {
        Data::F32(x) => x.len(),
        Data::F64(x) => x.len(),
        Data::I64(x) => x.len(),
        Data::Bool(x) => x.len(),
        Data::Str(x) => x.len(),
    }
}

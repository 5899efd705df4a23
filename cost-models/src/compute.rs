//! Compute model: the time of each kernel on one device, a roofline of its
//! FLOPs at a shape-dependent GEMM rate against its bytes at the achievable
//! memory bandwidth, plus a fixed per-kernel cost.

use crate::workload::{Kernel, OpWork};
use crate::{Calibration, Device};
use autopar_ir::DType;

/// The rates one device reaches under a calibration.
#[derive(Debug, Clone)]
pub struct Rates<'a> {
    device: &'a Device,
    calibration: &'a Calibration,
    /// Peak FLOP/s of the compute dtype (products of other dtypes fall back to it).
    peak: f64,
    /// Peak of non-tensor-core arithmetic (element-wise work): the f32 peak.
    vector_peak: f64,
    memory: f64,
}

/// The device lists no peak for the model's compute dtype.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("device '{device}' lists no peak FLOP/s for {dtype} (add it under [device.peak_tflops])")]
pub struct NoPeak {
    pub device: String,
    pub dtype: DType,
}

impl<'a> Rates<'a> {
    /// Rates for products in `dtype`.
    pub fn new(device: &'a Device, calibration: &'a Calibration, dtype: DType) -> Result<Rates<'a>, NoPeak> {
        let peak = device.peak(dtype).ok_or_else(|| NoPeak {
            device: device.name.clone(),
            dtype,
        })?;
        Ok(Rates {
            device,
            calibration,
            peak,
            vector_peak: device.peak(DType::F32).unwrap_or(peak),
            memory: calibration.memory_rate(device.memory_bandwidth),
        })
    }

    /// Peak FLOP/s of the compute dtype (the denominator of MFU).
    pub fn peak(&self) -> f64 {
        self.peak
    }

    /// Achievable memory bandwidth, bytes/s.
    pub fn memory_bandwidth(&self) -> f64 {
        self.memory
    }

    /// Forward time of one kernel.
    pub fn forward(&self, w: &OpWork) -> f64 {
        self.time(w, w.forward_flops, w.forward_bytes, 1.0)
    }

    /// Seconds of vector work: `flops` of element-wise arithmetic or
    /// `bytes` of memory traffic, whichever takes longer (no launch).
    pub fn vector(&self, flops: f64, bytes: f64) -> f64 {
        (flops / self.vector_peak).max(bytes / self.memory)
    }

    /// Backward time of one kernel (a product's backward is two GEMMs).
    pub fn backward(&self, w: &OpWork) -> f64 {
        let launches = if matches!(w.kernel, Kernel::Matmul { .. }) {
            2.0
        } else {
            1.0
        };
        self.time(w, w.backward_flops, w.backward_bytes, launches)
    }

    fn time(&self, w: &OpWork, flops: f64, bytes: f64, launches: f64) -> f64 {
        if flops == 0.0 && bytes == 0.0 {
            return 0.0;
        }
        let peak = (self.device.matmul_peak(w.dtype)).unwrap_or(self.peak * self.device.sustained_fraction);
        let arithmetic = match w.kernel {
            Kernel::Matmul { m, n, k, .. } => flops / self.calibration.matmul_rate(peak, w.dtype, m, n, k),
            Kernel::FusedAttention { sq, sk, d, .. } => {
                flops / self.calibration.matmul_rate(peak, w.dtype, sq, sk, d)
            }
            Kernel::Streaming => flops / self.vector_peak,
        };
        arithmetic.max(bytes / self.memory) + launches * self.calibration.kernel_overhead_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn device() -> Device {
        Device {
            name: "test".into(),
            peak_flops: BTreeMap::from([(DType::Bf16, 100e12), (DType::F32, 10e12)]),
            memory_bytes: 1e9,
            memory_bandwidth: 1e12,
            sustained_fraction: 1.0,
        }
    }

    fn work(kernel: Kernel, flops: f64, bytes: f64) -> OpWork {
        OpWork {
            node: "n".into(),
            kernel,
            dtype: DType::Bf16,
            forward_flops: flops,
            backward_flops: 2.0 * flops,
            forward_bytes: bytes,
            backward_bytes: 2.0 * bytes,
            attention_core: false,
        }
    }

    #[test]
    fn roofline_takes_the_slower_side() {
        let mut cal = Calibration {
            kernel_overhead_s: 0.0,
            ..Calibration::default()
        };
        cal.matmul.peak_fraction = 0.8;
        let dev = device();
        let r = Rates::new(&dev, &cal, DType::Bf16).unwrap();
        let big = 1e9;
        let mm = Kernel::Matmul {
            batch: 1.0,
            m: big,
            n: big,
            k: big,
        };
        // 8e13 FLOP/s achievable: 8e13 FLOPs take one second, 1e9 bytes take 1.25 ms.
        let t = r.forward(&work(mm, 8e13, 1e9));
        assert!((t - 1.0).abs() < 1e-6, "{t}");
        // Streaming: 8e11 B/s achievable.
        let t = r.forward(&work(Kernel::Streaming, 1.0, 8e11));
        assert!((t - 1.0).abs() < 1e-9, "{t}");
        assert!((r.backward(&work(Kernel::Streaming, 1.0, 8e11)) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn small_products_are_slower_per_flop() {
        let cal = Calibration::default();
        let dev = device();
        let r = Rates::new(&dev, &cal, DType::Bf16).unwrap();
        let rate = |d: f64| {
            let w = work(
                Kernel::Matmul {
                    batch: 1.0,
                    m: d,
                    n: d,
                    k: d,
                },
                2.0 * d * d * d,
                0.0,
            );
            2.0 * d * d * d / r.forward(&w)
        };
        assert!(rate(64.0) < rate(1024.0) && rate(1024.0) < rate(8192.0));
    }

    #[test]
    fn missing_peak_is_an_error() {
        let cal = Calibration::default();
        let dev = device();
        let err = Rates::new(&dev, &cal, DType::F8E4M3Fn).unwrap_err();
        assert!(err.to_string().contains("peak_tflops"), "{err}");
    }
}

//! The data-parallel collectives of a gradient bucket: one device call per
//! tensor, queued together as one group ([`DeviceComms::collectives`]: an
//! NCCL group), so a bucket of many small gradients is one launch and one
//! latency. A single tensor's all-reduce or reduce-scatter is a bucket of one.

use super::CudaBackend;
use crate::device_comms::{Call, DeviceOp};
use crate::tensor::GpuTensor;
use autopar_exec::{BackendError, Order};
use std::sync::Arc;

impl CudaBackend {
    /// Sums every tensor of `xs` in place over `group`, as one group of
    /// calls; false where the device does not connect the group (or the
    /// tensors are not floats), every member alike.
    pub(super) fn all_reduce_grouped(
        &mut self,
        xs: &mut [Arc<GpuTensor>],
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        let Some(dtype) = xs.first().and_then(|x| self.device_type(x, group)) else {
            return Ok(false);
        };
        let mut targets = Vec::with_capacity(xs.len());
        for x in xs.iter_mut() {
            let target = self.owned(x)?;
            targets.push((self.gpu.ptr(target), target.numel()));
        }
        let stream = self.stream_for(order)?;
        let calls: Vec<Call> = targets
            .iter()
            .map(|&(ptr, count)| DeviceOp::AllReduce(ptr).over(group, count, dtype))
            .collect();
        self.comms()?.collectives(&calls, &stream)?;
        self.hold(order, xs.iter().cloned());
        Ok(true)
    }

    /// This member's part of the sum of each tensor of `xs` (flattened and
    /// zero-padded to a multiple of the group's size), as one group of
    /// calls; `None` where the device does not connect the group.
    pub(super) fn reduce_scatter_grouped(
        &mut self,
        xs: &[Arc<GpuTensor>],
        group: &[usize],
        order: Order,
    ) -> Result<Option<Vec<Arc<GpuTensor>>>, BackendError> {
        let Some(dtype) = xs.first().and_then(|x| self.device_type(x, group)) else {
            return Ok(None);
        };
        let mut held = Vec::with_capacity(2 * xs.len());
        let mut parts = Vec::with_capacity(xs.len());
        let mut addresses = Vec::with_capacity(xs.len());
        for x in xs {
            let part = x.numel().div_ceil(group.len());
            let len = part * group.len();
            let whole = match len > x.numel() {
                true => Arc::new(self.padded(x, len)?),
                false => x.clone(),
            };
            let mine = Arc::new(self.allocate_like(x, vec![part])?);
            addresses.push((self.gpu.ptr(&whole), self.gpu.ptr(&mine), part));
            held.extend([whole, mine.clone()]);
            parts.push(mine);
        }
        let stream = self.stream_for(order)?;
        let calls: Vec<Call> = addresses
            .iter()
            .map(|&(send, recv, part)| DeviceOp::ReduceScatter { send, recv }.over(group, part, dtype))
            .collect();
        self.comms()?.collectives(&calls, &stream)?;
        self.hold(order, held);
        Ok(Some(parts))
    }
}

//! What the CUDA backend needs from the collectives between ranks' device
//! buffers, written once for its two kinds: NCCL between GPUs
//! ([`super::nccl::Nccl`]) and the exchange between ranks that share one
//! GPU in this process ([`super::same_device::SameDevice`]). Calls are
//! queued on a stream and return once queued; every member of a group
//! makes the same calls on it in the same order.

use super::nccl::{DataType, Posted, TransferRoute};
use autopar_comm::collective::{Algorithm, Collective};
use autopar_cost_models::comm::bytes_sent;
use cudarc::driver::CudaStream;
use std::sync::Arc;

pub(crate) type Stream = Arc<CudaStream>;

/// Collectives and transfers between ranks' device buffers.
pub(crate) trait DeviceComms {
    /// Whether `group`'s collectives run here (every member gets the same answer).
    fn connects(&self, group: &[usize]) -> bool;
    /// This rank's place in `group`.
    fn position(&self, group: &[usize]) -> Option<usize>;
    /// Sums `count` elements of `dtype` at `ptr` in place over `group`.
    fn all_reduce(
        &self,
        group: &[usize],
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String>;
    /// Sums the `count × group size` elements at `send` over `group` and
    /// writes part `position` of the sum (`count` elements) to `recv`.
    fn reduce_scatter(
        &self,
        group: &[usize],
        send_recv: (u64, u64),
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String>;
    /// Concatenates every member's `count` elements at `send` into `recv`
    /// (`count × group size` elements, parts in group order). In place
    /// when `send` is this member's part of `recv`.
    fn all_gather(
        &self,
        group: &[usize],
        send_recv: (u64, u64),
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String>;
    /// Bytes this rank has sent, counted per ring algorithm as the fabric
    /// counts its collectives.
    fn bytes_sent(&self) -> u64;
    /// Why the collectives stopped early (a failed peer), if they did.
    fn stopped(&self) -> Option<String>;
    /// How pipeline transfers run here, if they do.
    fn route(&self) -> Option<&TransferRoute> {
        None
    }
    /// Runs `posted` as one group ([`TransferRoute::Grouped`]).
    fn transfer(&self, posted: &[Posted], stream: &Stream) -> Result<(), String> {
        let _ = (posted, stream);
        Err("transfers are not grouped on the device here".into())
    }
    /// Sends to rank `to` ([`TransferRoute::Pairs`]).
    fn send_to(
        &self,
        to: usize,
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        let _ = (to, ptr, count, dtype, stream);
        Err("transfers do not run per pair on the device here".into())
    }
    /// Receives from rank `from` ([`TransferRoute::Pairs`]).
    fn recv_from(
        &self,
        from: usize,
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        let _ = (from, ptr, count, dtype, stream);
        Err("transfers do not run per pair on the device here".into())
    }
}

/// Bytes per element of a type the backend uses.
pub(crate) fn element_size(dtype: DataType) -> usize {
    match dtype {
        DataType::ncclBfloat16 | DataType::ncclFloat16 => 2,
        DataType::ncclFloat64 | DataType::ncclInt64 | DataType::ncclUint64 => 8,
        DataType::ncclInt8 | DataType::ncclUint8 => 1,
        _ => 4,
    }
}

/// Bytes one rank sends in a ring `collective` of `count` elements of
/// `dtype` over `members` ranks, as the fabric counts its own.
pub(crate) fn ring_bytes(collective: Collective, members: usize, count: usize, dtype: DataType) -> u64 {
    let bytes = (count * element_size(dtype)) as f64;
    bytes_sent(collective, Algorithm::Ring, members, bytes).map_or(0.0, |v| v[0]) as u64
}

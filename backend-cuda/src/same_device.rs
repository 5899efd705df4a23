//! Collectives between ranks that share one GPU in this process, each rank a
//! thread with its own stream. NCCL refuses a communicator that holds one
//! GPU twice, so the ranks meet on the host ([`Meetings`]), leaving each
//! other a buffer's address and an event, and read each other's buffers
//! directly on the device, in two phases: after the first meeting every
//! member's stream waits for every input and computes its result into a
//! buffer of its own; after the second (everyone has read every input) it
//! writes the result where it belongs. Every member sums the inputs in
//! group order, so all get the same bits.
//!
//! A member's thread waits at each meeting, as at the fabric's collectives,
//! so the programs must finish under blocking collectives
//! ([`autopar_lower::blocking::check_blocking`]); transfers stay on the
//! fabric. This path is for running multi-rank plans on one GPU (tests, the
//! GPU check), and it runs the backend's device-collective code, which NCCL
//! runs between GPUs, on that one GPU.

use super::device_comms::{element_size, ring_bytes, DeviceComms, Stream};
use super::meetings::Meetings;
use super::module::Kernels;
use super::nccl::DataType;
use super::ops::{grid, launch};
use super::CudaError;
use autopar_comm::collective::Collective;
use cudarc::driver::{CudaEvent, DevicePtr};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// What a member leaves at a meeting: the address of its input (0 when the
/// phase needs none) and an event that marks its stream's work so far.
#[derive(Clone)]
pub(crate) struct Deposit {
    ptr: u64,
    ready: Arc<CudaEvent>,
}

/// One rank's side of the exchange.
pub(crate) struct SameDevice {
    rank: usize,
    meetings: Arc<Meetings<Deposit>>,
    kernels: Arc<Kernels>,
    /// The groups whose collectives run here (those of the programs).
    groups: BTreeSet<Vec<usize>>,
    /// Calls so far by group: a call's meetings are named by its number.
    calls: RefCell<HashMap<Vec<usize>, u64>>,
    sent: Cell<u64>,
}

/// What `launch!` needs: kernels and the stream to queue them on.
struct On<'a> {
    kernels: &'a Kernels,
    stream: &'a Stream,
}

impl SameDevice {
    pub fn new(
        rank: usize,
        meetings: Arc<Meetings<Deposit>>,
        kernels: Arc<Kernels>,
        groups: BTreeSet<Vec<usize>>,
    ) -> SameDevice {
        SameDevice {
            rank,
            meetings,
            kernels,
            groups,
            calls: RefCell::new(HashMap::new()),
            sent: Cell::new(0),
        }
    }

    /// Meets `group` in `phase` of this rank's current call on it (phase 0
    /// starts the next call), leaving `ptr`; then `stream` waits for every
    /// member's work up to its arrival. Returns every member's deposit in
    /// group order.
    fn meet(
        &self,
        group: &[usize],
        phase: u8,
        ptr: u64,
        stream: &Stream,
        what: &str,
    ) -> Result<Vec<Deposit>, String> {
        let call = {
            let mut calls = self.calls.borrow_mut();
            let n = calls.entry(group.to_vec()).or_insert(0);
            if phase == 0 {
                *n += 1;
            }
            *n
        };
        let ready = Arc::new(stream.record_event(None).map_err(|e| e.to_string())?);
        let all = self.meetings.meet(
            (group.to_vec(), call, phase),
            self.rank,
            Deposit { ptr, ready },
            what,
        )?;
        for deposit in &all {
            stream.wait(&deposit.ready).map_err(|e| e.to_string())?;
        }
        Ok(all)
    }

    /// `dst = src` for `bytes` bytes, queued on `stream`.
    fn copy(&self, stream: &Stream, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
        // SAFETY: both ranges hold `bytes` bytes on this device; `stream`
        // waits for the work that wrote `src` and for every reader of `dst`.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(|e| e.to_string())
    }

    /// `acc += x` over `count` elements of `dtype`, queued on `stream`.
    fn add(&self, stream: &Stream, acc: u64, x: u64, count: usize, dtype: DataType) -> Result<(), String> {
        let suffix = match dtype {
            DataType::ncclFloat32 => "f32",
            DataType::ncclBfloat16 => "bf16",
            other => return Err(format!("no same-device sum of {other:?}")),
        };
        let on = On {
            kernels: &self.kernels,
            stream,
        };
        let n = count as i64;
        (|| launch!(on, format!("add_inplace_{suffix}"), grid(count), acc, x, n))()
            .map_err(|e: CudaError| e.to_string())
    }

    /// `dst` = the sum over `inputs` (in group order, so every member gets
    /// the same bits) of `count` elements each, `offset` bytes into each.
    fn sum_into(
        &self,
        stream: &Stream,
        dst: u64,
        inputs: &[Deposit],
        offset: u64,
        count: usize,
        dtype: DataType,
    ) -> Result<(), String> {
        self.copy(stream, dst, inputs[0].ptr + offset, count * element_size(dtype))?;
        inputs[1..]
            .iter()
            .try_for_each(|input| self.add(stream, dst, input.ptr + offset, count, dtype))
    }

    fn count(&self, collective: Collective, group: &[usize], count: usize, dtype: DataType) {
        self.sent
            .set(self.sent.get() + ring_bytes(collective, group.len(), count, dtype));
    }
}

impl DeviceComms for SameDevice {
    fn connects(&self, group: &[usize]) -> bool {
        self.groups.contains(group)
    }

    fn position(&self, group: &[usize]) -> Option<usize> {
        group.iter().position(|&r| r == self.rank)
    }

    fn all_reduce(
        &self,
        group: &[usize],
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        self.count(Collective::AllReduce, group, count, dtype);
        let bytes = count * element_size(dtype);
        let what = "a same-device all-reduce";
        let inputs = self.meet(group, 0, ptr, stream, what)?;
        let sum = stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| e.to_string())?;
        let at = sum.device_ptr(stream).0;
        self.sum_into(stream, at, &inputs, 0, count, dtype)?;
        // Every member has read every input before any is overwritten.
        self.meet(group, 1, 0, stream, what)?;
        self.copy(stream, ptr, at, bytes)
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        (send, recv): (u64, u64),
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        self.count(Collective::ReduceScatter, group, count * group.len(), dtype);
        let position = self
            .position(group)
            .ok_or_else(|| format!("rank {} is not in {group:?}", self.rank))?;
        let part = (position * count * element_size(dtype)) as u64;
        let what = "a same-device reduce-scatter";
        let inputs = self.meet(group, 0, send, stream, what)?;
        self.sum_into(stream, recv, &inputs, part, count, dtype)?;
        // Every input stays as it is until every member has read it.
        self.meet(group, 1, 0, stream, what).map(drop)
    }

    fn all_gather(
        &self,
        group: &[usize],
        (send, recv): (u64, u64),
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        self.count(Collective::AllGather, group, count * group.len(), dtype);
        let bytes = count * element_size(dtype);
        let what = "a same-device all-gather";
        let inputs = self.meet(group, 0, send, stream, what)?;
        for (j, input) in inputs.iter().enumerate() {
            let to = recv + (j * bytes) as u64;
            // In place, this member's part is already where it goes.
            if input.ptr != to {
                self.copy(stream, to, input.ptr, bytes)?;
            }
        }
        self.meet(group, 1, 0, stream, what).map(drop)
    }

    fn bytes_sent(&self) -> u64 {
        self.sent.get()
    }

    fn stopped(&self) -> Option<String> {
        None
    }
}

impl Drop for SameDevice {
    /// Peers waiting for this rank at a meeting it will not come to fail
    /// at once (the rank stopped on an error).
    fn drop(&mut self) {
        self.meetings.leave(self.rank);
    }
}

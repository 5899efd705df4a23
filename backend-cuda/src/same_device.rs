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

use super::device_comms::{element_size, Call, CommsError, DeviceComms, DeviceOp, Member, Stream};
use super::meetings::Meetings;
use super::module::Kernels;
use super::nccl::DataType;
use super::ops::{grid, launch};
use super::CudaError;
use cudarc::driver::{CudaEvent, DevicePtr};
use std::cell::RefCell;
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
    member: Member,
    meetings: Arc<Meetings<Deposit>>,
    kernels: Arc<Kernels>,
    /// The groups whose collectives run here (those of the programs).
    groups: BTreeSet<Vec<usize>>,
    /// Calls so far by group: a call's meetings are named by its number.
    calls: RefCell<HashMap<Vec<usize>, u64>>,
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
            member: Member::new(rank),
            meetings,
            kernels,
            groups,
            calls: RefCell::new(HashMap::new()),
        }
    }

    /// Meets `call`'s group in `phase` of this rank's current call on it
    /// (phase 0 starts the next call), leaving `ptr`; then `stream` waits
    /// for every member's work up to its arrival. Returns every member's
    /// deposit in group order.
    fn meet(&self, call: &Call, phase: u8, ptr: u64, stream: &Stream) -> Result<Vec<Deposit>, CommsError> {
        let group = call.group.to_vec();
        let number = {
            let mut calls = self.calls.borrow_mut();
            let n = calls.entry(group.clone()).or_insert(0);
            if phase == 0 {
                *n += 1;
            }
            *n
        };
        let ready = stream
            .record_event(None)
            .map_err(CommsError::driver("recording a same-device event"))?;
        let deposit = Deposit {
            ptr,
            ready: Arc::new(ready),
        };
        let what = format!("a same-device {}", call.op.name());
        let all = self
            .meetings
            .meet((group, number, phase), self.member.rank(), deposit, &what)?;
        for deposit in &all {
            stream
                .wait(&deposit.ready)
                .map_err(CommsError::driver("waiting for a member's same-device event"))?;
        }
        Ok(all)
    }

    /// `dst = src` for `bytes` bytes, queued on `stream`.
    fn copy(&self, stream: &Stream, dst: u64, src: u64, bytes: usize) -> Result<(), CommsError> {
        // SAFETY: both ranges hold `bytes` bytes on this device; `stream`
        // waits for the work that wrote `src` and for every reader of `dst`.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(CommsError::driver("copying between ranks' buffers"))
    }

    /// `acc += x` over `count` elements of `dtype`, queued on `stream`.
    fn add(
        &self,
        stream: &Stream,
        acc: u64,
        x: u64,
        count: usize,
        dtype: DataType,
    ) -> Result<(), CommsError> {
        let suffix = match dtype {
            DataType::ncclFloat32 => "f32",
            DataType::ncclBfloat16 => "bf16",
            other => return Err(CommsError::NoSum(other)),
        };
        let on = On {
            kernels: &self.kernels,
            stream,
        };
        let n = count as i64;
        (|| launch!(on, format!("add_inplace_{suffix}"), grid(count), acc, x, n))()
            .map_err(|e: CudaError| CommsError::Kernel(Box::new(e)))
    }

    /// `dst` = the sum over `inputs` (in group order, so every member gets
    /// the same bits) of `call`'s `count` elements each, `offset` bytes
    /// into each.
    fn sum_into(
        &self,
        stream: &Stream,
        dst: u64,
        inputs: &[Deposit],
        offset: u64,
        call: &Call,
    ) -> Result<(), CommsError> {
        let (count, dtype) = (call.count, call.dtype);
        self.copy(stream, dst, inputs[0].ptr + offset, count * element_size(dtype))?;
        inputs[1..]
            .iter()
            .try_for_each(|input| self.add(stream, dst, input.ptr + offset, count, dtype))
    }

    /// Sums into a buffer of this member's own, then (once every member
    /// has read every input) over its input at `ptr`.
    fn all_reduce(&self, ptr: u64, call: &Call, stream: &Stream) -> Result<(), CommsError> {
        let bytes = call.count * element_size(call.dtype);
        let inputs = self.meet(call, 0, ptr, stream)?;
        let sum = stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(CommsError::driver("allocating a same-device sum"))?;
        let at = sum.device_ptr(stream).0;
        self.sum_into(stream, at, &inputs, 0, call)?;
        // Every member has read every input before any is overwritten.
        self.meet(call, 1, 0, stream)?;
        self.copy(stream, ptr, at, bytes)
    }

    fn reduce_scatter(
        &self,
        (send, recv): (u64, u64),
        call: &Call,
        stream: &Stream,
    ) -> Result<(), CommsError> {
        let position = self.position(call.group).ok_or_else(|| CommsError::NotMember {
            rank: self.member.rank(),
            group: call.group.to_vec(),
        })?;
        let part = (position * call.count * element_size(call.dtype)) as u64;
        let inputs = self.meet(call, 0, send, stream)?;
        self.sum_into(stream, recv, &inputs, part, call)?;
        // Every input stays as it is until every member has read it.
        self.meet(call, 1, 0, stream).map(drop)
    }

    fn all_gather(&self, (send, recv): (u64, u64), call: &Call, stream: &Stream) -> Result<(), CommsError> {
        let bytes = call.count * element_size(call.dtype);
        let inputs = self.meet(call, 0, send, stream)?;
        for (j, input) in inputs.iter().enumerate() {
            let to = recv + (j * bytes) as u64;
            // In place, this member's part is already where it goes.
            if input.ptr != to {
                self.copy(stream, to, input.ptr, bytes)?;
            }
        }
        self.meet(call, 1, 0, stream).map(drop)
    }
}

impl DeviceComms for SameDevice {
    fn member(&self) -> &Member {
        &self.member
    }

    fn connects(&self, group: &[usize]) -> bool {
        self.groups.contains(group)
    }

    fn queue(&self, call: Call, stream: &Stream) -> Result<(), CommsError> {
        match call.op {
            DeviceOp::AllReduce(ptr) => self.all_reduce(ptr, &call, stream),
            DeviceOp::ReduceScatter { send, recv } => self.reduce_scatter((send, recv), &call, stream),
            DeviceOp::AllGather { send, recv } => self.all_gather((send, recv), &call, stream),
        }
    }

    /// Members fail at the meetings instead ([`Meetings::leave`]).
    fn stopped(&self) -> Option<CommsError> {
        None
    }
}

impl Drop for SameDevice {
    /// Peers waiting for this rank at a meeting it will not come to fail
    /// at once (the rank stopped on an error).
    fn drop(&mut self) {
        self.meetings.leave(self.member.rank());
    }
}

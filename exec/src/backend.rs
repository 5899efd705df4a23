//! What a rank's interpreter needs from the machine that holds its tensors.
//! The instruction loop (buffers, ZeRO shards, collectives, optimizer
//! slices, loss reports) is written once over this trait; the CPU backend
//! keeps host values and runs the reference kernels, the CUDA backend keeps
//! device buffers and runs cuBLAS and NVRTC kernels. Communication goes
//! through host buffers on the in-process fabric, so ranks that share a
//! machine (or one GPU) run any plan, unless the backend offers collectives
//! of its own ([`Backend::device_comms`]).

use crate::train::{OptimError, Optimizer};
use autopar_ir::{DType, Op, Value};
use std::ops::Range;
use std::sync::Arc;

/// Why a backend could not hold, move, compute or update a tensor.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A node's kernel refused its inputs or failed.
    #[error("node '{node}': {message}")]
    Node { node: String, message: String },
    /// A node without a device kernel failed in the reference kernels.
    #[error("node '{node}' (on the host): {message}")]
    HostNode { node: String, message: String },
    /// Micro-batches' gradients of one parameter differ in element count.
    #[error("gradient shapes differ between micro-batches")]
    GradientShapes,
    /// An optimizer step's weight and gradient differ in type.
    #[error("weight and gradient types differ")]
    UpdateTypes,
    #[error(transparent)]
    Optimizer(#[from] OptimError),
    /// Restored optimizer state does not fit the optimizer or precision.
    #[error("restored optimizer state has {slots} slots of {what}; the run's optimizer needs {want}")]
    StateSlots { slots: usize, what: String, want: usize },
    /// A collective was asked for what it cannot do (a group this rank is
    /// not in, slices that do not divide).
    #[error("{0}")]
    Collective(String),
    /// The device, its driver or its collectives library failed.
    #[error("{0}")]
    Device(String),
}

/// The device layers below a backend (driver calls, NCCL) report text.
impl From<String> for BackendError {
    fn from(message: String) -> BackendError {
        BackendError::Device(message)
    }
}

/// A rank's tensors and kernels.
pub trait Backend {
    /// A tensor held by the backend; cloning is cheap (a handle).
    type Tensor: Clone;
    /// One parameter's (or shard's) optimizer state.
    type State;

    /// Holds a host value (already in the run's precision).
    fn upload(&mut self, v: Value) -> Result<Self::Tensor, BackendError>;
    /// Holds a parameter's initial value. A backend that computes in a
    /// narrower type keeps the original for its master copy.
    fn upload_weight(&mut self, v: Value) -> Result<Self::Tensor, BackendError> {
        self.upload(v)
    }
    /// The tensor as a host value (the run's precision).
    fn download(&mut self, x: &Self::Tensor) -> Result<Arc<Value>, BackendError>;
    /// The tensor's size where it is held.
    fn bytes(&self, x: &Self::Tensor) -> u64;
    /// The tensor's element count.
    fn numel(&self, x: &Self::Tensor) -> usize;
    /// Runs one node: `op` on `args`, giving its outputs in order.
    fn eval(
        &mut self,
        node: &str,
        op: &Op,
        args: &[Option<&Self::Tensor>],
    ) -> Result<Vec<Self::Tensor>, BackendError>;
    /// A copy that later in-place updates of either do not share.
    fn duplicate(&mut self, x: &Self::Tensor) -> Result<Self::Tensor, BackendError>;
    /// `acc += g` (same element count).
    fn accumulate(&mut self, acc: &mut Self::Tensor, g: &Self::Tensor) -> Result<(), BackendError>;
    /// Fresh optimizer state for `len` elements.
    fn new_state(&mut self, optimizer: &Optimizer, len: usize) -> Result<Self::State, BackendError>;
    /// The state's slots as flat host values, in the optimizer's
    /// [`Optimizer::slot_names`] order (for a checkpoint).
    fn save_state(&mut self, state: &Self::State) -> Result<Vec<Value>, BackendError>;
    /// State holding `slots`, as [`Backend::save_state`] gave them (a
    /// resumed run's).
    fn load_state(&mut self, optimizer: &Optimizer, slots: &[Value]) -> Result<Self::State, BackendError>;
    /// One optimizer step (`step` counts from 1) of `weight[w]` by `grad[g]`
    /// (flattened ranges of equal length).
    #[allow(clippy::too_many_arguments)]
    fn update(
        &mut self,
        optimizer: &Optimizer,
        state: &mut Self::State,
        step: u64,
        weight: &mut Self::Tensor,
        w: Range<usize>,
        grad: &Self::Tensor,
        g: Range<usize>,
    ) -> Result<(), BackendError>;
    /// Waits for queued work, so step times are wall times.
    fn synchronize(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    /// The backend's own collectives and transfers between ranks (NCCL
    /// between GPUs, where staging through host memory would cost two
    /// copies over PCIe and the host network); `None` where it has none:
    /// the interpreter then stages all communication through host memory
    /// and the fabric.
    fn device_comms(&mut self) -> Option<&mut dyn DeviceCollectives<Self::Tensor>> {
        None
    }
}

/// Collectives and point-to-point transfers a backend runs on its own
/// tensors. Each says where it has none for a group (`Ok(false)` or
/// `None`, every member alike); the interpreter then stages that one
/// through host memory and the fabric. Every member must get the same
/// answer, and calls on one group come in the same order on every member.
pub trait DeviceCollectives<T> {
    /// Sums `x` in place over the ranks of `group` (global ranks, this one
    /// among them). Other handles sharing `x`'s storage keep their values
    /// (the backend sums into a copy of a shared tensor).
    fn all_reduce(&mut self, x: &mut T, group: &[usize], order: Order) -> Result<bool, BackendError>;
    /// ZeRO's gradient reduce-scatter: `x` flattened and zero-padded to a
    /// multiple of the group's size, summed over `group`, and this member's
    /// part of the sum (shape `[padded / group size]`, parts in group order).
    fn reduce_scatter(&mut self, x: &T, group: &[usize], order: Order) -> Result<Option<T>, BackendError>;
    /// A gradient bucket's all-reduce: every tensor of `xs` summed in place
    /// over `group` ([`DeviceCollectives::all_reduce`]), as one collective
    /// where the backend can group them (NCCL groups). By default they run
    /// one by one; the answer depends only on the group and element type,
    /// which a bucket's tensors share.
    fn all_reduce_bucket(
        &mut self,
        xs: &mut [T],
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        for x in xs.iter_mut() {
            if !self.all_reduce(x, group, order)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
    /// A gradient bucket's reduce-scatter: this member's part of the sum of
    /// each tensor of `xs` ([`DeviceCollectives::reduce_scatter`]), in
    /// order, as one collective where the backend can group them; by
    /// default one by one.
    fn reduce_scatter_bucket(
        &mut self,
        xs: &[T],
        group: &[usize],
        order: Order,
    ) -> Result<Option<Vec<T>>, BackendError> {
        let mut parts = Vec::with_capacity(xs.len());
        for x in xs {
            match self.reduce_scatter(x, group, order)? {
                Some(part) => parts.push(part),
                None => return Ok(None),
            }
        }
        Ok(Some(parts))
    }
    /// ZeRO-3's weight gather: the members' parts (equal sizes, flattened)
    /// concatenated in group order, cut to the whole weight's `shape`
    /// (beside the computation when `order` says so: a prefetch).
    fn all_gather(
        &mut self,
        part: &T,
        group: &[usize],
        shape: &[usize],
        order: Order,
    ) -> Result<Option<T>, BackendError>;
    /// ZeRO-1/2's weight refresh after a sharded optimizer step: every
    /// member holds the whole `w` but updated only its own part of it (`w`
    /// flattened, zero-padded to a multiple of the group's size and split
    /// evenly, parts in group order); replaces each part of `w` by its
    /// owner's.
    fn all_gather_parts(&mut self, w: &mut T, group: &[usize], order: Order) -> Result<bool, BackendError>;
    /// Every member's `x` (equal shapes) concatenated along `axis` in
    /// group order: the gathers of sequence, context and expert
    /// parallelism.
    fn gather_along(&mut self, x: &T, group: &[usize], axis: usize) -> Result<Option<T>, BackendError>;
    /// The sum of every member's `x` (equal shapes), cut along `axis` into
    /// as many equal slices as `group` has members: this member's slice
    /// (by its position in `group`). The conjugate of
    /// [`DeviceCollectives::gather_along`].
    fn reduce_scatter_along(
        &mut self,
        x: &T,
        group: &[usize],
        axis: usize,
    ) -> Result<Option<T>, BackendError>;
    /// Orders everything issued after it behind the collectives issued
    /// [`Order::Overlapped`] so far. The interpreter calls it before an
    /// instruction touches a tensor one of them reads or writes, and at
    /// the end of each step.
    fn join(&mut self) -> Result<(), BackendError>;
    /// Posts `x` for rank `to` (a pipeline's activations or gradients, a
    /// shared weight); `Ok(false)` where it has no transport for it (then
    /// the peer's [`DeviceCollectives::recv`] has none either). Transfers
    /// posted between two [`DeviceCollectives::flush_transfers`] form one
    /// group, which completes when every peer has posted its side.
    fn send(&mut self, x: &T, to: usize) -> Result<bool, BackendError>;
    /// Posts a receive of a `dtype` tensor of `shape` from rank `from`:
    /// the tensor, whose contents arrive in the backend's order once its
    /// group is flushed.
    fn recv(&mut self, from: usize, dtype: DType, shape: &[usize]) -> Result<Option<T>, BackendError>;
    /// Issues the transfers posted since the last flush as one group. The
    /// interpreter flushes before each instruction that does not continue a
    /// run of transfers ([`autopar_lower::blocking::continues_transfers`])
    /// and at the end of a step.
    fn flush_transfers(&mut self) -> Result<(), BackendError>;
    /// Bytes this rank sent through these collectives and transfers,
    /// counted as the fabric counts its own (per algorithm), so a run
    /// reports the same traffic whichever carried it.
    fn bytes_sent(&self) -> u64;
}

/// When a backend collective may run, relative to the computation issued
/// after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Before it: the next instructions read the result (tensor-parallel
    /// sums, ZeRO-3's weight gathers), or overlap is switched off.
    Inline,
    /// Beside it, until [`DeviceCollectives::join`]: gradient reductions
    /// and the ZeRO weight refresh, which the cost model overlaps with the
    /// backward pass. The backend may run these on a stream of their own;
    /// the tensors they read or write stay untouched until the join.
    Overlapped,
}

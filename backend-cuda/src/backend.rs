//! The CUDA [`Backend`]: a rank's tensors live in GPU memory (stream-ordered
//! allocations from the driver's pool, so freed buffers are reused), nodes
//! run as cuBLAS GEMMs and NVRTC kernels on the rank's stream, and the
//! optimizer steps flat f32 master slices on the device; collectives run
//! on the device where it can ([`DeviceComms`]: NCCL between GPUs, the
//! same-device exchange between ranks on one GPU), gradient reductions on
//! a communication stream of their own. Nodes without a
//! device kernel run on the host through the reference kernels and are
//! counted, so a run can say what did not run on the GPU.

use super::device_comms::{DeviceComms, DeviceOp};
use super::module::{Kernels, View};
use super::nccl::{DataType, Posted, TransferRoute};
use super::ops::{self, grid, launch, Gpu, IndexCheck};
use super::tensor::{self, GpuTensor, Storage};
use super::CudaError;
use super::GpuPrecision;
use autopar_exec::train::Optimizer;
use autopar_exec::{Backend, BackendError, DeviceCollectives, Order};
use autopar_ir::{DType, Op, Value};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};
use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};

mod grouped;

/// Op name → nodes of that op that ran on the host.
pub(crate) type HostNodes = Arc<Mutex<BTreeMap<String, usize>>>;

/// One rank's device state.
pub struct CudaBackend {
    gpu: Gpu,
    /// Op name → nodes of that op run on the host (no device kernel for
    /// them), shared by every rank of the run.
    host_nodes: HostNodes,
    /// Collectives on the device: NCCL when this rank's peers have GPUs of
    /// their own, the same-device exchange when they share this one.
    comms: Option<Box<dyn DeviceComms>>,
    /// Transfers posted for the next NCCL group, with the tensors they
    /// read or fill (held until the group is queued).
    posted: Vec<(Posted, Arc<GpuTensor>)>,
    /// Where collectives issued [`Order::Overlapped`] run (made on first use).
    side: Option<SideStream>,
    /// Sends by receiver, under [`TransferRoute::Pairs`].
    sending: BTreeMap<usize, Sending>,
    /// The gathers run since the step began, by the code they report an
    /// index out of range with (code k is entry k - 1).
    gathers: Vec<String>,
}

/// Sends to one receiver under [`TransferRoute::Pairs`]: a stream of their
/// own, so a send waiting for its receiver never holds the compute stream,
/// and the tensors of the sends in flight, each with an event that marks
/// its end (their stream-ordered frees must not come before it).
struct Sending {
    stream: Arc<CudaStream>,
    in_flight: VecDeque<(CudaEvent, Arc<GpuTensor>)>,
}

/// A rank's communication stream: NCCL gradient reductions and weight
/// refreshes queued here run while the compute stream goes on with the
/// backward pass. Each waits for the compute stream's work queued before
/// it; the compute stream waits for all of them at a join.
struct SideStream {
    stream: Arc<CudaStream>,
    /// The tensors the queued collectives read or write. Their buffers'
    /// stream-ordered frees go on the compute stream, so they are held
    /// until the compute stream has joined this one.
    held: Vec<Arc<GpuTensor>>,
}

/// Optimizer state of one parameter (or shard): f32 moments, and an f32
/// master copy when weights are bf16.
pub struct GpuState {
    master: Option<CudaSlice<f32>>,
    first: Option<CudaSlice<f32>>,
    second: Option<CudaSlice<f32>>,
}

/// A driver, cuBLAS or kernel failure.
fn err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(e.to_string())
}

impl CudaBackend {
    /// A backend on its own stream of `ctx`.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        kernels: Arc<Kernels>,
        precision: GpuPrecision,
        host_nodes: HostNodes,
    ) -> Result<CudaBackend, CudaError> {
        // SAFETY: only tries to dlopen libcublas.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::MissingLibrary {
                library: "libcublas",
                hint: "install the CUDA toolkit's cuBLAS (or the nvidia-cublas wheel) and add its lib folder to LD_LIBRARY_PATH".into(),
            });
        }
        let stream = ctx.new_stream().map_err(|e| CudaError::Driver(e.to_string()))?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Driver(format!("cuBLAS: {e}")))?;
        Ok(CudaBackend {
            gpu: Gpu {
                indices: IndexCheck::new(&stream)?,
                stream,
                blas,
                kernels,
                precision,
            },
            host_nodes,
            comms: None,
            posted: Vec::new(),
            side: None,
            sending: BTreeMap::new(),
            gathers: Vec::new(),
        })
    }

    /// The backend with its collectives (and maybe transfers) on `comms`.
    pub(crate) fn with_comms(self, comms: Box<dyn DeviceComms>) -> CudaBackend {
        CudaBackend {
            comms: Some(comms),
            ..self
        }
    }

    /// A device copy of `x` with its own buffer.
    fn copy(&self, x: &GpuTensor) -> Result<GpuTensor, CudaError> {
        let mut y = tensor::allocate(&self.gpu.stream, x.dtype, x.storage, x.shape.clone(), false)?;
        y.ints = x.ints.clone();
        y.seed = x.seed.clone();
        self.copy_into(&y, x)?;
        Ok(y)
    }

    /// Copies `x`'s elements to the start of `y`, which holds at least as many bytes.
    fn copy_into(&self, y: &GpuTensor, x: &GpuTensor) -> Result<(), CudaError> {
        let room = y.buf.len() as u64 - y.offset;
        if room < x.bytes() as u64 {
            return Err(CudaError::Driver(format!(
                "copying {} bytes into {room}",
                x.bytes()
            )));
        }
        // SAFETY: both buffers hold at least `x.bytes()` bytes (checked); same stream.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                self.gpu.ptr(y),
                self.gpu.ptr(x),
                x.bytes(),
                self.gpu.stream.cu_stream(),
            )
        }
        .map_err(|e| CudaError::Driver(e.to_string()))
    }

    /// `x` as a tensor whose buffer nobody else holds (copied if shared).
    fn owned<'t>(&self, x: &'t mut Arc<GpuTensor>) -> Result<&'t mut GpuTensor, BackendError> {
        let unique = Arc::get_mut(x).is_some_and(|t| Arc::get_mut(&mut t.buf).is_some());
        if !unique {
            *x = Arc::new(self.copy(x).map_err(err)?);
        }
        Arc::get_mut(x).ok_or_else(|| BackendError::Device("a tensor being updated is shared".into()))
    }

    /// Runs `op` through the reference kernels on host copies of `args`.
    fn on_host(
        &mut self,
        node: &str,
        op: &Op,
        args: &[Option<&Arc<GpuTensor>>],
    ) -> Result<Vec<Arc<GpuTensor>>, BackendError> {
        if let Ok(mut counts) = self.host_nodes.lock() {
            *counts.entry(op.name()).or_insert(0) += 1;
        }
        let host: Vec<Option<Value>> = args
            .iter()
            .map(|a| a.map(|x| tensor::download(&self.gpu.stream, x)).transpose())
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let refs: Vec<Option<&Value>> = host.iter().map(|v| v.as_ref()).collect();
        let outs = op.eval(&refs).map_err(|e| BackendError::HostNode {
            node: node.to_string(),
            message: e.to_string(),
        })?;
        outs.iter()
            .map(|v| {
                tensor::upload(&self.gpu.stream, v, self.gpu.precision)
                    .map(Arc::new)
                    .map_err(err)
            })
            .collect()
    }
}

impl Backend for CudaBackend {
    type Tensor = Arc<GpuTensor>;
    type State = GpuState;

    fn upload(&mut self, v: Value) -> Result<Arc<GpuTensor>, BackendError> {
        tensor::upload(&self.gpu.stream, &v, self.gpu.precision)
            .map(Arc::new)
            .map_err(err)
    }

    fn upload_weight(&mut self, v: Value) -> Result<Arc<GpuTensor>, BackendError> {
        let mut x = tensor::upload(&self.gpu.stream, &v, self.gpu.precision).map_err(err)?;
        if x.storage == Storage::Bf16 {
            let exact: Vec<f32> = v.to_f64_vec().into_iter().map(|f| f as f32).collect();
            x.seed = Some(Arc::new(self.gpu.stream.clone_htod(&exact).map_err(err)?));
        }
        Ok(Arc::new(x))
    }

    fn download(&mut self, x: &Arc<GpuTensor>) -> Result<Arc<Value>, BackendError> {
        tensor::download(&self.gpu.stream, x).map(Arc::new).map_err(err)
    }

    fn bytes(&self, x: &Arc<GpuTensor>) -> u64 {
        x.bytes() as u64
    }

    fn numel(&self, x: &Arc<GpuTensor>) -> usize {
        x.numel()
    }

    fn eval(
        &mut self,
        node: &str,
        op: &Op,
        args: &[Option<&Arc<GpuTensor>>],
    ) -> Result<Vec<Arc<GpuTensor>>, BackendError> {
        if ops::gathers(op) {
            self.gathers.push(node.to_string());
            self.gpu.indices.code.set(self.gathers.len() as i32);
        }
        let plain: Vec<Option<&GpuTensor>> = args.iter().map(|a| a.map(|x| &**x)).collect();
        let failed = |e: CudaError| BackendError::Node {
            node: node.to_string(),
            message: e.to_string(),
        };
        match ops::eval(&self.gpu, op, &plain).map_err(failed)? {
            Some(outs) => Ok(outs.into_iter().map(Arc::new).collect()),
            None => self.on_host(node, op, args),
        }
    }

    fn duplicate(&mut self, x: &Arc<GpuTensor>) -> Result<Arc<GpuTensor>, BackendError> {
        self.copy(x).map(Arc::new).map_err(err)
    }

    fn accumulate(&mut self, acc: &mut Arc<GpuTensor>, g: &Arc<GpuTensor>) -> Result<(), BackendError> {
        if acc.numel() != g.numel() || acc.storage != g.storage || !g.storage.is_float() {
            return Err(BackendError::GradientShapes);
        }
        let gpu = &self.gpu;
        let n = g.numel() as i64;
        let pg = gpu.ptr(g);
        let suffix = g.storage.suffix();
        let target = self.owned(acc)?;
        let pa = self.gpu.ptr(target);
        (|| {
            launch!(
                self.gpu,
                format!("add_inplace_{suffix}"),
                grid(n as usize),
                pa,
                pg,
                n
            )
        })()
        .map_err(err)
    }

    fn new_state(&mut self, optimizer: &Optimizer, len: usize) -> Result<GpuState, BackendError> {
        let zeros = |on: bool| -> Result<Option<CudaSlice<f32>>, BackendError> {
            on.then(|| self.gpu.stream.alloc_zeros::<f32>(len.max(1)).map_err(err))
                .transpose()
        };
        let (first, second) = match optimizer {
            Optimizer::AdamW { .. } => (zeros(true)?, zeros(true)?),
            Optimizer::Sgd { momentum, .. } => (zeros(*momentum != 0.0)?, None),
        };
        Ok(GpuState {
            master: None,
            first,
            second,
        })
    }

    fn save_state(&mut self, state: &GpuState) -> Result<Vec<Value>, BackendError> {
        if state.master.is_some() {
            return Err(BackendError::Device(
                "checkpoints of runs with bf16 weights are not supported yet (their f32 master copy is not saved)"
                    .into(),
            ));
        }
        [&state.first, &state.second]
            .into_iter()
            .flatten()
            .map(|slot| {
                let host = self.gpu.stream.clone_dtoh(slot).map_err(err)?;
                Value::f32(vec![host.len()], host).map_err(err)
            })
            .collect()
    }

    fn load_state(&mut self, optimizer: &Optimizer, slots: &[Value]) -> Result<GpuState, BackendError> {
        let mismatch = || BackendError::StateSlots {
            slots: slots.len(),
            what: slots.first().map_or("nothing".into(), |v| {
                format!("{} {:?} elements", v.numel(), v.dtype)
            }),
            want: optimizer.state_slots(),
        };
        if slots.len() != optimizer.state_slots() {
            return Err(mismatch());
        }
        let mut upload = slots.iter().map(|v| match &v.data {
            // An empty shard's state still holds one element, as `new_state` makes it.
            autopar_ir::Data::F32(d) if d.is_empty() => self.gpu.stream.alloc_zeros::<f32>(1).map_err(err),
            autopar_ir::Data::F32(d) => self.gpu.stream.clone_htod(d).map_err(err),
            _ => Err(mismatch()),
        });
        let first = upload.next().transpose()?;
        let second = upload.next().transpose()?;
        Ok(GpuState {
            master: None,
            first,
            second,
        })
    }

    fn update(
        &mut self,
        optimizer: &Optimizer,
        state: &mut GpuState,
        step: u64,
        weight: &mut Arc<GpuTensor>,
        w: Range<usize>,
        grad: &Arc<GpuTensor>,
        g: Range<usize>,
    ) -> Result<(), BackendError> {
        let storage = weight.storage;
        if storage != grad.storage || !storage.is_float() {
            return Err(BackendError::UpdateTypes);
        }
        let size = storage.size() as u64;
        let n = w.len() as i64;
        let pg = self.gpu.ptr(grad) + g.start as u64 * size;
        let target = self.owned(weight)?;
        let pw = self.gpu.ptr(target) + w.start as u64 * size;
        // The f32 master copy: the weights themselves in f32 runs, a slice
        // kept in the state otherwise, seeded from the weight's initial f32
        // value (or, for weights received since, from their bf16 value).
        let pm = match storage {
            Storage::F32 => pw,
            _ => {
                if state.master.is_none() {
                    let master = self.gpu.stream.alloc_zeros::<f32>(w.len().max(1)).map_err(err)?;
                    let (p, _) = cudarc::driver::DevicePtr::device_ptr(&master, &self.gpu.stream);
                    match target.seed.take() {
                        Some(seed) => {
                            let from = slice_ptr(&self.gpu, Some(&seed)) + w.start as u64 * 4;
                            // SAFETY: both ranges hold w.len() f32s; same stream.
                            unsafe {
                                cudarc::driver::result::memcpy_dtod_async(
                                    p,
                                    from,
                                    w.len() * 4,
                                    self.gpu.stream.cu_stream(),
                                )
                            }
                            .map_err(err)?;
                        }
                        None => (|| launch!(self.gpu, "cast_bf16_f32", grid(n as usize), p, pw, n))()
                            .map_err(err)?,
                    }
                    state.master = Some(master);
                }
                slice_ptr(&self.gpu, state.master.as_ref())
            }
        };
        let (pm1, pm2) = (
            slice_ptr(&self.gpu, state.first.as_ref()),
            slice_ptr(&self.gpu, state.second.as_ref()),
        );
        let suffix = storage.suffix();
        let launched = match *optimizer {
            Optimizer::AdamW {
                beta1, beta2, eps, ..
            } => {
                let Some(c) = optimizer.corrections(step) else {
                    unreachable!("AdamW has corrections")
                };
                let (step_size, bc2_sqrt, decay) = (c.step_size as f32, c.bc2_sqrt as f32, c.decay as f32);
                // Formed in f64 and rounded, exactly as the CPU oracle forms them.
                let (w1, rest1) = ((1.0 - beta1) as f32, (1.0 - (1.0 - beta1)) as f32);
                let (b2, w2, eps) = (beta2 as f32, (1.0 - beta2) as f32, eps as f32);
                (|| {
                    launch!(
                        self.gpu,
                        format!("adamw_{suffix}"),
                        grid(n as usize),
                        pm,
                        pw,
                        pm1,
                        pm2,
                        pg,
                        n,
                        step_size,
                        bc2_sqrt,
                        w1,
                        rest1,
                        b2,
                        w2,
                        eps,
                        decay
                    )
                })()
            }
            Optimizer::Sgd {
                lr,
                momentum,
                weight_decay,
            } => {
                let (lr, mu, wd) = (lr as f32, momentum as f32, weight_decay as f32);
                (|| {
                    launch!(
                        self.gpu,
                        format!("sgd_{suffix}"),
                        grid(n as usize),
                        pm,
                        pw,
                        pm1,
                        pg,
                        n,
                        lr,
                        mu,
                        wd
                    )
                })()
            }
        };
        launched.map_err(err)
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.join()?;
        // Every send of the step reaches its receiver before the step ends.
        for sending in self.sending.values_mut() {
            self.gpu.stream.join(&sending.stream).map_err(err)?;
            sending.in_flight.clear();
        }
        self.gpu.stream.synchronize().map_err(|e| {
            // A failure after the watchdog aborted NCCL names the failed rank.
            BackendError::Device(match self.comms.as_ref().and_then(|c| c.stopped()) {
                Some(why) => format!("{e} ({why})"),
                None => e.to_string(),
            })
        })?;
        let fault = self.gpu.indices.take(&self.gpu.stream).map_err(err)?;
        let gathers = std::mem::take(&mut self.gathers);
        match usize::try_from(fault - 1).ok().and_then(|k| gathers.get(k)) {
            Some(node) => Err(BackendError::Node {
                node: node.clone(),
                message: "an index is out of range (the GPU read 0 for it; the CPU backend names the value)"
                    .into(),
            }),
            None if fault != 0 => Err(BackendError::Device(format!(
                "a gather reported an index out of range with an unknown code {fault}"
            ))),
            None => Ok(()),
        }
    }

    fn device_comms(&mut self) -> Option<&mut dyn DeviceCollectives<Arc<GpuTensor>>> {
        match self.comms {
            Some(_) => Some(self),
            None => None,
        }
    }
}

/// Collectives on [`DeviceComms`] where it connects the group; a shared
/// tensor is copied before a collective writes it in place.
impl DeviceCollectives<Arc<GpuTensor>> for CudaBackend {
    fn all_reduce(
        &mut self,
        x: &mut Arc<GpuTensor>,
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        self.all_reduce_grouped(std::slice::from_mut(x), group, order)
    }

    fn reduce_scatter(
        &mut self,
        x: &Arc<GpuTensor>,
        group: &[usize],
        order: Order,
    ) -> Result<Option<Arc<GpuTensor>>, BackendError> {
        let parts = self.reduce_scatter_grouped(std::slice::from_ref(x), group, order)?;
        Ok(parts.and_then(|mut parts| parts.pop()))
    }

    fn all_reduce_bucket(
        &mut self,
        xs: &mut [Arc<GpuTensor>],
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        self.all_reduce_grouped(xs, group, order)
    }

    fn reduce_scatter_bucket(
        &mut self,
        xs: &[Arc<GpuTensor>],
        group: &[usize],
        order: Order,
    ) -> Result<Option<Vec<Arc<GpuTensor>>>, BackendError> {
        self.reduce_scatter_grouped(xs, group, order)
    }

    fn all_gather(
        &mut self,
        part: &Arc<GpuTensor>,
        group: &[usize],
        shape: &[usize],
        order: Order,
    ) -> Result<Option<Arc<GpuTensor>>, BackendError> {
        let Some(dtype) = self.device_type(part, group) else {
            return Ok(None);
        };
        let count = part.numel();
        if shape.iter().product::<usize>() > count * group.len() {
            return Err(BackendError::Collective(format!(
                "gathering {} parts of {count} elements cannot fill a {shape:?} weight",
                group.len()
            )));
        }
        let all = self.allocate_like(part, vec![count * group.len()])?;
        let (send, recv) = (self.gpu.ptr(part), self.gpu.ptr(&all));
        let call = DeviceOp::AllGather { send, recv }.over(group, count, dtype);
        let stream = self.stream_for(order)?;
        self.comms()?.collective(call, &stream)?;
        let all = Arc::new(all.alias(part.dtype, shape.to_vec()));
        self.hold(order, [part.clone(), all.clone()]);
        Ok(Some(all))
    }

    fn all_gather_parts(
        &mut self,
        w: &mut Arc<GpuTensor>,
        group: &[usize],
        order: Order,
    ) -> Result<bool, BackendError> {
        let Some(dtype) = self.device_type(w, group) else {
            return Ok(false);
        };
        let position = self.comms()?.position(group).ok_or_else(|| {
            BackendError::Collective(format!("this rank is not in the group {group:?} it gathers over"))
        })?;
        let part = w.numel().div_ceil(group.len());
        let len = part * group.len();
        if len > w.numel() {
            let mut all = self.padded(w, len)?;
            all.seed = w.seed.clone();
            *w = Arc::new(all.alias(w.dtype, w.shape.clone()));
        }
        // In place: this member's part already sits where the gather puts it.
        let target = self.owned(w)?;
        let at = self.gpu.ptr(target);
        let mine = at + (position * part * target.storage.size()) as u64;
        let stream = self.stream_for(order)?;
        let call = DeviceOp::AllGather { send: mine, recv: at }.over(group, part, dtype);
        self.comms()?.collective(call, &stream)?;
        self.hold(order, [w.clone()]);
        Ok(true)
    }

    fn gather_along(
        &mut self,
        x: &Arc<GpuTensor>,
        group: &[usize],
        axis: usize,
    ) -> Result<Option<Arc<GpuTensor>>, BackendError> {
        let parts = group.len();
        let Some((stacked, concatenated)) = View::stacked_and_concatenated(&x.shape, axis, parts) else {
            return Ok(None);
        };
        let Some(all) = self.all_gather(x, group, &[x.numel() * parts], Order::Inline)? else {
            return Ok(None);
        };
        let mut shape = x.shape.clone();
        shape[axis] *= parts;
        if leads_with_ones(&x.shape, axis) {
            // Stacked pieces already are their concatenation.
            return Ok(Some(Arc::new(all.alias(x.dtype, shape))));
        }
        let out = self.allocate_like(x, shape)?;
        self.gpu
            .copy_view(&out, concatenated, &all, stacked, all.numel())
            .map_err(err)?;
        Ok(Some(Arc::new(out)))
    }

    fn reduce_scatter_along(
        &mut self,
        x: &Arc<GpuTensor>,
        group: &[usize],
        axis: usize,
    ) -> Result<Option<Arc<GpuTensor>>, BackendError> {
        if self.device_type(x, group).is_none() {
            return Ok(None);
        }
        let parts = group.len();
        let mut piece = x.shape.clone();
        match piece.get_mut(axis) {
            Some(d) if *d % parts == 0 => *d /= parts,
            _ => {
                return Err(BackendError::Collective(format!(
                    "a {:?} tensor cannot be cut into {parts} equal slices along axis {axis}",
                    x.shape
                )))
            }
        }
        let Some((stacked, concatenated)) = View::stacked_and_concatenated(&piece, axis, parts) else {
            return Ok(None);
        };
        let send = match leads_with_ones(&piece, axis) {
            true => x.clone(),
            false => {
                let staged = Arc::new(self.allocate_like(x, vec![x.numel()])?);
                self.gpu
                    .copy_view(&staged, stacked, x, concatenated, x.numel())
                    .map_err(err)?;
                staged
            }
        };
        // Equal slices: ZeRO's flat reduce-scatter pads nothing.
        let mine = self.reduce_scatter(&send, group, Order::Inline)?;
        Ok(mine.map(|m| Arc::new(m.alias(x.dtype, piece))))
    }

    fn join(&mut self) -> Result<(), BackendError> {
        let Some(side) = self.side.as_mut().filter(|s| !s.held.is_empty()) else {
            return Ok(());
        };
        self.gpu.stream.join(&side.stream).map_err(err)?;
        // Their frees now queue behind the joined work.
        side.held.clear();
        Ok(())
    }

    fn send(&mut self, x: &Arc<GpuTensor>, to: usize) -> Result<bool, BackendError> {
        let Some(dtype) = self.transfer_type(x.storage) else {
            return Ok(false);
        };
        match self.comms.as_ref().and_then(|c| c.route()) {
            Some(TransferRoute::Pairs(_)) => self.send_now(x, to, dtype)?,
            _ => {
                let ptr = self.gpu.ptr(x);
                self.post(true, to, ptr, dtype, x.clone())
            }
        }
        Ok(true)
    }

    fn recv(
        &mut self,
        from: usize,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Option<Arc<GpuTensor>>, BackendError> {
        let storage = tensor::storage_of(dtype, self.gpu.precision);
        let Some((storage, nccl_type)) = storage.and_then(|s| Some((s, self.transfer_type(s)?))) else {
            return Ok(None);
        };
        let x =
            Arc::new(tensor::allocate(&self.gpu.stream, dtype, storage, shape.to_vec(), false).map_err(err)?);
        let ptr = self.gpu.ptr(&x);
        match self.comms.as_ref().and_then(|c| c.route()) {
            // The compute stream waits here for the data, as a receive from
            // the fabric waits for its message.
            Some(TransferRoute::Pairs(_)) => {
                let posted = Posted::new(false, from, ptr, x.numel(), nccl_type);
                self.comms()?.transfer_pair(posted, &self.gpu.stream)?
            }
            _ => self.post(false, from, ptr, nccl_type, x.clone()),
        }
        Ok(Some(x))
    }

    fn bytes_sent(&self) -> u64 {
        self.comms.as_ref().map_or(0, |c| c.bytes_sent())
    }

    fn flush_transfers(&mut self) -> Result<(), BackendError> {
        if self.posted.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.posted);
        let posted: Vec<Posted> = held.iter().map(|(p, _)| *p).collect();
        // Stream-ordered frees of `held` come after the queued group.
        Ok(self.comms()?.transfer(&posted, &self.gpu.stream)?)
    }
}

impl CudaBackend {
    /// The element type of a device collective of `x` over `group`, or
    /// `None` where it is staged through the host (every member alike).
    fn device_type(&self, x: &GpuTensor, group: &[usize]) -> Option<DataType> {
        self.comms.as_ref().filter(|c| c.connects(group))?;
        match x.storage {
            Storage::F32 => Some(DataType::ncclFloat32),
            Storage::Bf16 => Some(DataType::ncclBfloat16),
            Storage::I64 | Storage::Bool => None,
        }
    }

    fn comms(&self) -> Result<&dyn DeviceComms, BackendError> {
        comms_in(&self.comms)
    }

    /// The stream a collective issued with `order` is queued on. An
    /// overlapped one goes on the side stream, after the compute stream's
    /// work queued so far (which wrote its inputs).
    fn stream_for(&mut self, order: Order) -> Result<Arc<CudaStream>, BackendError> {
        if order == Order::Inline {
            return Ok(self.gpu.stream.clone());
        }
        let side = match &mut self.side {
            Some(side) => {
                side.stream.join(&self.gpu.stream).map_err(err)?;
                side
            }
            // A fork starts behind the compute stream's queued work.
            None => self.side.insert(SideStream {
                stream: self.gpu.stream.fork().map_err(err)?,
                held: Vec::new(),
            }),
        };
        Ok(side.stream.clone())
    }

    /// Keeps `tensors` alive until the next join, when an overlapped
    /// collective reads or writes them.
    fn hold(&mut self, order: Order, tensors: impl IntoIterator<Item = Arc<GpuTensor>>) {
        if let (Order::Overlapped, Some(side)) = (order, &mut self.side) {
            side.held.extend(tensors);
        }
    }

    /// NCCL's type for a transfer of `storage`, where transfers run on NCCL:
    /// floats only (every rank routes a transfer alike, knowing its dtype).
    fn transfer_type(&self, storage: Storage) -> Option<DataType> {
        self.comms.as_ref().and_then(|c| c.route())?;
        match storage {
            Storage::F32 => Some(DataType::ncclFloat32),
            Storage::Bf16 => Some(DataType::ncclBfloat16),
            Storage::I64 | Storage::Bool => None,
        }
    }

    /// Queues a send of `x` to `to` on the receiver's own stream, after the
    /// compute stream's work so far (which wrote `x`), and lets go of the
    /// tensors of earlier sends that have ended.
    fn send_now(&mut self, x: &Arc<GpuTensor>, to: usize, dtype: DataType) -> Result<(), BackendError> {
        let compute = &self.gpu.stream;
        let sending = match self.sending.entry(to) {
            std::collections::btree_map::Entry::Occupied(e) => {
                let sending = e.into_mut();
                sending.stream.join(compute).map_err(err)?;
                sending
            }
            // A fork starts behind the compute stream's queued work.
            std::collections::btree_map::Entry::Vacant(e) => e.insert(Sending {
                stream: compute.fork().map_err(err)?,
                in_flight: VecDeque::new(),
            }),
        };
        let posted = Posted::new(true, to, x.ptr(compute), x.numel(), dtype);
        comms_in(&self.comms)?.transfer_pair(posted, &sending.stream)?;
        let ended = sending.stream.record_event(None).map_err(err)?;
        sending.in_flight.push_back((ended, x.clone()));
        while sending
            .in_flight
            .front()
            .is_some_and(|(ended, _)| ended.try_is_complete().unwrap_or(false))
        {
            sending.in_flight.pop_front();
        }
        Ok(())
    }

    /// Adds a transfer of `x` (at `ptr`) to the open group.
    fn post(&mut self, send: bool, peer: usize, ptr: u64, dtype: DataType, x: Arc<GpuTensor>) {
        self.posted
            .push((Posted::new(send, peer, ptr, x.numel(), dtype), x));
    }

    /// A new tensor of `x`'s types and `shape` (contents unset).
    fn allocate_like(&self, x: &GpuTensor, shape: Vec<usize>) -> Result<GpuTensor, BackendError> {
        tensor::allocate(&self.gpu.stream, x.dtype, x.storage, shape, false).map_err(err)
    }

    /// `x` flattened and zero-padded to `len` elements, in a new buffer.
    fn padded(&self, x: &GpuTensor, len: usize) -> Result<GpuTensor, BackendError> {
        let y = tensor::allocate(&self.gpu.stream, x.dtype, x.storage, vec![len], true).map_err(err)?;
        self.copy_into(&y, x).map_err(err)?;
        Ok(y)
    }
}

/// The backend's device collectives, borrowed apart from its other fields.
fn comms_in(comms: &Option<Box<dyn DeviceComms>>) -> Result<&dyn DeviceComms, BackendError> {
    comms
        .as_deref()
        .ok_or_else(|| BackendError::Device("no device collectives".into()))
}

/// Whether every dim of `shape` before `axis` is 1, so that slices along
/// `axis` are contiguous blocks in order.
fn leads_with_ones(shape: &[usize], axis: usize) -> bool {
    shape[..axis].iter().all(|&d| d == 1)
}

/// The device address of an optional state slice (0, a null pointer, when absent).
fn slice_ptr(gpu: &Gpu, s: Option<&CudaSlice<f32>>) -> u64 {
    s.map_or(0, |s| cudarc::driver::DevicePtr::device_ptr(s, &gpu.stream).0)
}

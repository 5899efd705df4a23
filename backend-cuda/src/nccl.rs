//! NCCL between GPUs. When each rank of a run is its own process on its own
//! GPU (as a launcher starts them), a plan's all-reduces (data-parallel
//! gradients, tensor-parallel partial sums, tied weights' gradients) and
//! ZeRO's gradient reduce-scatters and weight gathers, and the gathers and
//! reduce-scatters along an axis of sequence, context and expert
//! parallelism run as NCCL calls instead of going through host memory and
//! TCP. Pipeline transfers do too, in one of two ways ([`TransferRoute`]):
//! grouped as the program runs them back to back, where the programs
//! finish with NCCL's waiting groups (1F1B, GPipe), or per pair of ranks
//! with sends on streams of their own (the interleaved schedule, whose
//! groups would wait in a cycle).
//!
//! NCCL calls block on the GPU until every member joins, so every rank must
//! route the same collectives to NCCL: the ranks first agree over the
//! fabric (each says whether it can, and on which GPU), and every rank
//! derives the groups from the same programs. Calls whose result the next
//! instructions read (tensor-parallel sums, ZeRO-3 gathers, transfers) go
//! on the rank's compute stream, ordered with its kernels as the program
//! orders them; gradient reductions and the ZeRO weight refresh go on a
//! communication stream that waits for the compute stream's work before
//! each call and is joined where the interpreter next touches what they
//! wrote, so they overlap the backward pass (the backend's `SideStream`).
//! Every rank replays the programs' communication first
//! ([`check_blocking`]) and keeps collectives host-staged if members would
//! meet them in orders that wait in a cycle. The two streams add none:
//! each rank submits every call from one thread in program order, the
//! order that replay proves finishes, so even a GPU that ran NCCL kernels
//! one at a time in submission order (NCCL does not promise concurrent
//! progress across communicators) finishes them. Per-pair transfers are
//! the one exception: they finish as the fabric's buffered sends do, which
//! needs a send waiting for its receiver to run beside the receiver's
//! other kernels, as NCCL does when the GPU has room (PyTorch's pipelines
//! rely on the same).

use super::device_comms::{Call, CommsError, DeviceComms, DeviceOp, Member, Stream};
use autopar_comm::collective::{Buffer, Collective, Endpoint};
use autopar_ir::CommKind;
use autopar_lower::blocking::{check_blocking, check_transfer_order, Transfers};
use autopar_lower::{Instr, Program};
use cudarc::driver::CudaContext;
use cudarc::nccl::{result, sys};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Set to 0 to stage every collective through host memory (to compare, or
/// to rule NCCL out while debugging).
pub const DISABLE_VAR: &str = "AUTOPAR_NCCL";

/// Set to 0 to keep pipeline transfers host-staged while collectives use
/// NCCL (say a pipeline's transfers hang where the GPU cannot run a
/// waiting send beside other kernels). Every rank must agree, so the ranks
/// exchange it with their readiness.
pub const TRANSFERS_VAR: &str = "AUTOPAR_NCCL_TRANSFERS";

/// NCCL 2.10 added bf16 reductions.
const MIN_VERSION: i32 = 21000;

/// One rank's NCCL communicators, one per group it meets in a collective,
/// and those its pipeline transfers run on when they go to NCCL too.
pub(crate) struct Nccl {
    member: Member,
    comms: Arc<Comms>,
    /// How transfers run on NCCL, where they do.
    route: Option<TransferRoute>,
    version: i32,
}

/// A send or receive of `count` elements at a device address, posted for
/// the next group, or for a pair's own communicator.
#[derive(Clone, Copy)]
pub(crate) struct Posted {
    pub send: bool,
    pub peer: usize,
    pub ptr: u64,
    pub count: usize,
    pub dtype: DataType,
}

impl Posted {
    /// A send to (`send`) or receive from `peer`.
    pub fn new(send: bool, peer: usize, ptr: u64, count: usize, dtype: DataType) -> Posted {
        Posted {
            send,
            peer,
            ptr,
            count,
            dtype,
        }
    }
}

/// How pipeline transfers run on NCCL. Both need every pair of ranks to
/// send and receive its transfers in one order
/// ([`check_transfer_order`]): NCCL matches them by order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TransferRoute {
    /// Each run of transfers is one group on the communicator of all ranks
    /// (these), queued on the compute stream; it completes when every
    /// counterpart is posted. Where the programs finish that way (1F1B,
    /// GPipe), as Megatron's batched exchanges do.
    Grouped(Vec<usize>),
    /// Each of these ordered pairs (sender, receiver) has a communicator
    /// of its own. A send is queued on a stream of its own per receiver
    /// and never holds the compute stream; a receive holds it until its
    /// data is there: the fabric's buffered sends, for schedules whose
    /// groups would wait in a cycle (interleaved). It relies on NCCL
    /// kernels of different communicators progressing side by side, as
    /// PyTorch's pipelines (a communicator and stream per pair) do.
    Pairs(BTreeSet<(usize, usize)>),
}

/// NCCL's element types.
pub(crate) type DataType = sys::ncclDataType_t;

/// How this process's rank talks to its peers' GPUs.
pub(crate) enum Link {
    /// A run of one rank has no peers.
    Alone,
    Nccl(Nccl),
    /// Collectives go through host memory and the fabric, for this reason.
    Staged(String),
}

/// An initialised communicator.
struct Comm(sys::ncclComm_t);

/// A rank's communicators by group, aborted (which never blocks on peers)
/// when the run ends, or earlier by the fabric's watchdog when a rank fails,
/// which fails the calls in flight instead of leaving them waiting.
pub(crate) struct Comms {
    by_group: BTreeMap<Vec<usize>, Comm>,
    /// Communicators of [`TransferRoute::Pairs`], by (sender, receiver).
    by_pair: BTreeMap<(usize, usize), Comm>,
    /// The rank whose failure aborted the communicators early, and why it
    /// failed, once they were.
    stopped: Mutex<Option<(usize, String)>>,
    aborted: AtomicBool,
}

// SAFETY: the rank's thread makes the calls; the watchdog thread only
// aborts, which NCCL allows from another thread while calls are in flight,
// and no call starts once `aborted` is set.
unsafe impl Send for Comms {}
unsafe impl Sync for Comms {}

impl Comms {
    /// Aborts every communicator because rank `by` failed (`why`).
    pub fn abort(&self, by: usize, why: &str) {
        if let Ok(mut stopped) = self.stopped.lock() {
            stopped.get_or_insert_with(|| (by, why.to_string()));
        }
        self.abort_once();
    }

    /// Aborts every communicator, the first time it is called.
    fn abort_once(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            for comm in self.by_group.values().chain(self.by_pair.values()) {
                // SAFETY: initialised, and not used once `aborted` is set.
                let _ = unsafe { result::comm_abort(comm.0) };
            }
        }
    }

    /// Why the communicators were aborted early, if they were.
    pub fn stopped(&self) -> Option<CommsError> {
        let stopped = self.stopped.lock().ok()?.clone();
        stopped.map(|(by, why)| CommsError::Stopped { by, why })
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        self.abort_once();
    }
}

impl Nccl {
    /// "NCCL 2.21.5 (…)", for the run's report: the version and what runs on it.
    pub fn describe(&self) -> String {
        let what = match self.route {
            Some(TransferRoute::Grouped(_)) => {
                "all-reduces, reduce-scatters and gathers, pipeline transfers grouped"
            }
            Some(TransferRoute::Pairs(_)) => {
                "all-reduces, reduce-scatters and gathers, pipeline transfers per pair of ranks"
            }
            None => "all-reduces, reduce-scatters and gathers; transfers host-staged",
        };
        format!("{} ({what})", self.version())
    }

    /// "NCCL 2.21.5".
    pub fn version(&self) -> String {
        let v = self.version;
        format!("NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }

    /// The communicators, for a watchdog to abort.
    pub fn comms(&self) -> Arc<Comms> {
        self.comms.clone()
    }

    /// The communicator of `group`.
    fn group(&self, group: &[usize]) -> Result<&Comm, CommsError> {
        self.comms
            .by_group
            .get(group)
            .ok_or_else(|| CommsError::NoGroup(group.to_vec()))
    }

    /// Queues `call` on `comm` and `stream`; `what` names it in errors.
    fn call_on(
        &self,
        comm: &Comm,
        what: impl FnOnce() -> String,
        stream: &Stream,
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<result::NcclStatus, result::NcclError>,
    ) -> Result<(), CommsError> {
        if let Some(stopped) = self.comms.stopped() {
            return Err(stopped);
        }
        // NCCL enqueues on the calling thread's current device.
        stream
            .context()
            .bind_to_thread()
            .map_err(CommsError::driver("binding the CUDA context"))?;
        call(comm.0, stream.cu_stream() as _)
            .map(drop)
            .map_err(|e| CommsError::Nccl {
                call: format!("NCCL {}", what()),
                code: e.0,
            })
    }
}

/// Queues `p`'s send to or receive from `peer`, its counterpart's place in
/// `comm`, on `s`.
///
/// # Safety
/// `p.ptr` holds (or has room for) `p.count` elements of `p.dtype` on this
/// device, kept alive by the caller until the transfer is queued.
unsafe fn send_or_recv(
    p: &Posted,
    peer: i32,
    comm: sys::ncclComm_t,
    s: sys::cudaStream_t,
) -> Result<result::NcclStatus, result::NcclError> {
    match p.send {
        true => result::send(p.ptr as *const _, p.count, p.dtype, peer, comm, s),
        false => result::recv(p.ptr as *mut _, p.count, p.dtype, peer, comm, s),
    }
}

/// Queues `call`'s NCCL collective on `comm` and `s`.
///
/// # Safety
/// The call's addresses hold the elements its op reads and writes (see
/// [`DeviceOp`]) on this device, kept alive until it completes.
unsafe fn enqueue(
    call: &Call,
    comm: sys::ncclComm_t,
    s: sys::cudaStream_t,
) -> Result<result::NcclStatus, result::NcclError> {
    let (count, dtype) = (call.count, call.dtype);
    let sum = sys::ncclRedOp_t::ncclSum;
    match call.op {
        DeviceOp::AllReduce(ptr) => {
            result::all_reduce(ptr as *const _, ptr as *mut _, count, dtype, sum, comm, s)
        }
        DeviceOp::ReduceScatter { send, recv } => {
            result::reduce_scatter(send as *const _, recv as *mut _, count, dtype, sum, comm, s)
        }
        DeviceOp::AllGather { send, recv } => {
            result::all_gather(send as *const _, recv as *mut _, count, dtype, comm, s)
        }
    }
}

impl DeviceComms for Nccl {
    fn member(&self) -> &Member {
        &self.member
    }

    /// Whether `group` has a communicator (every member gets the same answer).
    fn connects(&self, group: &[usize]) -> bool {
        self.comms.by_group.contains_key(group)
    }

    /// How transfers between ranks run on NCCL, if they do (all ranks agree).
    fn route(&self) -> Option<&TransferRoute> {
        self.route.as_ref()
    }

    /// Queues `call` on its group's communicator and `stream`.
    fn queue(&self, call: Call, stream: &Stream) -> Result<(), CommsError> {
        let (op, group) = (call.op, call.group);
        let comm = self.group(group)?;
        let what = || format!("{} over ranks {group:?}", op.name());
        // SAFETY: the addresses hold the elements the op reads and writes
        // (see `DeviceOp`) on this rank's device, used in stream order.
        self.call_on(comm, what, stream, |comm, s| unsafe { enqueue(&call, comm, s) })
    }

    /// Queues `calls` (over one group) as one NCCL group on its
    /// communicator and `stream`.
    fn collectives(&self, calls: &[Call], stream: &Stream) -> Result<(), CommsError> {
        let Some(first) = calls.first() else {
            return Ok(());
        };
        calls.iter().for_each(|call| self.member.count_call(call));
        let comm = self.group(first.group)?;
        let what = || {
            let (n, op, group) = (calls.len(), first.op.name(), first.group);
            format!("group of {n} {op}s over ranks {group:?}")
        };
        self.call_on(comm, what, stream, |comm, s| {
            result::group_start()?;
            // SAFETY: as in `queue`, for every call of the group.
            let issued = calls
                .iter()
                .try_for_each(|call| unsafe { enqueue(call, comm, s) }.map(drop));
            // The group is closed even when a call failed.
            let ended = result::group_end();
            issued.and(ended)
        })
    }

    /// Runs `posted` as one NCCL group on the communicator of all ranks,
    /// queued on `stream`: it completes when every peer has posted its side.
    fn transfer(&self, posted: &[Posted], stream: &Stream) -> Result<(), CommsError> {
        let Some(TransferRoute::Grouped(world)) = &self.route else {
            return Err(CommsError::NotGrouped("NCCL"));
        };
        for p in posted.iter().filter(|p| p.send) {
            self.member.count(Collective::SendRecv, 2, p.count, p.dtype);
        }
        let comm = self.group(world)?;
        let what = || format!("send/receive group over ranks {world:?}");
        self.call_on(comm, what, stream, |comm, s| {
            result::group_start()?;
            let issued = posted.iter().try_for_each(|p| {
                // SAFETY: the caller keeps every posted buffer alive until
                // the group is queued.
                unsafe { send_or_recv(p, p.peer as i32, comm, s) }.map(drop)
            });
            // The group is closed even when a call failed.
            let ended = result::group_end();
            issued.and(ended)
        })
    }

    /// Sends `p` to its peer on the pair's own communicator, where the
    /// sender is position 0 and the receiver 1 ([`TransferRoute::Pairs`]),
    /// or receives it there. A send completes when the peer receives it; a
    /// receive holds `stream` until its data is there.
    fn transfer_pair(&self, p: Posted, stream: &Stream) -> Result<(), CommsError> {
        let rank = self.member.rank();
        let (from, to) = match p.send {
            true => (rank, p.peer),
            false => (p.peer, rank),
        };
        if p.send {
            self.member.count(Collective::SendRecv, 2, p.count, p.dtype);
        }
        let comm = self
            .comms
            .by_pair
            .get(&(from, to))
            .ok_or(CommsError::NoPair { from, to })?;
        let what = || match p.send {
            true => format!("send to rank {to}"),
            false => format!("receive from rank {from}"),
        };
        let peer = i32::from(p.send);
        // SAFETY: the caller keeps `p`'s buffer alive until the transfer
        // completes (a send) or uses it in stream order (a receive).
        self.call_on(comm, what, stream, |comm, s| unsafe {
            send_or_recv(&p, peer, comm, s)
        })
    }

    fn stopped(&self) -> Option<CommsError> {
        self.comms.stopped()
    }
}

/// Connects this rank's NCCL communicators, or says why collectives stay
/// host-staged. Every rank of the run calls it at the same point; they all
/// reach the same decision.
pub(crate) fn connect(
    ep: &Endpoint,
    programs: &[Program],
    ctx: &Arc<CudaContext>,
) -> Result<Link, CommsError> {
    let world = ep.world();
    if world == 1 {
        return Ok(Link::Alone);
    }
    // Every rank reaches the same verdicts from the same programs: the
    // collectives go to NCCL if the programs finish with them blocking;
    // transfers too, grouped where the programs finish with groups that
    // wait for their counterparts, else per pair (buffered sends), as long
    // as each pair meets its transfers in one order.
    let grouped = check_blocking(programs, Transfers::Grouped).is_ok();
    if !grouped {
        if let Err(deadlock) = check_blocking(programs, Transfers::Buffered) {
            return Ok(Link::Staged(format!(
                "under NCCL's blocking collectives {deadlock}"
            )));
        }
    }
    let pairs = transfer_pairs(programs);
    let route = match (pairs.is_empty(), check_transfer_order(programs)) {
        (true, _) | (_, Err(_)) => None,
        (false, Ok(())) if grouped => Some(TransferRoute::Grouped((0..world).collect())),
        (false, Ok(())) => Some(TransferRoute::Pairs(pairs)),
    };
    open(ep, &collective_groups(programs), route, ctx)
}

/// Every (sender, receiver) pair of the programs' transfers.
fn transfer_pairs(programs: &[Program]) -> BTreeSet<(usize, usize)> {
    programs
        .iter()
        .flat_map(|p| {
            p.instructions.iter().filter_map(move |instr| match instr {
                Instr::Send { to, .. } | Instr::SendParam { to, .. } => Some((p.rank, *to)),
                _ => None,
            })
        })
        .collect()
}

/// Opens this rank's communicators among `groups` (one per group it is
/// in) and those of `route`'s transfers, once every rank of the job has
/// said it can use NCCL on a GPU of its own; otherwise says why not. The
/// transfers stay host-staged if any rank has [`TRANSFERS_VAR`] at 0.
/// Every rank calls it with the same groups and route at the same point.
pub(crate) fn open(
    ep: &Endpoint,
    groups: &BTreeSet<Vec<usize>>,
    route: Option<TransferRoute>,
    ctx: &Arc<CudaContext>,
) -> Result<Link, CommsError> {
    let (rank, world) = (ep.rank(), ep.world());
    let (readiness, version) = local_readiness();
    let uuid = ctx
        .uuid()
        .map_err(CommsError::driver("reading the GPU's UUID"))?
        .bytes
        .map(|b| b as u8);
    let transfers = !std::env::var(TRANSFERS_VAR).is_ok_and(|v| v.trim() == "0");
    let mine = Buffer::F64(encode_row(readiness, transfers, &uuid));
    let everyone: Vec<usize> = (0..world).collect();
    let rows = ep.all_gather(&everyone, &mine, "nccl/readiness", "agreeing on NCCL")?;
    let Buffer::F64(rows) = rows else {
        return Err(CommsError::ArrivedAsF32("the NCCL readiness rows".into()));
    };
    let route = match agree(&rows, world) {
        Ok(transfers) => route.filter(|_| transfers),
        Err(why) => return Ok(Link::Staged(why.to_string())),
    };
    ctx.bind_to_thread()
        .map_err(CommsError::driver("binding the CUDA context"))?;
    let mut groups = groups.clone();
    if let Some(TransferRoute::Grouped(world_group)) = &route {
        groups.insert(world_group.clone());
    }
    // Every member initialises the same communicators in the same (sorted)
    // order, so the blocking initialisations cannot wait in a cycle.
    let mut by_group = BTreeMap::new();
    for group in groups.iter().filter(|g| g.len() > 1) {
        if let Some(comm) = join(ep, group, &format!("{group:?}"))? {
            by_group.insert(group.clone(), comm);
        }
    }
    let mut by_pair = BTreeMap::new();
    if let Some(TransferRoute::Pairs(pairs)) = &route {
        for &(from, to) in pairs {
            if let Some(comm) = join(ep, &[from, to], &format!("{from}->{to}"))? {
                by_pair.insert((from, to), comm);
            }
        }
    }
    Ok(Link::Nccl(Nccl {
        member: Member::new(rank),
        comms: Arc::new(Comms {
            by_group,
            by_pair,
            stopped: Mutex::new(None),
            aborted: AtomicBool::new(false),
        }),
        route,
        version,
    }))
}

/// This rank's communicator among `members` (ranks in the order of their
/// places in it), or `None` where it is not one of them. The first member
/// makes the id and sends it to the others over the fabric; `key` names
/// the communicator in messages.
fn join(ep: &Endpoint, members: &[usize], key: &str) -> Result<Option<Comm>, CommsError> {
    let Some(position) = members.iter().position(|&r| r == ep.rank()) else {
        return Ok(None);
    };
    let tag = format!("nccl/id/{key}");
    let what = format!("sharing the NCCL id of ranks {key}");
    let id = if position == 0 {
        let id = result::get_uniqueid().map_err(|e| CommsError::Nccl {
            call: "ncclGetUniqueId".into(),
            code: e.0,
        })?;
        for &member in &members[1..] {
            ep.send(member, &tag, Buffer::F64(encode_bytes(&id_bytes(&id))), &what)?;
        }
        id
    } else {
        match ep.recv(members[0], &tag, &what)? {
            Buffer::F64(words) => id_from(&decode_bytes(&words, 128)?),
            Buffer::F32(_) => return Err(CommsError::ArrivedAsF32(format!("{what}: the id"))),
        }
    };
    let mut comm = std::ptr::null_mut();
    // SAFETY: `comm` is written by NCCL.
    unsafe { result::comm_init_rank(&mut comm, members.len() as i32, id, position as i32) }.map_err(|e| {
        CommsError::Nccl {
            call: format!("ncclCommInitRank for ranks {key}"),
            code: e.0,
        }
    })?;
    Ok(Some(Comm(comm)))
}

/// Whether this process can use NCCL: 0 if so, else a reason code, with
/// the library's version (0 when absent).
fn local_readiness() -> (u32, i32) {
    if std::env::var(DISABLE_VAR).is_ok_and(|v| v.trim() == "0") {
        return (1, 0);
    }
    // SAFETY: only tries to dlopen libnccl.
    if !unsafe { sys::is_culib_present() } {
        return (2, 0);
    }
    match result::get_nccl_version() {
        Ok(v) if v >= MIN_VERSION => (0, v),
        Ok(v) => (3, v),
        Err(_) => (2, 0),
    }
}

/// What a reason code from [`local_readiness`] means.
fn reason(code: u32) -> &'static str {
    match code {
        1 => "AUTOPAR_NCCL=0",
        2 => "libnccl.so not found (install NCCL, e.g. the nvidia-nccl wheel, and add its lib folder with a libnccl.so link to LD_LIBRARY_PATH)",
        3 => "NCCL older than 2.10 (no bf16 reductions)",
        0 => "ready",
        _ => "an unknown reason",
    }
}

/// One rank's readiness row: its reason code, then its GPU's UUID as four
/// 32-bit words (exact in f64, so the row survives any fabric).
fn encode_row(readiness: u32, transfers: bool, uuid: &[u8; 16]) -> Vec<f64> {
    [f64::from(readiness), f64::from(u8::from(transfers))]
        .into_iter()
        .chain(encode_bytes(uuid))
        .collect()
}

const ROW: usize = 6;

/// Why the ranks' collectives stay host-staged instead of going to NCCL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unready {
    #[error("{values} readiness values from {world} ranks")]
    Rows { values: usize, world: usize },
    /// Rank `rank` cannot use NCCL, for reason `code` ([`reason`]).
    #[error("rank {rank}: {}", reason(*.code))]
    Rank { rank: usize, code: u32 },
    #[error("ranks {first} and {rank} share a GPU")]
    SharedGpu { first: usize, rank: usize },
}

/// Collectives go to NCCL only if every rank can use it and no two ranks
/// share a GPU (NCCL refuses duplicate devices); otherwise says why not.
/// Transfers may go too (`Ok(true)`) unless a rank keeps them staged.
fn agree(rows: &[f64], world: usize) -> Result<bool, Unready> {
    if rows.len() != world * ROW {
        let values = rows.len();
        return Err(Unready::Rows { values, world });
    }
    let mut seen: BTreeMap<Vec<u64>, usize> = BTreeMap::new();
    for (rank, row) in rows.chunks(ROW).enumerate() {
        if row[0] != 0.0 {
            let code = row[0] as u32;
            return Err(Unready::Rank { rank, code });
        }
        let uuid: Vec<u64> = row[2..].iter().map(|&w| w as u64).collect();
        if let Some(first) = seen.insert(uuid, rank) {
            return Err(Unready::SharedGpu { first, rank });
        }
    }
    Ok(rows.chunks(ROW).all(|row| row[1] == 1.0))
}

/// The groups of every collective that goes to NCCL, over all ranks'
/// programs, in one order every rank computes alike.
pub(crate) fn collective_groups(programs: &[Program]) -> BTreeSet<Vec<usize>> {
    programs
        .iter()
        .flat_map(|p| &p.instructions)
        .filter_map(|instr| match instr {
            Instr::AllReduceGrad { group, .. }
            | Instr::SumTiedGrads { group, .. }
            | Instr::ReduceScatterGrad { group, .. }
            | Instr::AllGatherParams { group, .. }
            | Instr::GatherParam { group, .. }
            | Instr::Collective {
                kind:
                    CommKind::AllReduce
                    | CommKind::AllGather
                    | CommKind::GatherForCompute
                    | CommKind::ReduceScatter,
                group,
                ..
            } => Some(group),
            _ => None,
        })
        .filter(|group| group.len() > 1)
        .cloned()
        .collect()
}

/// Bytes as little-endian 32-bit words, each exact in an f64.
pub(super) fn encode_bytes(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut word = [0u8; 4];
            word[..c.len()].copy_from_slice(c);
            f64::from(u32::from_le_bytes(word))
        })
        .collect()
}

/// The `len` bytes [`encode_bytes`] made.
pub(super) fn decode_bytes(words: &[f64], len: usize) -> Result<Vec<u8>, CommsError> {
    if words.len() != len.div_ceil(4)
        || words
            .iter()
            .any(|&w| w.fract() != 0.0 || !(0.0..=4294967295.0).contains(&w))
    {
        return Err(CommsError::Malformed(len));
    }
    let mut bytes: Vec<u8> = words.iter().flat_map(|&w| (w as u32).to_le_bytes()).collect();
    bytes.truncate(len);
    Ok(bytes)
}

fn id_bytes(id: &sys::ncclUniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

fn id_from(bytes: &[u8]) -> sys::ncclUniqueId {
    let mut internal = [0 as std::ffi::c_char; 128];
    for (to, &b) in internal.iter_mut().zip(bytes) {
        *to = b as std::ffi::c_char;
    }
    sys::ncclUniqueId { internal }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_lower::{tiny_gpt_programs, Strategy};

    #[test]
    fn bytes_round_trip_through_words() {
        let bytes: Vec<u8> = (0..=255u8).rev().take(130).collect();
        let words = encode_bytes(&bytes);
        assert_eq!(words.len(), 33);
        assert_eq!(decode_bytes(&words, 130).unwrap(), bytes);
        assert_eq!(id_bytes(&id_from(&bytes[..128])), bytes[..128]);
        for malformed in [&words[1..], &[0.5; 33]] {
            let e = decode_bytes(malformed, 130).unwrap_err();
            assert!(matches!(e, CommsError::Malformed(130)), "{e:?}");
            assert_eq!(e.to_string(), "malformed 130-byte message");
        }
    }

    /// A pipeline's pairs are its neighbours in both directions (and the
    /// first and last stages, which exchange the tied embedding).
    #[test]
    fn pairs_of_a_pipeline() {
        let pairs = transfer_pairs(&tiny_gpt_programs(4, &Strategy::new(1, 4, 4, 1, 4)));
        for stage in 0..3 {
            assert!(
                pairs.contains(&(stage, stage + 1)) && pairs.contains(&(stage + 1, stage)),
                "{pairs:?}"
            );
        }
        assert!(
            pairs
                .iter()
                .all(|&(a, b)| a.abs_diff(b) == 1 || a.abs_diff(b) == 3),
            "{pairs:?}"
        );
    }

    /// NCCL traffic is counted as the fabric counts its ring collectives.
    #[test]
    fn bytes_are_counted_per_ring_algorithm() {
        let nccl = Nccl {
            member: Member::new(1),
            comms: Arc::new(Comms {
                by_group: BTreeMap::new(),
                by_pair: BTreeMap::new(),
                stopped: Mutex::new(None),
                aborted: AtomicBool::new(false),
            }),
            route: None,
            version: 0,
        };
        let member = nccl.member();
        member.count(Collective::AllReduce, 4, 1000, DataType::ncclFloat32);
        assert_eq!(nccl.bytes_sent(), 2 * 3 * 1000);
        member.count(Collective::AllGather, 4, 400, DataType::ncclBfloat16);
        assert_eq!(nccl.bytes_sent(), 6000 + 3 * 200);
        member.count(Collective::SendRecv, 2, 10, DataType::ncclFloat32);
        assert_eq!(nccl.bytes_sent(), 6600 + 40);
    }

    /// Without libnccl the check says so instead of the loader panicking;
    /// with it, the version is read (neither needs a GPU).
    #[test]
    fn readiness_is_read_without_a_gpu() {
        let (code, version) = local_readiness();
        match code {
            0 => assert!(version >= MIN_VERSION, "{version}"),
            1 | 2 => assert_eq!(version, 0),
            _ => assert!(version > 0 && version < MIN_VERSION, "{version}"),
        }
        eprintln!(
            "NCCL readiness here: {code} ({}), version {version}",
            reason(code)
        );
    }

    #[test]
    fn ranks_agree_only_when_all_can_on_distinct_gpus() {
        let row = |code, gpu: u8| encode_row(code, true, &[gpu; 16]);
        let rows = |rs: Vec<Vec<f64>>| rs.concat();
        assert_eq!(agree(&rows(vec![row(0, 1), row(0, 2), row(0, 3)]), 3), Ok(true));
        // One rank keeping its transfers staged keeps everyone's staged.
        let staged = encode_row(0, false, &[4; 16]);
        assert_eq!(agree(&rows(vec![row(0, 1), staged]), 2), Ok(false));
        let shared = agree(&rows(vec![row(0, 1), row(0, 2), row(0, 1)]), 3);
        assert_eq!(shared, Err(Unready::SharedGpu { first: 0, rank: 2 }));
        assert_eq!(shared.unwrap_err().to_string(), "ranks 0 and 2 share a GPU");
        let missing = agree(&rows(vec![row(0, 1), row(2, 2)]), 2).unwrap_err();
        assert_eq!(missing, Unready::Rank { rank: 1, code: 2 });
        assert!(
            missing.to_string().starts_with("rank 1: libnccl.so not found"),
            "{missing}"
        );
        let disabled = agree(&rows(vec![row(1, 1), row(0, 2)]), 2).unwrap_err();
        assert_eq!(disabled.to_string(), "rank 0: AUTOPAR_NCCL=0");
        let short = agree(&row(0, 1), 2).unwrap_err();
        assert_eq!(short, Unready::Rows { values: 6, world: 2 });
        assert_eq!(short.to_string(), "6 readiness values from 2 ranks");
    }

    /// The groups are the same from every rank's view, and cover the
    /// data- and tensor-parallel all-reduces of a hybrid plan.
    #[test]
    fn groups_of_a_hybrid_plan() {
        let s = Strategy::new(2, 1, 2, 1, 2).with_tp(2, false);
        let groups = collective_groups(&tiny_gpt_programs(2, &s));
        // Ranks are laid out tp-inner: tp groups {0,1}, {2,3}; dp {0,2}, {1,3}.
        let expected: BTreeSet<Vec<usize>> = [vec![0, 1], vec![0, 2], vec![1, 3], vec![2, 3]].into();
        assert_eq!(groups, expected);
        // A pipeline sends activations; its one all-reduce sums the tied
        // embedding's gradients of the first and last stages.
        let s = Strategy::new(1, 2, 2, 1, 2);
        assert_eq!(collective_groups(&tiny_gpt_programs(2, &s)), [vec![0, 1]].into());
        // ZeRO-3 meets over the data-parallel group in reduce-scatters and gathers only.
        let mut s = Strategy::new(2, 1, 2, 1, 2);
        s.zero = 3;
        let programs = tiny_gpt_programs(2, &s);
        assert!(programs[0]
            .instructions
            .iter()
            .all(|i| !matches!(i, Instr::AllReduceGrad { .. })));
        assert_eq!(collective_groups(&programs), [vec![0, 1]].into());
    }
}

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

use super::device_comms::{ring_bytes, DeviceComms, Stream};
use autopar_comm::collective::{Buffer, Collective, Endpoint};
use autopar_ir::CommKind;
use autopar_lower::blocking::{check_blocking, check_transfer_order, Transfers};
use autopar_lower::{Instr, Program};
use cudarc::driver::CudaContext;
use cudarc::nccl::{result, sys};
use std::cell::Cell;
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
    rank: usize,
    comms: Arc<Comms>,
    /// How transfers run on NCCL, where they do.
    route: Option<TransferRoute>,
    version: i32,
    /// Bytes this rank has sent, counted per ring algorithm as the fabric
    /// counts its collectives (NCCL's own choice of ring or tree aside).
    sent: Cell<u64>,
}

/// A send or receive of `count` elements at a device address, posted for
/// the next group.
#[derive(Clone, Copy)]
pub(crate) struct Posted {
    pub send: bool,
    pub peer: usize,
    pub ptr: u64,
    pub count: usize,
    pub dtype: DataType,
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
    /// Why the communicators were aborted early, once they were.
    stopped: Mutex<Option<String>>,
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
            stopped.get_or_insert_with(|| format!("NCCL stopped because rank {by} failed: {why}"));
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
    pub fn stopped(&self) -> Option<String> {
        self.stopped.lock().ok().and_then(|s| s.clone())
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

    /// Counts a `collective` of `count` elements of `dtype` over `group`.
    fn count(&self, collective: Collective, group: &[usize], count: usize, dtype: DataType) {
        self.sent
            .set(self.sent.get() + ring_bytes(collective, group.len(), count, dtype));
    }

    /// The communicators, for a watchdog to abort.
    pub fn comms(&self) -> Arc<Comms> {
        self.comms.clone()
    }

    fn pair(&self, from: usize, to: usize) -> Result<&Comm, String> {
        self.comms
            .by_pair
            .get(&(from, to))
            .ok_or_else(|| format!("no NCCL communicator for transfers from rank {from} to rank {to}"))
    }

    /// Queues `call` on `group`'s communicator and `stream`.
    fn enqueue(
        &self,
        name: &str,
        group: &[usize],
        stream: &Stream,
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<result::NcclStatus, result::NcclError>,
    ) -> Result<(), String> {
        let comm = self
            .comms
            .by_group
            .get(group)
            .ok_or_else(|| format!("no NCCL communicator for ranks {group:?}"))?;
        self.call_on(comm, &format!("{name} over ranks {group:?}"), stream, call)
    }

    /// Queues `call` on `comm` and `stream`; `what` names it in errors.
    fn call_on(
        &self,
        comm: &Comm,
        what: &str,
        stream: &Stream,
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<result::NcclStatus, result::NcclError>,
    ) -> Result<(), String> {
        if let Some(why) = self.comms.stopped() {
            return Err(why);
        }
        // NCCL enqueues on the calling thread's current device.
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| format!("binding the CUDA context: {e}"))?;
        call(comm.0, stream.cu_stream() as _)
            .map(drop)
            .map_err(|e| format!("NCCL {what}: {:?}", e.0))
    }
}

impl DeviceComms for Nccl {
    /// Whether `group` has a communicator (every member gets the same answer).
    fn connects(&self, group: &[usize]) -> bool {
        self.comms.by_group.contains_key(group)
    }

    /// Bytes this rank has sent through NCCL (see the field).
    fn bytes_sent(&self) -> u64 {
        self.sent.get()
    }

    /// How transfers between ranks run on NCCL, if they do (all ranks agree).
    fn route(&self) -> Option<&TransferRoute> {
        self.route.as_ref()
    }

    /// Runs `posted` as one NCCL group on the communicator of all ranks,
    /// queued on `stream`: it completes when every peer has posted its side.
    fn transfer(&self, posted: &[Posted], stream: &Stream) -> Result<(), String> {
        let Some(TransferRoute::Grouped(world)) = &self.route else {
            return Err("transfers are not grouped on NCCL here".into());
        };
        for p in posted.iter().filter(|p| p.send) {
            self.count(Collective::SendRecv, &[self.rank, p.peer], p.count, p.dtype);
        }
        self.enqueue("send/receive group", world, stream, |comm, s| {
            result::group_start()?;
            let issued = posted.iter().try_for_each(|p| {
                // SAFETY: `ptr` holds `count` elements of `dtype` on this
                // device, kept alive by the caller until the group is queued.
                unsafe {
                    match p.send {
                        true => result::send(p.ptr as *const _, p.count, p.dtype, p.peer as i32, comm, s),
                        false => result::recv(p.ptr as *mut _, p.count, p.dtype, p.peer as i32, comm, s),
                    }
                }
                .map(drop)
            });
            // The group is closed even when a call failed.
            let ended = result::group_end();
            issued.and(ended)
        })
    }

    /// This rank's position in `group` (its rank in the group's communicator).
    fn position(&self, group: &[usize]) -> Option<usize> {
        group.iter().position(|&r| r == self.rank)
    }

    /// Sums `count` elements of `dtype` at device address `ptr` in place
    /// over `group`, queued on `stream`.
    fn all_reduce(
        &self,
        group: &[usize],
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        self.count(Collective::AllReduce, group, count, dtype);
        self.enqueue("all-reduce", group, stream, |comm, s| {
            // SAFETY: `ptr` holds `count` elements of `dtype` on this rank's
            // device, used in stream order.
            unsafe {
                result::all_reduce(
                    ptr as *const _,
                    ptr as *mut _,
                    count,
                    dtype,
                    sys::ncclRedOp_t::ncclSum,
                    comm,
                    s,
                )
            }
        })
    }

    /// Sums the `count × group size` elements at `send` over `group` and
    /// writes part `position` of the sum (`count` elements) to `recv`.
    fn reduce_scatter(
        &self,
        group: &[usize],
        (send, recv): (u64, u64),
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        self.count(Collective::ReduceScatter, group, count * group.len(), dtype);
        self.enqueue("reduce-scatter", group, stream, |comm, s| {
            // SAFETY: `send` holds count × group size elements and `recv`
            // count, both on this device, used in stream order.
            unsafe {
                result::reduce_scatter(
                    send as *const _,
                    recv as *mut _,
                    count,
                    dtype,
                    sys::ncclRedOp_t::ncclSum,
                    comm,
                    s,
                )
            }
        })
    }

    /// Concatenates every member's `count` elements at `send` into `recv`
    /// (`count × group size` elements, parts in group order). In place
    /// when `send` is this member's part of `recv`.
    fn all_gather(
        &self,
        group: &[usize],
        (send, recv): (u64, u64),
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        self.count(Collective::AllGather, group, count * group.len(), dtype);
        self.enqueue("all-gather", group, stream, |comm, s| {
            // SAFETY: `send` holds `count` elements and `recv` count × group
            // size, both on this device, used in stream order.
            unsafe { result::all_gather(send as *const _, recv as *mut _, count, dtype, comm, s) }
        })
    }

    /// Sends `count` elements of `dtype` at `ptr` to rank `to` on the
    /// pair's own communicator ([`TransferRoute::Pairs`]), queued on
    /// `stream`; it completes when `to` receives it.
    fn send_to(
        &self,
        to: usize,
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        self.count(Collective::SendRecv, &[self.rank, to], count, dtype);
        let comm = self.pair(self.rank, to)?;
        self.call_on(comm, &format!("send to rank {to}"), stream, |comm, s| {
            // SAFETY: `ptr` holds `count` elements of `dtype` on this
            // device, kept alive by the caller until the send completes.
            // The receiver is position 1 of the pair's communicator.
            unsafe { result::send(ptr as *const _, count, dtype, 1, comm, s) }
        })
    }

    /// Receives `count` elements of `dtype` from rank `from` into `ptr`
    /// ([`TransferRoute::Pairs`]), queued on `stream`.
    fn recv_from(
        &self,
        from: usize,
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), String> {
        let comm = self.pair(from, self.rank)?;
        self.call_on(comm, &format!("receive from rank {from}"), stream, |comm, s| {
            // SAFETY: `ptr` has room for `count` elements of `dtype` on this
            // device, used in stream order. The sender is position 0.
            unsafe { result::recv(ptr as *mut _, count, dtype, 0, comm, s) }
        })
    }

    fn stopped(&self) -> Option<String> {
        self.comms.stopped()
    }
}

/// Connects this rank's NCCL communicators, or says why collectives stay
/// host-staged. Every rank of the run calls it at the same point; they all
/// reach the same decision.
pub(crate) fn connect(ep: &Endpoint, programs: &[Program], ctx: &Arc<CudaContext>) -> Result<Link, String> {
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
) -> Result<Link, String> {
    let (rank, world) = (ep.rank(), ep.world());
    let (readiness, version) = local_readiness();
    let uuid = ctx
        .uuid()
        .map_err(|e| format!("reading the GPU's UUID: {e}"))?
        .bytes
        .map(|b| b as u8);
    let transfers = !std::env::var(TRANSFERS_VAR).is_ok_and(|v| v.trim() == "0");
    let mine = Buffer::F64(encode_row(readiness, transfers, &uuid));
    let everyone: Vec<usize> = (0..world).collect();
    let rows = ep
        .all_gather(&everyone, &mine, "nccl/readiness", "agreeing on NCCL")
        .map_err(|e| e.to_string())?;
    let Buffer::F64(rows) = rows else {
        return Err("the NCCL readiness rows arrived as f32".into());
    };
    let route = match agree(&rows, world) {
        Ok(transfers) => route.filter(|_| transfers),
        Err(why) => return Ok(Link::Staged(why)),
    };
    ctx.bind_to_thread()
        .map_err(|e| format!("binding the CUDA context: {e}"))?;
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
        rank,
        comms: Arc::new(Comms {
            by_group,
            by_pair,
            stopped: Mutex::new(None),
            aborted: AtomicBool::new(false),
        }),
        route,
        version,
        sent: Cell::new(0),
    }))
}

/// This rank's communicator among `members` (ranks in the order of their
/// places in it), or `None` where it is not one of them. The first member
/// makes the id and sends it to the others over the fabric; `key` names
/// the communicator in messages.
fn join(ep: &Endpoint, members: &[usize], key: &str) -> Result<Option<Comm>, String> {
    let Some(position) = members.iter().position(|&r| r == ep.rank()) else {
        return Ok(None);
    };
    let tag = format!("nccl/id/{key}");
    let what = format!("sharing the NCCL id of ranks {key}");
    let id = if position == 0 {
        let id = result::get_uniqueid().map_err(|e| format!("ncclGetUniqueId: {:?}", e.0))?;
        for &member in &members[1..] {
            ep.send(member, &tag, Buffer::F64(encode_bytes(&id_bytes(&id))), &what)
                .map_err(|e| e.to_string())?;
        }
        id
    } else {
        match ep.recv(members[0], &tag, &what).map_err(|e| e.to_string())? {
            Buffer::F64(words) => id_from(&decode_bytes(&words, 128)?),
            Buffer::F32(_) => return Err(format!("{what}: the id arrived as f32")),
        }
    };
    let mut comm = std::ptr::null_mut();
    // SAFETY: `comm` is written by NCCL.
    unsafe { result::comm_init_rank(&mut comm, members.len() as i32, id, position as i32) }
        .map_err(|e| format!("ncclCommInitRank for ranks {key}: {:?}", e.0))?;
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

/// Collectives go to NCCL only if every rank can use it and no two ranks
/// share a GPU (NCCL refuses duplicate devices); otherwise says why not.
/// Transfers may go too (`Ok(true)`) unless a rank keeps them staged.
fn agree(rows: &[f64], world: usize) -> Result<bool, String> {
    if rows.len() != world * ROW {
        return Err(format!("{} readiness values from {world} ranks", rows.len()));
    }
    let mut seen: BTreeMap<Vec<u64>, usize> = BTreeMap::new();
    for (rank, row) in rows.chunks(ROW).enumerate() {
        if row[0] != 0.0 {
            return Err(format!("rank {rank}: {}", reason(row[0] as u32)));
        }
        let uuid: Vec<u64> = row[2..].iter().map(|&w| w as u64).collect();
        if let Some(first) = seen.insert(uuid, rank) {
            return Err(format!("ranks {first} and {rank} share a GPU"));
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
            | Instr::AllGatherParam { group, .. }
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
pub(super) fn decode_bytes(words: &[f64], len: usize) -> Result<Vec<u8>, String> {
    if words.len() != len.div_ceil(4)
        || words
            .iter()
            .any(|&w| w.fract() != 0.0 || !(0.0..=4294967295.0).contains(&w))
    {
        return Err(format!("malformed {len}-byte message"));
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
        let malformed = Err("malformed 130-byte message".to_string());
        assert_eq!(decode_bytes(&words[1..], 130), malformed);
        assert_eq!(decode_bytes(&[0.5; 33], 130), malformed);
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
            rank: 1,
            comms: Arc::new(Comms {
                by_group: BTreeMap::new(),
                by_pair: BTreeMap::new(),
                stopped: Mutex::new(None),
                aborted: AtomicBool::new(false),
            }),
            route: None,
            version: 0,
            sent: Cell::new(0),
        };
        let group = [0, 1, 2, 3];
        nccl.count(Collective::AllReduce, &group, 1000, DataType::ncclFloat32);
        assert_eq!(nccl.bytes_sent(), 2 * 3 * 1000);
        nccl.count(Collective::AllGather, &group, 400, DataType::ncclBfloat16);
        assert_eq!(nccl.bytes_sent(), 6000 + 3 * 200);
        nccl.count(Collective::SendRecv, &[1, 3], 10, DataType::ncclFloat32);
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
        assert_eq!(
            agree(&rows(vec![row(0, 1), row(0, 2), row(0, 1)]), 3),
            Err("ranks 0 and 2 share a GPU".into())
        );
        let missing = agree(&rows(vec![row(0, 1), row(2, 2)]), 2).unwrap_err();
        assert!(missing.starts_with("rank 1: libnccl.so not found"), "{missing}");
        assert_eq!(
            agree(&rows(vec![row(1, 1), row(0, 2)]), 2),
            Err("rank 0: AUTOPAR_NCCL=0".into())
        );
        let short = agree(&row(0, 1), 2).unwrap_err();
        assert!(short.ends_with(" readiness values from 2 ranks"), "{short}");
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

//! Launcher environment and rendezvous for multi-process CUDA runs.
//!
//! `autopar run --backend cuda` runs one process per GPU under the launchers
//! people already use (torchrun, Slurm's `srun`). Before NCCL can start, each
//! process must know its rank, and all of them must agree on the 128-byte NCCL
//! unique id that rank 0 creates (plus small per-rank facts such as hostname
//! and GPU ordinal). [`LaunchEnv`] reads the launcher's environment and
//! [`rendezvous`] is a small TCP all-gather, so no external store is needed.
//! Pure std, so it builds and is tested with or without the `cuda` feature.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// torch's default rendezvous port, used when MASTER_ADDR comes without MASTER_PORT.
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// Largest per-rank blob [`rendezvous`] carries: blobs are ids and small facts,
/// and the bound keeps a corrupt length from making rank 0 allocate.
pub const MAX_BLOB_BYTES: usize = 64 * 1024;
/// Largest frame on the wire (rank 0's reply holds every rank's blob).
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

const MAGIC: [u8; 4] = *b"APRV";
const PROTOCOL_VERSION: u32 = 1;
/// Bytes of a hello besides the blob: magic, version, rank, world, blob length.
const HELLO_HEADER_BYTES: usize = 20;
const ACCEPT_POLL: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(250);
const MIN_IO_TIMEOUT: Duration = Duration::from_millis(1);

/// Which launcher started this process, to word errors and pick conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun, or anything else that sets RANK / WORLD_SIZE.
    Torchrun,
    /// Slurm's `srun` (SLURM_PROCID without RANK).
    Slurm,
    /// No launcher variables: one process, rank 0 of 1.
    Single,
}

/// Where this process sits in the job and how to reach rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world_size: usize,
    /// Rank among the processes on this node: picks the GPU ordinal.
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Host rank 0 listens on (it binds this address).
    pub master_addr: String,
    /// Port of autopar's rendezvous; see [`LaunchEnv::from_lookup`].
    pub master_port: u16,
    pub launcher: Launcher,
}

/// Why the launch environment is unusable or the rendezvous failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{var} is not set: {why}")]
    Missing { var: &'static str, why: String },
    #[error("{var}='{value}' is invalid: expected {expected}")]
    BadValue {
        var: &'static str,
        value: String,
        expected: String,
    },
    #[error("rank 0 cannot listen on {addr}: {source}{hint}")]
    Listen {
        addr: String,
        hint: &'static str,
        source: io::Error,
    },
    #[error("rank {rank} could not reach rank 0 at {addr} within {:.1}s: {last}", waited.as_secs_f64())]
    Unreachable {
        rank: usize,
        addr: String,
        waited: Duration,
        last: String,
    },
    #[error("rendezvous at {addr} timed out after {:.1}s: rank(s) {} of world size {world} never joined", waited.as_secs_f64(), list_ranks(missing))]
    Timeout {
        addr: String,
        waited: Duration,
        world: usize,
        missing: Vec<usize>,
    },
    #[error("rendezvous: frame of {len} bytes from {peer} exceeds the {max}-byte limit")]
    FrameTooLarge { peer: String, len: u64, max: usize },
    #[error("rendezvous with {peer}: {detail}")]
    Protocol { peer: String, detail: String },
    #[error("rendezvous I/O with {peer}: {source}")]
    Io { peer: String, source: io::Error },
    /// Rank 0's error, relayed so that every rank fails with the same message.
    #[error("{message} (reported by rank 0)")]
    Remote { message: String },
    #[error("broadcast_from_root: rank 0 must supply the blob to broadcast")]
    NoRootBlob,
}

/// "1, 2, 5", shortened for huge worlds so the message stays readable.
fn list_ranks(ranks: &[usize]) -> String {
    const SHOWN: usize = 16;
    let mut text: Vec<String> = ranks.iter().take(SHOWN).map(usize::to_string).collect();
    if ranks.len() > SHOWN {
        text.push(format!("... ({} more)", ranks.len() - SHOWN));
    }
    text.join(", ")
}

fn bad(var: &'static str, value: impl ToString, expected: impl Into<String>) -> LaunchError {
    let (value, expected) = (value.to_string(), expected.into());
    LaunchError::BadValue { var, value, expected }
}

fn missing(var: &'static str, why: impl Into<String>) -> LaunchError {
    LaunchError::Missing { var, why: why.into() }
}

fn protocol(peer: impl Into<String>, detail: impl Into<String>) -> LaunchError {
    LaunchError::Protocol {
        peer: peer.into(),
        detail: detail.into(),
    }
}

fn too_large(peer: impl Into<String>, len: usize, max: usize) -> LaunchError {
    LaunchError::FrameTooLarge {
        peer: peer.into(),
        len: len as u64,
        max,
    }
}

/// A variable's value, trimmed; empty counts as unset (`export RANK=`).
type Get<'a> = &'a dyn Fn(&str) -> Option<String>;

fn number(get: Get, var: &'static str) -> Result<Option<usize>, LaunchError> {
    get(var)
        .map(|v| v.parse().map_err(|_| bad(var, &v, "a non-negative integer")))
        .transpose()
}

fn require(get: Get, var: &'static str, why: &str) -> Result<usize, LaunchError> {
    number(get, var)?.ok_or_else(|| missing(var, why))
}

fn port(var: &'static str, value: &str) -> Result<u16, LaunchError> {
    match value.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(bad(var, value, "a TCP port in 1..=65535")),
    }
}

/// A name and the value read from it, so checks can name both.
type Var = (&'static str, usize);

impl LaunchEnv {
    /// Reads the real process environment (non-UTF-8 values are shown lossily).
    pub fn from_env() -> Result<Self, LaunchError> {
        Self::from_lookup(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
    }

    /// One process, no launcher: what a plain `autopar run` gets.
    pub fn single() -> Self {
        LaunchEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".to_string(),
            master_port: DEFAULT_MASTER_PORT,
            launcher: Launcher::Single,
        }
    }

    /// Parses launcher variables from `lookup` (injectable for tests).
    ///
    /// RANK (or WORLD_SIZE) selects torchrun conventions; LOCAL_WORLD_SIZE
    /// defaults to WORLD_SIZE and LOCAL_RANK to RANK mod LOCAL_WORLD_SIZE, for
    /// hand-rolled single-node launchers. Otherwise SLURM_PROCID selects Slurm,
    /// with ranks per node from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE
    /// ("4", "4(x2),3"; uneven nodes are indexed by SLURM_NODEID). Neither:
    /// [`LaunchEnv::single`]. MASTER_ADDR is required when the world has more
    /// than one rank. The port is AUTOPAR_MASTER_PORT if set, else MASTER_PORT
    /// (default 29500), plus one when TORCHELASTIC_USE_AGENT_STORE=True,
    /// because then torchrun's agent already serves its store on MASTER_PORT.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LaunchError> {
        let get = move |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let get: Get = &get;
        if get("RANK").is_some() || (get("SLURM_PROCID").is_none() && get("WORLD_SIZE").is_some()) {
            let why = "torchrun-style launches set RANK and WORLD_SIZE together";
            let rank = ("RANK", require(get, "RANK", why)?);
            let world = ("WORLD_SIZE", require(get, "WORLD_SIZE", why)?);
            let local_world = (
                "LOCAL_WORLD_SIZE",
                number(get, "LOCAL_WORLD_SIZE")?.unwrap_or(world.1),
            );
            let local_rank = (
                "LOCAL_RANK",
                number(get, "LOCAL_RANK")?.unwrap_or(rank.1 % local_world.1.max(1)),
            );
            Self::checked(get, Launcher::Torchrun, [rank, world, local_rank, local_world])
        } else if get("SLURM_PROCID").is_some() {
            let why = "srun sets it together with SLURM_PROCID";
            let rank = ("SLURM_PROCID", require(get, "SLURM_PROCID", why)?);
            let world = ("SLURM_NTASKS", require(get, "SLURM_NTASKS", why)?);
            let local_rank = ("SLURM_LOCALID", require(get, "SLURM_LOCALID", why)?);
            let local_world = slurm_tasks_on_this_node(get)?;
            Self::checked(get, Launcher::Slurm, [rank, world, local_rank, local_world])
        } else {
            Ok(Self::single())
        }
    }

    /// Cross-checks [rank, world, local rank, local world] and reads rank 0's address.
    fn checked(get: Get, launcher: Launcher, counts: [Var; 4]) -> Result<Self, LaunchError> {
        let [rank, world, local_rank, local_world] = counts;
        for (var, value) in [world, local_world] {
            if value == 0 {
                return Err(bad(var, value, "a positive integer"));
            }
        }
        if local_world.1 > world.1 {
            return Err(bad(
                local_world.0,
                local_world.1,
                format!("at most {}={}", world.0, world.1),
            ));
        }
        for ((var, value), (limit_var, limit)) in [(rank, world), (local_rank, local_world)] {
            if value >= limit {
                return Err(bad(var, value, format!("below {limit_var}={limit}")));
            }
        }
        let master_addr = match get("MASTER_ADDR") {
            Some(addr) => addr,
            None if world.1 == 1 => "127.0.0.1".to_string(),
            None => {
                let why = format!(
                    "{}={} ranks need rank 0's host (e.g. the first node's name)",
                    world.0, world.1
                );
                return Err(missing("MASTER_ADDR", why));
            }
        };
        let master_port = match get("AUTOPAR_MASTER_PORT") {
            Some(p) => port("AUTOPAR_MASTER_PORT", &p)?,
            None => {
                let base = get("MASTER_PORT").map_or(Ok(DEFAULT_MASTER_PORT), |p| port("MASTER_PORT", &p))?;
                let agent_store = get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True");
                if launcher == Launcher::Torchrun && agent_store {
                    base.checked_add(1).ok_or_else(|| {
                        bad("MASTER_PORT", base, "below 65535: torchrun's agent store holds it and autopar uses the next port (or set AUTOPAR_MASTER_PORT)")
                    })?
                } else {
                    base
                }
            }
        };
        Ok(LaunchEnv {
            rank: rank.1,
            world_size: world.1,
            local_rank: local_rank.1,
            local_world_size: local_world.1,
            master_addr,
            master_port,
            launcher,
        })
    }

    /// "host:port", for messages.
    fn endpoint(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

/// Ranks on this node from Slurm's compressed per-node counts: "4", "4(x2)",
/// or uneven "4(x2),3", where SLURM_NODEID says which node this is.
fn slurm_tasks_on_this_node(get: Get) -> Result<Var, LaunchError> {
    let (var, spec) = ["SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
        .into_iter()
        .find_map(|var| get(var).map(|spec| (var, spec)))
        .ok_or_else(|| {
            missing(
                "SLURM_NTASKS_PER_NODE",
                "neither it nor SLURM_TASKS_PER_NODE gives ranks per node",
            )
        })?;
    let parse_run = |part: &str| -> Option<(usize, usize)> {
        match part.strip_suffix(')').and_then(|p| p.split_once("(x")) {
            Some((count, reps)) => Some((count.parse().ok()?, reps.parse().ok().filter(|&r| r > 0)?)),
            None => Some((part.parse().ok()?, 1)),
        }
    };
    let runs: Vec<(usize, usize)> = spec
        .split(',')
        .map(parse_run)
        .collect::<Option<_>>()
        .ok_or_else(|| bad(var, &spec, "per-node counts like '4', '4(x2)' or '4(x2),3'"))?;
    if runs.iter().all(|run| run.0 == runs[0].0) {
        return Ok((var, runs[0].0));
    }
    let node = require(
        get,
        "SLURM_NODEID",
        &format!("{var}='{spec}' differs between nodes"),
    )?;
    let mut first = 0usize;
    for (count, reps) in runs {
        first = first.saturating_add(reps);
        if node < first {
            return Ok((var, count));
        }
    }
    Err(bad(
        "SLURM_NODEID",
        node,
        format!("below the {first} nodes of {var}='{spec}'"),
    ))
}

/// All-gathers one small blob per rank: every rank gets all blobs in rank order.
///
/// Rank 0 listens on MASTER_ADDR:MASTER_PORT; the others connect (retrying
/// until `timeout`, since rank 0 may start later) and send a hello; rank 0
/// checks world sizes and ranks, then answers everyone with the list, or with
/// its error so that all ranks fail alike. A peer waits up to `timeout` for
/// the answer after connecting (half again as long, so that rank 0's
/// verdict wins any race with its own deadline), so a failing run can take
/// up to 2.5 × `timeout`.
/// `world_size == 1` returns at once without sockets.
pub fn rendezvous(env: &LaunchEnv, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, LaunchError> {
    if mine.len() > MAX_BLOB_BYTES {
        return Err(too_large(
            format!("rank {} (its own blob)", env.rank),
            mine.len(),
            MAX_BLOB_BYTES,
        ));
    }
    if env.rank >= env.world_size || u32::try_from(env.world_size).is_err() {
        return Err(bad(
            "rank",
            env.rank,
            format!("below world_size={} (at most u32::MAX)", env.world_size),
        ));
    }
    match (env.world_size, env.rank) {
        (1, _) => Ok(vec![mine.to_vec()]),
        (_, 0) => serve(env, mine, timeout),
        _ => join(env, mine, timeout),
    }
}

/// Sends rank 0's `root_blob` (the NCCL unique id) to every rank; other
/// ranks pass `None` (anything they pass is not sent).
pub fn broadcast_from_root(
    env: &LaunchEnv,
    root_blob: Option<&[u8]>,
    timeout: Duration,
) -> Result<Vec<u8>, LaunchError> {
    let mine = match (env.rank, root_blob) {
        (0, None) => return Err(LaunchError::NoRootBlob),
        (0, Some(blob)) => blob,
        _ => &[],
    };
    rendezvous(env, mine, timeout)?
        .into_iter()
        .next()
        .ok_or_else(|| protocol("rank 0", "empty rendezvous result"))
}

/// Rank 0: accept one hello per peer until all arrived, an error, or the deadline.
fn serve(env: &LaunchEnv, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, LaunchError> {
    let deadline = Instant::now() + timeout;
    let addr = env.endpoint();
    let listener = TcpListener::bind((env.master_addr.as_str(), env.master_port)).map_err(|source| {
        LaunchError::Listen {
            hint: match source.kind() {
                io::ErrorKind::AddrInUse => {
                    " (another process holds the port; set AUTOPAR_MASTER_PORT to a free one)"
                }
                io::ErrorKind::AddrNotAvailable => " (MASTER_ADDR must name the host rank 0 runs on)",
                _ => "",
            },
            addr: addr.clone(),
            source,
        }
    })?;
    listener.set_nonblocking(true).map_err(|e| io_error(&addr, e))?;
    let mut blobs: Vec<Option<Vec<u8>>> = vec![None; env.world_size];
    blobs[0] = Some(mine.to_vec());
    let mut peers = Vec::new();
    let mut failure = None;
    while peers.len() + 1 < env.world_size {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match listener.accept() {
            Ok((mut stream, from)) => {
                let from = from.to_string();
                if let Err(e) = receive_hello(&mut stream, &from, left, env.world_size, &mut blobs) {
                    failure.get_or_insert(e);
                }
                peers.push(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL.min(left)),
            Err(e) => {
                failure.get_or_insert(io_error(&addr, e));
                break;
            }
        }
    }
    let mut outcome = match failure {
        Some(e) => Err(e),
        None => {
            let missing: Vec<usize> = (0..env.world_size).filter(|&r| blobs[r].is_none()).collect();
            if missing.is_empty() {
                Ok(blobs.into_iter().flatten().collect())
            } else {
                Err(LaunchError::Timeout {
                    addr: addr.clone(),
                    waited: timeout,
                    world: env.world_size,
                    missing,
                })
            }
        }
    };
    let mut reply = encode_reply(&outcome);
    if reply.len() > MAX_FRAME_BYTES {
        outcome = Err(too_large("rank 0 (its reply)", reply.len(), MAX_FRAME_BYTES));
        reply = encode_reply(&outcome);
    }
    for mut peer in peers {
        // Best effort: a peer that already gave up reports its own error.
        let _ = peer
            .set_write_timeout(Some(timeout.max(MIN_IO_TIMEOUT)))
            .and_then(|()| write_frame(&mut peer, &reply));
    }
    outcome
}

/// Reads and checks one hello, recording its blob under its rank.
fn receive_hello(
    stream: &mut TcpStream,
    from: &str,
    left: Duration,
    world: usize,
    blobs: &mut [Option<Vec<u8>>],
) -> Result<(), LaunchError> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(left.max(MIN_IO_TIMEOUT))))
        .map_err(|e| io_error(from, e))?;
    let frame = read_frame(stream, HELLO_HEADER_BYTES + MAX_BLOB_BYTES, from)?;
    let mut d = Decoder::new(&frame, from)?;
    let (rank, their_world, blob) = (d.u32()? as usize, d.u32()? as usize, d.bytes()?.to_vec());
    d.finish()?;
    let fail = |detail: String| Err(protocol(format!("rank {rank} ({from})"), detail));
    if their_world != world {
        return fail(format!(
            "it has world size {their_world} but rank 0 has {world}; all ranks need the same"
        ));
    }
    match blobs.get_mut(rank) {
        Some(slot @ None) => {
            *slot = Some(blob);
            Ok(())
        }
        Some(Some(_)) => fail(format!("rank {rank} joined twice; ranks must be distinct")),
        None => fail(format!("rank {rank} is outside world size {world}")),
    }
}

/// Ranks > 0: connect, send the hello, await rank 0's answer.
fn join(env: &LaunchEnv, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, LaunchError> {
    let mut stream = connect(env, timeout)?;
    let peer = format!("rank 0 at {}", env.endpoint());
    // Rank 0 was listening when we connected, so its deadline is within `timeout`.
    let io_timeout = Some((timeout + timeout / 2).max(MIN_IO_TIMEOUT));
    stream
        .set_read_timeout(io_timeout)
        .and_then(|()| stream.set_write_timeout(io_timeout))
        .map_err(|e| io_error(&peer, e))?;
    let mut hello = header();
    for value in [env.rank, env.world_size, mine.len()] {
        hello.extend((value as u32).to_le_bytes());
    }
    hello.extend(mine);
    write_frame(&mut stream, &hello).map_err(|e| io_error(&peer, e))?;
    let frame = read_frame(&mut stream, MAX_FRAME_BYTES, &peer)?;
    let list = decode_reply(&frame, &peer)?.map_err(|message| LaunchError::Remote { message })?;
    if list.len() != env.world_size || list[env.rank] != mine {
        return Err(protocol(
            peer,
            format!("answer of {} blobs lacks ours at rank {}", list.len(), env.rank),
        ));
    }
    Ok(list)
}

/// Connects to rank 0, retrying with backoff until `timeout` (it may start later).
fn connect(env: &LaunchEnv, timeout: Duration) -> Result<TcpStream, LaunchError> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(10);
    let mut last = "no attempt made".to_string();
    loop {
        match (env.master_addr.as_str(), env.master_port).to_socket_addrs() {
            Ok(addrs) => {
                for sa in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match TcpStream::connect_timeout(&sa, left.clamp(MIN_IO_TIMEOUT, Duration::from_secs(1)))
                    {
                        Ok(stream) => return Ok(stream),
                        Err(e) => last = format!("{sa}: {e}"),
                    }
                }
            }
            Err(e) => last = format!("cannot resolve MASTER_ADDR '{}': {e}", env.master_addr),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LaunchError::Unreachable {
                rank: env.rank,
                addr: env.endpoint(),
                waited: timeout,
                last,
            });
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Names timeouts plainly instead of "resource temporarily unavailable".
fn io_error(peer: &str, source: io::Error) -> LaunchError {
    let source = match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, "no answer before the rendezvous timeout")
        }
        _ => source,
    };
    LaunchError::Io {
        peer: peer.to_string(),
        source,
    }
}

fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    w.write_all(&(payload.len() as u32).to_le_bytes())?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one length-prefixed frame, refusing lengths above `max` before allocating.
fn read_frame(r: &mut impl Read, max: usize, peer: &str) -> Result<Vec<u8>, LaunchError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|e| io_error(peer, e))?;
    let len = u32::from_le_bytes(len);
    if len as usize > max {
        return Err(too_large(peer, len as usize, max));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).map_err(|e| io_error(peer, e))?;
    Ok(payload)
}

fn header() -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend(PROTOCOL_VERSION.to_le_bytes());
    out
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u32).to_le_bytes());
    out.extend(bytes);
}

/// Rank 0's answer: tag 0 + the blobs in rank order, or tag 1 + its error.
fn encode_reply(outcome: &Result<Vec<Vec<u8>>, LaunchError>) -> Vec<u8> {
    let mut out = header();
    match outcome {
        Ok(blobs) => {
            out.push(0);
            out.extend((blobs.len() as u32).to_le_bytes());
            blobs.iter().for_each(|b| put_bytes(&mut out, b));
        }
        Err(e) => {
            out.push(1);
            put_bytes(&mut out, e.to_string().as_bytes());
        }
    }
    out
}

fn decode_reply(frame: &[u8], peer: &str) -> Result<Result<Vec<Vec<u8>>, String>, LaunchError> {
    let mut d = Decoder::new(frame, peer)?;
    let reply = match d.take(1)?[0] {
        0 => Ok((0..d.u32()?)
            .map(|_| d.bytes().map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?),
        1 => Err(String::from_utf8_lossy(d.bytes()?).into_owned()),
        tag => return Err(d.error(format!("unknown answer tag {tag}"))),
    };
    d.finish()?;
    Ok(reply)
}

/// Bounds-checked reader over one frame; every read is checked against what is left.
struct Decoder<'a> {
    rest: &'a [u8],
    peer: &'a str,
}

impl<'a> Decoder<'a> {
    /// Starts after checking magic and version, so strangers and old builds are named.
    fn new(frame: &'a [u8], peer: &'a str) -> Result<Self, LaunchError> {
        let mut d = Decoder { rest: frame, peer };
        if d.take(4)? != MAGIC {
            return Err(d.error("not an autopar rendezvous message".to_string()));
        }
        match d.u32()? {
            PROTOCOL_VERSION => Ok(d),
            v => Err(d.error(format!("protocol version {v}, expected {PROTOCOL_VERSION}: all ranks must run the same autopar build"))),
        }
    }

    fn error(&self, detail: String) -> LaunchError {
        protocol(self.peer, detail)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], LaunchError> {
        if n > self.rest.len() {
            return Err(self.error(format!(
                "message truncated: wanted {n} more bytes, {} left",
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, LaunchError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn bytes(&mut self) -> Result<&'a [u8], LaunchError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn finish(self) -> Result<(), LaunchError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(self.error(format!("{n} unexpected trailing bytes"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    /// Parses "K=V K=V ..." (a later K wins; "K=" unsets it, as an empty value does).
    fn parse(spec: &str) -> Result<LaunchEnv, LaunchError> {
        let vars: Vec<(String, String)> = spec
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(move |k| {
            vars.iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        })
    }

    const TORCHRUN: &str =
        "RANK=5 WORLD_SIZE=8 LOCAL_RANK=1 LOCAL_WORLD_SIZE=4 MASTER_ADDR=node0 MASTER_PORT=29400";
    const SLURM: &str =
        "SLURM_PROCID=6 SLURM_NTASKS=8 SLURM_LOCALID=2 SLURM_NTASKS_PER_NODE=4(x2) MASTER_ADDR=gpu001";

    /// [rank, world_size, local_rank, local_world_size] and rank 0's address.
    fn env([rank, world_size, local_rank, local_world_size]: [usize; 4], addr: &str, port: u16) -> LaunchEnv {
        let (master_addr, master_port, launcher) = (addr.to_string(), port, Launcher::Torchrun);
        LaunchEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher,
        }
    }

    #[test]
    fn torchrun_variables() {
        assert_eq!(parse(TORCHRUN).unwrap(), env([5, 8, 1, 4], "node0", 29400));
        // The agent store holds MASTER_PORT, so the next port; an explicit override wins.
        let agent = format!("{TORCHRUN} TORCHELASTIC_USE_AGENT_STORE=True");
        assert_eq!(parse(&agent).unwrap().master_port, 29401);
        let overridden = parse(&format!("{agent} AUTOPAR_MASTER_PORT=31000")).unwrap();
        assert_eq!(overridden.master_port, 31000);
        // Without LOCAL_*: one node holds the whole world; without MASTER_PORT: 29500.
        let bare = parse("RANK=3 WORLD_SIZE=4 MASTER_ADDR=10.0.0.1").unwrap();
        assert_eq!(bare, env([3, 4, 3, 4], "10.0.0.1", DEFAULT_MASTER_PORT));
    }

    #[test]
    fn slurm_variables() {
        let expected = LaunchEnv {
            launcher: Launcher::Slurm,
            ..env([6, 8, 2, 4], "gpu001", DEFAULT_MASTER_PORT)
        };
        assert_eq!(parse(SLURM).unwrap(), expected);
        let plain_count = parse(&format!("{SLURM} SLURM_NTASKS_PER_NODE=4"));
        assert_eq!(plain_count.unwrap(), expected);
        // Uneven "4(x2),3": node 2 holds 3 ranks; SLURM_TASKS_PER_NODE is the fallback.
        let uneven = "SLURM_NTASKS_PER_NODE= SLURM_TASKS_PER_NODE=4(x2),3 SLURM_NTASKS=11 SLURM_NODEID=2";
        assert_eq!(parse(&format!("{SLURM} {uneven}")).unwrap().local_world_size, 3);
        // torchrun inside a Slurm allocation: RANK wins.
        let both = parse(&format!("{SLURM} {TORCHRUN}")).unwrap();
        assert_eq!(both.launcher, Launcher::Torchrun);
    }

    #[test]
    fn single_process() {
        assert_eq!(parse("").unwrap(), LaunchEnv::single());
        assert_eq!(parse("RANK=0 WORLD_SIZE=1").unwrap().master_addr, "127.0.0.1");
    }

    #[test]
    #[rustfmt::skip]
    fn bad_environments_name_the_variable_and_value() {
        let torchrun_cases = [
            ("RANK=abc", "RANK='abc' is invalid: expected a non-negative integer"),
            ("RANK=8", "RANK='8' is invalid: expected below WORLD_SIZE=8"),
            ("RANK=", "RANK is not set: torchrun-style launches set RANK"),
            ("WORLD_SIZE=0", "WORLD_SIZE='0' is invalid: expected a positive"),
            ("WORLD_SIZE=4x", "WORLD_SIZE='4x' is invalid"),
            ("MASTER_ADDR=", "MASTER_ADDR is not set: WORLD_SIZE=8 ranks need"),
            ("LOCAL_RANK=4", "LOCAL_RANK='4' is invalid: expected below LOCAL_WORLD_SIZE=4"),
            ("LOCAL_WORLD_SIZE=9", "LOCAL_WORLD_SIZE='9' is invalid: expected at most WORLD_SIZE=8"),
            ("MASTER_PORT=70000", "MASTER_PORT='70000' is invalid: expected a TCP port"),
            ("AUTOPAR_MASTER_PORT=0", "AUTOPAR_MASTER_PORT='0' is invalid"),
            ("MASTER_PORT=65535 TORCHELASTIC_USE_AGENT_STORE=True", "MASTER_PORT='65535' is invalid: expected below"),
        ];
        let slurm = "SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 MASTER_ADDR=h";
        let slurm_cases = [
            ("SLURM_NTASKS_PER_NODE=4(x)", "SLURM_NTASKS_PER_NODE='4(x)' is invalid: expected per-node"),
            ("", "SLURM_NTASKS_PER_NODE is not set: neither it nor SLURM_TASKS_PER_NODE"),
            ("SLURM_TASKS_PER_NODE=1,2", "SLURM_NODEID is not set: SLURM_TASKS_PER_NODE='1,2' differs"),
            ("SLURM_TASKS_PER_NODE=1,2 SLURM_NODEID=2", "SLURM_NODEID='2' is invalid: expected below the 2 nodes"),
            ("SLURM_TASKS_PER_NODE=2 SLURM_NTASKS=", "SLURM_NTASKS is not set: srun sets it"),
        ];
        let cases = torchrun_cases.map(|(extra, want)| (TORCHRUN, extra, want)).into_iter();
        for (base, extra, want) in cases.chain(slurm_cases.map(|(extra, want)| (slurm, extra, want))) {
            let message = parse(&format!("{base} {extra}")).expect_err(extra).to_string();
            assert!(message.starts_with(want), "{extra}: got {message}");
        }
    }

    fn local_env(rank: usize, world_size: usize, port: u16) -> LaunchEnv {
        env([rank, world_size, rank, world_size], "127.0.0.1", port)
    }

    /// A loopback port that was free a moment ago.
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    type Outcome = Result<Vec<Vec<u8>>, LaunchError>;

    /// Runs one rendezvous thread per env (rank 0 last, after the others began
    /// retrying) on a free loopback port, retrying if the port got taken.
    fn run_ranks(envs: impl Fn(u16) -> Vec<LaunchEnv>, timeout: Duration) -> Vec<Outcome> {
        for _attempt in 0..3 {
            let mut envs = envs(free_port());
            envs.sort_by_key(|e| e.rank == 0);
            let handles: Vec<_> = envs
                .into_iter()
                .map(|env| {
                    if env.rank == 0 {
                        thread::sleep(Duration::from_millis(200));
                    }
                    let blob = format!("blob{}", env.rank).into_bytes();
                    thread::spawn(move || (env.rank, rendezvous(&env, &blob, timeout)))
                })
                .collect();
            let mut outcomes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            outcomes.sort_by_key(|(rank, _)| *rank);
            if !outcomes
                .iter()
                .any(|(_, o)| matches!(o, Err(LaunchError::Listen { .. })))
            {
                return outcomes.into_iter().map(|(_, o)| o).collect();
            }
        }
        panic!("no free loopback port in 3 attempts");
    }

    #[test]
    fn all_gather_with_rank0_starting_last() {
        let outcomes = run_ranks(
            |port| (0..4).map(|r| local_env(r, 4, port)).collect(),
            Duration::from_secs(5),
        );
        let expected: Vec<Vec<u8>> = (0..4).map(|r| format!("blob{r}").into_bytes()).collect();
        for outcome in outcomes {
            assert_eq!(outcome.unwrap(), expected);
        }
    }

    #[test]
    fn broadcast_sends_rank0s_id_everywhere() {
        let id: Vec<u8> = (0..128u8).collect();
        let port = free_port();
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let root_id = (rank == 0).then(|| id.clone());
                let env = local_env(rank, 3, port);
                thread::spawn(move || broadcast_from_root(&env, root_id.as_deref(), Duration::from_secs(5)))
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap(), id);
        }
        let single = LaunchEnv::single();
        let no_blob = broadcast_from_root(&single, None, Duration::ZERO);
        assert!(matches!(no_blob, Err(LaunchError::NoRootBlob)));
        assert_eq!(
            broadcast_from_root(&single, Some(b"id"), Duration::ZERO).unwrap(),
            b"id"
        );
    }

    #[test]
    fn mismatched_world_size_fails_every_rank_alike() {
        let envs = |port| {
            vec![
                local_env(0, 3, port),
                local_env(1, 3, port),
                local_env(2, 4, port),
            ]
        };
        let outcomes = run_ranks(envs, Duration::from_secs(5));
        let messages: Vec<String> = outcomes.into_iter().map(|o| o.unwrap_err().to_string()).collect();
        let want = "it has world size 4 but rank 0 has 3";
        assert!(
            messages[0].starts_with("rendezvous with rank 2 (127.0.0.1:"),
            "{}",
            messages[0]
        );
        assert!(messages[0].contains(want), "{}", messages[0]);
        assert_eq!(messages[1], format!("{} (reported by rank 0)", messages[0]));
        assert_eq!(messages[1], messages[2]);
    }

    #[test]
    fn missing_rank_times_out_naming_it() {
        let envs = |port| vec![local_env(0, 3, port), local_env(1, 3, port)];
        for outcome in run_ranks(envs, Duration::from_secs(1)) {
            let message = outcome.unwrap_err().to_string();
            let want = "timed out after 1.0s: rank(s) 2 of world size 3 never joined";
            assert!(message.contains(want), "{message}");
        }
    }

    #[test]
    fn unreachable_rank0_is_reported_after_the_timeout() {
        let port = free_port();
        let err = rendezvous(&local_env(1, 2, port), b"x", Duration::from_millis(300)).unwrap_err();
        let want = format!("rank 1 could not reach rank 0 at 127.0.0.1:{port} within 0.3s");
        assert!(err.to_string().starts_with(&want), "{err}");
    }

    #[test]
    fn oversized_frames_are_rejected_before_allocating() {
        let huge = u32::MAX.to_le_bytes();
        let err = read_frame(&mut &huge[..], MAX_FRAME_BYTES, "test")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "rendezvous: frame of 4294967295 bytes from test exceeds the 16777216-byte limit"
        );
        let blob = vec![0u8; MAX_BLOB_BYTES + 1];
        let own = rendezvous(&local_env(1, 2, 1), &blob, Duration::ZERO);
        assert!(matches!(own, Err(LaunchError::FrameTooLarge { len: 65537, .. })));

        // A peer announcing a 4 GiB hello: rank 0 fails and tells the peer why.
        let port = free_port();
        let root = thread::spawn(move || rendezvous(&local_env(0, 2, port), b"root", Duration::from_secs(5)));
        let mut stream = connect(&local_env(1, 2, port), Duration::from_secs(5)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(&huge).unwrap();
        let frame = read_frame(&mut stream, MAX_FRAME_BYTES, "rank 0").unwrap();
        let root_err = root.join().unwrap().unwrap_err();
        assert!(
            matches!(root_err, LaunchError::FrameTooLarge { len: 4294967295, .. }),
            "{root_err}"
        );
        assert_eq!(decode_reply(&frame, "rank 0").unwrap(), Err(root_err.to_string()));
    }

    #[test]
    fn malformed_messages_are_named() {
        let decode_err = |frame: &[u8]| decode_reply(frame, "rank 0").unwrap_err().to_string();
        let stranger = decode_err(b"HTTP/1.1");
        assert_eq!(
            stranger,
            "rendezvous with rank 0: not an autopar rendezvous message"
        );
        let old = [&MAGIC[..], &7u32.to_le_bytes()].concat();
        assert!(decode_err(&old).contains("protocol version 7, expected 1"));
        let truncated = [header(), vec![0, 2, 0, 0, 0]].concat();
        assert!(decode_err(&truncated).contains("message truncated: wanted 4 more bytes, 0 left"));
        let ok = encode_reply(&Ok(vec![b"a".to_vec(), vec![]]));
        assert_eq!(decode_reply(&ok, "p").unwrap(), Ok(vec![b"a".to_vec(), vec![]]));
    }
}

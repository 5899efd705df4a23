//! Ranks in separate processes: a full mesh of TCP connections behind the
//! same [`Endpoint`] as the in-process fabric.
//!
//! One process runs one rank. The processes find each other through the
//! launch [`rendezvous`] (each brings the port it listens on), then every
//! rank connects to each lower rank and accepts the higher ones. Each
//! connection gets a reader thread that files incoming messages into this
//! process's mailboxes, so sends never block on a peer that is busy
//! computing, exactly as in-process sends never block. An abort travels as a
//! message; a connection that ends without a goodbye aborts the fabric,
//! naming the rank whose process went away. Every process also sends a
//! heartbeat on each link while nothing else flows, so a peer that falls
//! silent (a frozen process, an unreachable host) is named within half the
//! fabric's timeout even when no collective waits on it — before any
//! collective's own timeout could blame the rank that waits for it.

use super::buffer::Element;
use super::fabric::Shared;
use super::pool::Pool;
use super::{Buffer, Endpoint};
use crate::launch::rendezvous::{rendezvous, RendezvousError};
use crate::launch::LaunchEnv;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"APFB";
const PROTOCOL_VERSION: u32 = 2;
/// Longest tag a peer may send (tags name a collective and a step).
const MAX_TAG_BYTES: usize = 64 * 1024;
const ACCEPT_POLL: Duration = Duration::from_millis(5);
const CONNECT_RETRY: Duration = Duration::from_millis(20);

/// Frame kinds on a link.
const MESSAGE: u8 = 0;
const ABORT: u8 = 1;
const GOODBYE: u8 = 2;
const HEARTBEAT: u8 = 3;

/// How long a peer may send nothing before it is declared silent, out of
/// the fabric's timeout: half, so the silent rank is named before a
/// collective waiting on a rank that waits on it times out.
const SILENCE_OF_TIMEOUT: u32 = 2;
/// Heartbeats per silence limit (several, so one late beat is no failure).
const BEATS_PER_SILENCE: u32 = 4;

/// Element types of a message's buffer.
const F32: u8 = 0;
const F64: u8 = 1;

/// Why the mesh could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    #[error("rank {rank}: {what}: {source}")]
    Io {
        rank: usize,
        what: String,
        source: io::Error,
    },
    #[error("rank {rank}: connecting the ranks: {detail}")]
    Protocol { rank: usize, detail: String },
    #[error("rank {rank}: rank(s) {missing:?} did not connect within {:.1} s", waited.as_secs_f64())]
    Timeout {
        rank: usize,
        missing: Vec<usize>,
        waited: Duration,
    },
}

/// Joins the job `env` describes and returns this process's endpoint, rank
/// `env.rank` of `env.world_size`. Rank 0 must be reachable at MASTER_ADDR;
/// `wait` bounds the rendezvous and the connections (processes start at
/// different times), `timeout` is the fabric's deadlock timeout afterwards.
pub fn connect(env: &LaunchEnv, wait: Duration, timeout: Duration) -> Result<Endpoint, MeshError> {
    let rank = env.rank;
    let io = |what: &str| {
        let what = what.to_string();
        move |source| MeshError::Io { rank, what, source }
    };
    let listener = TcpListener::bind(("0.0.0.0", 0)).map_err(io("listening for peers"))?;
    let port = listener.local_addr().map_err(io("listening for peers"))?.port();
    let joined = rendezvous(env, &port.to_le_bytes(), wait)?;
    let deadline = Instant::now() + wait;
    let mut streams: Vec<Option<TcpStream>> = (0..env.world_size).map(|_| None).collect();
    for (peer, entry) in joined.iter().enumerate().take(rank) {
        let port = <[u8; 2]>::try_from(entry.blob.as_slice())
            .map(u16::from_le_bytes)
            .map_err(|_| MeshError::Protocol {
                rank,
                detail: format!("rank {peer} announced no port"),
            })?;
        let mut stream = dial(&entry.host, port, deadline)
            .map_err(io(&format!("connecting to rank {peer} at {}:{port}", entry.host)))?;
        stream
            .write_all(&hello(rank, env.world_size))
            .map_err(io(&format!("greeting rank {peer}")))?;
        streams[peer] = Some(stream);
    }
    accept_higher(&listener, env, deadline, wait, &mut streams)?;
    let mut links = Vec::with_capacity(env.world_size);
    let mut readers = Vec::new();
    for (peer, stream) in streams.into_iter().enumerate() {
        let Some(stream) = stream else {
            links.push(None);
            continue;
        };
        let what = format!("setting up the connection to rank {peer}");
        stream.set_nodelay(true).map_err(io(&what))?;
        stream
            .set_read_timeout(Some(timeout / SILENCE_OF_TIMEOUT))
            .map_err(io(&what))?;
        stream.set_write_timeout(Some(timeout)).map_err(io(&what))?;
        let reading = stream.try_clone().map_err(io(&what))?;
        let link = Link::new(peer, stream).map_err(io(&what))?;
        readers.push((peer, reading, link.state.clone()));
        links.push(Some(link));
    }
    let pool = Arc::<Pool>::default();
    let shared = Shared::new(links, Arc::clone(&pool), timeout);
    let silence = timeout / SILENCE_OF_TIMEOUT;
    for (peer, stream, state) in readers {
        let shared = Arc::downgrade(&shared);
        let pool = Arc::clone(&pool);
        std::thread::Builder::new()
            .name(format!("rank {rank} ← rank {peer}"))
            .spawn(move || read_loop(stream, peer, rank, &shared, &pool, &state, silence))
            .map_err(io("starting a reader thread"))?;
    }
    let beating = Arc::downgrade(&shared);
    std::thread::Builder::new()
        .name(format!("rank {rank} heartbeat"))
        .spawn(move || heartbeat(&beating, silence / BEATS_PER_SILENCE))
        .map_err(io("starting the heartbeat thread"))?;
    Ok(Endpoint::on(rank, shared))
}

/// Sends a heartbeat on every link each `interval` until the fabric is
/// gone. A link whose writer is busy (a message on its way) is skipped:
/// that message is the peer's sign of life, and a write blocked on a
/// frozen peer must not hold up the beats to the others.
fn heartbeat(shared: &Weak<Shared>, interval: Duration) {
    loop {
        std::thread::sleep(interval);
        let Some(shared) = shared.upgrade() else { return };
        for link in shared.links() {
            if !link.state.closing.load(Ordering::SeqCst) {
                link.beat();
            }
        }
    }
}

/// Connects to `host:port` (each address it resolves to in turn: a name
/// such as `localhost` may resolve to IPv6 first, while peers listen on
/// IPv4), retrying until `deadline`; the peer's listener exists before the
/// rendezvous ends, so retries cover only transient errors.
fn dial(host: &str, port: u16, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let attempt = (host, port).to_socket_addrs().and_then(|addrs| {
            let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
            for addr in addrs {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                    Ok(stream) => return Ok(stream),
                    Err(e) => last = e,
                }
            }
            Err(last)
        });
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(CONNECT_RETRY),
        }
    }
}

/// The greeting a rank sends to each lower rank it connects to.
fn hello(rank: usize, world: usize) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for v in [PROTOCOL_VERSION, rank as u32, world as u32] {
        out.extend(v.to_le_bytes());
    }
    out
}

/// Accepts one connection from every higher rank, checking its greeting.
fn accept_higher(
    listener: &TcpListener,
    env: &LaunchEnv,
    deadline: Instant,
    wait: Duration,
    streams: &mut [Option<TcpStream>],
) -> Result<(), MeshError> {
    let rank = env.rank;
    let protocol = |detail: String| MeshError::Protocol { rank, detail };
    let io = |source| MeshError::Io {
        rank,
        what: "accepting peers".into(),
        source,
    };
    listener.set_nonblocking(true).map_err(io)?;
    let expected = env.world_size - rank - 1;
    let mut accepted = 0;
    while accepted < expected {
        match listener.accept() {
            Ok((mut stream, from)) => {
                stream.set_nonblocking(false).map_err(io)?;
                stream
                    .set_read_timeout(Some(
                        deadline
                            .saturating_duration_since(Instant::now())
                            .max(ACCEPT_POLL),
                    ))
                    .map_err(io)?;
                let mut greeting = [0u8; 16];
                stream
                    .read_exact(&mut greeting)
                    .map_err(|e| protocol(format!("{from} sent no greeting: {e}")))?;
                let word =
                    |i: usize| u32::from_le_bytes(greeting[i..i + 4].try_into().expect("4 bytes")) as usize;
                if greeting[..4] != MAGIC || word(4) != PROTOCOL_VERSION as usize {
                    return Err(protocol(format!(
                        "{from} is not an autopar rank of this build (bad greeting)"
                    )));
                }
                let (peer, world) = (word(8), word(12));
                if world != env.world_size {
                    return Err(protocol(format!(
                        "rank {peer} ({from}) has world size {world}, this rank {}",
                        env.world_size
                    )));
                }
                match streams.get_mut(peer) {
                    Some(slot @ None) if peer > rank => *slot = Some(stream),
                    _ => {
                        return Err(protocol(format!(
                            "{from} claims rank {peer}, which must be a distinct rank above {rank}"
                        )))
                    }
                }
                accepted += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = (rank + 1..env.world_size)
                        .filter(|&r| streams[r].is_none())
                        .collect();
                    return Err(MeshError::Timeout {
                        rank,
                        missing,
                        waited: wait,
                    });
                }
                std::thread::sleep(ACCEPT_POLL);
            }
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

/// What a link's reader tells its writer: whether the peer has finished
/// (said goodbye, or its connection ended), and whether this side is closing.
#[derive(Default)]
pub(super) struct LinkState {
    finished: Mutex<bool>,
    changed: Condvar,
    closing: AtomicBool,
}

impl LinkState {
    fn finish(&self) {
        *self.finished.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }
}

/// This process's connection to a rank in another process: the writing half
/// (the reader thread owns the other).
pub(super) struct Link {
    peer: usize,
    stream: TcpStream,
    writer: Mutex<BufWriter<TcpStream>>,
    state: Arc<LinkState>,
}

impl Link {
    fn new(peer: usize, stream: TcpStream) -> io::Result<Link> {
        Ok(Link {
            peer,
            writer: Mutex::new(BufWriter::new(stream.try_clone()?)),
            stream,
            state: Arc::default(),
        })
    }

    /// The rank at the other end.
    pub(super) fn peer(&self) -> usize {
        self.peer
    }

    /// Writes one frame: `kind`, then whatever `body` writes.
    fn frame(
        &self,
        kind: u8,
        body: impl FnOnce(&mut BufWriter<TcpStream>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(&[kind])?;
        body(&mut w)?;
        w.flush()
    }

    /// Sends `data` under `tag`.
    pub(super) fn send<T: Element>(&self, tag: &str, data: &[T]) -> io::Result<()> {
        self.frame(MESSAGE, |w| {
            write_bytes(w, tag.as_bytes())?;
            w.write_all(&[dtype_code::<T>()])?;
            write_elements(w, data)
        })
    }

    /// A sign of life, unless a frame is being written now.
    fn beat(&self) {
        if let Ok(mut w) = self.writer.try_lock() {
            let _ = w.write_all(&[HEARTBEAT]).and_then(|()| w.flush());
        }
    }

    /// Tells the peer that rank `by` (this one, or one this process saw
    /// fail) failed, and why.
    pub(super) fn abort(&self, by: usize, reason: &str) -> io::Result<()> {
        self.frame(ABORT, |w| {
            w.write_all(&(by as u32).to_le_bytes())?;
            write_bytes(w, reason.as_bytes())
        })
    }

    /// Tells the peer this side sends nothing more.
    pub(super) fn say_goodbye(&self) -> io::Result<()> {
        self.state.closing.store(true, Ordering::SeqCst);
        self.frame(GOODBYE, |_| Ok(()))
    }

    /// Waits until `deadline` for the peer to finish (its goodbye, or the
    /// end of its connection).
    pub(super) fn await_goodbye(&self, deadline: Instant) -> io::Result<()> {
        let finished = self.state.finished.lock().unwrap_or_else(|e| e.into_inner());
        let left = deadline.saturating_duration_since(Instant::now());
        let (finished, _) = self
            .state
            .changed
            .wait_timeout_while(finished, left, |done| !*done)
            .unwrap_or_else(|e| e.into_inner());
        if *finished {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "rank {} had not finished when this rank gave up waiting",
                    self.peer
                ),
            ))
        }
    }
}

impl Drop for Link {
    /// Ends the connection for both halves, so the reader thread stops and
    /// the peer learns this side is gone.
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The wire code of element type `T`.
fn dtype_code<T: Element>() -> u8 {
    if T::NAME == f64::NAME {
        F64
    } else {
        F32
    }
}

/// Elements per chunk put in wire order at once on either side of a link.
const CHUNK: usize = 1 << 16;

/// Most elements a message's announced length reserves before its data
/// arrives, so a corrupt length fails at the end of the stream instead of
/// allocating it up front.
const MAX_RESERVE: usize = 1 << 24;

/// Writes the element count, then the elements little-endian, a chunk at
/// a time (one write per chunk; on little-endian hosts the copy into wire
/// order is a plain copy).
fn write_elements<T: Element>(w: &mut impl Write, v: &[T]) -> io::Result<()> {
    w.write_all(&(v.len() as u64).to_le_bytes())?;
    let mut wire = Vec::with_capacity(CHUNK.min(v.len()));
    for chunk in v.chunks(CHUNK) {
        wire.clear();
        wire.extend(chunk.iter().map(|&x| x.le_order()));
        w.write_all(bytemuck::cast_slice(&wire))?;
    }
    Ok(())
}

fn write_bytes(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(&(bytes.len() as u32).to_le_bytes())?;
    w.write_all(bytes)
}

/// Files every message from `peer` into rank `me`'s mailbox until the peer
/// says goodbye; an abort from the peer, a connection that ends without a
/// goodbye, or a peer that sends nothing (not even a heartbeat) for
/// `silence`, while this side is not closing, fails the fabric naming it.
fn read_loop(
    stream: TcpStream,
    peer: usize,
    me: usize,
    shared: &Weak<Shared>,
    pool: &Pool,
    state: &LinkState,
    silence: Duration,
) {
    let mut r = BufReader::new(stream);
    loop {
        let frame = read_frame(&mut r, pool);
        let Some(shared) = shared.upgrade() else { break };
        match frame {
            Ok(Frame::Message(tag, data)) => shared.deliver(peer, me, tag, data),
            Ok(Frame::Heartbeat) => {}
            // Passed on before this process can fail and exit: a peer that sees
            // this process's connection end learns the cause first, on the same
            // connection. A rank out of range can only come from a corrupt frame:
            // blame the sender.
            Ok(Frame::Abort(by, reason)) => {
                shared.fail_everywhere(if by < shared.world() { by } else { peer }, &reason)
            }
            Ok(Frame::Goodbye) => break,
            Err(e) => {
                if !state.closing.load(Ordering::SeqCst) {
                    let silent = matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
                    if silent {
                        // Frees a send blocked on the silent peer at once.
                        let _ = r.get_ref().shutdown(Shutdown::Both);
                    }
                    let reason = if silent {
                        format!(
                            "it sent rank {me} nothing, not even a heartbeat, for {:.1} s; is its process stopped or its host unreachable?",
                            silence.as_secs_f64()
                        )
                    } else {
                        format!("its connection to rank {me} ended before the run did ({e}); did its process exit?")
                    };
                    shared.fail_everywhere(peer, &reason);
                }
                break;
            }
        }
    }
    state.finish();
}

enum Frame {
    Message(String, Buffer),
    Heartbeat,
    /// The failed rank and why.
    Abort(usize, String),
    Goodbye,
}

/// Reads one frame; a message's elements go into a vector from `pool`.
fn read_frame(r: &mut impl Read, pool: &Pool) -> io::Result<Frame> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    match read_array::<1>(r)?[0] {
        MESSAGE => {
            let tag = read_string(r)?;
            let dtype = read_array::<1>(r)?[0];
            let len = u64::from_le_bytes(read_array(r)?) as usize;
            let data = match dtype {
                F32 => Buffer::F32(read_elements(r, len, pool)?),
                F64 => Buffer::F64(read_elements(r, len, pool)?),
                other => return Err(bad(format!("unknown element type {other} in '{tag}'"))),
            };
            Ok(Frame::Message(tag, data))
        }
        HEARTBEAT => Ok(Frame::Heartbeat),
        ABORT => {
            let by = u32::from_le_bytes(read_array(r)?) as usize;
            Ok(Frame::Abort(by, read_string(r)?))
        }
        GOODBYE => Ok(Frame::Goodbye),
        other => Err(bad(format!("unknown frame kind {other}"))),
    }
}

fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut out = [0u8; N];
    r.read_exact(&mut out)?;
    Ok(out)
}

fn read_string(r: &mut impl Read) -> io::Result<String> {
    let len = u32::from_le_bytes(read_array(r)?) as usize;
    if len > MAX_TAG_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a {len}-byte tag exceeds {MAX_TAG_BYTES} bytes"),
        ));
    }
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Reads `len` little-endian elements straight into a vector from `pool`,
/// a chunk at a time (reserving at most [`MAX_RESERVE`] before data arrives).
fn read_elements<T: Element>(r: &mut impl Read, len: usize, pool: &Pool) -> io::Result<Vec<T>> {
    let mut out = pool.take::<T>(len.min(MAX_RESERVE));
    while out.len() < len {
        let start = out.len();
        out.resize(start + (len - start).min(CHUNK), bytemuck::Zeroable::zeroed());
        let chunk = &mut out[start..];
        r.read_exact(bytemuck::cast_slice_mut(chunk))?;
        chunk.iter_mut().for_each(|x| *x = x.le_order());
    }
    Ok(out)
}

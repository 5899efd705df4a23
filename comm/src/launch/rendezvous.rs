//! Rendezvous for multi-process runs: a small TCP all-gather through rank 0.
//!
//! Before ranks in separate processes can talk, each must learn where the
//! others listen. Rank 0 serves on MASTER_ADDR:MASTER_PORT; every other rank
//! connects, sends a hello with a small blob (its listening port, or any
//! per-rank fact), and gets back every rank's blob together with the address
//! rank 0 saw it connect from. No external store is needed, and every rank
//! fails with the same message when one of them is wrong.

use super::LaunchEnv;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

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

/// One rank's entry in the rendezvous: the host rank 0 saw it connect from
/// (rank 0's own is MASTER_ADDR) and the blob it brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub host: String,
    pub blob: Vec<u8>,
}

/// Why the rendezvous failed; every variant names the peer or address.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
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

fn protocol(peer: impl Into<String>, detail: impl Into<String>) -> RendezvousError {
    RendezvousError::Protocol {
        peer: peer.into(),
        detail: detail.into(),
    }
}

fn too_large(peer: impl Into<String>, len: usize, max: usize) -> RendezvousError {
    RendezvousError::FrameTooLarge {
        peer: peer.into(),
        len: len as u64,
        max,
    }
}

/// All-gathers one small blob per rank: every rank gets every rank's
/// [`Joined`] entry in rank order.
///
/// Rank 0 listens on MASTER_ADDR:MASTER_PORT; the others connect (retrying
/// until `timeout`, since rank 0 may start later) and send a hello; rank 0
/// checks world sizes and ranks, then answers everyone with the list, or with
/// its error so that all ranks fail alike. A peer waits up to `timeout` for
/// the answer after connecting (half again as long, so that rank 0's
/// verdict wins any race with its own deadline), so a failing run can take
/// up to 2.5 × `timeout`.
/// `world_size == 1` returns at once without sockets.
pub fn rendezvous(env: &LaunchEnv, mine: &[u8], timeout: Duration) -> Result<Vec<Joined>, RendezvousError> {
    if mine.len() > MAX_BLOB_BYTES {
        return Err(too_large(
            format!("rank {} (its own blob)", env.rank),
            mine.len(),
            MAX_BLOB_BYTES,
        ));
    }
    if env.rank >= env.world_size || u32::try_from(env.world_size).is_err() {
        return Err(protocol(
            format!("rank {}", env.rank),
            format!(
                "rank must be below world size {} (at most u32::MAX)",
                env.world_size
            ),
        ));
    }
    match (env.world_size, env.rank) {
        (1, _) => Ok(vec![Joined {
            host: env.master_addr.clone(),
            blob: mine.to_vec(),
        }]),
        (_, 0) => serve(env, mine, timeout),
        _ => join(env, mine, timeout),
    }
}

/// Rank 0: accept one hello per peer until all arrived, an error, or the deadline.
fn serve(env: &LaunchEnv, mine: &[u8], timeout: Duration) -> Result<Vec<Joined>, RendezvousError> {
    let deadline = Instant::now() + timeout;
    let addr = env.endpoint();
    let listener = TcpListener::bind((env.master_addr.as_str(), env.master_port)).map_err(|source| {
        RendezvousError::Listen {
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
    let mut blobs: Vec<Option<Joined>> = vec![None; env.world_size];
    blobs[0] = Some(Joined {
        host: env.master_addr.clone(),
        blob: mine.to_vec(),
    });
    let mut peers = Vec::new();
    let mut failure = None;
    while peers.len() + 1 < env.world_size {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match listener.accept() {
            Ok((mut stream, from)) => {
                if let Err(e) = receive_hello(&mut stream, from, left, env.world_size, &mut blobs) {
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
                Err(RendezvousError::Timeout {
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
    from: SocketAddr,
    left: Duration,
    world: usize,
    blobs: &mut [Option<Joined>],
) -> Result<(), RendezvousError> {
    let host = from.ip().to_string();
    let from = &from.to_string();
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
            *slot = Some(Joined { host, blob });
            Ok(())
        }
        Some(Some(_)) => fail(format!("rank {rank} joined twice; ranks must be distinct")),
        None => fail(format!("rank {rank} is outside world size {world}")),
    }
}

/// Ranks > 0: connect, send the hello, await rank 0's answer.
fn join(env: &LaunchEnv, mine: &[u8], timeout: Duration) -> Result<Vec<Joined>, RendezvousError> {
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
    let list = decode_reply(&frame, &peer)?.map_err(|message| RendezvousError::Remote { message })?;
    if list.len() != env.world_size || list[env.rank].blob != mine {
        return Err(protocol(
            peer,
            format!("answer of {} blobs lacks ours at rank {}", list.len(), env.rank),
        ));
    }
    Ok(list)
}

/// Connects to rank 0, retrying with backoff until `timeout` (it may start later).
fn connect(env: &LaunchEnv, timeout: Duration) -> Result<TcpStream, RendezvousError> {
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
            return Err(RendezvousError::Unreachable {
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
fn io_error(peer: &str, source: io::Error) -> RendezvousError {
    let source = match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, "no answer before the rendezvous timeout")
        }
        _ => source,
    };
    RendezvousError::Io {
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
fn read_frame(r: &mut impl Read, max: usize, peer: &str) -> Result<Vec<u8>, RendezvousError> {
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

/// Rank 0's answer: tag 0 + (host, blob) in rank order, or tag 1 + its error.
fn encode_reply(outcome: &Result<Vec<Joined>, RendezvousError>) -> Vec<u8> {
    let mut out = header();
    match outcome {
        Ok(blobs) => {
            out.push(0);
            out.extend((blobs.len() as u32).to_le_bytes());
            for joined in blobs {
                put_bytes(&mut out, joined.host.as_bytes());
                put_bytes(&mut out, &joined.blob);
            }
        }
        Err(e) => {
            out.push(1);
            put_bytes(&mut out, e.to_string().as_bytes());
        }
    }
    out
}

fn decode_reply(frame: &[u8], peer: &str) -> Result<Result<Vec<Joined>, String>, RendezvousError> {
    let mut d = Decoder::new(frame, peer)?;
    let reply = match d.take(1)?[0] {
        0 => Ok((0..d.u32()?)
            .map(|_| {
                let host = String::from_utf8_lossy(d.bytes()?).into_owned();
                let blob = d.bytes()?.to_vec();
                Ok(Joined { host, blob })
            })
            .collect::<Result<_, RendezvousError>>()?),
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
    fn new(frame: &'a [u8], peer: &'a str) -> Result<Self, RendezvousError> {
        let mut d = Decoder { rest: frame, peer };
        if d.take(4)? != MAGIC {
            return Err(d.error("not an autopar rendezvous message".to_string()));
        }
        match d.u32()? {
            PROTOCOL_VERSION => Ok(d),
            v => Err(d.error(format!("protocol version {v}, expected {PROTOCOL_VERSION}: all ranks must run the same autopar build"))),
        }
    }

    fn error(&self, detail: String) -> RendezvousError {
        protocol(self.peer, detail)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RendezvousError> {
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

    fn u32(&mut self) -> Result<u32, RendezvousError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn bytes(&mut self) -> Result<&'a [u8], RendezvousError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn finish(self) -> Result<(), RendezvousError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(self.error(format!("{n} unexpected trailing bytes"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::free_port;
    use std::thread;

    fn local_env(rank: usize, world_size: usize, port: u16) -> LaunchEnv {
        LaunchEnv::loopback(rank, world_size, port)
    }

    type Outcome = Result<Vec<Joined>, RendezvousError>;

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
                .any(|(_, o)| matches!(o, Err(RendezvousError::Listen { .. })))
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
        let expected: Vec<Joined> = (0..4)
            .map(|r| Joined {
                host: "127.0.0.1".into(),
                blob: format!("blob{r}").into_bytes(),
            })
            .collect();
        for outcome in outcomes {
            assert_eq!(outcome.unwrap(), expected);
        }
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
        assert!(matches!(
            own,
            Err(RendezvousError::FrameTooLarge { len: 65537, .. })
        ));

        // A peer announcing a 4 GiB hello: rank 0 fails and tells the peer why.
        let port = free_port();
        let root = thread::spawn(move || rendezvous(&local_env(0, 2, port), b"root", Duration::from_secs(5)));
        let mut stream = connect(&local_env(1, 2, port), Duration::from_secs(5)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(&huge).unwrap();
        let frame = read_frame(&mut stream, MAX_FRAME_BYTES, "rank 0").unwrap();
        let root_err = root.join().unwrap().unwrap_err();
        assert!(
            matches!(root_err, RendezvousError::FrameTooLarge { len: 4294967295, .. }),
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
        let joined = vec![
            Joined {
                host: "node0".into(),
                blob: b"a".to_vec(),
            },
            Joined {
                host: "10.0.0.2".into(),
                blob: vec![],
            },
        ];
        let ok = encode_reply(&Ok(joined.clone()));
        assert_eq!(decode_reply(&ok, "p").unwrap(), Ok(joined));
    }
}

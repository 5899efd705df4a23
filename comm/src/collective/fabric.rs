//! Mailboxes between ranks: buffered point-to-point messages matched by
//! (source, tag), with byte counting, timeouts and a fabric-wide abort.
//! Ranks in this process share the mailboxes directly; a rank in another
//! process is reached over a [`Link`](super::tcp::Link), whose reader thread
//! fills the same mailboxes, so collectives cannot tell the two apart.

use super::buffer::{with_elements, Element};
use super::pool::Pool;
use super::tcp::Link;
use super::{Buffer, CommError, LayoutMismatch};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Messages waiting for one destination rank, by (source rank, tag).
type Inbox = HashMap<(usize, String), VecDeque<Buffer>>;

/// One rank's mailbox; its condition variable wakes the owner on arrival
/// or abort.
#[derive(Default)]
struct Mailbox {
    inbox: Mutex<Inbox>,
    arrived: Condvar,
}

/// State every endpoint of one fabric in this process shares.
pub(super) struct Shared {
    mailboxes: Vec<Mailbox>,
    /// By rank: the connection to a rank in another process; `None` for
    /// ranks in this one.
    links: Vec<Option<Link>>,
    /// Message vectors for reuse (the link readers hold it too).
    pool: Arc<Pool>,
    sent: Vec<AtomicU64>,
    timeout: Duration,
    aborted: AtomicBool,
    /// Whether the other processes were told of a failure seen here.
    told: AtomicBool,
    /// Who aborted first, and why (set before `aborted`).
    abort_cause: Mutex<Option<(usize, String)>>,
}

/// Creates the endpoints of `world` ranks that talk through shared
/// mailboxes; endpoint `i` is rank `i`. A wait for a message gives up with
/// [`CommError::Timeout`] after `timeout`, so a dead or deadlocked rank
/// turns into an error instead of a hang.
pub fn fabric(world: usize, timeout: Duration) -> Vec<Endpoint> {
    let shared = Shared::new((0..world).map(|_| None).collect(), Arc::default(), timeout);
    (0..world)
        .map(|rank| Endpoint {
            rank,
            shared: Arc::clone(&shared),
        })
        .collect()
}

impl Shared {
    /// A fabric of `links.len()` ranks; ranks without a link live here.
    pub(super) fn new(links: Vec<Option<Link>>, pool: Arc<Pool>, timeout: Duration) -> Arc<Shared> {
        let world = links.len();
        Arc::new(Shared {
            mailboxes: (0..world).map(|_| Mailbox::default()).collect(),
            links,
            pool,
            sent: (0..world).map(|_| AtomicU64::new(0)).collect(),
            timeout,
            aborted: AtomicBool::new(false),
            told: AtomicBool::new(false),
            abort_cause: Mutex::new(None),
        })
    }

    /// Queues `data` from rank `from` under `tag` for rank `to` and wakes it.
    pub(super) fn deliver(&self, from: usize, to: usize, tag: String, data: Buffer) {
        let mailbox = &self.mailboxes[to];
        lock(&mailbox.inbox)
            .entry((from, tag))
            .or_default()
            .push_back(data);
        mailbox.arrived.notify_all();
    }

    /// Fails every wait in this process: rank `by` failed because of `reason`
    /// (the first cause recorded is the one reported).
    pub(super) fn fail(&self, by: usize, reason: &str) {
        {
            let mut cause = lock(&self.abort_cause);
            if cause.is_none() {
                *cause = Some((by, reason.to_string()));
            }
        }
        self.aborted.store(true, Ordering::SeqCst);
        for mailbox in &self.mailboxes {
            let _inbox = lock(&mailbox.inbox);
            mailbox.arrived.notify_all();
        }
    }

    /// [`Shared::fail`], and, the first time, tells every other process too
    /// (as a peer would not learn who failed from a connection that ends).
    pub(super) fn fail_everywhere(&self, by: usize, reason: &str) {
        // The others are told first: once this process fails its own waits
        // it may exit, and a connection that ends names only this process.
        if !self.aborted.load(Ordering::SeqCst) && !self.told.swap(true, Ordering::SeqCst) {
            // Best effort: a peer whose connection is gone notices on its own.
            for link in self.links().filter(|l| l.peer() != by) {
                let _ = link.abort(by, reason);
            }
        }
        self.fail(by, reason);
    }

    /// Ranks in the fabric.
    pub(super) fn world(&self) -> usize {
        self.mailboxes.len()
    }

    /// The links to ranks in other processes.
    pub(super) fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.iter().flatten()
    }
}

/// Locks a mutex, ignoring poisoning: a rank thread that panicked while
/// holding it leaves the mailbox data intact (pushes and pops are atomic
/// with respect to the guard), and the other ranks must still be able to
/// report errors rather than panic in turn.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One rank's handle on the fabric; moved into that rank's thread (clones
/// share it, for the driver's bookkeeping beside the rank's own traffic).
#[derive(Clone)]
pub struct Endpoint {
    rank: usize,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("rank", &self.rank)
            .field("world", &self.world())
            .field("bytes_sent", &self.bytes_sent())
            .finish()
    }
}

impl Endpoint {
    /// Rank `rank`'s endpoint on `shared` (for fabrics built elsewhere).
    pub(super) fn on(rank: usize, shared: Arc<Shared>) -> Endpoint {
        Endpoint { rank, shared }
    }

    /// This endpoint's global rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks on the fabric.
    pub fn world(&self) -> usize {
        self.shared.mailboxes.len()
    }

    /// Total bytes this rank has sent so far (elements × element size), to
    /// compare a run with the communication model.
    pub fn bytes_sent(&self) -> u64 {
        self.shared.sent[self.rank].load(Ordering::Relaxed)
    }

    /// Sends `data` to rank `to` under `tag`. Buffered: it never blocks, so
    /// collectives can send before they receive without deadlocking. Fails
    /// once the fabric is aborted.
    pub fn send(&self, to: usize, tag: &str, data: Buffer, what: &str) -> Result<(), CommError> {
        let bytes = data.byte_len();
        self.post(to, tag, data, what)?;
        self.shared.sent[self.rank].fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Sends bookkeeping that is not part of the plan's traffic (a step's
    /// loss, a rank's totals to rank 0): like [`Endpoint::send`], but not
    /// counted in [`Endpoint::bytes_sent`].
    pub fn notify(&self, to: usize, tag: &str, data: Buffer, what: &str) -> Result<(), CommError> {
        self.post(to, tag, data, what)
    }

    /// Sends a copy of `data` to rank `to` under `tag`, counted like
    /// [`Endpoint::send`]: written straight from the slice to a link, or
    /// copied into a reused vector for a rank in this process.
    pub(super) fn send_slice<T: Element>(
        &self,
        to: usize,
        tag: &str,
        data: &[T],
        what: &str,
    ) -> Result<(), CommError> {
        match self.route(to, what)? {
            Some(link) => link.send(tag, data).map_err(|e| self.link_failed(to, what, e))?,
            None => {
                let copy = T::wrap(self.shared.pool.copy_of(data));
                self.shared.deliver(self.rank, to, tag.to_string(), copy);
            }
        }
        let bytes = std::mem::size_of_val(data) as u64;
        self.shared.sent[self.rank].fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn post(&self, to: usize, tag: &str, data: Buffer, what: &str) -> Result<(), CommError> {
        match self.route(to, what)? {
            Some(link) => {
                with_elements!(&data, v => link.send(tag, v)).map_err(|e| self.link_failed(to, what, e))?;
                self.shared.pool.give(data);
            }
            None => self.shared.deliver(self.rank, to, tag.to_string(), data),
        }
        Ok(())
    }

    /// The link to rank `to`, or `None` when it lives in this process;
    /// fails for a rank outside the fabric or once the fabric is aborted.
    fn route(&self, to: usize, what: &str) -> Result<Option<&Link>, CommError> {
        let Some(route) = self.shared.links.get(to) else {
            return Err(CommError::NoSuchRank {
                rank: self.rank,
                what: what.to_string(),
                peer: to,
                world: self.world(),
            });
        };
        self.check_abort(what)?;
        Ok(route.as_ref())
    }

    fn link_failed(&self, peer: usize, what: &str, e: std::io::Error) -> CommError {
        CommError::Link {
            rank: self.rank,
            peer,
            what: what.to_string(),
            message: e.to_string(),
        }
    }

    /// Waits for the next message from rank `from` with exactly this `tag`
    /// (messages under other tags stay queued). Gives up with
    /// [`CommError::Timeout`] after the fabric's timeout, or with
    /// [`CommError::Aborted`] as soon as any rank aborts.
    pub fn recv(&self, from: usize, tag: &str, what: &str) -> Result<Buffer, CommError> {
        if from >= self.world() {
            return Err(CommError::NoSuchRank {
                rank: self.rank,
                what: what.to_string(),
                peer: from,
                world: self.world(),
            });
        }
        let mailbox = &self.shared.mailboxes[self.rank];
        let key = (from, tag.to_string());
        let deadline = Instant::now() + self.shared.timeout;
        let mut inbox = lock(&mailbox.inbox);
        loop {
            // Checked under the mailbox lock; `abort` notifies under the same
            // lock, so a wake-up cannot slip between this check and the wait.
            self.check_abort(what)?;
            if let Some(queue) = inbox.get_mut(&key) {
                if let Some(data) = queue.pop_front() {
                    if queue.is_empty() {
                        inbox.remove(&key);
                    }
                    return Ok(data);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    peer: from,
                    what: what.to_string(),
                    waited_s: self.shared.timeout.as_secs_f64(),
                });
            }
            inbox = mailbox
                .arrived
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Receives like [`Endpoint::recv`] and checks that the message holds
    /// `len` elements of type `T`: a mismatch means the ranks disagree about
    /// the instruction.
    pub(super) fn recv_elements<T: Element>(
        &self,
        from: usize,
        tag: &str,
        len: usize,
        what: &str,
    ) -> Result<Vec<T>, CommError> {
        let got = match T::unwrap(self.recv(from, tag, what)?) {
            Ok(v) if v.len() == len => return Ok(v),
            Ok(v) => T::wrap(v),
            Err(other) => other,
        };
        Err(CommError::Mismatch {
            rank: self.rank,
            what: what.to_string(),
            peer: from,
            mismatch: LayoutMismatch {
                expected: format!("{}[{len}]", T::NAME),
                got: got.to_string(),
            },
        })
    }

    /// Returns a received vector this rank is done with, for reuse.
    pub(super) fn recycle<T: Element>(&self, v: Vec<T>) {
        self.shared.pool.give(T::wrap(v));
    }

    /// Marks the whole fabric failed (a rank hit an error it cannot recover
    /// from): every rank's pending or future wait and send returns
    /// [`CommError::Aborted`] at once, naming this rank and `reason`, instead
    /// of timing out. The first abort's cause is the one reported.
    pub fn abort(&self, reason: &str) {
        self.shared.fail_everywhere(self.rank, reason);
    }

    /// The rank that aborted the fabric and why, once any has (this process's
    /// ranks, or a peer process whose link reported it or went away).
    pub fn abort_cause(&self) -> Option<(usize, String)> {
        if !self.shared.aborted.load(Ordering::SeqCst) {
            return None;
        }
        Some(lock(&self.shared.abort_cause).clone().unwrap_or_default())
    }

    /// Ends this process's part in a fabric spanning processes: tells every
    /// peer it is done, then waits (up to `patience`: peers may still be
    /// finishing their last step) until each peer has said the same, so no
    /// message in flight is lost when the process exits. Every rank calls it
    /// once it sent its last message; for an in-process fabric it does
    /// nothing.
    pub fn close(&self, patience: Duration) -> Result<(), CommError> {
        let failed = |link: &Link, e| self.link_failed(link.peer(), "closing the fabric", e);
        for link in self.shared.links() {
            link.say_goodbye().map_err(|e| failed(link, e))?;
        }
        let deadline = Instant::now() + patience;
        for link in self.shared.links() {
            link.await_goodbye(deadline).map_err(|e| failed(link, e))?;
        }
        // A peer that failed after this rank's last message still fails the run.
        self.check_abort("closing the fabric")
    }

    /// `Err(Aborted)` once any rank has aborted the fabric.
    fn check_abort(&self, what: &str) -> Result<(), CommError> {
        if !self.shared.aborted.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (by, reason) = lock(&self.shared.abort_cause).clone().unwrap_or_default();
        Err(CommError::Aborted {
            rank: self.rank,
            by,
            reason,
            what: what.to_string(),
        })
    }
}

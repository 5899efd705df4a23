//! A thread that acts when the fabric is aborted. Work that waits outside
//! the fabric — an NCCL call holding a GPU stream until its peers join —
//! never sees an abort by itself; when a rank fails or its process dies,
//! the watchdog hands the cause to a callback that cancels that work (for
//! NCCL: aborting the communicators, which fails the calls in flight), so
//! the surviving ranks report the failure instead of hanging.

use super::Endpoint;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watchdog looks at the fabric.
const POLL: Duration = Duration::from_millis(50);

/// Runs `on_abort` once, on its own thread, if the fabric is aborted
/// before the watchdog is dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Watches `endpoint`'s fabric; `on_abort` gets the failed rank and why.
    pub fn spawn(endpoint: Endpoint, on_abort: impl FnOnce(usize, String) + Send + 'static) -> Watchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                if let Some((by, reason)) = endpoint.abort_cause() {
                    on_abort(by, reason);
                    return;
                }
                std::thread::sleep(POLL);
            }
        });
        Watchdog {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    /// Stops watching (within one poll).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::fabric;
    use std::sync::mpsc;
    use std::time::Instant;

    #[test]
    fn an_abort_reaches_the_callback_with_its_cause() {
        let mut eps = fabric(2, Duration::from_secs(5));
        let (tx, rx) = mpsc::channel();
        let _dog = Watchdog::spawn(eps.remove(1), move |by, why| tx.send((by, why)).unwrap());
        let started = Instant::now();
        eps[0].abort("kernel failed on node 7");
        let got = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(got, (0, "kernel failed on node 7".to_string()));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_dropped_watchdog_never_calls_back() {
        let eps = fabric(1, Duration::from_secs(5));
        let (tx, rx) = mpsc::channel::<()>();
        let dog = Watchdog::spawn(eps[0].clone(), move |_, _| tx.send(()).unwrap());
        drop(dog);
        eps[0].abort("after the run");
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    }
}

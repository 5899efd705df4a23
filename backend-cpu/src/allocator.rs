//! The allocator CPU runs are made with: mimalloc (what the `autopar`
//! binary and the benches install as the global allocator), told to keep
//! the memory a step frees for the next step.
//!
//! A step allocates every activation and gradient afresh, and by default
//! mimalloc returns freed memory to the system 10 ms later, so the next
//! step's buffers fault their pages in again. On a virtual machine that is
//! dear: a fresh 16 MiB buffer took 24 ms to touch against 6 ms reused,
//! and the 16.9M-parameter zoo GPT's step ran 6-7 % faster with the memory
//! kept (three alternating pairs of runs on a 2-core VM). A run's memory
//! stays at its step's peak, which it reaches every step anyway.

pub use mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc's `mimalloc.h` (the same in its v2
/// and v3): milliseconds before freed memory goes back to the system, -1
/// for never.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps the memory this process frees for its own later allocations
/// instead of returning it to the system. Call first thing in `main`.
pub fn keep_freed_memory() {
    // SAFETY: sets one of mimalloc's process-wide options, which it reads
    // atomically; no memory is touched.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) }
}

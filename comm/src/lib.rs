//! Communication between ranks: the collectives (`collective`: ring,
//! pairwise and parameter-server algorithms over in-process mailboxes or
//! TCP, with byte counts and a deadlock watchdog) and multi-process launch
//! (`launch`: the launcher's environment and the rendezvous through rank 0).
//!
//! Architecture invariant: nothing here knows a model, an op, a program or
//! a device; it moves buffers of elements between ranks.

pub mod collective;
pub mod launch;

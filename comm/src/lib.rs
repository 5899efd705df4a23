//! Communication between ranks: the collectives (`collective`: ring,
//! pairwise and parameter-server algorithms over in-process mailboxes or
//! TCP, with byte counts and a deadlock watchdog) and multi-process launch
//! (`launch`: the launcher's environment and the rendezvous through rank 0).
//!
//! Architecture invariant: nothing here knows a model, an op or a device;
//! it moves buffers of elements between ranks and reads only the `Shard`
//! coordinates of lowered programs to cut and reassemble values.

pub mod collective;
pub mod launch;

//! The optional event trace: alloc, free, move and failed-alloc events in bounded per-core
//! rings, off by default, drained by a monitor.
//!
//! # Cost
//!
//! Off (the default), a hook on the alloc/free path is one relaxed load of a flag. On, an event
//! costs a clock read, one `fetch_add` on the ring of the caller's core (threads on the same core
//! share it), one CAS on the slot and eight plain stores: no lock, no wait, no allocation.
//!
//! # Switching the trace
//!
//! `trace_start` and `trace_stop` pause the pool (the stop gate): no alloc or free is in flight
//! while the rings are replaced or the flag flips, so a ring is never freed under a writer, and
//! after `trace_stop` returns no further event is recorded. Draining does not pause.

pub(crate) mod clock;
pub(crate) mod event;
#[cfg(not(loom))]
pub(crate) mod recorder;
pub(crate) mod ring;

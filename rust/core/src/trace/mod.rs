//! The optional event trace: alloc, free, move and failed-alloc events in bounded rings, off by
//! default, drained by a monitor.
//!
//! # Cost
//!
//! Off (the default), a hook on the alloc/free path is one relaxed load of a flag. On, an event
//! costs a read of the time-stamp counter (or of the monotonic clock where the counter is not
//! trusted), one thread-local load that finds the calling thread's own ring, and eight plain
//! stores: no atomic read-modify-write, no lock, no wait, no allocation. Each thread that
//! records claims a single-writer ring of its own on its first event (`trace/rings.rs`); threads
//! beyond the number of rings share one multi-writer ring, at the cost of three uncontended
//! read-modify-writes per event.
//!
//! # Order
//!
//! A drain merges the rings by time (`trace/merge.rs`). Events of one thread keep their order,
//! and a block's free and moves come after its alloc, whatever the times say: the counter read
//! (`rdtsc`) does not wait for the loads before it, so events of two threads a few tens of
//! nanoseconds apart may carry times in the wrong order. Times are made non-decreasing.
//!
//! # Switching the trace
//!
//! `trace_start` and `trace_stop` pause the pool (the stop gate): no alloc or free is in flight
//! while the rings are replaced or the flag flips, so a ring is never freed under a writer, and
//! after `trace_stop` returns no further event is recorded. Draining does not pause.

pub(crate) mod clock;
pub(crate) mod event;
#[cfg(not(loom))]
pub(crate) mod merge;
#[cfg(not(loom))]
pub(crate) mod recorder;
pub(crate) mod ring;
#[cfg(not(loom))]
pub(crate) mod rings;
pub(crate) mod slot;
pub(crate) mod solo;

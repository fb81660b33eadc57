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
//! An allocation reads the time after it placed its block, and a free before its block's bytes
//! go back (the event is recorded after), so a thread that takes those bytes again records a
//! later time than the free, however long the freeing thread waits in between (preempted, on
//! a machine with more threads than CPUs). A drain orders the shared ring's events by time
//! (they are in the order their threads took its slots) and merges the rings by time
//! (`trace/merge.rs`). Events of one thread keep their order, and a block's free and moves come
//! after its alloc, whatever the times say: the counter read (`rdtsc`) does not wait for the
//! loads before it, so events of two threads a few tens of nanoseconds apart may carry times in
//! the wrong order. Times are made non-decreasing. An event still being written at a drain
//! comes with the next one, with its own time: a reader puts the drains together by time
//! (`TraceRecorder` does).
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

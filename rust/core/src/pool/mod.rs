//! The pool: composes the arena, the handles, the stop gate, the statistics and the trace, and
//! is the public API. `pool.rs` holds the struct and the public calls; the allocation path is
//! `alloc.rs`, frees `free.rs`, pauses and pins `pause.rs`, the statistics snapshot `stats.rs` (its largest free block `largest_free.rs`),
//! the arena snapshot `snapshot.rs`, `check()` `check.rs`, the trace API `tracing.rs`, tags and
//! their counters `tags.rs`, growth and giving regions back `growth.rs`, its hooks `region_hooks.rs`;
//! `host_faults.rs` tests every host allocation's failure.

pub(crate) mod alloc;
pub(crate) mod check;
pub(crate) mod free;
pub(crate) mod growth;
#[cfg(all(test, not(loom)))]
mod host_faults;
pub(crate) mod largest_free;
pub(crate) mod pause;
#[allow(clippy::module_inception)]
pub(crate) mod pool;
pub(crate) mod region_hooks;
pub(crate) mod snapshot;
pub(crate) mod stats;
pub(crate) mod tags;
pub(crate) mod tracing;

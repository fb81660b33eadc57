//! Statistics: the per-core counters of the buddy and run paths (`counters.rs`), the per-thread
//! counters of the slab fast path (`thread.rs`), the tag names and the counters by tag
//! (`tags.rs`, updated by the callers of the core, not by its allocation path), and the [`PoolStats`] snapshot they are summed
//! into (`summary.rs`, its fields generated from one list).

pub(crate) mod counters;
pub(crate) mod summary;
pub(crate) mod tags;
#[cfg(not(loom))]
pub(crate) mod thread;

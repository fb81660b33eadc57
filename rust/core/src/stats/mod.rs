//! Statistics: the per-core counters of the buddy and run paths (`counters.rs`), the per-thread
//! counters of the slab fast path (`thread.rs`), and the [`PoolStats`] snapshot they are summed
//! into (`summary.rs`, its fields generated from one list).

pub(crate) mod counters;
pub(crate) mod summary;
#[cfg(not(loom))]
pub(crate) mod thread;

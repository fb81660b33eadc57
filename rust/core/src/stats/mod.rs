//! Statistics: the pool's counters and their peak estimates (`counters.rs`), kept in per-thread
//! blocks (`thread.rs`), the tag names and the counters by tag (`tags.rs`, updated by the
//! callers of the core, not by its allocation path), and the [`PoolStats`] snapshot they are
//! summed into (`summary.rs`, its fields generated from one list).

pub(crate) mod counters;
pub(crate) mod summary;
pub(crate) mod tags;
pub(crate) mod thread;

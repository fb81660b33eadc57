//! Slab caches: per-core caches of small size classes (`caches.rs`), and the operations at exact
//! positions that compaction uses on a paused pool (`exact.rs`).

pub(crate) mod caches;
pub(crate) mod exact;

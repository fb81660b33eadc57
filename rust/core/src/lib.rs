//! # npumem-core
//!
//! The allocator of npumem: it hands out pieces of one large memory region (an *arena*, often
//! device memory) to many threads at once, lock-free, never overlapping, with little waste.
//! Pure Rust, no Python; the `npumem-python` crate is a thin binding over it.
//!
//! ## Glossary of the core types
//!
//! | type | file | what it is |
//! |---|---|---|
//! | [`PoolConfig`] | `config.rs` | validated configuration: capacity, cores, chunk size, min block, bank size, alignment, slab sizes, backing |
//! | `TreeShape`, `Node` | `buddy.rs` | the lock-free buddy tree over one chunk; a node is a power-of-two block of it |
//! | `GlobalPool` | `global.rs` | the whole arena in chunk units: grants chunks to cores, serves large blocks as exact chunk runs |
//! | `CorePool` | `core_pool.rs` | one per core: the chunks it owns and its search hints |
//! | `ChunkSpace` | `chunk_space.rs` | a chunk's free units and free epoch in one word, and the memo of searches that failed there |
//! | `Layout`, `BuddyLayout` | `layout.rs` | how a request of `n` bytes maps onto buddy nodes (at the start of its power-of-two node, or *packed* anywhere the bank rule allows by a compaction) or a chunk run |
//! | [`Handle`] | `handle.rs` | a slot index plus a generation: a block reference that survives moves and detects reuse |
//! | `Gate` | `gate.rs` | the stop gate: pauses alloc/free for compaction and `check()` |
//! | [`PauseToken`], [`Move`], [`CompactionMode`] | `relocate/` | compaction: held pauses, validated batches of moves, the planners (packing below a boundary, repack or slide, sparsest-first evacuation, slab packing) |
//! | `Model`, `Gaps` | `relocate/model.rs` | the planners' picture of the arena: a bit per unit of each chunk, and its free stretches by length |
//! | [`PoolStats`] | `stats.rs` | per-core counters on their own cache lines, summed into a snapshot |
//! | `Clock` | `clock.rs` | the trace's clock: `Instant`, or the time-stamp counter scaled to it |
//! | [`TraceEvent`], `Ring` | `trace.rs` | the optional event trace: bounded per-core rings of alloc/free/move/failed events |
//! | [`Snapshot`] | `snapshot.rs` | the arena at one moment: live blocks, maximal free runs, stats |
//! | `HostBacking` | `backing.rs` | the optional host memory behind the arena |
//! | `SlabCaches` | `slab.rs` | per-core slab caches of small size classes: one CAS to allocate, one `fetch_or` to free |
//! | `ThreadStats` | `thread_stats.rs` | per-thread counters of the slab fast path |
//! | [`Pool`] | `pool.rs` | the public API; the allocation path is in `placement.rs`, frees in `release.rs`, the snapshot in `statistics.rs`, `check()` in `check.rs` |
//! | [`packing`] | `packing/` | the planner's inner loop: branch and bound over static offsets (driven by `npumem.plan`) |
//!
//! Names ending in `_raw` work on offsets; everything else on [`Handle`]s.

#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod backing;
mod bits;
mod buddy;
#[cfg(not(loom))]
mod check;
mod chunk_space;
mod clock;
mod config;
mod core_pool;
mod cpu;
mod error;
mod gate;
mod global;
mod handle;
mod index_stack;
pub mod kv;
mod layout;
pub mod packing;
#[cfg(not(loom))]
mod placement;
#[cfg(not(loom))]
mod pool;
#[cfg(not(loom))]
mod release;
#[cfg(not(loom))]
mod relocate; // compaction (issue 5): held pauses, batches of moves, compaction planners
mod segments;
mod slab;
#[cfg(not(loom))]
mod snapshot;
#[cfg(not(loom))]
mod statistics;
mod stats;
mod sync;
#[cfg(not(loom))]
mod thread_stats;
mod trace;
mod zeroed;

pub use config::{Backing, Placement, PoolConfig, MAX_CAPACITY, MAX_CORES};
pub use error::{Error, HandleFault, Result};
pub use handle::Handle;
#[cfg(not(loom))]
pub use pool::{BlockInfo, Pool};
#[cfg(not(loom))]
pub use relocate::{
    CompactionMode, CompactionPlan, Move, MovedBlocks, Mover, PauseToken, PlannedMove, StepReport, Transfer,
};
#[cfg(not(loom))]
pub use snapshot::{Extent, Snapshot};
pub use stats::{ClassStats, CoreStats, PoolStats};
pub use trace::{EventKind, TraceEvent};
#[cfg(not(loom))]
pub use trace::{TraceStatus, MAX_TRACE_CAPACITY};

/// The crate version.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

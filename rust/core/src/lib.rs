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
//! | [`PoolConfig`] | `config.rs` | validated configuration: capacity, cores, chunk size, min block, bank size, alignment, slab sizes, backing, base address, device |
//! | [`Device`] | `device.rs` | where the memory lives, as DLPack names devices (a type code and an index) |
//! | [`Error`] | `error.rs` | the one error type: what was wrong and what was expected |
//! | `Arena` | `arena/arena.rs` | the memory without handles: geometry, buddy trees, chunk space, global and core pools, slabs, backing |
//! | `Geometry` | `arena/geometry.rs` | the arena cut into chunks and *units* (`min_block`), and the bank rule's numbers |
//! | `Layout`, `BuddyLayout` | `arena/layout.rs` | how a request of `n` bytes maps onto buddy nodes (at the start of its power-of-two node, or *packed* anywhere the bank rule allows by a compaction) or a *run* of whole chunks |
//! | `TreeShape`, `Node` | `arena/buddy.rs` | the lock-free buddy tree over one chunk; a node is a power-of-two block of it |
//! | `ChunkSpace` | `arena/chunk_space.rs` | a chunk's free units and free epoch in one word, and the memo of searches that failed there |
//! | `CorePool` | `arena/core_pool.rs` | one per core: the chunks it owns and its search hints |
//! | `GlobalPool`, `ChunkState` | `arena/global.rs` | the whole arena in chunk units: grants chunks to cores, serves large blocks as exact chunk runs |
//! | (chunk life cycle) | `arena/chunks.rs` | granting a chunk to a core, retiring it when empty, reclaiming every empty chunk |
//! | `Swept` (exact positions) | `arena/exact.rs` | taking and giving back a buddy block or a run at a given offset, without side effects (compaction) |
//! | (free path) | `arena/release.rs` | giving a buddy block or a run back, from any thread |
//! | `SlabCaches`, `SlabClasses` | `arena/slab/` | per-core *slab* caches of small size classes: one CAS to allocate, one `fetch_or` to free; objects at exact positions |
//! | `HostBacking` | `arena/backing.rs` | the optional host memory behind the arena |
//! | [`Handle`] | `handle/id.rs` | a slot index plus a generation: a block reference that survives moves and detects reuse |
//! | `HandleTable`, `SlotInfo` | `handle/table.rs` | the slots behind handles and their state machine: live, moving, *pins* |
//! | [`OwnerWord`], [`Ownership`] | `handle/owner.rs` | one owner of a handle (a Python `Block`): whether it owns the block, the pins it took, its free at the last unpin |
//! | `Gate` | `gate.rs` | the stop gate: *pauses* alloc/free for compaction and `check()` |
//! | [`TraceEvent`], `SoloRing`, `Ring`, `Trace`, `Clock` | `trace/` | the optional event trace: bounded rings of alloc/free/move/failed events (one per recording thread, then one shared), and its clock |
//! | [`PoolStats`], `Counters`, `ThreadStats` | `stats/` | per-thread counter blocks (plain stores), summed into a snapshot whose fields are one list |
//! | [`Pool`], [`PauseToken`] | `pool/` | the public API: composes the arena, handles, gate, stats and trace; alloc, free, pause and pins, snapshot, check, trace |
//! | [`Snapshot`] | `pool/snapshot.rs` | the arena at one moment: live blocks, maximal free runs, stats, figures by tag |
//! | (largest free block) | `pool/largest_free.rs` | the statistics' exact largest request, reading whole only the trees that could hold it |
//! | [`Move`], [`CompactionMode`], [`CompactionPlan`], [`StepReport`] | `compaction/types.rs` | compaction's public types: a move, the modes, a compaction plan, what a compaction did |
//! | (compaction calls) | `compaction/api.rs` | `Pool::move_blocks` (one batch the caller names), `Pool::compact_step` (plan, then execute), `Pool::plan_compaction` (plan, then summary) |
//! | `Census`, `Item` | `compaction/census.rs` | the *census*: every live block by handle, taken on a paused pool |
//! | `Model`, `Gaps` | `compaction/model.rs` | the planners' picture of the arena: what each chunk is, one bit per covered unit; free stretches by length |
//! | `Piece`, `Home` | `compaction/piece.rs` | what moves as one (a block, or a whole slab with its objects), where it is and where it goes |
//! | (compaction planners) | `compaction/planners/` | pure functions of a census and a model: slab consolidation, packing below a boundary, evacuation, the schedule of batches |
//! | (executor) | `compaction/execute.rs`, `order.rs`, `copy.rs` | one batch: taken through the exact-position API, copied in an order that overwrites nothing still to be read, re-pointed |
//! | [`kv::PageTable`] | `kv/` | the paged KV cache's bookkeeping: sequences of fixed-size pages, shared by reference count, copy-on-write (the binding supplies the pages) |
//! | [`plan_search`] | `plan_search/` | the lifetime planner's search: branch and bound over static offsets (driven by `npumem.plan`), and the passes over a whole problem (bound, overlap check, greedy placements) |
//!
//! Words: a *unit* is the `min_block` quantum of a chunk; a *bank* is a `bank_size` stretch of the
//! arena, which no block of at most `bank_size` straddles; a *chunk* is a `chunk_size` piece of
//! the arena, owned by a core or in the global pool; a *run* is a block of whole chunks; a *slab*
//! is a buddy block carved into objects of one size class; a *pin* keeps a block from being
//! freed or moved; a *pause* holds every alloc and free at the stop gate.
//!
//! Names ending in `_raw` work on offsets; everything else on [`Handle`]s.

#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod arena;
#[cfg(not(loom))]
mod compaction;
mod config;
mod device;
mod error;
mod gate;
mod handle;
pub mod kv;
pub mod plan_search;
#[cfg(not(loom))]
mod pool;
mod stats;
mod trace;
mod util;

#[cfg(not(loom))]
pub use arena::regions::Region;
#[cfg(not(loom))]
pub use compaction::{
    CompactionMode, CompactionPlan, Move, MovedBlocks, Mover, PlannedMove, StagedCompaction, StepReport, Transfer,
};
pub use config::{Backing, Placement, PoolConfig, MAX_CAPACITY, MAX_CORES, MAX_CORE_RESERVE, MAX_SLAB_CLASSES};
pub use device::{Device, DEVICE_TYPES};
pub use error::{Error, HandleFault, Result, Shortfall};
pub use gate::WAIT_SLICE;
#[cfg(not(loom))]
pub use gate::{fork_generation, interruptible};
pub use handle::id::Handle;
pub use handle::owner::{OwnerWord, Ownership};
#[cfg(not(loom))]
pub use pool::pause::PauseToken;
#[cfg(not(loom))]
pub use pool::pool::{BlockInfo, Pool};
#[cfg(not(loom))]
pub use pool::region_hooks::RegionHook;
#[cfg(not(loom))]
pub use pool::snapshot::{Extent, Snapshot};
pub use stats::summary::{ClassStats, CoreStats, PoolStats};
pub use stats::tags::{
    TagFigures, TagLabel, TagPin, TagTable, TraceProgress, TraceTags, IDLE_TAGS, MAX_TAG_BYTES, NAMED_TAGS, OTHER_TAGS,
};
pub use trace::event::{EventKind, TraceEvent};
#[cfg(not(loom))]
pub use trace::recorder::{TraceStatus, MAX_TRACE_CAPACITY};
pub use util::grace::{Grace, Inside};
pub use util::published::PublishedSlots;

/// The crate version.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

//! The statistics snapshot's types: [`PoolStats`], per core [`CoreStats`], per slab size class
//! [`ClassStats`]. `Pool::stats` (in `pool/stats.rs`) fills them in.

/// One slab size class in a [`PoolStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassStats {
    /// Object size in bytes.
    pub size: usize,
    /// Live objects of this class.
    pub blocks_in_use: u64,
    /// Slabs of this class (each a buddy block carved into objects).
    pub slabs: u64,
    /// Bytes the live objects hold beyond what they asked for (rounding up to the class).
    pub waste_bytes: u64,
}

/// One core pool's share of a [`PoolStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreStats {
    /// The core pool's index.
    pub core: usize,
    /// Chunks it owns now.
    pub chunks: usize,
    /// Bytes of blocks inside its chunks.
    pub bytes_in_use: usize,
    /// Free bytes inside its chunks.
    pub bytes_free: usize,
    /// Allocations made by threads on this core.
    pub alloc_count: u64,
    /// Frees made by threads on this core (of blocks of any core).
    pub free_count: u64,
    /// Allocations on this core served by another core's chunks.
    pub overflow_allocs: u64,
    /// Allocations on this core that failed.
    pub failed_allocs: u64,
}

/// A snapshot of a pool's state and counters. Exact when no other thread changes the pool while
/// it is taken; otherwise each field is exact for some moment during the call.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStats {
    /// Bytes in the arena.
    pub capacity: usize,
    /// Bytes blocks can use (the capacity less a tail too short for one `min_block`).
    pub usable_capacity: usize,
    /// Bytes held by live blocks (block sizes, so rounding waste counts as in use).
    pub bytes_in_use: usize,
    /// Bytes any allocation can use: `usable_capacity - bytes_in_use - slab_cached_bytes`
    /// (all-free slabs count as free: an allocation reclaims them before it fails).
    pub bytes_free: usize,
    /// Unused bytes inside slabs that still hold objects: free objects of their size class
    /// and slack. Internal to the slabs, so neither in use nor free, and no fragmentation.
    pub slab_cached_bytes: usize,
    /// The highest `bytes_in_use` seen (see `stats/counters.rs` for its precision).
    pub peak_bytes_in_use: usize,
    /// Bytes the live blocks asked for.
    pub requested_bytes_in_use: usize,
    /// Bytes of the largest block that one allocation could get now (with the default
    /// alignment), counting chunks that cores hold empty and would give back.
    pub largest_free_block: usize,
    /// `1 - largest_free_block / bytes_free`, 0.0 when nothing is free.
    pub external_fragmentation: f64,
    /// Allocations since the pool was made.
    pub alloc_count: u64,
    /// Frees since the pool was made.
    pub free_count: u64,
    /// Allocations that raised out-of-memory.
    pub failed_allocs: u64,
    /// Allocations served outside the caller's own core pool.
    pub overflow_allocs: u64,
    /// Allocations served by slab caches.
    pub slab_allocs: u64,
    /// Allocations served by core pools' buddy trees.
    pub core_allocs: u64,
    /// Allocations served by the global pool (chunk runs).
    pub global_allocs: u64,
    /// Live blocks.
    pub blocks_in_use: u64,
    /// Chunks in the arena.
    pub chunks: usize,
    /// Chunks free in the global pool.
    pub chunks_free: usize,
    /// Chunks granted to core pools.
    pub chunks_in_cores: usize,
    /// Chunks in large blocks (runs).
    pub chunks_in_runs: usize,
    /// Per slab size class.
    pub size_classes: Vec<ClassStats>,
    /// Per core pool.
    pub per_core: Vec<CoreStats>,
}

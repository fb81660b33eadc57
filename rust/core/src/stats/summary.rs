//! The statistics snapshot's types: [`PoolStats`], per core [`CoreStats`], per slab size class
//! [`ClassStats`]. `Pool::stats` (in `pool/stats.rs`) fills them in.
//!
//! Each struct's fields are written once, in an exported list macro (`pool_stats_fields!`,
//! `core_stats_fields!`, `class_stats_fields!`) that the binding expands too, so the Python
//! classes have the same fields, in the same order, by construction.

/// The fields of [`ClassStats`], in order: `class_stats_fields!(callback, args...)` expands to
/// `callback! { [args...] fields... }`, each field its doc comments then `name: type,`. The
/// struct here, its summing in `Pool::stats`, and the binding's Python class are generated
/// from this one list.
#[macro_export]
#[doc(hidden)]
macro_rules! class_stats_fields {
    ($callback:ident, $($args:tt)*) => {
        $callback! {
            [$($args)*]
            /// Object size in bytes.
            size: usize,
            /// Live objects of this class.
            blocks_in_use: u64,
            /// Slabs of this class (each a buddy block carved into objects).
            slabs: u64,
            /// Bytes the live objects hold beyond what they asked for (rounding up to the class).
            waste_bytes: u64,
        }
    };
}

/// The fields of [`CoreStats`], in order: `core_stats_fields!(callback, args...)` expands to
/// `callback! { [args...] fields... }`, each field its doc comments then `name: type,`. The
/// struct here, its summing in `Pool::stats`, and the binding's Python class are generated
/// from this one list.
#[macro_export]
#[doc(hidden)]
macro_rules! core_stats_fields {
    ($callback:ident, $($args:tt)*) => {
        $callback! {
            [$($args)*]
            /// The core pool's index.
            core: usize,
            /// Chunks it owns now.
            chunks: usize,
            /// Bytes taken inside its chunks: its blocks, and its slabs whole (objects in use,
            /// free objects and slabs whose objects are all free alike, which the pool's
            /// `bytes_in_use` does not count), cached freed blocks left out.
            bytes_in_use: usize,
            /// Free bytes inside its chunks, cached freed blocks included.
            bytes_free: usize,
            /// Allocations made by threads on this core.
            alloc_count: u64,
            /// Frees made by threads on this core (of blocks of any core).
            free_count: u64,
            /// Allocations on this core served by another core's chunks.
            overflow_allocs: u64,
            /// Allocations on this core that failed.
            failed_allocs: u64,
        }
    };
}

/// The fields of [`PoolStats`], in order: `pool_stats_fields!(callback, args...)` expands to
/// `callback! { [args...] fields... }`, each field its doc comments then `name: type,`. The
/// struct here, its summing in `Pool::stats`, and the binding's Python class are generated
/// from this one list.
#[macro_export]
#[doc(hidden)]
macro_rules! pool_stats_fields {
    ($callback:ident, $($args:tt)*) => {
        $callback! {
            [$($args)*]
            /// Bytes in the arena.
            capacity: usize,
            /// Bytes blocks can use (the capacity less a tail too short for one `min_block`).
            usable_capacity: usize,
            /// Bytes held by live blocks (block sizes, so rounding waste counts as in use).
            bytes_in_use: usize,
            /// Bytes any allocation can use: `usable_capacity - bytes_in_use - slab_cached_bytes`
            /// (all-free slabs count as free: an allocation reclaims them before it fails).
            bytes_free: usize,
            /// Unused bytes inside slabs that still hold objects: free objects of their size class
            /// and slack. Internal to the slabs, so neither in use nor free, and no fragmentation.
            slab_cached_bytes: usize,
            /// The highest `bytes_in_use` seen (see `stats/counters.rs` for its precision).
            peak_bytes_in_use: usize,
            /// Bytes the live blocks asked for.
            requested_bytes_in_use: usize,
            /// The largest request (bytes) that one allocation could get now, with the default
            /// alignment: a request of this size succeeds while nothing else changes the pool,
            /// and a larger one fails, unless a free object of a slab of the calling thread's
            /// core takes it (slab space is no free bytes). Counts chunks that cores hold empty
            /// and would give back.
            largest_free_block: usize,
            /// `1 - largest_free_block / bytes_free`, 0.0 when nothing is free.
            external_fragmentation: f64,
            /// Allocations since the pool was made.
            alloc_count: u64,
            /// Frees since the pool was made.
            free_count: u64,
            /// Allocations that raised out-of-memory (requests larger than the arena included).
            failed_allocs: u64,
            /// Allocations served outside the caller's own core pool.
            overflow_allocs: u64,
            /// Allocations served by slab caches.
            slab_allocs: u64,
            /// Allocations served by core pools' buddy trees.
            core_allocs: u64,
            /// Allocations served by the global pool (chunk runs).
            global_allocs: u64,
            /// Live blocks.
            blocks_in_use: u64,
            /// Chunks in the arena.
            chunks: usize,
            /// Chunks free in the global pool.
            chunks_free: usize,
            /// Chunks granted to core pools.
            chunks_in_cores: usize,
            /// Chunks in large blocks (runs).
            chunks_in_runs: usize,
            /// Regions with memory behind them (1 unless the pool grew).
            regions: usize,
            /// Times the pool grew (added a region), those regions given back since included
            /// (by `trim`, or by an `alloc_many` that failed).
            grow_events: u64,
        }
    };
}

/// Defines a public statistics struct from a field list: `[attributes, name; nested lists]`.
macro_rules! stats_struct {
    (
        [$(#[$attr:meta])* $name:ident; $($(#[$ndoc:meta])* $nested:ident: $nty:ty,)*]
        $($(#[$doc:meta])* $field:ident: $ty:ty,)*
    ) => {
        $(#[$attr])*
        pub struct $name {
            $($(#[$doc])* pub $field: $ty,)*
            $($(#[$ndoc])* pub $nested: $nty,)*
        }
    };
}

class_stats_fields!(
    stats_struct,
    /// One slab size class in a [`PoolStats`].
    #[derive(Debug, Clone, PartialEq, Eq)]
    ClassStats;
);

core_stats_fields!(
    stats_struct,
    /// One core pool's share of a [`PoolStats`].
    #[derive(Debug, Clone, PartialEq, Eq)]
    CoreStats;
);

pool_stats_fields!(
    stats_struct,
    /// A snapshot of a pool's state and counters. Exact when no other thread changes the pool
    /// while it is taken; otherwise each field is exact for some moment during the call.
    #[derive(Debug, Clone, PartialEq)]
    PoolStats;
    /// Per slab size class.
    size_classes: Vec<ClassStats>,
    /// Per core pool.
    per_core: Vec<CoreStats>,
);

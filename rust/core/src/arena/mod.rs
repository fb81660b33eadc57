//! The arena: the memory itself, without handles or Python:
//! - its geometry (chunks, units, the bank rule), the route and shape of a block;
//! - the chunks' buddy trees and free-unit counts, the free stretches inside chunks and the
//!   blocks placed in them;
//! - the global pool of chunks and runs, the core pools and the buddy path of an allocation in
//!   their chunks, the slab caches, the optional host backing, the caches of freed blocks;
//! - the chunk life cycle, the last resort that reveals hidden room (and the set of the chunks
//!   whose rest a tail hid), the regions of a pool that grows;
//! - runs with a buddy tail, blocks with a front in the free end of a chunk and the records of
//!   the chunks' free ends, the largest request a free place holds, whether the arena is tight;
//! - the exact-position API that compaction uses.

#[allow(clippy::module_inception)]
pub(crate) mod arena;
pub(crate) mod backing;
pub(crate) mod block_cache;
pub(crate) mod buddy;
pub(crate) mod chunk_ends;
pub(crate) mod chunk_line;
pub(crate) mod chunk_sets;
pub(crate) mod chunk_space;
pub(crate) mod chunks;
pub(crate) mod core_alloc;
pub(crate) mod core_pool;
pub(crate) mod ends;
pub(crate) mod exact;
pub(crate) mod front;
pub(crate) mod front_nodes;
pub(crate) mod geometry;
pub(crate) mod global;
pub(crate) mod hidden_rests;
pub(crate) mod largest;
pub(crate) mod layout;
pub(crate) mod level_maps;
#[cfg(all(test, loom))]
pub(crate) mod loom_chunk;
#[cfg(all(test, loom))]
mod loom_free_path;
pub(crate) mod packed;
pub(crate) mod regions;
pub(crate) mod release;
pub(crate) mod reveal;
pub(crate) mod slab;
pub(crate) mod stretch_classes;
pub(crate) mod stretches;
pub(crate) mod tail;
pub(crate) mod tight;

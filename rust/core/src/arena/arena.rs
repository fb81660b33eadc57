//! [`Arena`]: the memory of one pool without handles: its geometry, the chunks' buddy trees and
//! free-unit counts, the global pool, the core pools, the slab caches and the optional host
//! backing. The chunk life cycle is `chunks.rs`, the exact-position API `exact.rs`, giving blocks
//! back on the free path `arena/release.rs`; the pool (`pool/`) composes an arena with handles,
//! statistics, the stop gate and the trace.

use super::backing::HostBacking;
use super::buddy::{Node, TreeShape};
use super::chunk_space::ChunkSpace;
use super::core_pool::CorePool;
use super::geometry::Geometry;
use super::global::GlobalPool;
use super::slab::caches::{SlabBlocks, SlabCaches, SlabClasses};
use crate::config::{Backing, PoolConfig};
use crate::error::Result;
use crate::util::sync::{AtomicU64, CachePadded};

/// The memory of one pool (see the module documentation).
pub(crate) struct Arena {
    pub(crate) geometry: Geometry,
    pub(crate) shape: TreeShape,
    pub(crate) trees: Box<[AtomicU64]>,
    /// Free units and the search memo of every chunk.
    pub(crate) space: Box<[ChunkSpace]>,
    pub(crate) global: GlobalPool,
    pub(crate) cores: Box<[CachePadded<CorePool>]>,
    pub(crate) slabs: SlabCaches,
    pub(crate) backing: Option<HostBacking>,
}

impl Arena {
    /// The arena of a validated `config`, its slabs of `classes`; every chunk in the global
    /// pool (its tree retired), the nodes beyond the arena's end allocated forever.
    pub(crate) fn new(config: &PoolConfig, classes: SlabClasses) -> Result<Arena> {
        let geometry = Geometry::new(config);
        let shape = TreeShape::new(geometry.depth);
        let trees: Box<[AtomicU64]> = (0..geometry.chunks * shape.words()).map(|_| AtomicU64::new(0)).collect();
        let space: Box<[ChunkSpace]> =
            (0..geometry.chunks).map(|c| ChunkSpace::new(geometry.usable_units(c))).collect();
        let backing = match config.backing {
            Backing::Host => Some(HostBacking::new(config.capacity, config.chunk_size)?),
            Backing::None => None,
        };
        let arena = Arena {
            global: GlobalPool::new(&geometry, config.placement),
            cores: (0..config.cores)
                .map(|_| CachePadded(CorePool::new(geometry.chunks, geometry.depth as usize + 1, config.core_reserve)))
                .collect(),
            slabs: SlabCaches::new(classes, geometry.usable_capacity(), config.cores),
            backing,
            shape,
            trees,
            space,
            geometry,
        };
        for chunk in 0..arena.geometry.chunks {
            let tree = arena.tree(chunk);
            for node in arena.reserved_nodes(chunk).into_iter().chain(arena.retire_nodes(chunk)) {
                arena.shape.try_alloc(tree, node).expect("a fresh tree has room for its own cover");
            }
        }
        Ok(arena)
    }

    /// The buddy tree of `chunk`.
    #[inline]
    pub(crate) fn tree(&self, chunk: usize) -> &[AtomicU64] {
        let words = self.shape.words();
        &self.trees[chunk * words..(chunk + 1) * words]
    }

    /// Nodes beyond the arena's end in the last chunk: allocated forever.
    pub(crate) fn reserved_nodes(&self, chunk: usize) -> Vec<Node> {
        self.shape.cover(self.geometry.usable_units(chunk), self.geometry.units_per_chunk())
    }

    /// The nodes whose allocation retires a chunk (they cover its usable units).
    pub(crate) fn retire_nodes(&self, chunk: usize) -> Vec<Node> {
        self.shape.cover(0, self.geometry.usable_units(chunk))
    }

    /// Whether every usable unit of `chunk` is free.
    pub(crate) fn chunk_is_empty(&self, chunk: usize) -> bool {
        self.space[chunk].free_units() == self.geometry.usable_units(chunk)
    }
}

/// Gives a retired slab's block back to the buddy pool; never carves (a free, a reclaim or a
/// compaction never makes a slab).
impl SlabBlocks for Arena {
    fn carve(&self, _bytes: usize) -> Option<usize> {
        None
    }

    fn release(&self, base: usize, bytes: usize) {
        self.release_buddy(base, bytes).expect("a retired slab's block is allocated");
    }
}

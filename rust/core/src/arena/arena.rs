//! [`Arena`]: the memory of one pool without handles: its geometry, the chunks' buddy trees and
//! free-unit counts, the global pool, the core pools, the slab caches and the optional host
//! backing. The chunk life cycle is `chunks.rs`, the exact-position API `exact.rs`, giving blocks
//! back on the free path `arena/release.rs`; the pool (`pool/`) composes an arena with handles,
//! statistics, the stop gate and the trace.

use super::backing::HostBacking;
use super::block_cache::BlockCaches;
use super::buddy::{Node, TreeShape};
use super::chunk_line::ChunkLine;
use super::core_pool::CorePool;
use super::geometry::Geometry;
use super::global::{ChunkState, GlobalPool};
use super::hidden_rests::HiddenRests;
use super::regions::Regions;
use super::slab::caches::{SlabBlocks, SlabCaches, SlabClasses};
use super::stretch_classes::StretchClasses;
use super::tight::Tight;
use crate::config::{Backing, PoolConfig};
use crate::error::{Error, Result};
use crate::util::sync::{AtomicU64, AtomicUsize, CachePadded};
use crate::util::zeroed::Zeroed;

/// The memory of one pool (see the module documentation).
pub(crate) struct Arena {
    pub(crate) geometry: Geometry,
    pub(crate) shape: TreeShape,
    pub(crate) trees: Zeroed<AtomicU64>,
    /// Per chunk, the summaries of its tree's bunches (parallel to `trees`, see `buddy.rs`).
    pub(crate) summaries: Zeroed<AtomicU64>,
    /// Per chunk, its free units (`chunk_space.rs`), what the last search learnt about its free
    /// stretches (`stretches.rs`) and about its free start and free end (`chunk_ends.rs`), on
    /// lines of their own (`chunk_line.rs`).
    pub(crate) lines: Zeroed<ChunkLine>,
    /// 1 once any ends record was written (until then a free has none to keep), else 0.
    pub(crate) ends_recorded: AtomicU64,
    /// The chunks by the length class of their memo's longest stretch (`stretch_classes.rs`).
    pub(crate) stretch_classes: StretchClasses,
    /// Per chunk, the block with a front in its free end, if any (`front.rs`).
    pub(crate) fronts: Zeroed<AtomicU64>,
    pub(crate) global: GlobalPool,
    pub(crate) cores: Box<[CachePadded<CorePool>]>,
    pub(crate) slabs: SlabCaches,
    /// Per core, freed buddy blocks kept allocated for the next request of their class
    /// (`block_cache.rs`).
    pub(crate) block_caches: BlockCaches,
    pub(crate) backing: Option<HostBacking>,
    /// The ranges of chunks with memory behind them (`regions.rs`).
    pub(crate) regions: Regions,
    /// Where the next partial reveal of a failing allocation starts (`reveal.rs`).
    pub(crate) reveal_cursor: AtomicU64,
    /// The chunks granted for a tail whose rest was hidden from their cores' searches
    /// (`hidden_rests.rs`), which a failing allocation reveals (`reveal.rs`).
    pub(crate) hidden_rests: HiddenRests,
    /// Where the free end of a core chunk that the next block with a front tries first starts:
    /// the chunk plus one and the unit (0: none; a hint, `front.rs`).
    pub(crate) frontier: AtomicU64,
    /// The chunk where the next best fit's look at the boundaries of core chunks starts (a
    /// hint, `front.rs`: [`PAIR_WINDOW`](crate::arena::front::PAIR_WINDOW)).
    pub(crate) pair_cursor: AtomicUsize,
    /// Whether the global pool ran out of chunks (`tight.rs`).
    pub(crate) tight: Tight,
    /// One past the highest chunk ever granted to a core ([`Arena::open`]): nothing ever wrote
    /// the free-space word, the tree or the freed-block states of a chunk from there on but the
    /// short last chunk's word and tree (written when the arena is made), so `check()` reads
    /// none of them ([`Arena::never_written`]; on an arena of 256 TiB, tens of gigabytes of
    /// zero pages).
    pub(crate) opened_to: AtomicUsize,
}

impl Arena {
    /// The arena of a validated `config`, its slabs of `classes`; every chunk in the global
    /// pool, the nodes beyond the arena's end allocated forever.
    ///
    /// Per-chunk metadata (trees, free-space words) lives in [`Zeroed`] tables and starts
    /// *pristine*: all zero, committed by the host only when a chunk is first granted
    /// (`chunks.rs`), so metadata grows with use, not with capacity. Only a partial last chunk
    /// is set up here (its tail nodes are allocated forever). Running out of host memory is
    /// `Error::HostMemory`, and nothing is left behind.
    pub(crate) fn new(config: &PoolConfig, classes: SlabClasses) -> Result<Arena> {
        let geometry = Geometry::new(&PoolConfig { capacity: config.offset_space(), ..config.clone() });
        let present = match config.grows() {
            true => config.capacity / config.chunk_size,
            false => geometry.chunks,
        };
        let regions = Regions::new(
            present,
            config.limit().div_ceil(config.chunk_size),
            config.grow_by.unwrap_or(config.capacity).div_ceil(config.chunk_size),
        );
        let shape = TreeShape::new(geometry.depth);
        let tree_words = geometry
            .chunks
            .checked_mul(shape.words())
            .ok_or(Error::HostMemory { what: "the chunks' buddy trees", bytes: usize::MAX })?;
        let trees = Zeroed::new(tree_words, "the chunks' buddy trees")?;
        let summaries = Zeroed::new(tree_words, "the chunks' bunch summaries")?;
        let lines = Zeroed::new(geometry.chunks, "the chunks' free-space words, stretch memos and ends records")?;
        let stretch_classes = StretchClasses::new(geometry.chunks)?;
        let fronts = Zeroed::new(geometry.chunks, "the chunks' front words")?;
        let hidden_rests = HiddenRests::new(geometry.chunks)?;
        let global = GlobalPool::new(&geometry, config.placement, present)?;
        let levels = geometry.depth as usize + 1;
        let mut cores = Vec::new();
        cores.try_reserve_exact(config.cores).map_err(|_| Error::HostMemory {
            what: "the core pools",
            bytes: config.cores.saturating_mul(std::mem::size_of::<CachePadded<CorePool>>()),
        })?;
        // A core can never keep more empty chunks than the arena has.
        let reserve = config.core_reserve.min(geometry.chunks);
        for _ in 0..config.cores {
            cores.push(CachePadded(CorePool::new(geometry.chunks, levels, reserve)?));
        }
        let slabs = SlabCaches::new(classes, geometry.usable_capacity(), config.cores)?;
        // The caches of freed blocks hold at most 1/8 of the largest capacity over all cores;
        // a granule is a bank (every cached block starts on one).
        let block_caches = BlockCaches::new(
            config.cores,
            geometry.cache_classes(),
            geometry.chunks << geometry.chunk_shift,
            geometry.bank_units as usize * geometry.min_block,
            (config.limit() / 8) as u64,
        )?;
        let backing = match config.backing {
            Backing::Host => Some(HostBacking::new(config.offset_space(), config.chunk_size)?),
            Backing::None => None,
        };
        let arena = Arena {
            global,
            cores: cores.into_boxed_slice(),
            slabs,
            block_caches,
            backing,
            shape,
            trees,
            summaries,
            lines,
            ends_recorded: AtomicU64::new(0),
            stretch_classes,
            fronts,
            geometry,
            regions,
            reveal_cursor: AtomicU64::new(0),
            hidden_rests,
            frontier: AtomicU64::new(0),
            pair_cursor: AtomicUsize::new(0),
            tight: Tight::default(),
            opened_to: AtomicUsize::new(0),
        };
        if let Some(last) = arena.geometry.chunks.checked_sub(1) {
            if arena.geometry.usable_units(last) < arena.geometry.units_per_chunk() {
                let tree = arena.tree(last);
                for node in arena.reserved_nodes(last).into_iter().chain(arena.retire_nodes(last)) {
                    arena.shape.try_alloc(tree, node).expect("a fresh tree has room for its own cover");
                }
                arena.lines[last].space.init(arena.geometry.usable_units(last));
            }
        }
        Ok(arena)
    }

    /// Whether nothing ever wrote `chunk`'s free-space word and tree, as far as `opened_to`
    /// tells (a chunk past every granted one, not the short last chunk): it is pristine.
    pub(crate) fn never_written(&self, chunk: usize, opened_to: usize) -> bool {
        chunk >= opened_to && self.geometry.usable_units(chunk) == self.geometry.units_per_chunk()
    }

    /// The buddy tree of `chunk`.
    #[inline]
    pub(crate) fn tree(&self, chunk: usize) -> &[AtomicU64] {
        let words = self.shape.words();
        &self.trees[chunk * words..(chunk + 1) * words]
    }

    /// The bunch summaries of `chunk`'s tree.
    #[inline]
    pub(crate) fn summaries(&self, chunk: usize) -> &[AtomicU64] {
        let words = self.shape.words();
        &self.summaries[chunk * words..(chunk + 1) * words]
    }

    /// Nodes beyond the arena's end in the last chunk: allocated forever.
    pub(crate) fn reserved_nodes(&self, chunk: usize) -> Vec<Node> {
        self.shape.cover(self.geometry.usable_units(chunk), self.geometry.units_per_chunk())
    }

    /// The nodes whose allocation retires a chunk (they cover its usable units).
    pub(crate) fn retire_nodes(&self, chunk: usize) -> Vec<Node> {
        self.shape.cover(0, self.geometry.usable_units(chunk))
    }

    /// Bytes of the per-chunk and per-granule metadata tables the host has committed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn committed_metadata_bytes(&self) -> usize {
        self.trees.resident_bytes()
            + self.summaries.resident_bytes()
            + self.lines.resident_bytes()
            + self.stretch_classes.resident_bytes()
            + self.fronts.resident_bytes()
            + self.global.resident_bytes()
            + self.cores.iter().map(|c| c.resident_bytes()).sum::<usize>()
            + self.slabs.resident_bytes()
            + self.block_caches.resident_bytes()
    }

    /// Whether `chunk` was never granted to a core (see `chunks.rs`).
    pub(crate) fn is_pristine(&self, chunk: usize) -> bool {
        !matches!(self.global.state(chunk), ChunkState::Core(_)) && self.lines[chunk].space.is_pristine()
    }

    /// Free units of `chunk`, a pristine one included (all its units are free).
    pub(crate) fn free_units(&self, chunk: usize) -> u64 {
        match self.is_pristine(chunk) {
            true => self.geometry.usable_units(chunk),
            false => self.lines[chunk].space.free_units(),
        }
    }

    /// Whether every usable unit of `chunk` is free.
    pub(crate) fn chunk_is_empty(&self, chunk: usize) -> bool {
        self.lines[chunk].space.free_units() == self.geometry.usable_units(chunk)
    }
}

/// Gives a retired slab's block back to the buddy pool; never carves (a free, a reclaim or a
/// compaction never makes a slab).
impl SlabBlocks for Arena {
    fn carve(&self, _bytes: usize) -> Option<usize> {
        None
    }

    fn release(&self, base: usize, bytes: usize) {
        self.release_slab_block(base, bytes);
    }
}

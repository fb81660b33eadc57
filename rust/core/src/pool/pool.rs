//! The pool: one arena, its chunks and trees, its core pools and slab caches, its handles; and
//! the public API. How a request finds its place is in `placement.rs`, how a block goes back in
//! `release.rs`, the statistics snapshot in `statistics.rs`, the consistency proof in `check.rs`.
//!
//! Allocation path for `n` bytes aligned to `a`, on the caller's core `c` (see DESIGN.md):
//!
//! 1. `n` at most the largest slab class (and `a` within the class's alignment): core `c`'s slab
//!    cache for that class;
//! 2. `n <= chunk_size / 2`: core `c`'s chunks (its hint first), then a fresh chunk from the
//!    global pool, then other cores' chunks (an *overflow* allocation);
//! 3. larger (or `a > chunk_size`): an exact run of whole chunks from the global pool;
//! 4. nothing fits: slabs and chunks that cores hold empty go back, and the request is tried
//!    once more; then [`Error::OutOfMemory`] with the bytes asked, the bytes free and the
//!    largest free block.
//!
//! A free goes straight to the slab, chunk or run that owns the block, from any thread.

use std::ptr::NonNull;

use crate::arena::backing::HostBacking;
use crate::arena::buddy::{Node, TreeShape};
use crate::arena::chunk_space::ChunkSpace;
use crate::arena::core_pool::CorePool;
use crate::arena::geometry::Geometry;
use crate::arena::global::GlobalPool;
use crate::arena::slab::caches::{SlabCaches, SlabClasses, MAX_CLASSES};
use crate::config::{Backing, PoolConfig};
use crate::error::{Error, Result};
use crate::gate::{self, Gate};
use crate::handle::id::Handle;
use crate::handle::table::{HandleTable, SlotInfo};
use crate::pool::alloc::Reach;
use crate::stats::counters::Counters;
use crate::stats::thread::ThreadStats;
use crate::trace::recorder::Trace;
use crate::util::cpu;
use crate::util::sync::{AtomicU32, AtomicU64, CachePadded, Ordering};

static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);

/// What a live block is, as the handle table and the arena see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    /// The block's handle.
    pub handle: Handle,
    /// Its current offset in the arena.
    pub offset: usize,
    /// The bytes it asked for.
    pub size: usize,
    /// The bytes it holds (its size rounded to its slab class or block layout).
    pub block_bytes: usize,
    /// The alignment it asked for.
    pub align: usize,
    /// The core pool that served it.
    pub core: usize,
    /// The tag id given at allocation (0 = none).
    pub tag: u32,
    /// Pins (explicit pins and live buffer views).
    pub pins: u32,
}

/// A pool over one arena. Share it between threads by reference or `Arc`.
pub struct Pool {
    pub(crate) id: u32,
    pub(crate) config: PoolConfig,
    pub(crate) geometry: Geometry,
    pub(crate) shape: TreeShape,
    pub(crate) trees: Box<[AtomicU64]>,
    /// Free units and the search memo of every chunk.
    pub(crate) space: Box<[ChunkSpace]>,
    pub(crate) global: GlobalPool,
    pub(crate) cores: Box<[CachePadded<CorePool>]>,
    pub(crate) slabs: SlabCaches,
    pub(crate) counters: Counters,
    pub(crate) slab_counters: ThreadStats,
    pub(crate) handles: HandleTable,
    pub(crate) gate: Gate,
    pub(crate) backing: Option<HostBacking>,
    /// The optional event trace (off by default; see `trace.rs`).
    pub(crate) trace: Trace,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("id", &self.id).field("config", &self.config).finish_non_exhaustive()
    }
}

impl Pool {
    /// Make a pool; the configuration is validated first.
    pub fn new(config: PoolConfig) -> Result<Pool> {
        config.validate()?;
        if config.slab_sizes.len() > MAX_CLASSES {
            return Err(Error::Config {
                field: "slab_sizes",
                reason: format!("must have at most {MAX_CLASSES} entries, got {}", config.slab_sizes.len()),
            });
        }
        gate::init_barriers();
        let id = NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed);
        let geometry = Geometry::new(&config);
        let shape = TreeShape::new(geometry.depth);
        let trees: Box<[AtomicU64]> = (0..geometry.chunks * shape.words()).map(|_| AtomicU64::new(0)).collect();
        let space: Box<[ChunkSpace]> =
            (0..geometry.chunks).map(|c| ChunkSpace::new(geometry.usable_units(c))).collect();
        let backing = match config.backing {
            Backing::Host => Some(HostBacking::new(config.capacity, config.chunk_size)?),
            Backing::None => None,
        };
        let classes = SlabClasses::new(&config.slab_sizes, config.bank_size, config.min_block, config.chunk_size);
        let smallest = config.slab_sizes.first().copied().unwrap_or(config.min_block).min(config.min_block);
        let max_blocks = geometry.usable_capacity() / smallest.max(1);
        let pool = Pool {
            id,
            global: GlobalPool::new(&geometry, config.placement),
            cores: (0..config.cores)
                .map(|_| CachePadded(CorePool::new(geometry.chunks, geometry.depth as usize + 1, config.core_reserve)))
                .collect(),
            slab_counters: ThreadStats::new(classes.classes.len()),
            slabs: SlabCaches::new(classes, geometry.usable_capacity(), config.cores),
            counters: Counters::new(config.cores, config.capacity),
            handles: HandleTable::new(id, max_blocks.max(1), config.cores),
            gate: Gate::new(id as usize),
            backing,
            trace: Trace::new(),
            shape,
            trees,
            space,
            geometry,
            config,
        };
        for chunk in 0..pool.geometry.chunks {
            let tree = pool.tree(chunk);
            for node in pool.reserved_nodes(chunk).into_iter().chain(pool.retire_nodes(chunk)) {
                pool.shape.try_alloc(tree, node).expect("a fresh tree has room for its own cover");
            }
        }
        Ok(pool)
    }

    /// The validated configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// This pool's id (handles carry it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Bytes in the arena.
    pub fn capacity(&self) -> usize {
        self.config.capacity
    }

    /// Number of core pools.
    pub fn cores(&self) -> usize {
        self.cores.len()
    }

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

    // ----- allocation ---------------------------------------------------------------------

    /// Allocate `size` bytes aligned to `align` (the pool's default alignment when `None`),
    /// with a tag id (0 = none). Waits while the pool is paused.
    pub fn alloc(&self, size: usize, align: Option<usize>, tag: u32) -> Result<Handle> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.cores.len());
        let _entered = self.enter()?;
        match self.place(&request, core, Reach::Full) {
            Some(placed) => self.finish(placed, &request, core, tag),
            None => Err(self.out_of_memory(&request, core, tag)),
        }
    }

    /// The quick part of [`Pool::alloc`] only (the caller's slab cache, core pool and a fresh
    /// chunk, no waiting while paused): `Ok(None)` means "call `alloc`", which may take longer.
    /// Meant for callers holding a lock they would rather release for the long part (the GIL).
    pub fn try_alloc_fast(&self, size: usize, align: Option<usize>, tag: u32) -> Result<Option<Handle>> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.cores.len());
        let Some(_entered) = self.gate.try_enter() else {
            return Ok(None);
        };
        match self.place(&request, core, Reach::Fast) {
            Some(placed) => self.finish(placed, &request, core, tag).map(Some),
            None => Ok(None),
        }
    }

    /// Allocate every size of `sizes` (each aligned to `align`), or none of them: on the first
    /// failure the blocks already made are freed and [`Error::Batch`] says which one failed and
    /// why. Every size is validated before anything is allocated. Waits while paused.
    pub fn alloc_many(&self, sizes: &[usize], align: Option<usize>, tag: u32) -> Result<Vec<Handle>> {
        let requests: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(index, &size)| self.request(size, align).map_err(|e| Error::batch(index, e)))
            .collect::<Result<_>>()?;
        let core = cpu::current_core(self.cores.len());
        let _entered = self.enter()?;
        let mut handles = Vec::with_capacity(sizes.len());
        for (index, request) in requests.iter().enumerate() {
            let made = match self.place(request, core, Reach::Full) {
                Some(placed) => self.finish(placed, request, core, tag),
                None => Err(self.out_of_memory(request, core, tag)),
            };
            match made {
                Ok(handle) => handles.push(handle),
                Err(err) => {
                    for handle in handles {
                        self.free_entered(handle).expect("a block just made can be freed");
                    }
                    return Err(Error::batch(index, err));
                }
            }
        }
        Ok(handles)
    }

    /// Allocate without a handle: the block's offset. Free it with [`Pool::free_raw`] and the
    /// same size.
    pub fn alloc_raw(&self, size: usize, align: Option<usize>) -> Result<usize> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.cores.len());
        let _entered = self.enter()?;
        match self.place(&request, core, Reach::Full) {
            Some(placed) => {
                self.account_alloc(&placed, core, size);
                Ok(placed.offset)
            }
            None => Err(self.out_of_memory(&request, core, 0)),
        }
    }

    // ----- free ---------------------------------------------------------------------------

    /// Free the block behind `handle`. Refused (and nothing changes) for a handle of another
    /// pool, a block already freed, or a pinned block. Waits while the pool is paused.
    pub fn free(&self, handle: Handle) -> Result<()> {
        let _entered = self.enter()?;
        self.free_entered(handle)
    }

    /// [`Pool::free`] without waiting: [`Error::Paused`] (and nothing changes) while the pool is
    /// paused. For callers holding a lock they would rather release before waiting.
    pub fn try_free(&self, handle: Handle) -> Result<()> {
        let Some(_entered) = self.gate.try_enter() else {
            return Err(Error::Paused);
        };
        self.free_entered(handle)
    }

    /// Free every block of `handles`, or none: all are checked first (live, of this pool, not
    /// pinned, no duplicates) and [`Error::Batch`] names the first that is not.
    pub fn free_many(&self, handles: &[Handle]) -> Result<()> {
        let _entered = self.enter()?;
        for (index, &handle) in handles.iter().enumerate() {
            let info = self.handles.get(handle).map_err(|e| {
                let e = if e == Error::InvalidHandle(crate::HandleFault::Freed) { Error::DoubleFree } else { e };
                Error::batch(index, e)
            })?;
            if info.pins > 0 {
                return Err(Error::batch(index, Error::Pinned { pins: info.pins }));
            }
        }
        // The same block twice: sort the slots and look at neighbours.
        let mut slots: Vec<(u32, usize)> = handles.iter().enumerate().map(|(i, h)| (h.slot(), i)).collect();
        slots.sort_unstable();
        if let Some(pair) = slots.windows(2).filter(|w| w[0].0 == w[1].0).min_by_key(|w| w[0].1.max(w[1].1)) {
            return Err(Error::batch(pair[0].1.max(pair[1].1), Error::DoubleFree));
        }
        for (index, &handle) in handles.iter().enumerate() {
            self.free_entered(handle).map_err(|e| Error::batch(index, e))?;
        }
        Ok(())
    }

    /// Free a block of the raw API by its offset and the size it was allocated with.
    pub fn free_raw(&self, offset: usize, size: usize) -> Result<()> {
        if size == 0 || size > self.config.capacity || offset >= self.config.capacity {
            return Err(Error::InvalidBlock { offset, size, reason: "outside the arena or empty" });
        }
        let _entered = self.enter()?;
        let released = self.release_block(offset, size)?;
        self.account_free(released, size);
        Ok(())
    }

    // ----- handles ------------------------------------------------------------------------

    /// What the handle's block is now.
    pub fn block(&self, handle: Handle) -> Result<BlockInfo> {
        let info = self.handles.get(handle)?;
        Ok(self.block_info(handle, info))
    }

    pub(crate) fn block_info(&self, handle: Handle, info: SlotInfo) -> BlockInfo {
        BlockInfo {
            handle,
            offset: info.offset,
            size: info.size,
            block_bytes: self.block_bytes_at(info.offset, info.size, 1usize << info.align_log2),
            align: 1usize << info.align_log2,
            core: info.core as usize,
            tag: info.tag,
            pins: info.pins,
        }
    }

    /// Add a pin: a pinned block cannot be freed or moved. Returns the pins now.
    pub fn pin(&self, handle: Handle) -> Result<u32> {
        self.pin_waiting(handle) // waits while the block is being moved (pause.rs)
    }

    /// Remove a pin. Returns the pins left.
    pub fn unpin(&self, handle: Handle) -> Result<u32> {
        self.handles.unpin(handle)
    }

    /// Every live block (through a handle), in offset order.
    pub fn blocks(&self) -> Vec<BlockInfo> {
        let mut blocks = Vec::new();
        self.handles.for_each_live(&mut |h, info| blocks.push(self.block_info(h, info)));
        blocks.sort_by_key(|b| b.offset);
        blocks
    }

    // ----- host memory --------------------------------------------------------------------

    /// Whether real host memory is behind the arena.
    pub fn has_backing(&self) -> bool {
        self.backing.is_some()
    }

    /// A pointer to the block's first byte and its requested length. The pointer stays valid
    /// while the block is live and not moved (pin it to prevent moves).
    pub fn host_ptr(&self, handle: Handle) -> Result<(NonNull<u8>, usize)> {
        let backing = self.backing.as_ref().ok_or(Error::NoBacking)?;
        let info = self.handles.get(handle)?;
        // SAFETY: a live block lies inside the arena.
        let ptr = unsafe { backing.base().add(info.offset) };
        Ok((ptr, info.size))
    }

    /// Copy `bytes` into the block at `at` (pinned meanwhile: a compaction cannot move it).
    pub fn write(&self, handle: Handle, at: usize, bytes: &[u8]) -> Result<()> {
        let _pin = self.pin_for_access(handle)?;
        let (ptr, len) = self.host_ptr(handle)?;
        if at.checked_add(bytes.len()).is_none_or(|end| end > len) {
            return Err(Error::InvalidSize { size: bytes.len() as u128, reason: "write past the end of the block" });
        }
        // SAFETY: the range is inside the live block; the caller owns the block's bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr().add(at), bytes.len()) };
        Ok(())
    }

    /// Copy the block's bytes from `at` into `out` (pinned meanwhile).
    pub fn read(&self, handle: Handle, at: usize, out: &mut [u8]) -> Result<()> {
        let _pin = self.pin_for_access(handle)?;
        let (ptr, len) = self.host_ptr(handle)?;
        if at.checked_add(out.len()).is_none_or(|end| end > len) {
            return Err(Error::InvalidSize { size: out.len() as u128, reason: "read past the end of the block" });
        }
        // SAFETY: the range is inside the live block.
        unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr().add(at), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

//! The pool: the allocation path, frees, statistics and the consistency check.
//!
//! Allocation path for `n` bytes aligned to `a`, on the caller's core `c` (see DESIGN.md):
//!
//! 1. `n <= chunk_size / 2`: core `c`'s chunks (its hint first), then a fresh chunk from the
//!    global pool, then other cores' chunks (an *overflow* allocation);
//! 2. larger (or `a > chunk_size`): an exact run of whole chunks from the global pool; if none
//!    is free, chunks that cores hold empty are reclaimed and the run is tried again;
//! 3. nothing fits: [`Error::OutOfMemory`] with the bytes asked, the bytes free and the largest
//!    free block.
//!
//! A free goes straight to the chunk that owns the block, from any thread. A chunk that becomes
//! fully free goes back to the global pool unless its core keeps it as reserve.
//!
//! Chunks in the global pool have their buddy tree *retired*: the nodes covering the chunk are
//! marked allocated, so a thread that still holds a stale hint to the chunk fails its climb and
//! never places a block in a chunk that is now part of a run. Granting a chunk releases those
//! nodes; retiring one allocates them, which succeeds only while the chunk is empty.

use std::collections::HashSet;
use std::ptr::NonNull;
use std::time::Duration;

use crate::backing::HostBacking;
use crate::buddy::{Conflict, Node, TreeShape};
use crate::config::{Backing, PoolConfig};
use crate::core_pool::CorePool;
use crate::cpu;
use crate::error::{Error, Result};
use crate::gate::{self, Gate};
use crate::global::{ChunkState, GlobalPool};
use crate::handle::{Handle, HandleTable, SlotInfo};
use crate::layout::{BuddyLayout, Geometry, Layout};
use crate::stats::{CoreStats, Counters, PoolStats, Route};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
// monitoring (issue 6): the event trace and snapshots
use crate::trace::Trace;
#[path = "snapshot.rs"]
pub(crate) mod snapshot;

/// How long `check()` and other pausing calls wait for calls in flight.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);

/// A free-unit counter alone on its cache line (it changes on every alloc and free in the chunk).
#[derive(Default)]
#[repr(align(64))]
struct ChunkCounter(AtomicU64);

/// What a live block is, as the handle table and the arena see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    /// The block's handle.
    pub handle: Handle,
    /// Its current offset in the arena.
    pub offset: usize,
    /// The bytes it asked for.
    pub size: usize,
    /// The bytes it holds (its size rounded to its layout).
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

/// What an allocation got before it became a handle.
#[derive(Debug, Clone, Copy)]
struct Placed {
    offset: usize,
    block_bytes: usize,
    route: Route,
    overflow: bool,
}

/// How far an allocation may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// The caller's core pool and a fresh chunk: quick, for callers that hold a lock (the GIL).
    Fast,
    /// Everything: other cores' chunks, reclaiming empty chunks.
    Full,
}

/// A pool over one arena. Share it between threads by reference or `Arc`.
pub struct Pool {
    id: u32,
    config: PoolConfig,
    geometry: Geometry,
    shape: TreeShape,
    trees: Box<[AtomicU64]>,
    free_units: Box<[ChunkCounter]>,
    global: GlobalPool,
    cores: Box<[crate::sync::CachePadded<CorePool>]>,
    counters: Counters,
    handles: HandleTable,
    gate: Gate,
    backing: Option<HostBacking>,
    /// Blocks allocated through the raw (offset) API and not freed yet.
    raw_live: AtomicU64,
    /// The optional event trace (monitoring, issue 6; see trace.rs).
    trace: Trace,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("id", &self.id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Make a pool; the configuration is validated first.
    pub fn new(config: PoolConfig) -> Result<Pool> {
        config.validate()?;
        gate::init_barriers();
        let id = NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed);
        let geometry = Geometry::new(&config);
        let shape = TreeShape::new(geometry.depth);
        let words = shape.words();
        let trees: Box<[AtomicU64]> = (0..geometry.chunks * words)
            .map(|_| AtomicU64::new(0))
            .collect();
        let free_units: Box<[ChunkCounter]> = (0..geometry.chunks)
            .map(|c| ChunkCounter(AtomicU64::new(geometry.usable_units(c))))
            .collect();
        let backing = match config.backing {
            Backing::Host => Some(HostBacking::new(config.capacity, config.chunk_size)?),
            Backing::None => None,
        };
        let smallest = config
            .slab_sizes
            .first()
            .copied()
            .unwrap_or(config.min_block)
            .min(config.min_block);
        let max_blocks = geometry.usable_capacity() / smallest.max(1);
        let pool = Pool {
            id,
            global: GlobalPool::new(&geometry, config.placement),
            cores: (0..config.cores)
                .map(|_| {
                    crate::sync::CachePadded(CorePool::new(
                        geometry.chunks,
                        geometry.depth as usize + 1,
                        config.core_reserve,
                    ))
                })
                .collect(),
            counters: Counters::new(config.cores, config.capacity),
            handles: HandleTable::new(id, max_blocks.max(1), config.cores),
            gate: Gate::new(id as usize),
            backing,
            raw_live: AtomicU64::new(0),
            trace: Trace::new(),
            shape,
            trees,
            free_units,
            geometry,
            config,
        };
        for chunk in 0..pool.geometry.chunks {
            let tree = pool.tree(chunk);
            for node in pool
                .reserved_nodes(chunk)
                .into_iter()
                .chain(pool.retire_nodes(chunk))
            {
                pool.shape
                    .try_alloc(tree, node)
                    .expect("a fresh tree has room for its own cover");
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

    fn tree(&self, chunk: usize) -> &[AtomicU64] {
        let words = self.shape.words();
        &self.trees[chunk * words..(chunk + 1) * words]
    }

    /// Nodes beyond the arena's end in the last chunk: allocated forever.
    fn reserved_nodes(&self, chunk: usize) -> Vec<Node> {
        let usable = self.geometry.usable_units(chunk);
        self.shape.cover(usable, self.geometry.units_per_chunk())
    }

    /// The nodes whose allocation retires a chunk (they cover its usable units).
    fn retire_nodes(&self, chunk: usize) -> Vec<Node> {
        self.shape.cover(0, self.geometry.usable_units(chunk))
    }

    // ----- requests -----------------------------------------------------------------------

    fn request(&self, size: usize, align: Option<usize>) -> Result<(Layout, usize)> {
        if size == 0 {
            return Err(Error::InvalidSize {
                size: 0,
                reason: "a block must have at least 1 byte",
            });
        }
        if size > self.config.capacity {
            return Err(Error::TooLarge {
                size,
                capacity: self.config.capacity,
            });
        }
        let align = align.unwrap_or(self.config.alignment);
        if align == 0 || !align.is_power_of_two() {
            return Err(Error::InvalidAlignment {
                align: align as u128,
                reason: "must be a power of two (1, 2, 4, ... bytes)".into(),
            });
        }
        if align > self.config.capacity {
            return Err(Error::InvalidAlignment {
                align: align as u128,
                reason: format!(
                    "must not be larger than the arena ({} bytes)",
                    self.config.capacity
                ),
            });
        }
        Ok((self.geometry.layout(size, align), align))
    }

    // ----- allocation ---------------------------------------------------------------------

    /// Allocate `size` bytes aligned to `align` (the pool's default alignment when `None`),
    /// with a tag id (0 = none). Waits while the pool is paused.
    pub fn alloc(&self, size: usize, align: Option<usize>, tag: u32) -> Result<Handle> {
        let (layout, align) = self.request(size, align)?;
        let core = cpu::current_core(self.cores.len());
        let _entered = self.gate.enter();
        match self.place(layout, size, core, Reach::Full) {
            Some(placed) => self.finish(placed, core, size, align, tag),
            None => {
                self.trace.on_failed(core, size, align, tag); // monitoring hook (issue 6)
                Err(self.out_of_memory(size, core))
            }
        }
    }

    /// The quick part of [`Pool::alloc`] only (the caller's core pool and a fresh chunk, no
    /// waiting while paused): `Ok(None)` means "call `alloc`", which may take longer. Meant for
    /// callers holding a lock they would rather release for the long part (Python's GIL).
    pub fn try_alloc_fast(
        &self,
        size: usize,
        align: Option<usize>,
        tag: u32,
    ) -> Result<Option<Handle>> {
        let (layout, align) = self.request(size, align)?;
        let core = cpu::current_core(self.cores.len());
        let Some(_entered) = self.gate.try_enter() else {
            return Ok(None);
        };
        match self.place(layout, size, core, Reach::Fast) {
            Some(placed) => self.finish(placed, core, size, align, tag).map(Some),
            None => Ok(None),
        }
    }

    /// Allocate without a handle: the block's offset. Free it with [`Pool::free_raw`] and the
    /// same size.
    pub fn alloc_raw(&self, size: usize, align: Option<usize>) -> Result<usize> {
        let (layout, _) = self.request(size, align)?;
        let core = cpu::current_core(self.cores.len());
        let _entered = self.gate.enter();
        match self.place(layout, size, core, Reach::Full) {
            Some(placed) => {
                self.counters.on_alloc(
                    core,
                    placed.route,
                    placed.overflow,
                    placed.block_bytes,
                    size,
                );
                self.raw_live.fetch_add(1, Ordering::Relaxed);
                Ok(placed.offset)
            }
            None => Err(self.out_of_memory(size, core)),
        }
    }

    fn finish(
        &self,
        placed: Placed,
        core: usize,
        size: usize,
        align: usize,
        tag: u32,
    ) -> Result<Handle> {
        match self
            .handles
            .insert(core, placed.offset, size, align.trailing_zeros() as u8, tag)
        {
            Ok(handle) => {
                self.counters.on_alloc(
                    core,
                    placed.route,
                    placed.overflow,
                    placed.block_bytes,
                    size,
                );
                // monitoring hook (issue 6)
                self.trace
                    .on_alloc(core, handle, placed.offset, size, align, tag);
                Ok(handle)
            }
            Err(err) => {
                self.free_block(placed.offset, size)
                    .expect("a block just placed can be freed");
                Err(err)
            }
        }
    }

    fn out_of_memory(&self, size: usize, core: usize) -> Error {
        self.counters.on_failed(core);
        let stats = self.stats();
        Error::OutOfMemory {
            requested: size,
            bytes_free: stats.bytes_free,
            largest_free_block: stats.largest_free_block,
        }
    }

    fn place(&self, layout: Layout, size: usize, core: usize, reach: Reach) -> Option<Placed> {
        match layout {
            Layout::Buddy(b) => self.place_buddy(&b, core, reach),
            Layout::Run {
                chunks,
                align_chunks,
            } => self.place_run(chunks, align_chunks, size, reach),
        }
    }

    fn place_buddy(&self, b: &BuddyLayout, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(placed) = self.alloc_in_core(b, core) {
            return Some(placed);
        }
        let bytes = b.enclosing as usize * self.geometry.min_block;
        if let Some(chunk) = self.grant(core, bytes) {
            if let Some(placed) = self.alloc_in_chunk(chunk, b, core) {
                return Some(placed);
            }
        }
        if reach == Reach::Fast {
            return None;
        }
        // Overflow: room in other cores' chunks (including the ones they keep in reserve).
        let cores = self.cores.len();
        for i in 1..cores {
            if let Some(mut placed) = self.alloc_in_core(b, (core + i) % cores) {
                placed.overflow = true;
                return Some(placed);
            }
        }
        // A chunk may have come free meanwhile.
        let chunk = self.grant(core, bytes)?;
        self.alloc_in_chunk(chunk, b, core)
    }

    /// Try the chunks owned by `owner`: its hint first, then every owned chunk from there.
    fn alloc_in_core(&self, b: &BuddyLayout, owner: usize) -> Option<Placed> {
        let pool = &self.cores[owner];
        let hint = pool.hint(b.level);
        if let Some((chunk, bunch)) = hint {
            if chunk < self.geometry.chunks {
                let tree = self.tree(chunk);
                let node = self
                    .shape
                    .search_in_bunch(tree, b.level, bunch, b.step, &mut |e| {
                        self.claim(tree, b, e)
                    });
                if let Some(node) = node {
                    return Some(self.commit(chunk, b, node));
                }
            }
        }
        let start = hint.map_or(0, |(chunk, _)| chunk);
        for chunk in pool.owned_from(start) {
            if self.free_units[chunk].0.load(Ordering::Relaxed) < b.units {
                continue;
            }
            if let Some(placed) = self.alloc_in_chunk(chunk, b, owner) {
                return Some(placed);
            }
        }
        None
    }

    fn alloc_in_chunk(&self, chunk: usize, b: &BuddyLayout, hint_owner: usize) -> Option<Placed> {
        let tree = self.tree(chunk);
        let node = self
            .shape
            .search(tree, b.level, b.step, &mut |e| self.claim(tree, b, e))?;
        self.cores[hint_owner].set_hint(b.level, chunk, self.shape.bunch_of(node));
        Some(self.commit(chunk, b, node))
    }

    /// Claim the block with enclosing node `e`: the node itself, or its trimmed pieces (rolled
    /// back if one of them is taken).
    fn claim(
        &self,
        tree: &[AtomicU64],
        b: &BuddyLayout,
        e: Node,
    ) -> std::result::Result<(), Conflict> {
        if b.is_whole() {
            return self.shape.try_alloc(tree, e);
        }
        let mut taken: Vec<Node> = Vec::with_capacity(4);
        for piece in b.pieces(self.geometry.depth, e) {
            if let Err(conflict) = self.shape.try_alloc(tree, piece) {
                for &p in &taken {
                    let _ = self.shape.release(tree, p);
                }
                return Err(if taken.is_empty() {
                    conflict
                } else {
                    Conflict::Taken
                });
            }
            taken.push(piece);
        }
        Ok(())
    }

    fn commit(&self, chunk: usize, b: &BuddyLayout, e: Node) -> Placed {
        self.free_units[chunk]
            .0
            .fetch_sub(b.units, Ordering::AcqRel);
        Placed {
            offset: self.geometry.offset_of(chunk, e.start(self.geometry.depth)),
            block_bytes: b.units as usize * self.geometry.min_block,
            route: Route::Core,
            overflow: false,
        }
    }

    /// Take a free chunk from the global pool for core `core` (one that can hold a node of
    /// `bytes` bytes).
    fn grant(&self, core: usize, bytes: usize) -> Option<usize> {
        let chunk = self.global.claim(&self.geometry, 1, bytes, 1)?;
        self.global.set_state(chunk, ChunkState::Core(core));
        self.cores[core].own(chunk);
        let tree = self.tree(chunk);
        for node in self.retire_nodes(chunk) {
            self.shape
                .release(tree, node)
                .expect("a chunk in the global pool is retired");
        }
        Some(chunk)
    }

    /// Give an empty chunk of `owner` back to the global pool; `false` if it is not empty (or
    /// someone else is retiring it).
    fn retire(&self, chunk: usize, owner: usize) -> bool {
        let tree = self.tree(chunk);
        // Coalescing is lazy: clear the marks of emptied bunches so the cover nodes fit.
        self.shape.sweep(tree);
        let nodes = self.retire_nodes(chunk);
        for (i, &node) in nodes.iter().enumerate() {
            if self.shape.try_alloc(tree, node).is_err() {
                for &n in &nodes[..i] {
                    let _ = self.shape.release(tree, n);
                }
                return false;
            }
        }
        self.cores[owner].disown(chunk);
        self.global.set_state(chunk, ChunkState::Free);
        self.global.release(chunk, 1);
        true
    }

    /// Retire every empty chunk that cores hold; returns how many went back.
    fn reclaim_empty_chunks(&self) -> usize {
        let mut reclaimed = 0;
        for owner in 0..self.cores.len() {
            let owned: Vec<usize> = self.cores[owner].owned_from(0).collect();
            for chunk in owned {
                if self.chunk_is_empty(chunk) && self.retire(chunk, owner) {
                    reclaimed += 1;
                }
            }
        }
        reclaimed
    }

    fn chunk_is_empty(&self, chunk: usize) -> bool {
        self.free_units[chunk].0.load(Ordering::Acquire) == self.geometry.usable_units(chunk)
    }

    fn place_run(
        &self,
        chunks: usize,
        align_chunks: usize,
        size: usize,
        reach: Reach,
    ) -> Option<Placed> {
        let start = match self
            .global
            .claim(&self.geometry, chunks, size, align_chunks)
        {
            Some(start) => start,
            None if reach == Reach::Full && self.reclaim_empty_chunks() > 0 => {
                self.global
                    .claim(&self.geometry, chunks, size, align_chunks)?
            }
            None => return None,
        };
        for chunk in start + 1..start + chunks {
            self.global.set_state(chunk, ChunkState::RunBody);
        }
        self.global.set_state(start, ChunkState::RunHead(chunks));
        Some(Placed {
            offset: start * self.geometry.chunk_size,
            block_bytes: self.run_bytes(start, chunks),
            route: Route::Global,
            overflow: false,
        })
    }

    fn run_bytes(&self, start: usize, chunks: usize) -> usize {
        (start..start + chunks)
            .map(|c| self.geometry.chunk_bytes(c))
            .sum()
    }

    // ----- free ---------------------------------------------------------------------------

    /// Free the block behind `handle`. Refused (and nothing changes) for a handle of another
    /// pool, a block already freed, or a pinned block. Waits while the pool is paused.
    pub fn free(&self, handle: Handle) -> Result<()> {
        let _entered = self.gate.enter();
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

    fn free_entered(&self, handle: Handle) -> Result<()> {
        let core = cpu::current_core(self.cores.len());
        let info = self.handles.remove(handle)?;
        let block_bytes = self.free_block(info.offset, info.size).map_err(|err| {
            Error::Corruption(vec![format!(
                "live handle {handle:?} pointed at offset {} ({} bytes) but: {err}",
                info.offset, info.size
            )])
        })?;
        self.handles.recycle(core, handle);
        self.counters.on_free(core, block_bytes, info.size);
        // monitoring hook (issue 6)
        self.trace
            .on_free(core, handle, info.offset, info.size, info.tag);
        Ok(())
    }

    /// Free a block of the raw API by its offset and the size it was allocated with.
    pub fn free_raw(&self, offset: usize, size: usize) -> Result<()> {
        if size == 0 || size > self.config.capacity || offset >= self.config.capacity {
            return Err(Error::InvalidBlock {
                offset,
                size,
                reason: "outside the arena or empty",
            });
        }
        let core = cpu::current_core(self.cores.len());
        let _entered = self.gate.enter();
        let block_bytes = self.free_block(offset, size)?;
        self.raw_live.fetch_sub(1, Ordering::Relaxed);
        self.counters.on_free(core, block_bytes, size);
        Ok(())
    }

    /// Release the block at `offset` of `size` requested bytes; returns its block bytes.
    /// Validates everything before it changes anything.
    fn free_block(&self, offset: usize, size: usize) -> Result<usize> {
        let invalid = |reason| {
            Err(Error::InvalidBlock {
                offset,
                size,
                reason,
            })
        };
        let chunk = self.geometry.chunk_of(offset);
        if chunk >= self.geometry.chunks {
            return invalid("outside the arena's chunks");
        }
        match self.global.state(chunk) {
            ChunkState::RunHead(len) => {
                let chunks = (size + self.geometry.chunk_size - 1) >> self.geometry.chunk_shift;
                if self.geometry.unit_in_chunk(offset) != 0
                    || offset & (self.geometry.min_block - 1) != 0
                    || chunks != len
                {
                    return invalid("does not match the chunk run there");
                }
                if !self
                    .global
                    .swap_state(chunk, ChunkState::RunHead(len), ChunkState::Free)
                {
                    return invalid("the chunk run there was freed already");
                }
                for c in chunk + 1..chunk + len {
                    self.global.set_state(c, ChunkState::Free);
                }
                let bytes = self.run_bytes(chunk, len);
                self.global.release(chunk, len);
                Ok(bytes)
            }
            ChunkState::Core(_) => {
                let Layout::Buddy(b) = self.geometry.layout(size, 1) else {
                    return invalid("a block of this size would be a chunk run");
                };
                let within = self.geometry.unit_in_chunk(offset);
                if offset & (self.geometry.min_block - 1) != 0 || within & (b.enclosing - 1) != 0 {
                    return invalid("not the start of a block of this size");
                }
                let e = Node::covering(self.geometry.depth, within, b.enclosing);
                let tree = self.tree(chunk);
                let depth = self.geometry.depth;
                // A trimmed block is several nodes: all must be allocated before any is freed.
                // (A whole block is one node: its release below is the check.)
                if !b.is_whole() && !b.pieces(depth, e).all(|p| self.shape.is_allocated(tree, p)) {
                    return invalid("no block of this size is allocated there");
                }
                // The first release decides who frees the block when two callers race.
                let mut pieces = b.pieces(depth, e);
                let first = pieces.next().expect("a block has at least one node");
                if self.shape.release(tree, first).is_err() {
                    return invalid("the block was freed already");
                }
                for p in pieces {
                    let _ = self.shape.release(tree, p);
                }
                let after = self.free_units[chunk]
                    .0
                    .fetch_add(b.units, Ordering::AcqRel)
                    + b.units;
                if after == self.geometry.usable_units(chunk) {
                    self.chunk_became_empty(chunk);
                }
                Ok(b.units as usize * self.geometry.min_block)
            }
            ChunkState::Free | ChunkState::RunBody => invalid("no block starts in this chunk"),
        }
    }

    fn chunk_became_empty(&self, chunk: usize) {
        if let ChunkState::Core(owner) = self.global.state(chunk) {
            let still_reserve = |c: usize| {
                self.global.state(c) == ChunkState::Core(owner) && self.chunk_is_empty(c)
            };
            if !self.cores[owner].keep_in_reserve(chunk, still_reserve) {
                self.retire(chunk, owner);
            }
        }
    }

    // ----- monitoring hooks (issue 6: trace.rs, snapshot.rs) ------------------------------

    /// The event trace (its switch and drain are in trace.rs).
    pub(crate) fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Pause alloc and free for a maintenance call (snapshot, trace switch), waiting for calls
    /// in flight; `Error::Busy` if they do not finish in time.
    pub(crate) fn pause_for_maintenance(&self) -> Result<gate::PauseGuard<'_>> {
        self.gate
            .pause(PAUSE_TIMEOUT)
            .map_err(|waited| Error::Busy {
                waited_ms: waited.as_millis() as u64,
            })
    }

    // ----- handles ------------------------------------------------------------------------

    /// What the handle's block is now.
    pub fn block(&self, handle: Handle) -> Result<BlockInfo> {
        let info = self.handles.get(handle)?;
        Ok(self.block_info(handle, info))
    }

    fn block_info(&self, handle: Handle, info: SlotInfo) -> BlockInfo {
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

    /// The bytes the block of `size` requested bytes at `offset` holds.
    fn block_bytes_at(&self, offset: usize, size: usize, align: usize) -> usize {
        match self.geometry.layout(size, align) {
            Layout::Buddy(b) => b.units as usize * self.geometry.min_block,
            Layout::Run { chunks, .. } => self.run_bytes(self.geometry.chunk_of(offset), chunks),
        }
    }

    /// Add a pin: a pinned block cannot be freed or moved. Returns the pins now.
    pub fn pin(&self, handle: Handle) -> Result<u32> {
        self.handles.pin(handle)
    }

    /// Remove a pin. Returns the pins left.
    pub fn unpin(&self, handle: Handle) -> Result<u32> {
        self.handles.unpin(handle)
    }

    /// Every live block (through a handle), in offset order.
    pub fn blocks(&self) -> Vec<BlockInfo> {
        let mut blocks = Vec::new();
        self.handles
            .for_each_live(&mut |h, info| blocks.push(self.block_info(h, info)));
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

    /// Copy `bytes` into the block at `at`.
    pub fn write(&self, handle: Handle, at: usize, bytes: &[u8]) -> Result<()> {
        let (ptr, len) = self.host_ptr(handle)?;
        if at.checked_add(bytes.len()).is_none_or(|end| end > len) {
            return Err(Error::InvalidSize {
                size: bytes.len() as u128,
                reason: "write past the end of the block",
            });
        }
        // SAFETY: the range is inside the live block; the caller owns the block's bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr().add(at), bytes.len()) };
        Ok(())
    }

    /// Copy the block's bytes from `at` into `out`.
    pub fn read(&self, handle: Handle, at: usize, out: &mut [u8]) -> Result<()> {
        let (ptr, len) = self.host_ptr(handle)?;
        if at.checked_add(out.len()).is_none_or(|end| end > len) {
            return Err(Error::InvalidSize {
                size: out.len() as u128,
                reason: "read past the end of the block",
            });
        }
        // SAFETY: the range is inside the live block.
        unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr().add(at), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    // ----- statistics ---------------------------------------------------------------------

    /// A snapshot of the pool's state and counters (see [`PoolStats`]).
    pub fn stats(&self) -> PoolStats {
        let totals = self.counters.totals();
        let usable = self.geometry.usable_capacity();
        let bytes_in_use = totals.bytes.max(0) as usize;
        let bytes_free = usable.saturating_sub(bytes_in_use);
        let largest_free_block = self.largest_free_block();
        let mut chunks_free = 0;
        let mut chunks_in_runs = 0;
        let mut chunks_in_cores = 0;
        for chunk in 0..self.geometry.chunks {
            match self.global.state(chunk) {
                ChunkState::Free => chunks_free += 1,
                ChunkState::Core(_) => chunks_in_cores += 1,
                ChunkState::RunHead(_) | ChunkState::RunBody => chunks_in_runs += 1,
            }
        }
        let per_core = (0..self.cores.len())
            .map(|core| {
                let c = self.counters.core(core);
                let (mut used, mut free) = (0usize, 0usize);
                let owned: Vec<usize> = self.cores[core].owned_from(0).collect();
                for &chunk in &owned {
                    let f = self.free_units[chunk].0.load(Ordering::Relaxed) as usize
                        * self.geometry.min_block;
                    free += f;
                    used += self.geometry.usable_bytes(chunk).saturating_sub(f);
                }
                CoreStats {
                    core,
                    chunks: owned.len(),
                    bytes_in_use: used,
                    bytes_free: free,
                    alloc_count: c.allocs(),
                    free_count: c.frees,
                    overflow_allocs: c.overflow_allocs,
                    failed_allocs: c.failed_allocs,
                }
            })
            .collect();
        PoolStats {
            capacity: self.config.capacity,
            usable_capacity: usable,
            bytes_in_use,
            bytes_free,
            peak_bytes_in_use: self.counters.peak(bytes_in_use as u64) as usize,
            requested_bytes_in_use: totals.requested.max(0) as usize,
            largest_free_block,
            external_fragmentation: if bytes_free == 0 {
                0.0
            } else {
                (1.0 - largest_free_block as f64 / bytes_free as f64).max(0.0)
            },
            alloc_count: totals.allocs(),
            free_count: totals.frees,
            failed_allocs: totals.failed_allocs,
            overflow_allocs: totals.overflow_allocs,
            slab_allocs: totals.slab_allocs,
            core_allocs: totals.core_allocs,
            global_allocs: totals.global_allocs,
            blocks_in_use: totals.allocs().saturating_sub(totals.frees),
            chunks: self.geometry.chunks,
            chunks_free,
            chunks_in_cores,
            chunks_in_runs,
            per_core,
        }
    }

    /// The largest block one allocation could get now: the largest free chunk run (counting
    /// empty core chunks, which would be reclaimed) or the largest free node in a chunk.
    fn largest_free_block(&self) -> usize {
        let runs = self.global.free_runs(&|chunk| {
            matches!(self.global.state(chunk), ChunkState::Core(_)) && self.chunk_is_empty(chunk)
        });
        let mut largest = runs
            .iter()
            .map(|&run| GlobalPool::run_capacity(&self.geometry, run))
            .max()
            .unwrap_or(0);
        for chunk in 0..self.geometry.chunks {
            if !matches!(self.global.state(chunk), ChunkState::Core(_))
                || self.chunk_is_empty(chunk)
            {
                continue;
            }
            if let Some(level) = self.shape.largest_free_level(self.tree(chunk)) {
                let bytes = (1usize << (self.geometry.depth - level)) * self.geometry.min_block;
                largest = largest.max(bytes);
            }
        }
        largest
    }

    // ----- consistency --------------------------------------------------------------------

    /// Pause the pool (waiting for calls in flight) and prove its metadata consistent: every
    /// chunk's state, bitmap bit and owner agree; every tree is well formed; every live handle
    /// names an allocated block inside the arena, aligned and bank-safe; no two blocks overlap;
    /// the counters equal what the walk finds. Returns the number of live blocks checked.
    pub fn check(&self) -> Result<usize> {
        let _paused = self
            .gate
            .pause(PAUSE_TIMEOUT)
            .map_err(|waited| Error::Busy {
                waited_ms: waited.as_millis() as u64,
            })?;
        let mut findings: Vec<String> = Vec::new();
        let g = &self.geometry;
        let depth = g.depth;
        // Chunks: state, bitmap, ownership, trees.
        let mut allocated: HashSet<(usize, Node)> = HashSet::new();
        let mut block_bytes_walked = 0usize;
        let mut chunk = 0;
        while chunk < g.chunks {
            let state = self.global.state(chunk);
            let owners: Vec<usize> = (0..self.cores.len())
                .filter(|&c| self.cores[c].owns(chunk))
                .collect();
            let taken = self.global.is_taken(chunk);
            let tree = self.tree(chunk);
            self.shape
                .check(tree, &mut |f| findings.push(format!("chunk {chunk}: {f}")));
            let mut nodes: HashSet<Node> = HashSet::new();
            self.shape.for_each_allocated(tree, &mut |n| {
                nodes.insert(n);
            });
            for n in self.reserved_nodes(chunk) {
                if !nodes.remove(&n) {
                    findings.push(format!(
                        "chunk {chunk}: reserved tail node {n:?} is not allocated"
                    ));
                }
            }
            let free_units = self.free_units[chunk].0.load(Ordering::Acquire);
            match state {
                ChunkState::Free | ChunkState::RunHead(_) | ChunkState::RunBody => {
                    for n in self.retire_nodes(chunk) {
                        if !nodes.remove(&n) {
                            findings.push(format!(
                                "chunk {chunk} ({state:?}): not retired, node {n:?} is free"
                            ));
                        }
                    }
                    if !nodes.is_empty() {
                        findings.push(format!(
                            "chunk {chunk} ({state:?}): {} stray allocated node(s)",
                            nodes.len()
                        ));
                    }
                    if free_units != g.usable_units(chunk) {
                        findings.push(format!("chunk {chunk} ({state:?}): free-unit count {free_units} but it holds no buddy block"));
                    }
                    if !owners.is_empty() {
                        findings.push(format!(
                            "chunk {chunk} ({state:?}): owned by core(s) {owners:?}"
                        ));
                    }
                    if (state == ChunkState::Free) == taken {
                        findings.push(format!(
                            "chunk {chunk} ({state:?}): bitmap says taken={taken}"
                        ));
                    }
                }
                ChunkState::Core(core) => {
                    if owners != vec![core] {
                        findings.push(format!(
                            "chunk {chunk}: state says core {core}, owner bitmaps say {owners:?}"
                        ));
                    }
                    if !taken {
                        findings.push(format!(
                            "chunk {chunk}: granted to core {core} but free in the bitmap"
                        ));
                    }
                    let used: u64 = nodes.iter().map(|n| n.units(depth)).sum();
                    if used + free_units != g.usable_units(chunk) {
                        findings.push(format!(
                            "chunk {chunk}: walk finds {used} units in use, counter says {} free of {}",
                            free_units,
                            g.usable_units(chunk)
                        ));
                    }
                    block_bytes_walked += used as usize * g.min_block;
                    allocated.extend(nodes.into_iter().map(|n| (chunk, n)));
                }
            }
            if let ChunkState::RunHead(len) = state {
                if chunk + len > g.chunks {
                    findings.push(format!(
                        "chunk {chunk}: run of {len} chunks runs past the arena"
                    ));
                    break;
                }
                for c in chunk + 1..chunk + len {
                    if self.global.state(c) != ChunkState::RunBody || !self.global.is_taken(c) {
                        findings.push(format!(
                            "chunk {c}: inside the run at chunk {chunk} but {:?}",
                            self.global.state(c)
                        ));
                    }
                }
                block_bytes_walked += self.run_bytes(chunk, len);
            } else if state == ChunkState::RunBody
                && (chunk == 0
                    || !matches!(
                        self.global.state(chunk - 1),
                        ChunkState::RunHead(_) | ChunkState::RunBody
                    ))
            {
                findings.push(format!("chunk {chunk}: run body without a head"));
            }
            chunk += 1;
        }
        // Handles: each names an allocated block, inside the arena, aligned, bank-safe.
        let mut extents: Vec<(usize, usize, Handle)> = Vec::new();
        let mut live = 0usize;
        let bank = self.config.bank_size;
        self.handles.for_each_live(&mut |h, info| {
            live += 1;
            let align = 1usize << info.align_log2;
            let bytes = self.block_bytes_at(info.offset, info.size, align);
            if info.offset + info.size > g.usable_capacity() {
                findings.push(format!("block {h:?}: [{}, +{}) ends past the arena", info.offset, info.size));
                return;
            }
            if info.offset % align != 0 {
                findings.push(format!("block {h:?}: offset {} not aligned to {align}", info.offset));
            }
            let bank_ok = if info.size <= bank {
                info.offset / bank == (info.offset + info.size - 1) / bank
            } else {
                info.offset % bank == 0
            };
            if !bank_ok {
                findings.push(format!("block {h:?}: [{}, +{}) breaks the bank rule (bank {bank})", info.offset, info.size));
            }
            let chunk = info.offset / g.chunk_size;
            match self.global.state(chunk) {
                ChunkState::RunHead(len) => {
                    if info.offset % g.chunk_size != 0 || info.size.div_ceil(g.chunk_size) != len {
                        findings.push(format!("block {h:?}: does not match the run at chunk {chunk}"));
                    }
                }
                ChunkState::Core(_) => match g.layout(info.size, 1) {
                    Layout::Buddy(b) => {
                        let within = ((info.offset % g.chunk_size) / g.min_block) as u64;
                        if within % b.enclosing != 0 {
                            findings.push(format!("block {h:?}: offset {} is not a block start", info.offset));
                        } else {
                            let e = Node::covering(depth, within, b.enclosing);
                            let pieces: Vec<Node> =
                                if b.is_whole() { vec![e] } else { b.pieces(depth, e).collect() };
                            for p in pieces {
                                if !allocated.remove(&(chunk, p)) {
                                    findings.push(format!("block {h:?}: node {p:?} of chunk {chunk} is not allocated (or shared)"));
                                }
                            }
                        }
                    }
                    Layout::Run { .. } => findings.push(format!("block {h:?}: run-sized block inside a core chunk")),
                },
                other => findings.push(format!("block {h:?}: its chunk {chunk} is {other:?}")),
            }
            extents.push((info.offset, bytes, h));
        });
        extents.sort_by_key(|&(offset, len, _)| (offset, len));
        for pair in extents.windows(2) {
            let ((a_off, a_len, a), (b_off, _, b)) = (pair[0], pair[1]);
            if a_off + a_len > b_off {
                findings.push(format!("blocks {a:?} and {b:?} overlap at offset {b_off}"));
            }
        }
        // Counters.
        let totals = self.counters.totals();
        let raw_live = self.raw_live.load(Ordering::Acquire) as usize;
        if raw_live == 0 && !allocated.is_empty() {
            findings.push(format!(
                "{} allocated node(s) belong to no live block (leaked)",
                allocated.len()
            ));
        }
        if totals.bytes.max(0) as usize != block_bytes_walked || totals.bytes < 0 {
            findings.push(format!(
                "counters say {} bytes in use, the walk finds {block_bytes_walked}",
                totals.bytes
            ));
        }
        let blocks_counted = totals.allocs() as i128 - totals.frees as i128;
        if blocks_counted != (live + raw_live) as i128 {
            findings.push(format!("counters say {blocks_counted} live blocks, {live} handles + {raw_live} raw blocks exist"));
        }
        let listed = self.handles.count_free_listed();
        if listed + live != self.handles.slots_used() {
            findings.push(format!(
                "handle table: {live} live + {listed} free-listed != {} slots used (a slot was lost)",
                self.handles.slots_used()
            ));
        }
        if findings.is_empty() {
            Ok(live + raw_live)
        } else {
            Err(Error::Corruption(findings))
        }
    }
}

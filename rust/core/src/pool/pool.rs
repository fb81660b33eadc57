//! The pool: one arena (`arena/`), its handles, counters, stop gate and trace; and the public
//! API. How a request finds its place is in `alloc.rs`, how a block goes back in `free.rs`,
//! pauses and pins in `pause.rs`, the statistics snapshot in `stats.rs`, the consistency proof
//! in `check.rs`.
//!
//! Allocation path for `n` bytes aligned to `a`, on the caller's core `c` (see `docs/design.md`):
//!
//! 1. `n` at most the largest slab class (and `a` within the class's alignment): core `c`'s slab
//!    cache for that class;
//! 2. `n <= chunk_size / 2`: core `c`'s chunks (its hint first), then a fresh chunk from the
//!    global pool, then other cores' chunks (an *overflow* allocation);
//! 3. larger (or `a > chunk_size`): an exact run of whole chunks from the global pool;
//! 4. nothing fits: slabs and chunks that cores hold empty go back, and the request is tried
//!    once more; a pool that can grow then adds a region (`growth.rs`); then
//!    [`Error::OutOfMemory`] with the bytes asked, the bytes free and the largest free block.
//!
//! A free goes straight to the slab, chunk or run that owns the block, from any thread.

use std::ptr::NonNull;

use crate::arena::arena::Arena;
use crate::arena::slab::caches::SlabClasses;
use crate::config::PoolConfig;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::gate::{self, Gate};
use crate::handle::id::Handle;
use crate::handle::table::{HandleTable, PinKind, SlotInfo};
use crate::pool::region_hooks::GrowthHooks;
use crate::stats::counters::Counters;
use crate::stats::tags::TagTable;
use crate::trace::recorder::Trace;
use crate::util::grow::try_push;

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
    pub(super) id: u32,
    pub(super) config: PoolConfig,
    /// The memory: chunks, trees, global and core pools, slabs, backing.
    pub(super) arena: Arena,
    pub(super) counters: Counters,
    pub(super) handles: HandleTable,
    pub(super) gate: Gate,
    /// The optional event trace (off by default; see `trace/`).
    pub(super) trace: Trace,
    /// Tag names and the counters by tag (see `pool/tags.rs`).
    pub(super) tags: TagTable,
    /// The largest request and total: `max_capacity`, or `capacity` if the pool cannot grow.
    pub(super) limit: usize,
    /// The largest block a request may ask for: in a pool that cannot grow, the bytes its chunks
    /// hold (the arena may end in a part shorter than its smallest block); in one that can, the
    /// largest region it can ever have (`Pool::largest_request_of`).
    pub(super) largest_request: usize,
    /// The largest slab class (0 without classes): a block that asked for more is never a slab
    /// object, so its free goes straight to its chunk.
    pub(super) largest_slab: usize,
    /// The hooks called when a region is added or given back (`growth.rs`).
    pub(super) growth: GrowthHooks,
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
        gate::init_barriers();
        // The thread's first allocation here takes the core of the CPU it runs on then.
        crate::util::cpu::forget();
        let id = crate::handle::id::new_pool_id();
        let classes = SlabClasses::of(&config);
        let slab_classes = classes.classes.len();
        let arena = Arena::new(&config, classes)?;
        let max_blocks = arena.geometry.usable_capacity() / arena.slabs.classes.smallest_footprint(config.min_block);
        Ok(Pool {
            id,
            counters: Counters::new(config.cores, slab_classes, config.limit()),
            handles: HandleTable::new(id, max_blocks.max(1), config.cores)?,
            gate: Gate::new(),
            trace: Trace::new(),
            tags: TagTable::new(),
            limit: config.limit(),
            largest_request: Self::largest_request_of(&config, &arena),
            largest_slab: config.slab_sizes.last().copied().unwrap_or(0),
            growth: GrowthHooks::default(),
            arena,
            config,
        })
    }

    /// The largest block a request may ask for ([`Pool::largest_request`]), computed once: in a
    /// pool that cannot grow, the bytes its chunks hold; in one that can, the largest region it
    /// can ever have (`Regions::largest_region_chunks`), at most `max_capacity`.
    fn largest_request_of(config: &PoolConfig, arena: &Arena) -> usize {
        match config.grows() {
            true => {
                let first = config.capacity / config.chunk_size;
                let chunks = arena.regions.largest_region_chunks(first);
                config.limit().min(chunks.saturating_mul(config.chunk_size))
            }
            false => config.limit().min(arena.geometry.usable_capacity()),
        }
    }

    /// The largest block this pool can ever hand out: a larger request is refused with
    /// [`Error::TooLarge`]. At most [`Pool::max_capacity`]; in a pool that grows, the larger of
    /// its first region and `max_capacity` less that region, in whole chunks (regions lie a
    /// chunk apart and no block spans two; the first is never given back).
    pub fn largest_request(&self) -> usize {
        self.largest_request
    }

    /// The validated configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// This pool's id (handles carry it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Bytes in the arena: `capacity`, plus the regions a pool that grows added since (less
    /// those trimmed away).
    #[inline]
    pub fn capacity(&self) -> usize {
        match self.config.grows() {
            true => self.arena.regions.present_chunks() * self.config.chunk_size,
            false => self.config.capacity,
        }
    }

    /// Number of core pools.
    pub fn cores(&self) -> usize {
        self.arena.cores.len()
    }

    /// The arena (for compaction: the exact-position API and the arena's layout).
    #[inline]
    pub(crate) fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The handle table (for compaction: marking blocks moving and re-pointing them).
    #[inline]
    pub(crate) fn handles(&self) -> &HandleTable {
        &self.handles
    }

    // ----- handles ------------------------------------------------------------------------

    /// What the handle's block is now. While a compaction moves the block, this waits until the
    /// move is done (the block's place is read where its slot points, and its bytes there are
    /// known only once the move has re-pointed it), as an allocation waits for the pause the
    /// move runs under: at most the pause's timeout, then [`Error::PausedTooLong`]. The thread
    /// moving it (a mover) gets what the slot records so far.
    pub fn block(&self, handle: Handle) -> Result<BlockInfo> {
        loop {
            match self.try_block(handle) {
                Err(Error::Moving) if self.gate.moving_here() => {
                    return Ok(self.block_info(handle, self.handles.get(handle)?));
                }
                Err(Error::Moving) => self.wait_out_move()?,
                other => return other,
            }
        }
    }

    /// Wait for a move of a block to end, for a thread that is not moving it. Moves run under a
    /// pause, so this waits for the pause as an allocation does: at most its timeout (then
    /// [`Error::PausedTooLong`]; [`Error::Relocating`] for the thread that holds the pause while
    /// another moves blocks under it, which the move outlasts). Where the pool lets this thread
    /// in while the move runs, it yields and returns, for the caller to look again.
    pub(crate) fn wait_out_move(&self) -> Result<()> {
        drop(self.enter()?);
        std::thread::yield_now();
        Ok(())
    }

    /// [`Pool::block`] without waiting: [`Error::Moving`] while a compaction moves the block
    /// (it is live and unpinned then).
    pub fn try_block(&self, handle: Handle) -> Result<BlockInfo> {
        let (info, moving) = self.handles.get_and_moving(handle)?;
        if moving {
            return Err(Error::Moving);
        }
        let block = self.block_info(handle, info);
        // A move that began meanwhile may have changed what the place held: read again.
        match self.handles.get_and_moving(handle)? {
            (again, false) if again.offset == info.offset => Ok(block),
            _ => Err(Error::Moving),
        }
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

    /// Add a user pin: a pinned block cannot be freed or moved. Returns the user pins now.
    pub fn pin(&self, handle: Handle) -> Result<u32> {
        self.pin_waiting(handle, PinKind::User) // waits while the block is being moved (pause.rs)
    }

    /// Remove a user pin ([`Error::InvalidBlock`] without one: the pins of buffer views are not
    /// the caller's to drop). Returns the user pins left.
    pub fn unpin(&self, handle: Handle) -> Result<u32> {
        self.handles.unpin(handle, PinKind::User)
    }

    /// Start the generations of handle slots not yet used at `generation` instead of 0: a test
    /// hook, to reach the last generation (where a slot retires) without 2^32 frees.
    #[doc(hidden)]
    pub fn start_generations_at(&self, generation: u32) {
        self.handles.start_generations_at(generation);
    }

    /// Add a view pin, for a buffer view of the block's bytes, waiting while the block is being
    /// moved. Returns the view pins now.
    pub fn pin_view(&self, handle: Handle) -> Result<u32> {
        self.pin_waiting(handle, PinKind::View)
    }

    /// Remove a view pin (when its view is released). Returns the view pins left.
    pub fn unpin_view(&self, handle: Handle) -> Result<u32> {
        self.handles.unpin(handle, PinKind::View)
    }

    /// Every live block (through a handle), in offset order, at one moment: alloc and free
    /// pause while the handles are read, as for a snapshot, so that no block freed (or moved)
    /// during the walk is listed beside the one that took its place. [`Error::Busy`] if calls
    /// in flight do not finish in time, [`Error::HostMemory`] if the host has no memory for
    /// the list (nothing changes then).
    pub fn blocks(&self) -> Result<Vec<BlockInfo>> {
        let _paused = self.pause_for_maintenance()?;
        self.blocks_while_paused()
    }

    /// [`Pool::blocks`] for a caller that holds the pool's pause.
    pub(crate) fn blocks_while_paused(&self) -> Result<Vec<BlockInfo>> {
        let mut blocks = Vec::new();
        let mut listed = Ok(());
        self.handles.for_each_live(&mut |h, info| {
            if listed.is_ok() {
                listed = try_push(&mut blocks, self.block_info(h, info), "the list of live blocks");
            }
        });
        listed?;
        // In place (a stable sort allocates); live blocks have distinct offsets.
        blocks.sort_unstable_by_key(|b| b.offset);
        Ok(blocks)
    }

    // ----- host memory --------------------------------------------------------------------

    /// Whether real host memory is behind the arena.
    pub fn has_backing(&self) -> bool {
        self.arena.backing.is_some()
    }

    /// The address of offset 0: the host mapping's of a host-backed pool, the configured
    /// `base_address` otherwise. A block's address is this plus its offset.
    pub fn base_address(&self) -> u64 {
        match &self.arena.backing {
            Some(backing) => backing.base().as_ptr() as u64,
            None => self.config.base_address,
        }
    }

    /// The device the arena's memory lives on.
    pub fn device(&self) -> Device {
        self.config.resolved_device()
    }

    /// A pointer to the block's first byte and its requested length. The pointer stays valid
    /// while the block is live and not moved (pin it to prevent moves).
    pub fn host_ptr(&self, handle: Handle) -> Result<(NonNull<u8>, usize)> {
        let backing = self.arena.backing.as_ref().ok_or(Error::NoBacking)?;
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

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use crate::config::{Backing, PoolConfig};
    use crate::error::Error;
    use crate::pool::pool::Pool;

    /// A block being moved is not read at its place (which the move has given back, so a run
    /// with a tail there would hold less than asked): `try_block` says so, and `block` in
    /// another thread waits until the move is done.
    #[test]
    fn a_moving_block_is_read_once_its_move_is_done() {
        let p = Pool::new(PoolConfig::new(16 << 20).cores(1).backing(Backing::None)).unwrap();
        let h = p.alloc(3 * (2 << 20) + 1, None, 0).unwrap();
        let before = p.block(h).unwrap();
        assert!(before.block_bytes > before.size);
        p.handles().begin_move(h).unwrap();
        assert_eq!(p.try_block(h), Err(Error::Moving));
        std::thread::scope(|s| {
            let waiting = s.spawn(|| p.block(h));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!waiting.is_finished(), "block() waits while the block moves");
            p.handles().end_move(h);
            assert_eq!(waiting.join().unwrap(), Ok(before.clone()));
        });
        assert_eq!(p.try_block(h), Ok(before));
        p.free(h).unwrap();
    }

    /// A block counts under its tag from its allocation to its free; one asked for with an id
    /// that no name has is stored and counted untagged, and stays so after a name takes the id.
    #[test]
    fn blocks_count_under_their_tags_and_unnamed_ids_count_untagged() {
        let p = Pool::new(PoolConfig::new(16 << 20).cores(1).backing(Backing::None)).unwrap();
        let tagged = |p: &Pool| p.tag_figures().iter().filter(|f| f.blocks_in_use > 0).count();
        let unnamed = p.alloc(1000, None, 1).unwrap();
        assert_eq!(p.block(unnamed).unwrap().tag, 0);
        let id = p.tags().acquire("weights", 1).unwrap();
        assert_eq!(id, 1, "the first name takes id 1");
        let named = p.alloc(3000, None, id).unwrap();
        let figures = p.tag_figures();
        let row = |label: &str| {
            figures
                .iter()
                .find(|f| format!("{:?}", f.label).contains(label))
                .map(|f| (f.blocks_in_use, f.requested_bytes_in_use))
        };
        assert_eq!(row("weights"), Some((1, 3000)));
        assert_eq!(row("Untagged"), Some((1, 1000)));
        p.free(unnamed).unwrap();
        p.free(named).unwrap();
        assert_eq!(tagged(&p), 0, "{:?}", p.tag_figures());
    }
}

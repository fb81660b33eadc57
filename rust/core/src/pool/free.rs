//! Giving blocks back: slab objects to their slab, buddy blocks to their chunk, runs to the
//! global pool. Every path validates the block before it changes anything, and the first
//! atomic release decides who frees a block when two callers race.

use crate::arena::global::ChunkState;
use crate::arena::release::Vouched;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::handle::table::SlotInfo;
use crate::pool::pool::Pool;
use crate::util::cpu;

/// What a release gave back, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// A slab object of this class (its size in bytes second).
    Slab(usize, usize),
    /// A buddy block or a run of this many bytes.
    Block(usize),
}

/// The error for a block that is not there (out of line: the hot path only branches to it).
#[cold]
fn invalid_block(offset: usize, size: usize, reason: &'static str) -> Error {
    Error::InvalidBlock { offset, size, reason }
}

impl Pool {
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

    /// Free every block of `handles`, or none: [`Error::NamedTwice`] for a handle named twice,
    /// else [`Error::Batch`] names the first that is freed, foreign or pinned. Each block is
    /// claimed before any is freed (`HandleTable::claim_for_free`), so a pin or a free that
    /// another thread makes meanwhile either comes first (and the batch frees nothing) or
    /// waits for the batch (and finds its block freed).
    pub fn free_many(&self, handles: &[Handle]) -> Result<()> {
        let _entered = self.enter()?;
        if let Some((first, again)) = Handle::named_twice(handles) {
            return Err(Error::NamedTwice { first, again });
        }
        self.handles.claim_for_free(handles).map_err(|(index, e)| Error::batch(index, e))?;
        let core = cpu::current_core(self.arena.cores.len());
        for (index, &handle) in handles.iter().enumerate() {
            let info = self.handles.remove_claimed(handle);
            self.release_removed(core, handle, info).map_err(|e| Error::batch(index, e))?;
        }
        Ok(())
    }

    /// Free a block of the raw API by its offset and the size it was allocated with. A raw block
    /// keeps no record of its size: an offset or size that names no allocated bytes is
    /// refused, but one whose shape matches other allocated bytes at `offset` (a part of a
    /// block, live or freed and kept in a cache of freed blocks, or a block and its neighbour)
    /// is not detected and frees those bytes, which later allocations may then overlap.
    /// Handles ([`Pool::alloc`], [`Pool::free`]) record the offset and the size.
    pub fn free_raw(&self, offset: usize, size: usize) -> Result<()> {
        if size == 0 || size > self.limit || offset >= self.arena.geometry.usable_capacity() {
            return Err(Error::InvalidBlock { offset, size, reason: "outside the arena or empty" });
        }
        let _entered = self.enter()?;
        let released = self.release_block(offset, size, Vouched::No)?;
        self.account_free(released, cpu::current_core(self.arena.cores.len()), size);
        Ok(())
    }

    pub(crate) fn free_entered(&self, handle: Handle) -> Result<()> {
        let core = cpu::current_core(self.arena.cores.len());
        let info = self.handles.remove(handle)?;
        self.release_removed(core, handle, info)
    }

    /// Give back the block of `handle`, just removed from the handle table (`info`: what its
    /// slot recorded), and count and trace its free.
    #[inline(always)]
    fn release_removed(&self, core: usize, handle: Handle, info: SlotInfo) -> Result<()> {
        let stamp = self.trace.stamp();
        // A block larger than every slab class is no slab object: its free skips the slab
        // directory (a load that misses the cache when blocks are freed in random order). The
        // handle vouches for the block: its free need not read the tree to find it there.
        let released = if info.size > self.largest_slab {
            self.release_chunk_block(info.offset, info.size, Vouched::Yes)
        } else {
            self.release_block(info.offset, info.size, Vouched::Yes)
        };
        let released = released.map_err(|err| {
            Error::Corruption(vec![format!(
                "live handle {handle:?} pointed at offset {} ({} bytes) but: {err}",
                info.offset, info.size
            )])
        })?;
        self.counters.with_slot_cache(|cache| self.handles.recycle(core, cache, handle));
        // The pool's counters first, then the tag's (see `Pool::finish`).
        self.account_free(released, core, info.size);
        self.count_tagged_free(info.tag, info.size);
        self.trace.on_free(stamp, core, handle, info.offset, info.size, info.tag);
        Ok(())
    }

    /// Count a free (in the calling thread's counters, under core `core` for a buddy block or a
    /// run).
    #[inline(always)]
    pub(crate) fn account_free(&self, released: Released, core: usize, size: usize) {
        match released {
            Released::Slab(k, bytes) => self.counters.on_slab_free(k, bytes, size),
            Released::Block(bytes) => self.counters.on_free(core, bytes, size),
        }
    }

    /// Count a live block whose bytes went from `old` to `new` (a block with a front that a
    /// compaction moved to whole chunks, `arena/front.rs`).
    pub(crate) fn count_resized(&self, old: usize, new: usize) {
        self.counters.on_resize(old, new);
    }

    /// Release the block at `offset` of `size` requested bytes.
    #[inline(always)]
    pub(crate) fn release_block(&self, offset: usize, size: usize, vouched: Vouched) -> Result<Released> {
        if let Some(slab) = self.arena.slabs.lookup(offset) {
            // A slab object: the fast path (errors are built out of line).
            let bytes = self.arena.slabs.classes.classes[slab.class].size;
            if size > bytes {
                return Err(invalid_block(offset, size, "a slab object is smaller than this"));
            }
            return match self.arena.slabs.free(slab, offset, &self.arena) {
                Ok(freed) => Ok(Released::Slab(freed.class, bytes)),
                Err(reason) => Err(invalid_block(offset, size, reason)),
            };
        }
        self.release_chunk_block(offset, size, vouched)
    }

    /// Whether the free of a block of `size` requested bytes may keep it in a cache of freed
    /// blocks (`arena/block_cache.rs`): it is no slab size (a request of a slab size goes to
    /// its slab, so a cached block of that size would wait for a drain), and the pool is at
    /// most 3/4 full (by the buddy and run bytes in use as the freeing thread can tell,
    /// `Counters::bytes_in_use_estimate`). Fuller, cached blocks would be in the way of the
    /// tree searches: measured with a quarter of the free bytes or less cached, a churn at 88%
    /// failed more often (78 against 64 of 200,000) and each failing allocation, draining the
    /// caches first, took three times as long.
    #[inline]
    fn may_cache(&self, size: usize) -> bool {
        size > self.largest_slab && self.counters.bytes_in_use_estimate() * 4 <= self.capacity() as u64 * 3
    }

    /// Release a buddy block or a run.
    #[inline(never)]
    fn release_chunk_block(&self, offset: usize, size: usize, vouched: Vouched) -> Result<Released> {
        let chunk = self.arena.geometry.chunk_of(offset);
        if chunk >= self.arena.geometry.chunks {
            return Err(invalid_block(offset, size, "outside the arena's chunks"));
        }
        match self.arena.global.state(chunk) {
            ChunkState::RunHead(len) => self.arena.release_run(offset, size, chunk, len).map(Released::Block),
            ChunkState::Core(_) => {
                self.arena.release_buddy(offset, size, self.may_cache(size), vouched).map(Released::Block)
            }
            ChunkState::TailedRunHead(len) => {
                self.arena.release_tailed_run(offset, size, chunk, len).map(Released::Block)
            }
            ChunkState::Free => Err(invalid_block(offset, size, self.arena.why_free_chunk(offset, size))),
            ChunkState::RunBody | ChunkState::FrontedRun { .. } => {
                Err(invalid_block(offset, size, "another block holds these bytes"))
            }
            ChunkState::Absent => Err(invalid_block(offset, size, "outside the pool's regions: no memory is there")),
        }
    }
}

//! Giving buddy blocks and runs back on the free path (runs with a tail: `tail.rs`; blocks with
//! a front: `front.rs`; a buddy block of a cache class may stay in its core's cache of freed
//! blocks instead: `block_cache.rs`), from any thread: each is checked before
//! anything changes, and the first atomic release decides who frees a block when two callers
//! race. A chunk that becomes empty stays as its core's reserve or goes back to the global pool.

use super::arena::Arena;
use super::block_cache::Put;
use super::buddy::Node;
use super::global::ChunkState;
use super::layout::{BuddyLayout, Layout};
use crate::error::{Error, Result};

/// Whether the caller of a free vouches that the block is allocated where it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vouched {
    /// Nobody does (the raw API, a retired slab): a free that keeps the block in a cache
    /// reads its nodes first, and refuses what is not allocated there.
    No,
    /// A live handle's record (kept by the handle table from the block's allocation to its
    /// free), or the allocation that placed the block a moment ago: the nodes are the block's.
    Yes,
}

/// What a drain of the caches of freed blocks does with a chunk it empties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Emptied {
    /// It stays with its core until the next reclaim: statistics read the same after the drain.
    Stay,
    /// It goes back to the global pool or into its core's reserve, as after any free.
    Settle,
}

impl Arena {
    /// Release the run of `len` chunks at chunk `chunk` that holds the block of `size`
    /// requested bytes at `offset`; returns its bytes.
    #[inline]
    pub(crate) fn release_run(&self, offset: usize, size: usize, chunk: usize, len: usize) -> Result<usize> {
        let invalid = |reason| Err(Error::InvalidBlock { offset, size, reason });
        let chunks = (size + self.geometry.chunk_size - 1) >> self.geometry.chunk_shift;
        if self.geometry.unit_in_chunk(offset) != 0 || offset & (self.geometry.min_block - 1) != 0 || chunks != len {
            return invalid("does not match the chunk run there");
        }
        let bytes = self.geometry.run_bytes(chunk, len);
        if !self.free_run(chunk, len) {
            return invalid("the chunk run there was freed already");
        }
        Ok(bytes)
    }

    /// Release the buddy block at `offset` (of `size` requested bytes, in a core chunk);
    /// returns its block bytes. With `room`, a block of a cache class may stay allocated in
    /// its owner's cache of freed blocks instead (`block_cache.rs`): after its nodes were read
    /// allocated, unless the caller vouches for the block.
    pub(crate) fn release_buddy(&self, offset: usize, size: usize, room: bool, vouched: Vouched) -> Result<usize> {
        let invalid = |reason| Err(Error::InvalidBlock { offset, size, reason });
        let chunk = self.geometry.chunk_of(offset);
        let state = (chunk < self.geometry.chunks).then(|| self.global.state(chunk));
        let Some(ChunkState::Core(owner)) = state else {
            return invalid("not inside a core pool's chunk");
        };
        let Layout::Buddy(b) = self.geometry.layout(size, 1) else {
            return self.release_past_chunk(offset, size, "a block of this size would be a chunk run");
        };
        let within = self.geometry.unit_in_chunk(offset);
        // A block starts on a unit; the allocation path puts it at the start of its enclosing
        // node, a compaction may pack it elsewhere (its pieces then cover it all the same).
        if offset & (self.geometry.min_block - 1) != 0 || within + b.units > self.geometry.units_per_chunk() {
            return self.release_past_chunk(offset, size, "not the start of a block of this size");
        }
        if let Some(class) = self.geometry.cache_class(&b) {
            return self.release_cacheable(offset, size, (chunk, owner, within), &b, class, (room, vouched));
        }
        if let Err(reason) = self.give_back_buddy(chunk, owner, &b, within) {
            return invalid(reason);
        }
        Ok(b.units as usize * self.geometry.min_block)
    }

    /// Give the block of a retired slab back to its tree (never to a cache: the slab's owner
    /// keeps no record of it as a block).
    pub(crate) fn release_slab_block(&self, base: usize, bytes: usize) {
        self.release_buddy(base, bytes, false, Vouched::No).expect("a retired slab's block is allocated");
    }

    /// [`Arena::release_buddy`] of a block of cache class `class` at unit `within` of `chunk`
    /// (core `owner`'s): kept in the owner's cache when it has room, else given back to the
    /// tree under the block's granule state (`block_cache.rs`).
    #[inline(always)]
    fn release_cacheable(
        &self,
        offset: usize,
        size: usize,
        (chunk, owner, within): (usize, usize, u64),
        b: &BuddyLayout,
        class: usize,
        (room, vouched): (bool, Vouched),
    ) -> Result<usize> {
        let invalid = |reason| Err(Error::InvalidBlock { offset, size, reason });
        let bytes = b.units as usize * self.geometry.min_block;
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        let mut pieces = b.pieces_at(depth, within);
        let first = pieces.next().expect("a block has at least one node");
        // Without room the block goes to the tree, whose release checks it.
        if room
            && vouched == Vouched::No
            && !(self.shape.is_allocated(tree, first) && pieces.all(|p| self.shape.is_allocated(tree, p)))
        {
            // Not this block: the tree's release finds what is wrong and changes nothing.
            return match self.give_back_buddy(chunk, owner, b, within) {
                Ok(()) => Ok(bytes),
                Err(reason) => invalid(reason),
            };
        }
        // Once the granule says cached, a drain that released the block since the check above
        // shows in its first node.
        let allocated = || self.shape.is_allocated(tree, first);
        let given_back = match self.block_caches.put(owner, class, offset, bytes as u64, room, allocated) {
            Put::Kept => return Ok(bytes),
            Put::Twice => return invalid("the block was freed already"),
            Put::Release => self.give_back_buddy(chunk, owner, b, within),
            Put::ReleaseThenSettle => {
                let given_back = self.give_back_buddy(chunk, owner, b, within);
                self.block_caches.settle(offset);
                given_back
            }
        };
        match given_back {
            Ok(()) => Ok(bytes),
            Err(reason) => invalid(reason),
        }
    }

    /// Give every block the cores' caches of freed blocks hold back to its tree (on a trim, and
    /// before a compaction plans or moves). The chunks stay with their cores, empty or not, so
    /// statistics read the same after a drain as before it; an emptied chunk goes back at the
    /// next reclaim (which each of those callers runs once it changes the pool). Returns the
    /// number of blocks given back.
    pub(crate) fn drain_block_caches(&self) -> usize {
        self.drain_caches_of(None, Emptied::Stay)
    }

    /// [`Arena::drain_block_caches`] for an allocation that is about to fail: each chunk the
    /// drain empties goes back to the global pool (or stays in its core's reserve), as after
    /// any free, so that runs of whole chunks can take it.
    pub(crate) fn drain_block_caches_before_failing(&self) -> usize {
        self.drain_caches_of(None, Emptied::Settle)
    }

    /// [`Arena::drain_block_caches`] of core `core`'s cache alone: when the global pool has no
    /// chunk to grant it, the blocks it keeps are room of its own before room of other cores.
    pub(crate) fn drain_block_cache_of(&self, core: usize) -> usize {
        self.drain_caches_of(Some(core), Emptied::Stay)
    }

    fn drain_caches_of(&self, core: Option<usize>, emptied: Emptied) -> usize {
        let g = &self.geometry;
        let mut chunks: Vec<usize> = Vec::new();
        let bytes_of = |class| g.cached_layout(class).units * g.min_block as u64;
        let release = |offset, class| {
            let b = g.cached_layout(class);
            let chunk = g.chunk_of(offset);
            let ChunkState::Core(owner) = self.global.state(chunk) else {
                debug_assert!(false, "a cached block at {offset} outside a core chunk");
                return;
            };
            // Only a second free of the block racing this drain can have released it first
            // (`block_cache.rs`): then this release fails and changes nothing.
            // A chunk this empties stays with its core until the next reclaim.
            let _ = self.give_back_buddy_in_place(chunk, owner, &b, g.unit_in_chunk(offset));
            chunks.push(chunk);
        };
        let drained = match core {
            None => self.block_caches.drain(bytes_of, release),
            Some(core) => self.block_caches.drain_core(core, bytes_of, release),
        };
        // Many blocks of one chunk given back at once join into stretches longer than what
        // each release raises its chunk's stretch memo to: read the ends of every chunk that
        // is still a core's once, so that the searches for large blocks bound them from the
        // tree as it is now.
        chunks.sort_unstable();
        chunks.dedup();
        for chunk in chunks {
            if !matches!(self.global.state(chunk), ChunkState::Core(_)) {
                continue;
            }
            if !self.chunk_is_empty(chunk) {
                self.read_ends(chunk);
            } else if emptied == Emptied::Settle {
                self.chunk_became_empty(chunk);
            }
        }
        drained
    }

    /// Release the block at `offset` of a core chunk whose `size` is no buddy block there: a
    /// block with a front when its requested bytes cross the chunk's end (`front.rs`), else
    /// `Error::InvalidBlock` with `reason`.
    #[cold]
    fn release_past_chunk(&self, offset: usize, size: usize, reason: &'static str) -> Result<usize> {
        let g = &self.geometry;
        if (g.unit_in_chunk(offset) as usize) * g.min_block + size > g.chunk_size {
            return self.release_fronted(offset, size);
        }
        Err(Error::InvalidBlock { offset, size, reason })
    }

    /// Give back buddy block `b` at unit `within` of chunk `chunk` of core `owner`: its nodes,
    /// then the chunk if that emptied it, else a hint for the owner to the space it left and,
    /// when the block's enclosing node is free now, a record of the largest free node around it
    /// (`core_pool.rs`).
    #[inline(always)]
    pub(crate) fn give_back_buddy(
        &self,
        chunk: usize,
        owner: usize,
        b: &BuddyLayout,
        within: u64,
    ) -> std::result::Result<(), &'static str> {
        if self.give_back_buddy_in_place(chunk, owner, b, within)? {
            self.chunk_became_empty(chunk);
        }
        Ok(())
    }

    /// [`Arena::give_back_buddy`], except that a chunk it empties stays with its core (a drain
    /// of the caches of freed blocks: the chunk was the core's while the block was cached, and
    /// a drain changes nothing that statistics show; the next reclaim gives it back). Returns
    /// whether the chunk is empty now.
    #[inline(always)]
    fn give_back_buddy_in_place(
        &self,
        chunk: usize,
        owner: usize,
        b: &BuddyLayout,
        within: u64,
    ) -> std::result::Result<bool, &'static str> {
        let unmarked = self.unmark_buddy_keeping_ends(chunk, b, within)?;
        if unmarked.after == self.geometry.usable_units(chunk) {
            return Ok(true);
        }
        let depth = self.geometry.depth;
        // The enclosing-sized node around the block's start: the block itself when it is
        // one node (the common case), else where the hint points.
        let e = Node::covering(depth, within & !(b.enclosing - 1), b.enclosing);
        let core = &self.cores[owner];
        core.set_hint_freed(b.level, chunk, e.index);
        // Only a block at its enclosing node's start is recorded: recording the pieces of a
        // trimmed block (or of a packed one) would scatter small blocks over the holes of large
        // ones, which then no longer join into the nodes that large requests need.
        if within & (b.enclosing - 1) == 0 {
            let first = b.pieces_at(depth, within).next().unwrap_or(e);
            let level = unmarked
                .coalesced
                .unwrap_or_else(|| self.shape.coalesced_level_in(self.tree(chunk), first, unmarked.run));
            if level <= b.level {
                core.record_free(level, chunk, within >> (depth - level), unmarked.sole);
            }
        }
        Ok(false)
    }
}

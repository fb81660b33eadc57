//! Giving blocks back: slab objects to their slab, buddy blocks to their chunk, runs to the
//! global pool. Every path validates the block before it changes anything, and the first
//! atomic release decides who frees a block when two callers race.

use crate::arena::buddy::Node;
use crate::arena::global::ChunkState;
use crate::arena::layout::Layout;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::pool::pool::Pool;
use crate::util::cpu;

/// What a release gave back, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// A slab object of this class.
    Slab(usize),
    /// A buddy block or a run of this many bytes.
    Block(usize),
}

/// The error for a block that is not there (out of line: the hot path only branches to it).
#[cold]
fn invalid_block(offset: usize, size: usize, reason: &'static str) -> Error {
    Error::InvalidBlock { offset, size, reason }
}

struct Carver<'a>(&'a Pool);

impl crate::arena::slab::caches::SlabBlocks for Carver<'_> {
    fn carve(&self, _bytes: usize) -> Option<usize> {
        None // a free never carves
    }

    fn release(&self, base: usize, bytes: usize) {
        self.0.release_buddy(base, bytes).expect("a retired slab's block is allocated");
    }
}

impl Pool {
    pub(crate) fn free_entered(&self, handle: Handle) -> Result<()> {
        let core = cpu::current_core(self.cores.len());
        let info = self.handles.remove(handle)?;
        let released = self.release_block(info.offset, info.size).map_err(|err| {
            Error::Corruption(vec![format!(
                "live handle {handle:?} pointed at offset {} ({} bytes) but: {err}",
                info.offset, info.size
            )])
        })?;
        self.handles.recycle(core, handle);
        self.account_free(released, info.size);
        self.trace.on_free(core, handle, info.offset, info.size, info.tag);
        Ok(())
    }

    /// Count a free: per thread for slab objects, per core (the caller's) otherwise.
    #[inline(always)]
    pub(crate) fn account_free(&self, released: Released, size: usize) {
        match released {
            Released::Slab(k) => self.slab_counters.on_free(k, size),
            Released::Block(bytes) => self.counters.on_free(cpu::current_core(self.cores.len()), bytes, size),
        }
    }

    /// Release the block at `offset` of `size` requested bytes.
    #[inline(always)]
    pub(crate) fn release_block(&self, offset: usize, size: usize) -> Result<Released> {
        if let Some(slab) = self.slabs.lookup(offset) {
            // A slab object: the fast path (errors are built out of line).
            if size > self.slabs.classes.classes[slab.class].size {
                return Err(invalid_block(offset, size, "a slab object is smaller than this"));
            }
            return match self.slabs.free(slab, offset, &Carver(self)) {
                Ok(freed) => Ok(Released::Slab(freed.class)),
                Err(reason) => Err(invalid_block(offset, size, reason)),
            };
        }
        self.release_chunk_block(offset, size)
    }

    /// Release a buddy block or a run.
    #[inline(never)]
    fn release_chunk_block(&self, offset: usize, size: usize) -> Result<Released> {
        let chunk = self.geometry.chunk_of(offset);
        if chunk >= self.geometry.chunks {
            return Err(invalid_block(offset, size, "outside the arena's chunks"));
        }
        match self.global.state(chunk) {
            ChunkState::RunHead(len) => self.release_run(offset, size, chunk, len).map(Released::Block),
            ChunkState::Core(_) => self.release_buddy(offset, size).map(Released::Block),
            ChunkState::Free | ChunkState::RunBody => Err(invalid_block(offset, size, "no block starts in this chunk")),
        }
    }

    fn release_run(&self, offset: usize, size: usize, chunk: usize, len: usize) -> Result<usize> {
        let invalid = |reason| Err(Error::InvalidBlock { offset, size, reason });
        let chunks = (size + self.geometry.chunk_size - 1) >> self.geometry.chunk_shift;
        if self.geometry.unit_in_chunk(offset) != 0 || offset & (self.geometry.min_block - 1) != 0 || chunks != len {
            return invalid("does not match the chunk run there");
        }
        if !self.global.swap_state(chunk, ChunkState::RunHead(len), ChunkState::Free) {
            return invalid("the chunk run there was freed already");
        }
        for c in chunk + 1..chunk + len {
            self.global.set_state(c, ChunkState::Free);
        }
        let bytes = self.run_bytes(chunk, len);
        self.global.release(chunk, len);
        Ok(bytes)
    }

    /// Release the buddy block at `offset` (of `size` requested bytes, in a core chunk);
    /// returns its block bytes.
    pub(crate) fn release_buddy(&self, offset: usize, size: usize) -> Result<usize> {
        let invalid = |reason| Err(Error::InvalidBlock { offset, size, reason });
        let chunk = self.geometry.chunk_of(offset);
        let state = (chunk < self.geometry.chunks).then(|| self.global.state(chunk));
        let Some(ChunkState::Core(owner)) = state else {
            return invalid("not inside a core pool's chunk");
        };
        let Layout::Buddy(b) = self.geometry.layout(size, 1) else {
            return invalid("a block of this size would be a chunk run");
        };
        let within = self.geometry.unit_in_chunk(offset);
        // A block starts on a unit; the allocation path puts it at the start of its enclosing
        // node, a compaction may pack it elsewhere (its pieces then cover it all the same).
        if offset & (self.geometry.min_block - 1) != 0 || within + b.units > self.geometry.units_per_chunk() {
            return invalid("not the start of a block of this size");
        }
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        // The enclosing-sized node around the block's start: the block itself when it is one
        // node (the common case), else where the hint points.
        let e = Node::covering(depth, within & !(b.enclosing - 1), b.enclosing);
        if b.is_one_node_at(within) {
            // One node: its release is the check (and decides a race of two callers).
            if self.shape.release(tree, e).is_err() {
                return invalid("the block was freed already");
            }
        } else {
            // Several nodes: all must be allocated before any is freed; the first release
            // decides who frees the block when two callers race.
            if !b.pieces_at(depth, within).all(|p| self.shape.is_allocated(tree, p)) {
                return invalid("no block of this size is allocated there");
            }
            let mut pieces = b.pieces_at(depth, within);
            let first = pieces.next().expect("a block has at least one node");
            if self.shape.release(tree, first).is_err() {
                return invalid("the block was freed already");
            }
            for p in pieces {
                let _ = self.shape.release(tree, p);
            }
        }
        let after = self.space[chunk].give(b.units);
        if after == self.geometry.usable_units(chunk) {
            self.chunk_became_empty(chunk);
        } else {
            self.cores[owner].set_hint(b.level, chunk, self.shape.bunch_of(e));
        }
        Ok(b.units as usize * self.geometry.min_block)
    }

    fn chunk_became_empty(&self, chunk: usize) {
        if let ChunkState::Core(owner) = self.global.state(chunk) {
            let still_reserve = |c: usize| self.global.state(c) == ChunkState::Core(owner) && self.chunk_is_empty(c);
            if !self.cores[owner].keep_in_reserve(chunk, still_reserve) {
                self.retire(chunk, owner);
            }
        }
    }
}

//! Runs with a tail (a pool with `PoolConfig::run_tails`): a block a little over a multiple of
//! the chunk is a run of whole chunks and a *tail*, the first nodes of the chunk after the run, cut like a trimmed buddy block
//! (`Layout::RunTail`). It reserves what its tail rounds up to, at most a granule of the tail's
//! enclosing power of two, instead of one more whole chunk (2 MiB + 1 B takes one chunk and one
//! unit, not two chunks). The tail's chunk is a core chunk of the allocating core: the rest of
//! it serves other blocks.
//!
//! Taking one: the run's chunks and the tail's chunk are claimed from the global pool at once
//! (contiguous and free, so the block never spans two regions: absent chunks are taken), the
//! tail's chunk is granted to the core, the tail's nodes are claimed at its start, and only
//! then the run's chunks are marked, its head last (`TailedRunHead`). A thread holding a stale
//! hint into the granted chunk may claim a node at its start first (or leave a mark there that
//! a sweep cleans): the chunk then stays with the core, the run's chunks go back, and the claim
//! starts again. Each retry follows another
//! allocation's success, so no thread waits for another.
//!
//! Giving one back: the head's state word decides which of two racing frees wins (as for a
//! plain run), then the run's chunks go back to the global pool and the tail is released like
//! any buddy block (its chunk may become empty and go back too).

use super::arena::Arena;
use super::global::ChunkState;
use super::layout::{BuddyLayout, Layout};
use crate::error::{Error, Result};

impl Arena {
    /// Bytes of a run of `chunks` whole chunks from chunk `start` with tail `tail`.
    #[inline]
    pub(crate) fn tailed_run_bytes(&self, start: usize, chunks: usize, tail: &BuddyLayout) -> usize {
        self.geometry.run_bytes(start, chunks) + tail.units as usize * self.geometry.min_block
    }

    /// Take `chunks` whole chunks, starting at a multiple of `align` chunks, and `tail` at the
    /// start of the chunk after them, which goes to core `core`. Returns the run's first chunk.
    pub(crate) fn claim_tailed_run(
        &self,
        chunks: usize,
        align: usize,
        tail: &BuddyLayout,
        core: usize,
    ) -> Option<usize> {
        let g = &self.geometry;
        let bytes = (chunks << g.chunk_shift) + tail.units as usize * g.min_block;
        loop {
            let start = self.global.claim(g, chunks + 1, bytes, align)?;
            let last = start + chunks;
            self.open(last, core);
            if self.take_tail(last, tail) || self.take_tail_swept(last, tail) {
                self.mark_tailed_run(start, chunks);
                return Some(start);
            }
            // A block took the start of the tail's chunk first: the chunk stays with the core.
            self.global.release(start, chunks);
        }
    }

    /// [`Arena::take_tail`] after a sweep of the chunk's tree: a chunk retired once may keep
    /// marks that a stale hint's failed climb left under its closed root, which only a thorough
    /// sweep (`TreeShape::sweep_all`) finds.
    #[cold]
    fn take_tail_swept(&self, chunk: usize, tail: &BuddyLayout) -> bool {
        self.shape.sweep_all(self.tree(chunk));
        self.take_tail(chunk, tail)
    }

    /// Claim the nodes of `tail` at the start of core chunk `chunk`; `false` (and the nodes as
    /// they were) when one of them is taken.
    pub(crate) fn take_tail(&self, chunk: usize, tail: &BuddyLayout) -> bool {
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        for (i, piece) in tail.pieces_at(depth, 0).enumerate() {
            if self.shape.try_alloc(tree, piece).is_err() {
                for taken in tail.pieces_at(depth, 0).take(i) {
                    let _ = self.shape.release(tree, taken);
                }
                if i > 0 {
                    let hidden = self.space[chunk].refresh();
                    self.announce_free(chunk, hidden, tail.pieces_at(depth, 0).take(i));
                }
                return false;
            }
        }
        self.space[chunk].take(tail.units);
        true
    }

    /// Mark chunks `[start, start + len)`, just taken from the global pool, as one run whose
    /// block goes on into a tail.
    pub(crate) fn mark_tailed_run(&self, start: usize, len: usize) {
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::RunBody);
        }
        self.global.set_state(start, ChunkState::TailedRunHead(len));
    }

    /// Release the run of `len` whole chunks at chunk `chunk` and its tail, which hold the block
    /// of `size` requested bytes at `offset`; returns its bytes.
    pub(crate) fn release_tailed_run(&self, offset: usize, size: usize, chunk: usize, len: usize) -> Result<usize> {
        let invalid = |reason| Err(Error::InvalidBlock { offset, size, reason });
        let Layout::RunTail { chunks, tail, .. } = self.geometry.layout(size, 1) else {
            return invalid("a chunk run with a tail starts there, but a block of this size has none");
        };
        if self.geometry.unit_in_chunk(offset) != 0 || offset & (self.geometry.min_block - 1) != 0 || chunks != len {
            return invalid("does not match the chunk run there");
        }
        let last = chunk + len;
        let ChunkState::Core(owner) = self.global.state(last) else {
            return invalid("the chunk after the run holds no tail");
        };
        // The tail's nodes are checked before anything changes (a raw free of the wrong size
        // must not free the run and leave its tail).
        if !tail.pieces_at(self.geometry.depth, 0).all(|p| self.shape.is_allocated(self.tree(last), p)) {
            return invalid("no tail of this size follows the chunk run there");
        }
        if !self.free_run_headed(chunk, len, ChunkState::TailedRunHead(len)) {
            return invalid("the chunk run there was freed already");
        }
        match self.give_back_buddy(last, owner, &tail, 0) {
            Ok(()) => Ok(self.tailed_run_bytes(chunk, len, &tail)),
            Err(reason) => invalid(reason),
        }
    }

    /// Give back the run with a tail of `size` bytes at chunk `start` (`len` whole chunks), as
    /// the exact-position API does: nothing else happens (an emptied chunk stays with its core).
    pub(crate) fn tailed_run_release_raw(&self, start: usize, len: usize, tail: &BuddyLayout) -> Result<(), String> {
        let last = start + len;
        if last >= self.geometry.chunks || !matches!(self.global.state(last), ChunkState::Core(_)) {
            return Err(format!("no tail in chunk {last} after the run at chunk {start}"));
        }
        let depth = self.geometry.depth;
        if !tail.pieces_at(depth, 0).all(|p| self.shape.is_allocated(self.tree(last), p)) {
            return Err(format!("the tail at the start of chunk {last} is not allocated"));
        }
        if !self.free_run_headed(start, len, ChunkState::TailedRunHead(len)) {
            return Err(format!("no run of {len} chunks with a tail starts at chunk {start}"));
        }
        self.unmark_buddy(last, tail, 0).map(|_| ()).map_err(|why| format!("the tail in chunk {last}: {why}"))
    }

    /// Take chunks `[start, start + len)` as a run and `tail` at the start of the core chunk
    /// after them (the exact-position API: a paused pool, the tail's chunk swept before).
    pub(crate) fn tailed_run_reserve_at(&self, start: usize, len: usize, tail: &BuddyLayout) -> Result<(), String> {
        let last = start + len;
        if last >= self.geometry.chunks || !matches!(self.global.state(last), ChunkState::Core(_)) {
            return Err(format!("chunk {last}, after the run, is not a core chunk to hold its tail"));
        }
        if tail.units > self.geometry.usable_units(last) {
            return Err(format!("chunk {last} is too short for the tail"));
        }
        if !self.global.try_take(start, len) {
            return Err(format!("chunks {start}..{last} are not all free"));
        }
        if !self.take_tail(last, tail) {
            self.global.release(start, len);
            return Err(format!("the start of chunk {last} is not free for the tail"));
        }
        self.mark_tailed_run(start, len);
        Ok(())
    }
}

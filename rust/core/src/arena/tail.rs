//! Runs with a tail (`PoolConfig::run_tails`, on by default): a block past a multiple of the
//! chunk is a run of whole chunks and a *tail*, the first nodes of the chunk after the run, cut
//! like a trimmed buddy block (`Layout::RunTail`), where one more whole chunk would waste more
//! than 1/32 of the request. It reserves what its tail rounds up to, at most a granule of the
//! tail's enclosing power of two, instead of one more whole chunk (2 MiB + 1 B takes one chunk
//! and one unit, not two chunks). The tail's chunk is a core chunk: the rest of it serves other
//! blocks.
//!
//! Where one goes (`GlobalPool::choose_tailed`, best fit over the free runs): either the free
//! chunks at the end of a free run and the free start of the core chunk after them (any core's:
//! the hole a freed run with a tail leaves, its chunks and its tail's room, serves its size
//! again), or free chunks and the free chunk after them, which is granted to the allocating
//! core for the tail. Such a chunk's levels are hidden from the core's searches: its rest
//! serves other blocks once a failing allocation reveals it (`reveal.rs`) or a free there
//! announces room, not at once. Small blocks that live long would otherwise settle next to a
//! run that comes and goes, and the chunk would stay with its core after the run is freed,
//! splitting the free chunks around it into runs one chunk too short for the next large block.
//!
//! Taking one: the run's chunks (and a fresh tail chunk) are claimed from the global pool at
//! once (contiguous and free, so the block never spans two regions: absent chunks are taken), a
//! fresh tail chunk is granted to the core, the tail's nodes are claimed at the tail chunk's
//! start, and only then the run's chunks are marked, its head last (`TailedRunHead`). A block
//! may take the start of the tail's chunk first (a thread holding a stale hint into a granted
//! chunk, a search in a shared one): the run's chunks go back, a shared chunk is not tried
//! again by this claim, and the claim starts again. A claimed tail keeps its chunk from being
//! retired (a retire needs the whole tree free), so the chunk stays a core chunk while the run
//! lives. Each retry follows another allocation's success or drops a candidate, so no thread
//! waits for another. The exclusion rests on the claims the loom models check: chunks taken
//! from the global pool (`global.rs`), and tree nodes, where a node and its ancestor or a
//! cleaning claim and a leaf never both win (`buddy.rs`).
//!
//! Giving one back: the head's state word decides which of two racing frees wins (as for a
//! plain run), then the run's chunks go back to the global pool and the tail's nodes are
//! released; a tail chunk that this empties is retired with the run, not kept in its core's
//! reserve, so the chunks join again.

use super::arena::Arena;
use super::global::{ChunkState, FreeRun, TailSpot};
use super::layout::{BuddyLayout, Layout};
use super::stretches::granule_shift;
use crate::error::{Error, Result};

impl Arena {
    /// Bytes of a run of `chunks` whole chunks from chunk `start` with tail `tail`.
    #[inline]
    pub(crate) fn tailed_run_bytes(&self, start: usize, chunks: usize, tail: &BuddyLayout) -> usize {
        self.geometry.run_bytes(start, chunks) + tail.units as usize * self.geometry.min_block
    }

    /// Take `chunks` whole chunks, starting at a multiple of `align` chunks, and `tail` at the
    /// start of the chunk after them: a core chunk whose start is free (any core's), or a free
    /// chunk, which goes to core `core` (`GlobalPool::choose_tailed` picks). Returns the run's
    /// first chunk.
    pub(crate) fn claim_tailed_run(
        &self,
        chunks: usize,
        align: usize,
        tail: &BuddyLayout,
        core: usize,
    ) -> Option<usize> {
        let g = &self.geometry;
        let bytes = (chunks << g.chunk_shift) + tail.units as usize * g.min_block;
        // Core chunks whose start a block took before this claim could (not retried).
        let mut refused: Vec<usize> = Vec::new();
        loop {
            let epoch = self.global.epoch();
            let runs = self.global.free_runs(&[]);
            let mut shares = |chunk: usize| !refused.contains(&chunk) && self.tail_fits_at_start(chunk, tail.units);
            match self.global.choose_tailed(g, &runs, chunks, bytes, align, &mut shares) {
                Some(spot) => {
                    if let Some(start) = self.try_tailed_at(spot, chunks, tail, core, &mut refused) {
                        return Some(start);
                    }
                }
                None => {
                    if self.global.epoch() == epoch {
                        return None;
                    }
                }
            }
        }
    }

    /// Try to take the run of `chunks` whole chunks with `tail` at `spot`; its first chunk, or
    /// `None` when a claim failed (a shared tail chunk whose start a block took first goes into
    /// `refused`).
    pub(crate) fn try_tailed_at(
        &self,
        spot: TailSpot,
        chunks: usize,
        tail: &BuddyLayout,
        core: usize,
        refused: &mut Vec<usize>,
    ) -> Option<usize> {
        match spot {
            TailSpot::Fresh(start) => {
                if !self.global.try_take(start, chunks + 1) {
                    return None;
                }
                let last = start + chunks;
                self.open(last, core);
                self.hide_rest_of(last, core);
                if self.take_tail(last, tail) || self.take_tail_swept(last, tail) {
                    self.mark_tailed_run(start, chunks);
                    return Some(start);
                }
                // A block took the start of the tail's chunk first: the chunk stays with
                // the core.
                self.global.release(start, chunks);
                None
            }
            TailSpot::Shared(start) => {
                if !self.global.try_take(start, chunks) {
                    return None;
                }
                let last = start + chunks;
                if self.take_tail(last, tail) {
                    // Its tail's nodes are held: the chunk cannot be retired under it.
                    self.mark_tailed_run(start, chunks);
                    return Some(start);
                }
                self.global.release(start, chunks);
                refused.push(last);
                None
            }
        }
    }

    /// Hide every level of chunk `chunk`, just granted to core `core` for a tail, from the
    /// core's searches: the rest of a tail's chunk serves other blocks only when nothing else
    /// can (a failing allocation reveals it, `reveal.rs`) or once a free there announces room.
    /// Small blocks that live long would otherwise settle next to a run that comes and goes,
    /// and the chunk would stay with its core after the run is freed, splitting the free
    /// chunks around it into runs too short for the next large block.
    pub(crate) fn hide_rest_of(&self, chunk: usize, core: usize) {
        if let Some(probe) = self.lines[chunk].space.probe(0) {
            self.cores[core].maps.hide(&self.lines[chunk].space, chunk, self.geometry.depth, probe);
            self.hidden_rests.add(chunk);
        }
    }

    /// Whether core chunk `chunk` looks free over its first `units` units now (its tree read
    /// once; a claim decides).
    pub(crate) fn tail_fits_at_start(&self, chunk: usize, units: u64) -> bool {
        matches!(self.global.state(chunk), ChunkState::Core(_))
            && units <= self.geometry.usable_units(chunk)
            && self.lines[chunk].space.free_units() >= units
            && self.free_units_at_start(chunk) >= units
    }

    /// The units at the start of core chunk `chunk` that no allocated node covers, in whole
    /// granules of its tree's bitmap (`stretches.rs`), as a read of the whole tree counts them:
    /// read from the chunk's start inwards to the first allocated unit
    /// ([`TreeShape::free_run_around`](super::buddy::TreeShape::free_run_around)), not the
    /// whole tree.
    pub(crate) fn free_units_at_start(&self, chunk: usize) -> u64 {
        let shift = granule_shift(self.geometry.depth);
        let (_, first_allocated) = self.shape.free_run_around(self.tree(chunk), 0, 0);
        ((first_allocated >> shift) << shift).min(self.geometry.usable_units(chunk))
    }

    /// The free units at the start of core chunk `chunk` now, where a tail could go (0 with
    /// `run_tails` off, or when the chunk is not a core chunk).
    pub(crate) fn tail_room_at(&self, chunk: usize) -> u64 {
        if !self.geometry.tails
            || chunk >= self.global.end()
            || !matches!(self.global.state(chunk), ChunkState::Core(_))
        {
            return 0;
        }
        self.free_units_at_start(chunk)
    }

    /// The largest request that free run `run` could hold now: its chunks, with the front the
    /// free end of the core chunk before it could take (`front.rs`) and the tail the free start
    /// of the core chunk after it could (`Geometry::largest_request_in_run`).
    pub(crate) fn largest_block_in_run(&self, run: FreeRun) -> usize {
        let tail_room = self.tail_room_at(run.start + run.len);
        self.geometry.largest_request_in_run((run.start, run.len), self.front_room_before(run), tail_room)
    }

    /// [`Arena::take_tail`] after a sweep of the chunk's tree: a chunk retired once may keep
    /// marks that a stale hint's failed climb left under its closed root, which only a thorough
    /// sweep (`TreeShape::sweep_all`) finds.
    #[cold]
    pub(crate) fn take_tail_swept(&self, chunk: usize, tail: &BuddyLayout) -> bool {
        self.shape.sweep_all(self.tree(chunk));
        self.take_tail(chunk, tail)
    }

    /// Claim the nodes of `tail` at the start of core chunk `chunk` (cleaning phantom marks of
    /// emptied bunches under them); `false` (and the nodes as they were) when one of them is
    /// taken.
    pub(crate) fn take_tail(&self, chunk: usize, tail: &BuddyLayout) -> bool {
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        let before = self.lines[chunk].space.look();
        for (i, piece) in tail.pieces_at(depth, 0).enumerate() {
            if self.shape.try_alloc_cleaning(tree, piece).is_err() {
                for taken in tail.pieces_at(depth, 0).take(i) {
                    let _ = self.shape.release(tree, taken);
                }
                if i > 0 {
                    let hidden = self.lines[chunk].space.refresh();
                    self.announce_free(chunk, hidden, tail.pieces_at(depth, 0).take(i));
                }
                return false;
            }
        }
        self.take_units(chunk, tail.units);
        self.keep_memo_after_claim(chunk, before, 0, tail.units);
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
        match self.unmark_buddy(last, &tail, 0) {
            Ok(after) => {
                // A chunk the tail alone held goes back with the run's chunks (not into the
                // core's reserve), so that they join again.
                if after == self.geometry.usable_units(last) && !self.retire(last, owner) {
                    self.chunk_became_empty(last);
                }
                Ok(self.tailed_run_bytes(chunk, len, &tail))
            }
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

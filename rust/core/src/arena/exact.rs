//! The exact-position API: take the bytes of a buddy block, a chunk run or a whole chunk at the
//! position the caller names, or give them back, with none of the allocation path's side
//! effects (no search, no hint, no chunk going back to the global pool by itself). Compaction
//! uses it on a paused pool, so the only writer is the caller. Whole chunks are
//! `Arena::grant_exact` and `Arena::retire_swept` (`chunks.rs`); slab objects
//! `SlabCaches::claim_at` and `SlabCaches::unclaim_at` (`slab/exact.rs`).
//!
//! The free path (`arena/release.rs`) gives blocks back through the same primitives
//! ([`Arena::unmark_buddy`], [`Arena::free_run`]), after its own checks.

use std::collections::HashSet;

use super::arena::Arena;
use super::buddy::Node;
use super::global::ChunkState;
use super::layout::{BuddyLayout, Layout};

/// Chunks whose buddy tree was swept (`sweep_all`) during the current batch (lazy-coalescing
/// marks cleared: a node is free for `try_alloc` exactly when no block covers any of its units).
#[derive(Default)]
pub(crate) struct Swept(HashSet<usize>);

impl Swept {
    /// Forget every sweep (after blocks were taken and given back again).
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

impl Arena {
    /// The buddy layout of a block of `size` bytes (its shape does not depend on alignment).
    pub(crate) fn buddy_layout(&self, size: usize) -> Option<BuddyLayout> {
        match self.geometry.layout(size, 1) {
            Layout::Buddy(b) => Some(b),
            Layout::Run { .. } => None,
        }
    }

    /// The chunk and first unit of a buddy block of layout `b` at `offset`, if a block can
    /// start there (on a unit, inside one chunk; packed blocks start anywhere the bank rule
    /// allows, which the caller checks).
    fn block_start(&self, offset: usize, b: &BuddyLayout) -> Option<(usize, u64)> {
        let chunk = self.geometry.chunk_of(offset);
        let within = self.geometry.unit_in_chunk(offset);
        if chunk >= self.geometry.chunks
            || offset & (self.geometry.min_block - 1) != 0
            || within + b.units > self.geometry.usable_units(chunk)
        {
            return None;
        }
        Some((chunk, within))
    }

    /// Release the nodes of buddy block `b` that starts at unit `within` of `chunk`, and give
    /// its units back; returns the chunk's free units after. `Err` (and no change) when the
    /// block is not allocated there; of two callers releasing the same block, one gets `Err`.
    #[inline(always)]
    pub(crate) fn unmark_buddy(&self, chunk: usize, b: &BuddyLayout, within: u64) -> Result<u64, &'static str> {
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        if b.is_one_node_at(within) {
            // One node: its release is the check (and decides a race of two callers).
            if self.shape.release(tree, Node::covering(depth, within, b.enclosing)).is_err() {
                return Err("the block was freed already");
            }
        } else {
            // Several nodes: all must be allocated before any is freed; the first release
            // decides who frees the block when two callers race.
            if !b.pieces_at(depth, within).all(|p| self.shape.is_allocated(tree, p)) {
                return Err("no block of this size is allocated there");
            }
            let mut pieces = b.pieces_at(depth, within);
            let first = pieces.next().expect("a block has at least one node");
            if self.shape.release(tree, first).is_err() {
                return Err("the block was freed already");
            }
            for p in pieces {
                let _ = self.shape.release(tree, p);
            }
        }
        Ok(self.space[chunk].give(b.units))
    }

    /// Give back the buddy block of `size` bytes at `offset` (nothing else happens: an emptied
    /// chunk stays with its core).
    pub(crate) fn buddy_release_raw(&self, offset: usize, size: usize) -> Result<(), String> {
        let b = self.buddy_layout(size).ok_or("a block of this size is a chunk run")?;
        let (chunk, start) = self.block_start(offset, &b).ok_or("not the start of a buddy block")?;
        self.unmark_buddy(chunk, &b, start)
            .map(|_| ())
            .map_err(|why| format!("no buddy block of {size} bytes at offset {offset}: {why}"))
    }

    /// Take the buddy block of `size` bytes at `offset` in a core chunk: every unit of it must
    /// be free. The chunk's tree is swept first (once per batch, see [`Swept`]).
    pub(crate) fn buddy_reserve_at(&self, offset: usize, size: usize, swept: &mut Swept) -> Result<(), String> {
        let b = self.buddy_layout(size).ok_or("a block of this size is a chunk run")?;
        let (chunk, start) = self
            .block_start(offset, &b)
            .ok_or_else(|| format!("offset {offset} cannot start a block of {size} bytes inside one chunk"))?;
        if !matches!(self.global.state(chunk), ChunkState::Core(_)) {
            return Err(format!("chunk {chunk} does not belong to a core pool"));
        }
        let tree = self.tree(chunk);
        if swept.0.insert(chunk) {
            self.shape.sweep_all(tree);
        }
        let depth = self.geometry.depth;
        let mut taken: Vec<Node> = Vec::new();
        for p in b.pieces_at(depth, start) {
            if self.shape.try_alloc(tree, p).is_err() {
                for &q in &taken {
                    let _ = self.shape.release(tree, q);
                }
                return Err(format!("the bytes at offset {offset} (+{size}) are not free"));
            }
            taken.push(p);
        }
        self.space[chunk].take(b.units);
        Ok(())
    }

    /// Give the run of `len` chunks at chunk `start` back to the global pool; `false` (and no
    /// change) when no such run starts there (of two callers, one gets `false`).
    #[inline]
    pub(crate) fn free_run(&self, start: usize, len: usize) -> bool {
        if !self.global.swap_state(start, ChunkState::RunHead(len), ChunkState::Free) {
            return false;
        }
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::Free);
        }
        self.global.release(start, len);
        true
    }

    /// Mark chunks `[start, start + len)`, just taken from the global pool, as one run.
    #[inline]
    pub(crate) fn mark_run(&self, start: usize, len: usize) {
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::RunBody);
        }
        self.global.set_state(start, ChunkState::RunHead(len));
    }

    /// Give back the run of `len` chunks starting at chunk `start`.
    pub(crate) fn run_release_raw(&self, start: usize, len: usize) -> Result<(), String> {
        match self.free_run(start, len) {
            true => Ok(()),
            false => Err(format!("no run of {len} chunks starts at chunk {start}")),
        }
    }

    /// Take chunks `[start, start + len)` as one run: all must be free in the global pool.
    pub(crate) fn run_reserve_at(&self, start: usize, len: usize) -> Result<(), String> {
        if start + len > self.geometry.chunks || !self.global.try_take(start, len) {
            return Err(format!("chunks {start}..{} are not all free", start + len));
        }
        self.mark_run(start, len);
        Ok(())
    }
}

//! Metadata at exact positions: giving back and taking a buddy block, a chunk run or a whole
//! chunk where the caller says, with none of the allocation path's side effects (no chunk goes
//! back to the global pool by itself, no search). Only used while the pool is paused, so the
//! only writer is the caller.

use std::collections::HashSet;

use crate::arena::buddy::Node;
use crate::arena::global::ChunkState;
use crate::arena::layout::{BuddyLayout, Layout};
use crate::arena::slab::caches::SlabBlocks;
use crate::pool::pool::Pool;

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

/// Gives a retired slab's block back to the buddy pool (the normal path).
pub(crate) struct BuddyBlocks<'a>(pub(crate) &'a Pool);

impl SlabBlocks for BuddyBlocks<'_> {
    fn carve(&self, _bytes: usize) -> Option<usize> {
        None
    }

    fn release(&self, base: usize, bytes: usize) {
        self.0.release_buddy(base, bytes).expect("a retired slab's block is allocated");
    }
}

impl Pool {
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

    /// Give back the buddy block of `size` bytes at `offset` (nothing else happens: an emptied
    /// chunk stays with its core).
    pub(crate) fn buddy_release_raw(&self, offset: usize, size: usize) -> Result<(), String> {
        let b = self.buddy_layout(size).ok_or("a block of this size is a chunk run")?;
        let (chunk, start) = self.block_start(offset, &b).ok_or("not the start of a buddy block")?;
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        if !b.pieces_at(depth, start).all(|p| self.shape.is_allocated(tree, p)) {
            return Err(format!("no buddy block of {size} bytes is allocated at offset {offset}"));
        }
        for p in b.pieces_at(depth, start) {
            let _ = self.shape.release(tree, p);
        }
        self.space[chunk].give(b.units);
        Ok(())
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

    /// Give back the run of `len` chunks starting at chunk `start`.
    pub(crate) fn run_release_raw(&self, start: usize, len: usize) -> Result<(), String> {
        if !self.global.swap_state(start, ChunkState::RunHead(len), ChunkState::Free) {
            return Err(format!("no run of {len} chunks starts at chunk {start}"));
        }
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::Free);
        }
        self.global.release(start, len);
        Ok(())
    }

    /// Take chunks `[start, start + len)` as one run: all must be free in the global pool.
    pub(crate) fn run_reserve_at(&self, start: usize, len: usize) -> Result<(), String> {
        if start + len > self.geometry.chunks || !self.global.try_take(start, len) {
            return Err(format!("chunks {start}..{} are not all free", start + len));
        }
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::RunBody);
        }
        self.global.set_state(start, ChunkState::RunHead(len));
        Ok(())
    }

    /// Grant free chunk `chunk` to core `owner` (as an allocation would, but this very chunk).
    pub(crate) fn grant_exact(&self, chunk: usize, owner: usize) -> bool {
        if chunk >= self.geometry.chunks || !self.global.try_take(chunk, 1) {
            return false;
        }
        self.global.set_state(chunk, ChunkState::Core(owner));
        self.cores[owner].own(chunk);
        let tree = self.tree(chunk);
        for node in self.retire_nodes(chunk) {
            self.shape.release(tree, node).expect("a chunk in the global pool is retired");
        }
        true
    }

    /// [`Pool::retire`] after a thorough sweep (orphan marks would make it fail).
    pub(crate) fn retire_swept(&self, chunk: usize, owner: usize) -> bool {
        self.shape.sweep_all(self.tree(chunk));
        self.retire(chunk, owner)
    }

    /// Give every empty chunk that cores hold back to the global pool (reserves included: a
    /// compaction wants whole free runs); returns how many went.
    pub(crate) fn retire_empty_chunks(&self) -> usize {
        let mut retired = 0;
        for owner in 0..self.cores.len() {
            let owned: Vec<usize> = self.cores[owner].owned().collect();
            for chunk in owned {
                if self.chunk_is_empty(chunk) && self.retire_swept(chunk, owner) {
                    retired += 1;
                }
            }
        }
        retired
    }

    /// What an allocation does before it fails, now: all-free slabs and empty chunks go back.
    pub(crate) fn reclaim_all(&self) -> usize {
        self.slabs.reclaim(&BuddyBlocks(self)) + self.retire_empty_chunks()
    }
}

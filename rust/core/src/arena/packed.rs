//! Taking a buddy block at the best-fitting free stretch of one chunk, on the allocation path:
//! the last resort before a chunk is given up for a block whose enclosing node is nowhere free
//! (`stretches.rs` explains the stretches and their memo).

use super::arena::Arena;
use super::layout::BuddyLayout;
use super::stretches::{best_fit, granule_shift, MAX_GRANULES};

impl Arena {
    /// Take block `b` in `chunk` at the start of the smallest free stretch that holds it from a
    /// multiple of `align` units (a power of two); returns its start and the stretch's end (in
    /// units). `None` when no stretch holds it, or a concurrent claim took part of the one
    /// found.
    pub(crate) fn take_stretch(&self, chunk: usize, b: &BuddyLayout, align: u64) -> Option<(u64, u64)> {
        let space = &self.space[chunk];
        let probe = space.probe(b.units)?;
        let memo = &self.stretches[chunk];
        if memo.rules_out(probe.epoch(), b.units) {
            return None;
        }
        let depth = self.geometry.depth;
        let shift = granule_shift(depth);
        let granules = self.geometry.units_per_chunk() >> shift;
        let mut bits = [0u64; (MAX_GRANULES / 64) as usize];
        let bits = &mut bits[..granules.div_ceil(64) as usize];
        let tree = self.tree(chunk);
        self.shape.allocated_granules(tree, shift, bits);
        let align_granules = (align >> shift).max(1);
        let len = b.units.div_ceil(1 << shift);
        let (fit, longest) = best_fit(bits, granules, len, align_granules);
        memo.record(probe.epoch(), longest << shift);
        let (start, end) = fit?;
        let (start, end) = (start << shift, end << shift);
        self.claim_at(chunk, b, start).then_some((start, end))
    }

    /// Claim the nodes of block `b` from unit `start` of `chunk` (cleaning phantom marks under
    /// them), and count its units as taken; `false` (nothing claimed) when a unit is in use.
    pub(crate) fn claim_at(&self, chunk: usize, b: &BuddyLayout, start: u64) -> bool {
        let depth = self.geometry.depth;
        let tree = self.tree(chunk);
        let space = &self.space[chunk];
        if start + b.units > self.geometry.units_per_chunk() {
            return false;
        }
        for (i, piece) in b.pieces_at(depth, start).enumerate() {
            if self.shape.try_alloc_cleaning(tree, piece).is_err() {
                let taken = || b.pieces_at(depth, start).take(i);
                for p in taken() {
                    let _ = self.shape.release(tree, p);
                }
                if i > 0 {
                    let hidden = space.refresh();
                    self.announce_free(chunk, hidden, taken());
                }
                return false;
            }
        }
        space.take(b.units);
        true
    }
}

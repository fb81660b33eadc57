//! A pool's tags: the name table and the counters by tag (`stats/tags.rs`), and the trace's
//! progress that decides when a recycled tag id may be dropped. The allocation path stores a
//! tag id in the block's slot and does nothing else with tags; the callers that name tags (the
//! Python binding, the C ABI) count their tagged blocks here, each before allocating it and
//! after freeing it. Blocks counted under no tag are the pool's blocks less the tagged ones:
//! nothing counts them one by one (`stats/counters.rs` estimates their peak).

use crate::pool::pool::Pool;
use crate::stats::tags::{TagFigures, TagTable, TraceProgress, UntaggedFigures};

impl Pool {
    /// The pool's tag names and counters by tag.
    #[inline]
    pub fn tags(&self) -> &TagTable {
        &self.tags
    }

    /// How far the trace is, for [`TagTable::release`] and [`TagTable::trace_drained`].
    pub fn trace_progress(&self) -> TraceProgress {
        let s = self.trace_status();
        let consumed = s.drained + s.dropped;
        TraceProgress { recorded: s.recorded, consumed, pending: s.enabled || s.recorded > consumed }
    }

    /// Count `blocks` blocks of `nbytes` requested bytes in all under tag `id`, before they are
    /// allocated: then [`Pool::confirm_tagged_alloc`] if they were, or count them back with
    /// [`Pool::count_tagged_free`] if the allocation failed. Nothing to do for id 0, no tag.
    #[inline]
    pub fn count_tagged_alloc(&self, id: u32, blocks: usize, nbytes: usize) {
        if id != 0 {
            self.tags.on_alloc(id, blocks, nbytes);
            self.counters.on_tagged(nbytes as i64);
        }
    }

    /// The blocks counted under tag `id` with [`Pool::count_tagged_alloc`] were allocated: the
    /// tag's peak takes them in (a failed allocation raises no peak).
    #[inline]
    pub fn confirm_tagged_alloc(&self, id: u32) {
        if id != 0 {
            self.tags.on_allocated(id);
        }
    }

    /// `blocks` blocks of `nbytes` requested bytes in all, tagged `id` and counted under it,
    /// were freed (or could not be allocated).
    #[inline]
    pub fn count_tagged_free(&self, id: u32, blocks: usize, nbytes: usize) {
        if id != 0 {
            self.tags.on_free(id, blocks, nbytes);
            self.counters.on_tagged(-(nbytes as i64));
        }
    }

    /// The figures of every tag that has had a block, and of the blocks counted under no tag,
    /// largest bytes in use first.
    pub fn tag_figures(&self) -> Vec<TagFigures> {
        let (blocks, requested, slab_requested) = self.blocks_and_requested();
        let untagged = self.untagged_of(requested);
        let peak = self.counters.sample_untagged(untagged, slab_requested);
        self.tags.figures(UntaggedFigures {
            blocks_in_use: blocks.saturating_sub(self.tags.tagged_blocks() as u64) as usize,
            requested_bytes_in_use: untagged as usize,
            peak_requested_bytes_in_use: peak as usize,
        })
    }

    /// Every tag's peak back to its bytes in use now, the untagged blocks' too.
    pub fn reset_tag_peaks(&self) {
        self.tags.reset_peaks();
        let (_, requested, slab_requested) = self.blocks_and_requested();
        self.counters.reset_untagged_peak(self.untagged_of(requested), slab_requested);
    }

    /// Give back `blocks` holds on tag `id` (blocks freed, or an allocation that failed).
    #[inline]
    pub fn release_tag(&self, id: u32, blocks: u64) {
        self.tags.release(id, blocks, || self.trace_progress());
    }
}

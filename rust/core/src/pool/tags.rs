//! A pool's tags: the name table and the counters by tag (`stats/tags.rs`), and the trace's
//! progress that decides when a recycled tag id may be dropped. The allocation path stores a
//! tag id in the block's slot and does nothing else with tags; the callers that name tags (the
//! Python binding, the C ABI) count their blocks here.

use crate::pool::pool::Pool;
use crate::stats::tags::{TagTable, TraceProgress};

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

    /// Give back `blocks` holds on tag `id` (blocks freed, or an allocation that failed).
    #[inline]
    pub fn release_tag(&self, id: u32, blocks: u64) {
        self.tags.release(id, blocks, || self.trace_progress());
    }
}

//! A pool's tags: the name table and the counters by tag (`stats/tags.rs`), and the trace's
//! progress that decides when a recycled tag id may be dropped. The allocation path stores a
//! tag id in the block's slot and counts the block under it once it is made, and a free counts
//! it back, both inside the call (so a pause sees the figures by tag add up to the blocks);
//! the callers that name tags (the Python binding, the C ABI) hold the tag's id meanwhile
//! ([`Pool::release_tag`]). Blocks counted under no tag are the pool's blocks less the tagged
//! ones: nothing counts them one by one (`stats/counters.rs` estimates their peak).

use crate::error::Result;
use crate::pool::pool::Pool;
use std::collections::HashSet;

use crate::stats::tags::{TagFigures, TagTable, TraceProgress, TraceTags, UntaggedFigures};

impl Pool {
    /// The pool's tag names and counters by tag.
    #[inline]
    pub fn tags(&self) -> &TagTable {
        &self.tags
    }

    /// Where the trace stands, for [`TagTable::release`] and [`TagTable::trace_drained`].
    pub fn trace_progress(&self) -> TraceProgress {
        let s = self.trace_status();
        TraceProgress { pending: s.enabled || s.recorded > s.drained + s.dropped, capacity: s.capacity }
    }

    /// Drop the tag ids the trace no longer names, after a drain whose events' names were read
    /// under a [`TagTable::pin`] taken before it.
    pub fn trace_drained_tags(&self) {
        self.tags.trace_drained(self);
    }

    /// Count a block of `nbytes` requested bytes, just made, under tag `id` (nothing for id 0,
    /// no tag): its bytes in use and its peak.
    #[inline]
    pub(crate) fn count_tagged_alloc(&self, id: u32, nbytes: usize) {
        if id != 0 {
            self.tags.on_alloc(id, 1, nbytes);
            self.counters.on_tagged(nbytes as i64);
            self.tags.on_allocated(id);
        }
    }

    /// A block of `nbytes` requested bytes, tagged `id`, was freed.
    #[inline]
    pub(crate) fn count_tagged_free(&self, id: u32, nbytes: usize) {
        if id != 0 {
            self.tags.on_free(id, 1, nbytes);
            self.counters.on_tagged(-(nbytes as i64));
        }
    }

    /// The figures of every tag that has had a block, and of the blocks counted under no tag,
    /// largest bytes in use first.
    pub fn tag_figures(&self) -> Vec<TagFigures> {
        self.counters.mark_slab_sample(false, true);
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
        self.counters.mark_slab_sample(false, true);
        let (_, requested, slab_requested) = self.blocks_and_requested();
        self.counters.reset_untagged_peak(self.untagged_of(requested), slab_requested);
    }

    /// Give back `blocks` holds on tag `id` (blocks freed, or an allocation that failed);
    /// refused, with nothing changed, for more holds than `id` has ([`TagTable::release`]).
    #[inline]
    pub fn release_tag(&self, id: u32, blocks: u64) -> Result<()> {
        self.tags.release(id, blocks, self)
    }
}

impl TraceTags for Pool {
    fn progress(&self) -> TraceProgress {
        self.trace_progress()
    }

    fn tags_named(&self, out: &mut HashSet<u32>) {
        self.trace.tags_named(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::handle::id::Handle;
    use crate::stats::tags::{IDLE_TAGS, NAMED_TAGS};
    use crate::trace::event::EventKind;
    use std::collections::HashMap;

    /// A pool whose named tags are all taken, so every later name is pooled (recycled).
    fn pool(cores: usize) -> Pool {
        let p = Pool::new(PoolConfig::new(16 << 20).cores(cores)).unwrap();
        for i in 0..NAMED_TAGS {
            p.tags().acquire(&format!("named-{i}"), 0).unwrap();
        }
        p
    }

    fn alloc_tagged(p: &Pool, name: &str) -> Handle {
        let id = p.tags().acquire(name, 1).unwrap();
        assert!(id > NAMED_TAGS);
        p.alloc(128, None, id).unwrap()
    }

    fn free_tagged(p: &Pool, h: Handle) {
        let tag = p.block(h).unwrap().tag;
        p.free(h).unwrap();
        p.release_tag(tag, 1).unwrap();
    }

    /// Names the table may keep beside those of live blocks and of events in the rings.
    fn bound(p: &Pool) -> usize {
        NAMED_TAGS as usize + IDLE_TAGS + 2 * p.trace_status().capacity.max(4096) + 64
    }

    /// Allocate and free a block under each of `names` fresh tags, remembering each handle's tag.
    fn cycle(p: &Pool, from: usize, names: usize, tags: &mut HashMap<u128, String>) {
        for i in from..from + names {
            let name = format!("req-{i}");
            let h = alloc_tagged(p, &name);
            tags.insert(h.to_bits(), name);
            free_tagged(p, h);
        }
    }

    /// Every drained event carries the tag its block was allocated with.
    fn check_names(p: &Pool, tags: &HashMap<u128, String>) -> usize {
        let events = p.trace_drain().unwrap();
        for e in &events {
            assert_eq!(p.tags().name(e.tag).as_deref(), tags.get(&e.handle).map(String::as_str), "{e:?}");
        }
        events.len()
    }

    #[test]
    fn an_undrained_trace_keeps_the_tag_table_bounded() {
        let p = pool(2);
        p.trace_start(4096).unwrap();
        let mut tags = HashMap::new();
        for round in 0..10 {
            cycle(&p, round * 20_000, 20_000, &mut tags);
            assert!(p.tags().interned() <= bound(&p), "{} names interned", p.tags().interned());
        }
        let st = p.trace_status();
        assert_eq!(st.recorded, 400_000);
        assert!(st.dropped >= 400_000 - st.capacity as u64, "overwritten events count as dropped: {st:?}");
        assert_eq!(check_names(&p, &tags), p.trace_status().drained as usize);
    }

    /// A thread records an event naming a tag, then records nothing more: its ring keeps the
    /// event while another thread cycles through many tags (and their recycled ids).
    fn a_quiet_thread_keeps_its_tag_named(cores: usize) {
        let p = pool(cores);
        p.trace_start(64).unwrap();
        let mut tags = HashMap::new();
        // The main thread records first, so it owns the first single-writer ring.
        let h = p.alloc(64, None, 0).unwrap();
        p.free(h).unwrap();
        let (h, quiet_id) = std::thread::scope(|s| {
            s.spawn(|| {
                // With one core the main thread owns the only single-writer ring: this thread
                // writes to the shared ring.
                let h = alloc_tagged(&p, "quiet");
                let id = p.block(h).unwrap().tag;
                free_tagged(&p, h);
                (h, id)
            })
            .join()
            .unwrap()
        });
        tags.insert(h.to_bits(), "quiet".to_string());
        cycle(&p, 0, 50_000, &mut tags);
        assert!(p.tags().interned() <= bound(&p), "{} names interned", p.tags().interned());
        let events = p.trace_drain().unwrap();
        let quiet: Vec<_> = events.iter().filter(|e| e.tag == quiet_id).collect();
        assert_eq!(quiet.len(), 2, "the quiet ring's alloc and free are kept");
        assert_eq!(quiet.iter().map(|e| e.kind).collect::<Vec<_>>(), vec![EventKind::Alloc, EventKind::Free]);
        for e in &events {
            assert_eq!(p.tags().name(e.tag).as_deref(), tags.get(&e.handle).map(String::as_str), "{e:?}");
        }
    }

    #[test]
    fn a_quiet_single_writer_ring_keeps_the_names_of_its_events() {
        a_quiet_thread_keeps_its_tag_named(2);
    }

    #[test]
    fn a_quiet_shared_ring_keeps_the_names_of_its_events() {
        a_quiet_thread_keeps_its_tag_named(1);
    }
}

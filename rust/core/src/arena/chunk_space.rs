//! What a core's search needs to know about a chunk before it reads the chunk's tree: how many
//! units are free, and whether a search for a block this large already failed there since the
//! last free.
//!
//! A core tries its chunks in address order (first fit keeps the high chunks whole for large
//! blocks), so a full or fragmented chunk low in the arena would be searched by every allocation
//! that passes it. The *miss memo* avoids that: a search that finds no free node at `level`
//! records it together with the chunk's *free epoch*, which every free advances. While the epoch
//! is unchanged, no node at that level or above can have come free, so later searches for blocks
//! that large skip the chunk without reading its tree.
//!
//! One word holds both counters, so an allocation and a free still cost one atomic operation on
//! the chunk: the low 32 bits are the free units, the high 32 bits the free epoch.
//!
//! The memo is exact under one condition: a search must read the epoch (`probe`) before it reads
//! the tree, and a free must release its tree nodes before it advances the epoch (`give`). Then
//! a search that missed a freed node took its epoch before that free's epoch step, and the memo
//! it records is stale on arrival. A search can still fail spuriously under contention (a node
//! being cleaned by another thread, a claim that lost a race to an allocation freed later); its
//! memo then hides room until the next free in the chunk, so the allocation path ends with a
//! search that ignores the memos before it reports that memory is exhausted.
//!
//! An all-zero word is a *pristine* chunk: one that was never granted to a core, whose tree is
//! all zero too (see `chunks.rs`). Every chunk that was ever granted has a non-zero word while it
//! is in the global pool (all its usable units count as free there), so the two never mix up.

use crate::util::sync::{AtomicU64, Ordering};

const UNITS_MASK: u64 = (1 << 32) - 1;
const EPOCH_STEP: u64 = 1 << 32;

/// The free-space word of one chunk and its miss memo, alone on a pair of cache lines (both
/// change on allocations and frees in the chunk; chunks of different cores must not share a
/// line, nor an adjacent-line prefetch pair).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct ChunkSpace {
    /// `epoch << 32 | free units`.
    free: AtomicU64,
    /// `epoch << 8 | (level + 1)` of the last search that found nothing, 0 for none.
    miss: AtomicU64,
}

// SAFETY: two atomic words; all zero is a pristine chunk.
unsafe impl crate::util::zeroed::Zeroable for ChunkSpace {}

/// The state of a chunk seen by [`ChunkSpace::probe`], to hand to [`ChunkSpace::missed`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe(u64);

impl ChunkSpace {
    /// A chunk with `units` free units (at most 2^32 - 1).
    #[cfg(test)]
    pub(crate) fn new(units: u64) -> ChunkSpace {
        assert!(units <= UNITS_MASK, "a chunk has at most 2^32 - 1 units");
        ChunkSpace { free: AtomicU64::new(units), miss: AtomicU64::new(0) }
    }

    /// Whether the chunk was never granted to a core (its word was never set). Only meaningful
    /// for a chunk no core owns: a full chunk's word is zero too after 2^32 epochs.
    pub(crate) fn is_pristine(&self) -> bool {
        self.free.load(Ordering::Acquire) == 0
    }

    /// Set a pristine chunk's free units (`units` > 0), before anyone else can reach it.
    pub(crate) fn init(&self, units: u64) {
        assert!(units > 0 && units <= UNITS_MASK, "a chunk has between 1 and 2^32 - 1 units");
        self.free.store(EPOCH_STEP | units, Ordering::Release);
        self.miss.store(0, Ordering::Relaxed);
    }

    /// The whole word, `epoch << 32 | free units`: it changes with every allocation and free
    /// in the chunk (a compaction planned while the pool ran compares it to tell which chunks
    /// changed since).
    pub(crate) fn word(&self) -> u64 {
        self.free.load(Ordering::Acquire)
    }

    /// Free units now.
    #[inline]
    pub(crate) fn free_units(&self) -> u64 {
        self.free.load(Ordering::Acquire) & UNITS_MASK
    }

    /// Count `units` as allocated (after the tree nodes were claimed).
    #[inline]
    pub(crate) fn take(&self, units: u64) {
        self.free.fetch_sub(units, Ordering::AcqRel);
    }

    /// Count `units` as free again and advance the epoch; call after the tree nodes were
    /// released. Returns the free units after.
    #[inline]
    pub(crate) fn give(&self, units: u64) -> u64 {
        let after = self.free.fetch_add(EPOCH_STEP + units, Ordering::AcqRel) + units;
        after & UNITS_MASK
    }

    /// Advance the epoch without a free: nodes came back that no free counted (a chunk granted
    /// to a core, claims rolled back), so no recorded miss may stand.
    #[inline]
    pub(crate) fn refresh(&self) {
        self.free.fetch_add(EPOCH_STEP, Ordering::AcqRel);
    }

    /// Whether a search for a block of `units` units at tree level `level` may succeed here:
    /// `None` when too few units are free or (unless `ignore_memo`) a search at `level` or a
    /// lower level (a smaller block) found nothing since the last free.
    #[inline]
    pub(crate) fn probe(&self, level: u32, units: u64, ignore_memo: bool) -> Option<Probe> {
        let word = self.free.load(Ordering::Acquire);
        if word & UNITS_MASK < units {
            return None;
        }
        if !ignore_memo {
            let miss = self.miss.load(Ordering::Relaxed);
            if miss >> 8 == word >> 32 && u64::from(level) < miss & 0xFF {
                return None;
            }
        }
        Some(Probe(word >> 32))
    }

    /// Record that a search at `level` (with natural alignment) found nothing after `probe`.
    #[inline]
    pub(crate) fn missed(&self, probe: Probe, level: u32) {
        let epoch = probe.0 & ((1 << 56) - 1);
        let seen = self.miss.load(Ordering::Relaxed);
        if seen >> 8 == epoch && seen & 0xFF > u64::from(level) {
            return; // a search for a smaller block already failed in this epoch
        }
        self.miss.store(epoch << 8 | (u64::from(level) + 1), Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_units_through_takes_and_gives() {
        let s = ChunkSpace::new(8192);
        s.take(100);
        assert_eq!(s.free_units(), 8092);
        assert_eq!(s.give(100), 8192);
        assert_eq!(s.free_units(), 8192);
    }

    #[test]
    fn a_miss_hides_the_chunk_for_that_size_and_larger_until_a_free() {
        let s = ChunkSpace::new(8192);
        s.take(4096);
        let probe = s.probe(5, 64, false).expect("room by count");
        s.missed(probe, 5);
        assert!(s.probe(5, 64, false).is_none(), "same level skipped");
        assert!(s.probe(3, 64, false).is_none(), "larger blocks (lower levels) skipped");
        assert!(s.probe(6, 32, false).is_some(), "smaller blocks are still searched");
        assert!(s.probe(5, 64, true).is_some(), "an exhaustive search ignores the memo");
        s.take(1);
        assert!(s.probe(5, 64, false).is_none(), "an allocation frees nothing");
        s.give(1);
        assert!(s.probe(5, 64, false).is_some(), "a free may have made room");
        s.missed(s.probe(5, 64, false).unwrap(), 5);
        s.refresh();
        assert!(s.probe(5, 64, false).is_some(), "room returned without a free");
        assert_eq!(s.free_units(), 4096);
    }

    #[test]
    fn the_memo_keeps_the_smallest_failed_block() {
        let s = ChunkSpace::new(8192);
        let p = s.probe(7, 1, false).unwrap();
        s.missed(p, 7);
        s.missed(p, 4); // a larger block failed too: the memo still covers level 7
        assert!(s.probe(7, 1, false).is_none());
        assert!(s.probe(8, 1, false).is_some());
    }

    #[test]
    fn too_few_units_is_a_miss_without_a_memo() {
        let s = ChunkSpace::new(16);
        s.take(10);
        assert!(s.probe(0, 16, false).is_none());
        assert!(s.probe(3, 6, false).is_some());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! The memo's ordering rule against a real tree: a search that records a miss concurrently
    //! with a free never hides the freed block from later searches.
    use super::*;
    use crate::arena::buddy::{Node, TreeShape};
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn a_miss_racing_a_free_never_hides_the_freed_block() {
        loom::model(|| {
            let shape = Arc::new(TreeShape::with_heights(2, 1, 1));
            let tree: Arc<Vec<AtomicU64>> = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
            let space = Arc::new(ChunkSpace::new(4));
            // Leaves 0 and 2 taken: two units free by count, but no free pair (level 1) until
            // leaf 0 comes back.
            for index in [0, 2] {
                shape.try_alloc(&tree, Node { level: 2, index }).unwrap();
                space.take(1);
            }
            let (s2, t2, sp2) = (shape.clone(), tree.clone(), space.clone());
            let freer = thread::spawn(move || {
                s2.release(&t2, Node { level: 2, index: 0 }).unwrap();
                sp2.give(1);
            });
            if let Some(probe) = space.probe(1, 2, false) {
                if shape.search(&tree, 1, 1, &mut |_| Ok(())).is_none() {
                    space.missed(probe, 1);
                }
            }
            freer.join().unwrap();
            assert!(space.probe(1, 2, false).is_some(), "the memo hides a pair freed during the search");
            let got = shape.search(&tree, 1, 1, &mut |n| shape.try_alloc(&tree, n));
            assert_eq!(got, Some(Node { level: 1, index: 0 }));
        });
    }
}

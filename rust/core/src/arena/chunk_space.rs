//! What a core's search needs to know about a chunk before it reads the chunk's tree: how many
//! units are free, the chunk's *free epoch* (which every free advances), and the threshold of
//! levels its core's level maps may hide (`level_maps.rs`).
//!
//! One word holds all three, so an allocation and a free still cost one atomic operation on the
//! chunk: bits 0..26 are the free units plus a bias (`BIAS`, below), bits 26..32 the
//! hidden-level threshold, bits 32..64 the free epoch. A search reads the epoch (`probe`) before
//! it reads the tree, and a free releases its tree nodes before it advances the epoch (`give`),
//! which also tells it the threshold: a search that missed a freed node took its epoch before
//! that free's epoch step.
//!
//! The count may fall below zero for a moment: a free releases its nodes before it counts
//! them, and an allocation that claims those nodes meanwhile counts them taken first (two
//! claimers may both pass a check of the count before either takes). The bias keeps such a
//! count inside its bits (it is at most a chunk's units below zero, and a chunk has at most
//! 2^24 units), so the borrow never reaches the threshold or the epoch, and the free's count
//! brings it back; readers see a count below zero as no free units.
//!
//! The rare side of each handshake with a free (a search that records a miss) reads the word
//! with read-modify-write operations (`raise_hidden`, `moved_since`), so that it and a free's
//! `give` are ordered one way or the other; the free itself needs nothing more than its `give`.
//!
//! An all-zero word is a *pristine* chunk: one that was never granted to a core, whose tree is
//! all zero too (see `chunks.rs`). Every chunk that was ever granted has a non-zero word while it
//! is in the global pool (all its usable units count as free there), so the two never mix up.

use crate::util::sync::{AtomicU64, Ordering};

const UNITS_MASK: u64 = (1 << 26) - 1;
/// Added to the free units in the word, so that a count taken below zero for a moment stays in
/// its bits (see the module documentation).
const BIAS: u64 = 1 << 25;
/// The most units a chunk may have: the rest of the units bits above the bias.
const MAX_UNITS: u64 = UNITS_MASK - BIAS;
const HIDDEN_SHIFT: u32 = 26;
const HIDDEN_MASK: u64 = 63 << HIDDEN_SHIFT;
const EPOCH_STEP: u64 = 1 << 32;
const EPOCH_MASK: u64 = (1 << 32) - 1;

/// The epoch a word holds after one step from `before`.
fn stepped(before: u64) -> Probe {
    Probe(((before >> 32) + 1) & EPOCH_MASK)
}

/// The free units a word counts (none while the count is below zero for a moment).
#[inline]
fn units_of(word: u64) -> u64 {
    (word & UNITS_MASK).saturating_sub(BIAS)
}

fn hidden_of(word: u64) -> u32 {
    ((word & HIDDEN_MASK) >> HIDDEN_SHIFT) as u32
}

fn with_hidden(word: u64, level: u32) -> u64 {
    (word & !HIDDEN_MASK) | (u64::from(level) << HIDDEN_SHIFT)
}

/// The free-space word of one chunk. It changes on allocations and frees in the chunk: the
/// arena keeps it with the chunk's other such records on lines of their own (`chunk_line.rs`).
#[derive(Debug, Default)]
pub(crate) struct ChunkSpace {
    /// `epoch << 32 | hidden << 26 | free units`. The owner's level maps set the bits of every
    /// level `>= hidden` for this chunk; below it they may be clear (see `level_maps.rs`).
    free: AtomicU64,
}

// SAFETY: one atomic word; all zero is a pristine chunk.
unsafe impl crate::util::zeroed::Zeroable for ChunkSpace {}

/// The free epoch of a chunk seen by [`ChunkSpace::probe`], to hand to
/// [`ChunkSpace::moved_since`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe(u64);

impl Probe {
    /// The free epoch it saw (32 bits).
    #[inline]
    pub(crate) fn epoch(self) -> u64 {
        self.0
    }

    /// The probe of free epoch `epoch` (its low 32 bits), as a record of free nodes keeps it.
    #[inline]
    pub(crate) fn of(epoch: u64) -> Probe {
        Probe(epoch & EPOCH_MASK)
    }
}

impl ChunkSpace {
    /// A chunk with `units` free units (at most 2^25 - 1).
    #[cfg(test)]
    pub(crate) fn new(units: u64) -> ChunkSpace {
        assert!(units <= MAX_UNITS, "a chunk has at most 2^25 - 1 units");
        ChunkSpace { free: AtomicU64::new(BIAS + units) }
    }

    /// Whether the chunk was never granted to a core (its word was never set: a set word holds
    /// the bias at least).
    pub(crate) fn is_pristine(&self) -> bool {
        self.free.load(Ordering::Acquire) == 0
    }

    /// Set a pristine chunk's free units (`units` > 0), before anyone else can reach it.
    pub(crate) fn init(&self, units: u64) {
        assert!(units > 0 && units <= MAX_UNITS, "a chunk has between 1 and 2^25 - 1 units");
        self.free.store(EPOCH_STEP | (BIAS + units), Ordering::Release);
    }

    /// The whole word: it changes with every allocation and free in the chunk.
    #[cfg(test)]
    pub(crate) fn word(&self) -> u64 {
        self.free.load(Ordering::Acquire)
    }

    /// The word without the hidden-level threshold: it changes with every allocation (the free
    /// units), every free and every refresh (the free epoch) in the chunk, so while it stays
    /// the same the chunk's tree covers the same units (a claim is counted after its nodes are
    /// taken, a release after they are given back). Read it before reading the tree.
    #[inline]
    pub(crate) fn stamp(&self) -> u64 {
        self.free.load(Ordering::Acquire) & !HIDDEN_MASK
    }

    /// Free units now.
    #[inline]
    pub(crate) fn free_units(&self) -> u64 {
        units_of(self.free.load(Ordering::Acquire))
    }

    /// Count `units` as allocated (after the tree nodes were claimed; the count may fall below
    /// zero for a moment, see the module documentation). Returns what [`ChunkSpace::look`]
    /// would read right after: the free units and the epoch.
    #[inline]
    pub(crate) fn take(&self, units: u64) -> (u64, Probe) {
        let before = self.free.fetch_sub(units, Ordering::AcqRel);
        (units_of(before.wrapping_sub(units)), Probe(before >> 32))
    }

    /// Count `units` as free again and advance the epoch; call after the tree nodes were
    /// released. Returns the free units after and the hidden-level threshold.
    #[inline]
    pub(crate) fn give(&self, units: u64) -> (u64, u32) {
        let before = self.free.fetch_add(EPOCH_STEP + units, Ordering::AcqRel);
        (units_of(before + units), hidden_of(before))
    }

    /// [`ChunkSpace::give`], also returning the epoch its step made (the free's own epoch).
    #[inline]
    pub(crate) fn give_stepped(&self, units: u64) -> (u64, u32, Probe) {
        let before = self.free.fetch_add(EPOCH_STEP + units, Ordering::AcqRel);
        (units_of(before + units), hidden_of(before), stepped(before))
    }

    /// [`ChunkSpace::refresh`], also returning the epoch its step made.
    #[inline]
    pub(crate) fn step(&self) -> (u32, Probe) {
        let before = self.free.fetch_add(EPOCH_STEP, Ordering::AcqRel);
        (hidden_of(before), stepped(before))
    }

    /// The hidden-level threshold and the free epoch, from one read.
    #[inline]
    pub(crate) fn threshold(&self) -> (u32, Probe) {
        let word = self.free.load(Ordering::Acquire);
        (hidden_of(word), Probe(word >> 32))
    }

    /// Lower the threshold from `from` to `to`, provided the epoch is still `probe`'s; `false`
    /// (and no change) when the threshold or the epoch moved.
    pub(crate) fn lower_hidden_at(&self, probe: Probe, from: u32, to: u32) -> bool {
        let mut word = self.free.load(Ordering::Acquire);
        loop {
            if hidden_of(word) != from || word >> 32 != probe.0 {
                return false;
            }
            match self.free.compare_exchange_weak(word, with_hidden(word, to), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(seen) => word = seen,
            }
        }
    }

    /// Advance the epoch without a free: nodes came back that no free counted (a chunk granted
    /// to a core, claims rolled back), so no miss seen before may stand. Returns the threshold.
    #[inline]
    pub(crate) fn refresh(&self) -> u32 {
        hidden_of(self.free.fetch_add(EPOCH_STEP, Ordering::AcqRel))
    }

    /// The free units now and the free epoch (as [`ChunkSpace::probe`] sees it), from one read:
    /// a chunk with fewer free units than a block has no free node that holds the block, and
    /// the epoch lets a caller hide it as a search that found nothing does.
    #[inline]
    pub(crate) fn look(&self) -> (u64, Probe) {
        let word = self.free.load(Ordering::Acquire);
        (units_of(word), Probe(word >> 32))
    }

    /// [`ChunkSpace::look`], unless every level of a tree of `depth` levels below its root is
    /// hidden: the rest of a chunk granted for a run's tail, hidden on purpose until a free
    /// there or a failing allocation shows it (`tail.rs`).
    #[inline]
    pub(crate) fn look_shown(&self, depth: u32) -> Option<(u64, Probe)> {
        let word = self.free.load(Ordering::Acquire);
        (hidden_of(word) <= depth).then_some((units_of(word), Probe(word >> 32)))
    }

    /// The epoch now, if at least `units` units are free (else a search cannot succeed).
    #[inline]
    pub(crate) fn probe(&self, units: u64) -> Option<Probe> {
        let word = self.free.load(Ordering::Acquire);
        (units_of(word) >= units).then_some(Probe(word >> 32))
    }

    /// Whether a free (or a refresh) came since `probe`. A read-modify-write: see the module
    /// documentation.
    #[inline]
    pub(crate) fn moved_since(&self, probe: Probe) -> bool {
        self.free.fetch_add(0, Ordering::AcqRel) >> 32 != probe.0
    }

    /// The hidden-level threshold.
    #[inline]
    pub(crate) fn hidden(&self) -> u32 {
        hidden_of(self.free.load(Ordering::Acquire))
    }

    /// Raise the threshold to at least `level`, unless a free came since `probe` (then `false`
    /// and no change).
    pub(crate) fn raise_hidden(&self, level: u32, probe: Probe) -> bool {
        let mut word = self.free.load(Ordering::Acquire);
        loop {
            if word >> 32 != probe.0 {
                return false;
            }
            if hidden_of(word) >= level {
                // Still an RMW, to order this miss against any free that follows.
                return self.free.fetch_add(0, Ordering::AcqRel) >> 32 == probe.0;
            }
            match self.free.compare_exchange_weak(word, with_hidden(word, level), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(seen) => word = seen,
            }
        }
    }

    /// Nothing hidden (a chunk whose every level was just announced).
    pub(crate) fn reset_hidden(&self) {
        let mut word = self.free.load(Ordering::Acquire);
        while hidden_of(word) != 0 {
            match self.free.compare_exchange_weak(word, with_hidden(word, 0), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(seen) => word = seen,
            }
        }
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
        assert_eq!(s.give(100), (8192, 0));
        assert_eq!(s.free_units(), 8192);
    }

    /// A claim of nodes that a free released but has not counted yet takes the count below
    /// zero until the free counts them: the threshold and the epoch stay as they were, readers
    /// see no free units, and the free's count brings the count back.
    #[test]
    fn a_count_below_zero_for_a_moment_leaves_the_threshold_and_the_epoch_alone() {
        let s = ChunkSpace::new(16);
        s.take(13);
        let probe = s.probe(0).unwrap();
        assert!(s.raise_hidden(4, probe));
        s.take(46);
        assert_eq!((s.free_units(), s.hidden()), (0, 4));
        assert!(s.probe(1).is_none(), "no free units while below zero");
        assert!(!s.moved_since(probe), "an allocation is no epoch step");
        assert_eq!(s.give(46), (3, 4));
        assert_eq!((s.free_units(), s.hidden()), (3, 4));
        assert_eq!(s.threshold().1.epoch(), probe.epoch() + 1, "one step: the free's");
        // Below zero from a threshold of 0 (the borrow would reach the epoch).
        let s = ChunkSpace::new(0);
        let probe = s.probe(0).unwrap();
        s.take(1 << 24);
        assert_eq!((s.free_units(), s.hidden()), (0, 0));
        assert!(!s.moved_since(probe));
        assert_eq!(s.give(1 << 24), (0, 0));
    }

    #[test]
    fn a_probe_sees_frees_and_refreshes_but_not_allocations() {
        let s = ChunkSpace::new(8192);
        s.take(4096);
        let probe = s.probe(64).expect("room by count");
        assert!(s.probe(4097).is_none(), "too few units");
        s.take(1);
        assert!(!s.moved_since(probe), "an allocation frees nothing");
        s.give(1);
        assert!(s.moved_since(probe), "a free may have made room");
        let probe = s.probe(64).unwrap();
        s.refresh();
        assert!(s.moved_since(probe), "room returned without a free");
    }

    #[test]
    fn the_threshold_rises_and_falls() {
        let s = ChunkSpace::new(16);
        let probe = s.probe(0).unwrap();
        assert!(s.raise_hidden(5, probe));
        assert!(s.raise_hidden(3, probe));
        assert_eq!(s.hidden(), 5);
        assert_eq!(s.give(1), (17, 5), "a free learns the threshold from its own update");
        assert!(!s.raise_hidden(7, probe), "a free came since the probe");
        s.take(1);
        assert_eq!((s.hidden(), s.free_units()), (5, 16));
        let (_, now) = s.threshold();
        assert!(!s.lower_hidden_at(now, 4, 1));
        assert!(!s.lower_hidden_at(probe, 5, 1), "an epoch that a free moved on");
        assert!(s.lower_hidden_at(now, 5, 1));
        assert_eq!(s.hidden(), 1);
        s.reset_hidden();
        assert_eq!(s.hidden(), 0);
    }
}

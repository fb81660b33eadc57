//! The free runs at the two ends of a chunk, as a search may know them without reading the
//! chunk's tree: its *free start* (the units from unit 0 up to the first allocated one) and its
//! *free end* (the units after the last allocated one). A block of at most two chunks that
//! straddles the boundary of two core chunks needs the free end of one and the free start of
//! the next (`front.rs`); a failing allocation looks at the pairs around every chunk whose
//! stretch memo may hold half its block, so each pair should cost a few loads, not two tree
//! reads.
//!
//! # The record
//!
//! A chunk's [`ChunkEnds`] holds `epoch << 32 | KNOWN | start << 15 | end`: while the chunk's
//! free epoch is `epoch` (`ChunkSpace::look`), its free start is at most `start` units and its
//! free end, from the first bank boundary in it (where a front starts), at most `end` units (0:
//! nothing known; a field of [`SATURATED`] says nothing of its end). It is kept exactly as the stretch memo is kept (`stretches.rs`), and the same rule holds
//! for every writer: a record valid at the chunk's epoch never says an end is shorter than it is.
//! Allocations only shorten the ends, and every free (rollback, grant, reveal) advances the
//! epoch after its nodes are released, so:
//!
//! * A search that read the tree after probing epoch `e` records what it read under `e`
//!   ([`ChunkEnds::record`]). One that missed a free's release probed before that free's step,
//!   so its record names an epoch that is already over.
//! * A free of a buddy block carries a valid record over its own epoch step
//!   ([`ChunkEnds::before_free`], [`ChunkEnds::after_free`], on the free path through
//!   `Arena::unmark_buddy_keeping_ends`). Before it releases anything it reads the epoch `e`
//!   and checks the record is valid at `e`; after its release and step, only when the epoch is
//!   `e + 1` (no other step came between), it writes the record again, valid at `e + 1`: an end
//!   the freed units `[from, to)` cannot reach keeps its bound (the unit that bounded that end
//!   at `e` is still allocated: only this free released anything, and not that unit). An end
//!   they may reach takes, for a buddy block, the bound of the chunk's stretch memo at `e + 1`
//!   (which the same free raised first: every free stretch from a bank boundary is at most
//!   that long, and a free start or a free end from its first bank boundary is such a
//!   stretch), or none, so no tree is read on that path; for the front or the tail of a block
//!   with a front, the free run around the freed units, read from the tree
//!   (`TreeShape::free_run_around`): the unit before it and the unit after it are allocated.
//!   When another step came between, the record stays out of date.
//! * A reveal (`reveal.rs`) releases nothing: it carries a valid record over its step with
//!   nothing raised.
//!
//! No read-modify-write is needed: a record is only ever compared with the epoch its reader
//! probed, and a write that lands late names an epoch that is over. Searches read trees a
//! granule at a time (`stretches.rs`) and the free end counts from a bank boundary: a free
//! whose units come within a granule of the free start's bound, or within a bank of the free
//! end's, counts as reaching it. The loom models below check a record racing a free, a free that
//! raises it racing a search, two frees, and a reveal.

use super::chunk_space::{ChunkSpace, Probe};
use crate::util::sync::{AtomicU64, Ordering};

/// Bits of each end's field; a field holds at most [`SATURATED`] - 1 units exactly.
const FIELD_BITS: u32 = 15;
/// A field that says nothing of its end (it holds that many units or more).
pub(crate) const SATURATED: u64 = (1 << FIELD_BITS) - 1;
/// Set in every record that says something (a word of 0 says nothing).
const KNOWN: u64 = 1 << (2 * FIELD_BITS);
const EPOCH_MASK: u64 = 0xFFFF_FFFF;

/// What a search learnt about the ends of one chunk (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct ChunkEnds(AtomicU64);

// SAFETY: one atomic word; all zero means nothing is known.
unsafe impl crate::util::zeroed::Zeroable for ChunkEnds {}

/// Bounds of a chunk's free start and free end, in units (`u64::MAX`: no bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ends {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

fn field(units: u64) -> u64 {
    units.min(SATURATED)
}

fn bound(field: u64) -> u64 {
    if field == SATURATED {
        u64::MAX
    } else {
        field
    }
}

impl ChunkEnds {
    /// The bounds a search that probed free epoch `epoch` may use, if a record is valid then.
    #[inline]
    pub(crate) fn known(&self, epoch: u64) -> Option<Ends> {
        Self::decode(self.0.load(Ordering::Acquire), epoch)
    }

    #[inline]
    fn decode(word: u64, epoch: u64) -> Option<Ends> {
        (word & KNOWN != 0 && word >> 32 == epoch & EPOCH_MASK)
            .then(|| Ends { start: bound((word >> FIELD_BITS) & SATURATED), end: bound(word & SATURATED) })
    }

    /// A search that probed `epoch` read a free start of at most `start` units and a free end of
    /// at most `end` units.
    #[inline]
    pub(crate) fn record(&self, epoch: u64, start: u64, end: u64) {
        let word = ((epoch & EPOCH_MASK) << 32) | KNOWN | (field(start) << FIELD_BITS) | field(end);
        if self.0.load(Ordering::Relaxed) != word {
            self.0.store(word, Ordering::Release);
        }
    }

    /// Before a free in the chunk releases anything: the chunk's epoch now, if the record is
    /// valid at it (else there is nothing to keep). One load when nothing was ever recorded.
    #[inline(always)]
    pub(crate) fn before_free(&self, space: &ChunkSpace) -> Option<Probe> {
        let word = self.0.load(Ordering::Acquire);
        if word == 0 {
            return None;
        }
        let (_, before) = space.look();
        (word >> 32 == before.epoch()).then_some(before)
    }

    /// After that free released units `[from, to)` of a chunk of `usable` units and advanced
    /// the epoch: when its own step is the only one since `before`, the record (read again: it
    /// bounds the ends at `before`) becomes valid at the new epoch. An end that the freed units
    /// do not come within `slack` units of (a granule for the free start; a bank, or a granule
    /// when larger, for the free end) keeps its bound; an end they may reach takes its bound
    /// from `reached(epoch)`, which says what the ends are at most at the new epoch (from the
    /// chunk's stretch memo, or from the free run around the freed units). Otherwise the
    /// record is left out of date. Returns what it wrote.
    #[inline]
    pub(crate) fn after_free(
        &self,
        space: &ChunkSpace,
        before: Probe,
        (from, to): (u64, u64),
        usable: u64,
        (start_slack, end_slack): (u64, u64),
        reached: impl FnOnce(u64) -> Ends,
    ) -> Option<Ends> {
        let (_, now) = space.look();
        let after = (before.epoch() + 1) & EPOCH_MASK;
        if now.epoch() != after {
            return None;
        }
        let Ends { mut start, mut end } = self.known(before.epoch())?;
        let reaches_start = from <= start.saturating_add(start_slack);
        let reaches_end = to.saturating_add(end).saturating_add(end_slack) >= usable;
        if reaches_start || reaches_end {
            let bound = reached(after);
            if reaches_start {
                start = bound.start;
            }
            if reaches_end {
                end = bound.end;
            }
        }
        self.record(after, start, end);
        Some(Ends { start, end })
    }

    /// After a step that released nothing (a reveal): when it is the only step since `before`,
    /// the record valid at `before` becomes valid at the new epoch as it is.
    #[inline]
    pub(crate) fn after_step(&self, space: &ChunkSpace, before: Probe) {
        let (_, now) = space.look();
        if now.epoch() != (before.epoch() + 1) & EPOCH_MASK {
            return;
        }
        if let Some(Ends { start, end }) = self.known(before.epoch()) {
            self.record(now.epoch(), start, end);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_record_says_something_only_at_its_own_epoch() {
        let r = ChunkEnds::default();
        assert_eq!(r.known(0), None, "nothing known");
        r.record(7, 10, 300);
        assert_eq!(r.known(7), Some(Ends { start: 10, end: 300 }));
        assert_eq!(r.known(8), None, "a free came since");
        assert_eq!(r.known(7 + (1 << 32)), Some(Ends { start: 10, end: 300 }), "epochs on 32 bits");
        r.record(9, 0, 0);
        assert_eq!(r.known(9), Some(Ends { start: 0, end: 0 }), "ends of 0 are known");
        r.record(9, 1 << 20, SATURATED - 1);
        assert_eq!(r.known(9), Some(Ends { start: u64::MAX, end: SATURATED - 1 }), "too long: no bound");
    }

    #[test]
    fn a_free_away_from_the_ends_keeps_them_and_one_at_an_end_takes_the_memo_bound() {
        let space = ChunkSpace::new(100);
        let r = ChunkEnds::default();
        let (_, e) = space.look();
        r.record(e.epoch(), 4, 6);
        let no_memo = |_| -> Ends { unreachable!("a free away from the ends asks nothing") };
        // Units [40, 50) freed: neither end moves.
        let before = r.before_free(&space).unwrap();
        space.give(10);
        assert_eq!(r.after_free(&space, before, (40, 50), 128, (1, 8), no_memo), Some(Ends { start: 4, end: 6 }));
        // Units [4, 9) freed: the free start takes the memo's bound at the new epoch.
        let before = r.before_free(&space).unwrap();
        space.give(5);
        let (_, now) = space.look();
        let memo = |epoch: u64| {
            assert_eq!(epoch, now.epoch(), "the memo at the free's own epoch");
            Ends { start: 12, end: 12 }
        };
        assert_eq!(r.after_free(&space, before, (4, 9), 128, (1, 8), memo), Some(Ends { start: 12, end: 6 }));
        // Within a bank of the free end's bound: it may reach it.
        let before = r.before_free(&space).unwrap();
        space.give(1);
        assert_eq!(
            r.after_free(&space, before, (110, 115), 128, (1, 8), |_| Ends { start: u64::MAX, end: u64::MAX }),
            Some(Ends { start: 12, end: u64::MAX })
        );
        let (_, now) = space.look();
        assert_eq!(r.known(now.epoch()), Some(Ends { start: 12, end: u64::MAX }), "no bound: saturated");
        // Two steps between: out of date.
        let before = r.before_free(&space).unwrap();
        space.give(1);
        space.refresh();
        assert_eq!(r.after_free(&space, before, (60, 61), 128, (1, 8), no_memo), None);
        let (_, now) = space.look();
        assert_eq!(r.known(now.epoch()), None);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! A search that records the ends races a free in the same chunk, and frees that carry the
    //! record race searches, each other and a reveal: afterwards, a record that is valid at the
    //! chunk's epoch never says an end is shorter than the tree has it.
    use super::*;
    use crate::arena::buddy::{Node, TreeShape};
    use crate::arena::loom_chunk::tree_with;
    use loom::sync::Arc;
    use loom::thread;

    /// A chunk's tree (of `depth` levels below the root, bands of height 1), free-space word
    /// and ends record.
    #[derive(Clone)]
    struct Chunk {
        depth: u32,
        shape: Arc<TreeShape>,
        tree: Arc<Vec<AtomicU64>>,
        space: Arc<ChunkSpace>,
        ends: Arc<ChunkEnds>,
    }

    /// A chunk of `1 << depth` units with `taken` allocated, and the record a search made then.
    fn chunk_with(depth: u32, taken: &[Node]) -> Chunk {
        let (shape, tree, space) = tree_with(depth, taken);
        let chunk = Chunk { depth, shape, tree, space, ends: Arc::new(ChunkEnds::default()) };
        search(&chunk);
        chunk
    }

    /// The free start and free end of the tree now.
    fn read_ends(c: &Chunk) -> (u64, u64) {
        let mut bits = [0u64; 1];
        c.shape.allocated_granules(&c.tree, 0, &mut bits);
        let units = 1u64 << c.depth;
        let start = u64::from(bits[0].trailing_zeros()).min(units);
        let last = 64 - u64::from(bits[0].leading_zeros());
        (start, units - last.min(units))
    }

    /// The longest free run of the tree now.
    fn longest_run(c: &Chunk) -> u64 {
        let mut bits = [0u64; 1];
        c.shape.allocated_granules(&c.tree, 0, &mut bits);
        let (mut longest, mut run) = (0, 0);
        for unit in 0..1u64 << c.depth {
            run = if bits[0] & (1 << unit) == 0 { run + 1 } else { 0 };
            longest = longest.max(run);
        }
        longest
    }

    /// A search: probe, read the tree, record.
    fn search(c: &Chunk) {
        let (_, probe) = c.space.look();
        let (start, end) = read_ends(c);
        c.ends.record(probe.epoch(), start, end);
    }

    /// How a free carries the record over its step.
    #[derive(Clone, Copy, PartialEq)]
    enum Keep {
        /// It does not (a release that keeps no record): only the epoch advances.
        No,
        /// As a buddy block's free: a reached end takes a bound of every free stretch (the
        /// tightest a valid stretch memo could give: the longest free run, read after the step).
        Memo,
        /// As the free of a front or a tail: a reached end takes the run around the freed units.
        Run,
    }

    /// A thread that frees `node`, carrying the record as `keep` says.
    fn freer(chunk: &Chunk, node: Node, keep: Keep) -> thread::JoinHandle<()> {
        let c = chunk.clone();
        thread::spawn(move || {
            let before = if keep == Keep::No { None } else { c.ends.before_free(&c.space) };
            c.shape.release(&c.tree, node).unwrap();
            c.space.give(node.units(c.depth));
            if let Some(before) = before {
                let from = node.start(c.depth);
                let to = from + node.units(c.depth);
                let units = 1u64 << c.depth;
                c.ends.after_free(&c.space, before, (from, to), units, (1, 1), |_| match keep {
                    Keep::Memo => Ends { start: longest_run(&c), end: longest_run(&c) },
                    _ => {
                        let (lo, hi) = c.shape.free_run_around(&c.tree, from, to);
                        Ends {
                            start: if lo == 0 { hi } else { lo },
                            end: if hi >= units { units - lo } else { units - hi },
                        }
                    }
                });
            }
        })
    }

    /// The record, when valid at the chunk's epoch now, bounds both ends of the tree.
    fn assert_record_holds(c: &Chunk) {
        let (start, end) = read_ends(c);
        let (_, now) = c.space.look();
        if let Some(known) = c.ends.known(now.epoch()) {
            assert!(known.start >= start, "the record says the free start is {} of {start}", known.start);
            assert!(known.end >= end, "the record says the free end is {} of {end}", known.end);
        }
    }

    /// Eight units (depth 3): unit 0, units 2..4 and unit 7 taken.
    fn ends_taken() -> (Chunk, Node, Node) {
        let first = Node { level: 3, index: 0 };
        let last = Node { level: 3, index: 7 };
        (chunk_with(3, &[first, Node { level: 2, index: 1 }, last]), first, last)
    }

    #[test]
    fn a_record_racing_a_free_never_shortens_an_end() {
        for keep in [Keep::No, Keep::Memo, Keep::Run] {
            loom::model(move || {
                let (chunk, first, _) = ends_taken();
                let freeing = freer(&chunk, first, keep);
                search(&chunk);
                freeing.join().unwrap();
                assert_record_holds(&chunk);
            });
        }
    }

    #[test]
    fn two_frees_at_both_ends_never_leave_a_short_record() {
        for (first_keeps, second_keeps) in [(Keep::Memo, Keep::Memo), (Keep::Memo, Keep::No), (Keep::Run, Keep::Memo)] {
            loom::model(move || {
                let (chunk, first, last) = ends_taken();
                let a = freer(&chunk, first, first_keeps);
                let b = freer(&chunk, last, second_keeps);
                a.join().unwrap();
                b.join().unwrap();
                assert_record_holds(&chunk);
            });
        }
    }

    #[test]
    fn a_free_away_from_the_ends_racing_a_free_at_one_never_hides_it() {
        // Units 2..4 (away from both ends, no tree read) and unit 7 (the free end grows).
        loom::model(|| {
            let (chunk, _, last) = ends_taken();
            let a = freer(&chunk, Node { level: 2, index: 1 }, Keep::Memo);
            let b = freer(&chunk, last, Keep::Run);
            a.join().unwrap();
            b.join().unwrap();
            assert_record_holds(&chunk);
        });
    }

    #[test]
    fn a_reveal_carrying_the_record_racing_a_free_never_hides_an_end() {
        for keep in [Keep::Memo, Keep::No] {
            loom::model(move || {
                let (chunk, first, _) = ends_taken();
                let freeing = freer(&chunk, first, keep);
                let before = chunk.ends.before_free(&chunk.space);
                chunk.space.refresh();
                if let Some(before) = before {
                    chunk.ends.after_step(&chunk.space, before);
                }
                freeing.join().unwrap();
                assert_record_holds(&chunk);
            });
        }
    }
}

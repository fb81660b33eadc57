//! Free stretches inside a chunk: where a buddy block goes when no node of its enclosing size
//! is free, and the per-chunk memo that keeps a search from reading a chunk's tree again when
//! nothing there can have grown.
//!
//! A *free stretch* is a maximal range of a chunk's units that no allocated node covers. A
//! block larger than a bank may start at any bank boundary (the bank rule,
//! `Geometry::packed_alignment`) and is then held by the naturally aligned nodes that cover it,
//! as a compaction's packed blocks are (`BuddyLayout::pieces_at`); it is freed like any other
//! block, from its start and size, so a freed stretch goes back as aligned buddy nodes and
//! coalesces as they do. The allocation path places a block this way after it found no free
//! enclosing node anywhere (`pool/alloc.rs`), so holes that no power of two fits (a 34 KiB
//! request with 14% of the arena free, the largest free node 32 KiB) still serve requests;
//! first for every trimmed block (at its enclosing node it would strand the rest of the node:
//! the first of its core's chunks with a stretch that holds it, `Pool::place_in_own`);
//! and, once the global pool has no chunk left to grant, first for every block of 1/64 of a
//! chunk or more (`tight.rs`).
//!
//! # Finding a stretch
//!
//! The chunk's tree is read once, through its *leaf map* (`TreeShape::leaf_map`): the words of
//! the inner bands say, for each leaf bunch (32 units), whether an allocated node above covers
//! it, whether it is marked occupied, or neither (all its units are free). The free stretches
//! lie in the runs of uncovered leaf bunches; the marked leaf bunches' own words are read only
//! in the runs long enough to hold the block, or to change the two longest stretches found,
//! and the stretches, found run by run between the covered bunches and the allocated units of
//! the marked ones, go to [`best_fit_in_tree`], which picks the smallest free stretch that
//! holds the block at an allowed start (at 85% occupancy a tree read visits about 10 inner
//! words and at most the 18 or so marked leaf words of 273). A tree of more than 8,192 leaves
//! is copied into a bitmap of allocated granules instead (a granule is a few units, so the
//! bitmap stays on the stack: `TreeShape::allocated_granules`) for [`best_fit`]. Both give
//! the same answer for the same tree. The pieces are then claimed one by one (cleaning the
//! phantom marks under them); a piece taken meanwhile rolls the claim back, as a trimmed
//! block's claim does.
//!
//! Across chunks, the search is a best fit too (`packed.rs`): the chunk whose longest free
//! stretch is the shortest that holds the block, known from the memos below without reading
//! the trees (only the chosen chunk's tree is read, to place the block in it), and found
//! through an index of the chunks by the length class (an eighth of a doubling) of their memo's longest stretch
//! (`stretch_classes.rs`): the block's class first, then the classes above, at most 64 chunks
//! compared in the first class that has one that holds it; then the chunks whose memo the
//! index may not know (its *unsure* chunks), and before an allocation fails, every chunk.
//! Placing each block in the tightest
//! chunk leaves the long stretches to the large blocks: with random sizes from 256 B to 1 MiB
//! at 85% occupancy, a first fit across chunks failed one allocation in 200 (no chunk kept a
//! stretch of 700 KiB), the best fit about one in 2,500.
//!
//! # The memo
//!
//! A chunk's [`StretchMemo`] holds `epoch << 32 | (longest + 1)`: no free stretch of the chunk
//! is longer than `longest` units at an allowed start while its free epoch is `epoch`
//! (`ChunkSpace::probe`; 0: nothing known). The rule every writer keeps: a memo valid at the
//! chunk's epoch never hides a stretch that is free, so a search for a longer block may skip
//! the chunk after two loads. Allocations only shorten stretches and every free (and every
//! rollback, grant and reveal) advances the chunk's epoch after its nodes are released.
//!
//! * A search that began at epoch `epoch` records the longest stretch it read. One that missed
//!   a free's release read the epoch before that free's step, so the memo it writes names an
//!   epoch that is already over. A search that then takes a block records what the block
//!   leaves (the longest other stretch, or the rest of its own, [`Fit::after_taking`]) under
//!   the same epoch, so that allocations keep the memo exact, not only an upper bound: the
//!   best fit across chunks ranks chunks by it.
//! * A free of a buddy block carries a valid memo over its own epoch step instead of letting
//!   it go out of date ([`StretchMemo::before_free`], [`StretchMemo::after_free`], called by
//!   `Arena::unmark_buddy_raising` on the free path). Before it releases anything it reads
//!   the epoch `e` and checks that the memo is valid at `e`; after its release and step it
//!   reads the epoch again. Only when that is `e + 1` (its own step is the only one since) is
//!   the memo written again, valid at `e + 1`: the larger of what the memo held (read again:
//!   it bounded every stretch at `e`) and the free run around the freed block, read from the
//!   tree around it (`TreeShape::free_run_around`, a few words, not the whole tree). Every
//!   other stretch is as it was at `e` or shorter; the one the free made is that run. When
//!   another step came between, that step's free made a stretch this free did not measure,
//!   and the memo stays out of date.
//! * A reveal (`reveal.rs`) releases nothing: it carries a valid memo over its epoch step the
//!   same way, with nothing to raise. A search that reads a chunk's tree for another purpose
//!   (the ends of a chunk, `Arena::free_ends`) records what it read when the memo is out of
//!   date, as a search does.
//!
//! # The place
//!
//! Beside the memo, a chunk keeps the [`Place`] of its longest stretch when a search or a free
//! learnt it: where that stretch starts, and how long the others are at most (`others`).
//! A block longer than `others` and no longer than the longest fits only there, so a search
//! takes it there without reading the tree: at 85% occupancy the chunk the best fit across
//! chunks chooses is, nine times in ten, one whose longest stretch is the only one that holds
//! the block. What the block leaves is known too: the rest of that stretch, or, when the rest
//! is shorter than the others, nothing about where the longest is now (the next search that
//! chooses the chunk reads its tree, and a read learns the two longest stretches and the
//! third's length, so a claim from the longest one can place the second).
//!
//! A place is one word: its start and `others` (14 bits each, so only chunks of at most 8,192
//! units keep one) and a tag: the low 22 bits of the epoch and the free units (14 bits) it was
//! learnt at. Every place written at an epoch stays true for the rest of it, as a memo does
//! (allocations only take units), but it is exact only while nothing was taken: a search reads
//! a place only while the chunk's free units are those of its tag. A writer tags with free
//! units it read before what it learnt (a search reads the chunk's word, then its tree; a
//! claim through a place subtracts its own units from what it read first), so that a claim
//! that came between leaves the place unread, never a stale place that looks exact; writers
//! that saw the same epoch and free units saw the same tree, so a memo and a place of two
//! such writers speak of the same stretches. The place is stored before the memo (release)
//! and loaded after it (acquire), and every write of the memo writes the place (or clears
//! it): a place whose 22 bits of epoch match by wrapping round cannot outlive the memo of its
//! own epoch. A free carries a place that was exact before it over its
//! step with the memo: the run it made is one of the others, or it took in the longest
//! stretch, or it is the longest now (then its place is known even when none was before).
//! A claim at a spot it chose without the tree (a block at a chunk's free end, a front, a
//! tail: `Arena::keep_memo_after_claim`) keeps a place that was exact when it read the
//! chunk's free units ([`Place::after_claim`]): what is left of the longest stretch before
//! and after the claim, or the place as it was when the claim lies elsewhere. A chunk granted
//! empty knows its place (its start), so the chunks that fronts, tails and the frontier fill
//! keep exact memos without a read.
//!
//! No read-modify-write is needed on either side: a memo is only ever compared with the epoch
//! the reader itself probed, and a write that lands late names an epoch that is over. The loom
//! models below check a memo, and a memo recorded after a claim, racing a free; a free that
//! raises the memo racing a search, a claim and a second free (that raises it or not), also
//! when the two frees make stretches apart (a raise must never cover another free's step); a
//! reveal that carries the memo racing a free; a claim through a place, a search that records
//! a place and a second free, each racing a free that carries the place; a claim that reads no
//! tree and lowers the memo to the chunk's free units (no stretch is longer than they are, at
//! the epoch read with them: `Arena::cap_memo_at_free`), racing a free that raises the memo or
//! not; and a claim that keeps the place, across the longest stretch, beside it or taking all
//! of it, racing a free. `packed.rs` checks the memos against a unit model over random
//! allocations and frees.

use super::buddy::{LeafMap, TreeShape, MAX_LEAF_BUNCHES};
use super::chunk_space::{ChunkSpace, Probe};
use crate::util::bits::low_bits;
use crate::util::sync::{AtomicU64, Ordering};

/// Units in the bitmap of one chunk, at most: larger trees count granules of several units.
pub(crate) const MAX_GRANULES: u64 = 8192;

/// Granules of `1 << shift` units for a tree of `depth` levels below its root.
pub(crate) fn granule_shift(depth: u32) -> u32 {
    depth.saturating_sub(MAX_GRANULES.trailing_zeros())
}

/// What a search learnt about a chunk's free stretches (see the module documentation): the
/// memo word, `epoch << 32 | (longest + 1)`, and the [`Place`] of that longest stretch, when
/// known, in a word of its own that names the chunk's epoch and free units it was learnt at.
#[derive(Debug, Default)]
pub(crate) struct StretchMemo {
    memo: AtomicU64,
    place: AtomicU64,
}

// SAFETY: two atomic words; all zero means nothing is known.
unsafe impl crate::util::zeroed::Zeroable for StretchMemo {}

/// Where a chunk's longest free stretch lies, beside a memo valid at epoch `e` that gives its
/// length `longest`: at epoch `e`, every free stretch of the chunk (from a bank boundary) lies
/// inside `[start, start + longest)` or holds at most `others` units, and `others < longest`.
/// `start` is a bank boundary. Allocations only take units, so the statement stays true for
/// the rest of the epoch; but it is only exact while nothing was taken since, so a place is
/// read only while the chunk's free units are those it was learnt at. A search that places a
/// block longer than `others` at `start` then places it where a best fit over the tree would,
/// without reading the tree (`Arena::take_stretch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) start: u64,
    pub(crate) others: u64,
}

impl Place {
    /// The longest free stretch and its place once a claim took units `[at, end)` of a chunk
    /// whose longest stretch was `longest` units here (lengths from a multiple of `bank`
    /// units): a claim across that stretch leaves what lies before it (from the stretch's
    /// start) and what lies after it (from the first bank boundary past the claim); a claim
    /// elsewhere shortens one of the others at most. The place is `None` when no single
    /// stretch is known to be the longest (a piece no longer than the others' bound).
    pub(crate) fn after_claim(self, longest: u64, (at, end): (u64, u64), bank: u64) -> (u64, Option<Place>) {
        let stop = self.start + longest;
        if end <= self.start || at >= stop {
            return (longest, Some(self));
        }
        let before = at.saturating_sub(self.start);
        let next = aligned_up(end, bank);
        let after = stop.saturating_sub(next);
        let longest = before.max(after).max(self.others);
        let place = if after > before.max(self.others) {
            Some(Place { start: next, others: before.max(self.others) })
        } else if before > after.max(self.others) {
            Some(Place { start: self.start, others: after.max(self.others) })
        } else {
            None
        };
        (longest, place)
    }
}

/// Bits of a place word for its start, its `others` and the free units of its tag, each: a
/// chunk of at most 8,192 units (a tree read unit by unit) fits.
const PLACE_FIELD_BITS: u32 = 14;
/// Bits of a place word for the epoch of its tag.
const PLACE_EPOCH_BITS: u32 = 64 - 3 * PLACE_FIELD_BITS;

/// The tag a place learnt at epoch `epoch` with `free` units free carries: the epoch's low
/// bits over the free units (`free` below `1 << PLACE_FIELD_BITS`). Set apart from 0 (no
/// place) by a place's `others < longest`: a place word is never all zero.
#[inline]
fn place_tag(epoch: u64, free: u64) -> u64 {
    (epoch & low_bits(PLACE_EPOCH_BITS)) << PLACE_FIELD_BITS | free
}

impl StretchMemo {
    /// Whether a search that probed free epoch `epoch` may skip the chunk for a block of
    /// `units` units: a search at the same epoch found no stretch that long.
    #[inline]
    pub(crate) fn rules_out(&self, epoch: u64, units: u64) -> bool {
        let memo = self.memo.load(Ordering::Acquire);
        let known = memo & 0xFFFF_FFFF;
        known != 0 && memo >> 32 == epoch & 0xFFFF_FFFF && known - 1 < units
    }

    /// The longest free stretch a search that probed `epoch` found, if one recorded it.
    #[inline]
    pub(crate) fn known(&self, epoch: u64) -> Option<u64> {
        Self::valid(self.memo.load(Ordering::Acquire), epoch)
    }

    /// The longest stretch memo word `memo` holds, if it is valid at `epoch`.
    #[inline]
    fn valid(memo: u64, epoch: u64) -> Option<u64> {
        let known = memo & 0xFFFF_FFFF;
        (known != 0 && memo >> 32 == epoch & 0xFFFF_FFFF).then(|| known - 1)
    }

    /// The longest free stretch known at `epoch` and its [`Place`], when both are known and
    /// the place was learnt with `free` units free (nothing was taken since).
    #[inline]
    pub(crate) fn placed(&self, epoch: u64, free: u64) -> Option<(u64, Place)> {
        let memo = self.memo.load(Ordering::Acquire);
        let longest = Self::valid(memo, epoch)?;
        // Written before the memo word (release), by a writer that saw the same epoch and free
        // units, so the same tree: its place and this memo speak of the same stretches.
        let place = self.place.load(Ordering::Acquire);
        if place >> (2 * PLACE_FIELD_BITS) != place_tag(epoch, free) || free >> PLACE_FIELD_BITS != 0 {
            return None;
        }
        let field = low_bits(PLACE_FIELD_BITS);
        Some((longest, Place { start: (place >> PLACE_FIELD_BITS) & field, others: place & field }))
    }

    /// The longest free stretch the last search recorded, whatever its epoch.
    #[inline]
    pub(crate) fn recorded(&self) -> Option<u64> {
        (self.memo.load(Ordering::Relaxed) & 0xFFFF_FFFF).checked_sub(1)
    }

    /// A search that probed `epoch` found no free stretch longer than `longest` units (and
    /// learnt nothing of where it is).
    /// Returns the longest stretch the memo held before, at whatever epoch (`None`: nothing).
    #[cfg(test)]
    pub(crate) fn record(&self, epoch: u64, longest: u64) -> Option<u64> {
        self.record_placed(epoch, longest, None, 0)
    }

    /// [`StretchMemo::record`], with the [`Place`] of that longest stretch when `place` says
    /// it, learnt with `free` units free (kept only when its fields fit its word).
    #[inline]
    pub(crate) fn record_placed(&self, epoch: u64, longest: u64, place: Option<Place>, free: u64) -> Option<u64> {
        let memo = ((epoch & 0xFFFF_FFFF) << 32) | (longest.min(0xFFFF_FFFE) + 1);
        let limit = 1 << PLACE_FIELD_BITS;
        let place = place
            .filter(|p| p.others < longest && longest < limit && p.start < limit && free < limit)
            .map_or(0, |p| place_tag(epoch, free) << (2 * PLACE_FIELD_BITS) | p.start << PLACE_FIELD_BITS | p.others);
        if self.place.load(Ordering::Relaxed) != place {
            self.place.store(place, Ordering::Release);
        }
        let before = self.memo.load(Ordering::Relaxed);
        if before != memo {
            self.memo.store(memo, Ordering::Release);
        }
        (before & 0xFFFF_FFFF).checked_sub(1)
    }

    /// Before a free in the chunk releases anything: the chunk's epoch now, if the memo is
    /// valid at it (else there is nothing to keep, and the free leaves the memo out of date).
    #[inline]
    pub(crate) fn before_free(&self, space: &ChunkSpace) -> Option<Probe> {
        let memo = self.memo.load(Ordering::Acquire);
        if memo == 0 {
            return None; // nothing known: the common case of a chunk no search read
        }
        let (_, before) = space.look();
        (memo >> 32 == before.epoch()).then_some(before)
    }

    /// After that free released its `freed` units and advanced the epoch: when its own step
    /// is the only one since `before`, the memo (read again: it bounds every stretch at
    /// `before`) becomes valid at the new epoch, raised to the free run around the freed units
    /// that `run` reads from the tree (`[start, stop)` in units, `(0, 0)` when nothing was
    /// freed), counted from its first multiple of `bank` units. Its [`Place`], when known and
    /// nothing was taken since, is carried over too; the run's place is known when the run is
    /// the longest now. Otherwise the memo is left as it is: out of date. Returns what it
    /// wrote: the longest stretch before and after, when it did.
    #[inline]
    pub(crate) fn after_free(
        &self,
        space: &ChunkSpace,
        before: Probe,
        bank: u64,
        freed: u64,
        run: impl FnOnce() -> (u64, u64),
    ) -> Option<(u64, u64)> {
        let (free, now) = space.look();
        let after = (before.epoch() + 1) & 0xFFFF_FFFF;
        if now.epoch() != after {
            return None;
        }
        let (known, place) = match free.checked_sub(freed).and_then(|was| self.placed(before.epoch(), was)) {
            Some((known, place)) => (known, Some(place)),
            None => (self.known(before.epoch())?, None),
        };
        let (start, stop) = run();
        let first = aligned_up(start, bank).min(stop);
        let room = stop - first;
        let raised = known.max(room);
        let place = match place {
            // The longest stretch is where it was; the run is one of the others.
            Some(p) if room < known => Some(Place { start: p.start, others: p.others.max(room) }),
            // The run took in the longest stretch: the others are as they were.
            Some(p) if start <= p.start && p.start + known <= stop => Some(Place { start: first, others: p.others }),
            // The run is the longest now: every other stretch is at most the longest before.
            _ if room > known => Some(Place { start: first, others: known }),
            _ => None,
        };
        self.record_placed(after, raised, place, free);
        Some((known, raised))
    }
}

/// `x` rounded up to a multiple of `align` (a power of two: a mask, not a division).
#[inline]
fn aligned_up(x: u64, align: u64) -> u64 {
    (x + align - 1) & !(align - 1)
}

/// The first granule at or after `from` whose bit in `bits` equals `set`, or `end`.
fn next_bit(bits: &[u64], from: u64, end: u64, set: bool) -> u64 {
    let mut w = (from / 64) as usize;
    let flip = if set { 0 } else { u64::MAX };
    if w >= bits.len() {
        return end;
    }
    let mut word = (bits[w] ^ flip) & (u64::MAX << (from % 64));
    loop {
        if word != 0 {
            return (w as u64 * 64 + u64::from(word.trailing_zeros())).min(end);
        }
        w += 1;
        if w >= bits.len() {
            return end;
        }
        word = bits[w] ^ flip;
    }
}

/// What [`best_fit`] found in a chunk's bitmap (lengths in granules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fit {
    /// The smallest free stretch that holds the block from an allowed start (the lowest on a
    /// tie): that start and the stretch's end.
    pub(crate) at: Option<(u64, u64)>,
    /// The longest free length from an allowed start.
    pub(crate) longest: u64,
    /// The longest such length among the other stretches than one of length `longest` (so
    /// `longest` again when two stretches share it).
    pub(crate) second: u64,
    /// The allowed start of the first stretch of length `longest` (0 when none is free).
    pub(crate) longest_at: u64,
    /// The allowed start of the stretch of length `second` counted as such (0 when none).
    pub(crate) second_at: u64,
    /// The longest length among the stretches other than those two.
    pub(crate) third: u64,
}

impl Fit {
    /// The [`Place`] of the longest stretch (lengths and starts in granules).
    pub(crate) fn place(&self) -> Place {
        Place { start: self.longest_at, others: self.second }
    }

    /// The longest free length from an allowed start once a block of `len` granules takes the
    /// start of the fit (what is left after it begins at the next allowed start), and the
    /// [`Place`] of that longest stretch: the rest of the fit after the block, when the fit
    /// was the longest stretch and its rest is still the longest; else the second stretch,
    /// when the fit was the longest; else the longest stretch as it was.
    pub(crate) fn after_taking(&self, len: u64, align: u64) -> (u64, Place) {
        let Some((start, end)) = self.at else {
            return (self.longest, self.place());
        };
        let next = aligned_up(start + len, align);
        let rest = end.saturating_sub(next);
        if start == self.longest_at && end - start == self.longest {
            if rest >= self.second {
                (rest, Place { start: next, others: self.second })
            } else {
                // The second stretch is the longest now, the rest one of the others.
                (self.second, Place { start: self.second_at, others: self.third.max(rest) })
            }
        } else {
            // A tie at `longest` leaves `second == longest`: a place that says nothing.
            (self.longest.max(rest), self.place())
        }
    }
}

/// The free stretches of a chunk offered one by one, in address order, to the best fit for
/// `len` granules from a start that is a multiple of `align` (see [`best_fit`]).
struct FitScan {
    len: u64,
    align: u64,
    best: Option<(u64, u64)>,
    longest: u64,
    second: u64,
    third: u64,
    longest_at: u64,
    second_at: u64,
}

impl FitScan {
    fn new(len: u64, align: u64) -> FitScan {
        debug_assert!(align.is_power_of_two(), "align {align}");
        FitScan { len, align, best: None, longest: 0, second: 0, third: 0, longest_at: 0, second_at: 0 }
    }

    /// The free stretch `[start, end)` (empty when `start == end`); a maximal one.
    #[inline]
    fn offer(&mut self, start: u64, end: u64) {
        let aligned = aligned_up(start, self.align);
        if aligned < end {
            let room = end - aligned;
            if room > self.longest {
                (self.third, self.second, self.second_at) = (self.second, self.longest, self.longest_at);
                (self.longest, self.longest_at) = (room, aligned);
            } else if room > self.second {
                (self.third, self.second, self.second_at) = (self.second, room, aligned);
            } else if room > self.third {
                self.third = room;
            }
            if room >= self.len && self.best.is_none_or(|(_, r)| room < r) {
                self.best = Some((aligned, room));
            }
        }
    }

    fn fit(self) -> Fit {
        Fit {
            at: self.best.map(|(start, room)| (start, start + room)),
            longest: self.longest,
            second: self.second,
            longest_at: self.longest_at,
            second_at: self.second_at,
            third: self.third,
        }
    }
}

/// In a bitmap of `granules` granules (a set bit is allocated), the smallest free stretch that
/// holds `len` granules from a start that is a multiple of `align` (best fit, the lowest on a
/// tie), and the two longest free lengths from such starts.
pub(crate) fn best_fit(allocated: &[u64], granules: u64, len: u64, align: u64) -> Fit {
    let mut scan = FitScan::new(len, align);
    let mut at = 0;
    while at < granules {
        let start = next_bit(allocated, at, granules, false);
        if start >= granules {
            break;
        }
        let end = next_bit(allocated, start, granules, true);
        scan.offer(start, end);
        at = end;
    }
    scan.fit()
}

/// [`best_fit`] over the units of a chunk's tree (granules of one unit), read through its leaf
/// map (`TreeShape::leaf_map`): the words of the inner bands, then those of the marked leaf
/// bunches that can matter; the tree is not copied into a bitmap. Every free stretch lies in a
/// run of uncovered leaf bunches and is no longer than the run from its first allowed start:
/// the runs that long enough to hold `len` units are read first, in address order (the fit is
/// in one of them), then the others whose length could still change the two longest stretches
/// found. The same answer as [`best_fit`] over `TreeShape::allocated_granules`, and a snapshot
/// of a moving target as that is. `None` when the tree has no leaf map (one band, or more than
/// 8,192 units).
pub(crate) fn best_fit_in_tree(shape: &TreeShape, tree: &[AtomicU64], len: u64, align: u64) -> Option<Fit> {
    let map = shape.leaf_map(tree)?;
    let mut scan = FitScan::new(len, align);
    // The runs of uncovered leaf bunches, found once (a covered bunch at least between two
    // runs: at most half the bunches, rounded up).
    let mut runs = [(0u16, 0u16); MAX_LEAF_BUNCHES / 2 + 1];
    let mut count = 0;
    let mut at = 0;
    while at < map.bunches {
        let first = next_bit(&map.covered, at, map.bunches, false);
        if first >= map.bunches {
            break;
        }
        let end = next_bit(&map.covered, first, map.bunches, true);
        runs[count] = (first as u16, end as u16);
        count += 1;
        at = end;
    }
    let room = |(first, end): (u16, u16)| {
        (u64::from(end) * map.units).saturating_sub(aligned_up(u64::from(first) * map.units, align))
    };
    for long in [true, false] {
        for &run in &runs[..count] {
            let room = room(run);
            if if long { room >= len } else { room < len && room > scan.third } {
                scan_run(shape, tree, &map, u64::from(run.0), u64::from(run.1), &mut scan);
            }
        }
    }
    Some(scan.fit())
}

/// Offer to `scan` the free stretches of uncovered leaf bunches `[first, end)` (covered ones,
/// or the chunk's ends, around them): the unmarked bunches are free all through, the marked
/// ones' words say which of their units are allocated.
fn scan_run(shape: &TreeShape, tree: &[AtomicU64], map: &LeafMap, first: u64, end: u64, scan: &mut FitScan) {
    let width = map.units;
    // The open free run: from the start of the uncovered leaf bunches.
    let mut run = first * width;
    let mut k = first;
    loop {
        k = next_bit(&map.marked, k, end, true);
        if k >= end {
            break;
        }
        let allocated = shape.leaf_allocated(tree, k);
        if allocated != 0 {
            let base = k * width;
            let low = u64::from(allocated.trailing_zeros());
            let high = 63 - u64::from(allocated.leading_zeros());
            scan.offer(run, base + low);
            // The free runs between the bunch's first and last allocated units.
            let mut free = !allocated & low_bits(high as u32) & !low_bits(low as u32);
            while free != 0 {
                let s = free.trailing_zeros();
                let e = (!free & !low_bits(s)).trailing_zeros();
                scan.offer(base + u64::from(s), base + u64::from(e));
                free &= !low_bits(e);
            }
            run = base + high + 1;
        }
        k += 1;
    }
    scan.offer(run, end * width);
}

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    use super::*;

    /// A seeded xorshift generator.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// The reference: every start, every length, unit by unit; the fit's start, and every
    /// stretch's length from its first allowed start.
    fn reference(free: &[bool], len: u64, align: u64) -> (Option<u64>, Vec<u64>) {
        let n = free.len() as u64;
        let run = |s: u64| (s..n).take_while(|&i| free[i as usize]).count() as u64;
        let mut best: Option<(u64, u64)> = None;
        let mut rooms = Vec::new();
        let mut s = 0;
        while s < n {
            if free[s as usize] && (s == 0 || !free[s as usize - 1]) {
                // A maximal stretch: its first allowed start.
                let end = s + run(s);
                let aligned = s.div_ceil(align) * align;
                if aligned < end {
                    let room = end - aligned;
                    rooms.push(room);
                    if room >= len && best.is_none_or(|(_, r)| room < r) {
                        best = Some((aligned, room));
                    }
                }
                s = end;
            } else {
                s += 1;
            }
        }
        (best.map(|b| b.0), rooms)
    }

    #[test]
    fn best_fit_matches_a_unit_by_unit_reference() {
        let mut rng = Rng::new(16);
        for round in 0..2000 {
            let n = [64u64, 100, 128, 300, 8192][round % 5];
            let density = (rng.next() % 100) as f64 / 100.0;
            let free: Vec<bool> = (0..n).map(|_| (rng.next() % 1000) as f64 / 1000.0 >= density).collect();
            let mut bits = vec![0u64; n.div_ceil(64) as usize];
            for (i, &f) in free.iter().enumerate() {
                if !f {
                    bits[i / 64] |= 1 << (i % 64);
                }
            }
            let len = 1 + rng.next() % 40;
            let align = 1 << (rng.next() % 5);
            let found = best_fit(&bits, n, len, align);
            let fit = found.at;
            let (want_fit, mut rooms) = reference(&free, len, align);
            rooms.sort_unstable_by(|a, b| b.cmp(a));
            let nth = |i: usize| rooms.get(i).copied().unwrap_or(0);
            assert_eq!((found.longest, found.second, found.third), (nth(0), nth(1), nth(2)), "round {round}");
            // The starts of the two longest stretches: allowed starts of stretches that long
            // (two different ones when the lengths tie).
            let room_at = |s: u64| {
                let stop = (s..n).find(|&i| !free[i as usize]).unwrap_or(n);
                let first = (0..s).rev().find(|&i| !free[i as usize]).map_or(0, |i| i + 1);
                (s < stop && first.div_ceil(align) * align == s).then(|| stop - s)
            };
            if found.longest > 0 {
                assert_eq!(room_at(found.longest_at), Some(found.longest), "round {round}: {found:?}");
            }
            if found.second > 0 {
                assert_eq!(room_at(found.second_at), Some(found.second), "round {round}: {found:?}");
                assert_ne!(found.second_at, found.longest_at, "round {round}: {found:?}");
            }
            // What is left once the block takes the fit: every other stretch, and the rest of
            // the fit after the block.
            if let Some((s, end)) = fit {
                let rest = end.saturating_sub((s + len).div_ceil(align) * align);
                let mut others = rooms.clone();
                let i = others.iter().position(|&r| r == end - s).expect("the fit is a stretch");
                others.remove(i);
                let want = others.into_iter().chain([rest]).max().unwrap_or(0);
                assert_eq!(found.after_taking(len, align).0, want, "round {round}: longest after");
            }
            // Ties may break differently; the fit must be free, allowed and as small.
            assert_eq!(fit.is_some(), want_fit.is_some(), "round {round}");
            if let (Some((s, end)), Some(w)) = (fit, want_fit) {
                assert_eq!(end - s, (s..n).take_while(|&i| free[i as usize]).count() as u64);
                assert_eq!(s % align, 0);
                assert!((s..s + len).all(|i| free[i as usize]), "round {round}: the fit is free");
                let room = |s: u64| (s..n).take_while(|&i| free[i as usize]).count();
                assert_eq!(room(s), room(w), "round {round}: as tight as the reference");
            }
        }
    }

    /// A claim of any free units, across the longest stretch or elsewhere, leaves a memo that
    /// bounds every stretch; and a place that it keeps names a stretch that long, longer than
    /// every other: so a search may take it without reading the tree.
    #[test]
    fn a_claim_anywhere_keeps_a_true_memo_and_place() {
        let mut rng = Rng::new(29);
        let mut kept = 0;
        for round in 0..4000 {
            let n = [64u64, 128, 300, 8192][round % 4];
            let density = (rng.next() % 90) as f64 / 100.0;
            let mut free: Vec<bool> = (0..n).map(|_| (rng.next() % 1000) as f64 / 1000.0 >= density).collect();
            let bank = 1 << (rng.next() % 5);
            let bits_of = |free: &[bool]| {
                let mut bits = vec![0u64; n.div_ceil(64) as usize];
                for (i, &f) in free.iter().enumerate() {
                    if !f {
                        bits[i / 64] |= 1 << (i % 64);
                    }
                }
                bits
            };
            let fit = best_fit(&bits_of(&free), n, 1, bank);
            if fit.longest == 0 || fit.second >= fit.longest {
                continue;
            }
            // The bound on the others is an upper bound: any value below the longest.
            let others = fit.second + rng.next() % (fit.longest - fit.second);
            let place = Place { start: fit.longest_at, others };
            // A claim of free units: a piece of a free run, across the longest or elsewhere.
            let runs: Vec<u64> = (0..n).filter(|&i| free[i as usize] && (i == 0 || !free[i as usize - 1])).collect();
            let s = runs[(rng.next() % runs.len() as u64) as usize];
            let e = (s..n).find(|&i| !free[i as usize]).unwrap_or(n);
            let at = s + rng.next() % (e - s);
            let end = at + 1 + rng.next() % (e - at);
            for i in at..end {
                free[i as usize] = false;
            }
            let (longest, kept_place) = place.after_claim(fit.longest, (at, end), bank);
            let (_, mut rooms) = reference(&free, 1, bank);
            rooms.sort_unstable_by(|a, b| b.cmp(a));
            let nth = |i: usize| rooms.get(i).copied().unwrap_or(0);
            assert!(nth(0) <= longest, "round {round}: the memo bounds every stretch");
            if let Some(p) = kept_place {
                kept += 1;
                let room = (p.start..n).take_while(|&i| free[i as usize]).count() as u64;
                let first = (0..p.start).rev().find(|&i| !free[i as usize]).map_or(0, |i| i + 1);
                assert_eq!(p.start % bank, 0, "round {round}");
                assert_eq!(first.div_ceil(bank) * bank, p.start, "round {round}: the stretch's first allowed start");
                assert_eq!((room, nth(0)), (longest, longest), "round {round}: the place is the longest");
                assert!(nth(1) <= p.others && p.others < longest, "round {round}: {p:?}, rooms {rooms:?}");
            }
        }
        assert!(kept > 500, "places kept: {kept}");
    }

    #[test]
    fn the_tree_read_through_its_leaf_map_agrees_with_a_node_model() {
        // Random nodes of every level taken and released (leaving phantom marks, some cleaned
        // again by claims that clean) in trees of several shapes: the leaf map against the
        // live nodes, and the best fit read through it against the bitmap of the live nodes'
        // units, for random lengths and alignments.
        use crate::arena::buddy::{Node, TreeShape};
        let mut rng = Rng::new(61);
        let shapes = [(6, 6, 4), (7, 6, 4), (10, 6, 4), (13, 6, 4), (4, 2, 2), (5, 1, 1), (9, 3, 2), (8, 6, 1)];
        for (case, &(depth, leaf, inner)) in shapes.iter().cycle().take(8 * 40).enumerate() {
            let shape = TreeShape::with_heights(depth, leaf, inner);
            let tree: Vec<AtomicU64> = (0..shape.words()).map(|_| AtomicU64::new(0)).collect();
            let units = 1u64 << depth;
            let mut live: Vec<Node> = Vec::new();
            let steps = rng.next() % 400;
            for _ in 0..steps {
                // Mostly small nodes, so leaf bunches fill up and empty again.
                let level = depth - (rng.next() % u64::from(depth + 1)).min(rng.next() % u64::from(depth + 1)) as u32;
                let n = Node { level, index: rng.next() % (1 << level) };
                let taken =
                    if rng.next() % 4 == 0 { shape.try_alloc_cleaning(&tree, n) } else { shape.try_alloc(&tree, n) };
                if taken.is_ok() {
                    live.push(n);
                }
                if !live.is_empty() && rng.next() % 5 < 2 {
                    let n = live.swap_remove((rng.next() % live.len() as u64) as usize);
                    shape.release(&tree, n).unwrap();
                }
            }
            let mut model = vec![0u64; units.div_ceil(64) as usize];
            for n in &live {
                set(&mut model, n.start(depth), n.start(depth) + n.units(depth));
            }
            let Some(map) = shape.leaf_map(&tree) else {
                assert!(depth < leaf, "case {case}: a tree of several bands has a leaf map");
                continue;
            };
            let width = map.units;
            assert_eq!(map.bunches * width, units, "case {case}");
            for k in 0..map.bunches {
                let bit = |m: &[u64]| m[(k / 64) as usize] >> (k % 64) & 1 != 0;
                let (lo, hi) = (k * width, (k + 1) * width);
                let above = live
                    .iter()
                    .any(|n| n.units(depth) > width && n.start(depth) < hi && lo < n.start(depth) + n.units(depth));
                let inside = (lo..hi).filter(|&u| model[(u / 64) as usize] >> (u % 64) & 1 != 0).count() as u64;
                assert_eq!(bit(&map.covered), above, "case {case}: leaf bunch {k} covered");
                if above {
                    continue;
                }
                let allocated = shape.leaf_allocated(&tree, k);
                assert_eq!(u64::from(allocated.count_ones()), inside, "case {case}: leaf bunch {k}'s units");
                assert!(bit(&map.marked) || inside == 0, "case {case}: leaf bunch {k} holds nodes, unmarked");
            }
            for _ in 0..8 {
                let len = 1 + rng.next() % units.min(300);
                let align = 1 << (rng.next() % u64::from(depth.min(6) + 1));
                let want = best_fit(&model, units, len, align);
                // The starts of tied stretches may differ: the tree read takes the runs that
                // hold the block first. Only a start that a place can keep must agree.
                let comparable = |f: Fit| {
                    let longest_at = (f.longest > f.second).then_some(f.longest_at);
                    let second_at = (f.second > f.third && f.longest > f.second).then_some(f.second_at);
                    (f.at, f.longest, f.second, f.third, longest_at, second_at)
                };
                assert_eq!(
                    best_fit_in_tree(&shape, &tree, len, align).map(comparable),
                    Some(comparable(want)),
                    "case {case}: len {len}, align {align}"
                );
            }
        }

        fn set(bits: &mut [u64], from: u64, to: u64) {
            for u in from..to {
                bits[(u / 64) as usize] |= 1 << (u % 64);
            }
        }
    }

    #[test]
    fn a_memo_rules_out_only_longer_blocks_at_its_own_epoch() {
        let m = StretchMemo::default();
        assert!(!m.rules_out(1, 1), "nothing known");
        m.record(7, 40);
        assert!(m.rules_out(7, 41));
        assert!(!m.rules_out(7, 40));
        assert!(!m.rules_out(8, 41), "a free came since");
        m.record(8, 0);
        assert!(m.rules_out(8, 1));
        assert!(m.rules_out(8 + (1 << 32), 1), "epochs are compared on 32 bits, as the chunk keeps them");
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! A search that records a memo races a free in the same chunk, and frees that raise the
    //! memo race searches, claims (one that lowers the memo to the free units too) and each
    //! other: afterwards, a memo that is valid at the
    //! chunk's epoch never rules out a stretch that is free, and a place that is valid there
    //! says truly where every stretch longer than its `others` lies.
    use super::*;
    use crate::arena::buddy::{Node, TreeShape};
    use crate::arena::chunk_space::ChunkSpace;
    use crate::arena::loom_chunk::tree_with;
    use loom::sync::Arc;
    use loom::thread;

    /// A chunk's tree (of `depth` levels below the root, bands of height 1), free-space word
    /// and stretch memo.
    #[derive(Clone)]
    struct Chunk {
        depth: u32,
        shape: Arc<TreeShape>,
        tree: Arc<Vec<AtomicU64>>,
        space: Arc<ChunkSpace>,
        memo: Arc<StretchMemo>,
    }

    /// A chunk of `1 << depth` units with `taken` allocated, and a memo (with its place) that
    /// a search recorded then.
    fn chunk_with(depth: u32, taken: &[Node]) -> Chunk {
        let (shape, tree, space) = tree_with(depth, taken);
        let chunk = Chunk { depth, shape, tree, space, memo: Arc::new(StretchMemo::default()) };
        record_read(&chunk);
        chunk
    }

    /// A search's read of the tree, recorded in the memo with the longest stretch's place.
    fn record_read(c: &Chunk) {
        let (free, _) = c.space.look();
        let (epoch, fit) = read_fit(c);
        c.memo.record_placed(epoch, fit.longest, Some(fit.place()), free);
    }

    /// Four units in two leaf bunches of two (depth 2), units 0 and 2 taken (free stretches of
    /// one unit at 1 and at 3).
    fn two_of_four_taken() -> Chunk {
        chunk_with(2, &[Node { level: 2, index: 0 }, Node { level: 2, index: 2 }])
    }

    /// A thread that frees `node`, raising the memo as the free path does
    /// (`Arena::unmark_buddy_raising`) when `raise`, else only advancing the epoch.
    fn freer(chunk: &Chunk, node: Node, raise: bool) -> thread::JoinHandle<()> {
        let c = chunk.clone();
        thread::spawn(move || {
            let before = if raise { c.memo.before_free(&c.space) } else { None };
            c.shape.release(&c.tree, node).unwrap();
            c.space.give(node.units(c.depth));
            if let Some(before) = before {
                // Read before the memo's step is checked, as the free path reads it (the
                // announcement takes the levels of the largest free nodes from it too).
                let from = node.start(c.depth);
                let run = c.shape.free_run_around(&c.tree, from, from + node.units(c.depth));
                c.memo.after_free(&c.space, before, 1, node.units(c.depth), || run);
            }
        })
    }

    /// A search's read of the tree for one unit, as the allocation path reads it (through the
    /// leaf map): the epoch it probed and the best fit it saw.
    fn read_fit(c: &Chunk) -> (u64, Fit) {
        let probe = c.space.probe(1).unwrap();
        (probe.epoch(), best_fit_in_tree(&c.shape, &c.tree, 1, 1).expect("a tree of several bands"))
    }

    /// The memo, valid at the chunk's epoch now, does not rule out its longest free stretch
    /// (read into a bitmap, the reference), and its place, valid, holds every stretch longer
    /// than its `others`.
    fn assert_memo_holds(c: &Chunk) {
        let mut now_bits = [0u64; 1];
        c.shape.allocated_granules(&c.tree, 0, &mut now_bits);
        let units = 1u64 << c.depth;
        let longest = best_fit(&now_bits, units, 1, 1).longest;
        let (free, now) = c.space.look();
        assert!(!c.memo.rules_out(now.epoch(), longest), "the memo hides a free stretch of {longest}");
        if let Some((known, place)) = c.memo.placed(now.epoch(), free) {
            let free = |u: u64| now_bits[0] >> u & 1 == 0;
            for u in (0..units).filter(|&u| free(u) && (u == 0 || !free(u - 1))) {
                let end = (u..units).find(|&v| !free(v)).unwrap_or(units);
                assert!(
                    end - u <= place.others || (place.start <= u && end <= place.start + known),
                    "a stretch of {} at {u} outside {place:?} of {known}",
                    end - u
                );
            }
        }
    }

    /// A search for block `node` through the memo's place, as `Arena::take_stretch` begins:
    /// when the place says no other stretch holds the block and the block starts there, claim
    /// it and record what is left, and where. Whether it took the block.
    fn claim_through_place(c: &Chunk, node: Node) -> bool {
        let units = node.units(c.depth);
        let (free, probe) = c.space.look();
        let Some((longest, place)) = c.memo.placed(probe.epoch(), free) else {
            return false;
        };
        if units <= place.others || units > longest || place.start != node.start(c.depth) {
            return false;
        }
        if c.shape.try_alloc(&c.tree, node).is_err() {
            return false;
        }
        c.space.take(units);
        let (left, place_left) = place.after_claim(longest, (place.start, place.start + units), 1);
        c.memo.record_placed(probe.epoch(), left, place_left, free - units);
        true
    }

    /// A claim of `node` wherever it lies, then the memo kept through its place as
    /// `Arena::keep_memo_after_claim` keeps it (a block at a chunk's free end, a front, a
    /// tail): the free units and epoch read before the claim, the place read at them.
    fn claim_and_keep(c: &Chunk, node: Node) {
        let units = node.units(c.depth);
        let (free, probe) = c.space.look();
        if free < units || c.shape.try_alloc(&c.tree, node).is_err() {
            return;
        }
        c.space.take(units);
        match c.memo.placed(probe.epoch(), free) {
            Some((longest, place)) => {
                let at = node.start(c.depth);
                let (longest, place) = place.after_claim(longest, (at, at + units), 1);
                c.memo.record_placed(probe.epoch(), longest, place, free - units);
            }
            None => cap_at_free(c, c.space.look()),
        }
    }

    const UNIT_0: Node = Node { level: 2, index: 0 };
    const UNIT_2: Node = Node { level: 2, index: 2 };

    #[test]
    fn a_memo_racing_a_free_never_hides_the_freed_stretch() {
        loom::model(|| {
            let chunk = two_of_four_taken();
            let freeing = freer(&chunk, UNIT_2, false);
            let (epoch, fit) = read_fit(&chunk);
            chunk.memo.record(epoch, fit.longest);
            freeing.join().unwrap();
            // Units 1..4 are free now: a block of three must not be ruled out.
            let now = chunk.space.probe(0).unwrap();
            assert!(!chunk.memo.rules_out(now.epoch(), 3), "the memo hides the freed stretch");
        });
    }

    #[test]
    fn a_memo_recorded_after_a_claim_racing_a_free_never_hides_the_freed_stretch() {
        for raise in [false, true] {
            loom::model(move || {
                let chunk = two_of_four_taken();
                let freeing = freer(&chunk, UNIT_2, raise);
                // A search for one unit: read, record, claim the best fit, record what is left.
                let (epoch, fit) = read_fit(&chunk);
                chunk.memo.record(epoch, fit.longest);
                let (start, _) = fit.at.unwrap();
                let claimed = chunk.shape.try_alloc(&chunk.tree, Node { level: 2, index: start }).is_ok();
                if claimed {
                    chunk.space.take(1);
                    chunk.memo.record(epoch, fit.after_taking(1, 1).0);
                }
                freeing.join().unwrap();
                // Unit 2 is free now, and unit 3 unless the search took it.
                assert_memo_holds(&chunk);
            });
        }
    }

    #[test]
    fn a_memo_raised_by_a_free_racing_a_search_never_hides_a_free_stretch() {
        loom::model(|| {
            let chunk = two_of_four_taken();
            let freeing = freer(&chunk, UNIT_2, true);
            let (epoch, fit) = read_fit(&chunk);
            chunk.memo.record(epoch, fit.longest);
            freeing.join().unwrap();
            assert_memo_holds(&chunk);
        });
    }

    /// Eight units: units 0..2 and unit 3 taken; free, unit 2 and units 4..8: the place says
    /// the longest stretch (four units) is at 4, every other at most one unit.
    fn place_at_four() -> Chunk {
        let chunk = chunk_with(3, &[Node { level: 2, index: 0 }, Node { level: 3, index: 3 }]);
        let (free, probe) = chunk.space.look();
        assert_eq!(chunk.memo.placed(probe.epoch(), free), Some((4, Place { start: 4, others: 1 })));
        chunk
    }

    #[test]
    fn a_claim_through_a_place_racing_a_free_never_leaves_a_false_place() {
        // The free of unit 3 joins unit 2 and the longest stretch into one (before the claim)
        // or joins unit 2 to what the claim left (after it); it raises the memo and the place,
        // or only advances the epoch.
        for raise in [true, false] {
            loom::model(move || {
                let chunk = place_at_four();
                let freeing = freer(&chunk, Node { level: 3, index: 3 }, raise);
                let claimed = claim_through_place(&chunk, Node { level: 2, index: 2 });
                freeing.join().unwrap();
                assert_memo_holds(&chunk);
                if !raise {
                    // No step came between: the claim's probe was current, and its place too.
                    let epoch = chunk.space.probe(0).unwrap().epoch();
                    assert!(claimed || chunk.memo.known(epoch).is_none(), "the claim through the place failed");
                }
            });
        }
    }

    /// A claim of `node`, then a valid memo longer than the units left free lowered to them:
    /// with a look after the claim, as `Arena::cap_memo_at_free` does after a claim that reads
    /// no tree (a block at a chunk's free end, a front, a tail), or (`from_take`) with the free
    /// units and epoch that the claim's count returned, as `Arena::lower_memo_after_take` does
    /// on the buddy path. (That one lowers only a memo of a higher length class than the free
    /// units; up to eight units, each length is a class of its own.)
    fn claim_and_cap(c: &Chunk, node: Node, from_take: bool) {
        if c.shape.try_alloc(&c.tree, node).is_err() {
            return;
        }
        let taken = c.space.take(node.units(c.depth));
        cap_at_free(c, if from_take { taken } else { c.space.look() });
    }

    /// A valid memo longer than `free` units lowered to them (`probe`: the epoch read with them).
    fn cap_at_free(c: &Chunk, (free, probe): (u64, Probe)) {
        if c.memo.known(probe.epoch()).is_some_and(|longest| longest > free) {
            c.memo.record_placed(probe.epoch(), free, None, free);
        }
    }

    #[test]
    fn a_memo_kept_through_the_place_after_a_claim_racing_a_free_never_leaves_a_false_one() {
        // The claims: units 6..8 (the end of the longest stretch, 4..8: what is left keeps its
        // place), unit 2 (outside it: the place stays) and units 4..8 (all of it: the place
        // is lost, and the memo says the others' bound). The frees: unit 3 (joining unit 2 and
        // the longest stretch, raising the memo or only advancing the epoch) and units 0..2
        // (a run of three with unit 2 while unit 3 is taken).
        for claimed in [Node { level: 2, index: 3 }, Node { level: 3, index: 2 }, Node { level: 1, index: 1 }] {
            for (freed, raise) in [
                (Node { level: 3, index: 3 }, true),
                (Node { level: 3, index: 3 }, false),
                (Node { level: 2, index: 0 }, true),
            ] {
                loom::model(move || {
                    let chunk = place_at_four();
                    let freeing = freer(&chunk, freed, raise);
                    claim_and_keep(&chunk, claimed);
                    freeing.join().unwrap();
                    assert_memo_holds(&chunk);
                });
            }
        }
    }

    #[test]
    fn a_memo_lowered_to_the_free_units_racing_a_free_never_hides_a_free_stretch() {
        // The claim takes the longest stretch (units 4..8), leaving unit 2 free; the free of
        // unit 3 (raising the memo or only advancing the epoch) or of units 0..2 makes a run
        // next to unit 2 that the lowered memo must not hide.
        for (freed, raise, from_take) in [
            (Node { level: 3, index: 3 }, true, false),
            (Node { level: 3, index: 3 }, false, false),
            (Node { level: 2, index: 0 }, true, false),
            (Node { level: 3, index: 3 }, true, true),
            (Node { level: 3, index: 3 }, false, true),
            (Node { level: 2, index: 0 }, true, true),
        ] {
            loom::model(move || {
                let chunk = place_at_four();
                let freeing = freer(&chunk, freed, raise);
                claim_and_cap(&chunk, Node { level: 1, index: 1 }, from_take);
                freeing.join().unwrap();
                assert_memo_holds(&chunk);
            });
        }
    }

    #[test]
    fn a_search_recording_a_place_racing_a_free_that_raises_it_never_leaves_a_false_place() {
        // The free of units 0..2 joins unit 2 into a run of three, next to unit 3 still taken:
        // the longest stays at 4, the others grow to three units.
        loom::model(|| {
            let chunk = place_at_four();
            let freeing = freer(&chunk, Node { level: 2, index: 0 }, true);
            record_read(&chunk);
            freeing.join().unwrap();
            assert_memo_holds(&chunk);
        });
    }

    #[test]
    fn two_frees_raising_a_place_never_leave_a_false_one() {
        // Units 0..2 and unit 3: together they join everything into one stretch of eight.
        loom::model(|| {
            let chunk = place_at_four();
            let first = freer(&chunk, Node { level: 2, index: 0 }, true);
            let second = freer(&chunk, Node { level: 3, index: 3 }, true);
            first.join().unwrap();
            second.join().unwrap();
            assert_memo_holds(&chunk);
        });
    }

    #[test]
    fn two_frees_raising_the_memo_never_hide_a_free_stretch() {
        // The second free raises the memo too, or only advances the epoch (as a release that
        // keeps no memo does: a block with a front, a rollback, a reveal).
        for second_raises in [true, false] {
            loom::model(move || {
                let chunk = two_of_four_taken();
                let first = freer(&chunk, UNIT_0, true);
                let second = freer(&chunk, UNIT_2, second_raises);
                first.join().unwrap();
                second.join().unwrap();
                // Every unit is free: whichever raise came last, a valid memo allows all four.
                assert_memo_holds(&chunk);
            });
        }
    }

    #[test]
    fn a_reveal_carrying_the_memo_racing_a_free_never_hides_a_free_stretch() {
        // The reveal steps the epoch twice with nothing released (its refresh, then the level
        // maps' announcement) and carries a valid memo over each step (`Arena::reveal_chunk`);
        // the free raises the memo or only advances the epoch.
        for raise in [true, false] {
            loom::model(move || {
                let chunk = two_of_four_taken();
                let freeing = freer(&chunk, UNIT_2, raise);
                for _ in 0..2 {
                    let before = chunk.memo.before_free(&chunk.space);
                    chunk.space.refresh();
                    if let Some(before) = before {
                        chunk.memo.after_free(&chunk.space, before, 1, 0, || (0, 0));
                    }
                }
                freeing.join().unwrap();
                assert_memo_holds(&chunk);
            });
        }
    }

    #[test]
    fn a_raise_never_covers_for_another_free_apart_from_its_own() {
        // Eight units: unit 0, units 2..4 and units 4..8 taken, unit 1 free. One free gives
        // back unit 0 (a run of two) and raises the memo, the other gives back units 4..8 (a
        // run of four, apart from the first) and keeps no memo: the raise must not make a memo
        // of two valid after both steps.
        for second_raises in [true, false] {
            loom::model(move || {
                let low = Node { level: 3, index: 0 };
                let high = Node { level: 1, index: 1 };
                let chunk = chunk_with(3, &[low, Node { level: 2, index: 1 }, high]);
                let first = freer(&chunk, low, true);
                let second = freer(&chunk, high, second_raises);
                first.join().unwrap();
                second.join().unwrap();
                assert_memo_holds(&chunk);
            });
        }
    }
}

//! Taking a buddy block at a free stretch, on the allocation path: across chunks (the best fit,
//! ranked by the longest stretch their memos know, or the first of a core's own chunks in
//! address order) and inside one chunk (the best fit), for every trimmed block larger than a
//! bank, for a block whose enclosing node is nowhere free and, in a tight arena, for every
//! block of 1/64 of a chunk or more (`pool/alloc.rs`); and, on the free path, keeping a chunk's
//! stretch memo valid across a free (`Arena::unmark_buddy_raising`). `stretches.rs` explains
//! the stretches and their memo.

use super::arena::Arena;
use super::chunk_space::Probe;
use super::exact::Unmarked;
use super::global::ChunkState;
use super::layout::BuddyLayout;
use super::stretch_classes::{class_floor, class_of, classes_up_to, PER_DOUBLING};
use super::stretches::{best_fit, best_fit_in_tree, granule_shift, Fit, Place, MAX_GRANULES};

/// Chunks whose stretch memo is out of date that a best-fit search reads from their trees, at
/// most (besides the chunk it takes the block in).
const FRESH_READS: usize = 2;
/// Searches again after the chunk a best-fit search chose did not hold the block (its memo
/// promised more than the tree had), at most.
const MEMO_CORRECTIONS: usize = 2;
/// Chunks that can hold the block that a best-fit search compares, at most.
const COMPARED: usize = 64;

/// The best fit among the chunks a search compares: the shortest longest stretch that holds the
/// block, with its chunk and owner.
#[derive(Default)]
struct BestFit {
    best: Option<(u64, usize, usize)>,
    compared: usize,
}

impl BestFit {
    /// Compare a chunk whose longest stretch (`longest` units) holds a block of `units`; true
    /// when the search can stop: [`COMPARED`] chunks compared, or one that fits exactly.
    #[inline]
    fn offer(&mut self, longest: u64, chunk: usize, owner: usize, units: u64) -> bool {
        if self.best.is_none_or(|(k, ..)| longest < k) {
            self.best = Some((longest, chunk, owner));
        }
        self.compared += 1;
        self.compared == COMPARED || longest == units
    }
}

/// Why a best-fit search placed no block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missed {
    /// The last search ruled out every core chunk it looked at (those its length class or its
    /// unsure bit named: every chunk that might hold the block), by its memo or by its tree: a
    /// first fit over them would read them for nothing.
    Everywhere,
    /// A chunk was left unread (its memo out of date, the reads used up), or the chunk chosen
    /// refused the block: a first fit may still find room.
    Unsure,
}

/// The reads of trees a best-fit search may still make, and whether it had to leave a chunk
/// unread for want of them.
struct Reads {
    left: usize,
    ran_out: bool,
}

/// Whose chunks a best-fit search prefers, for the calling core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Search {
    /// The core's own chunks: one of them that holds the block in a length class at most
    /// [`NEAR_CLASSES`] above the best fit anywhere, before the best fit in another core's
    /// chunk (see [`Arena::best_by_class`]).
    OwnFirst(usize),
    /// The best fit among every core's chunks.
    Anywhere(usize),
    /// The first of the core's own chunks in address order that holds the block (see
    /// [`Arena::first_own_fit`]); no other core's.
    FirstOwn(usize),
}

impl Search {
    fn core(self) -> usize {
        match self {
            Search::OwnFirst(core) | Search::Anywhere(core) | Search::FirstOwn(core) => core,
        }
    }
}

/// Own chunks a first fit reads in address order before it turns to the length classes for
/// the chunks after them ([`Arena::first_own_fit`]).
const FIRST_FIT_WALK: usize = 128;

/// Length classes above the best fit anywhere that a core's own chunk may be in and still come
/// first ([`Search::OwnFirst`]): one doubling of the stretch's length.
const NEAR_CLASSES: usize = PER_DOUBLING as usize;

/// Where a best-fit search put a block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    pub(crate) chunk: usize,
    /// Its first unit in the chunk.
    pub(crate) start: u64,
    /// The core that owns the chunk.
    pub(crate) owner: usize,
}

impl Arena {
    /// Take block `b` in the free stretch of a core chunk that fits it best, from a multiple of
    /// `align` units (see [`Arena::take_stretch`]), with the calling core's own chunks first
    /// as `search` says: the chunk whose longest free stretch is the shortest that holds the
    /// block, known from the stretch memos (frees keep them valid), found through their length
    /// classes ([`Arena::best_by_class`]), or, when those have none, among the first
    /// [`COMPARED`] chunks that hold it in address order of those whose memo may be out of
    /// date (the unsure chunks of `stretch_classes.rs`: with the classes, the index is exact);
    /// at most [`FRESH_READS`] trees are read for chunks whose memo is out of date.
    /// `seen` keeps the longest stretch (in units) learnt of on the way. When no chunk took it,
    /// whether a first fit (which reads every chunk that may hold it) could still find room.
    ///
    /// A memo bounds its chunk's longest stretch from above, so the chunk chosen may not hold
    /// the block after all; its search then records what it does hold, and the search runs
    /// again without it, at most [`MEMO_CORRECTIONS`] times (each with [`FRESH_READS`] reads).
    pub(crate) fn take_best_stretch(
        &self,
        b: &BuddyLayout,
        align: u64,
        bank: u64,
        search: Search,
        seen: &mut u64,
    ) -> Result<Taken, Missed> {
        for _ in 0..=MEMO_CORRECTIONS {
            let mut reads = Reads { left: FRESH_READS, ran_out: false };
            let best = match search {
                Search::FirstOwn(core) => self.first_own_fit(b, bank, core, &mut reads, seen),
                _ => self
                    .best_by_class(b, bank, search, &mut reads, seen)
                    .or_else(|| self.best_by_address(b, bank, search, &mut reads, seen)),
            };
            let Some((_, chunk, owner)) = best else {
                // The classes and the unsure chunks ruled out every core chunk: a chunk the
                // search could not read is the only one that might hold the block.
                return Err(if reads.ran_out { Missed::Unsure } else { Missed::Everywhere });
            };
            match self.take_stretch(chunk, b, align, bank) {
                Ok(start) => return Ok(Taken { chunk, start, owner }),
                Err(longest) => {
                    *seen = (*seen).max(longest);
                    // Only a search from a bank boundary records the chunk's memo: a coarser
                    // one would choose the same chunk again.
                    if align != bank {
                        return Err(Missed::Unsure);
                    }
                }
            }
        }
        Err(Missed::Unsure)
    }

    /// The longest free stretch of core chunk `chunk` if it holds `b`, as its memo knows it
    /// (or its tree, read while `reads` lasts, when the memo is out of date); `seen` keeps the
    /// longest read from a tree (a memo only bounds its chunk's stretches from above: an
    /// allocation through the buddy path shortens them and leaves it as it is). A chunk whose
    /// rest a run's tail hid holds nothing until that rest is shown (`tail.rs`), as for the
    /// cores' searches.
    #[inline]
    fn holding(&self, chunk: usize, b: &BuddyLayout, bank: u64, reads: &mut Reads, seen: &mut u64) -> Option<u64> {
        let (free, probe) = self.lines[chunk].space.look_shown(self.geometry.depth)?;
        if free < b.units {
            return None;
        }
        let longest = match self.lines[chunk].stretch.known(probe.epoch()) {
            Some(longest) => longest.min(free),
            None => match self.read_longest(chunk, bank, (free, probe), &mut reads.left) {
                Some(longest) => {
                    *seen = (*seen).max(longest);
                    longest
                }
                None => {
                    reads.ran_out = true;
                    return None;
                }
            },
        };
        (longest >= b.units).then_some(longest)
    }

    /// A chunk that a length class names, as a search through the classes looks at it: passed
    /// over after one load when its memo, of whatever epoch, rules `b` out (an out-of-date one
    /// is unsure, and the searches of the unsure chunks look at it), or when it is no core
    /// chunk or its owner is not `wanted`; else its longest stretch if it holds `b`
    /// ([`Arena::holding`]), and its owner.
    #[inline]
    fn class_member_holding(
        &self,
        chunk: usize,
        b: &BuddyLayout,
        bank: u64,
        reads: &mut Reads,
        seen: &mut u64,
        wanted: impl Fn(usize) -> bool,
    ) -> Option<(u64, usize)> {
        if self.lines[chunk].stretch.recorded().is_some_and(|longest| longest < b.units) {
            return None;
        }
        let ChunkState::Core(owner) = self.global.state(chunk) else {
            return None;
        };
        if !wanted(owner) {
            return None;
        }
        Some((self.holding(chunk, b, bank, reads, seen)?, owner))
    }

    /// The best fit through the length classes (`stretch_classes.rs`): the class of `b`'s
    /// length first (some of its chunks hold `b`), then the longer ones (all of theirs do,
    /// while their memos hold), and in the first class with a chunk that holds `b`, the best fit
    /// ([`Arena::best_in_class`]). With [`Search::OwnFirst`], the calling core's own chunks
    /// first: the best fit among them, unless another core's chunk holds the block in a class
    /// more than [`NEAR_CLASSES`] lower. Returns the chunk's longest stretch, the chunk and its
    /// owner.
    ///
    /// A block placed in another core's chunk makes the two cores' threads write the same tree
    /// and chunk line, here and again at its free, and a search over every chunk reads the
    /// memos that other cores' frees write. Once the global pool has no chunk left (16 core
    /// pools of a 1 GiB arena only half full run out of chunks), every core places its large
    /// blocks this way; over every chunk alike, 16 threads put 93% of them in other cores'
    /// chunks. Only below 2/3 of the capacity in use (`Pool::place_packed`): at 80% the own
    /// chunks first failed 783 allocations of 12.8 million where the best fit anywhere failed
    /// none (`BENCHMARKS.md`).
    fn best_by_class(
        &self,
        b: &BuddyLayout,
        bank: u64,
        search: Search,
        reads: &mut Reads,
        seen: &mut u64,
    ) -> Option<(u64, usize, usize)> {
        let (first, end) = (class_of(b.units), classes_up_to(self.geometry.units_per_chunk()));
        let Search::OwnFirst(core) = search else {
            return self.first_class_fit(first..end, &|_| u64::MAX, b, bank, reads, seen).map(|(_, best)| best);
        };
        let own = &self.cores[core];
        let theirs = |w: usize| !own.owned_word(w);
        let Some((class, mine)) = self.first_class_fit(first..end, &|w| own.owned_word(w), b, bank, reads, seen) else {
            return self.first_class_fit(first..end, &theirs, b, bank, reads, seen).map(|(_, best)| best);
        };
        let better = self.first_class_fit(first..class.saturating_sub(NEAR_CLASSES), &theirs, b, bank, reads, seen);
        Some(better.map_or(mine, |(_, best)| best))
    }

    /// The first of core `core`'s chunks in address order that holds `b`, as its memo (or its
    /// tree, while `reads` lasts) says. Returns the chunk's longest stretch, the chunk and
    /// `core`. A first fit keeps blocks low in the core's chunks, as its buddy searches do
    /// (`Pool::place_in_own`): a best fit would choose the shown rest of a chunk that a run's
    /// tail shares (the tightest stretch), and blocks that stay there keep the chunk from
    /// joining the free chunks around it when the run goes (`tail.rs`).
    ///
    /// The first [`FIRST_FIT_WALK`] own chunks are walked in address order: the class bytes
    /// of 64 chunks in a line rule out those whose memo is of a shorter class than the block
    /// (`StretchClasses::may_hold_word`), and the others are read, each ruled out by its memo
    /// in one load of its own line (a line its core's threads write). Past those, the length
    /// classes find the lowest chunk that holds the block ([`Arena::first_own_fit_from`]).
    /// The classes alone read every class from the block's up: lines that every core's memo
    /// moves write, and with two threads of one pool running at once, the walk over them cost
    /// each thread about 31 ns a step of the churn at 50% (`BENCHMARKS.md`).
    fn first_own_fit(
        &self,
        b: &BuddyLayout,
        bank: u64,
        core: usize,
        reads: &mut Reads,
        seen: &mut u64,
    ) -> Option<(u64, usize, usize)> {
        let own = &self.cores[core];
        let class = class_of(b.units);
        let mut walked = 0;
        for w in 0..self.geometry.chunks.div_ceil(64) {
            let owned = own.owned_word(w);
            if owned == 0 {
                continue;
            }
            // The own chunk where the walk ends, if in this word: the one after the first
            // FIRST_FIT_WALK own chunks.
            let mut end = None;
            let in_word = owned.count_ones() as usize;
            if walked + in_word > FIRST_FIT_WALK {
                let mut left = owned;
                for _ in walked..FIRST_FIT_WALK {
                    left &= left - 1;
                }
                end = Some(w * 64 + left.trailing_zeros() as usize);
            }
            walked += in_word;
            let unsure = self.stretch_classes.unsure_word(w);
            let mut read = owned & (unsure | self.stretch_classes.may_hold_word(w, class));
            while read != 0 {
                let chunk = w * 64 + read.trailing_zeros() as usize;
                read &= read - 1;
                if end.is_some_and(|end| chunk >= end) {
                    break;
                }
                let held = if unsure & 1 << (chunk % 64) != 0 {
                    self.settle_unsure(chunk);
                    self.holding(chunk, b, bank, reads, seen)
                } else {
                    self.class_member_holding(chunk, b, bank, reads, seen, |o| o == core).map(|(longest, _)| longest)
                };
                if let Some(longest) = held {
                    return Some((longest, chunk, core));
                }
            }
            if let Some(end) = end {
                return self.first_own_fit_from(end, b, bank, core, reads, seen);
            }
        }
        None
    }

    /// [`Arena::first_own_fit`] among core `core`'s chunks from `from` on, through the length
    /// classes: the lowest of the first such chunk of each class from `b`'s up and the first
    /// such unsure chunk (each search looks only below the lowest found so far).
    fn first_own_fit_from(
        &self,
        from: usize,
        b: &BuddyLayout,
        bank: u64,
        core: usize,
        reads: &mut Reads,
        seen: &mut u64,
    ) -> Option<(u64, usize, usize)> {
        let own = &self.cores[core];
        let mut first: Option<(u64, usize, usize)> = None;
        let limit = |first: &Option<(u64, usize, usize)>| first.map_or(usize::MAX, |(_, chunk, _)| chunk);
        for class in class_of(b.units)..classes_up_to(self.geometry.units_per_chunk()) {
            let below = limit(&first);
            // Only the words of chunks below the lowest found so far.
            let mask = |w: usize| if w * 64 < below { own.owned_word(w) } else { 0 };
            for chunk in self.stretch_classes.chunks_in(class, from, &mask) {
                if chunk >= below {
                    break;
                }
                if let Some((longest, _)) = self.class_member_holding(chunk, b, bank, reads, seen, |o| o == core) {
                    first = Some((longest, chunk, core));
                    break;
                }
            }
        }
        let below = limit(&first);
        for w in from / 64..self.geometry.chunks.div_ceil(64).min(below.div_ceil(64)) {
            let mut unsure = own.owned_word(w) & self.stretch_classes.unsure_word(w);
            if w == from / 64 {
                unsure &= !((1u64 << (from % 64)) - 1);
            }
            while unsure != 0 {
                let chunk = w * 64 + unsure.trailing_zeros() as usize;
                unsure &= unsure - 1;
                if chunk >= below {
                    return first;
                }
                self.settle_unsure(chunk);
                if let Some(longest) = self.holding(chunk, b, bank, reads, seen) {
                    return Some((longest, chunk, core));
                }
            }
        }
        first
    }

    /// The first of `classes` with a chunk that `mask` keeps and that holds `b`, and the best
    /// fit there ([`Arena::best_in_class`]).
    #[inline]
    fn first_class_fit(
        &self,
        classes: std::ops::Range<usize>,
        mask: &dyn Fn(usize) -> u64,
        b: &BuddyLayout,
        bank: u64,
        reads: &mut Reads,
        seen: &mut u64,
    ) -> Option<(usize, (u64, usize, usize))> {
        for class in classes {
            if let Some(best) = self.best_in_class(class, mask, b, bank, reads, seen) {
                return Some((class, best));
            }
        }
        None
    }

    /// The best fit in length class `class` among the chunks `mask` keeps (a bitmap word of
    /// chunks, by word index): of the first [`COMPARED`] chunks that hold `b`, the one whose
    /// longest stretch is the shortest. A chunk whose memo, of whatever epoch, rules the block
    /// out is passed over after one load of the memo table: an out-of-date one is unsure, and
    /// [`Arena::best_by_address`] looks at it.
    #[inline]
    fn best_in_class(
        &self,
        class: usize,
        mask: &dyn Fn(usize) -> u64,
        b: &BuddyLayout,
        bank: u64,
        reads: &mut Reads,
        seen: &mut u64,
    ) -> Option<(u64, usize, usize)> {
        let mut best = BestFit::default();
        for chunk in self.stretch_classes.chunks_in(class, 0, mask) {
            let Some((longest, owner)) = self.class_member_holding(chunk, b, bank, reads, seen, |_| true) else {
                continue;
            };
            if best.offer(longest, chunk, owner, b.units) {
                break;
            }
        }
        best.best
    }

    /// The best fit over the calling core's chunks in address order and then the other
    /// cores' (with [`Search::OwnFirst`], the other cores' only when none of its own holds
    /// the block), for when the length classes had none: the chunks whose memo may be out of
    /// date or was never written (the unsure ones; with the classes, every chunk that might
    /// hold the block). A chunk visited whose memo is valid is no longer unsure.
    fn best_by_address(
        &self,
        b: &BuddyLayout,
        bank: u64,
        search: Search,
        reads: &mut Reads,
        seen: &mut u64,
    ) -> Option<(u64, usize, usize)> {
        let core = search.core();
        let cores = self.cores.len();
        let words = self.geometry.chunks.div_ceil(64);
        let mut best = BestFit::default();
        for i in 0..cores {
            let owner = (core + i) % cores;
            let pool = &self.cores[owner];
            for w in 0..words {
                let unsure = self.stretch_classes.unsure_word(w);
                let mut owned = pool.owned_word(w) & unsure;
                while owned != 0 {
                    let chunk = w * 64 + owned.trailing_zeros() as usize;
                    owned &= owned - 1;
                    if unsure & 1 << (chunk % 64) != 0 {
                        self.settle_unsure(chunk);
                    }
                    let Some(longest) = self.holding(chunk, b, bank, reads, seen) else {
                        continue;
                    };
                    if best.offer(longest, chunk, owner, b.units) {
                        return best.best;
                    }
                }
            }
            if i == 0 && matches!(search, Search::OwnFirst(_)) && best.best.is_some() {
                return best.best;
            }
        }
        best.best
    }

    /// An unsure chunk whose memo is valid now is no longer unsure (unless a step comes
    /// meanwhile). One whose memo is out of date gets its free units as its memo: no stretch
    /// is longer than the units free, and the next search that finds the chunk in that class
    /// reads its tree for the exact figure (a memo may promise more than the tree holds). So
    /// a chunk with little room is unsure once, not at every search that reaches this far.
    fn settle_unsure(&self, chunk: usize) {
        let space = &self.lines[chunk].space;
        let (free, probe) = space.look();
        if self.lines[chunk].stretch.known(probe.epoch()).is_some() {
            self.stretch_classes.settle(chunk, || space.moved_since(probe));
        } else {
            self.record_stretch(chunk, probe.epoch(), free, None, free);
        }
    }

    /// Take block `b` in `chunk` at the start of the smallest free stretch that holds it from a
    /// multiple of `align` units (a power of two, at least `bank` units: a bank, the finest
    /// start of a block larger than a bank); returns its start (in units). Otherwise (no
    /// stretch holds it, or a concurrent claim took part of the one found) the longest free
    /// stretch from a bank boundary that the search learnt of (0 when it learnt nothing).
    ///
    /// When the memo knows where the longest stretch is and no other stretch holds the block
    /// ([`Place`]), that stretch is the fit: the block is claimed there without reading the
    /// tree (if a concurrent claim took part of it, the tree is read after all).
    pub(crate) fn take_stretch(&self, chunk: usize, b: &BuddyLayout, align: u64, bank: u64) -> Result<u64, u64> {
        let space = &self.lines[chunk].space;
        let (free, probe) = space.look();
        if free < b.units {
            return Err(0);
        }
        let memo = &self.lines[chunk].stretch;
        if memo.rules_out(probe.epoch(), b.units) {
            // Nothing read: the memo only bounds the stretches from above.
            return Err(0);
        }
        if align == bank {
            if let Some((longest, place)) = memo.placed(probe.epoch(), free) {
                if b.units > place.others && b.units <= longest && self.claim_at(chunk, b, place.start) {
                    // Allocations leave the epoch as it is: what is left after this block is
                    // known, and where.
                    let (left, place_left) = place.after_claim(longest, (place.start, place.start + b.units), bank);
                    self.record_stretch(chunk, probe.epoch(), left, place_left, free - b.units);
                    return Ok(place.start);
                }
            }
        }
        let (fit, shift) = self.fit_in(chunk, b.units, align);
        let len = b.units.div_ceil(1 << shift);
        let granule_align = (align >> shift).max(1);
        // The memo keeps stretches from a bank boundary: a coarser search says nothing of them.
        // Places are kept for trees read unit by unit.
        let seen = if align == bank { fit.longest << shift } else { 0 };
        if align == bank {
            self.record_stretch(chunk, probe.epoch(), seen, (shift == 0).then(|| fit.place()), free);
        }
        let start = fit.at.ok_or(seen)?.0 << shift;
        if !self.claim_at(chunk, b, start) {
            return Err(seen);
        }
        // Allocations leave the epoch as it is: what is left after this block is known.
        if align == bank {
            let (after, place) = fit.after_taking(len, granule_align);
            self.record_stretch(chunk, probe.epoch(), after << shift, (shift == 0).then_some(place), free - b.units);
        }
        Ok(start)
    }

    /// The longest free stretch of `chunk` from a multiple of `bank` units, in units, read from
    /// its tree (while `reads` lasts: each read of a tree takes one) and recorded, when it may
    /// pass `above` units: not when the chunk's memo, valid, or its free units say it does
    /// not. `None` when it cannot pass `above`, or `reads` ran out.
    pub(crate) fn longest_stretch_above(&self, chunk: usize, bank: u64, above: u64, reads: &mut usize) -> Option<u64> {
        let (free, probe) = self.lines[chunk].space.look();
        if free <= above || self.lines[chunk].stretch.known(probe.epoch()).is_some_and(|longest| longest <= above) {
            return None;
        }
        self.read_longest(chunk, bank, (free, probe), reads)
    }

    /// The longest free stretch from a multiple of `bank` units that the chunks of the highest
    /// length classes hold (`stretch_classes.rs`), in units: a lower bound, a stretch that was
    /// free when read, for an out-of-memory error.
    ///
    /// From the highest class down, a core chunk whose place (`stretches.rs`) is valid gives
    /// its longest stretch without a read; any other is read while `reads` lasts, unless its
    /// valid memo says it cannot pass what was found. The walk stops at the first class whose
    /// chunks cannot pass that, or once it has visited `visits` chunks (each visit takes one).
    /// The memos are upper bounds, so the first chunks of the highest class mostly end it.
    ///
    /// A read records nothing: the error leaves the memos, and so the placements that follow,
    /// as they were.
    pub(crate) fn longest_stretch_by_class(&self, bank: u64, reads: &mut usize, visits: &mut usize) -> u64 {
        let mut largest = 0;
        for class in (0..classes_up_to(self.geometry.units_per_chunk())).rev() {
            if largest >= class_floor(class + 1).saturating_sub(1) {
                break; // every memo of this class or a lower one is shorter than that
            }
            if self.stretch_classes.looks_empty(class) {
                continue;
            }
            for chunk in self.stretch_classes.chunks(class, 0) {
                *visits = match visits.checked_sub(1) {
                    Some(left) => left,
                    None => return largest,
                };
                // A chunk back in the global pool keeps its memo and epoch, but its tree is
                // retired: its room is the free runs'.
                if !matches!(self.global.state(chunk), ChunkState::Core(_)) {
                    continue;
                }
                let (free, probe) = self.lines[chunk].space.look();
                if let Some((longest, _)) = self.lines[chunk].stretch.placed(probe.epoch(), free) {
                    largest = largest.max(longest);
                } else if free > largest
                    && self.lines[chunk].stretch.known(probe.epoch()).is_none_or(|longest| longest > largest)
                {
                    let Some(left) = reads.checked_sub(1) else { continue };
                    *reads = left;
                    let (fit, shift) = self.fit_in(chunk, 1, bank);
                    largest = largest.max(fit.longest << shift);
                }
            }
        }
        largest
    }

    /// The longest free stretch of `chunk` from a multiple of `bank` units, read from its tree
    /// after `look` (its free units and epoch then; while `reads` lasts) and recorded in its
    /// memo.
    fn read_longest(&self, chunk: usize, bank: u64, (free, probe): (u64, Probe), reads: &mut usize) -> Option<u64> {
        *reads = reads.checked_sub(1)?;
        let (fit, shift) = self.fit_in(chunk, 1, bank);
        let longest = fit.longest;
        self.record_stretch(chunk, probe.epoch(), longest << shift, (shift == 0).then(|| fit.place()), free);
        Some(longest << shift)
    }

    /// The free units at the start and at the end of core chunk `chunk` (whole granules, as
    /// [`Arena::free_units_at_start`] and [`Arena::free_units_at_end`] read them), from one read
    /// of its tree; when its stretch memo is out of date, the longest stretch that read finds
    /// is recorded, so the next search skips the chunk after two loads while nothing is freed
    /// there.
    pub(crate) fn free_ends(&self, chunk: usize, bank: u64) -> (u64, u64) {
        let (_, probe) = self.lines[chunk].space.look();
        let mut bits = [0u64; (MAX_GRANULES / 64) as usize];
        let (granules, shift) = self.read_granules(chunk, &mut bits);
        let bits = &bits[..granules.div_ceil(64) as usize];
        if self.lines[chunk].stretch.known(probe.epoch()).is_none() {
            let longest = best_fit(bits, granules, 1, (bank >> shift).max(1)).longest;
            self.record_stretch(chunk, probe.epoch(), longest << shift, None, 0);
        }
        let usable = self.geometry.usable_units(chunk);
        let first =
            bits.iter().position(|&w| w != 0).map_or(granules, |w| w as u64 * 64 + u64::from(bits[w].trailing_zeros()));
        let last =
            bits.iter().rposition(|&w| w != 0).map_or(0, |w| w as u64 * 64 + 64 - u64::from(bits[w].leading_zeros()));
        ((first << shift).min(usable), usable - (last << shift).min(usable))
    }

    /// [`Arena::unmark_buddy_coalesced`] (the free path's release of block `b` at unit `within`
    /// of `chunk`) that keeps the chunk's stretch memo valid across the free: the memo is
    /// raised to the free run around the block, read from the tree around it
    /// (`TreeShape::free_run_around`), instead of going out of date with the epoch step.
    #[inline(always)]
    pub(crate) fn unmark_buddy_raising(
        &self,
        chunk: usize,
        b: &BuddyLayout,
        within: u64,
    ) -> Result<Unmarked, &'static str> {
        let before = self.lines[chunk].stretch.before_free(&self.lines[chunk].space);
        // The free run around the block raises the memo, and the announcement takes the
        // levels of the largest free nodes from it too.
        let released = self.unmark_buddy_coalesced(chunk, b, within, before.is_some())?;
        let raised = || match (before, released.run) {
            (Some(before), Some(run)) => self.raise_after_free(chunk, before, b.units, run),
            _ => false,
        };
        if !raised() {
            // The memo was out of date before, or another step came between.
            self.stretch_classes.mark_unsure(chunk);
        }
        Ok(released)
    }

    /// The second half of [`Arena::unmark_buddy_raising`], once `freed` units of `chunk` are
    /// released, the epoch advanced and the free run around them read (`run`). Returns
    /// whether the memo is valid again.
    #[inline(never)]
    fn raise_after_free(&self, chunk: usize, before: Probe, freed: u64, run: (u64, u64)) -> bool {
        let bank = self.geometry.bank_units;
        let raised = self.lines[chunk].stretch.after_free(&self.lines[chunk].space, before, bank, freed, || run);
        if let Some((known, longest)) = raised {
            self.stretch_classes.moved(chunk, Some(known), longest, || self.lines[chunk].stretch.recorded());
        }
        raised.is_some()
    }

    /// After a claim that took units of `chunk` without reading its tree (a block at a chunk's
    /// free end, a front, a tail): the chunk's memo, when valid and longer than the units now
    /// free, is lowered to them (no stretch is longer), so that the length classes do not keep
    /// a chunk that its ends filled among the long ones, where every best-fit search and every
    /// failing allocation would look at it again.
    pub(crate) fn cap_memo_at_free(&self, chunk: usize) {
        let (free, probe) = self.lines[chunk].space.look();
        if self.lines[chunk].stretch.known(probe.epoch()).is_some_and(|longest| longest > free) {
            self.record_stretch(chunk, probe.epoch(), free, None, free);
        }
    }

    /// After a claim of units `[at, at + units)` of `chunk` that read no tree (a block at a
    /// chunk's free end, a front, a tail), with `before` the chunk's free units and epoch read
    /// before the claim: when the memo knew the place of the longest stretch then, the memo
    /// and the place after the claim are known too ([`Place::after_claim`]), tagged with the
    /// free units that this claim alone leaves (a claim that came between leaves the place
    /// unread, and the memo an upper bound still). Otherwise the memo is capped at the free
    /// units ([`Arena::cap_memo_at_free`]). So a chunk that fronts, tails and the frontier
    /// fill from its start keeps an exact memo (its free end), and after a fill of
    /// 4-64 KiB blocks a failing allocation does not find some 180 chunks whose memo (their
    /// free units, in slivers shorter than a bank) promised room: it read each one's tree,
    /// 0.8 ms.
    pub(crate) fn keep_memo_after_claim(&self, chunk: usize, (free, probe): (u64, Probe), at: u64, units: u64) {
        match self.lines[chunk].stretch.placed(probe.epoch(), free) {
            Some((longest, place)) if free >= units => {
                let (longest, place) = place.after_claim(longest, (at, at + units), self.geometry.bank_units);
                self.record_stretch(chunk, probe.epoch(), longest, place, free - units);
            }
            _ => self.cap_memo_at_free(chunk),
        }
    }

    /// After a claim on the buddy path left `chunk` with `free` units at epoch `probe` (what
    /// [`ChunkSpace::take`] returned): the chunk's memo, when valid and of a higher length
    /// class than the units now free, is lowered to them (no stretch is longer). So a chunk
    /// that small blocks fill leaves the long classes one class at a time (a few writes per
    /// doubling of its free units, not one per allocation), and a failing search for a large
    /// block finds it neither there nor unsure: after 1 GiB of slab objects, the first
    /// failing 1 MiB allocation settled every chunk, 15 us, before the memos were known from
    /// the grant on ([`Arena::open`]).
    ///
    /// [`ChunkSpace::take`]: super::chunk_space::ChunkSpace::take
    #[inline]
    pub(crate) fn lower_memo_after_take(&self, chunk: usize, (free, probe): (u64, Probe)) {
        let memo = &self.lines[chunk].stretch;
        if memo.known(probe.epoch()).is_some_and(|longest| class_of(longest) > class_of(free)) {
            self.record_stretch(chunk, probe.epoch(), free, None, free);
        }
    }

    /// A chunk just opened for a core holds no stretch longer than its free units: its memo
    /// says so, so that it is not unsure (`stretch_classes.rs`) while the buddy path fills it,
    /// which lowers the memo as it goes ([`Arena::lower_memo_after_take`]).
    pub(crate) fn know_stretch_of_opened(&self, chunk: usize) {
        let (free, probe) = self.lines[chunk].space.look();
        // An empty chunk is one stretch from its start: its place is known.
        let place = (free == self.geometry.usable_units(chunk)).then_some(Place { start: 0, others: 0 });
        self.record_stretch(chunk, probe.epoch(), free, place, free);
    }

    /// Record in `chunk`'s stretch memo that a search that probed `epoch` found no free
    /// stretch longer than `longest` units (at `place`, when known, with `free` units free),
    /// and move the chunk to that length's class. The chunk is no longer unsure unless a step
    /// came since `epoch`, and is unsure then even if it was sure before
    /// ([`StretchClasses::settle_written`](super::stretch_classes::StretchClasses::settle_written)).
    #[inline]
    fn record_stretch(&self, chunk: usize, epoch: u64, longest: u64, place: Option<Place>, free: u64) {
        let before = self.lines[chunk].stretch.record_placed(epoch, longest, place, free);
        self.stretch_classes.moved(chunk, before, longest, || self.lines[chunk].stretch.recorded());
        self.stretch_classes.settle_written(chunk, || self.lines[chunk].space.moved_since(Probe::of(epoch)));
    }

    /// The best fit in `chunk`'s tree for a block of `units` units from a multiple of `align`
    /// units (a power of two), and the shift of the granules its lengths count
    /// (`stretches.rs`): read through the tree's leaf map when it has one
    /// ([`best_fit_in_tree`], granules of one unit), else copied into a bitmap first.
    fn fit_in(&self, chunk: usize, units: u64, align: u64) -> (Fit, u32) {
        if let Some(fit) = best_fit_in_tree(&self.shape, self.tree(chunk), units, align) {
            return (fit, 0);
        }
        let mut bits = [0u64; (MAX_GRANULES / 64) as usize];
        let (granules, shift) = self.read_granules(chunk, &mut bits);
        let bits = &bits[..granules.div_ceil(64) as usize];
        (best_fit(bits, granules, units.div_ceil(1 << shift), (align >> shift).max(1)), shift)
    }

    /// Read `chunk`'s tree into `bits` (a set bit is an allocated granule): the granules and
    /// the granule's shift (`stretches.rs`).
    fn read_granules(&self, chunk: usize, bits: &mut [u64]) -> (u64, u32) {
        let shift = granule_shift(self.geometry.depth);
        let granules = self.geometry.units_per_chunk() >> shift;
        self.shape.allocated_granules(self.tree(chunk), shift, &mut bits[..granules.div_ceil(64) as usize]);
        (granules, shift)
    }

    /// Claim the nodes of block `b` from unit `start` of `chunk` (cleaning phantom marks under
    /// them), and count its units as taken; `false` (nothing claimed) when a unit is in use.
    pub(crate) fn claim_at(&self, chunk: usize, b: &BuddyLayout, start: u64) -> bool {
        let depth = self.geometry.depth;
        let tree = self.tree(chunk);
        let space = &self.lines[chunk].space;
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
        self.take_units(chunk, b.units);
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! Random allocations and frees of blocks larger than a bank (many placed in free
    //! stretches) against a reference model of every chunk's units: the trees hold exactly
    //! the units the live blocks cover, and no stretch memo that is still valid rules out a
    //! stretch the reference has free (frees raise the memos, so most stay valid).
    use super::{Missed, Search, FIRST_FIT_WALK, FRESH_READS, NEAR_CLASSES};
    use crate::arena::global::ChunkState;
    use crate::arena::release::Vouched;
    use crate::arena::stretch_classes::{class_of, StretchClasses};
    use crate::arena::stretches::best_fit;
    use crate::config::{Backing, PoolConfig};
    use crate::pool::pool::Pool;

    use crate::arena::stretches::tests::Rng;

    const MIB: usize = 1 << 20;

    /// The free stretches of a bitmap of `units` units (a set bit is allocated): each one's
    /// first multiple of `bank` and its length from there (those that hold one).
    fn stretches(bits: &[u64], units: u64, bank: u64) -> Vec<(u64, u64)> {
        let free = |u: u64| bits[(u / 64) as usize] >> (u % 64) & 1 == 0;
        let mut out = Vec::new();
        let mut u = 0;
        while u < units {
            if !free(u) {
                u += 1;
                continue;
            }
            let end = (u..units).find(|&v| !free(v)).unwrap_or(units);
            let first = u.next_multiple_of(bank);
            if first < end {
                out.push((first, end - first));
            }
            u = end;
        }
        out
    }

    /// A size from `lo` to `hi`, log-uniform.
    fn log_uniform(rng: &mut Rng, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((a + (b - a) * u).exp() as usize).clamp(lo, hi)
    }

    /// A chunk's memo is known from its grant on, and the buddy path lowers it as small blocks
    /// fill the chunk: after an arena filled with small blocks (slab objects and blocks of at
    /// most a bank), no core chunk is unsure and none is in a length class above its free
    /// units, so the first failing search for a large block has no chunk to read or settle.
    #[test]
    fn chunks_that_small_blocks_fill_are_neither_unsure_nor_in_long_classes() {
        let p = Pool::new(PoolConfig::new(64 * MIB).cores(2).backing(Backing::None)).unwrap();
        let a = p.arena();
        let mut rng = Rng(11);
        let mut live = Vec::new();
        while let Ok(h) = p.alloc(log_uniform(&mut rng, 64, 4096), None, 0) {
            live.push(h);
        }
        let s = p.stats();
        assert!(
            s.bytes_in_use as f64 > 0.75 * p.capacity() as f64,
            "{} of {} bytes in use",
            s.bytes_in_use,
            p.capacity()
        );
        let mut core_chunks = 0;
        for chunk in 0..a.geometry.chunks {
            if !matches!(a.global.state(chunk), ChunkState::Core(_)) {
                continue;
            }
            core_chunks += 1;
            let unsure = a.stretch_classes.unsure_word(chunk / 64) >> (chunk % 64) & 1 == 1;
            let (free, probe) = a.lines[chunk].space.look();
            let longest = a.lines[chunk].stretch.known(probe.epoch());
            assert!(!unsure && longest.is_some(), "chunk {chunk}: unsure, memo {longest:?}");
            assert!(class_of(longest.unwrap()) <= class_of(free), "chunk {chunk}: memo {longest:?}, {free} units free");
        }
        assert!(core_chunks >= 30, "{core_chunks} core chunks");
        let large = a.geometry.buddy_layout(MIB).unwrap();
        let bank = a.geometry.bank_units(p.config().bank_size);
        let mut seen = 0;
        let missed = a.take_best_stretch(&large, bank, bank, Search::Anywhere(0), &mut seen);
        assert_eq!(missed.err(), Some(Missed::Everywhere), "the classes rule every chunk out");
        for h in live {
            p.free(h).unwrap();
        }
        assert_eq!(p.check().unwrap(), 0);
    }

    /// Claims that read no tree (fronts, their tails, blocks at the frontier) keep the memo
    /// exact through its place: after an arena filled with 4-64 KiB blocks, which fronts and
    /// the frontier tile across chunk ends, no core chunk's valid memo promises a stretch from
    /// a bank boundary that its tree does not have, for a block of a bank or more. Before,
    /// such claims left the memo at the chunk's free units (in slivers shorter than a bank):
    /// 182 of 512 chunks here, and the first failing allocation revealed and read them all.
    #[test]
    fn chunks_that_fronts_and_the_frontier_fill_keep_exact_memos() {
        // The same sequence twice: to its first failure, then on a fresh pool up to it (the
        // failing path reads trees and corrects the memos on the way). A thread that moves to
        // another CPU between the runs allocates from the other core pool, so the second run
        // may place a little differently and fail a few blocks short.
        let config = PoolConfig::new(1024 * MIB).cores(2).backing(Backing::None);
        let sizes = |rng: &mut Rng| log_uniform(rng, 4 << 10, 64 << 10);
        let (mut rng, first) = (Rng(3), Pool::new(config.clone()).unwrap());
        let placed = std::iter::from_fn(|| first.alloc(sizes(&mut rng), None, 0).ok()).count();
        let (mut rng, p) = (Rng(3), Pool::new(config).unwrap());
        let a = p.arena();
        let live: Vec<_> = (0..placed).map_while(|_| p.alloc(sizes(&mut rng), None, 0).ok()).collect();
        assert!(live.len() * 100 >= placed * 99, "{} of {placed} placed the second time", live.len());
        let bank = a.geometry.bank_units(p.config().bank_size);
        let (mut core_chunks, mut loose, mut fronts) = (0, Vec::new(), 0);
        for chunk in 0..a.geometry.chunks {
            if !matches!(a.global.state(chunk), ChunkState::Core(_)) {
                continue;
            }
            core_chunks += 1;
            fronts += usize::from(a.fronts[chunk].load(std::sync::atomic::Ordering::Acquire) != 0);
            let (_, probe) = a.lines[chunk].space.look();
            let Some(longest) = a.lines[chunk].stretch.known(probe.epoch()) else { continue };
            let (fit, shift) = a.fit_in(chunk, 1, bank);
            let exact = fit.longest << shift;
            assert!(longest >= exact, "chunk {chunk}: memo {longest} below its longest stretch {exact}");
            if longest >= bank && longest > exact {
                loose.push((chunk, longest, exact));
            }
        }
        assert!(core_chunks >= 50 && fronts >= core_chunks / 4, "{core_chunks} core chunks, {fronts} with a front");
        assert!(loose.len() <= core_chunks / 50, "memos that promise too much: {loose:?} of {core_chunks} chunks");
        for h in live {
            p.free(h).unwrap();
        }
        assert_eq!(p.check().unwrap(), 0);
    }

    /// A memo is a bound: chunk 0's may promise a stretch its tree does not have (here 1,024
    /// units where three stretches of 512 are free). The best fit then chooses chunk 0 for a
    /// block of 768 units that only chunk 1 holds; the failed search records
    /// chunk 0's real stretch and the search runs again, which takes chunk 1.
    #[test]
    fn a_memo_that_promised_too_much_is_corrected_and_the_search_goes_on() {
        let p = Pool::new(PoolConfig::new(8 * MIB).cores(1).core_reserve(0).slab_sizes(Vec::new())).unwrap();
        let a = p.arena();
        let g = &a.geometry;
        let bank = g.bank_units(p.config().bank_size);
        // Chunks 0 and 1 filled with blocks of 512 units (128 KiB), in address order.
        let blocks: Vec<_> = (0..32).map(|_| p.alloc(128 << 10, None, 0).unwrap()).collect();
        let offsets: Vec<usize> = blocks.iter().map(|&h| p.block(h).unwrap().offset).collect();
        assert_eq!(offsets, (0..32).map(|i| i * (128 << 10)).collect::<Vec<_>>());
        // Three blocks' room free in chunk 0 apart, and side by side in chunk 1.
        let freed = [3, 5, 7, 16 + 3, 16 + 4, 16 + 5];
        for i in freed {
            p.free(blocks[i]).unwrap();
        }
        a.drain_block_caches();
        let epoch = |c: usize| a.lines[c].space.probe(0).unwrap().epoch();
        assert_eq!(a.lines[0].stretch.known(epoch(0)), Some(512));
        assert_eq!(a.lines[1].stretch.known(epoch(1)), Some(1536));
        a.record_stretch(0, epoch(0), 1024, None, 0);
        let b = g.buddy_layout(192 << 10).unwrap();
        assert_eq!(b.units, 768);
        let mut seen = 0;
        let taken =
            a.take_best_stretch(&b, bank, bank, Search::Anywhere(0), &mut seen).expect("chunk 1 holds the block");
        assert_eq!(taken.chunk, 1);
        assert!((3 * 512..=6 * 512 - 768).contains(&taken.start), "{taken:?}");
        assert_eq!(a.lines[0].stretch.known(epoch(0)), Some(512), "chunk 0's memo corrected");
        assert!(!a.claim_at(1, &b, taken.start), "the block's units are taken");
        // The block belongs to no handle: give it back through the arena.
        a.release_buddy(g.offset_of(1, taken.start), 192 << 10, false, Vouched::No).unwrap();
        for (i, h) in blocks.into_iter().enumerate() {
            if !freed.contains(&i) {
                p.free(h).unwrap();
            }
        }
        assert_eq!(p.check().unwrap(), 0);
    }

    /// With its own chunks first, a core's block goes to a free stretch of its own chunks
    /// before a tighter one in another core's chunk (which would make the two cores' threads
    /// write one tree), unless that one is tighter by more than a doubling, and to the other
    /// core's chunk when none of its own holds it; a search anywhere takes the tighter one.
    #[test]
    fn a_core_takes_a_stretch_of_its_own_chunks_before_a_tighter_one_of_another_core() {
        let p = Pool::new(PoolConfig::new(8 * MIB).cores(2).core_reserve(0).slab_sizes(Vec::new())).unwrap();
        let a = p.arena();
        let g = &a.geometry;
        let bank = g.bank_units(p.config().bank_size);
        // Core 0 owns chunk 0, core 1 chunk 1; each is full of blocks of 512 units (128 KiB).
        let block = g.buddy_layout(128 << 10).unwrap();
        assert_eq!(block.units, 512);
        let per_chunk = g.units_per_chunk() / 512;
        for (chunk, core) in [(0, 0), (1, 1)] {
            assert!(a.grant_exact(chunk, core));
            for i in 0..per_chunk {
                assert!(a.claim_at(chunk, &block, i * 512));
            }
            // The memo, known from the grant on, follows the claims as the allocation paths
            // keep it (`claim_at` alone leaves that to its caller).
            a.cap_memo_at_free(chunk);
        }
        // A stretch of three blocks (1,536 units) in core 0's chunk, of two (1,024 units, the
        // tighter fit for 768) in core 1's.
        let release = |chunk, start, bytes| {
            a.release_buddy(g.offset_of(chunk, start), bytes, false, Vouched::No).unwrap();
        };
        for (chunk, i) in [(0, 3), (0, 4), (0, 5), (1, 8), (1, 9)] {
            release(chunk, i * 512, 128 << 10);
        }
        for c in [0, 1] {
            a.read_ends(c);
        }
        let b = g.buddy_layout(192 << 10).unwrap();
        assert_eq!(b.units, 768);
        let mut seen = 0;
        let mut take = |search| {
            let t = a.take_best_stretch(&b, bank, bank, search, &mut seen).expect("a chunk holds the block");
            release(t.chunk, t.start, 192 << 10);
            (t.chunk, t.owner)
        };
        assert!(class_of(1536) <= class_of(1024) + NEAR_CLASSES);
        assert_eq!(take(Search::OwnFirst(0)), (0, 0), "core 0's own chunk, though core 1's fits tighter");
        assert_eq!(take(Search::OwnFirst(1)), (1, 1));
        assert_eq!(take(Search::Anywhere(0)), (1, 1), "the best fit anywhere");
        // Core 0's stretch five blocks long: core 1's fits far tighter.
        for i in [6, 7] {
            release(0, i * 512, 128 << 10);
        }
        a.read_ends(0);
        assert!(class_of(2560) > class_of(1024) + NEAR_CLASSES);
        assert_eq!(take(Search::OwnFirst(0)), (1, 1), "another core's chunk, more than a doubling tighter");
        // Core 0's stretch taken again: core 1's chunk is the only one that holds the block.
        for i in 3..8 {
            assert!(a.claim_at(0, &block, i * 512));
        }
        assert_eq!(take(Search::OwnFirst(0)), (1, 1), "core 0 has no chunk that holds it");
        for chunk in [0, 1] {
            for i in 0..per_chunk {
                if !(chunk == 1 && (i == 8 || i == 9)) {
                    release(chunk, i * 512, 128 << 10);
                }
            }
        }
        assert_eq!(p.check().unwrap(), 0);
    }

    /// A first fit of a core's own chunks takes the lowest chunk with a stretch that holds the
    /// block, though a higher one fits tighter, never another core's chunk, and says so when
    /// none of its own holds the block.
    #[test]
    fn a_first_fit_takes_the_lowest_own_chunk_that_holds_the_block() {
        let p = Pool::new(PoolConfig::new(8 * MIB).cores(2).core_reserve(0).slab_sizes(Vec::new())).unwrap();
        let a = p.arena();
        let g = &a.geometry;
        let bank = g.bank_units(p.config().bank_size);
        let block = g.buddy_layout(128 << 10).unwrap();
        let per_chunk = g.units_per_chunk() / block.units;
        for (chunk, core) in [(0, 0), (1, 0), (2, 0), (3, 1)] {
            assert!(a.grant_exact(chunk, core));
            for i in 0..per_chunk {
                assert!(a.claim_at(chunk, &block, i * block.units));
            }
        }
        let release = |chunk, start, bytes| {
            a.release_buddy(g.offset_of(chunk, start), bytes, false, Vouched::No).unwrap();
        };
        // Four blocks free in chunk 0 (room for two), none in chunk 1, two (the tightest fit, room
        // for one) in chunks 2 and 3.
        for (chunk, i) in [(0, 3), (0, 4), (0, 5), (0, 6), (2, 8), (2, 9), (3, 8), (3, 9)] {
            release(chunk, i * block.units, 128 << 10);
        }
        for c in 0..4 {
            a.read_ends(c);
        }
        let b = g.buddy_layout(192 << 10).unwrap();
        let mut seen = 0;
        let mut take = || a.take_best_stretch(&b, bank, bank, Search::FirstOwn(0), &mut seen);
        let t = take().expect("chunk 0 holds it");
        assert_eq!((t.chunk, t.start, t.owner), (0, 3 * block.units, 0), "the lowest chunk, at its stretch");
        let t = take().expect("chunk 0 still holds one");
        assert_eq!((t.chunk, t.start), (0, 3 * block.units + b.units), "next to the first");
        let t = take().expect("chunk 2 holds it");
        assert_eq!((t.chunk, t.owner), (2, 0), "chunk 0 is full: the next own chunk, not core 1's");
        assert!(take().is_err(), "no own chunk holds it, and core 1's is not searched");
    }

    /// Past the first [`FIRST_FIT_WALK`] own chunks, read in address order, the length classes
    /// find the lowest own chunk that holds the block: an unsure one too, and the lowest
    /// rather than the tightest.
    #[test]
    fn a_first_fit_past_the_walk_takes_the_lowest_own_chunk_through_the_classes() {
        let config = PoolConfig::new(512 * MIB).cores(1).core_reserve(0).slab_sizes(Vec::new()).backing(Backing::None);
        let p = Pool::new(config).unwrap();
        let a = p.arena();
        let g = &a.geometry;
        let bank = g.bank_units(p.config().bank_size);
        let block = g.buddy_layout(128 << 10).unwrap();
        let per_chunk = g.units_per_chunk() / block.units;
        let chunks = FIRST_FIT_WALK + 64;
        for chunk in 0..chunks {
            assert!(a.grant_exact(chunk, 0));
            for i in 0..per_chunk {
                assert!(a.claim_at(chunk, &block, i * block.units));
            }
            a.cap_memo_at_free(chunk);
        }
        let release = |chunk, start, bytes| {
            a.release_buddy(g.offset_of(chunk, start), bytes, false, Vouched::No).unwrap();
        };
        // Room for one block of 768 units in chunk 10 (inside the walk), in unsure chunk
        // walk + 12 and in chunk walk + 40 (two free blocks: the tightest fit); for two in
        // chunk walk + 20 (three free blocks).
        let (unsure, loose, tight) = (FIRST_FIT_WALK + 12, FIRST_FIT_WALK + 20, FIRST_FIT_WALK + 40);
        for (chunk, blocks) in [(10, 2), (unsure, 2), (loose, 3), (tight, 2)] {
            for i in 0..blocks {
                release(chunk, (4 + i) * block.units, 128 << 10);
            }
        }
        // The unsure chunk's memo says no block fits (so its class does not lead to it), then
        // a step leaves the memo out of date.
        a.record_stretch(unsure, a.lines[unsure].space.look().1.epoch(), 0, None, 0);
        a.lines[unsure].space.refresh();
        a.stretch_classes.mark_unsure(unsure);
        let b = g.buddy_layout(192 << 10).unwrap();
        assert_eq!(b.units, 768);
        let mut seen = 0;
        let mut take = || a.take_best_stretch(&b, bank, bank, Search::FirstOwn(0), &mut seen).map(|t| t.chunk);
        assert_eq!(take(), Ok(10), "inside the walk");
        assert_eq!(take(), Ok(unsure), "the unsure chunk, the lowest past the walk");
        assert_eq!(take(), Ok(loose), "the lowest past the walk, not the tightest");
        assert_eq!(take(), Ok(loose), "its second room");
        assert_eq!(take(), Ok(tight));
        assert!(take().is_err(), "no own chunk holds it any more");
    }

    /// A search that rules out every core chunk by its memo or tree says so (a failing
    /// allocation then skips the first fit, which would read the same memos again); one that
    /// left a chunk unread for want of reads does not, and the next search reads it.
    #[test]
    fn a_search_that_ruled_out_every_chunk_says_so_and_one_that_left_a_chunk_unread_does_not() {
        let p = Pool::new(PoolConfig::new(16 * MIB).cores(1).core_reserve(0).slab_sizes(Vec::new())).unwrap();
        let a = p.arena();
        let g = &a.geometry;
        let bank = g.bank_units(p.config().bank_size);
        let chunks = g.chunks;
        let per_chunk = g.chunk_size / (128 << 10);
        let blocks: Vec<_> = (0..chunks * per_chunk).map(|_| p.alloc(128 << 10, None, 0).unwrap()).collect();
        // Every other block free: stretches of 128 KiB (512 units) apart, in every chunk.
        for h in blocks.iter().step_by(2) {
            p.free(*h).unwrap();
        }
        a.drain_block_caches();
        let epoch = |c: usize| a.lines[c].space.probe(0).unwrap().epoch();
        for c in 0..chunks {
            a.read_ends(c);
            assert_eq!(a.lines[c].stretch.known(epoch(c)), Some(512), "chunk {c}'s memo");
        }
        let b = g.buddy_layout(192 << 10).unwrap();
        let mut seen = 0;
        assert_eq!(
            a.take_best_stretch(&b, bank, bank, Search::Anywhere(0), &mut seen).unwrap_err(),
            Missed::Everywhere
        );
        // The memos only bound the stretches from above: a search that read no tree learnt of
        // no stretch that is really free.
        assert_eq!(seen, 0);
        // One chunk more out of date than a search may read (as after a step that could not
        // carry their memos, which marks them unsure).
        for c in 0..=FRESH_READS {
            a.lines[c].stretch.record(epoch(c) + 1, 0);
            a.stretch_classes.mark_unsure(c);
        }
        assert_eq!(a.take_best_stretch(&b, bank, bank, Search::Anywhere(0), &mut seen).unwrap_err(), Missed::Unsure);
        assert_eq!(seen, 512, "the stretches the trees it read hold");
        assert_eq!(
            a.take_best_stretch(&b, bank, bank, Search::Anywhere(0), &mut seen).unwrap_err(),
            Missed::Everywhere
        );
        for c in 0..chunks {
            assert_eq!(a.lines[c].stretch.known(epoch(c)), Some(512), "chunk {c}'s memo read again");
        }
        // The memos, valid, rule every chunk out: the error reads the trees for its figure.
        let err = p.alloc(192 << 10, None, 0).unwrap_err();
        assert!(
            matches!(err, crate::error::Error::OutOfMemory { largest_free_block, .. } if largest_free_block == 128 << 10),
            "{err}"
        );
        for h in blocks.into_iter().skip(1).step_by(2) {
            p.free(h).unwrap();
        }
        assert_eq!(p.check().unwrap(), 0);
    }

    #[test]
    fn stretches_and_memos_agree_with_a_unit_model() {
        let p = Pool::new(PoolConfig::new(32 * MIB).cores(1).core_reserve(0).backing(Backing::None)).unwrap();
        let a = p.arena();
        let g = &a.geometry;
        let units = g.units_per_chunk();
        let bank = g.bank_units(4096); // the default bank
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        let mut live = Vec::new();
        let mut placed_off_node = 0;
        let (mut checks, mut valid_memos, mut exact_memos, mut sure, mut places) = (0, 0, 0, 0, 0);
        for step in 0..20_000 {
            if live.is_empty() || rng.next() % 100 < 55 {
                let size = log_uniform(&mut rng, 4097, MIB);
                if let Ok(h) = p.alloc(size, None, 0) {
                    let info = p.block(h).unwrap();
                    let b = g.buddy_layout(size).unwrap();
                    if g.unit_in_chunk(info.offset) & (b.enclosing - 1) != 0 {
                        placed_off_node += 1;
                    }
                    live.push(h);
                }
            } else {
                let i = (rng.next() as usize) % live.len();
                p.free(live.swap_remove(i)).unwrap();
            }
            if step % 250 != 249 {
                continue;
            }
            // Freed blocks that the caches of freed blocks keep are still allocated in their
            // trees: give them back, so that the trees hold only the live blocks.
            a.drain_block_caches();
            // The reference: per chunk, the units the live blocks cover.
            let mut model = vec![vec![0u64; (units / 64) as usize]; g.chunks];
            for &h in &live {
                let info = p.block(h).unwrap();
                let chunk = g.chunk_of(info.offset);
                let from = g.unit_in_chunk(info.offset);
                for u in from..from + (info.block_bytes / g.min_block) as u64 {
                    // A block with a front goes on at the start of the next chunk.
                    let (chunk, u) = (chunk + (u / units) as usize, u % units);
                    let word = &mut model[chunk][(u / 64) as usize];
                    assert_eq!(*word & (1 << (u % 64)), 0, "two live blocks share unit {u} of chunk {chunk}");
                    *word |= 1 << (u % 64);
                }
            }
            for chunk in a.cores[0].owned() {
                let mut bits = vec![0u64; (units / 64) as usize];
                a.shape.allocated_granules(a.tree(chunk), 0, &mut bits);
                assert_eq!(bits, model[chunk], "step {step}: the tree of chunk {chunk} against the model");
                let mut coarse = vec![0u64; (units / 256) as usize];
                a.shape.allocated_granules(a.tree(chunk), 2, &mut coarse);
                for granule in 0..units / 4 {
                    let any = (0..4)
                        .any(|k| model[chunk][((granule * 4 + k) / 64) as usize] >> ((granule * 4 + k) % 64) & 1 != 0);
                    assert_eq!(coarse[(granule / 64) as usize] >> (granule % 64) & 1 != 0, any);
                }
                let longest = best_fit(&model[chunk], units, 1, bank).longest;
                let epoch = a.lines[chunk].space.probe(0).unwrap().epoch();
                assert!(
                    !a.lines[chunk].stretch.rules_out(epoch, longest),
                    "step {step}: chunk {chunk}'s memo hides a free stretch of {longest} units"
                );
                checks += 1;
                if let Some(known) = a.lines[chunk].stretch.known(epoch) {
                    valid_memos += 1;
                    exact_memos += usize::from(known == longest);
                }
                // A place, valid, says truly where every stretch longer than its `others` lies.
                let free = a.lines[chunk].space.free_units();
                if let Some((known, place)) = a.lines[chunk].stretch.placed(epoch, free) {
                    places += 1;
                    assert_eq!(place.start % bank, 0, "step {step}: chunk {chunk}'s place {place:?}");
                    for (start, room) in stretches(&model[chunk], units, bank) {
                        assert!(
                            room <= place.others || (place.start <= start && start + room <= place.start + known),
                            "step {step}: chunk {chunk}: a stretch of {room} at {start} is outside {place:?} of {known}"
                        );
                    }
                }
                // A chunk the index counts as sure has a valid memo (every step that left a memo
                // out of date marked its chunk unsure), and every chunk with a memo is in the
                // class of its length: the index is exact, no search need read every chunk.
                if a.stretch_classes.unsure_word(chunk / 64) & 1 << (chunk % 64) == 0 {
                    sure += 1;
                    let known = a.lines[chunk].stretch.known(epoch);
                    assert!(known.is_some(), "step {step}: chunk {chunk} is sure, its memo out of date");
                }
                if let Some(recorded) = a.lines[chunk].stretch.recorded() {
                    let class = crate::arena::stretch_classes::class_of(recorded);
                    assert!(
                        a.stretch_classes.chunks(class, chunk).next() == Some(chunk),
                        "step {step}: chunk {chunk} is not in its memo's class"
                    );
                    // Its class byte says the same (the walk of a first fit reads that).
                    assert_eq!(
                        a.stretch_classes.byte_of(chunk),
                        StretchClasses::byte_for(recorded),
                        "step {step}: chunk {chunk}'s class byte is not its memo's class"
                    );
                }
            }
        }
        assert!(placed_off_node > 0, "some blocks were placed in free stretches");
        assert!(sure * 2 > checks, "{sure} of {checks} chunks sure");
        // Frees raise the memos rather than leaving them out of date: most stay valid.
        assert!(valid_memos * 4 > checks * 3, "{valid_memos} memos valid of {checks}");
        assert!(exact_memos * 2 > valid_memos, "{exact_memos} of {valid_memos} valid memos exact");
        assert!(places * 4 > valid_memos, "{places} places of {valid_memos} valid memos");
        for h in live {
            p.free(h).unwrap();
        }
        assert_eq!(p.check().unwrap(), 0);
    }
}

//! An index of chunks by the length class of the longest free stretch their stretch memo
//! knows (`stretches.rs`), so that the best fit across chunks (`packed.rs`) looks first at the
//! chunks whose memo says they hold a block and only a little more, instead of at every chunk.
//!
//! The classes split each doubling of the length in eight, as TLSF's second level does: lengths
//! 0 to 7 units have a class each, then `[2^e, 1.125 x 2^e)`, `[1.125 x 2^e, 1.25 x 2^e)` and
//! so on ([`class_of`]), so the chunks of a block's own class that turn out too short are few:
//! with four a doubling, a best-fit search at 85% occupancy read about eight such chunks'
//! memos per block, and failed more allocations than rlsf at a few seeds of the churn.
//! One two-level bitmap over the chunks per class (`chunk_sets.rs`): a search skips the empty
//! words of a class through its summary, on an arena of many chunks too. Whoever writes a memo
//! moves the chunk's bit to the class of what it wrote, and a search checks each chunk it finds
//! against the chunk's memo and free epoch before it trusts it. A chunk whose memo is out of
//! date sits in the class of what its memo knew, and is *unsure* (below).
//!
//! The index is exact: once its writers are done, every chunk with a memo is in the class of
//! that memo, so a search that finds no room through the classes and the unsure chunks has
//! looked at every chunk that might have it. Writers of one chunk's memo may race: one reads
//! the memo before its own, writes its own, then sets its new class's bit and clears the old
//! class's; another's memo may land between its read and its clear, of the class it clears. So
//! a move sets its bit with a read-modify-write even when the bit is set already, and after
//! its clear reads the memo again and sets the bit of that memo's class (again until the class
//! it finds is the one it set last). A clear that comes after another writer's set then reads
//! that writer's memo, and puts its bit back. (Its bit in a class it no longer belongs to stays:
//! a search skips it on its memo.) A loom model below races two writers.

//! # Chunks whose memo may be out of date
//!
//! A memo goes out of date with every epoch step of its chunk that does not carry it (a free
//! that could not raise it, a grant, a rollback, a reveal that could not carry it: the callers
//! of [`StretchClasses::mark_unsure`]), and the chunk's class then says nothing of it. Such
//! chunks are *unsure*, and so is a chunk whose memo was never written: one more bitmap over
//! the chunks marks the *sure* ones (all zero: every chunk unsure), which every such step
//! clears (after its step) and a writer of a valid memo sets, so that a search looks at the
//! unsure chunks instead of at every chunk. The set is a handshake with the steps: set the
//! bit, then read the epoch again (a read-modify-write) and clear the bit again when it moved
//! since the memo's epoch; so a step either comes before that read (and the bit is cleared
//! again) or its own clear comes after the set. A writer does that read-modify-write even
//! when the chunk was sure already ([`StretchClasses::settle_written`]): a free that carries
//! the memo over its step leaves the chunk sure, and a memo written after it at the epoch
//! before (a claim through the place that probed before the free) would otherwise leave a sure
//! chunk whose memo is out of date, in a class below its longest stretch, where no search looks
//! for it. Loom models below check both. Every epoch step
//! that does not carry the memo marks the chunk (the unit-model test of `packed.rs` checks,
//! after every batch of random allocations and frees, that each sure chunk has a valid memo and
//! each chunk with a memo is in its class), so no allocation reads every chunk's memo: on an
//! arena of 16,384 chunks that read took a failing allocation about 20 us.
//!
//! # Each chunk's class, by address
//!
//! The sets answer "which chunks are of this class"; a first fit over a core's own chunks asks
//! the other way round, "which of these chunks, in address order, may hold this length". Each
//! chunk also has a byte with its class (plus one, at most [`BYTE_TOP`]; zero before its first
//! memo), eight to a word, so that the walk reads the classes of 64 chunks in one cache line
//! ([`StretchClasses::may_hold_word`]) instead of each chunk's own line. A move writes the
//! byte with a read-modify-write after its insert and before it reads the memo again, so the
//! argument above holds for the byte too: the last writer of the byte then reads the memo that
//! stayed and writes its class when it differs, and the byte ends in the class of the memo
//! (a loom model below races two writers). A byte is never lower than its memo's class once
//! its writers are done; a byte of [`BYTE_TOP`] stands for every class from `BYTE_TOP - 1` up.
//!
//! A chunk granted to a core gets its free units as its memo at once (`Arena::open`), and the
//! buddy path lowers the memo whenever a claim leaves fewer units free than its class starts
//! at (`Arena::lower_memo_after_take`). So the chunks that small blocks fill are neither
//! unsure nor in the long classes: before, the first failing allocation for a large block
//! after 1 GiB of slab objects settled all 512 chunks, 15 us of its 30.

use super::chunk_sets::ChunkSets;
use crate::error::Result;
use crate::util::sync::{AtomicU64, Ordering};
use crate::util::zeroed::Zeroed;

/// Classes per doubling of the length (a power of two): a class spans an eighth of a
/// doubling, so the chunks of the block's own class that turn out too short are few.
pub(crate) const PER_DOUBLING: u32 = 8;
/// Bits of a length below its leading one that pick its class within the doubling.
const SUB_BITS: u32 = PER_DOUBLING.trailing_zeros();
/// Length classes: lengths below [`PER_DOUBLING`] units one each, then [`PER_DOUBLING`] per
/// doubling up to stretches of 2^32 units.
pub(crate) const CLASSES: usize = (PER_DOUBLING * (33 - SUB_BITS)) as usize;

/// The class of a longest stretch of `units` units: classes grow with the length.
#[inline]
pub(crate) fn class_of(units: u64) -> usize {
    if units < u64::from(PER_DOUBLING) {
        return units as usize;
    }
    let exponent = 63 - units.leading_zeros(); // at least SUB_BITS
    let sub = (units >> (exponent - SUB_BITS)) & u64::from(PER_DOUBLING - 1);
    ((PER_DOUBLING * (exponent - SUB_BITS + 1)) as usize + sub as usize).min(CLASSES - 1)
}

/// The shortest length of class `class`: the inverse of [`class_of`] on the first length of
/// each class (`u64::MAX` past the last class).
#[inline]
pub(crate) fn class_floor(class: usize) -> u64 {
    let class = class as u64;
    let per = u64::from(PER_DOUBLING);
    if class < per {
        return class;
    }
    if class >= CLASSES as u64 {
        return u64::MAX;
    }
    (per + class % per) << (class / per - 1)
}

/// The classes a memo of at most `longest` units can be in: `0..classes_up_to(longest)` (no
/// stretch is longer than a chunk, so the classes above a chunk's length stay empty).
#[inline]
pub(crate) fn classes_up_to(longest: u64) -> usize {
    (class_of(longest) + 1).min(CLASSES)
}

/// The largest value of a chunk's class byte ([`StretchClasses::may_hold_word`]): seven bits,
/// so that eight bytes compare with a threshold in one addition.
const BYTE_TOP: u64 = 127;

/// The bytes of a word of class bytes: each byte's low bit, and each byte's high bit.
const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Chunk `chunk`'s class byte for a memo of class `class`: one more than the class, at most
/// [`BYTE_TOP`].
#[inline]
fn class_byte(class: usize) -> u64 {
    (class as u64 + 1).min(BYTE_TOP)
}

/// The chunks of each length class (see the module documentation).
pub(crate) struct StretchClasses {
    /// Set `class`: the chunks whose memo's longest stretch is of that class.
    classes: ChunkSets,
    /// Each chunk's class byte, eight to a word in address order, whole words of 64 chunks
    /// (see the module documentation).
    bytes: Zeroed<AtomicU64>,
    /// The chunks that are not unsure (see the module documentation), `words` words: a chunk
    /// starts unsure, its memo unknown, until a grant writes it.
    sure: Zeroed<AtomicU64>,
}

impl StretchClasses {
    /// The index of `chunks` chunks, every class empty.
    pub(crate) fn new(chunks: usize) -> Result<StretchClasses> {
        Ok(StretchClasses {
            classes: ChunkSets::new(chunks, CLASSES, "the stretch classes")?,
            bytes: Zeroed::new(chunks.div_ceil(64).max(1) * 8, "the class of each chunk")?,
            sure: Zeroed::new(chunks.div_ceil(64).max(1), "the chunks of sure stretch memos")?,
        })
    }

    /// Host bytes the index holds.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.classes.resident_bytes() + self.sure.resident_bytes() + self.bytes.resident_bytes()
    }

    /// `chunk`'s memo went from a longest stretch of `old` units (`None`: it knew nothing) to
    /// `new`: move it to the new class. `recorded()` reads the memo again (its longest stretch,
    /// whatever its epoch): when a writer racing this one wrote it meanwhile, this one's
    /// removal may have taken the chunk out of that writer's class, so the chunk goes (back)
    /// into the class of the memo it finds (see the module documentation).
    /// The chunk's class byte follows, written before the memo is read again.
    #[inline]
    pub(crate) fn moved(&self, chunk: usize, old: Option<u64>, new: u64, recorded: impl Fn() -> Option<u64>) {
        let mut to = class_of(new);
        self.classes.insert_ordered(to, chunk);
        self.write_byte(chunk, to);
        if let Some(from) = old.map(class_of).filter(|&from| from != to) {
            self.classes.remove_tidying(from, chunk);
        }
        while let Some(now) = recorded().map(class_of) {
            if now == to {
                break;
            }
            self.classes.insert_ordered(now, chunk);
            self.write_byte(chunk, now);
            to = now;
        }
    }

    /// Write `chunk`'s class byte for `class`, with a read-modify-write of its word even when
    /// the byte holds that class already: the next read of the memo must see every memo whose
    /// writer wrote the byte before (see the module documentation).
    #[inline]
    fn write_byte(&self, chunk: usize, class: usize) {
        let (word, shift) = (&self.bytes[chunk / 8], (chunk % 8) * 8);
        let byte = class_byte(class) << shift;
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let new = current & !(0xff << shift) | byte;
            match word.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => current = now,
            }
        }
    }

    /// Chunks `64 w` to `64 w + 63` (a bit each, in address order) whose class byte says that
    /// they may hold a stretch of class `class`: those whose memo is of that class or a longer
    /// one, and those that never had a memo. A chunk left out has no such stretch while its
    /// memo is valid (and while it is not, it is unsure: see [`StretchClasses::unsure_word`]).
    #[inline]
    pub(crate) fn may_hold_word(&self, w: usize, class: usize) -> u64 {
        let threshold = class_byte(class);
        // A byte b (at most 127) is at least the threshold t (1 to 127) when b + 128 - t has
        // its high bit set, and is not zero when b + 127 has it; no sum carries into the next
        // byte.
        let at_least = LOW_BITS * (128 - threshold);
        let nonzero = LOW_BITS * 127;
        let mut out = 0;
        for i in 0..8 {
            let bytes = self.bytes[w * 8 + i].load(Ordering::Acquire);
            let high = ((bytes + at_least) | !(bytes + nonzero)) & HIGH_BITS;
            // The high bit of byte j to bit j.
            out |= ((high >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) << (i * 8);
        }
        out
    }

    /// `chunk`'s class byte (zero: it never had a memo).
    #[cfg(test)]
    pub(crate) fn byte_of(&self, chunk: usize) -> u64 {
        self.bytes[chunk / 8].load(Ordering::Acquire) >> ((chunk % 8) * 8) & 0xff
    }

    /// The class byte that a memo of `units` units leaves.
    #[cfg(test)]
    pub(crate) fn byte_for(units: u64) -> u64 {
        class_byte(class_of(units))
    }

    /// An epoch step of `chunk` left its memo out of date (called after the step).
    #[inline]
    pub(crate) fn mark_unsure(&self, chunk: usize) {
        let (word, bit) = (&self.sure[chunk / 64], 1u64 << (chunk % 64));
        if word.load(Ordering::Relaxed) & bit != 0 {
            word.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// A memo of `chunk` valid at the epoch a search probed was written (or found): the chunk
    /// is sure, unless `moved()` (a read-modify-write of the chunk's free-space word,
    /// `ChunkSpace::moved_since`) says a step came since that probe (see the module
    /// documentation).
    #[inline]
    pub(crate) fn settle(&self, chunk: usize, moved: impl FnOnce() -> bool) {
        let (word, bit) = (&self.sure[chunk / 64], 1u64 << (chunk % 64));
        if word.load(Ordering::Relaxed) & bit != 0 {
            return;
        }
        word.fetch_or(bit, Ordering::AcqRel);
        if moved() {
            word.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// [`StretchClasses::settle`] for a writer that has just written `chunk`'s memo, valid at
    /// the epoch it probed: the chunk is sure only if no step came since that probe, even when
    /// it was sure already. A free that carried the memo over its step keeps the chunk sure,
    /// and a memo written after it at the older epoch (a claim that probed before the free)
    /// leaves the memo out of date: the check after the write marks the chunk unsure then.
    #[inline]
    pub(crate) fn settle_written(&self, chunk: usize, moved: impl FnOnce() -> bool) {
        let (word, bit) = (&self.sure[chunk / 64], 1u64 << (chunk % 64));
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::AcqRel);
        }
        if moved() {
            word.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Word `w` of the unsure chunks (a set bit: the chunk's memo may be out of date).
    #[inline]
    pub(crate) fn unsure_word(&self, w: usize) -> u64 {
        !self.sure[w].load(Ordering::Acquire)
    }

    /// Set in `out` (a bitmap over the chunks, a word per 64) every chunk whose memo may say
    /// that it has a free stretch of `units` units or more: the chunks of the classes from that
    /// of `units` up to (not including) `top` ([`classes_up_to`]), and the unsure ones. With the index exact, no
    /// other chunk has such a stretch. Only the chunks `out` covers are set, and set bits past
    /// the last chunk the caller asked about are the caller's to drop.
    pub(crate) fn may_hold(&self, units: u64, top: usize, out: &mut [u64]) {
        for class in class_of(units)..top {
            self.classes.or_into(class, out);
        }
        for (w, word) in out.iter_mut().enumerate() {
            *word |= self.unsure_word(w);
        }
    }

    /// The chunks of `class` from `from` on that `mask` keeps (a bitmap word of chunks, by
    /// word index), in address order.
    pub(crate) fn chunks_in<'a>(
        &'a self,
        class: usize,
        from: usize,
        mask: &'a dyn Fn(usize) -> u64,
    ) -> impl Iterator<Item = usize> + 'a {
        self.members(class, from, mask)
    }

    /// Whether `class` looks empty ([`ChunkSets::looks_empty`]): for walks over many classes
    /// (a failing allocation's, its error's), where most are empty and cold.
    #[inline]
    pub(crate) fn looks_empty(&self, class: usize) -> bool {
        self.classes.looks_empty(class)
    }

    /// The chunks of `class` from `from` on, in address order.
    pub(crate) fn chunks(&self, class: usize, from: usize) -> impl Iterator<Item = usize> + '_ {
        self.members(class, from, &|_| u64::MAX)
    }

    /// The chunks of `class` from `from` on that `mask` keeps, in address order.
    fn members<'a>(
        &'a self,
        class: usize,
        from: usize,
        mask: &'a dyn Fn(usize) -> u64,
    ) -> impl Iterator<Item = usize> + 'a {
        let mut at = from;
        std::iter::from_fn(move || {
            let chunk = self.classes.next(class, at, mask)?;
            at = chunk + 1;
            Some(chunk)
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_moves_between_classes() {
        let c = StretchClasses::new(130).unwrap();
        // Eight classes per doubling: lengths 0 to 15 have a class each, then each class
        // spans two lengths up to 32, four up to 64.
        assert_eq!(PER_DOUBLING, 8);
        let firsts: Vec<usize> = (0..16).chain((16..32).step_by(2)).chain([32, 36]).map(class_of).collect();
        assert_eq!(firsts, (0..26).collect::<Vec<_>>());
        assert!((1..1 << 20).all(|u: u64| class_of(u) >= class_of(u - 1)), "classes grow with the length");
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
        c.moved(129, None, 600, || Some(600));
        assert_eq!(c.chunks(class_of(600), 0).collect::<Vec<_>>(), [129]);
        c.moved(129, Some(600), 3, || Some(3));
        c.moved(5, None, 3, || Some(3));
        assert_eq!(c.chunks(class_of(600), 0).count(), 0);
        assert_eq!(c.chunks(3, 0).collect::<Vec<_>>(), [5, 129]);
        assert_eq!(c.chunks(3, 6).collect::<Vec<_>>(), [129]);
        c.moved(129, Some(3), 5, || Some(5));
        c.moved(129, Some(5), 5, || Some(5));
        assert_eq!(c.chunks(class_of(5), 0).collect::<Vec<_>>(), [129], "same class: the bit stays");
    }

    #[test]
    fn a_class_floor_is_the_first_length_of_its_class() {
        for class in 0..CLASSES {
            let floor = class_floor(class);
            assert_eq!(class_of(floor), class, "class {class}");
            assert!(floor == 0 || class_of(floor - 1) == class - 1, "class {class}: {floor} is its first length");
        }
        assert_eq!(class_floor(CLASSES), u64::MAX);
    }

    /// The class bytes follow the moves, and a word of them says which chunks may hold a
    /// class: every chunk whose memo is of that class or a longer one, every chunk without a
    /// memo, and no other (chunk by chunk against the memos, for every class, with random
    /// memos of every magnitude, the longest beyond the last class).
    #[test]
    fn class_bytes_say_which_chunks_may_hold_a_class() {
        let chunks = 200;
        let c = StretchClasses::new(chunks).unwrap();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut memos: Vec<Option<u64>> = vec![None; chunks];
        for _ in 0..50 {
            for memo in memos.iter_mut() {
                if next() % 4 != 0 {
                    let units = next() >> (next() % 64);
                    *memo = Some(units);
                }
            }
            for (chunk, memo) in memos.iter().enumerate() {
                if let Some(units) = *memo {
                    c.moved(chunk, None, units, || Some(units));
                    assert_eq!(c.byte_of(chunk), StretchClasses::byte_for(units));
                }
            }
            for class in 0..CLASSES {
                for w in 0..chunks.div_ceil(64) {
                    let word = c.may_hold_word(w, class);
                    for bit in 0..64 {
                        let chunk = w * 64 + bit;
                        let may = word >> bit & 1 == 1;
                        let expected = match memos.get(chunk).copied().flatten() {
                            None => true,
                            // The top byte stands for every class from BYTE_TOP - 1 up.
                            Some(units) => {
                                class_of(units) >= class
                                    || class_byte(class_of(units)) == BYTE_TOP && class_byte(class) == BYTE_TOP
                            }
                        };
                        assert_eq!(may, expected, "chunk {chunk}, class {class}, memo {:?}", memos.get(chunk));
                    }
                }
            }
        }
    }

    /// A writer whose memo another writer replaced before it moved the chunk (so that it takes
    /// the chunk out of the other's class) puts the chunk back into the class of the memo it
    /// reads afterwards.
    #[test]
    fn a_move_that_finds_the_memo_changed_restores_its_class() {
        let c = StretchClasses::new(130).unwrap();
        // The other writer recorded 600 units and moved the chunk from class_of(40) to it.
        c.moved(7, None, 40, || Some(40));
        c.moved(7, Some(40), 600, || Some(600));
        // This writer read 600 as the memo before its own (3 units), which the other's then
        // replaced: it takes the chunk out of class_of(600) and finds 600 recorded.
        c.moved(7, Some(600), 3, || Some(600));
        assert_eq!(c.chunks(class_of(600), 0).collect::<Vec<_>>(), [7], "the memo's class");
        assert_eq!(c.chunks(3, 0).collect::<Vec<_>>(), [7], "a wrong class stays: searches skip it");
    }

    /// Every chunk starts unsure (its memo unknown); a settle makes it sure unless a step came
    /// since the memo's epoch; a step that leaves the memo out of date makes it unsure again.
    #[test]
    fn chunks_are_unsure_until_a_valid_memo_settles_them() {
        let c = StretchClasses::new(130).unwrap();
        let unsure = |chunk: usize| c.unsure_word(chunk / 64) & 1 << (chunk % 64) != 0;
        assert!((0..130).all(unsure));
        c.settle(129, || false);
        assert!(!unsure(129) && unsure(128));
        c.settle(5, || true);
        assert!(unsure(5), "a step came since the memo's epoch");
        c.mark_unsure(129);
        assert!(unsure(129));
        c.settle(129, || false);
        c.settle(129, || unreachable!("a sure chunk is not settled again"));
        assert!(!unsure(129));
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! The unsure bit's handshake between a search that records a memo and an epoch step that
    //! leaves it out of date, and two writers of one chunk's memo that move it between classes.
    use super::*;
    use crate::arena::chunk_space::ChunkSpace;
    use crate::arena::stretches::StretchMemo;
    use loom::sync::Arc;
    use loom::thread;

    /// A search records a memo at the epoch it probed and settles the chunk, racing a step (a
    /// free that could not carry the memo) that marks it unsure. Afterwards the chunk is
    /// unsure unless its memo is valid at the epoch now.
    #[test]
    fn a_memo_recorded_racing_a_step_leaves_the_chunk_unsure_or_its_memo_valid() {
        loom::model(|| {
            let space = Arc::new(ChunkSpace::new(4));
            let memo = Arc::new(StretchMemo::default());
            let classes = Arc::new(StretchClasses::new(1).unwrap());
            let (sp2, c2) = (space.clone(), classes.clone());
            let stepper = thread::spawn(move || {
                sp2.give(1);
                c2.mark_unsure(0);
            });
            let (_, probe) = space.look();
            memo.record(probe.epoch(), 3);
            classes.settle(0, || space.moved_since(probe));
            stepper.join().unwrap();
            let (_, now) = space.look();
            let unsure = classes.unsure_word(0) & 1 != 0;
            assert!(unsure || memo.known(now.epoch()).is_some(), "a chunk with an out-of-date memo is sure");
        });
    }

    /// A writer records a memo at the epoch it probed (a claim through the place, here 1 unit
    /// of 4 left), racing a free that carries the memo over its step and keeps the chunk sure
    /// (`StretchMemo::after_free`, then the move to the raised memo's class). When the
    /// writer's memo lands after the free's, it is out of date, and the chunk must not stay
    /// sure: afterwards the chunk is unsure or its memo valid at the epoch now, and in the
    /// class of the memo recorded.
    #[test]
    fn a_memo_written_late_after_a_free_that_carried_it_leaves_the_chunk_unsure_or_valid() {
        loom::model(|| {
            let space = Arc::new(ChunkSpace::new(4));
            space.take(2);
            let memo = Arc::new(StretchMemo::default());
            let classes = Arc::new(StretchClasses::new(1).unwrap());
            let (_, probe) = space.look();
            memo.record(probe.epoch(), 2);
            classes.moved(0, None, 2, || memo.recorded());
            classes.settle(0, || space.moved_since(probe));
            let (sp2, m2, c2) = (space.clone(), memo.clone(), classes.clone());
            let freer = thread::spawn(move || {
                let before = m2.before_free(&sp2);
                sp2.give(1);
                let carried = before.and_then(|before| m2.after_free(&sp2, before, 1, 1, || (0, 3)));
                match carried {
                    Some((known, longest)) => c2.moved(0, Some(known), longest, || m2.recorded()),
                    None => c2.mark_unsure(0),
                }
            });
            let (_, probe) = space.look();
            let before = memo.record(probe.epoch(), 1);
            classes.moved(0, before, 1, || memo.recorded());
            classes.settle_written(0, || space.moved_since(probe));
            freer.join().unwrap();
            let (_, now) = space.look();
            let unsure = classes.unsure_word(0) & 1 != 0;
            assert!(unsure || memo.known(now.epoch()).is_some(), "a chunk with an out-of-date memo is sure");
            let recorded = memo.recorded().expect("a memo was recorded");
            assert!(classes.classes.contains(class_of(recorded), 0), "the chunk is not in its memo's class");
            assert_eq!(classes.byte_of(0), StretchClasses::byte_for(recorded), "the class byte");
        });
    }

    /// Two searches record the chunk's memo at once (600 units and 41, from 40: 41 is of the
    /// class of 40), each moving the chunk from the class of the memo it read before its own
    /// to the class of its own. Afterwards the chunk is in the class of the memo that stayed,
    /// whichever it is: the move to 600 may take the chunk out of the class of 40 and 41 after
    /// the other's insert, and then finds 41 recorded and puts it back. (It fails when a move
    /// skips its read-modify-write on a bit already set, or does not read the memo again.)
    #[test]
    fn racing_moves_leave_the_chunk_in_the_class_of_its_memo() {
        loom::model(|| {
            let memo = Arc::new(StretchMemo::default());
            let classes = Arc::new(StretchClasses::new(1).unwrap());
            memo.record(1, 40);
            classes.moved(0, None, 40, || memo.recorded());
            let write = |memo: &StretchMemo, classes: &StretchClasses, longest: u64| {
                let before = memo.record(1, longest);
                classes.moved(0, before, longest, || memo.recorded());
            };
            let (m2, c2) = (memo.clone(), classes.clone());
            let other = thread::spawn(move || write(&m2, &c2, 600));
            write(&memo, &classes, 41);
            other.join().unwrap();
            let now = memo.recorded().expect("a memo was recorded");
            assert!(classes.classes.contains(class_of(now), 0), "the chunk is not in its memo's class ({now} units)");
            assert_eq!(classes.byte_of(0), StretchClasses::byte_for(now), "the class byte ({now} units)");
        });
    }
}

//! An index of chunks by the length class of the longest free stretch their stretch memo
//! knows (`stretches.rs`), so that the best fit across chunks (`packed.rs`) looks first at the
//! chunks whose memo says they hold a block and only a little more, instead of at every chunk.
//!
//! Class `k` (0 < `k` < [`CLASSES`]) holds the chunks whose memo's longest stretch `l` has
//! `2^(k-1) <= l < 2^k` units (class 0: `l` = 0); one bitmap over the chunks per class. The
//! index is a hint: whoever writes a memo moves the chunk's bit to the class of what it wrote
//! (one load of the bit when it is there already, as it mostly is), and a search checks each
//! chunk it finds against the chunk's memo and free epoch before it trusts it. Writers of one
//! chunk's memo that race may leave its bit in two classes (the search skips the wrong one) or,
//! rarely, in none; a chunk whose memo is out of date sits in the class of what its memo knew.
//! Neither hides room for long: a search that finds nothing through the index goes on to the
//! chunks whose memo may be out of date (below), and an allocation that is about to fail reads
//! the memos of every chunk in address order, as it would without the index, and the trees
//! whose memo is out of date (recording them here again).
//!
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
//! again) or its own clear comes after the set. A loom model below checks it. The bitmap is a
//! hint too, as the classes are: a step that does not clear it (or a chunk missing from its
//! class after a race) costs a search that does not find the chunk at once; the search of an
//! allocation about to fail reads every chunk.

use crate::error::Result;
use crate::util::sync::{AtomicU64, Ordering};
use crate::util::zeroed::Zeroed;

/// Length classes: up to stretches of 2^31 units.
pub(crate) const CLASSES: usize = 32;

/// The class of a longest stretch of `units` units.
#[inline]
pub(crate) fn class_of(units: u64) -> usize {
    (64 - units.leading_zeros() as usize).min(CLASSES - 1)
}

/// The chunks of each length class (see the module documentation).
pub(crate) struct StretchClasses {
    /// `CLASSES` bitmaps of `words` words each.
    bits: Zeroed<AtomicU64>,
    /// The chunks that are not unsure (see the module documentation), `words` words: a chunk
    /// starts unsure, its memo unknown.
    sure: Zeroed<AtomicU64>,
    words: usize,
}

impl StretchClasses {
    /// The index of `chunks` chunks, every class empty.
    pub(crate) fn new(chunks: usize) -> Result<StretchClasses> {
        let words = chunks.div_ceil(64);
        Ok(StretchClasses {
            bits: Zeroed::new(CLASSES * words, "the stretch classes")?,
            sure: Zeroed::new(words, "the chunks of sure stretch memos")?,
            words,
        })
    }

    /// Host bytes the index holds.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.bits.resident_bytes() + self.sure.resident_bytes()
    }

    #[inline]
    fn word(&self, class: usize, w: usize) -> &AtomicU64 {
        &self.bits[(class % CLASSES) * self.words + w]
    }

    /// `chunk`'s memo went from a longest stretch of `old` units (`None`: it knew nothing) to
    /// `new`: move its bit to the new class.
    #[inline]
    pub(crate) fn moved(&self, chunk: usize, old: Option<u64>, new: u64) {
        let (w, bit) = (chunk / 64, 1u64 << (chunk % 64));
        let to = class_of(new);
        let word = self.word(to, w);
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::AcqRel);
        }
        if let Some(from) = old.map(class_of).filter(|&from| from != to) {
            let word = self.word(from, w);
            if word.load(Ordering::Relaxed) & bit != 0 {
                word.fetch_and(!bit, Ordering::AcqRel);
            }
        }
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

    /// Word `w` of the unsure chunks (a set bit: the chunk's memo may be out of date).
    #[inline]
    pub(crate) fn unsure_word(&self, w: usize) -> u64 {
        !self.sure[w].load(Ordering::Acquire)
    }

    /// The chunks of `class` from `from` on, in address order.
    pub(crate) fn chunks(&self, class: usize, from: usize) -> impl Iterator<Item = usize> + '_ {
        (from / 64..self.words).flat_map(move |w| {
            let mut bits = self.word(class, w).load(Ordering::Acquire);
            if w == from / 64 {
                bits &= u64::MAX << (from % 64);
            }
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    w * 64 + b
                })
            })
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_moves_between_classes() {
        let c = StretchClasses::new(130).unwrap();
        assert_eq!((class_of(0), class_of(1), class_of(2), class_of(3), class_of(4)), (0, 1, 2, 2, 3));
        c.moved(129, None, 600);
        assert_eq!(c.chunks(class_of(600), 0).collect::<Vec<_>>(), [129]);
        c.moved(129, Some(600), 3);
        c.moved(5, None, 2);
        assert_eq!(c.chunks(class_of(600), 0).count(), 0);
        assert_eq!(c.chunks(2, 0).collect::<Vec<_>>(), [5, 129]);
        assert_eq!(c.chunks(2, 6).collect::<Vec<_>>(), [129]);
        c.moved(5, Some(2), 3);
        assert_eq!(c.chunks(2, 0).collect::<Vec<_>>(), [5, 129], "same class: the bit stays");
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
    //! leaves it out of date.
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
}

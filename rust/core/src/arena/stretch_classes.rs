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
//! Neither hides room: a search that finds nothing through the index goes on to read the memos
//! of the chunks in address order, as it would without the index, and reads trees whose memo is
//! out of date (recording them here again).

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
    words: usize,
}

impl StretchClasses {
    /// The index of `chunks` chunks, every class empty.
    pub(crate) fn new(chunks: usize) -> Result<StretchClasses> {
        let words = chunks.div_ceil(64);
        Ok(StretchClasses { bits: Zeroed::new(CLASSES * words, "the stretch classes")?, words })
    }

    /// Host bytes the index holds.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.bits.resident_bytes()
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
}

//! Sets of chunks as two-level bitmaps, as TLSF keeps its free lists: one bit per chunk (64
//! chunks a word) and one summary bit per bitmap word, set while the word may be non-zero.
//! Finding the lowest member at or after a position reads one summary word per 4,096 chunks
//! and the bitmap words the summary names; the tables are lazily committed ([`Zeroed`]). The
//! level maps (`level_maps.rs`: per tree level, the chunks that may serve it) and the length
//! classes of the stretch memos (`stretch_classes.rs`) are such sets.
//!
//! The summary follows one rule: a setter sets the word's bit, then the summary bit; a scanner
//! that finds a word empty clears its summary bit and reads the word again with a
//! read-modify-write, setting the summary bit back when it is not empty. So a word that holds
//! a member always has its summary bit (a loom model in `level_maps.rs` races the two).

use crate::error::Result;
use crate::util::sync::{AtomicU64, Ordering};
use crate::util::zeroed::Zeroed;

const ACQ: Ordering = Ordering::Acquire;

/// Bitmap words over the chunks for a walk on a failing allocation's path: on the stack for
/// arenas of up to 16,384 chunks (2 KiB), on the heap beyond. A heap allocation on that path
/// cost 1-2 us when the process's allocator had just given its heap top back to the system.
pub(crate) type ChunkWords = smallvec::SmallVec<[u64; 256]>;
const ACQ_REL: Ordering = Ordering::AcqRel;

/// `sets` sets over the same chunks.
pub(crate) struct ChunkSets {
    /// Bitmap words per set (64 chunks each).
    words: usize,
    /// Summary words per set (64 bitmap words each).
    tops: usize,
    /// `sets * words`: bit `c % 64` of word `set * words + c / 64` is chunk `c`.
    bits: Zeroed<AtomicU64>,
    /// `sets * tops`: bit `w % 64` of word `set * tops + w / 64` is bitmap word `w`.
    top: Zeroed<AtomicU64>,
}

impl ChunkSets {
    /// `sets` empty sets over `chunks` chunks; `what` names the tables in
    /// `Error::HostMemory` when the host has no room for them.
    pub(crate) fn new(chunks: usize, sets: usize, what: &'static str) -> Result<ChunkSets> {
        let words = chunks.div_ceil(64).max(1);
        let tops = words.div_ceil(64);
        Ok(ChunkSets { words, tops, bits: Zeroed::new(sets * words, what)?, top: Zeroed::new(sets * tops, what)? })
    }

    /// Bytes of its tables the host has committed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.bits.resident_bytes() + self.top.resident_bytes()
    }

    /// Bitmap word `w` of `set`.
    #[inline]
    pub(crate) fn word(&self, set: usize, w: usize) -> &AtomicU64 {
        &self.bits[set * self.words + w]
    }

    #[inline]
    fn summary(&self, set: usize, s: usize) -> &AtomicU64 {
        &self.top[set * self.tops + s]
    }

    /// Whether the summary of `set` names no bitmap word: then `set` held no member whose
    /// setter was done when the call began (the rule above). A walk over many sets that are
    /// mostly empty reads their summaries, packed eight to a line, instead of a bitmap word,
    /// each on a line of its own, per set ([`ChunkSets::next`] reads the word of its start
    /// first, the common case of a set that holds something there).
    #[inline]
    pub(crate) fn looks_empty(&self, set: usize) -> bool {
        (0..self.tops).all(|s| self.summary(set, s).load(ACQ) == 0)
    }

    /// Add the members of `set` to the bitmap `out` (word `w`: chunks `64 w..64 w + 64`; words
    /// past `out` are left out), a word at a time, through the summary: what a walk over the
    /// members one by one would add, in a load per word.
    pub(crate) fn or_into(&self, set: usize, out: &mut [u64]) {
        let words = self.words.min(out.len());
        for s in 0..words.div_ceil(64) {
            let mut summary = self.summary(set, s).load(ACQ);
            while summary != 0 {
                let w = s * 64 + summary.trailing_zeros() as usize;
                summary &= summary - 1;
                if w < words {
                    out[w] |= self.word(set, w).load(ACQ);
                }
            }
        }
    }

    /// Whether `chunk` is in `set`.
    #[cfg(test)]
    pub(crate) fn contains(&self, set: usize, chunk: usize) -> bool {
        self.word(set, chunk / 64).load(ACQ) & (1 << (chunk % 64)) != 0
    }

    /// Put `chunk` in `set` (and its bitmap word in the summary).
    #[inline]
    pub(crate) fn insert(&self, set: usize, chunk: usize) {
        let (w, bit) = (chunk / 64, 1u64 << (chunk % 64));
        let word = self.word(set, w);
        if word.load(ACQ) & bit == 0 {
            word.fetch_or(bit, ACQ_REL);
        }
        self.summarize(set, w);
    }

    /// [`ChunkSets::insert`] with a read-modify-write of the chunk's word even when its bit is
    /// set already, so that whoever clears the bit later reads what came before this insert
    /// (`stretch_classes.rs` needs that to keep a chunk in its class).
    #[inline]
    pub(crate) fn insert_ordered(&self, set: usize, chunk: usize) {
        let (w, bit) = (chunk / 64, 1u64 << (chunk % 64));
        self.word(set, w).fetch_or(bit, ACQ_REL);
        self.summarize(set, w);
    }

    /// Set word `w`'s bit in the summary of `set`.
    #[inline]
    fn summarize(&self, set: usize, w: usize) {
        let (s, sbit) = (w / 64, 1u64 << (w % 64));
        let summary = self.summary(set, s);
        if summary.load(ACQ) & sbit == 0 {
            summary.fetch_or(sbit, ACQ_REL);
        }
    }

    /// Take `chunk` out of `set` (its word's summary bit goes when a scan finds the word empty).
    #[inline]
    pub(crate) fn remove(&self, set: usize, chunk: usize) {
        let (w, bit) = (chunk / 64, 1u64 << (chunk % 64));
        let word = self.word(set, w);
        if word.load(ACQ) & bit != 0 {
            word.fetch_and(!bit, ACQ_REL);
        }
    }

    /// [`ChunkSets::remove`] that clears the word's summary bit when it takes the word's last
    /// member, as a scan that finds the word empty does: so that a set that emptied looks
    /// empty ([`ChunkSets::looks_empty`]) before any scan went by. Costs two more
    /// read-modify-writes each time a word empties; for sets that members pass through (the
    /// length classes), where stale summary bits would otherwise make the first walk over
    /// them after a fill read and tidy every one, about 7 us on 512 chunks.
    #[inline]
    pub(crate) fn remove_tidying(&self, set: usize, chunk: usize) {
        let (w, bit) = (chunk / 64, 1u64 << (chunk % 64));
        let word = self.word(set, w);
        if word.load(ACQ) & bit != 0 && word.fetch_and(!bit, ACQ_REL) == bit {
            self.tidy(set, w);
        }
    }

    /// The lowest chunk of `set` at or after `from` that `owned` (a bitmap word of chunks, by
    /// word index) keeps. Summary bits of empty words are cleared on the way.
    #[inline]
    pub(crate) fn next(&self, set: usize, from: usize, owned: &dyn Fn(usize) -> u64) -> Option<usize> {
        let mut w = from / 64;
        if w >= self.words {
            return None;
        }
        let first = self.word(set, w).load(ACQ) & owned(w) & !((1u64 << (from % 64)) - 1);
        if first != 0 {
            return Some(w * 64 + first.trailing_zeros() as usize);
        }
        w += 1;
        while w < self.words {
            let s = w / 64;
            let summary = self.summary(set, s).load(ACQ) & !((1u64 << (w % 64)) - 1);
            if summary == 0 {
                w = (s + 1) * 64;
                continue;
            }
            w = s * 64 + summary.trailing_zeros() as usize;
            let word = self.word(set, w).load(ACQ);
            if word == 0 {
                self.tidy(set, w);
            }
            let bits = word & owned(w);
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
        }
        None
    }

    /// The lowest chunk at or after `from` that is in `set` and not in `without`, and that
    /// `owned` keeps (the summary of `set` leads), among the bitmap words that `words` lasts
    /// for: each word of `set` read takes one, and `None` also means it ran out.
    pub(crate) fn next_without(
        &self,
        set: usize,
        without: usize,
        from: usize,
        owned: &dyn Fn(usize) -> u64,
        words: &mut usize,
    ) -> Option<usize> {
        let mut w = from / 64;
        let mut mask = !((1u64 << (from % 64)) - 1);
        while w < self.words {
            let s = w / 64;
            let summary = self.summary(set, s).load(ACQ) & !((1u64 << (w % 64)) - 1);
            if summary == 0 {
                (w, mask) = ((s + 1) * 64, u64::MAX);
                continue;
            }
            let at = s * 64 + summary.trailing_zeros() as usize;
            if at != w {
                (w, mask) = (at, u64::MAX);
            }
            *words = words.checked_sub(1)?;
            let bits = self.word(set, w).load(ACQ) & !self.word(without, w).load(ACQ) & owned(w) & mask;
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            (w, mask) = (w + 1, u64::MAX);
        }
        None
    }

    /// Bitmap word `w` of `set` was seen empty: clear its summary bit, unless it is set again.
    #[cold]
    fn tidy(&self, set: usize, w: usize) {
        let (s, sbit) = (w / 64, 1u64 << (w % 64));
        self.summary(set, s).fetch_and(!sbit, ACQ_REL);
        // A read-modify-write, so that a setter either sees the cleared summary bit or is seen.
        if self.word(set, w).fetch_or(0, ACQ_REL) != 0 {
            self.summary(set, s).fetch_or(sbit, ACQ_REL);
        }
    }

    /// Whether the summary of `set` names bitmap word `w`.
    #[cfg(test)]
    pub(crate) fn summarizes(&self, set: usize, w: usize) -> bool {
        self.summary(set, w / 64).load(ACQ) & (1 << (w % 64)) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn all(_: usize) -> u64 {
        u64::MAX
    }

    /// Members are found in address order across summary words; a word emptied by removals
    /// leaves its summary bit until a scan meets it empty; `next_without` skips the members of
    /// the other set; `owned` masks words.
    #[test]
    fn members_are_found_in_address_order_and_empty_words_leave_the_summary() {
        let sets = ChunkSets::new(10_000, 2, "test sets").unwrap();
        for chunk in [5, 70, 4_100, 9_999] {
            sets.insert(0, chunk);
        }
        sets.insert(1, 70);
        let members = |set: usize, owned: &dyn Fn(usize) -> u64| {
            let mut found = Vec::new();
            while let Some(c) = sets.next(set, found.last().map_or(0, |&c: &usize| c + 1), owned) {
                found.push(c);
            }
            found
        };
        assert_eq!(members(0, &all), [5, 70, 4_100, 9_999]);
        assert_eq!(members(0, &|w| if w == 1 { 0 } else { u64::MAX }), [5, 4_100, 9_999]);
        let mut plenty = usize::MAX;
        assert_eq!(sets.next_without(0, 1, 0, &all, &mut plenty), Some(5));
        assert_eq!(sets.next_without(0, 1, 6, &all, &mut plenty), Some(4_100), "70 is in the other set");
        // Words 0 (5 is before the start), 1 (70 is in the other set) and 64 (4,100): the third
        // word read finds it.
        assert_eq!(sets.next_without(0, 1, 6, &all, &mut 2), None, "two words read: not found");
        let mut words = 3;
        assert_eq!(sets.next_without(0, 1, 6, &all, &mut words), Some(4_100));
        assert_eq!(words, 0, "a word per bitmap word read");
        sets.remove(0, 4_100);
        assert!(!sets.contains(0, 4_100) && sets.summarizes(0, 4_100 / 64), "the summary bit stays");
        assert_eq!(members(0, &all), [5, 70, 9_999]);
        assert!(!sets.summarizes(0, 4_100 / 64), "the scan that met the word empty cleared it");
        assert!(sets.summarizes(0, 9_999 / 64));
    }

    /// A removal that empties a word clears its summary bit at once (a set that emptied looks
    /// empty), one that leaves a member keeps it; a set's members go into a bitmap a word at a
    /// time, as a walk over them would set them.
    #[test]
    fn a_removal_that_empties_a_word_tidies_it_and_members_go_into_bitmaps_by_word() {
        let sets = ChunkSets::new(10_000, 2, "test sets").unwrap();
        let members = [3usize, 64, 65, 4_100, 9_999];
        for &c in &members {
            sets.insert(0, c);
        }
        let mut out = vec![0u64; 100];
        sets.or_into(0, &mut out);
        let mut want = vec![0u64; 100];
        for &c in members.iter().filter(|&&c| c / 64 < 100) {
            want[c / 64] |= 1 << (c % 64);
        }
        assert_eq!(out, want, "the bitmap holds the members of the words it covers");
        sets.remove_tidying(0, 64);
        assert!(sets.summarizes(0, 1), "chunk 65 is still in word 1");
        for c in [65, 3, 4_100, 9_999] {
            sets.remove_tidying(0, c);
        }
        assert!((0..10_000 / 64).all(|w| !sets.summarizes(0, w)));
        assert!(sets.looks_empty(0) && sets.looks_empty(1));
        sets.insert(1, 7);
        assert!(!sets.looks_empty(1));
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A removal that empties a word and clears its summary bit (`remove_tidying`), racing an
    /// insert into the same word: afterwards the word's member is found through the summary.
    #[test]
    fn a_removal_that_tidies_racing_an_insert_never_hides_the_inserted_chunk() {
        for ordered in [false, true] {
            loom::model(move || {
                let sets = Arc::new(ChunkSets::new(128, 1, "test").unwrap());
                sets.insert(0, 64);
                let s2 = sets.clone();
                let inserter = thread::spawn(move || match ordered {
                    true => s2.insert_ordered(0, 65),
                    false => s2.insert(0, 65),
                });
                sets.remove_tidying(0, 64);
                inserter.join().unwrap();
                assert_eq!(sets.next(0, 0, &|_| u64::MAX), Some(65), "the summary hides the inserted chunk");
                assert!(!sets.looks_empty(0));
            });
        }
    }
}

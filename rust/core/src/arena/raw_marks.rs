//! Where the blocks of the raw API (`Pool::alloc_raw`, `Pool::free_raw`) start and end, so that
//! a raw free of the wrong size is refused instead of giving back a part of its block or a
//! neighbour's nodes. The raw API keeps no record of a block's size; these marks are what it
//! keeps instead.
//!
//! *Bounds*: two bits per unit of the offset space, interleaved (32 units per word, bit `2i`
//! "a raw block starts at unit i", bit `2i + 1` "a raw block ends at unit i", its last reserved
//! unit), so a small block's two bits share a word. Every raw block that is no slab object has
//! both: the allocation sets them once the block is placed (end first, then start), and its
//! free checks them before anything is released:
//!
//! - the start bit at the block's first unit (no start bit: an offset inside a block, a block
//!   freed already, or a block with a handle, which carries no marks);
//! - the end bit at the last unit that the given size implies (the block's shape follows from
//!   its offset and size): a size too small ends inside the block, where no end bit is;
//! - for each later piece of that shape (the nodes of a buddy block or of a tail), no end bit at
//!   the unit before the piece. A size too large reaches past the block's end; where its
//!   pieces are all allocated nodes (which the release checks before it changes anything),
//!   every boundary between blocks inside it is a boundary between two pieces, the block's own
//!   end among them, and its end bit is there. Where they are not, the release refuses the
//!   size and the marks are put back. Runs and blocks with a front also check their size
//!   against their own records (the run's length, the front word).
//!
//! Then clearing the start bit decides which of two racing frees of one block wins (the loser
//! gets an error and changes nothing); the winner clears the end bit before the release, so the
//! units it gives back carry no mark a new block could inherit. When the release then refuses
//! the size, the winner sets both bits again. (Between the two, a correct free of a neighbour
//! whose end bit a wrong size named is refused too: only a program that already frees a block
//! with the wrong size can see that.)
//!
//! *Objects*: a slab object is smaller than a unit; a word per slab id has bit `j` set while
//! object `j` is a raw block. The size is checked against the object's class as before; the bit
//! tells a raw object from one with a handle and decides races as the start bit does.
//!
//! A block with a handle never touches the marks: `Pool::alloc` and `Pool::free` pay nothing.
//! Raw blocks never move (compaction moves blocks by handle), so the marks never move either.
//! Memory: 2 bits per unit (1 MiB per GiB of offset space with 256-byte units) and 8 bytes per
//! slab id, reserved address space that the host commits only where raw blocks are marked.

use crate::error::Result;
use crate::util::sync::{AtomicU64, Ordering};
use crate::util::zeroed::Zeroed;

/// Units whose bounds share one word.
const UNITS_PER_WORD: u64 = 32;

/// The word and bit of unit `unit`'s start mark (its end mark is the next bit).
#[inline(always)]
fn start_bit(unit: u64) -> (usize, u64) {
    ((unit / UNITS_PER_WORD) as usize, 1 << (2 * (unit % UNITS_PER_WORD)))
}

/// The word and bit of unit `unit`'s end mark.
#[inline(always)]
fn end_bit(unit: u64) -> (usize, u64) {
    let (word, bit) = start_bit(unit);
    (word, bit << 1)
}

/// The first units of the later pieces of a block of `units` units from unit `first`: the
/// maximal naturally aligned nodes that cover it (`BuddyLayout::pieces_at`, on units of the
/// whole offset space: a chunk is aligned to more units than any block in it has).
#[inline(always)]
pub(crate) fn later_pieces(first: u64, units: u64) -> impl Iterator<Item = u64> {
    let (mut at, mut rest) = (first, units);
    std::iter::from_fn(move || {
        if rest == 0 {
            return None;
        }
        let fits = 1u64 << (63 - rest.leading_zeros());
        let aligned = if at == 0 { u64::MAX } else { 1u64 << at.trailing_zeros() };
        let piece = fits.min(aligned);
        at += piece;
        rest -= piece;
        (rest > 0).then_some(at)
    })
}

/// Why a raw free is refused by the marks (the reasons of `Error::InvalidBlock`).
pub(crate) const NOT_A_RAW_START: &str =
    "no block of the raw API starts here (an offset inside a block, a block freed already, or a block with a handle: free those with Pool::free)";
pub(crate) const NOT_THE_END: &str =
    "a raw block starts here, but it does not end where this size would: it was allocated with another size";
pub(crate) const COVERS_ANOTHER: &str =
    "this size reaches past the raw block that starts here into the next block: it was allocated with another size";

/// The start and end marks of the raw blocks (see the module documentation).
pub(crate) struct RawMarks {
    bounds: Zeroed<AtomicU64>,
    objects: Zeroed<AtomicU64>,
}

impl RawMarks {
    /// Marks for `units` units and `slab_ids` slab ids, all clear.
    pub(crate) fn new(units: u64, slab_ids: usize) -> Result<RawMarks> {
        Ok(RawMarks {
            bounds: Zeroed::new(units.div_ceil(UNITS_PER_WORD) as usize, "the raw blocks' bounds")?,
            objects: Zeroed::new(slab_ids, "the raw slab objects")?,
        })
    }

    /// Mark the raw block from unit `first` to unit `last` (both included), just placed.
    #[inline(always)]
    pub(crate) fn mark_block(&self, first: u64, last: u64) {
        let (sw, s) = start_bit(first);
        let (ew, e) = end_bit(last);
        if sw == ew {
            self.bounds[sw].fetch_or(s | e, Ordering::AcqRel);
        } else {
            self.bounds[ew].fetch_or(e, Ordering::AcqRel);
            self.bounds[sw].fetch_or(s, Ordering::AcqRel);
        }
    }

    /// Whether a raw block starts at unit `unit`.
    #[inline(always)]
    pub(crate) fn starts_at(&self, unit: u64) -> bool {
        let (w, b) = start_bit(unit);
        self.bounds[w].load(Ordering::Acquire) & b != 0
    }

    /// Whether a raw block ends at unit `unit`.
    #[inline(always)]
    fn ends_at(&self, unit: u64) -> bool {
        let (w, b) = end_bit(unit);
        self.bounds[w].load(Ordering::Acquire) & b != 0
    }

    /// Check that the raw block from unit `first` to unit `last` is marked and that no block
    /// ends before any of `pieces` (the first units of its later pieces); then take it: clear
    /// its marks, the start bit first (it decides a race). `Err` (and nothing changed) says why
    /// not.
    #[inline(always)]
    pub(crate) fn take_block(
        &self,
        first: u64,
        last: u64,
        pieces: impl Iterator<Item = u64>,
    ) -> std::result::Result<(), &'static str> {
        if !self.starts_at(first) {
            return Err(NOT_A_RAW_START);
        }
        if !self.ends_at(last) {
            return Err(NOT_THE_END);
        }
        for unit in pieces {
            if self.ends_at(unit - 1) {
                return Err(COVERS_ANOTHER);
            }
        }
        let (sw, s) = start_bit(first);
        let (ew, e) = end_bit(last);
        if sw == ew {
            // Both bits in one word: clear them at once, only while the start is there.
            let word = &self.bounds[sw];
            let mut now = word.load(Ordering::Acquire);
            loop {
                if now & s == 0 {
                    return Err(NOT_A_RAW_START);
                }
                match word.compare_exchange_weak(now, now & !(s | e), Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Ok(()),
                    Err(seen) => now = seen,
                }
            }
        }
        if self.bounds[sw].fetch_and(!s, Ordering::AcqRel) & s == 0 {
            return Err(NOT_A_RAW_START);
        }
        self.bounds[ew].fetch_and(!e, Ordering::AcqRel);
        Ok(())
    }

    /// Mark again the block [`RawMarks::take_block`] took, whose release was refused.
    #[cold]
    pub(crate) fn restore_block(&self, first: u64, last: u64) {
        self.mark_block(first, last);
    }

    /// Mark object `j` of slab `id` as a raw block, just placed.
    #[inline(always)]
    pub(crate) fn mark_object(&self, id: u32, j: u32) {
        self.objects[id as usize].fetch_or(1 << j, Ordering::AcqRel);
    }

    /// Take object `j` of slab `id`: whether it was a raw block (then it is no longer marked).
    #[inline(always)]
    pub(crate) fn take_object(&self, id: u32, j: u32) -> bool {
        self.objects[id as usize].fetch_and(!(1 << j), Ordering::AcqRel) & (1 << j) != 0
    }

    /// Mark again the object [`RawMarks::take_object`] took, whose release was refused.
    #[cold]
    pub(crate) fn restore_object(&self, id: u32, j: u32) {
        self.mark_object(id, j);
    }

    /// Bytes of the marks the host has committed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.bounds.resident_bytes() + self.objects.resident_bytes()
    }

    /// Every raw block's first unit, in order.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn starts(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (w, word) in self.bounds.iter().enumerate() {
            let mut bits = word.load(Ordering::Acquire) & 0x5555_5555_5555_5555;
            while bits != 0 {
                out.push(w as u64 * UNITS_PER_WORD + bits.trailing_zeros() as u64 / 2);
                bits &= bits - 1;
            }
        }
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_taken_once_with_its_own_bounds() {
        let marks = RawMarks::new(256, 4).unwrap();
        marks.mark_block(3, 40); // two words
        marks.mark_block(41, 41); // one unit, next to it
        assert_eq!(marks.take_block(3, 20, std::iter::empty()), Err(NOT_THE_END), "too small");
        assert_eq!(marks.take_block(3, 41, [41].into_iter()), Err(COVERS_ANOTHER), "too large");
        assert_eq!(marks.take_block(4, 40, std::iter::empty()), Err(NOT_A_RAW_START), "inside");
        assert_eq!(marks.starts(), vec![3, 41]);
        assert_eq!(marks.take_block(3, 40, [35].into_iter()), Ok(()));
        assert_eq!(marks.take_block(3, 40, std::iter::empty()), Err(NOT_A_RAW_START), "twice");
        assert_eq!(marks.take_block(41, 41, std::iter::empty()), Ok(()));
        assert!(marks.starts().is_empty());
        marks.restore_block(41, 41);
        assert_eq!(marks.take_block(41, 41, std::iter::empty()), Ok(()));
        marks.mark_object(2, 63);
        assert!(marks.take_object(2, 63));
        assert_eq!(later_pieces(1024, 1216).collect::<Vec<_>>(), vec![2048, 2176]);
        assert_eq!(later_pieces(1, 3).collect::<Vec<_>>(), vec![2]);
        assert_eq!(later_pieces(64, 64).count(), 0);
        assert!(!marks.take_object(2, 63));
    }
}

#[cfg(loom)]
mod loom_models {
    //! Raw frees racing each other and racing a neighbour's allocation on the same word of
    //! marks: one free of a block wins, and no mark of another block is lost.
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two frees of the block of units 0..=5 (both bits in one word) or 0..=40 (two words):
    /// exactly one wins, and its marks are clear afterwards while a neighbour's stay.
    #[test]
    fn two_racing_frees_of_one_block_one_wins() {
        for last in [5u64, 40] {
            loom::model(move || {
                let marks = Arc::new(RawMarks::new(64, 1).unwrap());
                marks.mark_block(0, last);
                marks.mark_block(last + 1, last + 1);
                let other = marks.clone();
                let t = thread::spawn(move || other.take_block(0, last, std::iter::empty()).is_ok());
                let here = marks.take_block(0, last, std::iter::empty()).is_ok();
                let there = t.join().unwrap();
                assert!(here ^ there, "exactly one free wins");
                assert!(!marks.starts_at(0));
                assert!(!marks.ends_at(last));
                assert!(marks.starts_at(last + 1) && marks.ends_at(last + 1), "the neighbour keeps its marks");
            });
        }
    }

    /// A free of units 0..=2 racing the allocation of its neighbour at units 3..=4 (their marks
    /// share a word): the free takes its block, and the neighbour's marks are all set after.
    #[test]
    fn a_free_racing_a_neighbours_allocation_keeps_its_marks() {
        loom::model(|| {
            let marks = Arc::new(RawMarks::new(64, 1).unwrap());
            marks.mark_block(0, 2);
            let other = marks.clone();
            let t = thread::spawn(move || other.mark_block(3, 4));
            assert_eq!(marks.take_block(0, 2, std::iter::empty()), Ok(()));
            t.join().unwrap();
            assert!(!marks.starts_at(0) && !marks.ends_at(2));
            assert!(marks.starts_at(3) && marks.ends_at(4));
            assert_eq!(marks.take_block(3, 4, std::iter::empty()), Ok(()));
        });
    }

    /// Two frees of one slab object: exactly one takes it.
    #[test]
    fn two_racing_frees_of_one_object_one_wins() {
        loom::model(|| {
            let marks = Arc::new(RawMarks::new(32, 1).unwrap());
            marks.mark_object(0, 5);
            marks.mark_object(0, 6);
            let other = marks.clone();
            let t = thread::spawn(move || other.take_object(0, 5));
            let here = marks.take_object(0, 5);
            assert!(here ^ t.join().unwrap());
            assert!(marks.take_object(0, 6), "the other object stays marked");
        });
    }
}

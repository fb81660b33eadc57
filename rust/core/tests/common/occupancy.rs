//! An overlap oracle for tests that allocate from many threads: one bit per byte of the
//! arena, claimed after an allocation and released before the free.

use std::sync::atomic::{AtomicU64, Ordering};

/// One bit per byte of the arena: set while a live block covers that byte.
pub struct Occupancy {
    words: Vec<AtomicU64>,
}

impl Occupancy {
    pub fn new(capacity: usize) -> Occupancy {
        Occupancy { words: (0..capacity.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// The words covering `[offset, offset + len)`, each with the mask of the bytes it holds.
    fn masks(offset: usize, len: usize) -> impl Iterator<Item = (usize, u64)> {
        let end = offset + len;
        (offset / 64..end.div_ceil(64)).map(move |w| {
            let lo = offset.max(w * 64) - w * 64;
            let hi = end.min(w * 64 + 64) - w * 64;
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            (w, mask)
        })
    }

    /// Marks a block live; an error if any of its bytes belongs to another live block (the
    /// bits set before the clash stay set: the caller fails the test).
    pub fn claim(&self, offset: usize, len: usize) -> Result<(), String> {
        for (w, mask) in Self::masks(offset, len) {
            let old = self.words[w].fetch_or(mask, Ordering::AcqRel);
            if old & mask != 0 {
                let byte = w * 64 + (old & mask).trailing_zeros() as usize;
                return Err(format!("block [{offset}, +{len}) overlaps a live block at byte {byte}"));
            }
        }
        Ok(())
    }

    /// Marks a block free; an error if any of its bytes was not marked live.
    pub fn release(&self, offset: usize, len: usize) -> Result<(), String> {
        for (w, mask) in Self::masks(offset, len) {
            let old = self.words[w].fetch_and(!mask, Ordering::AcqRel);
            if old & mask != mask {
                return Err(format!("block [{offset}, +{len}) was not registered whole"));
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| w.load(Ordering::Acquire) == 0)
    }
}

//! One pool per core: the set of chunks it owns (a bitmap over all chunks, so any thread can add
//! or drop one with a single atomic operation), a search hint per tree level (the chunk and
//! bunch of the last success, so the next allocation of that size usually finds room at once),
//! and how many of its chunks are fully free (the reserve it keeps before giving chunks back).

use crate::sync::{AtomicU64, Ordering};

pub(crate) struct CorePool {
    owned: Box<[AtomicU64]>,
    /// Per level: `(chunk + 1) << 32 | bunch`, 0 meaning no hint.
    hints: Box<[AtomicU64]>,
    empty_chunks: AtomicU64,
}

impl CorePool {
    pub(crate) fn new(chunks: usize, levels: usize) -> CorePool {
        CorePool {
            owned: (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            hints: (0..levels).map(|_| AtomicU64::new(0)).collect(),
            empty_chunks: AtomicU64::new(0),
        }
    }

    pub(crate) fn own(&self, chunk: usize) {
        self.owned[chunk / 64].fetch_or(1 << (chunk % 64), Ordering::AcqRel);
    }

    pub(crate) fn disown(&self, chunk: usize) {
        self.owned[chunk / 64].fetch_and(!(1 << (chunk % 64)), Ordering::AcqRel);
    }

    pub(crate) fn owns(&self, chunk: usize) -> bool {
        self.owned[chunk / 64].load(Ordering::Acquire) & (1 << (chunk % 64)) != 0
    }

    /// The owned chunks, starting at `from` and wrapping around.
    pub(crate) fn owned_from(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        let words = self.owned.len();
        let first_word = if words == 0 { 0 } else { (from / 64) % words };
        // Visit the first word twice: its bits at or after `from`, then (last) those before.
        (0..=words).filter(move |_| words > 0).flat_map(move |i| {
            let w = (first_word + i) % words.max(1);
            let mut bits = self.owned[w].load(Ordering::Acquire);
            if i == 0 {
                bits &= !0u64 << (from % 64);
            } else if i == words {
                bits &= !(!0u64 << (from % 64));
            }
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(w * 64 + b)
            })
        })
    }

    #[inline]
    pub(crate) fn hint(&self, level: u32) -> Option<(usize, u64)> {
        let h = self.hints[level as usize].load(Ordering::Relaxed);
        (h != 0).then(|| ((h >> 32) as usize - 1, h & 0xFFFF_FFFF))
    }

    #[inline]
    pub(crate) fn set_hint(&self, level: u32, chunk: usize, bunch: u64) {
        let h = ((chunk as u64 + 1) << 32) | bunch;
        if self.hints[level as usize].load(Ordering::Relaxed) != h {
            self.hints[level as usize].store(h, Ordering::Relaxed);
        }
    }

    /// One more of this core's chunks is fully free; returns how many are now.
    pub(crate) fn chunk_emptied(&self) -> u64 {
        self.empty_chunks.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// One fewer of this core's chunks is fully free.
    pub(crate) fn chunk_filled(&self) {
        self.empty_chunks.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn owned_iteration_wraps_from_a_start() {
        let c = CorePool::new(200, 14);
        for chunk in [3, 64, 70, 130, 199] {
            c.own(chunk);
        }
        assert_eq!(
            c.owned_from(0).collect::<Vec<_>>(),
            vec![3, 64, 70, 130, 199]
        );
        assert_eq!(
            c.owned_from(70).collect::<Vec<_>>(),
            vec![70, 130, 199, 3, 64]
        );
        assert_eq!(
            c.owned_from(100).collect::<Vec<_>>(),
            vec![130, 199, 3, 64, 70]
        );
        c.disown(70);
        assert!(!c.owns(70) && c.owns(64));
        assert_eq!(CorePool::new(0, 1).owned_from(0).count(), 0);
    }

    #[test]
    fn hints_round_trip() {
        let c = CorePool::new(10, 14);
        assert_eq!(c.hint(5), None);
        c.set_hint(5, 0, 0);
        assert_eq!(c.hint(5), Some((0, 0)));
        c.set_hint(5, 9, 255);
        assert_eq!(c.hint(5), Some((9, 255)));
    }
}

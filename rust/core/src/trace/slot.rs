//! What the trace's two rings (`trace/ring.rs`, `trace/solo.rs`) share: the words of one event
//! in a slot, stored and loaded whole with relaxed accesses (each ring's sequence words and
//! fences order them), the skip over tickets a lapped ring no longer holds, and what a drain
//! found.

use crate::util::sync::{AtomicU64, Ordering};

/// The words of the event a ring slot holds.
pub(crate) struct EventWords<const W: usize>([AtomicU64; W]);

impl<const W: usize> EventWords<W> {
    /// Zeroed words (no event).
    pub(crate) fn new() -> EventWords<W> {
        EventWords(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    /// Store an event's words (the writer of the slot, after its claim and a release fence).
    #[inline(always)]
    pub(crate) fn store(&self, words: &[u64; W]) {
        for (cell, &w) in self.0.iter().zip(words) {
            cell.store(w, Ordering::Relaxed);
        }
    }

    /// Load the words (the drainer; it decides afterwards whether they are one event).
    #[inline(always)]
    pub(crate) fn load(&self) -> [u64; W] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// What one drain of a ring found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drained {
    pub(crate) delivered: u64,
    pub(crate) dropped: u64,
}

/// The first of the tickets `from..end` that a ring of `cap` slots still holds: the older ones
/// share their slots with newer tickets, so they are counted dropped in `done`.
#[inline]
pub(crate) fn first_held(from: u64, end: u64, cap: u64, done: &mut Drained) -> u64 {
    if end - from > cap {
        done.dropped += end - cap - from;
        end - cap
    } else {
        from
    }
}

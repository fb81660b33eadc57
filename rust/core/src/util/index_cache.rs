//! A single owner's cache of free indices, in front of a shared lock-free stack
//! (`index_stack.rs`): the owner puts an index it frees and takes it back at its next
//! allocation, without the compare-and-swap on the shared stack that each of the two would
//! otherwise cost.
//!
//! # Ownership
//!
//! A cache has one writer at a time, so its operations are plain loads and stores; whoever
//! hands it to another owner orders the two with a release and an acquire. Others read it only
//! while the owners are stopped. Its indices stay free while no one owns it; the next owner
//! takes them.
//!
//! # Room
//!
//! Cached indices are free but reachable only by their cache's owner, so a table sized for the
//! most indices in use at once could run out while caches hold some. A table served by caches
//! is made [`CACHED_INDICES`] entries larger, and only the first `CACHED_INDICES / CAPACITY`
//! caches made for it hold anything ([`IndexCache::numbered`]): however many owners come and
//! go, the indices the caches hold never take one that an allocation needs.

use crate::util::sync::{AtomicU32, Ordering};

/// Indices one cache holds at most.
pub(crate) const CAPACITY: usize = 32;

/// The indices all the caches of one pool may hold together: the extra entries of its table.
pub(crate) const CACHED_INDICES: usize = 1 << 15;

/// One owner's free indices (see the module's documentation).
pub(crate) struct IndexCache {
    /// Indices it may hold: [`CAPACITY`], or 0 for a block past the pool's budget.
    room: u32,
    /// The indices held: `indices[..len]`.
    len: AtomicU32,
    indices: [AtomicU32; CAPACITY],
}

impl IndexCache {
    /// The `number`-th cache made for one table (counted from 0): it holds nothing past the
    /// budget.
    pub(crate) fn numbered(number: usize) -> IndexCache {
        let room = if number < CACHED_INDICES / CAPACITY { CAPACITY as u32 } else { 0 };
        IndexCache { room, len: AtomicU32::new(0), indices: std::array::from_fn(|_| AtomicU32::new(0)) }
    }

    /// The index cached last (by the owner only).
    #[inline]
    pub(crate) fn take(&self) -> Option<u32> {
        let len = self.len.load(Ordering::Relaxed);
        let last = len.checked_sub(1)?;
        self.len.store(last, Ordering::Relaxed);
        Some(self.indices[last as usize].load(Ordering::Relaxed))
    }

    /// Cache `index` (by the owner only); false when the cache is full.
    #[inline]
    pub(crate) fn put(&self, index: u32) -> bool {
        let len = self.len.load(Ordering::Relaxed);
        if len >= self.room {
            return false;
        }
        self.indices[len as usize].store(index, Ordering::Relaxed);
        self.len.store(len + 1, Ordering::Relaxed);
        true
    }

    /// The indices held now (by the owner, or by anyone while the owners are stopped).
    pub(crate) fn held(&self) -> impl Iterator<Item = u32> + '_ {
        let len = (self.len.load(Ordering::Relaxed) as usize).min(CAPACITY);
        self.indices[..len].iter().map(|s| s.load(Ordering::Relaxed))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn holds_up_to_its_capacity_last_in_first_out() {
        let cache = IndexCache::numbered(0);
        assert_eq!(cache.take(), None);
        for s in 0..CAPACITY as u32 {
            assert!(cache.put(100 + s));
        }
        assert!(!cache.put(7), "a full cache refuses");
        assert_eq!(cache.held().count(), CAPACITY);
        assert_eq!(cache.take(), Some(100 + CAPACITY as u32 - 1));
        assert!(cache.put(7));
        assert_eq!(cache.take(), Some(7));
        let mut left: Vec<u32> = cache.held().collect();
        left.sort_unstable();
        assert_eq!(left, (100..100 + CAPACITY as u32 - 1).collect::<Vec<_>>());
    }

    #[test]
    fn caches_past_the_budget_hold_nothing() {
        let last = CACHED_INDICES / CAPACITY - 1;
        assert!(IndexCache::numbered(last).put(1));
        let past = IndexCache::numbered(last + 1);
        assert!(!past.put(1));
        assert_eq!(past.take(), None);
        assert_eq!(past.held().count(), 0);
    }
}

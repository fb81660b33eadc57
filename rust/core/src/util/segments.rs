//! A table indexed by `u32` whose storage is allocated in fixed segments on first use and never
//! moved or freed while the table lives. Lock-free: two threads that touch a new segment at once
//! both allocate one, one installs it with a CAS and the other drops its own. References into the
//! table stay valid for the table's lifetime, so a lock-free structure can keep indices into it.

#[cfg(loom)]
use loom::sync::atomic::AtomicPtr;
#[cfg(not(loom))]
use std::sync::atomic::AtomicPtr;

use crate::util::sync::Ordering;

/// Entries per segment: `1 << SEGMENT_SHIFT`.
const SEGMENT_SHIFT: u32 = 12;
const SEGMENT: usize = 1 << SEGMENT_SHIFT;

pub(crate) struct Segmented<T> {
    segments: Box<[AtomicPtr<T>]>,
    capacity: usize,
}

// SAFETY: segments are heap arrays of `T` that only hand out shared references; `T: Sync` makes
// sharing them between threads sound, `T: Send` moving their ownership (on drop).
unsafe impl<T: Send + Sync> Send for Segmented<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Segmented<T> {}

impl<T: Default> Segmented<T> {
    /// Room for `capacity` entries (segments are allocated only when used).
    pub(crate) fn new(capacity: usize) -> Segmented<T> {
        Segmented {
            segments: (0..capacity.div_ceil(SEGMENT)).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            capacity,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entry `index`, allocating its segment if needed.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> &T {
        let ptr = self.segments[index as usize >> SEGMENT_SHIFT].load(Ordering::Acquire);
        let ptr = if ptr.is_null() { self.install(index as usize >> SEGMENT_SHIFT) } else { ptr };
        // SAFETY: a non-null segment holds SEGMENT entries and lives as long as `self`.
        unsafe { &*ptr.add(index as usize & (SEGMENT - 1)) }
    }

    /// Allocate segment `segment` (or take the one another thread installed first).
    #[cold]
    fn install(&self, segment: usize) -> *mut T {
        let cell = &self.segments[segment];
        let fresh: Box<[T]> = (0..SEGMENT).map(|_| T::default()).collect();
        let fresh = Box::into_raw(fresh) as *mut T;
        match cell.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => fresh,
            Err(winner) => {
                // SAFETY: `fresh` came from Box::into_raw above and lost the race: ours to drop.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, SEGMENT)) });
                winner
            }
        }
    }

    /// Entry `index` if its segment exists (never allocates).
    pub(crate) fn get_existing(&self, index: u32) -> Option<&T> {
        let ptr = self.segments.get(index as usize >> SEGMENT_SHIFT)?.load(Ordering::Acquire);
        if ptr.is_null() || index as usize >= self.capacity {
            return None;
        }
        // SAFETY: a non-null segment holds SEGMENT entries and lives as long as `self`.
        Some(unsafe { &*ptr.add(index as usize & (SEGMENT - 1)) })
    }
}

impl<T> Drop for Segmented<T> {
    fn drop(&mut self) {
        for cell in self.segments.iter() {
            let ptr = cell.load(Ordering::Acquire);
            if !ptr.is_null() {
                // SAFETY: installed by `get` from a `Box<[T]>` of SEGMENT entries; dropped once.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, SEGMENT)) });
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::util::sync::AtomicU64;

    #[test]
    fn entries_are_stable_and_lazily_allocated() {
        let table: Segmented<AtomicU64> = Segmented::new(10_000);
        assert!(table.get_existing(5000).is_none());
        table.get(5000).store(7, Ordering::Relaxed);
        let first = table.get(5000) as *const AtomicU64;
        table.get(9999).store(1, Ordering::Relaxed);
        assert_eq!(table.get(5000) as *const AtomicU64, first, "entries never move");
        assert_eq!(table.get_existing(5000).unwrap().load(Ordering::Relaxed), 7);
        assert!(table.get_existing(10_000).is_none());
        assert_eq!(table.capacity(), 10_000);
    }
}

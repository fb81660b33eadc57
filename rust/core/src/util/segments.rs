//! A table indexed by `u32` whose storage is allocated in fixed segments on first use and never
//! moved or freed while the table lives. Lock-free: two threads that touch a new segment at once
//! both allocate one, one installs it with a CAS and the other drops its own. References into the
//! table stay valid for the table's lifetime, so a lock-free structure can keep indices into it.
//!
//! Host memory is never assumed: the segment directory is a lazily committed zeroed table, and
//! [`Segmented::try_get`] (the one place a segment is installed) reports a failed allocation as
//! `Error::HostMemory` (failpoint `host.segment`) instead of aborting. [`Segmented::get`] is for
//! entries whose segment is known to exist.

#[cfg(loom)]
use loom::sync::atomic::AtomicPtr;
#[cfg(not(loom))]
use std::sync::atomic::AtomicPtr;

use crate::error::{Error, Result};
use crate::util::failpoint;
use crate::util::sync::Ordering;
use crate::util::zeroed::{Zeroable, Zeroed};

/// Entries per segment: `1 << SEGMENT_SHIFT`.
const SEGMENT_SHIFT: u32 = 12;
const SEGMENT: usize = 1 << SEGMENT_SHIFT;

pub(crate) struct Segmented<T> {
    segments: Zeroed<AtomicPtr<T>>,
    capacity: usize,
}

// SAFETY: segments are heap arrays of `T` that only hand out shared references; `T: Sync` makes
// sharing them between threads sound, `T: Send` moving their ownership (on drop).
unsafe impl<T: Send + Sync> Send for Segmented<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for Segmented<T> {}

// SAFETY: an `AtomicPtr` has the representation of a pointer, and all zero is null.
unsafe impl<T> Zeroable for AtomicPtr<T> {}

impl<T: Default> Segmented<T> {
    /// Room for `capacity` entries (segments are allocated only when used); `Error::HostMemory`
    /// when the host has no room for the segment directory.
    pub(crate) fn new(capacity: usize) -> Result<Segmented<T>> {
        Ok(Segmented { segments: Zeroed::new(capacity.div_ceil(SEGMENT), "a segment directory")?, capacity })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entry `index`, whose segment exists (it was reached through [`Segmented::try_get`]).
    #[inline]
    pub(crate) fn get(&self, index: u32) -> &T {
        let ptr = self.segments[index as usize >> SEGMENT_SHIFT].load(Ordering::Acquire);
        if ptr.is_null() {
            missing_segment(index);
        }
        // SAFETY: a non-null segment holds SEGMENT entries and lives as long as `self`.
        unsafe { &*ptr.add(index as usize & (SEGMENT - 1)) }
    }

    /// Entry `index`, allocating its segment if needed; `Error::HostMemory` when the host has
    /// no memory for the segment (nothing changes then).
    #[inline]
    pub(crate) fn try_get(&self, index: u32) -> Result<&T> {
        let ptr = self.segments[index as usize >> SEGMENT_SHIFT].load(Ordering::Acquire);
        let ptr = if ptr.is_null() { self.install(index as usize >> SEGMENT_SHIFT)? } else { ptr };
        // SAFETY: a non-null segment holds SEGMENT entries and lives as long as `self`.
        Ok(unsafe { &*ptr.add(index as usize & (SEGMENT - 1)) })
    }

    /// Allocate segment `segment` (or take the one another thread installed first).
    #[cold]
    fn install(&self, segment: usize) -> Result<*mut T> {
        let cell = &self.segments[segment];
        let bytes = SEGMENT * std::mem::size_of::<T>();
        let failed = Error::HostMemory { what: "a segment of a table", bytes };
        if failpoint::fire("host.segment") {
            return Err(failed);
        }
        let mut fresh: Vec<T> = Vec::new();
        fresh.try_reserve_exact(SEGMENT).map_err(|_| failed)?;
        fresh.extend((0..SEGMENT).map(|_| T::default()));
        let fresh = Box::into_raw(fresh.into_boxed_slice()) as *mut T;
        match cell.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(fresh),
            Err(winner) => {
                // SAFETY: `fresh` came from Box::into_raw above and lost the race: ours to drop.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, SEGMENT)) });
                Ok(winner)
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

/// An entry was used before its segment was installed: a bug of the caller.
#[cold]
#[inline(never)]
fn missing_segment(index: u32) -> ! {
    panic!("entry {index} of a segmented table was used before its segment was installed")
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
        let table: Segmented<AtomicU64> = Segmented::new(10_000).unwrap();
        assert!(table.get_existing(5000).is_none());
        table.try_get(5000).unwrap().store(7, Ordering::Relaxed);
        let first = table.get(5000) as *const AtomicU64;
        table.try_get(9999).unwrap().store(1, Ordering::Relaxed);
        assert_eq!(table.get(5000) as *const AtomicU64, first, "entries never move");
        assert_eq!(table.get_existing(5000).unwrap().load(Ordering::Relaxed), 7);
        assert!(table.get_existing(10_000).is_none());
        assert_eq!(table.capacity(), 10_000);
    }

    #[test]
    fn a_failed_install_changes_nothing() {
        let table: Segmented<AtomicU64> = Segmented::new(10_000).unwrap();
        let (got, fired) = failpoint::fail_at("host.segment", 0, || table.try_get(5000).map(|_| ()));
        assert!(fired);
        assert!(matches!(got, Err(Error::HostMemory { .. })), "{got:?}");
        assert!(table.get_existing(5000).is_none(), "no segment was installed");
        table.try_get(5000).unwrap().store(3, Ordering::Relaxed);
        assert_eq!(table.get(5000).load(Ordering::Relaxed), 3);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! Two threads install the same segment at once: both get the winner's segment, the
    //! loser's is dropped.
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn racing_installs_agree_on_one_segment() {
        loom::model(|| {
            let table: Arc<Segmented<u64>> = Arc::new(Segmented::new(2 * SEGMENT).unwrap());
            let t2 = table.clone();
            let other = thread::spawn(move || t2.try_get(5).unwrap() as *const u64 as usize);
            let mine = table.try_get(7).unwrap() as *const u64 as usize;
            let theirs = other.join().unwrap();
            assert_eq!(theirs + 2 * std::mem::size_of::<u64>(), mine, "two segments were installed");
            assert_eq!(table.get(5) as *const u64 as usize, theirs);
            assert!(table.get_existing(SEGMENT as u32).is_none(), "the second segment was never asked for");
        });
    }
}

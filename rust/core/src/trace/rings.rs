//! The rings of one trace, and which ring a thread writes.
//!
//! A trace has one single-writer ring per core pool (`trace/solo.rs`) and one shared
//! multi-writer ring (`trace/ring.rs`). The first event a thread records in a trace claims a
//! free single-writer ring for the thread (one CAS); every later event of that thread goes
//! there with no atomic read-modify-write. A thread that finds every single-writer ring taken
//! writes to the shared ring for the rest of the trace. A thread that exits releases its rings,
//! so threads that come and go do not use them up; their events stay until a drain takes them,
//! and a claim takes a ring that holds none first.
//!
//! Which ring a thread writes is cached per thread, keyed by the trace's id (unique in the
//! process), so the hot path is one thread-local load and a compare. A thread that records
//! into several traces in turn finds its own ring again by its owner word.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::clock::TscScale;
use super::event::EVENT_WORDS;
use super::ring::Ring;
use super::slot::Drained;
use super::solo::SoloRing;
use crate::error::{Error, Result};

/// Fewest slots per ring.
const MIN_RING: usize = 16;

/// The cached ring index that means "the shared ring".
const SHARED: u32 = u32::MAX;

/// Ids of traces (never 0, never reused).
static NEXT_TRACE: AtomicU64 = AtomicU64::new(1);
/// Ids of threads that write trace events (never 0, never reused).
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (trace id, ring index) of the last trace this thread recorded into.
    static CACHED: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
    /// This thread's writer id; 0 until its first claim.
    static THREAD_ID: Cell<u64> = const { Cell::new(0) };
    /// The rings this thread owns, released when it exits.
    static OWNED: RefCell<Owned> = const { RefCell::new(Owned(Vec::new())) };
}

/// Rings a thread owns: the trace's rings (weakly, so a finished trace is freed) and the index.
struct Owned(Vec<(Weak<Rings>, usize)>);

impl Drop for Owned {
    fn drop(&mut self) {
        let me = THREAD_ID.try_with(Cell::get).unwrap_or(0);
        for (rings, i) in self.0.drain(..) {
            if let Some(rings) = rings.upgrade() {
                rings.solo[i].release(me);
            }
        }
    }
}

/// Every ring of one trace.
pub(crate) struct Rings {
    /// Unique in the process, so a thread's cached ring cannot match another trace.
    id: u64,
    solo: Box<[SoloRing<EVENT_WORDS>]>,
    shared: Ring<EVENT_WORDS>,
    per_ring: usize,
    /// The fast clock of this trace, if the time-stamp counter is trustworthy here. Events then
    /// hold raw counter values, scaled to nanoseconds when drained.
    pub(crate) fast_clock: Option<TscScale>,
}

impl Rings {
    /// Rings for about `capacity` events over `cores` core pools: `cores` single-writer rings and
    /// one shared ring, each of `capacity / cores` slots rounded up to a power of two (at least
    /// 16). `Error::HostMemory` when the host has no room for them.
    pub(crate) fn new(cores: usize, capacity: usize, fast_clock: Option<TscScale>) -> Result<Arc<Rings>> {
        let per_ring = capacity.div_ceil(cores).next_power_of_two().max(MIN_RING);
        let mut solo = Vec::new();
        solo.try_reserve_exact(cores).map_err(|_| Error::HostMemory { what: "the trace rings", bytes: usize::MAX })?;
        for _ in 0..cores {
            solo.push(SoloRing::new(per_ring)?);
        }
        let shared = Ring::new(per_ring)?;
        let id = NEXT_TRACE.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(Rings { id, solo: solo.into_boxed_slice(), shared, per_ring, fast_clock }))
    }

    /// Events the rings hold at most.
    pub(crate) fn capacity(&self) -> usize {
        self.per_ring * (self.solo.len() + 1)
    }

    /// Events recorded so far (delivered, lost, or waiting to be drained).
    pub(crate) fn written(&self) -> u64 {
        self.solo.iter().map(|r| r.written()).sum::<u64>() + self.shared.written()
    }

    /// Record one event in the calling thread's ring. `this` is `self` as installed by the
    /// trace (`Arc::into_raw`), used only on a thread's first event of the trace.
    #[inline]
    pub(crate) fn push(&self, this: *const Rings, words: &[u64; EVENT_WORDS]) {
        let (id, index) = CACHED.with(Cell::get);
        let index = if id == self.id { index } else { self.claim(this) };
        match self.solo.get(index as usize) {
            Some(ring) => ring.push(words),
            None => self.shared.push(words),
        }
    }

    /// The calling thread's ring index in this trace (`SHARED` when none is free), claimed if
    /// need be, and cached.
    #[cold]
    #[inline(never)]
    fn claim(&self, this: *const Rings) -> u32 {
        let me = THREAD_ID.with(|id| {
            if id.get() == 0 {
                id.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
            }
            id.get()
        });
        let index = match self.solo.iter().position(|r| r.owned_by(me)) {
            Some(i) => i as u32,
            None => self.claim_free(this, me),
        };
        CACHED.with(|c| c.set((self.id, index)));
        index
    }

    /// Claim a free single-writer ring for thread `me` and remember it for the thread's exit.
    fn claim_free(&self, this: *const Rings, me: u64) -> u32 {
        // SAFETY: `this` came from `Arc::into_raw` of these rings, which the trace keeps alive
        // while any thread records into them; the count is raised before the `Arc` is made, so
        // dropping it leaves the trace's reference as it was.
        let weak = unsafe {
            Arc::increment_strong_count(this);
            Arc::downgrade(&Arc::from_raw(this))
        };
        // A thread past its thread-local destructors cannot remember a ring: it uses the shared
        // one.
        OWNED
            .try_with(|owned| {
                let Ok(mut owned) = owned.try_borrow_mut() else { return SHARED };
                // A free ring that a drain emptied first: one that a finished thread released
                // still holds its events until the next drain.
                let empty = self.solo.iter().position(|r| r.drained() && r.claim(me));
                let Some(i) = empty.or_else(|| self.solo.iter().position(|r| r.claim(me))) else {
                    return SHARED;
                };
                owned.0.retain(|(rings, _)| rings.strong_count() > 0);
                owned.0.push((weak, i));
                i as u32
            })
            .unwrap_or(SHARED)
    }

    /// Drain every ring: each event, with the index of its ring, oldest first within its ring,
    /// to `out`; the events lost and delivered, summed.
    pub(crate) fn drain(&self, out: &mut dyn FnMut(usize, [u64; EVENT_WORDS])) -> Drained {
        let mut total = self.shared.drain(&mut |w| out(self.solo.len(), w));
        for (i, ring) in self.solo.iter().enumerate() {
            let got = ring.drain(&mut |w| out(i, w));
            total.delivered += got.delivered;
            total.dropped += got.dropped;
        }
        total
    }

    /// Hand every event a drain now would deliver to `out`, and leave it in the rings (the
    /// caller serialises this with drains).
    pub(crate) fn retained(&self, out: &mut dyn FnMut([u64; EVENT_WORDS])) {
        self.shared.retained(out);
        for ring in self.solo.iter() {
            ring.retained(out);
        }
    }

    /// Events recorded but not drained that the rings no longer hold (the caller serialises
    /// this with drains, which count them dropped).
    pub(crate) fn overwritten(&self) -> u64 {
        self.solo.iter().map(|r| r.overwritten()).sum::<u64>() + self.shared.overwritten()
    }

    /// Events a drain now would take at most from ring `ring` (numbered as [`Rings::drain`]
    /// numbers them: the threads' rings, then the shared one).
    pub(crate) fn waiting(&self, ring: usize) -> usize {
        match self.solo.get(ring) {
            Some(solo) => solo.waiting(),
            None => self.shared.waiting(),
        }
    }

    /// How many rings `drain` names.
    pub(crate) fn count(&self) -> usize {
        self.solo.len() + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    fn words(n: u64) -> [u64; EVENT_WORDS] {
        [n, 0, 0, 0, 0, 0, !n]
    }

    /// Events per ring: the single-writer rings, then the shared one.
    fn per_ring(rings: &Rings) -> Vec<u64> {
        let mut counts = vec![0; rings.count()];
        rings.drain(&mut |i, w| {
            assert_eq!(w[6], !w[0], "torn event");
            counts[i] += 1;
        });
        let shared = counts.remove(rings.solo.len());
        counts.push(shared);
        counts
    }

    #[test]
    fn threads_beyond_the_rings_share_one_and_exiting_threads_free_theirs() {
        let rings = Rings::new(2, 64, None).unwrap();
        let this = Arc::as_ptr(&rings);
        let rings = &*rings;
        let barrier = Barrier::new(4);
        // Joined one by one: a join waits for the thread's exit, destructors included.
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let barrier = &barrier;
                    let ptr = this as usize;
                    s.spawn(move || {
                        barrier.wait(); // all four alive at once
                        for i in 0..10 {
                            rings.push(ptr as *const Rings, &words(t * 100 + i));
                        }
                        barrier.wait();
                    })
                })
                .collect();
            threads.into_iter().for_each(|t| t.join().unwrap());
        });
        assert_eq!(per_ring(rings), vec![10, 10, 20], "two threads own a ring each, two share");
        assert!(rings.solo.iter().all(|r| r.owned_by(0)), "exited threads release their rings");
        // A new thread finds a ring of its own again.
        let ptr = this as usize;
        std::thread::scope(|s| s.spawn(move || rings.push(ptr as *const Rings, &words(1))).join().unwrap());
        assert_eq!(per_ring(rings).iter().sum::<u64>(), 1);
        assert_eq!(rings.shared.written(), 20, "the new thread did not use the shared ring");
    }

    #[test]
    fn threads_that_come_one_after_another_keep_their_events_until_a_drain() {
        // Rings of 32 events: each thread records 20, exits, then the next one comes.
        let rings = Rings::new(3, 96, None).unwrap();
        let ptr = Arc::as_ptr(&rings) as usize;
        let rings = &*rings;
        for t in 0..3u64 {
            std::thread::scope(|s| {
                s.spawn(move || (0..20).for_each(|i| rings.push(ptr as *const Rings, &words(t * 100 + i))))
                    .join()
                    .unwrap()
            });
        }
        assert_eq!(per_ring(rings), vec![20, 20, 20, 0], "each thread took a ring no events were in");
        // Once drained, a released ring is as good as a new one.
        for t in 3..6u64 {
            std::thread::scope(|s| {
                s.spawn(move || (0..20).for_each(|i| rings.push(ptr as *const Rings, &words(t * 100 + i))))
                    .join()
                    .unwrap()
            });
        }
        assert_eq!(per_ring(rings), vec![20, 20, 20, 0]);
    }

    #[test]
    fn a_thread_recording_into_two_traces_in_turn_keeps_its_ring_in_each() {
        let (a, b) = (Rings::new(2, 64, None).unwrap(), Rings::new(2, 64, None).unwrap());
        for n in 0..6 {
            let r = if n % 2 == 0 { &a } else { &b };
            r.push(Arc::as_ptr(r), &words(n));
        }
        for r in [&a, &b] {
            let counts = per_ring(r);
            assert_eq!(counts.iter().filter(|&&c| c == 3).count(), 1, "{counts:?}");
            assert_eq!(counts.iter().sum::<u64>(), 3);
        }
        // Each trace's id is its own: a fresh trace is not mistaken for an old one.
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn a_finished_trace_is_freed_though_a_live_thread_owned_a_ring_in_it() {
        let rings = Rings::new(1, 16, None).unwrap();
        rings.push(Arc::as_ptr(&rings), &words(1));
        let weak = Arc::downgrade(&rings);
        drop(rings);
        assert!(weak.upgrade().is_none(), "the thread's record of its ring kept the trace alive");
        // The next trace gets a ring for this thread again.
        let next = Rings::new(1, 16, None).unwrap();
        next.push(Arc::as_ptr(&next), &words(2));
        assert_eq!(per_ring(&next), vec![1, 0]);
    }
}

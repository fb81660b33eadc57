//! The optional event trace: alloc, free, move and failed-alloc events in bounded per-core
//! rings, off by default, drained by a monitor.
//!
//! # Cost
//!
//! Off (the default), a hook on the alloc/free path is one relaxed load of a flag. On, an event
//! costs a clock read, one `fetch_add` on the ring of the caller's core (threads on the same core
//! share it), one CAS on the slot and eight plain stores: no lock, no wait, no allocation.
//!
//! # Ring protocol
//!
//! A ring has `cap` slots (a power of two) and a write index. A writer takes ticket `t` with
//! `fetch_add` on the write index and owns slot `t % cap` for that ticket. Each slot has a
//! sequence word `(t + 1) << 2 | state` naming the last ticket that claimed it:
//!
//! | state | meaning |
//! |---|---|
//! | `WRITING` | the ticket's writer is storing its words |
//! | `DONE` | the words are the ticket's event |
//! | `VOID` | the ticket was skipped; the slot is free |
//! | `BUSY` | the ticket was skipped while an older writer still stores into the slot |
//!
//! *Write* ticket `t`: load the sequence word; if it names a ticket `>= t`, a newer writer took
//! the slot (the ring lapped this writer): give up. If an older writer is still in the slot
//! (`WRITING` or `BUSY`), CAS the word to `(t, BUSY)` and give up: never two writers store into
//! one slot. Otherwise CAS it to `(t, WRITING)`, store the words, and CAS `(t, WRITING)` to
//! `(t, DONE)`. If that CAS fails, a newer ticket marked the slot `BUSY` meanwhile: the writer
//! CASes that word to `VOID` so the slot can be used again, and its event is lost.
//!
//! *Drain* (one drainer at a time) ticket `t` from the ring's read index up to the write index:
//! the word names a newer ticket, or `(t, VOID | BUSY)`: the event is lost, count it dropped;
//! an older ticket, or `(t, WRITING)`: the writer has not finished, stop here (the next drain
//! resumes); `(t, DONE)`: read the words, then re-read the word (a seqlock): unchanged means the
//! words are the event, changed means a newer writer overwrote the slot while it was read
//! (dropped). Every ticket is thus delivered or counted dropped exactly once, and a drain never
//! returns a torn event. When the ring is full the oldest events are overwritten.
//!
//! The loom models at the end of this file check this protocol: writers racing each other on a
//! lapped ring and a concurrent drain.
//!
//! # Switching the trace
//!
//! `trace_start` and `trace_stop` pause the pool (the stop gate): no alloc or free is in flight
//! while the rings are replaced or the flag flips, so a ring is never freed under a writer, and
//! after `trace_stop` returns no further event is recorded. Draining does not pause.

use crate::sync::{fence, AtomicU64, Ordering};

/// Words of one event in a slot.
const EVENT_WORDS: usize = 7;

const WRITING: u64 = 0;
const DONE: u64 = 1;
const VOID: u64 = 2;
const BUSY: u64 = 3;
const STATE: u64 = 3;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// A block was allocated (`aux` = its alignment).
    Alloc = 1,
    /// A block was freed.
    Free = 2,
    /// A live block moved (`offset` = where it is now, `aux` = where it was).
    Move = 3,
    /// An allocation failed for lack of memory (`offset` = 0, `aux` = the alignment asked).
    Failed = 4,
}

impl EventKind {
    fn from_u8(v: u8) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::Alloc),
            2 => Some(EventKind::Free),
            3 => Some(EventKind::Move),
            4 => Some(EventKind::Failed),
            _ => None,
        }
    }

    /// A short lowercase name: `alloc`, `free`, `move`, `failed`.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::Move => "move",
            EventKind::Failed => "failed",
        }
    }
}

/// One traced event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    /// Nanoseconds since the pool was made (monotonic clock).
    pub time_ns: u64,
    /// What happened.
    pub kind: EventKind,
    /// The block's offset (after the move for moves; 0 for failed allocations).
    pub offset: usize,
    /// The bytes asked for.
    pub size: usize,
    /// The core pool of the thread that made the call.
    pub core: u16,
    /// The tag id given at allocation (0 = none).
    pub tag: u32,
    /// The block's handle, packed ([`crate::Handle::to_bits`]); 0 for failed allocations.
    pub handle: u128,
    /// Alignment for allocations and failures, the old offset for moves, 0 for frees.
    pub aux: u64,
}

impl TraceEvent {
    fn to_words(self) -> [u64; EVENT_WORDS] {
        [
            self.time_ns,
            self.offset as u64,
            self.size as u64,
            self.kind as u64 | (self.core as u64) << 8 | (self.tag as u64) << 32,
            self.handle as u64,
            (self.handle >> 64) as u64,
            self.aux,
        ]
    }

    fn from_words(w: [u64; EVENT_WORDS]) -> Option<TraceEvent> {
        Some(TraceEvent {
            time_ns: w[0],
            offset: w[1] as usize,
            size: w[2] as usize,
            kind: EventKind::from_u8(w[3] as u8)?,
            core: (w[3] >> 8) as u16,
            tag: (w[3] >> 32) as u32,
            handle: w[4] as u128 | (w[5] as u128) << 64,
            aux: w[6],
        })
    }
}

/// One slot: a sequence word and the event's words, alone on a cache line when `W = 7`.
#[repr(align(64))]
struct Slot<const W: usize> {
    seq: AtomicU64,
    words: [AtomicU64; W],
}

/// A bounded multi-writer ring with one drainer (see the module documentation).
pub(crate) struct Ring<const W: usize> {
    slots: Box<[Slot<W>]>,
    mask: u64,
    write: crate::sync::CachePadded<AtomicU64>,
    /// Next ticket to drain (only the drainer touches it).
    read: AtomicU64,
}

/// What one drain of a ring found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drained {
    pub(crate) delivered: u64,
    pub(crate) dropped: u64,
}

impl<const W: usize> Ring<W> {
    /// A ring of `cap` slots (a power of two, at least 1).
    pub(crate) fn new(cap: usize) -> Ring<W> {
        assert!(cap.is_power_of_two());
        Ring {
            slots: (0..cap)
                .map(|_| Slot { seq: AtomicU64::new(VOID), words: std::array::from_fn(|_| AtomicU64::new(0)) })
                .collect(),
            mask: cap as u64 - 1,
            write: crate::sync::CachePadded(AtomicU64::new(0)),
            read: AtomicU64::new(0),
        }
    }

    /// Tickets handed out so far (events written, lost or in flight).
    pub(crate) fn written(&self) -> u64 {
        self.write.load(Ordering::Relaxed)
    }

    /// Record one event; never waits. The event is lost if the ring laps this writer.
    #[inline]
    pub(crate) fn push(&self, words: &[u64; W]) {
        let ticket = self.write.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[(ticket & self.mask) as usize];
        let mine = (ticket + 1) << 2;
        let mut seen = slot.seq.load(Ordering::Relaxed);
        loop {
            if seen >> 2 > ticket {
                return; // a newer ticket owns the slot: this one is counted dropped by the drain
            }
            let older_inside = matches!(seen & STATE, WRITING | BUSY);
            let next = if older_inside { mine | BUSY } else { mine | WRITING };
            match slot.seq.compare_exchange_weak(seen, next, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) if older_inside => return,
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        // Readers that see any of the words below see the claim above (seqlock writer side).
        fence(Ordering::Release);
        for (cell, &w) in slot.words.iter().zip(words) {
            cell.store(w, Ordering::Relaxed);
        }
        if let Err(mut seen) =
            slot.seq.compare_exchange(mine | WRITING, mine | DONE, Ordering::Release, Ordering::Relaxed)
        {
            // A newer ticket marked the slot BUSY while the words were stored: hand it back.
            loop {
                debug_assert_eq!(seen & STATE, BUSY);
                match slot.seq.compare_exchange_weak(seen, (seen & !STATE) | VOID, Ordering::Release, Ordering::Relaxed)
                {
                    Ok(_) => break,
                    Err(now) => seen = now,
                }
            }
        }
    }

    /// Hand every finished event since the last drain to `out`, oldest first. One drainer at a
    /// time (the caller serialises drains).
    pub(crate) fn drain(&self, out: &mut dyn FnMut([u64; W])) -> Drained {
        let write = self.write.load(Ordering::Acquire);
        let cap = self.mask + 1;
        let mut ticket = self.read.load(Ordering::Relaxed);
        let mut done = Drained::default();
        if write - ticket > cap {
            // The slots of these tickets belong to newer tickets now.
            done.dropped += write - cap - ticket;
            ticket = write - cap;
        }
        while ticket < write {
            let slot = &self.slots[(ticket & self.mask) as usize];
            let before = slot.seq.load(Ordering::Acquire);
            let owner = before >> 2;
            if owner > ticket + 1 {
                done.dropped += 1; // overwritten
                ticket += 1;
                continue;
            }
            if owner < ticket + 1 || before & STATE == WRITING {
                break; // its writer has not finished: the next drain resumes here
            }
            if before & STATE != DONE {
                done.dropped += 1; // skipped by its writer (VOID or BUSY)
                ticket += 1;
                continue;
            }
            let words: [u64; W] = std::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) == before {
                out(words);
                done.delivered += 1;
            } else {
                done.dropped += 1; // a newer writer took the slot while we read it
            }
            ticket += 1;
        }
        self.read.store(ticket, Ordering::Relaxed);
        done
    }
}

#[cfg(not(loom))]
pub(crate) use switch::Trace;

/// The pool's trace: the on/off flag, the rings, and the pool-level API.
#[cfg(not(loom))]
mod switch {
    use super::{EventKind, Ring, TraceEvent, EVENT_WORDS};
    use crate::clock::{Clock, TscScale};
    use crate::error::{Error, Result};
    use crate::handle::Handle;
    use crate::pool::Pool;
    use crate::sync::CachePadded;
    use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64 as StdAtomicU64, Ordering};
    use std::sync::Mutex;

    /// Most events a trace can hold (64 bytes each: 1 GiB).
    pub const MAX_TRACE_CAPACITY: usize = 1 << 24;
    /// Fewest slots per core ring.
    const MIN_RING: usize = 16;

    struct Rings {
        rings: Box<[CachePadded<Ring<EVENT_WORDS>>]>,
        per_core: usize,
        /// The fast clock of this trace, if the time-stamp counter is trustworthy here.
        fast_clock: Option<TscScale>,
    }

    #[derive(Default)]
    struct Drains {
        dropped: u64,
        delivered: u64,
    }

    /// The flag, the rings (replaced only while the pool is paused), and drain bookkeeping.
    pub(crate) struct Trace {
        on: AtomicBool,
        clock: Clock,
        rings: AtomicPtr<Rings>,
        /// Serialises start, stop and drain (never taken on the alloc/free path).
        control: Mutex<Drains>,
        /// Incremented by every start, so a drain can tell traces apart.
        generation: StdAtomicU64,
    }

    impl Drop for Trace {
        fn drop(&mut self) {
            let rings = *self.rings.get_mut();
            if !rings.is_null() {
                // SAFETY: installed from a Box by `install`, freed once, here.
                drop(unsafe { Box::from_raw(rings) });
            }
        }
    }

    /// Where a trace stands.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct TraceStatus {
        /// Whether events are being recorded now.
        pub enabled: bool,
        /// Events the rings hold at most (all cores together; 0 before the first start).
        pub capacity: usize,
        /// Events recorded since the last start (delivered, lost, or waiting to be drained).
        pub recorded: u64,
        /// Events drained since the last start.
        pub drained: u64,
        /// Events lost since the last start (overwritten before a drain, or lapped writers),
        /// as counted by the drains so far.
        pub dropped: u64,
    }

    impl Trace {
        pub(crate) fn new() -> Trace {
            Trace {
                on: AtomicBool::new(false),
                clock: Clock::new(),
                rings: AtomicPtr::new(std::ptr::null_mut()),
                control: Mutex::new(Drains::default()),
                generation: StdAtomicU64::new(0),
            }
        }

        /// Nanoseconds since the pool was made.
        pub(crate) fn now_ns(&self) -> u64 {
            self.clock.now_ns()
        }

        /// Whether the trace is on: the one load the alloc/free path pays when it is off.
        #[inline(always)]
        fn on(&self) -> bool {
            self.on.load(Ordering::Relaxed)
        }

        #[inline]
        pub(crate) fn on_alloc(&self, core: usize, handle: Handle, offset: usize, size: usize, align: usize, tag: u32) {
            if self.on() {
                self.record(EventKind::Alloc, core, handle.to_bits(), offset, size, tag, align as u64);
            }
        }

        #[inline]
        pub(crate) fn on_free(&self, core: usize, handle: Handle, offset: usize, size: usize, tag: u32) {
            if self.on() {
                self.record(EventKind::Free, core, handle.to_bits(), offset, size, tag, 0);
            }
        }

        #[inline]
        pub(crate) fn on_failed(&self, core: usize, size: usize, align: usize, tag: u32) {
            if self.on() {
                self.record(EventKind::Failed, core, 0, 0, size, tag, align as u64);
            }
        }

        #[cold]
        #[inline(never)]
        #[allow(clippy::too_many_arguments)]
        fn record(&self, kind: EventKind, core: usize, handle: u128, offset: usize, size: usize, tag: u32, aux: u64) {
            let rings = self.rings.load(Ordering::Acquire);
            if rings.is_null() {
                return;
            }
            // SAFETY: rings are replaced and freed only while the pool is paused, and every
            // caller of `record` is inside the pool (or is the pauser itself, for moves).
            let rings = unsafe { &*rings };
            let time_ns = match &rings.fast_clock {
                Some(scale) => scale.now_ns(),
                None => self.now_ns(),
            };
            let event = TraceEvent { time_ns, kind, offset, size, core: core as u16, tag, handle, aux };
            rings.rings[core % rings.rings.len()].push(&event.to_words());
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, Drains> {
            self.control.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Replace the rings (the pool must be paused) and switch on; `fast_clock` from
        /// `Clock::calibrate`.
        fn install(&self, cores: usize, capacity: usize, fast_clock: Option<TscScale>) {
            let per_core = capacity.div_ceil(cores).next_power_of_two().max(MIN_RING);
            let fresh = Box::new(Rings {
                rings: (0..cores).map(|_| CachePadded(Ring::new(per_core))).collect(),
                per_core,
                fast_clock,
            });
            let old = self.rings.swap(Box::into_raw(fresh), Ordering::AcqRel);
            if !old.is_null() {
                // SAFETY: the pool is paused, so no writer holds the old rings; installed from a
                // Box by an earlier `install`, freed once, here.
                drop(unsafe { Box::from_raw(old) });
            }
            self.generation.fetch_add(1, Ordering::Relaxed);
            self.on.store(true, Ordering::Release);
        }

        fn status_locked(&self, drains: &Drains) -> TraceStatus {
            let rings = self.rings.load(Ordering::Acquire);
            if rings.is_null() {
                return TraceStatus::default();
            }
            // SAFETY: rings are freed only by `install` under the control lock (held here) or
            // by drop.
            let rings = unsafe { &*rings };
            TraceStatus {
                enabled: self.on(),
                capacity: rings.per_core * rings.rings.len(),
                recorded: rings.rings.iter().map(|r| r.written()).sum(),
                drained: drains.delivered,
                dropped: drains.dropped,
            }
        }
    }

    impl Pool {
        /// Start a fresh event trace holding up to `capacity` events (all cores together; each
        /// core's ring gets `capacity / cores` rounded up to a power of two, at least 16).
        /// Events of an earlier trace that were not drained are discarded. Pauses the pool
        /// briefly. The rings take 64 bytes per event.
        pub fn trace_start(&self, capacity: usize) -> Result<()> {
            if capacity == 0 || capacity > MAX_TRACE_CAPACITY {
                return Err(Error::InvalidSize {
                    size: capacity as u128,
                    reason: "a trace holds between 1 and 16,777,216 events",
                });
            }
            let trace = &self.trace;
            let mut drains = trace.lock();
            let fast_clock = trace.clock.calibrate(); // about 1 ms, before pausing
            let _paused = self.pause_for_maintenance()?;
            trace.install(self.cores(), capacity, fast_clock);
            *drains = Drains::default();
            Ok(())
        }

        /// Stop recording (pauses the pool briefly, so no event is recorded after this
        /// returns). The events recorded so far stay until drained or the next start.
        pub fn trace_stop(&self) -> Result<()> {
            let trace = &self.trace;
            let _drains = trace.lock();
            let _paused = self.pause_for_maintenance()?;
            trace.on.store(false, Ordering::Release);
            Ok(())
        }

        /// Every event recorded since the last drain, oldest first (by time; events of one
        /// core keep their order). Does not pause the pool: events still being written are
        /// left for the next drain.
        pub fn trace_drain(&self) -> Vec<TraceEvent> {
            let trace = &self.trace;
            let mut drains = trace.lock();
            let rings = trace.rings.load(Ordering::Acquire);
            if rings.is_null() {
                return Vec::new();
            }
            // SAFETY: rings are freed only by `install` under the control lock (held here) or
            // by drop.
            let rings = unsafe { &*rings };
            let mut events = Vec::new();
            for ring in rings.rings.iter() {
                let got = ring.drain(&mut |w| {
                    if let Some(e) = TraceEvent::from_words(w) {
                        events.push(e);
                    }
                });
                drains.delivered += got.delivered;
                drains.dropped += got.dropped;
            }
            events.sort_by_key(|e| e.time_ns);
            events
        }

        /// Where the trace stands: on or off, capacity, events recorded, drained and dropped.
        pub fn trace_status(&self) -> TraceStatus {
            let trace = &self.trace;
            let drains = trace.lock();
            trace.status_locked(&drains)
        }

        /// Record that a live block moved from `from` to `to` (for the compactor, which calls it
        /// while the pool is paused). Nothing happens while the trace is off.
        pub fn record_move(&self, handle: Handle, from: usize, to: usize) -> Result<()> {
            let trace = &self.trace;
            if !trace.on() {
                return Ok(());
            }
            let block = self.block(handle)?;
            trace.record(EventKind::Move, block.core, handle.to_bits(), to, block.size, block.tag, from as u64);
            Ok(())
        }

        /// Nanoseconds since the pool was made (the clock of trace events and snapshots).
        pub fn clock_ns(&self) -> u64 {
            self.trace.now_ns()
        }
    }
}

#[cfg(not(loom))]
pub use switch::{TraceStatus, MAX_TRACE_CAPACITY};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn event(n: u64) -> [u64; 2] {
        [n, !n]
    }

    #[test]
    fn words_round_trip() {
        let e = TraceEvent {
            time_ns: 123,
            kind: EventKind::Move,
            offset: 1 << 40,
            size: 77,
            core: 513,
            tag: u32::MAX,
            handle: (9u128 << 64) | (5 << 32) | 3,
            aux: 4096,
        };
        assert_eq!(TraceEvent::from_words(e.to_words()), Some(e));
    }

    #[test]
    fn drain_delivers_in_order_and_counts_overwrites() {
        let ring: Ring<2> = Ring::new(4);
        for n in 0..3 {
            ring.push(&event(n));
        }
        let mut got = Vec::new();
        assert_eq!(ring.drain(&mut |w| got.push(w[0])), Drained { delivered: 3, dropped: 0 });
        assert_eq!(got, vec![0, 1, 2]);
        for n in 3..13 {
            ring.push(&event(n));
        }
        got.clear();
        let d = ring.drain(&mut |w| got.push(w[0]));
        assert_eq!(got, vec![9, 10, 11, 12], "the newest `cap` events are kept");
        assert_eq!(d.dropped, 6);
        assert_eq!(ring.drain(&mut |_| panic!("nothing new")), Drained::default());
    }

    #[test]
    fn concurrent_writers_and_drains_never_tear_or_duplicate() {
        let ring: Arc<Ring<2>> = Arc::new(Ring::new(64));
        let writers = 3u64;
        let per = 20_000u64;
        let mut seen = HashSet::new();
        let mut dropped = 0;
        std::thread::scope(|s| {
            for w in 0..writers {
                let ring = ring.clone();
                s.spawn(move || {
                    for i in 0..per {
                        ring.push(&event(w * per + i));
                    }
                });
            }
            for _ in 0..2000 {
                let d = ring.drain(&mut |words| {
                    assert_eq!(words[1], !words[0], "torn event");
                    assert!(seen.insert(words[0]), "event delivered twice");
                });
                dropped += d.dropped;
            }
        });
        let d = ring.drain(&mut |words| {
            assert_eq!(words[1], !words[0], "torn event");
            assert!(seen.insert(words[0]), "event delivered twice");
        });
        dropped += d.dropped;
        assert_eq!(seen.len() as u64 + dropped, writers * per, "every ticket accounted once");
    }

    fn pool(capacity: usize, cores: usize) -> crate::Pool {
        crate::Pool::new(crate::PoolConfig::new(capacity).cores(cores)).unwrap()
    }

    #[test]
    fn off_by_default_and_nothing_recorded_after_stop() {
        let p = pool(16 << 20, 2);
        let h = p.alloc(1000, None, 0).unwrap();
        p.free(h).unwrap();
        assert!(p.trace_drain().is_empty());
        assert_eq!(p.trace_status(), TraceStatus::default());
        p.trace_start(100).unwrap();
        let h = p.alloc(1000, None, 0).unwrap();
        p.trace_stop().unwrap();
        p.free(h).unwrap();
        let events = p.trace_drain();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::Alloc);
        let st = p.trace_status();
        assert!(!st.enabled);
        assert_eq!((st.recorded, st.drained, st.dropped), (1, 1, 0));
        assert!(st.capacity >= 100);
    }

    #[test]
    fn events_carry_what_happened() {
        let p = pool(8 << 20, 1);
        p.trace_start(1000).unwrap();
        let a = p.alloc(3000, Some(4096), 7).unwrap();
        let b = p.alloc(5 << 20, None, 8).unwrap();
        assert!(p.alloc(6 << 20, None, 9).is_err());
        let info = p.block(a).unwrap();
        p.free(a).unwrap();
        p.record_move(b, 0, 4096).unwrap();
        p.free(b).unwrap();
        let events = p.trace_drain();
        let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
        use EventKind::*;
        assert_eq!(kinds, vec![Alloc, Alloc, Failed, Free, Move, Free]);
        let e = events[0];
        assert_eq!((e.offset, e.size, e.tag, e.aux, e.handle, e.core), (info.offset, 3000, 7, 4096, a.to_bits(), 0));
        assert_eq!((events[2].size, events[2].tag, events[2].handle), (6 << 20, 9, 0));
        assert_eq!(events[2].aux, p.config().alignment as u64);
        assert_eq!((events[3].handle, events[3].offset), (a.to_bits(), info.offset));
        assert_eq!((events[4].offset, events[4].aux, events[4].size), (4096, 0, 5 << 20));
        assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        assert!(p.clock_ns() >= events[5].time_ns);
        // A bad capacity is refused and changes nothing.
        assert!(p.trace_start(0).is_err());
        assert!(p.trace_start(MAX_TRACE_CAPACITY + 1).is_err());
        assert!(p.trace_status().enabled);
    }

    #[test]
    fn a_full_ring_keeps_the_newest_and_counts_the_rest() {
        let p = pool(8 << 20, 1);
        p.trace_start(16).unwrap();
        for _ in 0..50 {
            let h = p.alloc(256, None, 0).unwrap();
            p.free(h).unwrap();
        }
        let events = p.trace_drain();
        assert_eq!(events.len(), 16);
        let st = p.trace_status();
        assert_eq!((st.recorded, st.drained, st.dropped), (100, 16, 84));
        // A restart begins a fresh trace.
        p.trace_start(16).unwrap();
        assert_eq!(p.trace_status().recorded, 0);
        assert!(p.trace_drain().is_empty());
    }

    #[test]
    fn concurrent_alloc_free_pairs_up_in_the_trace() {
        let p = Arc::new(pool(64 << 20, 2));
        p.trace_start(1 << 16).unwrap();
        let mut drained = Vec::new();
        std::thread::scope(|s| {
            for t in 0..2 {
                let p = p.clone();
                s.spawn(move || {
                    for i in 0..5000usize {
                        let h = p.alloc(64 + (i * 37 + t) % 9000, None, t as u32).unwrap();
                        p.free(h).unwrap();
                    }
                });
            }
            for _ in 0..20 {
                drained.extend(p.trace_drain());
                std::thread::yield_now();
            }
        });
        p.trace_stop().unwrap();
        drained.extend(p.trace_drain());
        assert_eq!(p.trace_status().dropped, 0);
        assert_eq!(drained.len(), 20_000);
        let mut live = std::collections::HashMap::new();
        drained.sort_by_key(|e| e.time_ns);
        for e in &drained {
            match e.kind {
                EventKind::Alloc => assert!(live.insert(e.handle, e.size).is_none()),
                EventKind::Free => assert_eq!(live.remove(&e.handle), Some(e.size)),
                _ => panic!("unexpected {e:?}"),
            }
        }
        assert!(live.is_empty());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! The ring protocol on a ring of one or two slots, so writers lap each other and the drain
    //! races both: no torn event, no event twice, every ticket delivered or counted dropped.
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn check(words: [u64; 2], seen: &mut Vec<u64>) {
        assert_eq!(words[1], words[0] * 10, "torn event {words:?}");
        assert!(!seen.contains(&words[0]), "event {} delivered twice", words[0]);
        seen.push(words[0]);
    }

    #[test]
    fn writer_laps_writer_on_one_slot_while_draining() {
        loom::model(|| {
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(1));
            let r2 = ring.clone();
            let other = thread::spawn(move || r2.push(&[1, 10]));
            ring.push(&[2, 20]);
            let mut seen = Vec::new();
            let mut dropped = 0;
            dropped += ring.drain(&mut |w| check(w, &mut seen)).dropped;
            other.join().unwrap();
            dropped += ring.drain(&mut |w| check(w, &mut seen)).dropped;
            assert_eq!(seen.len() as u64 + dropped, 2, "a ticket was lost uncounted");
            // The ring is quiet and the slot free again: a fresh event gets through.
            ring.push(&[3, 30]);
            let mut last = Vec::new();
            ring.drain(&mut |w| check(w, &mut last));
            assert_eq!(last, vec![3], "the slot was left unusable");
        });
    }

    #[test]
    fn drain_races_a_writer_overwriting_the_slot_it_reads() {
        loom::model(|| {
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(1));
            ring.push(&[1, 10]);
            let r2 = ring.clone();
            let writer = thread::spawn(move || {
                r2.push(&[2, 20]);
            });
            let mut seen = Vec::new();
            let mut dropped = ring.drain(&mut |w| check(w, &mut seen)).dropped;
            writer.join().unwrap();
            dropped += ring.drain(&mut |w| check(w, &mut seen)).dropped;
            assert_eq!(seen.len() as u64 + dropped, 2);
            assert!(seen.contains(&2), "the last event of a quiet ring is delivered");
        });
    }

    #[test]
    fn two_writers_two_slots_and_a_drain() {
        loom::model(|| {
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(2));
            let r2 = ring.clone();
            let other = thread::spawn(move || {
                r2.push(&[1, 10]);
                r2.push(&[2, 20]);
            });
            ring.push(&[3, 30]);
            let mut seen = Vec::new();
            let mut dropped = ring.drain(&mut |w| check(w, &mut seen)).dropped;
            other.join().unwrap();
            dropped += ring.drain(&mut |w| check(w, &mut seen)).dropped;
            assert_eq!(seen.len() as u64 + dropped, 3, "a ticket was lost uncounted");
        });
    }
}

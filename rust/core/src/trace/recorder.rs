//! The pool's trace: the on/off flag, the per-core rings, and the drain bookkeeping. The pool's
//! trace API (`trace_start`, `trace_drain`, ...) is in `pool/tracing.rs`.

use super::clock::{Clock, TscScale};
use super::event::{EventKind, TraceEvent, EVENT_WORDS};
use super::ring::Ring;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::util::sync::CachePadded;
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

    /// Fresh rings for `capacity` events over `cores` cores; `fast_clock` from
    /// `Clock::calibrate`. `Error::HostMemory` when the host has no room for them.
    fn make_rings(cores: usize, capacity: usize, fast_clock: Option<TscScale>) -> Result<Box<Rings>> {
        let per_core = capacity.div_ceil(cores).next_power_of_two().max(MIN_RING);
        let mut rings = Vec::new();
        rings.try_reserve_exact(cores).map_err(|_| Error::HostMemory { what: "the trace rings", bytes: usize::MAX })?;
        for _ in 0..cores {
            rings.push(CachePadded(Ring::new(per_core)?));
        }
        Ok(Box::new(Rings { rings: rings.into_boxed_slice(), per_core, fast_clock }))
    }

    /// Replace the rings with `fresh` (the pool must be paused) and switch on.
    fn install(&self, fresh: Box<Rings>) {
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

    /// Start a fresh trace of `capacity` events over `cores` rings; `pause` pauses the pool
    /// (after the clock is calibrated, which takes about 1 ms) for the switch. Events of an
    /// earlier trace that were not drained are discarded.
    pub(crate) fn start<G>(&self, cores: usize, capacity: usize, pause: impl FnOnce() -> Result<G>) -> Result<()> {
        let mut drains = self.lock();
        let fast_clock = self.clock.calibrate();
        let fresh = Self::make_rings(cores, capacity, fast_clock)?;
        let _paused = pause()?;
        self.install(fresh);
        *drains = Drains::default();
        Ok(())
    }

    /// Stop recording while `pause` holds the pool.
    pub(crate) fn stop<G>(&self, pause: impl FnOnce() -> Result<G>) -> Result<()> {
        let _drains = self.lock();
        let _paused = pause()?;
        self.on.store(false, Ordering::Release);
        Ok(())
    }

    /// Every event recorded since the last drain, oldest first (by time; events of one core
    /// keep their order). Events still being written are left for the next drain.
    pub(crate) fn drain(&self) -> Vec<TraceEvent> {
        let mut drains = self.lock();
        let rings = self.rings.load(Ordering::Acquire);
        if rings.is_null() {
            return Vec::new();
        }
        // SAFETY: rings are freed only by `install` under the control lock (held here) or by
        // drop.
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

    /// Where the trace stands.
    pub(crate) fn status(&self) -> TraceStatus {
        let drains = self.lock();
        self.status_locked(&drains)
    }

    /// Whether events are recorded now.
    pub(crate) fn is_on(&self) -> bool {
        self.on()
    }

    /// Record that the block behind `handle` (of `core`, `size` bytes, `tag`) moved from `from`
    /// to `to`.
    pub(crate) fn on_move(&self, core: usize, handle: Handle, from: usize, to: usize, size: usize, tag: u32) {
        if self.on() {
            self.record(EventKind::Move, core, handle.to_bits(), to, size, tag, from as u64);
        }
    }
}

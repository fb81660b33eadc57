//! The pool's trace: the on/off flag, the rings, and the drain bookkeeping. The pool's trace
//! API (`trace_start`, `trace_drain`, ...) is in `pool/tracing.rs`; which ring a thread writes
//! is `trace/rings.rs`.

use super::clock::Clock;
use super::event::{EventKind, TraceEvent};
use super::merge::{merge, MergeRoom};
use super::rings::Rings;
use crate::error::Result;
use crate::handle::id::Handle;
use crate::util::grow::try_vec;
use crate::util::grow::{reserve, try_push};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64 as StdAtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::error::Error;

/// How long a trace call waits for a control lock stamped with another fork generation before
/// it takes the holder for a thread of the parent process (one that took it an instant ago and
/// has not stamped it yet is done in microseconds).
const FORKED_HOLDER_GRACE: Duration = Duration::from_secs(1);

#[cfg(not(loom))]
use crate::gate::fork_generation;

/// Loom models make no process: one generation.
#[cfg(loom)]
fn fork_generation() -> u64 {
    0
}

/// Most events a trace can hold (64 bytes each: 1 GiB).
pub const MAX_TRACE_CAPACITY: usize = 1 << 24;

/// What a drain's lists of events are called when the host has no memory for them.
const EVENTS: &str = "the drained trace events";

#[derive(Default)]
struct Drains {
    dropped: u64,
    delivered: u64,
}

/// The time of an event, read before it happened (see [`Trace::stamp`]).
#[derive(Debug, Clone, Copy)]
#[must_use]
pub(crate) struct Stamp(Option<u64>);

/// The flag, the rings (replaced only while the pool is paused), and drain bookkeeping.
pub(crate) struct Trace {
    on: AtomicBool,
    clock: Clock,
    /// From `Arc::into_raw`; the trace holds that reference.
    rings: AtomicPtr<Rings>,
    /// Serialises start, stop and drain (never taken on the alloc/free path).
    control: Mutex<Drains>,
    /// The fork generation (`gate::fork_generation`) of the process whose thread took
    /// `control` last, stamped right after it took it: a lock held with another generation's
    /// stamp was taken by a thread of the parent process, before a `fork()`, and is never let
    /// go in this one ([`Trace::lock`]).
    locked_in: StdAtomicU64,
    /// Incremented by every start, so a drain can tell traces apart.
    generation: StdAtomicU64,
}

impl Drop for Trace {
    fn drop(&mut self) {
        let rings = *self.rings.get_mut();
        if !rings.is_null() {
            // SAFETY: installed from `Arc::into_raw` by `install`; the trace's reference is
            // given up once, here.
            drop(unsafe { Arc::from_raw(rings) });
        }
    }
}

/// Where a trace stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceStatus {
    /// Whether events are being recorded now.
    pub enabled: bool,
    /// Events the rings hold at most (all rings together; 0 before the first start).
    pub capacity: usize,
    /// Events recorded since the last start (delivered, lost, or waiting to be drained).
    pub recorded: u64,
    /// Events drained since the last start.
    pub drained: u64,
    /// Events lost since the last start: counted by the drains so far (overwritten before a
    /// drain, or lapped writers), and those the rings have overwritten since the last drain.
    pub dropped: u64,
}

impl Trace {
    pub(crate) fn new() -> Trace {
        Trace {
            on: AtomicBool::new(false),
            clock: Clock::new(),
            rings: AtomicPtr::new(std::ptr::null_mut()),
            control: Mutex::new(Drains::default()),
            locked_in: StdAtomicU64::new(fork_generation()),
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

    /// The time of a free about to be made, read before its block's bytes go back (`None` while
    /// the trace is off): a thread that takes them again records a later time, however long
    /// the freeing thread waits before it records its event ([`Trace::on_free`]).
    #[inline]
    pub(crate) fn stamp(&self) -> Stamp {
        Stamp(if self.on() { self.now() } else { None })
    }

    #[inline]
    pub(crate) fn on_free(&self, stamp: Stamp, core: usize, handle: Handle, offset: usize, size: usize, tag: u32) {
        if let Some(time) = stamp.0 {
            self.record_at(time, EventKind::Free, core, handle.to_bits(), offset, size, tag, 0);
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
        if let Some(time) = self.now() {
            self.record_at(time, kind, core, handle, offset, size, tag, aux);
        }
    }

    /// The rings' time now (counter ticks, or nanoseconds where the counter is not trusted);
    /// `None` when the trace has no rings.
    #[cold]
    #[inline(never)]
    fn now(&self) -> Option<u64> {
        let ptr = self.rings.load(Ordering::Acquire);
        if ptr.is_null() {
            return None;
        }
        // SAFETY: as in `record_at`.
        let rings = unsafe { &*ptr };
        Some(match &rings.fast_clock {
            Some(scale) => scale.ticks(),
            None => self.now_ns(),
        })
    }

    /// Record an event that happened at `time_ns` (in the rings' time, [`Trace::now`]).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn record_at(
        &self,
        time_ns: u64,
        kind: EventKind,
        core: usize,
        handle: u128,
        offset: usize,
        size: usize,
        tag: u32,
        aux: u64,
    ) {
        let ptr = self.rings.load(Ordering::Acquire);
        if ptr.is_null() {
            return;
        }
        // SAFETY: rings are replaced and given up only while the pool is paused, and every
        // caller is inside the pool (or is the pauser itself, for moves), so the rings read by
        // `now` for a stamp are these.
        let rings = unsafe { &*ptr };
        let event = TraceEvent { time_ns, kind, offset, size, core: core as u16, tag, handle, aux };
        rings.push(ptr, &event.to_words());
    }

    /// The control lock: `None` when a thread of the parent process held it at a `fork()`
    /// (it stays stamped with another fork generation for [`FORKED_HOLDER_GRACE`]). Then no
    /// thread of this process can take it, so none replaces the rings either: reading them
    /// without the lock is safe, changing the trace is not.
    fn lock(&self) -> Option<MutexGuard<'_, Drains>> {
        let started = Instant::now();
        loop {
            let taken = match self.control.try_lock() {
                Ok(drains) => Some(drains),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) if self.locked_in.load(Ordering::Acquire) == fork_generation() => {
                    // Held by a thread of this process: it lets the lock go.
                    Some(self.control.lock().unwrap_or_else(|p| p.into_inner()))
                }
                Err(TryLockError::WouldBlock) => None,
            };
            if let Some(drains) = taken {
                let generation = fork_generation();
                if self.locked_in.load(Ordering::Relaxed) != generation {
                    self.locked_in.store(generation, Ordering::Release);
                }
                return Some(drains);
            }
            if started.elapsed() >= FORKED_HOLDER_GRACE {
                return None;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// [`Trace::lock`] for a call that changes the trace: `Error::ForkedMidCall` in a child
    /// process forked while another thread was inside a trace call.
    fn lock_to_change(&self) -> Result<MutexGuard<'_, Drains>> {
        self.lock().ok_or(Error::ForkedMidCall)
    }

    /// Replace the rings with `fresh` (the pool must be paused) and switch on.
    fn install(&self, fresh: Arc<Rings>) {
        let old = self.rings.swap(Arc::into_raw(fresh).cast_mut(), Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: the pool is paused, so no writer uses the old rings; installed from
            // `Arc::into_raw` by an earlier `install`, the trace's reference given up once, here.
            drop(unsafe { Arc::from_raw(old) });
        }
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.on.store(true, Ordering::Release);
    }

    fn status_locked(&self, drains: &Drains) -> TraceStatus {
        let rings = self.rings.load(Ordering::Acquire);
        if rings.is_null() {
            return TraceStatus::default();
        }
        // SAFETY: rings are freed only by `install` under the control lock (held here, or held
        // by a thread of the parent process, which no thread here can take) or by drop.
        let rings = unsafe { &*rings };
        TraceStatus {
            enabled: self.on(),
            capacity: rings.capacity(),
            recorded: rings.written(),
            drained: drains.delivered,
            dropped: drains.dropped + rings.overwritten(),
        }
    }

    /// Start a fresh trace of `capacity` events over `cores` rings; `pause` pauses the pool
    /// (after the clock is calibrated, which takes about 1 ms) for the switch. Events of an
    /// earlier trace that were not drained are discarded.
    ///
    /// The pool is paused before the control lock is taken, never the other way round: the
    /// pause may wait long (for another thread's pause, up to its timeout), and a thread that
    /// waits for it checks for signals, which in the Python binding takes the GIL, while a
    /// thread holding the GIL may be waiting for the control lock (`trace_status`, a tag's
    /// release). Nothing done under the control lock waits for the pool or the GIL.
    pub(crate) fn start<G>(&self, cores: usize, capacity: usize, pause: impl FnOnce() -> Result<G>) -> Result<()> {
        let fast_clock = self.clock.calibrate();
        let fresh = Rings::new(cores, capacity, fast_clock)?;
        let _paused = pause()?;
        let mut drains = self.lock_to_change()?;
        self.install(fresh);
        *drains = Drains::default();
        Ok(())
    }

    /// Stop recording while `pause` holds the pool (taken before the control lock, as for
    /// [`Trace::start`]).
    pub(crate) fn stop<G>(&self, pause: impl FnOnce() -> Result<G>) -> Result<()> {
        let _paused = pause()?;
        let _drains = self.lock_to_change()?;
        self.on.store(false, Ordering::Release);
        Ok(())
    }

    /// Every event recorded since the last drain, oldest first (by time; events of one thread
    /// keep their order, and a block's free and moves come after its alloc: `trace/merge.rs`).
    /// Events still being written are left for the next drain.
    ///
    /// `Error::HostMemory` when the host has no memory for the events: the room for those
    /// waiting is made before any is taken from the rings, so they stay for the next drain.
    /// Events recorded meanwhile beyond that room need more; those the host cannot hold are
    /// counted dropped (and if the merge cannot grow for them, every event taken is).
    pub(crate) fn drain(&self) -> Result<Vec<TraceEvent>> {
        let mut drains = self.lock_to_change()?;
        let rings = self.rings.load(Ordering::Acquire);
        if rings.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: rings are freed only by `install` under the control lock (held here) or by
        // drop.
        let rings = unsafe { &*rings };
        let mut streams = try_vec(rings.count(), EVENTS)?;
        for ring in 0..rings.count() {
            let mut stream = Vec::new();
            reserve(&mut stream, rings.waiting(ring), EVENTS)?;
            streams.push(stream);
        }
        let room = MergeRoom::new(streams.len(), streams.iter().map(Vec::capacity).sum())?;
        let mut unkept = 0;
        let got = rings.drain(&mut |ring, w| {
            if let Some(mut e) = TraceEvent::from_words(w) {
                if let Some(scale) = &rings.fast_clock {
                    e.time_ns = scale.at(e.time_ns);
                }
                if try_push(&mut streams[ring], e, EVENTS).is_err() {
                    unkept += 1;
                }
            }
        });
        // The shared ring holds the events of several threads in the order they took its slots,
        // which is not the order of their times (a thread may wait between the two): by time,
        // the order of each thread's own events (whose times grow) is kept.
        if let Some(shared) = streams.last_mut() {
            shared.sort_by_key(|e| e.time_ns);
        }
        let taken: u64 = streams.iter().map(|s| s.len() as u64).sum();
        let merged = merge(streams, room);
        let lost = if merged.is_ok() { unkept } else { unkept + taken };
        drains.delivered += got.delivered - lost;
        drains.dropped += got.dropped + lost;
        merged
    }

    /// Where the trace stands. In a child process forked while another thread was inside a
    /// trace call, without what the parent's drains counted (delivered, and dropped by them).
    pub(crate) fn status(&self) -> TraceStatus {
        match self.lock() {
            Some(drains) => self.status_locked(&drains),
            None => self.status_locked(&Drains::default()),
        }
    }

    /// Add to `out` the tag ids that the events a drain now would deliver name (0 for none
    /// included): a read-only pass over every ring's events since the last drain, O(the
    /// rings' capacity). An event being written meanwhile may be left out, so the caller must
    /// know otherwise about the tags such events name (`stats/tags.rs`: their blocks hold them).
    pub(crate) fn tags_named(&self, out: &mut HashSet<u32>) {
        // Without the lock (`None`), no thread of this process replaces the rings either.
        let _drains = self.lock();
        let rings = self.rings.load(Ordering::Acquire);
        if rings.is_null() {
            return;
        }
        // SAFETY: rings are freed only by `install` under the control lock (held here, or held
        // by a thread of the parent process, which no thread here can take) or by drop.
        let rings = unsafe { &*rings };
        rings.retained(&mut |w| {
            if let Some(e) = TraceEvent::from_words(w) {
                out.insert(e.tag);
            }
        });
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

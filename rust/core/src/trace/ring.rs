//! A bounded multi-writer ring with one drainer: the storage of the event trace.
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

use super::slot::{first_held, Drained, EventWords};
use crate::error::Result;
use crate::util::grow::try_boxed;
use crate::util::sync::{fence, AtomicU64, Ordering};

const WRITING: u64 = 0;
const DONE: u64 = 1;
const VOID: u64 = 2;
const BUSY: u64 = 3;
const STATE: u64 = 3;

/// One slot: a sequence word and the event's words, alone on a cache line when `W = 7`.
#[repr(align(64))]
struct Slot<const W: usize> {
    seq: AtomicU64,
    words: EventWords<W>,
}

/// A bounded multi-writer ring with one drainer (see the module documentation).
pub(crate) struct Ring<const W: usize> {
    slots: Box<[Slot<W>]>,
    mask: u64,
    write: crate::util::sync::CachePadded<AtomicU64>,
    /// Next ticket to drain (only the drainer touches it).
    read: AtomicU64,
}

impl<const W: usize> Ring<W> {
    /// A ring of `cap` slots (a power of two, at least 1); `Error::HostMemory` when the host
    /// has no room for it (failpoint `host.vec`).
    pub(crate) fn new(cap: usize) -> Result<Ring<W>> {
        assert!(cap.is_power_of_two());
        let empty = |_| Slot { seq: AtomicU64::new(VOID), words: EventWords::new() };
        Ok(Ring {
            slots: try_boxed(cap, "a trace ring", empty)?,
            mask: cap as u64 - 1,
            write: crate::util::sync::CachePadded(AtomicU64::new(0)),
            read: AtomicU64::new(0),
        })
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
        slot.words.store(words);
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

    /// Events a drain now would take at most: those written since the last drain, up to the
    /// ring's capacity (one drainer at a time, as for [`Ring::drain`]).
    pub(crate) fn waiting(&self) -> usize {
        let unread = self.write.load(Ordering::Acquire).saturating_sub(self.read.load(Ordering::Relaxed));
        unread.min(self.mask + 1) as usize
    }

    /// Hand every finished event since the last drain to `out`, oldest first. One drainer at a
    /// time (the caller serialises drains).
    pub(crate) fn drain(&self, out: &mut dyn FnMut([u64; W])) -> Drained {
        let (done, next) = self.visit(out, true);
        self.read.store(next, Ordering::Relaxed);
        done
    }

    /// Hand every finished event a drain now would deliver, and those behind a ticket whose
    /// writer has not finished, to `out`, oldest first, and leave them in the ring: a read-only
    /// drain (serialised with drains by the caller, as they are with each other).
    pub(crate) fn retained(&self, out: &mut dyn FnMut([u64; W])) {
        self.visit(out, false);
    }

    /// Tickets handed out but not drained whose slots newer tickets took: overwritten since the
    /// last drain, which will count them dropped (serialised with drains by the caller).
    pub(crate) fn overwritten(&self) -> u64 {
        let unread = self.write.load(Ordering::Acquire).saturating_sub(self.read.load(Ordering::Relaxed));
        unread.saturating_sub(self.mask + 1)
    }

    /// The drain's reading: every finished event since the last drain to `out`, stopping at the
    /// first ticket whose writer has not finished when `stop_at_unfinished` (a drain, which
    /// resumes there next time) or stepping over it; what was delivered and dropped, and the
    /// ticket the next drain starts from.
    fn visit(&self, out: &mut dyn FnMut([u64; W]), stop_at_unfinished: bool) -> (Drained, u64) {
        let write = self.write.load(Ordering::Acquire);
        let cap = self.mask + 1;
        let mut done = Drained::default();
        let mut ticket = first_held(self.read.load(Ordering::Relaxed), write, cap, &mut done);
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
                if stop_at_unfinished {
                    break; // its writer has not finished: the next drain resumes here
                }
                ticket += 1;
                continue;
            }
            if before & STATE != DONE {
                done.dropped += 1; // skipped by its writer (VOID or BUSY)
                ticket += 1;
                continue;
            }
            let words = slot.words.load();
            fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) == before {
                out(words);
                done.delivered += 1;
            } else {
                done.dropped += 1; // a newer writer took the slot while we read it
            }
            ticket += 1;
        }
        (done, ticket)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn event(n: u64) -> [u64; 2] {
        [n, !n]
    }

    #[test]
    fn drain_delivers_in_order_and_counts_overwrites() {
        let ring: Ring<2> = Ring::new(4).unwrap();
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
        let ring: Arc<Ring<2>> = Arc::new(Ring::new(64).unwrap());
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
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(1).unwrap());
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
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(1).unwrap());
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

    /// A read-only pass races a writer that has taken the older ticket and may still be
    /// storing: the pass steps over it and sees the finished event after it, returns no torn
    /// event, and leaves both for the drain.
    #[test]
    fn a_read_only_pass_steps_over_an_unfinished_writer() {
        loom::model(|| {
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(2).unwrap());
            let r2 = ring.clone();
            let other = thread::spawn(move || r2.push(&[1, 10]));
            ring.push(&[2, 20]);
            let mut seen = Vec::new();
            ring.retained(&mut |w| check(w, &mut seen));
            assert!(seen.contains(&2), "a finished event was missed");
            other.join().unwrap();
            let mut after = Vec::new();
            ring.retained(&mut |w| check(w, &mut after));
            after.sort();
            assert_eq!(after, vec![1, 2]);
            let mut drained = Vec::new();
            assert_eq!(ring.drain(&mut |w| check(w, &mut drained)), Drained { delivered: 2, dropped: 0 });
        });
    }

    /// A read-only pass reads a one-slot ring while a writer laps it: no torn event.
    #[test]
    fn a_read_only_pass_races_a_writer_lapping_the_slot() {
        loom::model(|| {
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(1).unwrap());
            ring.push(&[1, 10]);
            let r2 = ring.clone();
            let writer = thread::spawn(move || r2.push(&[2, 20]));
            let mut seen = Vec::new();
            ring.retained(&mut |w| check(w, &mut seen));
            writer.join().unwrap();
            let mut after = Vec::new();
            ring.retained(&mut |w| check(w, &mut after));
            assert_eq!(after, vec![2]);
            let mut drained = Vec::new();
            assert_eq!(ring.drain(&mut |w| check(w, &mut drained)), Drained { delivered: 1, dropped: 1 });
        });
    }

    #[test]
    fn two_writers_two_slots_and_a_drain() {
        loom::model(|| {
            let ring: Arc<Ring<2>> = Arc::new(Ring::new(2).unwrap());
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

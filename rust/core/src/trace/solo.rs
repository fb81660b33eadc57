//! A bounded single-writer ring with one drainer: where a thread that owns a ring records its
//! events, with no atomic read-modify-write per event.
//!
//! A ring has `cap` slots (a power of two), a *sequence* word `2 x (events published) + 1 while
//! an event is being written`, stored only by the owner, and an *owner* word (the id of the
//! thread that may write, 0 when the ring is free). A thread *claims* a free ring with one CAS
//! (`0 -> id`, acquire) and *releases* it with one (`id -> 0`, release), so successive owners
//! see each other's sequence.
//!
//! *Push* ticket `h` (the owner only): store `2h + 1` to the sequence (release); a release
//! fence; store the event's words into slot `h % cap` (replacing those of ticket `h - cap`);
//! store `2h + 2` (release). This is a seqlock's writer: a drainer that sees any word of ticket
//! `h` then sees a sequence of at least `2h + 1`. Two plain stores and the words: no
//! read-modify-write.
//!
//! *Drain* (one drainer at a time): load the sequence (acquire: the words of every published
//! ticket are visible); tickets from the last drain up to the published count `end` are due.
//! Those older than `end - cap` were overwritten: count them dropped. Read the words of the
//! rest, then an acquire fence and the sequence again: the newest ticket `w` whose words may
//! have been stored is `seq / 2` when `seq` is odd and `seq / 2 - 1` when even. A ticket `t`
//! with `t + cap <= w` shares its slot with a ticket written since, so what was read may be
//! torn: count it dropped; the others are exactly the events written. Every ticket is thus
//! delivered or counted dropped once, and a drain never returns a torn event. When the ring is
//! full the oldest events are overwritten.
//!
//! The loom models at the end of this file check this protocol: a writer lapping a small ring
//! while a drain reads it, and two threads handing a ring over by claim and release.

use super::slot::{first_held, Drained, EventWords};
use crate::error::Result;
use crate::util::grow::try_boxed;
use crate::util::sync::{fence, AtomicU64, CachePadded, Ordering};

/// Tickets read per batch by a drain before it checks that the writer left them intact.
const DRAIN_BATCH: usize = 256;

/// One slot: the event's words, alone on a cache line when `W <= 8`.
#[repr(align(64))]
struct Slot<const W: usize> {
    words: EventWords<W>,
}

/// A bounded single-writer ring with one drainer (see the module documentation).
pub(crate) struct SoloRing<const W: usize> {
    /// `2 x` events published, `+ 1` while one is being written (stored only by the owner).
    seq: CachePadded<AtomicU64>,
    /// The owning thread's id; 0 when free.
    owner: CachePadded<AtomicU64>,
    /// Next ticket to drain (only the drainer touches it).
    read: AtomicU64,
    slots: Box<[Slot<W>]>,
    mask: u64,
}

impl<const W: usize> SoloRing<W> {
    /// A free ring of `cap` slots (a power of two, at least 1); `Error::HostMemory` when the host
    /// has no room for it (failpoint `host.vec`).
    pub(crate) fn new(cap: usize) -> Result<SoloRing<W>> {
        assert!(cap.is_power_of_two());
        let empty = |_| Slot { words: EventWords::new() };
        Ok(SoloRing {
            seq: CachePadded(AtomicU64::new(0)),
            owner: CachePadded(AtomicU64::new(0)),
            read: AtomicU64::new(0),
            slots: try_boxed(cap, "a trace ring", empty)?,
            mask: cap as u64 - 1,
        })
    }

    /// Make thread `id` (not 0) the ring's one writer, if the ring is free.
    pub(crate) fn claim(&self, id: u64) -> bool {
        debug_assert_ne!(id, 0);
        self.owner.compare_exchange(0, id, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Whether the ring holds no event that a drain has not taken (read by a thread that
    /// claims rings: a free ring that still holds a finished thread's events is a last choice,
    /// as writing there overwrites them).
    pub(crate) fn drained(&self) -> bool {
        self.seq.load(Ordering::Relaxed) >> 1 == self.read.load(Ordering::Relaxed)
    }

    /// Whether thread `id` owns the ring.
    pub(crate) fn owned_by(&self, id: u64) -> bool {
        self.owner.load(Ordering::Relaxed) == id
    }

    /// Free the ring if thread `id` owns it; its events stay for the drain.
    pub(crate) fn release(&self, id: u64) {
        let _ = self.owner.compare_exchange(id, 0, Ordering::Release, Ordering::Relaxed);
    }

    /// Events pushed so far (delivered, lost, or waiting to be drained).
    pub(crate) fn written(&self) -> u64 {
        self.seq.load(Ordering::Relaxed) >> 1
    }

    /// Record one event; never waits. Only the ring's owner may call it (two writers at once
    /// would lose events, never break memory safety).
    #[inline]
    pub(crate) fn push(&self, words: &[u64; W]) {
        let seq = self.seq.load(Ordering::Relaxed);
        let slot = &self.slots[((seq >> 1) & self.mask) as usize];
        // Release: a drainer that reads the odd value sees the events published before it.
        self.seq.store(seq + 1, Ordering::Release);
        // A drainer that sees any word below sees the odd sequence above, so it knows the
        // event this slot held is being overwritten.
        fence(Ordering::Release);
        slot.words.store(words);
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// Events a drain now would take at most: those written since the last drain, up to the
    /// ring's capacity (one drainer at a time, as for [`SoloRing::drain`]).
    pub(crate) fn waiting(&self) -> usize {
        let unread = (self.seq.load(Ordering::Acquire) >> 1).saturating_sub(self.read.load(Ordering::Relaxed));
        unread.min(self.mask + 1) as usize
    }

    /// Hand every event published since the last drain to `out`, oldest first. One drainer at a
    /// time (the caller serialises drains).
    pub(crate) fn drain(&self, out: &mut dyn FnMut([u64; W])) -> Drained {
        let (done, next) = self.visit(out);
        self.read.store(next, Ordering::Relaxed);
        done
    }

    /// Hand the events a drain now would deliver to `out`, oldest first, and leave them in the
    /// ring: a read-only drain (serialised with drains by the caller, as they are with each
    /// other).
    pub(crate) fn retained(&self, out: &mut dyn FnMut([u64; W])) {
        self.visit(out);
    }

    /// Events published but not drained that the ring no longer holds: overwritten since the
    /// last drain, which will count them dropped (serialised with drains by the caller).
    pub(crate) fn overwritten(&self) -> u64 {
        let unread = (self.seq.load(Ordering::Acquire) >> 1).saturating_sub(self.read.load(Ordering::Relaxed));
        unread.saturating_sub(self.mask + 1)
    }

    /// The drain's reading: every intact event published since the last drain to `out`; what
    /// was delivered and dropped, and the ticket the next drain starts from.
    fn visit(&self, out: &mut dyn FnMut([u64; W])) -> (Drained, u64) {
        let end = self.seq.load(Ordering::Acquire) >> 1;
        let cap = self.mask + 1;
        let mut done = Drained::default();
        let mut ticket = first_held(self.read.load(Ordering::Relaxed), end, cap, &mut done);
        let mut batch: Vec<[u64; W]> = Vec::with_capacity(((end - ticket) as usize).min(DRAIN_BATCH));
        while ticket < end {
            let n = ((end - ticket) as usize).min(DRAIN_BATCH);
            batch.clear();
            batch.extend((0..n as u64).map(|i| self.slots[((ticket + i) & self.mask) as usize].words.load()));
            fence(Ordering::Acquire);
            let seq = self.seq.load(Ordering::Relaxed);
            // Tickets below `newest + 1 - cap` share a slot with a ticket whose words may have
            // been stored since (`newest`, the one being written or the last published): what
            // was read there may be torn.
            let newest_plus_one = (seq + 1) >> 1;
            let intact_from = newest_plus_one.saturating_sub(cap).clamp(ticket, ticket + n as u64);
            done.dropped += intact_from - ticket;
            for words in &batch[(intact_from - ticket) as usize..] {
                out(*words);
                done.delivered += 1;
            }
            ticket += n as u64;
        }
        (done, ticket)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::trace::ring::Ring;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicU64 as Counter;
    fn event(n: u64) -> [u64; 2] {
        [n, !n]
    }

    #[test]
    fn drain_delivers_in_order_and_counts_overwrites() {
        let ring: SoloRing<2> = SoloRing::new(4).unwrap();
        assert!(ring.claim(1));
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
        assert_eq!(ring.written(), 13);
    }

    #[test]
    fn drains_longer_than_a_batch_keep_every_event() {
        let ring: SoloRing<2> = SoloRing::new(1024).unwrap();
        assert!(ring.claim(1));
        for n in 0..1000 {
            ring.push(&event(n));
        }
        let mut got = Vec::new();
        assert_eq!(ring.drain(&mut |w| got.push(w[0])), Drained { delivered: 1000, dropped: 0 });
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn one_owner_at_a_time_and_release_hands_over() {
        let ring: SoloRing<2> = SoloRing::new(4).unwrap();
        assert!(ring.claim(7));
        assert!(!ring.claim(8), "claimed twice");
        assert!(ring.owned_by(7) && !ring.owned_by(8));
        ring.release(8);
        assert!(ring.owned_by(7), "only the owner releases");
        ring.push(&event(1));
        ring.release(7);
        assert!(ring.claim(8));
        ring.push(&event(2));
        let mut got = Vec::new();
        ring.drain(&mut |w| got.push(w[0]));
        assert_eq!(got, vec![1, 2]);
    }

    /// Threads come and go; each claims a free ring or, when none is free, writes to the shared
    /// multi-writer ring, then releases; a drainer runs all along. Every event is delivered once
    /// or counted dropped, none torn.
    #[test]
    fn threads_claiming_releasing_and_falling_back_lose_nothing_uncounted() {
        use std::sync::atomic::{AtomicBool, Ordering::*};
        let solos: Vec<SoloRing<2>> = (0..2).map(|_| SoloRing::new(64).unwrap()).collect();
        let shared: Ring<2> = Ring::new(64).unwrap();
        let next_id = Counter::new(1);
        let (rounds, threads, per) = (6u64, 4u64, 3000u64);
        let mut seen = HashSet::new();
        let mut dropped = 0;
        let check = |words: [u64; 2], seen: &mut HashSet<u64>| {
            assert_eq!(words[1], !words[0], "torn event");
            assert!(seen.insert(words[0]), "event {} delivered twice", words[0]);
        };
        for round in 0..rounds {
            let done = AtomicBool::new(false);
            let (local, lost) = std::thread::scope(|s| {
                let writers: Vec<_> = (0..threads)
                    .map(|t| {
                        let (solos, shared, next_id) = (&solos, &shared, &next_id);
                        s.spawn(move || {
                            let me = next_id.fetch_add(1, Relaxed);
                            let mine = solos.iter().find(|r| r.claim(me));
                            let base = (round * threads + t) * per;
                            let mut state = base | 1;
                            for i in 0..per {
                                match mine {
                                    Some(r) => r.push(&event(base + i)),
                                    None => shared.push(&event(base + i)),
                                }
                                state ^= state << 13;
                                state ^= state >> 7;
                                state ^= state << 17;
                                if state % 97 == 0 {
                                    std::thread::yield_now();
                                }
                            }
                            if let Some(r) = mine {
                                r.release(me);
                            }
                        })
                    })
                    .collect();
                let drainer = s.spawn(|| {
                    let mut local = Vec::new();
                    let mut lost = 0;
                    while !done.load(Acquire) {
                        for r in &solos {
                            lost += r.drain(&mut |w| local.push(w)).dropped;
                        }
                        lost += shared.drain(&mut |w| local.push(w)).dropped;
                        std::thread::yield_now();
                    }
                    (local, lost)
                });
                for w in writers {
                    w.join().unwrap();
                }
                done.store(true, Release);
                drainer.join().unwrap()
            });
            for w in local {
                check(w, &mut seen);
            }
            dropped += lost;
        }
        for r in &solos {
            dropped += r.drain(&mut |w| check(w, &mut seen)).dropped;
        }
        dropped += shared.drain(&mut |w| check(w, &mut seen)).dropped;
        assert_eq!(seen.len() as u64 + dropped, rounds * threads * per, "every event accounted once");
        assert!(solos.iter().all(|r| r.claim(u64::MAX)), "every ring released");
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! The single-writer protocol on rings of one or two slots, so the writer laps the ring
    //! while the drain reads it: no torn event, no event twice, every ticket delivered or
    //! counted dropped; and a hand-over by release and claim keeps the sequence consistent.
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn check(words: [u64; 2], seen: &mut Vec<u64>) {
        assert_eq!(words[1], words[0] * 10, "torn event {words:?}");
        assert!(!seen.contains(&words[0]), "event {} delivered twice", words[0]);
        seen.push(words[0]);
    }

    /// The drain runs on its own thread while this one (the owner) writes, then drains again.
    fn lap_while_draining(cap: usize, events: u64, drains: usize) {
        loom::model(move || {
            let ring: Arc<SoloRing<2>> = Arc::new(SoloRing::new(cap).unwrap());
            assert!(ring.claim(1));
            let r2 = ring.clone();
            let drainer = thread::spawn(move || {
                let mut seen = Vec::new();
                let mut dropped = 0;
                for _ in 0..drains {
                    dropped += r2.drain(&mut |w| check(w, &mut seen)).dropped;
                }
                (seen, dropped)
            });
            for n in 1..=events {
                ring.push(&[n, n * 10]);
            }
            let (mut seen, mut dropped) = drainer.join().unwrap();
            dropped += ring.drain(&mut |w| check(w, &mut seen)).dropped;
            assert_eq!(seen.len() as u64 + dropped, events, "a ticket was lost uncounted");
            assert!(seen.contains(&events), "the last event of a quiet ring is delivered");
            let mut sorted = seen.clone();
            sorted.sort();
            assert_eq!(seen, sorted, "delivered out of order");
        });
    }

    #[test]
    fn writer_laps_a_one_slot_ring_while_draining() {
        lap_while_draining(1, 2, 1);
    }

    #[test]
    fn writer_laps_a_two_slot_ring_while_draining_twice() {
        lap_while_draining(2, 3, 2);
    }

    /// A read-only pass reads the ring while its owner laps it: it returns no torn event and no
    /// event twice, and leaves the ring as it was for the drain.
    fn pass_while_writing(cap: usize, events: u64) {
        loom::model(move || {
            let ring: Arc<SoloRing<2>> = Arc::new(SoloRing::new(cap).unwrap());
            assert!(ring.claim(1));
            ring.push(&[1, 10]);
            let r2 = ring.clone();
            let pass = thread::spawn(move || {
                let mut seen = Vec::new();
                r2.retained(&mut |w| check(w, &mut seen));
                seen
            });
            for n in 2..=events {
                ring.push(&[n, n * 10]);
            }
            let seen = pass.join().unwrap();
            let mut sorted = seen.clone();
            sorted.sort();
            assert_eq!(seen, sorted, "read out of order");
            let mut after = Vec::new();
            ring.retained(&mut |w| check(w, &mut after));
            let newest: Vec<u64> = (events.saturating_sub(cap as u64) + 1..=events).collect();
            assert_eq!(after, newest, "a quiet ring's events are all seen");
            let mut drained = Vec::new();
            let d = ring.drain(&mut |w| check(w, &mut drained));
            assert_eq!((drained, d.dropped), (newest, events - cap.min(events as usize) as u64));
        });
    }

    #[test]
    fn a_read_only_pass_races_a_writer_lapping_a_one_slot_ring() {
        pass_while_writing(1, 2);
    }

    #[test]
    fn a_read_only_pass_races_a_writer_lapping_a_two_slot_ring() {
        pass_while_writing(2, 3);
    }

    #[test]
    fn release_and_claim_hand_the_ring_over() {
        loom::model(|| {
            let ring: Arc<SoloRing<2>> = Arc::new(SoloRing::new(2).unwrap());
            let spawn = |id: u64| {
                let r = ring.clone();
                thread::spawn(move || {
                    if r.claim(id) {
                        r.push(&[id, id * 10]);
                        r.release(id);
                        true
                    } else {
                        false
                    }
                })
            };
            let (a, b) = (spawn(1), spawn(2));
            let wrote = [a.join().unwrap(), b.join().unwrap()];
            let mut seen = Vec::new();
            let d = ring.drain(&mut |w| check(w, &mut seen));
            assert_eq!(d.dropped, 0);
            let expect = wrote.iter().filter(|&&w| w).count();
            assert!(expect >= 1, "a free ring was claimed by nobody");
            assert_eq!(seen.len(), expect, "an owner's event was lost: the sequence went back");
            assert!(ring.claim(3), "the ring was left claimed");
        });
    }
}

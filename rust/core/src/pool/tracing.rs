//! The pool's event trace API: start, stop, drain, status, and the move events of a compactor.
//! The trace itself (flag, rings, drains) is `trace/recorder.rs`.

use super::pool::Pool;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::trace::event::TraceEvent;
use crate::trace::recorder::{TraceStatus, MAX_TRACE_CAPACITY};

impl Pool {
    /// Start a fresh event trace of `capacity` events spread over `cores + 1` rings: one ring
    /// per core pool, each owned by the first thread that records into it until that thread
    /// exits, and one ring the threads beyond those share, each of `capacity / cores` events
    /// rounded up to a power of two, at least 16, its oldest events overwritten when full. The
    /// total (`trace_status().capacity`) is `cores + 1` rings' worth, and one thread keeps at
    /// most one ring's worth between drains. Events of an earlier trace that were not drained
    /// are discarded. Pauses the pool briefly. The rings take 64 bytes per event.
    pub fn trace_start(&self, capacity: usize) -> Result<()> {
        if capacity == 0 || capacity > MAX_TRACE_CAPACITY {
            return Err(Error::InvalidSize {
                size: capacity as u128,
                reason: "a trace holds between 1 and 16,777,216 events",
            });
        }
        self.trace.start(self.cores(), capacity, || self.pause_for_maintenance())
    }

    /// Stop recording (pauses the pool briefly, so no event is recorded after this
    /// returns). The events recorded so far stay until drained or the next start.
    pub fn trace_stop(&self) -> Result<()> {
        self.trace.stop(|| self.pause_for_maintenance())
    }

    /// Every event recorded since the last drain, oldest first (by time; events of one
    /// thread keep their order, and a block's free and moves come after its alloc). Does not
    /// pause the pool: events still being written are left for the next drain, where they come
    /// with their own, older times (put drains together by time).
    /// [`Error::HostMemory`](crate::error::Error::HostMemory) when the host has no memory for the
    /// events: those waiting stay for the next drain (see `Trace::drain`). Events name tags by
    /// id: read their names under a [`TagTable::pin`](crate::stats::tags::TagTable::pin) taken
    /// before the drain (the id of a tag no block holds may be reused once no event in the
    /// rings names it), then call [`Pool::trace_drained_tags`].
    pub fn trace_drain(&self) -> Result<Vec<TraceEvent>> {
        self.trace.drain()
    }

    /// Where the trace stands: on or off, capacity, events recorded, drained and dropped (the
    /// events the rings overwrote since the last drain included).
    pub fn trace_status(&self) -> TraceStatus {
        self.trace.status()
    }

    /// Record that a live block moved from `from` to `to` (for the compactor, which calls it
    /// while the pool is paused). Nothing happens while the trace is off.
    pub fn record_move(&self, handle: Handle, from: usize, to: usize) -> Result<()> {
        if !self.trace.is_on() {
            return Ok(());
        }
        let block = self.block(handle)?;
        self.trace.on_move(block.core, handle, from, to, block.size, block.tag);
        Ok(())
    }

    /// Nanoseconds since the pool was made (the clock of trace events and snapshots).
    pub fn clock_ns(&self) -> u64 {
        self.trace.now_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::trace::event::EventKind;

    use std::sync::Arc;

    fn pool(capacity: usize, cores: usize) -> Pool {
        Pool::new(PoolConfig::new(capacity).cores(cores)).unwrap()
    }

    #[test]
    fn off_by_default_and_nothing_recorded_after_stop() {
        let p = pool(16 << 20, 2);
        let h = p.alloc(1000, None, 0).unwrap();
        p.free(h).unwrap();
        assert!(p.trace_drain().unwrap().is_empty());
        assert_eq!(p.trace_status(), TraceStatus::default());
        p.trace_start(100).unwrap();
        let h = p.alloc(1000, None, 0).unwrap();
        p.trace_stop().unwrap();
        p.free(h).unwrap();
        let events = p.trace_drain().unwrap();
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
        let [t1, t2, t3] = ["a", "b", "c"].map(|name| p.tags().acquire(name, 0).unwrap());
        let a = p.alloc(3000, Some(4096), t1).unwrap();
        let b = p.alloc(5 << 20, None, t2).unwrap();
        assert!(p.alloc(6 << 20, None, t3).is_err());
        let info = p.block(a).unwrap();
        p.free(a).unwrap();
        p.record_move(b, 0, 4096).unwrap();
        p.free(b).unwrap();
        let events = p.trace_drain().unwrap();
        let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
        use EventKind::*;
        assert_eq!(kinds, vec![Alloc, Alloc, Failed, Free, Move, Free]);
        let e = events[0];
        assert_eq!((e.offset, e.size, e.tag, e.aux, e.handle, e.core), (info.offset, 3000, t1, 4096, a.to_bits(), 0));
        assert_eq!((events[2].size, events[2].tag, events[2].handle), (6 << 20, t3, 0));
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
        let events = p.trace_drain().unwrap();
        assert_eq!(events.len(), 16);
        let st = p.trace_status();
        assert_eq!((st.recorded, st.drained, st.dropped), (100, 16, 84));
        // A restart begins a fresh trace.
        p.trace_start(16).unwrap();
        assert_eq!(p.trace_status().recorded, 0);
        assert!(p.trace_drain().unwrap().is_empty());
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
                drained.extend(p.trace_drain().unwrap());
                std::thread::yield_now();
            }
        });
        p.trace_stop().unwrap();
        drained.extend(p.trace_drain().unwrap());
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

    /// Four threads on a pool of two cores (two threads own a ring, two share one), each
    /// handing every block it allocates to the next thread, which frees it.
    fn hand_over_in_a_ring_of_threads(p: &Pool, per_thread: usize, drain_meanwhile: bool) -> Vec<TraceEvent> {
        let threads = 4;
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads).map(|_| std::sync::mpsc::channel::<Handle>()).unzip();
        let mut drained = Vec::new();
        let finished = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let mut senders: Vec<Option<_>> = senders.into_iter().map(Some).collect();
            for (t, rx) in receivers.into_iter().enumerate() {
                let tx = senders[(t + 1) % threads].take().expect("one sender per thread");
                let finished = &finished;
                s.spawn(move || {
                    for i in 0..per_thread {
                        tx.send(p.alloc(64 + (i * 131 + t * 7) % 70_000, None, t as u32).unwrap()).unwrap();
                        while let Ok(h) = rx.try_recv() {
                            p.free(h).unwrap();
                        }
                    }
                    drop(tx);
                    for h in rx {
                        p.free(h).unwrap();
                    }
                    finished.fetch_add(1, std::sync::atomic::Ordering::Release);
                });
            }
            while drain_meanwhile && finished.load(std::sync::atomic::Ordering::Acquire) < threads {
                drained.extend(p.trace_drain().unwrap());
                std::thread::yield_now();
            }
        });
        drained.extend(p.trace_drain().unwrap());
        drained
    }

    #[test]
    fn blocks_handed_between_more_threads_than_rings_are_traced_once_each_in_replay_order() {
        // Without host memory, and room for every block at once (a thread may run ahead).
        let p = Pool::new(PoolConfig::new(1 << 30).cores(2).backing(crate::config::Backing::None)).unwrap();
        let per_thread = 3000;
        // Drained all along: nothing lost, nothing twice.
        p.trace_start(1 << 18).unwrap();
        let events = hand_over_in_a_ring_of_threads(&p, per_thread, true);
        let st = p.trace_status();
        assert_eq!((st.recorded, st.drained, st.dropped), (8 * per_thread as u64, events.len() as u64, 0));
        let mut seen = std::collections::HashSet::new();
        for e in &events {
            assert!(seen.insert((e.kind as u8, e.handle)), "{e:?} delivered twice");
        }
        // Drained once: every free comes after its alloc, and the times never go back.
        p.trace_start(1 << 18).unwrap();
        let events = hand_over_in_a_ring_of_threads(&p, per_thread, false);
        assert_eq!(events.len(), 8 * per_thread);
        assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        let mut live = std::collections::HashSet::new();
        for e in &events {
            match e.kind {
                EventKind::Alloc => assert!(live.insert(e.handle)),
                EventKind::Free => assert!(live.remove(&e.handle), "a free before its alloc: {e:?}"),
                _ => panic!("unexpected {e:?}"),
            }
        }
        assert!(live.is_empty());
    }

    /// A start that waits for another thread's pause holds nothing that the trace's other
    /// calls need: the status and a drain answer while it waits (the Python binding's signal
    /// checks take the GIL during that wait, and a caller holding the GIL may ask for the
    /// status). The pause is held until they answered, at most 20 s.
    #[test]
    fn status_and_drain_answer_while_a_start_waits_for_a_pause() {
        use std::sync::mpsc;
        use std::time::Duration;
        let p = Arc::new(pool(8 << 20, 1));
        let token = p.pause(Duration::from_secs(30)).unwrap();
        let starter = {
            let p = Arc::clone(&p);
            std::thread::spawn(move || p.trace_start(1024))
        };
        std::thread::sleep(Duration::from_millis(100)); // the start now waits for the pause
        let (answered, wait) = mpsc::channel();
        let asker = {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let status = p.trace_status();
                let drained = p.trace_drain().unwrap().len();
                answered.send((status.enabled, drained)).unwrap();
            })
        };
        let got = wait.recv_timeout(Duration::from_secs(20));
        p.resume(&token).unwrap();
        asker.join().unwrap();
        let started = starter.join().unwrap();
        assert_eq!(got, Ok((false, 0)), "the status and the drain waited for the start");
        started.unwrap();
        assert!(p.trace_status().enabled);
    }
}

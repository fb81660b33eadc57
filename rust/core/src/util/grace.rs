//! Waiting for the work that began before a point, and not for the work that begins while one
//! waits: work counts itself in ([`Grace::enter`], one read-modify-write and two loads) and out
//! (dropping the [`Inside`], one read-modify-write); a waiter ([`Grace::wait_for_earlier`])
//! waits until every piece of work whose `enter` returned before its call has left.
//!
//! The counts are kept by *phase*, as in an epoch scheme. Work reads the phase, counts itself
//! in under it, and reads the phase again: when a waiter moved it on in between, that waiter may
//! have read the count before this work was in it, so the work counts out and in again under
//! the new phase, which only later waiters wait on. A waiter moves the phase on, then waits
//! until the count of the phase before is 0. Work whose `enter` returned before the waiter's
//! call read the phase last before the waiter moved it, so it counted in under the phase the
//! waiter waits on (or has left already). Each side writes one word and then reads the other's
//! (the store-buffer pattern): both use sequentially consistent operations. Waiters take turns:
//! a second waiter moving the phase back while the first still waits on it would wait on work
//! that began after it, and not on work of the other phase that began before it.
//!
//! The binding uses it to let a trace's drain wait for the allocations whose events it took
//! until they recorded their Python stacks (`rust/python/src/stacks.rs`).

use std::time::Duration;

use crate::util::sync::{seq_cst_for_loom, AtomicUsize, Ordering};

#[cfg(loom)]
use loom::sync::Mutex;
#[cfg(not(loom))]
use std::sync::Mutex;

/// Counts of the work in progress, by phase (see the module documentation).
#[derive(Debug, Default)]
pub struct Grace {
    entered: [AtomicUsize; 2],
    /// The phase new work counts in under (its low bit).
    phase: AtomicUsize,
    /// Held by a waiter from moving the phase on until it is done waiting.
    turns: Mutex<()>,
}

/// One piece of work in progress: counted out when dropped.
#[derive(Debug)]
#[must_use = "the work counts as in progress until this is dropped"]
pub struct Inside<'a> {
    grace: &'a Grace,
    phase: usize,
}

impl Grace {
    /// Nothing in progress.
    pub fn new() -> Grace {
        Grace::default()
    }

    /// Count the calling work in until the returned [`Inside`] drops.
    #[inline]
    pub fn enter(&self) -> Inside<'_> {
        loop {
            let phase = self.phase.load(Ordering::SeqCst) & 1;
            self.entered[phase].fetch_add(1, Ordering::SeqCst);
            seq_cst_for_loom();
            if self.phase.load(Ordering::SeqCst) & 1 == phase {
                return Inside { grace: self, phase };
            }
            self.entered[phase].fetch_sub(1, Ordering::Release);
        }
    }

    /// Whether no work is in progress now.
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.entered.iter().all(|n| n.load(Ordering::SeqCst) == 0)
    }

    /// Wait until every piece of work whose [`Grace::enter`] returned before this call has
    /// left, at most `limit` (sleeping between looks); whether it did. Work that enters while
    /// this waits is not waited for.
    pub fn wait_for_earlier(&self, limit: Duration) -> bool {
        if self.is_idle() {
            return true;
        }
        let _turn = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.phase.fetch_add(1, Ordering::SeqCst) & 1;
        seq_cst_for_loom();
        self.wait_until_left(before, limit)
    }

    #[cfg(not(loom))]
    fn wait_until_left(&self, phase: usize, limit: Duration) -> bool {
        let started = std::time::Instant::now();
        let mut nap = Duration::from_micros(20);
        while self.entered[phase].load(Ordering::Acquire) != 0 {
            if started.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
        true
    }

    /// Under loom, without a clock: until the work left.
    #[cfg(loom)]
    fn wait_until_left(&self, phase: usize, _limit: Duration) -> bool {
        while self.entered[phase].load(Ordering::Acquire) != 0 {
            crate::util::sync::spin_hint();
        }
        true
    }
}

impl Drop for Inside<'_> {
    #[inline]
    fn drop(&mut self) {
        self.grace.entered[self.phase].fetch_sub(1, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn spawn_waiter(grace: &Arc<Grace>) -> std::thread::JoinHandle<bool> {
        let grace = Arc::clone(grace);
        std::thread::spawn(move || grace.wait_for_earlier(Duration::from_secs(60)))
    }

    /// Until a waiter moved the phase on.
    fn until_moved(grace: &Grace, from: usize) {
        while grace.phase.load(Ordering::SeqCst) == from {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_waiter_waits_for_the_work_that_began_before_it() {
        let grace = Arc::new(Grace::new());
        assert!(grace.is_idle());
        assert!(grace.wait_for_earlier(Duration::ZERO), "nothing to wait for");
        let early = grace.enter();
        assert!(!grace.is_idle());
        let left = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (grace, left) = (Arc::clone(&grace), Arc::clone(&left));
            std::thread::spawn(move || (grace.wait_for_earlier(Duration::from_secs(60)), left.load(Ordering::SeqCst)))
        };
        until_moved(&grace, 0);
        std::thread::sleep(Duration::from_millis(20));
        left.store(true, Ordering::SeqCst);
        drop(early);
        assert_eq!(waiter.join().unwrap(), (true, true), "done, and only after the early work left");
        assert!(grace.is_idle());
    }

    #[test]
    fn work_that_enters_while_a_waiter_waits_is_not_waited_for() {
        let grace = Arc::new(Grace::new());
        let early = grace.enter();
        let waiter = spawn_waiter(&grace);
        until_moved(&grace, 0);
        let during = grace.enter();
        drop(early);
        assert!(waiter.join().unwrap(), "done although work that began during the wait is in");
        assert!(!grace.is_idle());
        // The next waiter waits for it.
        let next = spawn_waiter(&grace);
        until_moved(&grace, 1);
        std::thread::sleep(Duration::from_millis(10));
        assert!(!next.is_finished());
        drop(during);
        assert!(next.join().unwrap());
        assert!(grace.is_idle());
    }

    #[test]
    fn a_wait_gives_up_at_its_limit() {
        let grace = Grace::new();
        let inside = grace.enter();
        assert!(!grace.wait_for_earlier(Duration::from_millis(5)));
        drop(inside);
        assert!(grace.wait_for_earlier(Duration::ZERO));
    }
}

#[cfg(loom)]
mod loom_models {
    //! An allocation counts itself in, writes its event, records its stack and counts out; a
    //! drain that took the event waits for earlier work and must then find the stack recorded.
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;
    use loom::thread;

    struct Shared {
        grace: Grace,
        written: AtomicBool,
        recorded: AtomicBool,
    }

    fn shared() -> Arc<Shared> {
        Arc::new(Shared { grace: Grace::new(), written: AtomicBool::new(false), recorded: AtomicBool::new(false) })
    }

    fn allocate(s: &Shared) {
        let inside = s.grace.enter();
        s.written.store(true, Ordering::Release);
        s.recorded.store(true, Ordering::Release);
        drop(inside);
    }

    fn drain(s: &Shared) {
        if s.written.load(Ordering::Acquire) {
            assert!(s.grace.wait_for_earlier(Duration::from_secs(1)));
            assert!(s.recorded.load(Ordering::Acquire), "a drain that took the event finds its stack");
        }
    }

    #[test]
    fn a_drain_that_took_an_event_finds_its_stack() {
        loom::model(|| {
            let s = shared();
            let worker = {
                let s = Arc::clone(&s);
                thread::spawn(move || allocate(&s))
            };
            drain(&s);
            worker.join().unwrap();
        });
    }

    #[test]
    fn two_drains_each_find_the_stack_of_an_event_they_took() {
        loom::model(|| {
            let s = shared();
            let worker = {
                let s = Arc::clone(&s);
                thread::spawn(move || allocate(&s))
            };
            let other = {
                let s = Arc::clone(&s);
                thread::spawn(move || drain(&s))
            };
            drain(&s);
            worker.join().unwrap();
            other.join().unwrap();
        });
    }

    #[test]
    fn work_that_enters_while_a_drain_moves_the_phase_is_still_waited_for_when_its_event_was_taken() {
        // Two allocations; the drain moves the phase for the first one's event, maybe while
        // the second one counts itself in (then it counts in again under the new phase).
        loom::model(|| {
            let (a, b) = (shared(), Arc::new(AtomicBool::new(false)));
            let first = {
                let a = Arc::clone(&a);
                thread::spawn(move || allocate(&a))
            };
            let second = {
                let (a, b) = (Arc::clone(&a), Arc::clone(&b));
                thread::spawn(move || {
                    let inside = a.grace.enter();
                    b.store(true, Ordering::Release);
                    drop(inside);
                })
            };
            drain(&a);
            first.join().unwrap();
            second.join().unwrap();
            assert!(a.grace.is_idle());
        });
    }
}

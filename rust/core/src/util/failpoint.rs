//! Failpoints: named places where a test can make a fallible operation fail on purpose.
//!
//! Production code asks [`fire`] at each place that can fail for reasons outside the caller's
//! control (a host allocation, a mapping, a mover call) and takes its failure path when the
//! answer is `true`. Outside the crate's own tests the function is a constant `false` that the
//! optimizer removes: no cost, no state.
//!
//! In tests, failpoints are armed per thread (tests run in parallel, each on its own thread):
//!
//! * [`record`] runs a closure and returns the failpoints it passed, in order, one entry per
//!   hit (`"host.table"` three times if three tables were made);
//! * [`fail_at`] runs a closure with the `nth` hit (from 0) of failpoint `name` failing;
//! * [`fail_from`] the same with every later hit failing too.
//!
//! A fault-injection test records the sites an operation passes, then fails each hit in turn
//! and checks that the operation reports a typed error and leaves nothing half-made.
//!
//! Names are dotted, subsystem first: `host.table`, `host.segment`, `host.backing`,
//! `host.vec`, `host.headroom`, `host.trace_ring`, `mover.wave`, `mover.copy_back`,
//! `copies.interrupt`, `growth.withdraw` (a region left free that another thread's allocation
//! took a chunk of before the growth could withdraw it).

#[cfg(all(test, not(loom)))]
mod armed {
    use std::cell::RefCell;

    /// This thread's failpoint state.
    #[derive(Default)]
    pub(super) struct State {
        /// Every hit while recording.
        pub(super) recorded: Option<Vec<&'static str>>,
        /// `(name, hits left before the failing one)`.
        pub(super) armed: Option<(&'static str, usize)>,
        /// Whether every hit of the armed failpoint after the failing one fails too.
        pub(super) sticky: bool,
    }

    thread_local! {
        pub(super) static STATE: RefCell<State> = RefCell::new(State::default());
    }
}

/// Whether the operation at failpoint `name` should fail now (only ever `true` in tests that
/// armed it on this thread).
#[cfg(not(all(test, not(loom))))]
#[inline(always)]
pub(crate) fn fire(_name: &'static str) -> bool {
    false
}

/// Whether the operation at failpoint `name` should fail now (only ever `true` in tests that
/// armed it on this thread).
#[cfg(all(test, not(loom)))]
pub(crate) fn fire(name: &'static str) -> bool {
    armed::STATE.with(|state| {
        let mut state = state.borrow_mut();
        if let Some(hits) = state.recorded.as_mut() {
            hits.push(name);
        }
        match state.armed.as_mut() {
            Some((armed, left)) if *armed == name => {
                if *left == 0 {
                    if !state.sticky {
                        state.armed = None;
                    }
                    true
                } else {
                    *left -= 1;
                    false
                }
            }
            _ => false,
        }
    })
}

/// Run `f` and return it with the failpoints it passed on this thread, in order.
#[cfg(all(test, not(loom)))]
pub(crate) fn record<T>(f: impl FnOnce() -> T) -> (T, Vec<&'static str>) {
    armed::STATE.with(|state| state.borrow_mut().recorded = Some(Vec::new()));
    let out = f();
    let hits = armed::STATE.with(|state| state.borrow_mut().recorded.take()).unwrap_or_default();
    (out, hits)
}

/// Run `f` with hit `nth` (from 0) of failpoint `name` on this thread failing; returns what `f`
/// returned and whether the failpoint fired.
#[cfg(all(test, not(loom)))]
pub(crate) fn fail_at<T>(name: &'static str, nth: usize, f: impl FnOnce() -> T) -> (T, bool) {
    armed::STATE.with(|state| state.borrow_mut().armed = Some((name, nth)));
    let out = f();
    let fired = armed::STATE.with(|state| state.borrow_mut().armed.take()).is_none();
    (out, fired)
}

/// Run `f` with hit `nth` (from 0) of failpoint `name` on this thread and every later hit
/// failing; returns what `f` returned and whether the failpoint fired.
#[cfg(all(test, not(loom)))]
pub(crate) fn fail_from<T>(name: &'static str, nth: usize, f: impl FnOnce() -> T) -> (T, bool) {
    armed::STATE.with(|state| {
        let mut state = state.borrow_mut();
        state.armed = Some((name, nth));
        state.sticky = true;
    });
    let out = f();
    let fired = armed::STATE.with(|state| {
        let mut state = state.borrow_mut();
        state.sticky = false;
        state.armed.take().is_some_and(|(_, left)| left == 0)
    });
    (out, fired)
}

/// Every hit of `hits` as `(name, nth)`: the list a fault-injection test fails in turn.
#[cfg(all(test, not(loom)))]
pub(crate) fn sites(hits: &[&'static str]) -> Vec<(&'static str, usize)> {
    let mut seen: Vec<(&'static str, usize)> = Vec::new();
    hits.iter()
        .map(|&name| {
            let nth = seen.iter().filter(|(n, _)| *n == name).count();
            seen.push((name, nth));
            (name, nth)
        })
        .collect()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn records_and_fails_the_nth_hit_only() {
        let work = || vec![fire("a"), fire("a"), fire("a"), fire("b")];
        let (out, hits) = record(work);
        assert_eq!(out, vec![false; 4]);
        assert_eq!(hits, vec!["a", "a", "a", "b"]);
        assert_eq!(sites(&hits), vec![("a", 0), ("a", 1), ("a", 2), ("b", 0)]);
        let (out, fired) = fail_at("a", 1, work);
        assert_eq!((out, fired), (vec![false, true, false, false], true));
        let (_, fired) = fail_at("c", 0, work);
        assert!(!fired, "a failpoint never passed does not fire");
        assert!(!fire("a"), "disarmed after the run");
    }
}

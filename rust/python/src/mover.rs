//! A Python mover: the callable `mover(transfers)` that copies the bytes of a batch of moves
//! (`Transfer`s: `(src, dst, nbytes)` with both addresses) when the pool's bytes live on a
//! device.
//!
//! Moving runs without the GIL; the mover is called with it, re-acquired from the moving
//! thread (which holds the pool's pause and no other lock), with Python's cyclic garbage
//! collector off until the moves are done ([`CollectorOff`]). When the mover raises, the batch
//! is undone and its own exception propagates.

use npumem_core::{Error, Mover, Transfer};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::errors::{caused_by, to_py};
use crate::gil::interruptible;
use crate::transfer;
use crate::user_code;

/// Run `work` without the GIL, handing it `mover` (if any) as a core mover; map its error, or
/// give back the mover's own exception when the mover failed.
pub(crate) fn run_with<T, F>(py: Python<'_>, mover: Option<&Py<PyAny>>, base_address: u64, work: F) -> PyResult<T>
where
    F: FnOnce(Option<Mover<'_>>) -> npumem_core::Result<T> + Send,
    T: Send,
{
    let mut raised: Option<PyErr> = None;
    let _collector = mover.map(|_| CollectorOff::new(py));
    // Interruptible: Ctrl-C ends copies on host memory (undone) and waits, as its exception.
    let result = interruptible(py, || match mover {
        Some(m) => work(Some(&mut |batch: &[Transfer]| call(m, batch, base_address, &mut raised))),
        None => work(None),
    })?;
    result.map_err(|err| match (err, raised) {
        (Error::MoverFailed(_), Some(e)) => e,
        // The device may have lost bytes: a `CorruptionError`, caused by the mover's failure.
        (err @ Error::CopyBackFailed { .. }, Some(e)) => caused_by(py, to_py(err), e),
        (err, _) => to_py(err),
    })
}

/// Python's cyclic garbage collector, kept off while a mover's batches run (and back on after,
/// unless it was off already). The moves run under the pool's pause, and a collection reads
/// every object the process tracks: with 400,000 live blocks, one that the mover's calls
/// happened to trigger took 457 ms of a 516-830 ms pause. Off, the collection comes at the
/// first allocation that triggers it after the moves. The collector is the process's: the
/// first of the calls with a mover running at once (on any thread, or one inside another's
/// mover) turns it off if it was on, and the last to end turns it back on then.
struct CollectorOff<'py>(Python<'py>);

/// Calls with a mover running now, and whether the first of them turned the collector off.
/// Changed with the GIL held only.
static MOVING: AtomicUsize = AtomicUsize::new(0);
static TURNED_OFF: AtomicBool = AtomicBool::new(false);

impl<'py> CollectorOff<'py> {
    fn new(py: Python<'py>) -> Self {
        if MOVING.fetch_add(1, Ordering::Relaxed) == 0 {
            let gc = py.import("gc");
            let on = gc
                .as_ref()
                .is_ok_and(|gc| gc.call_method0("isenabled").is_ok_and(|on| on.is_truthy().unwrap_or(false)));
            let off = on && gc.is_ok_and(|gc| gc.call_method0("disable").is_ok());
            TURNED_OFF.store(off, Ordering::Relaxed);
        }
        CollectorOff(py)
    }
}

impl Drop for CollectorOff<'_> {
    fn drop(&mut self) {
        if MOVING.fetch_sub(1, Ordering::Relaxed) == 1 && TURNED_OFF.swap(false, Ordering::Relaxed) {
            if let Ok(gc) = self.0.import("gc") {
                let _ = gc.call_method0("enable");
            }
        }
    }
}

/// Call the Python mover with `[Transfer(src, dst, nbytes, addresses), ...]`, keeping the
/// exception it raised: the first one (the failure the batch was undone for), unless a later
/// call (a copy back) raised an exception that is no `Exception`, a `KeyboardInterrupt` or a
/// `SystemExit`, which goes on with the first as its `__context__`.
fn call(mover: &Py<PyAny>, batch: &[Transfer], base_address: u64, raised: &mut Option<PyErr>) -> Result<(), String> {
    user_code::attach(|py| {
        let list = PyList::new(py, batch.iter().map(|t| transfer::Transfer::new(t.src, t.dst, t.len, base_address)));
        list.and_then(|list| user_code::call(mover.bind(py), (list,)).map(|_| ())).map_err(|e| {
            let why = e.to_string();
            *raised = Some(match raised.take() {
                Some(first) if e.is_instance_of::<PyException>(py) || e.value(py).is(first.value(py)) => first,
                Some(first) => {
                    let _ = e.value(py).setattr("__context__", first.value(py));
                    e
                }
                None => e,
            });
            why
        })
    })
}

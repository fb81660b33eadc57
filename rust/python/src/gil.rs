//! The one place that runs npumem-core work without the GIL (and maps its errors), and the one
//! place that takes the GIL back from inside such work.
//!
//! Work that may wait for another thread's pause of a pool runs [`interruptible`]: the core
//! waits in slices ([`npumem_core::WAIT_SLICE`]) and, between them, takes the GIL back to run
//! the signal handlers that are due (Ctrl-C's `KeyboardInterrupt`, an alarm's handler). When one
//! raises, the wait gives up, the work does nothing, and the handler's exception is what the
//! call raises.
//!
//! [`attach`] takes the GIL for every caller in this crate.

use std::cell::RefCell;

use pyo3::prelude::*;

use crate::errors::to_py;

thread_local! {
    /// The exception a signal handler raised while this thread's [`interruptible`] work waited,
    /// until that work returns.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// `Python::attach`, except in a thread without the GIL that finds the interpreter gone (its
/// exit under way, as a daemon thread waiting without the GIL may): that thread parks for good,
/// as Python 3.14 does with such threads and PyO3 does where the exit ends one while it takes
/// the GIL back (see `user_code.rs`), rather than panic. (A thread that holds the GIL, as the
/// exit's own thread does, is attached as always.)
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    let mut f = Some(f);
    let mut run = |py: Python<'_>| (f.take().expect("run once"))(py);
    if let Some(done) = Python::try_attach(&mut run) {
        return done;
    }
    // SAFETY: callable at any time.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        loop {
            std::thread::park();
        }
    }
    Python::attach(run)
}

/// The interrupt check of [`interruptible`] work (called by the core between slices of a wait,
/// without the GIL): runs the signal handlers that are due; `true` (give up) once one raised,
/// its exception kept for [`interruptible`].
fn signal_raised() -> bool {
    if RAISED.with(|raised| raised.borrow().is_some()) {
        return true;
    }
    match attach(|py| py.check_signals()) {
        Ok(()) => false,
        Err(err) => {
            RAISED.with(|raised| *raised.borrow_mut() = Some(err));
            true
        }
    }
}

/// Run `work` with the GIL released: other Python threads run meanwhile. A wait for another
/// thread's pause inside `work` is not interrupted (see [`interruptible`]): for work that must
/// finish, such as a free whose block would be lost otherwise.
pub(crate) fn detached<T, F>(py: Python<'_>, work: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    py.detach(work)
}

/// Run core `work` with the GIL released, its waits for another thread's pause interruptible
/// by signals: `Err` with the exception a signal handler raised meanwhile (the work gave up
/// and did nothing: the core's contract for an interrupted wait), else what `work` returned,
/// for a caller that looks at the core's error before mapping it.
pub(crate) fn interruptible<T, F>(py: Python<'_>, work: F) -> PyResult<npumem_core::Result<T>>
where
    F: FnOnce() -> npumem_core::Result<T> + Send,
    T: Send,
{
    let done = detached(py, || npumem_core::interruptible(signal_raised, work));
    match RAISED.with(|raised| raised.borrow_mut().take()) {
        Some(raised) => Err(raised),
        None => Ok(done),
    }
}

/// Run fallible core `work` with the GIL released, interruptible by signals as
/// [`interruptible`], and map its error.
pub(crate) fn without_gil<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: FnOnce() -> npumem_core::Result<T> + Send,
    T: Send,
{
    interruptible(py, work)?.map_err(to_py)
}

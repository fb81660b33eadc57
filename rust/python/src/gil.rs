//! The one place that runs npumem-core work without the GIL (and maps its errors).
//!
//! Work that may wait for another thread's pause of a pool runs [`interruptible`]: the core
//! waits in slices ([`npumem_core::WAIT_SLICE`]) and, between them, takes the GIL back to run
//! the signal handlers that are due (Ctrl-C's `KeyboardInterrupt`, an alarm's handler). When one
//! raises, the wait gives up, the work does nothing, and the handler's exception is what the
//! call raises. A Ctrl-C that a region hook caught inside such work comes again once the
//! outermost call returns ([`defer_ctrl_c`]).

use std::cell::{Cell, RefCell};

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::user_code;

thread_local! {
    /// The exception a signal handler raised while this thread's [`interruptible`] work waited,
    /// until that work returns.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
    /// How many [`detached`] calls this thread is inside (one in a hook that another runs).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// A Ctrl-C that a region hook caught, to come again once the outermost [`detached`] call
    /// returns ([`defer_ctrl_c`]).
    static CTRL_C: Cell<bool> = const { Cell::new(false) };
}

/// The interrupt check of [`interruptible`] work (called by the core between slices of a wait,
/// without the GIL): runs the signal handlers that are due; `true` (give up) once one raised,
/// its exception kept for [`interruptible`].
fn signal_raised() -> bool {
    if RAISED.with(|raised| raised.borrow().is_some()) {
        return true;
    }
    match user_code::attach(|py| py.check_signals()) {
        Ok(()) => false,
        Err(err) => {
            RAISED.with(|raised| *raised.borrow_mut() = Some(err));
            true
        }
    }
}

/// Run `work` with the GIL released: other Python threads run meanwhile. A wait for another
/// thread's pause inside `work` is not interrupted (see [`interruptible`]): for work that must
/// finish, such as a free whose block would be lost otherwise. A Ctrl-C that an `on_trim` run
/// by `work` kept comes once the outermost such call is done ([`defer_ctrl_c`]).
pub(crate) fn detached<T, F>(py: Python<'_>, work: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let depth = Detached::enter();
    let done = py.detach(work);
    drop(depth);
    if !in_detached_work() {
        // The outermost call only: one inside a hook would interrupt the hooks after it.
        deliver_deferred_ctrl_c(py);
    }
    done
}

/// Whether this thread runs core work through [`detached`] (a hook that such work calls runs
/// inside it; one that a C caller's allocation calls does not).
fn in_detached_work() -> bool {
    DEPTH.with(Cell::get) > 0
}

/// This thread's depth of [`detached`] work, one level while it lives.
struct Detached;

impl Detached {
    fn enter() -> Detached {
        DEPTH.with(|d| d.set(d.get() + 1));
        Detached
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        if std::thread::panicking() && !in_detached_work() {
            // The call that would deliver a kept Ctrl-C ends in a panic: none is kept for a
            // later, unrelated call.
            CTRL_C.with(|deferred| deferred.set(false));
        }
    }
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

/// For a `KeyboardInterrupt` that a region hook (an `on_trim`) raised on the main thread while
/// Python handles SIGINT (a Ctrl-C that came while the hook ran), in core work run through
/// [`detached`]: keep it, so that once the outermost such call returns the interpreter acts as
/// if the signal came again (its handler runs then, raising `KeyboardInterrupt` by default).
/// Not at once: the signal would interrupt the trim's next hook before it could unmap its
/// region. Returns whether it kept it; any other exception, one on another thread (where no
/// signal handler runs), or one in a hook that a C caller's allocation ran (no call of the
/// binding around it would deliver it) is left to the caller.
pub(crate) fn defer_ctrl_c(py: Python<'_>, err: &PyErr) -> bool {
    if !err.is_instance_of::<PyKeyboardInterrupt>(py) || !in_detached_work() {
        return false;
    }
    let handled = || -> PyResult<bool> {
        let threading = py.import("threading")?;
        if !threading.call_method0("current_thread")?.is(&threading.call_method0("main_thread")?) {
            return Ok(false);
        }
        let signal = py.import("signal")?;
        // `SIG_DFL` and `SIG_IGN` are no callables: then a signal would not reach Python.
        Ok(signal.call_method1("getsignal", (signal.getattr("SIGINT")?,))?.is_callable())
    };
    if !handled().unwrap_or(false) {
        return false;
    }
    CTRL_C.with(|deferred| deferred.set(true));
    true
}

/// Deliver the Ctrl-C that [`defer_ctrl_c`] kept on this thread, if any.
fn deliver_deferred_ctrl_c(_py: Python<'_>) {
    if CTRL_C.with(|deferred| deferred.replace(false)) {
        // SAFETY: the GIL is held (`_py`), as the function requires.
        unsafe { pyo3::ffi::PyErr_SetInterrupt() };
    }
}

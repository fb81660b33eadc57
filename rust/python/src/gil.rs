//! The one place that runs npumem-core work without the GIL (and maps its errors).
//!
//! Work that may wait for another thread's pause of a pool runs [`interruptible`]: the core
//! waits in slices ([`npumem_core::WAIT_SLICE`]) and, between them, takes the GIL back to run
//! the signal handlers that are due (Ctrl-C's `KeyboardInterrupt`, an alarm's handler). When one
//! raises, the wait gives up, the work does nothing, and the handler's exception is what the
//! call raises.

use std::cell::RefCell;

use pyo3::prelude::*;

use crate::errors::to_py;
use crate::growth;
use crate::user_code;

thread_local! {
    /// The exception a signal handler raised while this thread's [`interruptible`] work waited,
    /// until that work returns.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
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
/// by `work` kept comes once `work` is done (`growth::deliver_deferred_ctrl_c`).
pub(crate) fn detached<T, F>(py: Python<'_>, work: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let done = py.detach(work);
    growth::deliver_deferred_ctrl_c(py);
    done
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

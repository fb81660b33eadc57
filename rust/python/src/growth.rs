//! The Python side of pool growth: `Pool(on_grow=..., on_trim=...)` callables become the core's
//! region hooks, and the exception an `on_grow` raised becomes the `__cause__` of the
//! `OutOfMemoryError` of the allocation it failed (a `KeyboardInterrupt` or `SystemExit` is
//! raised as it is); an `on_trim`'s goes to `sys.unraisablehook`.
//!
//! A hook runs on the allocating (or trimming) thread, with the GIL taken for the call; the
//! exception waits in a thread-local slot until the failed allocation reaches Python.

use std::cell::RefCell;
use std::sync::Arc;

use npumem_core::RegionHook;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::args;
use crate::errors::{caused_by, error, ErrorClass};
use crate::user_code;

thread_local! {
    /// The exception the last failing `on_grow` of this thread raised.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// The core hook that calls `callable(offset, nbytes)` (`name` for the error when it is not
/// callable); `None` for `None`.
pub(crate) fn hook(callable: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<RegionHook>> {
    let Some(callable) = callable.filter(|c| !c.is_none()) else { return Ok(None) };
    if !callable.is_callable() {
        return Err(error(
            ErrorClass::ArgumentType,
            format!("{name} must be callable or None, got {}", args::type_name(callable)),
        ));
    }
    let callable = callable.clone().unbind();
    // An `on_trim` that raises cannot fail its trim (the region is gone either way): its
    // exception goes to `sys.unraisablehook`. An `on_grow`'s waits for the failed allocation.
    let trims = name == "on_trim";
    let hook: RegionHook = Arc::new(move |offset: usize, nbytes: usize| {
        Python::attach(|py| match user_code::call(callable.bind(py), (offset, nbytes)) {
            Ok(_) => Ok(()),
            Err(err) => {
                let message = err.to_string();
                if trims {
                    err.write_unraisable(py, Some(callable.bind(py)));
                } else {
                    RAISED.with(|slot| *slot.borrow_mut() = Some(err));
                }
                Err(message)
            }
        })
    });
    Ok(Some(hook))
}

/// Forget an exception of an earlier allocation of this thread.
pub(crate) fn forget() {
    RAISED.with(|slot| slot.borrow_mut().take());
}

/// `err` with the exception a failing `on_grow` raised (if any) as its `__cause__`; or that
/// exception itself when it is no `Exception` (a `KeyboardInterrupt`, a `SystemExit`): those
/// go through as they are.
pub(crate) fn chain(py: Python<'_>, err: PyErr) -> PyErr {
    let Some(cause) = RAISED.with(|slot| slot.borrow_mut().take()) else { return err };
    let out_of_memory = ErrorClass::OutOfMemory.class(py).is_ok_and(|class| err.is_instance(py, class));
    match out_of_memory || !cause.is_instance_of::<PyException>(py) {
        true => caused_by(py, err, cause),
        false => err,
    }
}

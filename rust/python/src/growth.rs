//! The Python side of pool growth: `Pool(on_grow=..., on_trim=...)` callables become the core's
//! region hooks, and the exception an `on_grow` raised becomes the `__cause__` of the
//! `OutOfMemoryError` of the allocation it failed (a `KeyboardInterrupt` or `SystemExit` is
//! raised as it is); an `on_trim`'s goes to `sys.unraisablehook`, except a Ctrl-C on the main
//! thread, which comes again once the call that trimmed returns (`gil::defer_ctrl_c`).
//!
//! A hook runs on the allocating (or trimming) thread, with the GIL taken for the call; the
//! exception waits in a thread-local slot until the failed allocation reaches Python. An
//! allocation inside a handler (or a hook) keeps the exception of the allocation it runs in
//! ([`stash`], [`restore`]). No out-of-memory handler runs for an allocation inside a hook
//! ([`in_hook`]): the change of regions the hook is part of holds the pool, so the handler
//! could neither grow it nor pause it.
//!
//! The callables live in the pool's [`Hooks`], the one owner of each: the pool's
//! garbage-collector methods visit and clear them there, so a hook that refers to its pool
//! (a closure over it) is a cycle the collector can break.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};

use npumem_core::RegionHook;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::args;
use crate::errors::{caused_by, error, ErrorClass};
use crate::gil;
use crate::user_code;

thread_local! {
    /// The exception the last failing `on_grow` of this thread raised.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
    /// How many region hooks this thread is running (one inside another's pool's hook).
    static IN_HOOK: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread runs a region hook now (an allocation inside it asks no handler).
pub(crate) fn in_hook() -> bool {
    IN_HOOK.with(Cell::get) > 0
}

/// Take the exception of the allocation a nested one runs inside (a handler's or a hook's),
/// to be put back with [`restore`] once the nested allocation is done.
pub(crate) fn stash() -> Option<PyErr> {
    RAISED.with(|slot| slot.borrow_mut().take())
}

/// Put back what [`stash`] took.
pub(crate) fn restore(outer: Option<PyErr>) {
    RAISED.with(|slot| *slot.borrow_mut() = outer);
}

/// One hook's callable, shared by the pool (for the collector) and the core's hook.
type Slot = Arc<Mutex<Option<Py<PyAny>>>>;

/// A pool's `on_grow` and `on_trim` callables.
#[derive(Default)]
pub(crate) struct Hooks {
    slots: [Slot; 2],
}

impl Hooks {
    /// For the garbage collector: visit the callables (one skipped while its hook runs).
    pub(crate) fn traverse(&self, visit: &pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        for slot in &self.slots {
            if let Ok(callable) = slot.try_lock() {
                visit.call(callable.as_ref())?;
            }
        }
        Ok(())
    }

    /// For the garbage collector: drop the callables (the hooks do nothing after).
    pub(crate) fn clear(&self) {
        for slot in &self.slots {
            if let Ok(mut callable) = slot.try_lock() {
                callable.take();
            }
        }
    }

    /// The core hooks that call `on_grow(offset, nbytes)` and `on_trim(offset, nbytes)` (each
    /// `None` for `None`), their callables kept here.
    pub(crate) fn set(
        &self,
        on_grow: Option<&Bound<'_, PyAny>>,
        on_trim: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<[Option<RegionHook>; 2]> {
        let grow = hook(&self.slots[0], on_grow, "on_grow")?;
        let trim = hook(&self.slots[1], on_trim, "on_trim")?;
        Ok([grow, trim])
    }
}

/// The core hook that calls `callable(offset, nbytes)`, kept in `slot` (`name` for the error
/// when it is not callable); `None` for `None`.
fn hook(slot: &Slot, callable: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<RegionHook>> {
    let Some(callable) = callable.filter(|c| !c.is_none()) else { return Ok(None) };
    if !callable.is_callable() {
        return Err(error(
            ErrorClass::ArgumentType,
            format!("{name} must be callable or None, got {}", args::type_name(callable)),
        ));
    }
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(callable.clone().unbind());
    let slot = Arc::clone(slot);
    // An `on_trim` that raises cannot fail its trim (the region is gone either way): its
    // exception goes to `sys.unraisablehook`. An `on_grow`'s waits for the failed allocation.
    let trims = name == "on_trim";
    let hook: RegionHook = Arc::new(move |offset: usize, nbytes: usize| {
        user_code::attach(|py| {
            let held = slot.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|c| c.clone_ref(py));
            // Cleared by the collector: the pool is going away.
            let Some(callable) = held else { return Ok(()) };
            IN_HOOK.with(|n| n.set(n.get() + 1));
            let called = user_code::call(callable.bind(py), (offset, nbytes));
            IN_HOOK.with(|n| n.set(n.get() - 1));
            match called {
                Ok(_) => Ok(()),
                Err(err) => {
                    let message = err.to_string();
                    if trims {
                        if !gil::defer_ctrl_c(py, &err) {
                            err.write_unraisable(py, Some(callable.bind(py)));
                        }
                    } else {
                        RAISED.with(|slot| *slot.borrow_mut() = Some(err));
                    }
                    Err(message)
                }
            }
        })
    });
    Ok(Some(hook))
}

/// Whether this thread's last failing `on_grow` raised an exception that is no `Exception`
/// (Ctrl-C, an exit): the allocation then ends with it, without asking anything more.
pub(crate) fn interrupted(py: Python<'_>) -> bool {
    RAISED.with(|slot| slot.borrow().as_ref().is_some_and(|e| !e.is_instance_of::<PyException>(py)))
}

/// `err` with the exception a failing `on_grow` raised (if any) as its `__cause__`; or that
/// exception itself when it is no `Exception` (a `KeyboardInterrupt`, a `SystemExit`): those
/// go through as they are. An `err` that has a cause already (the exception of an
/// out-of-memory handler, which ran after the growth failed) keeps it, and the growth's
/// exception becomes that cause's `__context__`, unless it has one.
pub(crate) fn chain(py: Python<'_>, err: PyErr) -> PyErr {
    let Some(grown) = RAISED.with(|slot| slot.borrow_mut().take()) else { return err };
    if !grown.is_instance_of::<PyException>(py) {
        return grown;
    }
    if !ErrorClass::OutOfMemory.class(py).is_ok_and(|class| err.is_instance(py, class)) {
        return err;
    }
    match err.cause(py) {
        Some(handler) => {
            if handler.value(py).getattr("__context__").is_ok_and(|c| c.is_none()) {
                let _ = handler.value(py).setattr("__context__", grown.value(py));
            }
            err
        }
        None => caused_by(py, err, grown),
    }
}

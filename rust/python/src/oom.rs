//! The out-of-memory handler: a Python callable `handler(nbytes) -> bool` that a failing
//! allocation calls before it raises `OutOfMemoryError` (a compactor attaches one); a true
//! answer retries the allocation once.
//!
//! The handler is called with the GIL, after the failed allocation left the pool (no gate
//! held), so it may pause and compact.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

use npumem_core::{Error, Handle};
use pyo3::prelude::*;

use crate::args;
use crate::errors::{error, to_py, ErrorClass};
use crate::gil::{detached, without_gil};

thread_local! {
    /// Set while this thread runs an out-of-memory handler (an allocation inside it does not
    /// call a handler again).
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

/// A pool's out-of-memory handler, or none.
#[derive(Default)]
pub(crate) struct OomHandler {
    slot: Mutex<Option<Py<PyAny>>>,
}

impl OomHandler {
    fn lock(&self) -> MutexGuard<'_, Option<Py<PyAny>>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handler, or None.
    pub(crate) fn get(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.lock().as_ref().map(|h| h.clone_ref(py))
    }

    /// Set `handler` (a callable or `None`); returns the previous one.
    pub(crate) fn replace(&self, handler: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        let new = if handler.is_none() {
            None
        } else if handler.is_callable() {
            Some(handler.clone().unbind())
        } else {
            return Err(error(
                ErrorClass::ArgumentType,
                format!("the out-of-memory handler must be callable or None, got {}", args::type_name(handler)),
            ));
        };
        Ok(std::mem::replace(&mut *self.lock(), new))
    }

    /// For the garbage collector: visit the handler (skipped while another thread holds it).
    pub(crate) fn traverse(&self, visit: &pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Ok(handler) = self.slot.try_lock() {
            visit.call(handler.as_ref())?;
        }
        Ok(())
    }

    /// For the garbage collector: drop the handler.
    pub(crate) fn clear(&self) {
        if let Ok(mut handler) = self.slot.try_lock() {
            handler.take();
        }
    }

    /// Call the handler for a request of `nbytes`; whether to retry.
    fn ask(&self, py: Python<'_>, nbytes: usize) -> PyResult<bool> {
        let Some(handler) = self.get(py) else { return Ok(false) };
        if IN_HANDLER.with(Cell::get) {
            return Ok(false);
        }
        IN_HANDLER.with(|f| f.set(true));
        let answer = handler.call1(py, (nbytes,)).and_then(|r| r.is_truthy(py));
        IN_HANDLER.with(|f| f.set(false));
        answer
    }

    /// Run `alloc` without the GIL; on out-of-memory ask the handler (for `nbytes`) and, if it
    /// says so, run it once more.
    fn retrying<T: Send>(
        &self,
        py: Python<'_>,
        core: &npumem_core::Pool,
        nbytes: impl FnOnce() -> usize,
        alloc: impl Fn() -> npumem_core::Result<T> + Sync,
    ) -> PyResult<T> {
        match detached(py, &alloc) {
            Err(err) if matches!(err.root(), Error::OutOfMemory { .. }) => {
                if self.ask(py, nbytes())? {
                    let done = without_gil(py, &alloc)?;
                    core.forgive_failure(); // it did not raise after all
                    Ok(done)
                } else {
                    Err(to_py(err))
                }
            }
            other => other.map_err(to_py),
        }
    }

    /// The slow path of `Pool.alloc`, with the retry.
    pub(crate) fn alloc(
        &self,
        py: Python<'_>,
        core: &npumem_core::Pool,
        size: usize,
        align: Option<usize>,
        tag: u32,
    ) -> PyResult<Handle> {
        self.retrying(py, core, || size, || core.alloc(size, align, tag))
    }

    /// `Pool.alloc_many`, with the retry (the handler is asked for the sum of the sizes).
    pub(crate) fn alloc_many(
        &self,
        py: Python<'_>,
        core: &npumem_core::Pool,
        sizes: &[usize],
        align: Option<usize>,
        tag: u32,
    ) -> PyResult<Vec<Handle>> {
        self.retrying(py, core, || sizes.iter().sum(), || core.alloc_many(sizes, align, tag))
    }
}

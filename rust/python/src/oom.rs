//! The out-of-memory handler: a Python callable `handler(nbytes) -> bool` that a failing
//! allocation calls before it raises `OutOfMemoryError` (a compactor attaches one); a true
//! answer retries the allocation once. `nbytes` is the request's size, a batch's total for
//! `alloc_many`; inside the handler, `oom_request_sizes()` gives each item's size (a handler
//! that can make room for the items apart, as a compaction can, needs them).
//!
//! A pool that can grow asks its handler before it grows: the first try holds growth, so that
//! a compaction may serve the request without a new region, and the retry may grow. If that
//! retry fails too (its `on_grow` refused, or no region has room for the request), the handler
//! is asked once more, now told that the pool will not grow (`oom_retry_may_grow()` is False),
//! so that it may wait for other threads' frees, and a true answer retries a last time,
//! without growing. An exception `on_grow` raised becomes the `__cause__` of the
//! `OutOfMemoryError` (or, when the handler raised after it, the `__context__` of the
//! handler's exception, which is the cause).
//!
//! The handler is called with the GIL, after the failed allocation left the pool (no gate
//! held), so it may pause and compact. An allocation counts in `failed_allocs` and traces a
//! `failed` event once, when it finally fails (the handler declined or raised, or the last
//! retry found no room): while a handler may still rescue it, the core leaves its failure
//! unrecorded (`Pool::failures_deferred`), so that no reader ever sees a rescued allocation as
//! failed.

use std::cell::{Cell, RefCell};
use std::sync::{Mutex, MutexGuard};

use npumem_core::{Error, Handle};
use pyo3::prelude::*;

use crate::args;
use crate::errors::{caused_by, error, to_py, ErrorClass};
use crate::gil::{detached, interruptible};
use crate::growth;
use crate::user_code;

thread_local! {
    /// The pools whose out-of-memory handler this thread runs, innermost last: an allocation
    /// inside a handler does not call that pool's handler again (another pool's, yes).
    static IN_HANDLER: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// Set while this thread runs Python code under a lock that other threads' calls need (a
    /// KV cache's state mutex, the pool's pause): a handler must not wait for other threads'
    /// frees then.
    static UNDER_LOCK: Cell<bool> = const { Cell::new(false) };
    /// The allocation whose handler this thread runs (see [`oom_request_sizes`] and
    /// [`oom_retry_may_grow`]).
    static REQUEST: RefCell<Option<Request>> = const { RefCell::new(None) };
}

/// What a handler learns of the allocation it runs for.
struct Request {
    /// The item sizes, in bytes.
    sizes: Vec<usize>,
    /// Whether the retry that a true answer makes may add a region.
    may_grow: bool,
}

/// Run `work` (which may call the out-of-memory handler) marked as holding a lock that other
/// threads need; see [`handler_may_wait`].
pub(crate) fn under_lock<T>(work: impl FnOnce() -> T) -> T {
    let before = UNDER_LOCK.with(|f| f.replace(true));
    let out = work();
    UNDER_LOCK.with(|f| f.set(before));
    out
}

/// Whether an out-of-memory handler running in this thread may wait for other threads to free
/// memory: False inside a KV cache's page allocation, which holds the cache's lock (the other
/// threads' cache calls, their frees among them, would wait for the waiter), and in a thread
/// that holds the pool's pause (no other thread's free reaches the pool).
#[pyfunction]
pub(crate) fn oom_handler_may_wait() -> bool {
    !UNDER_LOCK.with(Cell::get)
}

/// The sizes of the allocation whose out-of-memory handler runs in this thread, in bytes: one
/// for `alloc` (and a KV cache's page), one per item for `alloc_many`, whose handler is asked
/// for their total. `None` outside a handler.
#[pyfunction]
pub(crate) fn oom_request_sizes() -> Option<Vec<usize>> {
    REQUEST.with(|r| r.borrow().as_ref().map(|r| r.sizes.clone()))
}

/// Whether the retry that a true answer of the out-of-memory handler running in this thread
/// makes may add a region: True when the pool can grow and has not tried yet (it asks its
/// handler before it grows), False when it cannot grow, when its growth failed for this
/// request (the handler is then asked once more), and outside a handler. A handler that would
/// wait for other threads' frees need not while the retry may grow.
#[pyfunction]
pub(crate) fn oom_retry_may_grow() -> bool {
    REQUEST.with(|r| r.borrow().as_ref().is_some_and(|r| r.may_grow))
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

    /// Call the handler for a request of items of `sizes` bytes (with their total), whose
    /// retry may grow the pool or not (`may_grow`); whether to retry. In a thread that holds
    /// the pool's pause, the handler is told not to wait for other threads.
    fn ask(&self, py: Python<'_>, core: &npumem_core::Pool, sizes: &[usize], may_grow: bool) -> PyResult<bool> {
        if core.paused_by_caller() {
            under_lock(|| self.ask_now(py, core.id(), sizes, may_grow))
        } else {
            self.ask_now(py, core.id(), sizes, may_grow)
        }
    }

    /// [`OomHandler::ask`] as the thread is, for pool `pool`. No handler runs for an
    /// allocation inside this pool's handler, nor inside a region hook (`growth::in_hook`).
    fn ask_now(&self, py: Python<'_>, pool: u32, sizes: &[usize], may_grow: bool) -> PyResult<bool> {
        let Some(handler) = self.get(py) else { return Ok(false) };
        if growth::in_hook() || IN_HANDLER.with(|h| h.borrow().contains(&pool)) {
            return Ok(false);
        }
        let nbytes = sizes.iter().fold(0usize, |sum, &n| sum.saturating_add(n));
        IN_HANDLER.with(|h| h.borrow_mut().push(pool));
        // A handler of another pool that this one runs inside keeps its request.
        let outer = REQUEST.with(|r| r.replace(Some(Request { sizes: sizes.to_vec(), may_grow })));
        let answer = user_code::call(handler.bind(py), (nbytes,)).and_then(|r| user_code::is_truthy(&r));
        REQUEST.with(|r| *r.borrow_mut() = outer);
        IN_HANDLER.with(|h| h.borrow_mut().pop());
        answer
    }

    /// Run `alloc` without the GIL; on out-of-memory ask the handler (for items of `sizes`)
    /// and, if it says so, run it once more. `record` records the final failure of an
    /// out-of-memory error whose recording the core deferred
    /// ([`npumem_core::Pool::record_failure`]).
    fn retrying<T: Send>(
        &self,
        py: Python<'_>,
        core: &npumem_core::Pool,
        sizes: impl FnOnce() -> Vec<usize>,
        alloc: impl Fn() -> npumem_core::Result<T> + Sync,
        record: impl FnOnce(&Error) + Send,
    ) -> PyResult<T> {
        // An allocation inside a handler or a hook keeps the growth exception of the one it
        // runs in; any other starts without one of an earlier allocation.
        let nested = growth::in_hook() || IN_HANDLER.with(|h| !h.borrow().is_empty());
        let outer = growth::stash();
        let out = self.retrying_once(py, core, sizes, alloc, record);
        let out = out.map_err(|err| growth::chain(py, err));
        if nested {
            growth::restore(outer);
        }
        out
    }

    /// [`OomHandler::retrying`] without the growth hook's exception.
    fn retrying_once<T: Send>(
        &self,
        py: Python<'_>,
        core: &npumem_core::Pool,
        sizes: impl FnOnce() -> Vec<usize>,
        alloc: impl Fn() -> npumem_core::Result<T> + Sync,
        record: impl FnOnce(&Error) + Send,
    ) -> PyResult<T> {
        let out_of_memory = |err: &Error| matches!(err.root(), Error::OutOfMemory { .. });
        // With a handler, the first try's failure is recorded only once it is final (below).
        let deferred = self.get(py).is_some();
        // A pool that can grow tries the handler's remedy before it adds a region: the first
        // try holds growth, the retry allows it.
        let grow_last = core.config().grows() && deferred;
        // A signal handler that raised while the allocation waited for another thread's pause
        // ends the call: nothing was allocated, nor recorded as a failure.
        let first = interruptible(py, || match (deferred, grow_last) {
            (true, true) => core.failures_deferred(|| core.without_growth(&alloc)),
            (true, false) => core.failures_deferred(&alloc),
            (false, _) => alloc(),
        })?;
        // The first failure is final: recorded now if the core left it to this call, without
        // the GIL (the record waits for another thread's pause, as an allocation does).
        let give_up = |err: Error| {
            if deferred {
                detached(py, || record(&err));
            }
            err
        };
        let err = match first {
            Err(err) if out_of_memory(&err) => err,
            other => return other.map_err(to_py),
        };
        let sizes = sizes();
        // A handler that failed (raised, or answered with something that has no truth value):
        // the allocation fails as it would have, with that exception as its cause. Ctrl-C and
        // exits go through as they are.
        let retry = match self.ask(py, core, &sizes, grow_last) {
            Ok(retry) => retry,
            Err(raised) => return Err(caused_by(py, to_py(give_up(err)), raised)),
        };
        if !(retry || grow_last) {
            return Err(to_py(give_up(err)));
        }
        if !deferred {
            // The first failure was recorded already (a handler set meanwhile): the retry
            // records none. One allocation, one outcome.
            return interruptible(py, || core.failures_deferred(&alloc))?.map_err(to_py);
        }
        if !grow_last {
            return interruptible(py, &alloc)?.map_err(to_py); // records its own failure
        }
        // The retry may grow. When it fails too, the pool did not grow for this request: the
        // handler is asked again, told so, unless the growth hook raised Ctrl-C or an exit.
        let err = match interruptible(py, || core.failures_deferred(&alloc))? {
            Err(err) if out_of_memory(&err) && !growth::interrupted(py) => err,
            Err(err) if out_of_memory(&err) => return Err(to_py(give_up(err))),
            other => return other.map_err(to_py),
        };
        // The handler was told that the pool will not grow: the last retry does not. Its
        // failure keeps what the growth found (no place for the region, where the limit had
        // room).
        match self.ask(py, core, &sizes, false) {
            Ok(true) => interruptible(py, || core.without_growth(&alloc))?
                .map_err(|last| to_py(last.with_unplaced_growth_of(&err))),
            Ok(false) => Err(to_py(give_up(err))),
            Err(raised) => Err(caused_by(py, to_py(give_up(err)), raised)),
        }
    }

    /// The slow path of `Pool.alloc`, after the quick attempt with the GIL held, with the
    /// retry: `alloc_quick_first`, so the block lands where it would had the quick attempt
    /// run (a pause shuts that attempt out).
    pub(crate) fn alloc(
        &self,
        py: Python<'_>,
        core: &npumem_core::Pool,
        size: usize,
        align: Option<usize>,
        tag: u32,
    ) -> PyResult<Handle> {
        let record = |_: &Error| core.record_failure(size, align, tag);
        self.retrying(py, core, || vec![size], || core.alloc_quick_first(size, align, tag), record)
    }

    /// `Pool.alloc_many`, with the retry (the handler is asked for the sum of the sizes, and
    /// `oom_request_sizes()` gives them).
    /// Signals are checked now and then (Ctrl-C): one that raises stops the batch, which then
    /// leaves nothing allocated, and its exception is returned.
    pub(crate) fn alloc_many(
        &self,
        py: Python<'_>,
        core: &npumem_core::Pool,
        sizes: &[usize],
        align: Option<usize>,
        tag: u32,
    ) -> PyResult<Vec<Handle>> {
        let raised: Mutex<Option<PyErr>> = Mutex::new(None);
        let keep_going = || match user_code::attach(|py| py.check_signals()) {
            Ok(()) => true,
            Err(err) => {
                *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(err);
                false
            }
        };
        // The item that found no room is the allocation that failed.
        let record = |err: &Error| {
            if let Error::Batch { index, .. } = err {
                core.record_failure(sizes[*index], align, tag);
            }
        };
        let done = self.retrying(
            py,
            core,
            || sizes.to_vec(),
            || core.alloc_many_until(sizes, align, tag, keep_going),
            record,
        )?;
        match done {
            Some(handles) => Ok(handles),
            None => Err(raised
                .into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| error(ErrorClass::InvalidArgument, "the batch was stopped before it completed"))),
        }
    }
}

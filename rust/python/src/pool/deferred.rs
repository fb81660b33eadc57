//! `with pool.deferred():` scopes. Inside one, every free of a block of that pool made by this
//! thread (`free()`, `free_many()`, a `with` block's exit, a block whose last reference goes)
//! is queued; the outermost scope's exit frees the queue as one batch, also when the body
//! raises.
//!
//! The open scopes of a thread live in a thread-local list, so that a free asks "is this thread
//! deferring?" by reading its own thread's list: no lock on the free path. Before that, one
//! relaxed load of the pool's count of open scopes (written only when a scope opens or closes)
//! answers "no" for a pool without any, so the common free reads no thread-local storage.
//! Scopes of one pool nest: an inner scope adds to the queue of the outermost one. A thread that
//! ends with a scope open (it cannot in Python, but the list is dropped all the same) hands its
//! queue to the pool's stranded frees.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use pyo3::prelude::*;

use super::pending::{Pending, PendingFrees};
use super::state::Pool;
use crate::errors::{error, ErrorClass};
use crate::user_code;

/// One pool's open scopes on this thread.
struct Scope {
    pending: Arc<PendingFrees>,
    /// Scopes of this pool open on this thread.
    depth: u32,
    /// The frees queued by them.
    queue: Vec<Pending>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        let rest = std::mem::take(&mut self.queue);
        self.pending.strand_queued(rest);
        self.pending.scope_closed();
    }
}

thread_local! {
    static SCOPES: RefCell<Vec<Scope>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread has a deferred scope of `pending`'s pool open.
#[inline]
pub(crate) fn deferring(pending: &Arc<PendingFrees>) -> bool {
    if !pending.any_scope() {
        return false;
    }
    SCOPES
        .try_with(|scopes| match scopes.try_borrow() {
            Ok(scopes) => !scopes.is_empty() && scopes.iter().any(|s| Arc::ptr_eq(&s.pending, pending)),
            Err(_) => false,
        })
        .unwrap_or(false)
}

/// Queue `items` in this thread's open scope of `pending`'s pool; false (nothing queued) when
/// none is open.
pub(crate) fn queue_in_scope(pending: &Arc<PendingFrees>, items: &[Pending]) -> bool {
    if !pending.any_scope() {
        return false;
    }
    SCOPES
        .try_with(|scopes| {
            let Ok(mut scopes) = scopes.try_borrow_mut() else {
                return false;
            };
            match scopes.iter_mut().find(|s| Arc::ptr_eq(&s.pending, pending)) {
                Some(scope) => {
                    scope.queue.extend_from_slice(items);
                    pending.queued(items.len());
                    true
                }
                None => false,
            }
        })
        .unwrap_or(false)
}

/// Open a scope of `pending`'s pool on this thread.
fn open(pending: &Arc<PendingFrees>) {
    SCOPES.with_borrow_mut(|scopes| match scopes.iter_mut().find(|s| Arc::ptr_eq(&s.pending, pending)) {
        Some(scope) => scope.depth += 1,
        None => {
            pending.scope_opened();
            scopes.push(Scope { pending: Arc::clone(pending), depth: 1, queue: Vec::new() });
        }
    });
}

/// Close a scope of `pending`'s pool on this thread: the queue to flush when it was the
/// outermost one.
fn close(pending: &Arc<PendingFrees>) -> Option<Vec<Pending>> {
    SCOPES.with_borrow_mut(|scopes| {
        let at = scopes.iter().position(|s| Arc::ptr_eq(&s.pending, pending))?;
        scopes[at].depth -= 1;
        if scopes[at].depth > 0 {
            return None;
        }
        let mut scope = scopes.remove(at);
        Some(std::mem::take(&mut scope.queue))
    })
}

/// `Pool.deferred()`: a context manager under which this thread's frees of the pool's blocks
/// are queued, and freed as one batch when it exits.
#[pyclass(module = "npumem._core", frozen)]
pub struct Deferred {
    pool: Py<Pool>,
    /// The thread that entered it, while entered.
    entered: Mutex<Option<ThreadId>>,
}

impl Deferred {
    pub(crate) fn new(pool: Py<Pool>) -> Deferred {
        Deferred { pool, entered: Mutex::new(None) }
    }
}

/// A scope dropped while open (its `__exit__` never came: `__enter__` called by hand, the
/// object then let go) closes as its exit would, on the thread that entered it: its frees are
/// made now, a failure goes to `sys.unraisablehook`. Dropped on another thread, it cannot
/// reach the entering thread's scopes: those close when that thread ends.
impl Drop for Deferred {
    fn drop(&mut self) {
        let entered = self.entered.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if entered != Some(std::thread::current().id()) {
            return;
        }
        let pending = &self.pool.get().pending;
        let Some(mut batch) = close(pending) else { return };
        user_code::attach(|py| {
            batch.append(&mut pending.take(false));
            if let (_, Some(err)) = pending.flush(py, batch) {
                err.write_unraisable(py, None);
            }
        });
    }
}

#[pymethods]
impl Deferred {
    fn __enter__(slf: Py<Self>) -> PyResult<Py<Self>> {
        let this = slf.get();
        let mut entered = this.entered.lock().unwrap_or_else(|p| p.into_inner());
        if entered.is_some() {
            return Err(error(
                ErrorClass::InvalidArgument,
                "this deferred scope is open already; use a new pool.deferred() for a nested scope",
            ));
        }
        *entered = Some(std::thread::current().id());
        open(&this.pool.get().pending);
        drop(entered);
        Ok(slf)
    }

    /// Free the queued blocks as one batch. With an exception in flight, a free that fails is
    /// kept for the next flush and the body's exception propagates; without one, the first
    /// failure is raised after every other free was made.
    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        {
            let mut entered = self.entered.lock().unwrap_or_else(|p| p.into_inner());
            match *entered {
                Some(thread) if thread == std::thread::current().id() => *entered = None,
                Some(_) => {
                    return Err(error(
                        ErrorClass::InvalidArgument,
                        "a deferred scope must exit on the thread that entered it",
                    ))
                }
                None => return Err(error(ErrorClass::InvalidArgument, "this deferred scope is not open")),
            }
        }
        let pool = self.pool.get();
        let Some(mut batch) = close(&pool.pending) else {
            return Ok(false);
        };
        batch.append(&mut pool.pending.take(false));
        let (_, failed) = pool.pending.flush(py, batch);
        match failed {
            Some(err) if _exc_type.is_none_or(|t| t.is_none()) => Err(err),
            _ => Ok(false),
        }
    }

    /// Frees queued by this thread's open scopes of the pool.
    #[getter]
    fn pending(&self) -> usize {
        let pending = &self.pool.get().pending;
        SCOPES
            .with_borrow(|scopes| scopes.iter().find(|s| Arc::ptr_eq(&s.pending, pending)).map_or(0, |s| s.queue.len()))
    }

    fn __repr__(&self) -> String {
        format!("<npumem.Deferred pending={}>", self.pending())
    }
}

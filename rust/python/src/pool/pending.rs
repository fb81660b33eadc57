//! Frees that wait: the deferred frees of `Pool.defer_free`, and the frees of blocks whose last
//! reference went while the pool could not take them (paused by another thread, or the block
//! still pinned by C code). Both wait here until a flush.
//!
//! `count` is `PoolStats.deferred_pending`: every queued free, those of the `with
//! pool.deferred():` scopes of all threads included (`deferred.rs` keeps those per thread and
//! counts them here). `collected` is `PoolStats.auto_freed`: blocks freed (or queued to be)
//! because their last reference went.
//!
//! Nothing here is on the path of an ordinary `alloc` or `free`: only deferred frees and
//! collected blocks reach it. Whatever is still queued when the last holder of this struct goes
//! (the pool object, or a thread's scope) is freed then.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use npumem_core::{Error, Handle};
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::gil::detached;

/// One free waiting for a flush: the handle, and the tag whose hold it gives back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) handle: Handle,
    pub(crate) tag_id: u32,
}

/// A pool's waiting frees.
pub(crate) struct PendingFrees {
    core: Arc<npumem_core::Pool>,
    /// `Pool.defer_free` outside a scope: freed by `Pool.flush_deferred()`.
    deferred: Mutex<Vec<Pending>>,
    /// Frees that met a closed gate or a pin: retried at every flush, scope exit, resumed
    /// pause and `stats()`.
    stranded: Mutex<Vec<Pending>>,
    /// Every queued free, in any queue (`PoolStats.deferred_pending`).
    count: AtomicUsize,
    /// Blocks freed because their last reference went (`PoolStats.auto_freed`).
    collected: AtomicU64,
    /// Threads with a deferred scope of this pool open (`deferred.rs`): while none has, a free
    /// skips the look at its thread's scopes.
    scopes: AtomicUsize,
}

fn lock(queue: &Mutex<Vec<Pending>>) -> MutexGuard<'_, Vec<Pending>> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a free that failed with `err` may succeed later (the block is still allocated).
pub(crate) fn retry_later(err: &Error) -> bool {
    matches!(
        err.root(),
        Error::Pinned { .. }
            | Error::Paused
            | Error::Busy { .. }
            | Error::PausedTooLong { .. }
            | Error::PausedAtFork { .. }
            | Error::Interrupted { .. }
            | Error::CopiesInterrupted { .. }
            | Error::Moving
            | Error::Relocating
    )
}

/// Whether a free failed with `err` because another thread's pause outlasted its wait.
fn gave_up_on_a_pause(err: &Error) -> bool {
    matches!(err.root(), Error::Busy { .. } | Error::PausedTooLong { .. } | Error::PausedAtFork { .. })
}

impl PendingFrees {
    pub(crate) fn new(core: Arc<npumem_core::Pool>) -> PendingFrees {
        PendingFrees {
            core,
            deferred: Mutex::new(Vec::new()),
            stranded: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
            collected: AtomicU64::new(0),
            scopes: AtomicUsize::new(0),
        }
    }

    /// Queued frees, all queues and threads together.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Blocks freed because their last reference went.
    pub(crate) fn collected(&self) -> u64 {
        self.collected.load(Ordering::Relaxed)
    }

    /// Whether some thread has a deferred scope of this pool open. A thread that opened one
    /// sees its own count: the load never hides a scope of the calling thread.
    #[inline]
    pub(crate) fn any_scope(&self) -> bool {
        self.scopes.load(Ordering::Relaxed) != 0
    }

    /// A thread opened its outermost scope of this pool.
    pub(crate) fn scope_opened(&self) {
        self.scopes.fetch_add(1, Ordering::Relaxed);
    }

    /// A thread's outermost scope of this pool closed (or the thread ended with it open).
    pub(crate) fn scope_closed(&self) {
        self.scopes.fetch_sub(1, Ordering::Relaxed);
    }

    /// `n` frees entered a queue (a scope's, or one of these).
    pub(crate) fn queued(&self, n: usize) {
        self.count.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` frees left the queues (freed, or found freed already).
    fn dequeued(&self, n: usize) {
        self.count.fetch_sub(n, Ordering::Relaxed);
    }

    /// A block's last reference went: count it.
    pub(crate) fn note_collected(&self) {
        self.collected.fetch_add(1, Ordering::Relaxed);
    }

    /// Queue a free for `flush_deferred`.
    pub(crate) fn defer(&self, items: &[Pending]) {
        self.queued(items.len());
        lock(&self.deferred).extend_from_slice(items);
    }

    /// Queue a free that cannot run now; it is retried at the next flush.
    pub(crate) fn strand(&self, item: Pending) {
        self.queued(1);
        lock(&self.stranded).push(item);
    }

    /// Strand frees counted as queued already (a scope's queue whose thread ended).
    pub(crate) fn strand_queued(&self, items: Vec<Pending>) {
        if !items.is_empty() {
            lock(&self.stranded).extend(items);
        }
    }

    /// Whether frees wait for a retry.
    pub(crate) fn has_stranded(&self) -> bool {
        !lock(&self.stranded).is_empty()
    }

    /// Take the frees of `defer_free` (with `deferred`) and the stranded ones, to flush them.
    pub(crate) fn take(&self, deferred: bool) -> Vec<Pending> {
        let mut batch = if deferred { std::mem::take(&mut *lock(&self.deferred)) } else { Vec::new() };
        batch.append(&mut lock(&self.stranded));
        batch
    }

    /// Free `batch` (frees already counted in `count`), waiting for a pause of another thread
    /// without the GIL: as one batch, or one by one when the batch is refused. A free that may
    /// succeed later (a pinned block, a pool busy moving) is stranded for the next flush; one
    /// whose block is gone already (freed through its raw handle) is dropped. When another
    /// thread's pause outlasts the wait, every free not made is stranded at once (each would
    /// wait out the pause again) and the pause's `PoolBusyError` is returned. Returns how many
    /// blocks were freed and the first error.
    pub(crate) fn flush(&self, py: Python<'_>, batch: Vec<Pending>) -> (usize, Option<PyErr>) {
        if batch.is_empty() {
            return (0, None);
        }
        let core = &self.core;
        let handles: Vec<Handle> = batch.iter().map(|p| p.handle).collect();
        match detached(py, || core.free_many(&handles)) {
            Ok(()) => {
                for p in &batch {
                    self.released(p.tag_id);
                }
                self.dequeued(batch.len());
                return (batch.len(), None);
            }
            Err(err) if gave_up_on_a_pause(&err) => {
                lock(&self.stranded).extend(batch);
                return (0, Some(to_py(err)));
            }
            Err(_) => {}
        }
        let mut freed = 0;
        let mut first_error = None;
        let mut left = Vec::new();
        let mut items = batch.into_iter();
        for p in items.by_ref() {
            match detached(py, || core.free(p.handle)) {
                Ok(()) => {
                    self.released(p.tag_id);
                    freed += 1;
                    self.dequeued(1);
                }
                Err(err) if gave_up_on_a_pause(&err) => {
                    left.push(p);
                    first_error.get_or_insert_with(|| to_py(err));
                    break;
                }
                Err(err) if retry_later(&err) => left.push(p),
                Err(err) => {
                    self.dequeued(1);
                    first_error.get_or_insert_with(|| to_py(err));
                }
            }
        }
        left.extend(items);
        lock(&self.stranded).extend(left);
        (freed, first_error)
    }

    /// Give back the hold of a block freed here on its tag (its free counted it back).
    pub(crate) fn released(&self, tag_id: u32) {
        let core = &self.core;
        if !core.tags().is_named(tag_id) {
            // The block held its tag: never refused.
            let _ = core.release_tag(tag_id, 1);
        }
    }

    /// Free a block whose last reference went, without waiting: stranded when the pool is
    /// paused by another thread or the block is pinned.
    pub(crate) fn free_collected(&self, item: Pending) {
        self.note_collected();
        match self.core.try_free(item.handle) {
            Ok(()) => self.released(item.tag_id),
            Err(err) if retry_later(&err) => self.strand(item),
            // Freed already through its raw handle: nothing to do.
            Err(_) => {}
        }
    }
}

impl Drop for PendingFrees {
    /// The pool object and every scope are gone: free what still waits (best effort; a block
    /// still pinned then stays allocated).
    fn drop(&mut self) {
        let rest: Vec<Pending> = self
            .deferred
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .chain(self.stranded.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..))
            .collect();
        for p in rest {
            if self.core.try_free(p.handle).is_ok() {
                self.released(p.tag_id);
            }
        }
    }
}

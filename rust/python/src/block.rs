//! `npumem.Block`: a handle to one block, with its bytes as a buffer on host-backed pools.
//!
//! A `Block` owns its block: when its last reference goes, the block is freed (and counted in
//! `PoolStats.auto_freed`) unless it was freed, its free was deferred, or `detach()` handed the
//! handle on. Buffer views (memoryviews, NumPy arrays, DLPack capsules) hold a reference to the
//! `Block`, so a block with views is freed when the last view goes. A collected block that the
//! pool cannot take at once (paused by another thread, or pinned by C code) waits in the pool's
//! stranded frees (`pool/pending.rs`); nothing waits in a destructor.
//!
//! The object's state is npumem-core's `OwnerWord`: its ownership, read by every method and
//! ended once by the call that ends it (free, defer, detach), and the pins `pin()` took through
//! this object. Those pins are the object's: `unpin()` drops only them, `detach()` hands them on
//! with the handle, and a collected object drops them (a pin drop never waits) before its block
//! is freed. A block whose `with` exit was refused for its pins is freed by whichever pin goes
//! last, also when that is a DLPack consumer's on another thread without the GIL (the word's
//! fences; its loom models check the race). The core's free path is unchanged.

use std::ffi::c_int;
use std::sync::Arc;

use npumem_core::{Handle, HandleFault, OwnerWord, Ownership};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::array;
use crate::dlpack;
use crate::errors::{error, to_py, ErrorClass};
use crate::gil::without_gil;
use crate::pinned::{pin, pin_view, read_block, PinOwner, Pinned};
use crate::pool::deferred;
use crate::pool::detached::DetachedBlock;
use crate::pool::pending::Pending;
use crate::pool::state::Pool;

/// One block of a pool. Its `offset` may change when the pool is compacted; the block stays
/// valid until freed, and is freed when its last reference goes (unless `detach()` handed it
/// on). A context manager that frees the block on exit.
// A freelist: programs allocate and drop blocks by the thousand (alloc_many), and reusing
// the Python objects halves the cost of making one.
#[pyclass(module = "npumem._core", frozen, freelist = 4096)]
pub struct Block {
    pool: Py<Pool>,
    handle: Handle,
    nbytes: usize,
    tag: Option<Py<PyString>>,
    /// The pool's id of `tag` (0: none), for the counters by tag.
    tag_id: u32,
    /// Whether this object owns the block, and the pins `pin()` took through it (and did not
    /// drop).
    state: OwnerWord,
}

impl Drop for Block {
    /// The last reference went: free the block if this object still owns it, after dropping
    /// the pins its `pin()` took (nothing could drop them any more; a pin of C code stays, and
    /// the free then waits in the pool's stranded frees).
    fn drop(&mut self) {
        let (ownership, pins) = self.state.load();
        if !ownership.owning() {
            return;
        }
        let pool = self.pool.get();
        for _ in 0..pins {
            if pool.core.unpin(self.handle).is_err() {
                break;
            }
        }
        let item = self.pending();
        if deferred::queue_in_scope(&pool.pending, &[item]) {
            pool.pending.note_collected();
            return;
        }
        pool.pending.free_collected(item);
    }
}

/// Guards and exports pin through the object (`pinned.rs`, `dlpack.rs`).
impl PinOwner for Py<Block> {
    fn check_owned(&self) -> PyResult<()> {
        self.get().owned(ErrorClass::InvalidHandle)
    }

    fn after_unpin(&self) {
        self.get().after_unpin();
    }

    fn object(&self, py: Python<'_>) -> Py<PyAny> {
        self.clone_ref(py).into_any()
    }
}

/// What the error for a block whose free is deferred says.
const DEFERRED_MESSAGE: &str = "the block's free is deferred: it can no longer be used";

/// What the error for a block whose deferred free was made says.
const DEFERRED_FREED_MESSAGE: &str = "the block was freed (its free was deferred, and has been made)";

/// What the error for a block detached from this object says.
const DETACHED_MESSAGE: &str = "the block was detached from this object (Block.detach()); adopt its handle to use it";

/// What a call says of a block whose free through another call is under way.
const FREEING_MESSAGE: &str = "the block is being freed by another call";

/// The error for a block detached from this object.
fn detached_error() -> PyErr {
    error(ErrorClass::InvalidHandle, DETACHED_MESSAGE)
}

impl Block {
    pub(crate) fn new(pool: Py<Pool>, handle: Handle, nbytes: usize, tag: Option<Py<PyString>>, tag_id: u32) -> Block {
        Block { pool, handle, nbytes, tag, tag_id, state: OwnerWord::default() }
    }

    /// `block` as a Python object that the garbage collector tracks. An object from the free
    /// list is not tracked (only a fresh one is), and a cycle through an untracked block (an
    /// out-of-memory handler that holds a block of its pool) would never be collected.
    pub(crate) fn into_object(py: Python<'_>, block: Block) -> PyResult<Bound<'_, Block>> {
        let object = Bound::new(py, block)?;
        // SAFETY: a live object of a garbage-collected type, fully initialized; the GIL is held.
        unsafe {
            if ffi::PyObject_GC_IsTracked(object.as_ptr()) == 0 {
                ffi::PyObject_GC_Track(object.as_ptr().cast());
            }
        }
        Ok(object)
    }

    /// A block adopted with the pins that `pin()` took through the object that detached it.
    pub(crate) fn adopted(
        pool: Py<Pool>,
        handle: Handle,
        nbytes: usize,
        tag: Option<Py<PyString>>,
        tag_id: u32,
        pins: u32,
    ) -> Block {
        Block { pool, handle, nbytes, tag, tag_id, state: OwnerWord::adopted(pins) }
    }

    /// The ownership now.
    #[inline(always)]
    fn owner(&self) -> Ownership {
        self.state.ownership()
    }

    /// End the ownership (freed): no pin of this object is left either.
    fn set_freed(&self) {
        self.state.set_freed();
    }

    /// The tag id and the bytes asked for, for the counters by tag.
    pub(crate) fn tag_and_size(&self) -> (u32, usize) {
        (self.tag_id, self.nbytes)
    }

    /// The block as a queued free.
    pub(crate) fn pending(&self) -> Pending {
        Pending { handle: self.handle, tag_id: self.tag_id }
    }

    /// What the error for a block whose free is deferred says: that it was freed, once the
    /// deferred free was made (the object is not told of it; its handle is stale then).
    fn deferred_message(&self) -> &'static str {
        match self.pool.get().core.try_block(self.handle) {
            Err(npumem_core::Error::InvalidHandle(HandleFault::Freed)) => DEFERRED_FREED_MESSAGE,
            _ => DEFERRED_MESSAGE,
        }
    }

    /// Refuse a block this object no longer owns (deferred or detached): `class` for a
    /// deferred one.
    #[inline(always)]
    pub(crate) fn owned(&self, class: ErrorClass) -> PyResult<()> {
        match self.owner() {
            Ownership::Deferred => Err(error(class, self.deferred_message())),
            Ownership::Detached => Err(detached_error()),
            Ownership::Freeing => Err(error(class, FREEING_MESSAGE)),
            _ => Ok(()),
        }
    }

    /// The handle, for a batch call on `pool` (which must be the block's own); `index` names
    /// the item in the error.
    pub(crate) fn handle_in(&self, pool: &Pool, index: usize) -> PyResult<Handle> {
        if !std::ptr::eq(pool, self.pool.get()) {
            return Err(error(ErrorClass::InvalidHandle, format!("item {index} of the batch belongs to another pool")));
        }
        match self.owner() {
            Ownership::Deferred => {
                Err(error(ErrorClass::InvalidHandle, format!("item {index} of the batch: {}", self.deferred_message())))
            }
            Ownership::Detached => {
                Err(error(ErrorClass::InvalidHandle, format!("item {index} of the batch: {DETACHED_MESSAGE}")))
            }
            Ownership::Freeing => {
                Err(error(ErrorClass::InvalidHandle, format!("item {index} of the batch: {FREEING_MESSAGE}")))
            }
            _ => Ok(self.handle),
        }
    }

    /// The handle for `free_many`: as `handle_in`, a deferred block, or one another call is
    /// freeing, refused as a double free.
    pub(crate) fn handle_to_free(&self, pool: &Pool, index: usize) -> PyResult<Handle> {
        match self.owner() {
            Ownership::Deferred => {
                let already = match self.deferred_message() {
                    DEFERRED_MESSAGE => "the block's free is deferred already",
                    freed => freed,
                };
                Err(error(ErrorClass::DoubleFree, format!("item {index} of the batch: {already}")))
            }
            Ownership::Freeing => {
                Err(error(ErrorClass::DoubleFree, format!("item {index} of the batch: {FREEING_MESSAGE}")))
            }
            _ => self.handle_in(pool, index),
        }
    }

    /// Claim the block for a free through this object (`OwnerWord::begin_free`), before the
    /// free may wait without the GIL: meanwhile no other call can detach it, queue its free or
    /// pin it through this object. The word to restore with [`Block::unclaim_free`] if the free
    /// fails; `None` for a block pinned through this object (the core refuses its free, with
    /// the pins it counts); the error for a block this object no longer owns (`item`: its place
    /// in a batch).
    pub(crate) fn claim_free(&self, item: Option<usize>) -> PyResult<Option<u64>> {
        match self.state.begin_free() {
            Ok(before) => Ok(Some(before)),
            Err((ownership, _)) if ownership.owning() => Ok(None),
            Err(_) => Err(self.deferral_refused(item)),
        }
    }

    /// The free that [`Block::claim_free`] claimed the block for failed: owned again.
    pub(crate) fn unclaim_free(&self, claim: Option<u64>) {
        if let Some(before) = claim {
            self.state.undo_free(before);
        }
    }

    /// `free_many` freed the block.
    pub(crate) fn mark_freed(&self) {
        self.set_freed();
    }

    /// Free through `pool`, which must be the block's own (queued instead inside a deferred
    /// scope of this thread).
    pub(crate) fn free_in(&self, py: Python<'_>, pool: &Pool) -> PyResult<()> {
        if !std::ptr::eq(pool, self.pool.get()) {
            return Err(error(ErrorClass::InvalidHandle, "the block belongs to another pool"));
        }
        self.owned(ErrorClass::DoubleFree)?;
        if deferred::deferring(&pool.pending) {
            return self.defer_in(pool);
        }
        let core = &pool.core;
        match core.try_free(self.handle) {
            Err(npumem_core::Error::Paused) => {
                // The free waits for the pause without the GIL: it claims the block first, so
                // that no other call can detach it, queue its free or pin it meanwhile. (With
                // the GIL held, no other Python call runs between the check above and here.)
                let claim = self.claim_free(None)?;
                if let Err(err) = without_gil(py, || core.free(self.handle)) {
                    self.unclaim_free(claim);
                    return Err(err);
                }
            }
            other => other.map_err(to_py)?,
        }
        self.set_freed();
        pool.tags.release(core, self.tag_id, 1);
        Ok(())
    }

    /// Check that the block can be freed now (alive, not pinned), as `free()` would.
    pub(crate) fn check_freeable(&self, pool: &Pool) -> PyResult<()> {
        self.owned(ErrorClass::DoubleFree)?;
        // A block being moved is live and unpinned.
        let pins = match pool.core.try_block(self.handle) {
            Ok(info) => info.pins,
            Err(npumem_core::Error::Moving) => 0,
            Err(npumem_core::Error::InvalidHandle(HandleFault::Freed)) => {
                return Err(to_py(npumem_core::Error::DoubleFree))
            }
            Err(other) => return Err(to_py(other)),
        };
        if pins > 0 {
            return Err(to_py(npumem_core::Error::Pinned { pins }));
        }
        Ok(())
    }

    /// Mark the block deferred: the state before, for `unmark_deferred`; None when another
    /// call ended the ownership first, or when `pin()` pinned the block meanwhile.
    pub(crate) fn mark_deferred(&self) -> Option<u64> {
        self.state.defer().ok()
    }

    /// Undo `mark_deferred` (a batch that could not queue every block): back to `before`.
    pub(crate) fn unmark_deferred(&self, before: u64) {
        self.state.undo_defer(before);
    }

    /// Queue the block's free (this thread's deferred scope, else the pool's deferred frees).
    pub(crate) fn defer_in(&self, pool: &Pool) -> PyResult<()> {
        if !std::ptr::eq(pool, self.pool.get()) {
            return Err(error(ErrorClass::InvalidHandle, "the block belongs to another pool"));
        }
        self.check_freeable(pool)?;
        if self.mark_deferred().is_none() {
            return Err(self.deferral_refused(None));
        }
        let item = self.pending();
        if !deferred::queue_in_scope(&pool.pending, &[item]) {
            pool.pending.defer(&[item]);
        }
        Ok(())
    }

    /// After an unpin, by whatever dropped the pin (`unpin()`, a buffer view, a DLPack export,
    /// a `Pinned` guard): free a block whose `with` exit was refused for its pins, once the last
    /// pin is gone. Never waits and needs no GIL: when another thread holds a pause, the free
    /// waits in the pool's stranded frees (freed when the pause ends, or at the next flush).
    /// Inside a deferred scope of the pool on this thread, the free is queued in the scope, as
    /// every free the thread makes there.
    pub(crate) fn after_unpin(&self) {
        if !self.state.frees_at_this_unpin() {
            return;
        }
        let pool = self.pool.get();
        if deferred::deferring(&pool.pending) {
            if self.unpinned_in_slot(pool) && self.state.queue_free_at_last_unpin() {
                pool.pending.note_collected();
                let item = self.pending();
                if !deferred::queue_in_scope(&pool.pending, &[item]) {
                    pool.pending.defer(&[item]);
                }
            }
            return;
        }
        match pool.core.try_free(self.handle) {
            Ok(()) => {
                self.set_freed();
                pool.pending.note_collected();
                pool.pending.released(self.tag_id);
            }
            Err(npumem_core::Error::Paused) => {
                if self.unpinned_in_slot(pool) && self.state.queue_free_at_last_unpin() {
                    pool.pending.note_collected();
                    pool.pending.strand(self.pending());
                }
            }
            // Still pinned, or freed already (by another unpin's check, or its raw handle).
            Err(_) => {}
        }
    }

    /// Whether the block's slot holds no pin of anyone now (a moving block has none).
    fn unpinned_in_slot(&self, pool: &Pool) -> bool {
        match pool.core.try_block(self.handle) {
            Ok(info) => info.pins == 0,
            Err(e) => e == npumem_core::Error::Moving,
        }
    }

    /// The error for a deferral that `mark_deferred` refused (`item`: the block's place in a
    /// batch).
    pub(crate) fn deferral_refused(&self, item: Option<usize>) -> PyErr {
        let (class, message) = match self.owner() {
            Ownership::Deferred => (ErrorClass::DoubleFree, self.deferred_message().to_string()),
            Ownership::Detached => (ErrorClass::InvalidHandle, DETACHED_MESSAGE.to_string()),
            Ownership::Freed => (ErrorClass::DoubleFree, npumem_core::Error::DoubleFree.to_string()),
            Ownership::Freeing => (ErrorClass::DoubleFree, FREEING_MESSAGE.to_string()),
            _ => (ErrorClass::PinnedBlock, npumem_core::Error::Pinned { pins: self.pins_now() }.to_string()),
        };
        match item {
            Some(i) => error(class, format!("item {i} of the batch: {message}")),
            None => error(class, message),
        }
    }

    /// The block's pins now (0 for a block gone).
    fn pins_now(&self) -> u32 {
        // A block being moved has no pins.
        self.pool.get().core.try_block(self.handle).map_or(0, |info| info.pins)
    }

    /// The error for a call that found the ownership ended (freed, deferred or detached).
    fn ended_error(&self) -> PyErr {
        match self.owned(ErrorClass::InvalidHandle) {
            Err(err) => err,
            Ok(()) => to_py(npumem_core::Error::InvalidHandle(HandleFault::Freed)),
        }
    }

    /// Check that the block is allocated and owned by this object.
    fn check_alive(&self, pool: &Pool) -> PyResult<()> {
        self.owned(ErrorClass::InvalidHandle)?;
        match pool.core.try_block(self.handle) {
            Ok(_) | Err(npumem_core::Error::Moving) => Ok(()),
            Err(other) => Err(to_py(other)),
        }
    }

    fn info(&self, py: Python<'_>) -> PyResult<npumem_core::BlockInfo> {
        self.owned(ErrorClass::InvalidHandle)?;
        read_block(py, &self.pool.get().core, self.handle).map_err(to_py)
    }

    /// The core pool.
    fn core(&self) -> &Arc<npumem_core::Pool> {
        &self.pool.get().core
    }
}

#[pymethods]
impl Block {
    /// For the garbage collector: the pool, so that a cycle through it (an out-of-memory
    /// handler that holds a block of its pool) is found; the pool's `__clear__` breaks it.
    fn __traverse__(&self, visit: pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.pool)
    }

    /// Current offset of the block in the arena (it may change after a compaction).
    #[getter]
    fn offset(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.info(py)?.offset)
    }

    /// The block's address: the pool's base address plus `offset` (a host pointer on host
    /// pools; it may change after a compaction, never while the block is pinned).
    #[getter]
    fn address(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.core().base_address().wrapping_add(self.info(py)?.offset as u64))
    }

    /// The DLPack device of the block's memory: `(device type code, index)`, e.g. `(1, 0)` for
    /// the CPU, `(2, 0)` for the first CUDA device.
    fn __dlpack_device__(&self) -> (i32, i32) {
        dlpack::device_of(self.core())
    }

    /// The block as a DLPack capsule: a one-dimensional `uint8` tensor over its bytes, on its
    /// pool's device (DLPack 1.0 when `max_version` allows it). The block is pinned until the
    /// consumer lets go of the tensor: it never moves, and `free()` refuses meanwhile. No
    /// copy is made (`copy=True` and another `dl_device` raise `ExportError`, a `BufferError`). A
    /// `backing="none"` pool without a `base_address` has no addresses to export: it raises
    /// `NoBackingError`.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        this.owned(ErrorClass::InvalidHandle)?;
        let request = dlpack::Request { stream, max_version, dl_device, copy };
        dlpack::export(py, this.core(), this.handle, Box::new(slf.clone().unbind()), &request)
    }

    /// A NumPy array of `dtype` (default `uint8`) and `shape` (default: as many items as fit)
    /// over the block's bytes, without copying (host pools). The array pins the block while it
    /// or any view of it lives.
    #[pyo3(signature = (dtype = None, shape = None))]
    fn as_array<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        shape: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        if !this.core().has_backing() {
            // A freed or stale handle is reported as such before the missing backing.
            this.info(slf.py())?;
            return Err(error(
                ErrorClass::NoBacking,
                "as_array needs host memory; this pool's bytes live on its device (use __dlpack__ with a device library)",
            ));
        }
        array::as_array(slf.as_any(), this.nbytes, dtype, shape)
    }

    /// Bytes asked for.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Bytes the block holds (`nbytes` rounded up to its layout).
    #[getter]
    fn block_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.info(py)?.block_bytes)
    }

    /// The alignment the block was allocated with.
    #[getter]
    fn align(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.info(py)?.align)
    }

    /// The tag given at allocation, or None.
    #[getter]
    fn tag(&self, py: Python<'_>) -> Option<Py<PyString>> {
        self.tag.as_ref().map(|t| t.clone_ref(py))
    }

    /// Whether the block is still allocated and owned by this object (False once freed, once
    /// its free is deferred, and once detached).
    #[getter]
    fn alive(&self, py: Python<'_>) -> bool {
        self.info(py).is_ok()
    }

    /// The block's handle as an int (slot, generation and pool id packed together).
    #[getter]
    fn handle(&self) -> u128 {
        self.handle.to_bits()
    }

    /// The pool the block belongs to.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<Pool> {
        self.pool.clone_ref(py)
    }

    /// Pins on the block (explicit pins and live buffer views).
    #[getter]
    fn pins(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.info(py)?.pins)
    }

    /// Free the block. Raises `DoubleFreeError` if it was freed already and `PinnedBlockError`
    /// while buffer views of it are alive.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.free_in(py, self.pool.get())
    }

    /// Enter a `with` statement; raises `InvalidHandleError` for a block already freed.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        slf.get().info(slf.py())?;
        Ok(slf)
    }

    /// Pin the block: a compaction never moves it (and it cannot be freed) until it is
    /// unpinned as many times. The pins belong to this object: when it is collected they are
    /// dropped, and the block is freed once nothing else pins it (`detach()` hands them on with
    /// the handle). Returns the pins `pin()` took through this object that are held now.
    fn pin(&self, py: Python<'_>) -> PyResult<u32> {
        self.owned(ErrorClass::InvalidHandle)?;
        let core = &self.pool.get().core;
        pin(py, core, self.handle)?;
        match self.state.count_pin() {
            Ok(pins) => Ok(pins),
            Err(_) => {
                // Another thread ended the ownership meanwhile (detach, defer): the pin is not
                // this object's to keep.
                let _ = core.unpin(self.handle);
                Err(self.ended_error())
            }
        }
    }

    /// Remove a pin taken by `pin()` through this object (`InvalidHandleError` without one:
    /// the pins of buffer views are released with the views, a `pinned()` guard's when it
    /// exits). Returns the pins `pin()` took through this object that are left.
    fn unpin(&self) -> PyResult<u32> {
        self.owned(ErrorClass::InvalidHandle)?;
        let left = self.state.uncount_pin().map_err(|ended| match ended {
            None => error(
                ErrorClass::InvalidHandle,
                "unpin without a matching pin: the block holds no pin taken by pin() through this \
                 object (a buffer view's pin is released with the view, a pinned() guard's when it exits)",
            ),
            Some(_) => self.ended_error(),
        })?;
        // The count dropped also when the core refuses: then the pin was gone already (C code
        // dropped it), and this object holds one less.
        self.pool.get().core.unpin(self.handle).map_err(to_py)?;
        self.after_unpin();
        Ok(left)
    }

    /// A context manager that pins the block for the `with` block: `with blk.pinned(): ...`.
    /// Entering it raises `InvalidHandleError`, as `pin()` does, once the block is freed, its
    /// free deferred, or the block detached from this object.
    fn pinned(slf: &Bound<'_, Self>) -> Pinned {
        let this = slf.get();
        Pinned::new(Box::new(slf.clone().unbind()), this.pool.get().core.clone(), this.handle)
    }

    /// Give up ownership: returns the raw handle (as the `handle` property) for C code or
    /// another owner, and this object no longer frees the block (nor can use it). The handle
    /// stays valid across compactions; `Pool.adopt(handle)` makes a `Block` of it again. Pins
    /// that `pin()` took through this object go with the handle: the adopting object holds
    /// them (its `unpin()` drops them).
    fn detach(&self, py: Python<'_>) -> PyResult<u128> {
        let pool = self.pool.get();
        self.check_alive(pool)?;
        let Ok(pins) = self.state.detach() else {
            return Err(self.ended_error());
        };
        let tag = self.tag.as_ref().map(|t| t.clone_ref(py));
        let block = DetachedBlock { nbytes: self.nbytes, tag, tag_id: self.tag_id, pins };
        pool.detached.insert(self.handle.to_bits(), block);
        Ok(self.handle.to_bits())
    }

    /// Free the block on leaving the `with` statement (unless it was freed, deferred or
    /// detached inside it). When the body raised, its exception always propagates: a block
    /// still pinned then is freed when its last pin goes (or when the object goes), and no
    /// refusal of the free replaces the body's (an exception that a signal handler raised while
    /// the free waited for another thread's pause does: the block then stays allocated).
    /// Without an exception, a pinned block raises `PinnedBlockError` and stays allocated.
    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if !self.alive(py) {
            return Ok(false);
        }
        let raising = _exc_type.is_some_and(|t| !t.is_none());
        // The pool's refusal gives way to the body's exception; an exception of a signal
        // handler that ended the free's wait for a pause (Ctrl-C) goes through.
        let refused = |err: &PyErr| ErrorClass::Npumem.class(py).is_ok_and(|class| err.is_instance(py, class));
        match self.free(py) {
            Ok(()) => Ok(false),
            Err(err) if raising && refused(&err) => {
                if self.info(py).is_ok_and(|info| info.pins > 0) {
                    self.state.free_at_last_unpin();
                    // The last pin may have gone meanwhile.
                    self.after_unpin();
                }
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }

    /// The block's bytes, writable, without copying (host-backed pools). The block counts as
    /// pinned while a view is alive: it cannot be freed or moved.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        this.owned(ErrorClass::InvalidHandle)?;
        let core = &this.pool.get().core;
        if !core.has_backing() {
            // A freed or stale handle is reported as such before the missing backing.
            this.info(slf.py())?;
            return Err(error(
                ErrorClass::NoBacking,
                "the pool has no host memory behind it (backing=\"none\"): its bytes live on the device",
            ));
        }
        pin_view(slf.py(), core, this.handle)?;
        let (ptr, len) = match core.host_ptr(this.handle) {
            Ok(found) => found,
            Err(err) => {
                let _ = core.unpin_view(this.handle);
                return Err(to_py(err));
            }
        };
        // SAFETY: `view` is the buffer struct CPython passed in; the pointer and length describe
        // the live, pinned block, which stays valid until `__releasebuffer__` unpins it; the
        // exporter (`slf`) is kept alive by the view.
        let filled = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.as_ptr().cast(), len as ffi::Py_ssize_t, 0, flags)
        };
        if filled != 0 {
            let _ = core.unpin_view(this.handle);
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let _ = self.pool.get().core.unpin_view(self.handle);
        self.after_unpin();
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let tag = match &self.tag {
            Some(t) => format!(" tag={:?}", t.bind(py).to_string_lossy()),
            None => String::new(),
        };
        let state = match self.owner() {
            Ownership::Deferred if self.deferred_message() == DEFERRED_FREED_MESSAGE => "freed",
            Ownership::Deferred => "deferred",
            Ownership::Detached => "detached",
            Ownership::Freeing => "being freed",
            _ => "freed",
        };
        match self.info(py) {
            Ok(info) => format!("<npumem.Block offset={} nbytes={}{tag}>", info.offset, self.nbytes),
            Err(_) => format!("<npumem.Block {state} nbytes={}{tag}>", self.nbytes),
        }
    }
}

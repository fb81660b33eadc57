//! `npumem.Block`: a handle to one block, with its bytes as a buffer on host-backed pools.

use std::ffi::c_int;
use std::sync::Arc;

use npumem_core::Handle;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::array;
use crate::dlpack;
use crate::errors::{error, to_py, ErrorClass};
use crate::gil::without_gil;
use crate::pinned::{pin, pin_view, Pinned};
use crate::pool::state::Pool;

/// One block of a pool. Its `offset` may change when the pool is compacted; the block stays
/// valid until freed. A context manager that frees the block on exit.
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
}

impl Block {
    pub(crate) fn new(pool: Py<Pool>, handle: Handle, nbytes: usize, tag: Option<Py<PyString>>, tag_id: u32) -> Block {
        Block { pool, handle, nbytes, tag, tag_id }
    }

    /// The tag id and the bytes asked for, for the counters by tag.
    pub(crate) fn tag_and_size(&self) -> (u32, usize) {
        (self.tag_id, self.nbytes)
    }

    /// The handle, for a batch call on `pool` (which must be the block's own); `index` names
    /// the item in the error.
    pub(crate) fn handle_in(&self, pool: &Pool, index: usize) -> PyResult<Handle> {
        if !std::ptr::eq(pool, self.pool.get()) {
            return Err(error(ErrorClass::InvalidHandle, format!("item {index} of the batch belongs to another pool")));
        }
        Ok(self.handle)
    }

    /// Free through `pool`, which must be the block's own.
    pub(crate) fn free_in(&self, py: Python<'_>, pool: &Pool) -> PyResult<()> {
        if !std::ptr::eq(pool, self.pool.get()) {
            return Err(error(ErrorClass::InvalidHandle, "the block belongs to another pool"));
        }
        let core = &pool.core;
        match core.try_free(self.handle) {
            Err(npumem_core::Error::Paused) => without_gil(py, || core.free(self.handle))?,
            other => other.map_err(to_py)?,
        }
        core.tags().on_free(self.tag_id, 1, self.nbytes);
        pool.tags.release(core, self.tag_id, 1);
        Ok(())
    }

    fn info(&self) -> PyResult<npumem_core::BlockInfo> {
        self.pool.get().core.block(self.handle).map_err(to_py)
    }

    /// The core pool.
    fn core(&self) -> &Arc<npumem_core::Pool> {
        &self.pool.get().core
    }
}

#[pymethods]
impl Block {
    /// Current offset of the block in the arena (it may change after a compaction).
    #[getter]
    fn offset(&self) -> PyResult<usize> {
        Ok(self.info()?.offset)
    }

    /// The block's address: the pool's base address plus `offset` (a host pointer on host
    /// pools; it may change after a compaction, never while the block is pinned).
    #[getter]
    fn address(&self) -> PyResult<u64> {
        Ok(self.core().base_address().wrapping_add(self.info()?.offset as u64))
    }

    /// The DLPack device of the block's memory: `(device type code, index)`, e.g. `(1, 0)` for
    /// the CPU, `(2, 0)` for the first CUDA device.
    fn __dlpack_device__(&self) -> (i32, i32) {
        dlpack::device_of(self.core())
    }

    /// The block as a DLPack capsule: a one-dimensional `uint8` tensor over its bytes, on its
    /// pool's device (DLPack 1.0 when `max_version` allows it). The block is pinned until the
    /// consumer lets go of the tensor: it never moves, and `free()` refuses meanwhile. No
    /// copy is made (`copy=True` and another `dl_device` raise `BufferError`).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = dlpack::Request { stream, max_version, dl_device, copy };
        dlpack::export(py, self.core(), self.handle, &request)
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
    fn block_bytes(&self) -> PyResult<usize> {
        Ok(self.info()?.block_bytes)
    }

    /// The alignment the block was allocated with.
    #[getter]
    fn align(&self) -> PyResult<usize> {
        Ok(self.info()?.align)
    }

    /// The tag given at allocation, or None.
    #[getter]
    fn tag(&self, py: Python<'_>) -> Option<Py<PyString>> {
        self.tag.as_ref().map(|t| t.clone_ref(py))
    }

    /// Whether the block is still allocated.
    #[getter]
    fn alive(&self) -> bool {
        self.pool.get().core.block(self.handle).is_ok()
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
    fn pins(&self) -> PyResult<u32> {
        Ok(self.info()?.pins)
    }

    /// Free the block. Raises `DoubleFreeError` if it was freed already and `PinnedBlockError`
    /// while buffer views of it are alive.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.free_in(py, self.pool.get())
    }

    /// Enter a `with` statement; raises `InvalidHandleError` for a block already freed.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        slf.get().info()?;
        Ok(slf)
    }

    /// Pin the block: a compaction never moves it (and it cannot be freed) until it is
    /// unpinned as many times. Returns the pins `pin()` took that are held now.
    fn pin(&self, py: Python<'_>) -> PyResult<u32> {
        pin(py, &self.pool.get().core, self.handle)
    }

    /// Remove a pin taken by `pin()` (`InvalidHandleError` without one: the pins of buffer views
    /// are released with the views). Returns the pins `pin()` took that are left.
    fn unpin(&self) -> PyResult<u32> {
        self.pool.get().core.unpin(self.handle).map_err(to_py)
    }

    /// A context manager that pins the block for the `with` block: `with blk.pinned(): ...`.
    fn pinned(slf: &Bound<'_, Self>) -> Pinned {
        let this = slf.get();
        Pinned::new(slf.clone().into_any().unbind(), this.pool.get().core.clone(), this.handle)
    }

    /// Free the block on leaving the `with` statement (unless it was freed inside it).
    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if self.alive() {
            self.free(py)?;
        }
        Ok(false)
    }

    /// The block's bytes, writable, without copying (host-backed pools). The block counts as
    /// pinned while a view is alive: it cannot be freed or moved.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        let core = &this.pool.get().core;
        if !core.has_backing() {
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
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let tag = match &self.tag {
            Some(t) => format!(" tag={:?}", t.bind(py).to_string()),
            None => String::new(),
        };
        match self.info() {
            Ok(info) => format!("<npumem.Block offset={} nbytes={}{tag}>", info.offset, self.nbytes),
            Err(_) => format!("<npumem.Block freed nbytes={}{tag}>", self.nbytes),
        }
    }
}

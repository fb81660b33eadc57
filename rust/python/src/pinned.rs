//! Pinning a block: `Block.pin()` (user pins), the pins buffer views hold (view pins, counted
//! apart: `Block.unpin()` never drops one), and `Pinned`, the context manager of
//! `Block.pinned()`.
//!
//! Nothing waits for a moving block with the GIL: a pin (or a read of the block's figures,
//! [`read_block`]) is tried first and, when the block is being moved, made again without it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use npumem_core::{Error, Handle};
use pyo3::prelude::*;

use crate::errors::{error, to_py, ErrorClass};
use crate::gil::{detached, without_gil};

/// What the pool records of `handle`'s block now (`Pool::block`): while a compaction moves it,
/// waited for without the GIL, which the move's mover may need.
pub(crate) fn read_block(
    py: Python<'_>,
    core: &npumem_core::Pool,
    handle: Handle,
) -> npumem_core::Result<npumem_core::BlockInfo> {
    match core.try_block(handle) {
        Err(npumem_core::Error::Moving) => detached(py, || core.block(handle)),
        other => other,
    }
}

/// Add a user pin: at once, or (while the block is being moved) waiting without the GIL.
/// Returns the user pins.
pub(crate) fn pin(py: Python<'_>, core: &npumem_core::Pool, handle: Handle) -> PyResult<u32> {
    match core.try_pin(handle) {
        Err(Error::Moving) => without_gil(py, || core.pin(handle)),
        other => other.map_err(to_py),
    }
}

/// Add the view pin of a buffer view, as [`pin`]; only `unpin_view` drops it.
pub(crate) fn pin_view(py: Python<'_>, core: &npumem_core::Pool, handle: Handle) -> PyResult<u32> {
    match core.try_pin_view(handle) {
        Err(Error::Moving) => without_gil(py, || core.pin_view(handle)),
        other => other.map_err(to_py),
    }
}

/// The object a guard or an export pins through: the `npumem.Block` (`block.rs`), seen through
/// what its pins need, so that this file and `dlpack.rs` do not depend on the class.
pub(crate) trait PinOwner: Send + Sync {
    /// Refuse (`InvalidHandleError`) an object that no longer owns its block (freed, deferred,
    /// detached), as `Block.pin()` refuses it.
    fn check_owned(&self) -> PyResult<()>;
    /// One of the block's pins went: free it if its `with` exit waited for its last pin. Never
    /// waits and needs no GIL.
    fn after_unpin(&self);
    /// The Python object.
    fn object(&self, py: Python<'_>) -> Py<PyAny>;
}

/// Pins a block while a `with` block runs (`Block.pinned()`).
#[pyclass(module = "npumem._core", frozen)]
pub struct Pinned {
    /// The `npumem.Block` that `__enter__` gives back.
    block: Box<dyn PinOwner>,
    core: Arc<npumem_core::Pool>,
    handle: Handle,
    /// Pins this guard took and has not dropped (entered and not exited): `__exit__` drops
    /// only those, never a pin the caller took otherwise.
    held: AtomicU32,
}

impl Drop for Pinned {
    /// A guard collected while entered drops the pins it holds (nothing else could), and
    /// gives the block the chance every unpin gives it. Dropping a pin never waits.
    fn drop(&mut self) {
        let held = *self.held.get_mut();
        if held == 0 {
            return;
        }
        for _ in 0..held {
            if self.core.unpin(self.handle).is_err() {
                break;
            }
        }
        self.block.after_unpin();
    }
}

impl Pinned {
    pub(crate) fn new(block: Box<dyn PinOwner>, core: Arc<npumem_core::Pool>, handle: Handle) -> Pinned {
        Pinned { block, core, handle, held: AtomicU32::new(0) }
    }
}

#[pymethods]
impl Pinned {
    /// Pin the block; refused (`InvalidHandleError`) as `Block.pin()` refuses it: a block
    /// freed, deferred, or detached from its object (another object may own it now).
    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.block.check_owned()?;
        pin(py, &self.core, self.handle)?;
        self.held.fetch_add(1, Ordering::AcqRel);
        Ok(self.block.object(py))
    }

    /// Unpin on leaving the `with` block (a block whose own `with` exit waited for its last
    /// pin is freed when this was it).
    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let took = self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if took.is_err() {
            return Err(error(
                ErrorClass::InvalidArgument,
                "this guard holds no pin: it was exited as often as entered",
            ));
        }
        if let Err(err) = self.core.unpin(self.handle) {
            self.held.fetch_add(1, Ordering::AcqRel);
            return Err(to_py(err));
        }
        self.block.after_unpin();
        Ok(false)
    }

    /// The block's repr, and the pins the guard holds (1 inside its `with` block, 0 outside).
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let block = self.block.object(py).bind(py).repr()?;
        Ok(format!("<npumem.Pinned {block} held={}>", self.held.load(Ordering::Acquire)))
    }
}

//! Python call stacks of allocations, recorded while a trace runs with `stacks=True`.
//!
//! `Pool.alloc` asks [`Stacks::enabled`] (one relaxed load of a flag of the binding, not of the
//! core); when it is set, the calling thread's Python stack goes into a map by handle, and
//! `Pool.trace_drain` attaches it to the block's `alloc` event. The map holds at most
//! [`MAX_PENDING`] stacks: beyond that (a trace never drained), further allocations are
//! traced without a stack until a drain takes some out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// Frames kept per stack, most recent call first.
pub(crate) const MAX_DEPTH: usize = 32;
/// Stacks waiting for their `alloc` event to be drained, at most.
pub(crate) const MAX_PENDING: usize = 1 << 20;

/// A pool's recorded stacks, by handle bits.
#[derive(Default)]
pub(crate) struct Stacks {
    on: AtomicBool,
    pending: Mutex<HashMap<u128, Py<PyTuple>>>,
}

impl Stacks {
    fn lock(&self) -> MutexGuard<'_, HashMap<u128, Py<PyTuple>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether allocations record their stack now.
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Start (dropping stacks of an earlier trace) or stop recording.
    pub(crate) fn set(&self, on: bool) {
        if on {
            self.lock().clear();
        }
        self.on.store(on, Ordering::Relaxed);
    }

    /// Record the calling thread's stack for the block `handle`.
    pub(crate) fn record(&self, py: Python<'_>, handle: u128) -> PyResult<()> {
        let stack = current_stack(py)?;
        let mut pending = self.lock();
        if pending.len() < MAX_PENDING {
            pending.insert(handle, stack.unbind());
        }
        Ok(())
    }

    /// The stack recorded for `handle`, taken out of the map (None when there is none).
    pub(crate) fn take<'py>(&self, py: Python<'py>, handle: u128) -> Option<Bound<'py, PyTuple>> {
        self.lock().remove(&handle).map(|s| s.into_bound(py))
    }

    /// Drop every stack (garbage collection).
    pub(crate) fn clear(&self) {
        if let Ok(mut pending) = self.pending.try_lock() {
            pending.clear();
        }
    }
}

/// The calling thread's Python stack as a tuple of `(file, line, function)`, most recent call
/// first, at most [`MAX_DEPTH`] frames.
fn current_stack(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let frames = PyList::empty(py);
    let mut frame = py.import("sys")?.call_method1("_getframe", (0,))?;
    while !frame.is_none() && frames.len() < MAX_DEPTH {
        let code = frame.getattr("f_code")?;
        let entry =
            PyTuple::new(py, [code.getattr("co_filename")?, frame.getattr("f_lineno")?, code.getattr("co_name")?])?;
        frames.append(entry)?;
        frame = frame.getattr("f_back")?;
    }
    Ok(frames.to_tuple())
}

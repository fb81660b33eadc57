//! Python call stacks of allocations, recorded while a trace runs with `stacks=True`.
//!
//! `Pool.alloc` asks [`Stacks::enabled`] (one relaxed load of a flag of the binding, not of the
//! core); when it is set, the calling thread's Python stack (each frame's code object and last
//! instruction) goes into a map by handle, and `Pool.trace_drain` attaches it to the block's
//! `alloc` event, looking up files, lines and functions then (once per distinct frame). The map holds at most
//! [`MAX_PENDING`] stacks: beyond that (a trace never drained), further allocations are
//! traced without a stack until a drain takes some out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

/// Frames kept per stack, most recent call first.
pub(crate) const MAX_DEPTH: usize = 32;
/// Stacks waiting for their `alloc` event to be drained, at most.
pub(crate) const MAX_PENDING: usize = 1 << 20;

/// A recorded stack: the code object and last instruction of each frame, most recent first.
/// Lines and names are looked up when the stack is drained, off the allocation path.
type RawStack = Vec<(Py<PyAny>, i64)>;

/// `(file, line, function)` by code object address and instruction, with the code object.
type FrameCache = HashMap<(usize, i64), (Py<PyAny>, Py<PyTuple>)>;

/// A pool's recorded stacks, by handle bits, and the frames already looked up.
#[derive(Default)]
pub(crate) struct Stacks {
    on: AtomicBool,
    pending: Mutex<HashMap<u128, RawStack>>,
    /// `(file, line, function)` by code object and instruction (the code object is kept, so
    /// its address is not reused while it is a key).
    frames: Mutex<FrameCache>,
}

impl Stacks {
    fn lock(&self) -> MutexGuard<'_, HashMap<u128, RawStack>> {
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
            pending.insert(handle, stack);
        }
        Ok(())
    }

    /// The stack recorded for `handle` as a tuple of `(file, line, function)`, taken out of
    /// the map (None when there is none).
    pub(crate) fn take<'py>(&self, py: Python<'py>, handle: u128) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(raw) = self.lock().remove(&handle) else { return Ok(None) };
        let mut frames = self.frames.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(raw.len());
        for (code, lasti) in raw {
            let key = (code.as_ptr() as usize, lasti);
            if let Some((_, frame)) = frames.get(&key) {
                out.push(frame.clone_ref(py));
                continue;
            }
            let frame = describe(code.bind(py), lasti)?.unbind();
            out.push(frame.clone_ref(py));
            frames.insert(key, (code, frame));
        }
        Ok(Some(PyTuple::new(py, out)?))
    }

    /// Drop every stack (garbage collection).
    pub(crate) fn clear(&self) {
        if let Ok(mut pending) = self.pending.try_lock() {
            pending.clear();
        }
        if let Ok(mut frames) = self.frames.try_lock() {
            frames.clear();
        }
    }
}

/// The calling thread's Python stack: code object and last instruction of each frame, most
/// recent call first, at most [`MAX_DEPTH`] frames.
fn current_stack(py: Python<'_>) -> PyResult<RawStack> {
    static GETFRAME: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let getframe = GETFRAME.get_or_try_init(py, || py.import("sys")?.getattr("_getframe").map(Bound::unbind))?;
    let mut frames = Vec::with_capacity(MAX_DEPTH);
    let mut frame = getframe.bind(py).call0()?;
    while !frame.is_none() && frames.len() < MAX_DEPTH {
        let code = frame.getattr(intern!(py, "f_code"))?;
        let lasti: i64 = frame.getattr(intern!(py, "f_lasti"))?.extract()?;
        frames.push((code.unbind(), lasti));
        frame = frame.getattr(intern!(py, "f_back"))?;
    }
    Ok(frames)
}

/// `(file, line, function)` of instruction `lasti` (a byte offset) of `code`.
fn describe<'py>(code: &Bound<'py, PyAny>, lasti: i64) -> PyResult<Bound<'py, PyTuple>> {
    let py = code.py();
    let mut line: i64 = 0;
    for entry in code.call_method0(intern!(py, "co_lines"))?.try_iter()? {
        let (start, end, found): (i64, i64, Option<i64>) = entry?.extract()?;
        if start <= lasti && lasti < end {
            line = found.unwrap_or(0);
            break;
        }
    }
    PyTuple::new(
        py,
        [
            code.getattr(intern!(py, "co_filename"))?,
            line.into_pyobject(py)?.into_any(),
            code.getattr(intern!(py, "co_name"))?,
        ],
    )
}

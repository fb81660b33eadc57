//! Python call stacks of allocations, recorded while a trace runs with `stacks=True`.
//!
//! `Pool.alloc` asks [`Stacks::enabled`] (one relaxed load of a flag of the binding, not of the
//! core); when it is set, the calling thread's Python stack (each frame's code object and last
//! instruction) goes into a map by handle, and `Pool.trace_drain` attaches it to the block's
//! `alloc` event, looking up files, lines and functions then (once per distinct frame).
//!
//! The rings overwrite their oldest events when a trace is not drained in time, and a stack
//! whose event was overwritten is never taken. So the map keeps the stacks of the latest
//! allocations only, as many as the trace's rings hold events: a record beyond that drops the
//! oldest stack. The frames looked up (which keep their code objects alive) are forgotten when
//! a trace starts, and when there are more than [`MAX_FRAMES`] of them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

/// Frames kept per stack, most recent call first.
pub(crate) const MAX_DEPTH: usize = 32;
/// Frames looked up that are kept for the next drains, at most (the cache starts over past it).
pub(crate) const MAX_FRAMES: usize = 1 << 16;

/// A recorded stack: the code object and last instruction of each frame, most recent first.
/// Lines and names are looked up when the stack is drained, off the allocation path.
type RawStack = Box<[(Py<PyAny>, i64)]>;

/// `(file, line, function)` by code object address and instruction, with the code object.
type FrameCache = HashMap<(usize, i64), (Py<PyAny>, Py<PyTuple>)>;

/// The stacks waiting for their `alloc` event to be drained: by handle bits, and the handles
/// in the order they were recorded (some of them taken since).
#[derive(Default)]
struct Pending {
    by_handle: HashMap<u128, RawStack>,
    order: VecDeque<u128>,
    /// Stacks kept at most: the events the trace's rings hold.
    limit: usize,
}

impl Pending {
    fn insert(&mut self, handle: u128, stack: RawStack) {
        if self.limit == 0 {
            return;
        }
        self.by_handle.insert(handle, stack);
        self.order.push_back(handle);
        while self.by_handle.len() > self.limit {
            let Some(oldest) = self.order.pop_front() else { break };
            self.by_handle.remove(&oldest);
        }
        // Handles taken by drains stay in the order until they come first: past twice the
        // limit, the order keeps only the handles still waiting.
        if self.order.len() > 2 * self.limit {
            let by_handle = &self.by_handle;
            self.order.retain(|h| by_handle.contains_key(h));
        }
    }

    fn clear(&mut self, limit: usize) {
        self.by_handle = HashMap::new();
        self.order = VecDeque::new();
        self.limit = limit;
    }
}

/// A pool's recorded stacks, by handle bits, and the frames already looked up.
#[derive(Default)]
pub(crate) struct Stacks {
    on: AtomicBool,
    pending: Mutex<Pending>,
    /// `(file, line, function)` by code object and instruction (the code object is kept, so
    /// its address is not reused while it is a key).
    frames: Mutex<FrameCache>,
}

impl Stacks {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn frames(&self) -> MutexGuard<'_, FrameCache> {
        self.frames.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether allocations record their stack now.
    #[inline]
    pub(crate) fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Start recording for a trace whose rings hold `capacity` events (dropping the stacks and
    /// frames of an earlier trace).
    pub(crate) fn start(&self, on: bool, capacity: usize) {
        self.lock().clear(capacity);
        *self.frames() = HashMap::new();
        self.on.store(on, Ordering::Relaxed);
    }

    /// Stop recording; the stacks recorded stay until drained.
    pub(crate) fn stop(&self) {
        self.on.store(false, Ordering::Relaxed);
    }

    /// Record the calling thread's stack for the block `handle`.
    pub(crate) fn record(&self, py: Python<'_>, handle: u128) -> PyResult<()> {
        let stack = current_stack(py)?;
        self.lock().insert(handle, stack);
        Ok(())
    }

    /// The stack recorded for `handle` as a tuple of `(file, line, function)`, taken out of
    /// the map (None when there is none).
    pub(crate) fn take<'py>(&self, py: Python<'py>, handle: u128) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(raw) = self.lock().by_handle.remove(&handle) else { return Ok(None) };
        let mut frames = self.frames();
        let mut out = Vec::with_capacity(raw.len());
        for (code, lasti) in raw {
            let key = (code.as_ptr() as usize, lasti);
            if let Some((_, frame)) = frames.get(&key) {
                out.push(frame.clone_ref(py));
                continue;
            }
            let frame = describe(code.bind(py), lasti)?.unbind();
            out.push(frame.clone_ref(py));
            if frames.len() >= MAX_FRAMES {
                *frames = HashMap::new();
            }
            frames.insert(key, (code, frame));
        }
        Ok(Some(PyTuple::new(py, out)?))
    }

    /// Drop every stack (garbage collection).
    pub(crate) fn clear(&self) {
        if let Ok(mut pending) = self.pending.try_lock() {
            let limit = pending.limit;
            pending.clear(limit);
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
    // Kept until drained: no room for frames it does not have.
    Ok(frames.into_boxed_slice())
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

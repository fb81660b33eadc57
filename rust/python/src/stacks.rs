//! Python call stacks of allocations, recorded while a trace runs with `stacks=True`.
//!
//! `Pool.alloc` asks [`Stacks::begin`] (one relaxed load of a flag of the binding, not of the
//! core); when recording is on, the calling thread's Python stack (each frame's code object and
//! last instruction) is taken before the allocation, and goes into a map by handle once the
//! allocation returns ([`Recording::finish`]). `Pool.trace_drain` attaches it to the block's
//! `alloc` event, looking up files, lines and functions then (once per distinct frame).
//!
//! An allocation's event reaches the rings inside its core call, its stack reaches the map
//! after it: a drain on another thread may take the event in between, while the allocating
//! thread is without the GIL (`alloc_many`, a wait for room) or gave it up to a finalizer or
//! a signal handler. So a [`Recording`] is inside the stacks' [`Grace`] from before its core
//! call until its stack is in the map, and a drain that took events waits, without the GIL,
//! for every recording that began before its take ([`Stacks::settle`]); recordings that begin
//! later, whose events it did not take, do not hold it up.
//!
//! The rings overwrite their oldest events when a trace is not drained in time, and a stack
//! whose event was overwritten is never taken. So the map keeps the stacks of the latest
//! allocations only, as many as the trace's rings hold events: a record beyond that drops the
//! oldest stack. The frames looked up (which keep their code objects alive) are forgotten when
//! a trace starts, and when there are more than [`MAX_FRAMES`] of them.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use npumem_core::{Grace, Inside};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

/// Frames kept per stack, most recent call first.
pub(crate) const MAX_DEPTH: usize = 32;
/// Frames looked up that are kept for the next drains, at most (the cache starts over past it).
pub(crate) const MAX_FRAMES: usize = 1 << 16;

/// How long a drain waits at most for allocations that began recording before it took its
/// events (past it, an event whose stack is not in the map yet is drained without one).
const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// A recorded stack: the code object and last instruction of each frame, most recent first.
/// Lines and names are looked up when the stack is drained, off the allocation path. The
/// blocks of one `alloc_many` share it.
type RawStack = Arc<[(Py<PyAny>, i64)]>;

thread_local! {
    /// Recordings of the calling thread in progress: a drain that Python code run in the
    /// middle of one calls (a finalizer, a signal handler, an out-of-memory handler) must not
    /// wait for its own thread.
    static RECORDING_HERE: Cell<usize> = const { Cell::new(0) };
}

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
    /// The recordings in progress (see the module documentation).
    recording: Grace,
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
    fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Before an allocation: when recording is on, the calling thread's stack, counted in as a
    /// recording until [`Recording::finish`] put it in the map (or the recording is dropped:
    /// the allocation failed). Taken before the allocation, so that a failure to read the stack
    /// leaves nothing allocated.
    #[inline]
    pub(crate) fn begin(&self, py: Python<'_>) -> PyResult<Option<Recording<'_>>> {
        if !self.enabled() {
            return Ok(None);
        }
        let stack = current_stack(py)?;
        let inside = self.recording.enter();
        RECORDING_HERE.with(|n| n.set(n.get() + 1));
        Ok(Some(Recording { stacks: self, _inside: inside, stack }))
    }

    /// After a drain took its events from the rings (without the GIL): wait until every
    /// recording that began before the take has put its stack in the map, at most
    /// [`SETTLE_LIMIT`]. A recording begins before its allocation's core call writes the
    /// event, so one whose event the drain took is waited for, unless it is done. Not when the
    /// calling thread is inside a recording itself (a finalizer or handler it runs drains), nor
    /// when it holds the pool's pause (`paused_here`): a recording may be waiting at the pool's
    /// entry for that pause to end. Then the stack of an allocation that returned from the core
    /// just before the pause may be missed, as any other drain may miss it past the limit.
    pub(crate) fn settle(&self, paused_here: bool) {
        if self.recording.is_idle() || paused_here || RECORDING_HERE.with(Cell::get) > 0 {
            return;
        }
        self.recording.wait_for_earlier(SETTLE_LIMIT);
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

    /// The stack recorded for `handle` as a tuple of `(file, line, function)`, taken out of
    /// the map (None when there is none).
    pub(crate) fn take<'py>(&self, py: Python<'py>, handle: u128) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(raw) = self.lock().by_handle.remove(&handle) else { return Ok(None) };
        let mut frames = self.frames();
        let mut out = Vec::with_capacity(raw.len());
        for (code, lasti) in raw.iter() {
            let lasti = *lasti;
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
            frames.insert(key, (code.clone_ref(py), frame));
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

/// An allocation recording its stack (see [`Stacks::begin`]); dropping it without
/// [`Recording::finish`] records nothing.
pub(crate) struct Recording<'a> {
    stacks: &'a Stacks,
    _inside: Inside<'a>,
    stack: RawStack,
}

impl Recording<'_> {
    /// The allocation made `handles`: each gets the stack.
    pub(crate) fn finish(self, handles: impl IntoIterator<Item = u128>) {
        let mut pending = self.stacks.lock();
        for handle in handles {
            pending.insert(handle, Arc::clone(&self.stack));
        }
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        RECORDING_HERE.with(|n| n.set(n.get() - 1));
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
    Ok(frames.into())
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

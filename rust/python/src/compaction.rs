//! Compaction (issue 5), converted for Python: `Pool.pause()` and the `Pause` it returns,
//! `Pool.move_blocks`, `Pool.compact_step`, `Pool.plan_compaction`, the out-of-memory handler
//! a compactor attaches, and pinning (`Block.pin`, `unpin`, `pinned`). `Pool`'s and `Block`'s
//! methods delegate here.
//!
//! The GIL: moving blocks runs without it; a Python mover is called with it (re-acquired from
//! the moving thread, which holds the pool's pause and no other lock). Nothing that waits for a
//! moving block waits with the GIL: pins are tried first and, when the block is being moved,
//! taken again without it. The out-of-memory handler is called with the GIL after the failed
//! allocation left the pool (no gate held), so it may pause and compact.

use std::cell::Cell;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use npumem_core::{CompactionMode, Error, Handle, Move, PauseToken, Transfer};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::args;
use crate::block::Block;
use crate::errors::{error, to_py, Kind};
use crate::gil::{detached, without_gil};
use crate::pool::Pool;

/// How long `Pool.pause()` waits by default (seconds).
const DEFAULT_PAUSE_TIMEOUT: f64 = 10.0;

/// A held pause of a pool: alloc and free calls of other threads wait until it is resumed
/// (`resume()`, leaving a `with` block, or garbage collection). The thread that paused may still
/// use the pool.
#[pyclass(module = "npumem._core", frozen)]
pub struct Pause {
    core: Arc<npumem_core::Pool>,
    pool: Py<Pool>,
    token: Mutex<Option<PauseToken>>,
}

impl Drop for Pause {
    fn drop(&mut self) {
        let token = self.token.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(token) = token {
            let _ = self.core.resume(&token);
        }
    }
}

fn in_use() -> PyErr {
    error(Kind::PoolBusy, "this pause is in use by another call (a compaction or a mover running under it)")
}

impl Pause {
    /// Run `work` with the token, if the pause still holds.
    fn with_token<T>(&self, work: impl FnOnce(&PauseToken) -> PyResult<T>) -> PyResult<T> {
        let guard = match self.token.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Err(in_use()),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        match guard.as_ref() {
            Some(token) => work(token),
            None => Err(to_py(Error::NotPaused)),
        }
    }
}

#[pymethods]
impl Pause {
    /// Let the pool run again (nothing happens if it was resumed already).
    fn resume(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = match self.token.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Err(in_use()),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        if let Some(token) = guard.as_ref() {
            let core = &self.core;
            without_gil(py, || core.resume(token))?;
            *guard = None;
        }
        Ok(())
    }

    /// Whether this pause still holds the pool.
    #[getter]
    fn held(&self) -> bool {
        match self.token.try_lock() {
            Ok(guard) => guard.as_ref().is_some_and(|t| self.core.holds(t)),
            Err(_) => true, // in use by a call under it
        }
    }

    /// The paused pool.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<Pool> {
        self.pool.clone_ref(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Resume on leaving the `with` block.
    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.resume(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("<npumem.Pause of pool {} held={}>", self.core.id(), self.held())
    }
}

/// Pins a block while a `with` block runs (`Block.pinned()`).
#[pyclass(module = "npumem._core", frozen)]
pub struct Pinned {
    block: Py<Block>,
    core: Arc<npumem_core::Pool>,
    handle: Handle,
}

#[pymethods]
impl Pinned {
    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<Block>> {
        pin(py, &self.core, self.handle)?;
        Ok(self.block.clone_ref(py))
    }

    /// Unpin on leaving the `with` block.
    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.core.unpin(self.handle).map_err(to_py)?;
        Ok(false)
    }
}

/// `Block.pinned()`.
pub(crate) fn pinned(block: Py<Block>, core: Arc<npumem_core::Pool>, handle: Handle) -> Pinned {
    Pinned { block, core, handle }
}

/// Pin a block: at once, or (while it is being moved) waiting without the GIL.
pub(crate) fn pin(py: Python<'_>, core: &Arc<npumem_core::Pool>, handle: Handle) -> PyResult<u32> {
    match core.try_pin(handle) {
        Err(Error::Moving) => without_gil(py, || core.pin(handle)),
        other => other.map_err(to_py),
    }
}

/// `Pool.pause(timeout)`.
pub(crate) fn pause(slf: &Bound<'_, Pool>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Pause> {
    let seconds = match timeout.filter(|t| !t.is_none()) {
        Some(t) => {
            let s: f64 = t.extract().map_err(|_| {
                error(Kind::ArgumentType, format!("timeout must be a number of seconds, got {}", args::type_name(t)))
            })?;
            if !(s.is_finite() && s >= 0.0) {
                return Err(error(Kind::InvalidArgument, format!("timeout must be >= 0 seconds, got {s}")));
            }
            s.min(3600.0)
        }
        None => DEFAULT_PAUSE_TIMEOUT,
    };
    let core = slf.get().core.clone();
    let token = without_gil(slf.py(), || core.pause(Duration::from_secs_f64(seconds)))?;
    Ok(Pause { core, pool: slf.clone().unbind(), token: Mutex::new(Some(token)) })
}

/// The pause object an argument names (it must pause this pool).
fn pause_of<'a>(pool: &Pool, value: &'a Bound<'_, PyAny>) -> PyResult<&'a Pause> {
    let pause = value
        .cast::<Pause>()
        .map_err(|_| {
            error(Kind::ArgumentType, format!("pause must be an npumem.Pause, got {}", args::type_name(value)))
        })?
        .get();
    if !Arc::ptr_eq(&pause.core, &pool.core) {
        return Err(error(Kind::InvalidArgument, "the pause belongs to another pool"));
    }
    Ok(pause)
}

/// A mover for the core: calls the Python callable with `[(src, dst, nbytes), ...]`, keeping
/// the exception it raised.
fn call_mover(mover: &Py<PyAny>, batch: &[Transfer], raised: &mut Option<PyErr>) -> Result<(), String> {
    Python::attach(|py| {
        let list = PyList::new(py, batch.iter().map(|t| (t.src, t.dst, t.len)))?;
        mover.call1(py, (list,)).map(|_| ())
    })
    .map_err(|e| {
        let why = e.to_string();
        *raised = Some(e);
        why
    })
}

/// Map a core error, or give back the mover's own exception when the mover failed.
fn mover_error(err: Error, raised: Option<PyErr>) -> PyErr {
    match (err, raised) {
        (Error::MoverFailed(_), Some(e)) => e,
        (err, _) => to_py(err),
    }
}

fn check_mover<'py>(mover: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Py<PyAny>>> {
    match mover.filter(|m| !m.is_none()) {
        Some(m) if m.is_callable() => Ok(Some(m.clone().unbind())),
        Some(m) => Err(error(Kind::ArgumentType, format!("mover must be callable, got {}", args::type_name(m)))),
        None => Ok(None),
    }
}

/// `Pool.move_blocks(pause, moves, mover=None)`: returns the copies made, in order.
pub(crate) fn move_blocks<'py>(
    slf: &Bound<'py, Pool>,
    pause: &Bound<'py, PyAny>,
    moves: &Bound<'py, PyAny>,
    mover: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let py = slf.py();
    let pool = slf.get();
    let pause = pause_of(pool, pause)?;
    let mover = check_mover(mover)?;
    let items = moves.try_iter().map_err(|_| {
        error(
            Kind::ArgumentType,
            format!("moves must be an iterable of (Block, offset), got {}", args::type_name(moves)),
        )
    })?;
    let mut batch = Vec::new();
    for (i, item) in items.enumerate() {
        let item = item?;
        let pair = item.cast::<PyTuple>().ok().filter(|t| t.len() == 2).ok_or_else(|| {
            error(
                Kind::ArgumentType,
                format!("moves[{i}] must be a (Block, offset) pair, got {}", args::type_name(&item)),
            )
        })?;
        let block = pair.get_item(0)?;
        let block = block.cast::<Block>().map_err(|_| {
            error(Kind::ArgumentType, format!("moves[{i}][0] must be an npumem.Block, got {}", args::type_name(&block)))
        })?;
        let handle = block.get().handle_in(pool, i)?;
        let to = args::integer(&pair.get_item(1)?, &format!("moves[{i}][1]"), Kind::ArgumentType)?;
        let to = usize::try_from(to)
            .map_err(|_| error(Kind::InvalidArgument, format!("moves[{i}][1] must be an offset >= 0, got {to}")))?;
        batch.push(Move { handle, to });
    }
    let core = &pool.core;
    let done = pause.with_token(|token| {
        let mut raised: Option<PyErr> = None;
        let result = detached(py, || match &mover {
            Some(m) => core.move_blocks(token, &batch, Some(&mut |b: &[Transfer]| call_mover(m, b, &mut raised))),
            None => core.move_blocks(token, &batch, None),
        });
        result.map_err(|e| mover_error(e, raised))
    })?;
    PyList::new(py, done.transfers.iter().map(|t| (t.src, t.dst, t.len)))
}

/// The mode of a compaction from its Python arguments.
fn mode_of(
    mode: &str,
    max_bytes: Option<&Bound<'_, PyAny>>,
    chunks: Option<&Bound<'_, PyAny>>,
) -> PyResult<CompactionMode> {
    match mode {
        "full" => Ok(CompactionMode::Full),
        "incremental" => {
            let n = match max_bytes.filter(|m| !m.is_none()) {
                Some(m) => args::integer(m, "max_bytes", Kind::ArgumentType)?,
                None => return Err(error(Kind::InvalidArgument, "mode=\"incremental\" needs max_bytes")),
            };
            if n <= 0 {
                return Err(error(Kind::InvalidArgument, format!("max_bytes must be greater than 0, got {n}")));
            }
            Ok(CompactionMode::Incremental { max_bytes: usize::try_from(n).unwrap_or(usize::MAX) })
        }
        "evacuate" => {
            let Some(list) = chunks.filter(|c| !c.is_none()) else {
                return Err(error(Kind::InvalidArgument, "mode=\"evacuate\" needs chunks"));
            };
            let items = list.try_iter().map_err(|_| {
                error(Kind::ArgumentType, format!("chunks must be an iterable of ints, got {}", args::type_name(list)))
            })?;
            let mut out = Vec::new();
            for (i, item) in items.enumerate() {
                let c = args::integer(&item?, &format!("chunks[{i}]"), Kind::ArgumentType)?;
                out.push(usize::try_from(c).map_err(|_| {
                    error(Kind::InvalidArgument, format!("chunks[{i}] must be a chunk index >= 0, got {c}"))
                })?);
            }
            Ok(CompactionMode::Evacuate { chunks: out })
        }
        other => Err(error(
            Kind::InvalidArgument,
            format!("mode must be \"full\", \"incremental\" or \"evacuate\", got {other:?}"),
        )),
    }
}

/// `Pool.compact_step(pause, mode, max_bytes=None, chunks=None, mover=None)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn compact_step<'py>(
    slf: &Bound<'py, Pool>,
    pause: &Bound<'py, PyAny>,
    mode: &str,
    max_bytes: Option<&Bound<'py, PyAny>>,
    chunks: Option<&Bound<'py, PyAny>>,
    mover: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let py = slf.py();
    let pool = slf.get();
    let pause = pause_of(pool, pause)?;
    let mode = mode_of(mode, max_bytes, chunks)?;
    let mover = check_mover(mover)?;
    let core = &pool.core;
    let done = pause.with_token(|token| {
        let mut raised: Option<PyErr> = None;
        let result = detached(py, || match &mover {
            Some(m) => core.compact_step(token, &mode, Some(&mut |b: &[Transfer]| call_mover(m, b, &mut raised))),
            None => core.compact_step(token, &mode, None),
        });
        result.map_err(|e| mover_error(e, raised))
    })?;
    let d = PyDict::new(py);
    d.set_item("blocks", done.blocks)?;
    d.set_item("bytes", done.bytes)?;
    d.set_item("batches", done.batches)?;
    d.set_item("transfers", done.transfers)?;
    d.set_item("chunks_freed", done.chunks_freed)?;
    d.set_item("planning_s", done.planning.as_secs_f64())?;
    d.set_item("moving_s", done.moving.as_secs_f64())?;
    Ok(d)
}

/// `Pool.plan_compaction(mode, max_bytes=None, chunks=None, pause=None, mover=None)`.
pub(crate) fn plan_compaction<'py>(
    slf: &Bound<'py, Pool>,
    mode: &str,
    max_bytes: Option<&Bound<'py, PyAny>>,
    chunks: Option<&Bound<'py, PyAny>>,
    pause: Option<&Bound<'py, PyAny>>,
    mover: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let py = slf.py();
    let pool = slf.get();
    let mode = mode_of(mode, max_bytes, chunks)?;
    let with_mover = check_mover(mover)?.is_some();
    let core = &pool.core;
    let plan = match pause.filter(|p| !p.is_none()) {
        Some(p) => pause_of(pool, p)?
            .with_token(|token| without_gil(py, || core.plan_compaction_with(Some(token), &mode, with_mover)))?,
        None => without_gil(py, || core.plan_compaction_with(None, &mode, with_mover))?,
    };
    let d = PyDict::new(py);
    d.set_item("blocks", plan.blocks)?;
    d.set_item("bytes", plan.bytes)?;
    d.set_item("chunks_emptied", plan.chunks_emptied)?;
    d.set_item("bytes_free", plan.bytes_free)?;
    d.set_item("largest_free_before", plan.largest_free_before)?;
    d.set_item("largest_free_after", plan.largest_free_after)?;
    let moves = PyList::new(py, plan.moves.iter().map(|m| (m.kind, m.from, m.to, m.bytes, m.blocks)))?;
    d.set_item("moves", moves)?;
    Ok(d)
}

// ----- the out-of-memory handler ---------------------------------------------------------------

thread_local! {
    /// Set while this thread runs a pool's out-of-memory handler (an allocation inside it does
    /// not call the handler again).
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

/// Call the pool's out-of-memory handler for a request of `nbytes`; whether to retry.
fn ask_handler(slf: &Bound<'_, Pool>, nbytes: usize) -> PyResult<bool> {
    let handler =
        slf.get().oom_handler.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|h| h.clone_ref(slf.py()));
    let Some(handler) = handler else { return Ok(false) };
    if IN_HANDLER.with(Cell::get) {
        return Ok(false);
    }
    IN_HANDLER.with(|f| f.set(true));
    let answer = handler.call1(slf.py(), (nbytes,)).and_then(|r| r.is_truthy(slf.py()));
    IN_HANDLER.with(|f| f.set(false));
    answer
}

fn is_out_of_memory(err: &Error) -> bool {
    matches!(err.root(), Error::OutOfMemory { .. })
}

/// The slow part of `Pool.alloc` (without the GIL); on out-of-memory the handler may compact,
/// then the allocation is tried once more.
pub(crate) fn alloc_retrying(slf: &Bound<'_, Pool>, size: usize, align: Option<usize>, tag: u32) -> PyResult<Handle> {
    let core = &slf.get().core;
    match detached(slf.py(), || core.alloc(size, align, tag)) {
        Err(err) if is_out_of_memory(&err) => {
            if ask_handler(slf, size)? {
                let handle = without_gil(slf.py(), || core.alloc(size, align, tag))?;
                core.forgive_failure(); // it did not raise after all
                Ok(handle)
            } else {
                Err(to_py(err))
            }
        }
        other => other.map_err(to_py),
    }
}

/// `Pool.alloc_many` without the GIL, with the same retry.
pub(crate) fn alloc_many_retrying(
    slf: &Bound<'_, Pool>,
    sizes: &[usize],
    align: Option<usize>,
    tag: u32,
) -> PyResult<Vec<Handle>> {
    let core = &slf.get().core;
    match detached(slf.py(), || core.alloc_many(sizes, align, tag)) {
        Err(err) if is_out_of_memory(&err) => {
            if ask_handler(slf, sizes.iter().sum())? {
                let handles = without_gil(slf.py(), || core.alloc_many(sizes, align, tag))?;
                core.forgive_failure();
                Ok(handles)
            } else {
                Err(to_py(err))
            }
        }
        other => other.map_err(to_py),
    }
}

/// `Pool.set_oom_handler(handler)`: `handler(nbytes) -> bool` or `None`; returns the previous.
pub(crate) fn set_oom_handler(slf: &Bound<'_, Pool>, handler: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
    let new = if handler.is_none() {
        None
    } else if handler.is_callable() {
        Some(handler.clone().unbind())
    } else {
        return Err(error(
            Kind::ArgumentType,
            format!("the out-of-memory handler must be callable or None, got {}", args::type_name(handler)),
        ));
    };
    let mut slot = slf.get().oom_handler.lock().unwrap_or_else(|p| p.into_inner());
    Ok(std::mem::replace(&mut *slot, new))
}

/// `Pool.oom_handler`.
pub(crate) fn oom_handler(slf: &Bound<'_, Pool>) -> Option<Py<PyAny>> {
    slf.get().oom_handler.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|h| h.clone_ref(slf.py()))
}

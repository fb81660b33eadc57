//! `npumem._core.PagedKV`: the paged KV cache over a pool, as Python sees it (the Python class
//! `npumem.kv.KVCache` derives from it). The bookkeeping is npumem-core's `kv::PageTable`; this
//! file supplies its pages (one reservation, or a block of the pool per page), copies pages for
//! copy-on-write, and converts arguments, results and errors.
//!
//! Threads: the table sits behind a mutex of the cache's own (the pool's alloc/free paths stay
//! lock-free), taken in turns ([`Turns`]): a call takes the turn at once when nobody holds it or
//! waits for it, else it draws a ticket and waits for its turn without the GIL; the call that
//! ends hands the turn to the next ticket. No thread ever waits for the turn while it holds the
//! GIL, so a thread that has the turn may always wait for the GIL (to go on after work it did
//! without the GIL, or after its wait): the GIL's holder lets it go without needing the turn.
//! Python code called under the mutex (a mover, the pool's out-of-memory handler, a finalizer
//! that the garbage collector runs while the call makes Python objects) must not call the cache
//! again: such a call raises `PoolBusyError` instead of waiting for itself. The eviction
//! callback runs with the mutex released.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use npumem_core::kv::{FreeList, KvError, PageSource, PageTable};
use npumem_core::Handle;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple};

use crate::args;
use crate::errors::{caused_by, error, to_py, with_figures, ErrorClass};
use crate::gil::{detached, without_gil};
use crate::pinned::read_block;
use crate::pool::pending::{retry_later, Pending};
use crate::pool::state::Pool;
use crate::user_code;

/// Retries after `on_evict` calls that freed no page of an on-demand cache, before giving up.
const MAX_IDLE_EVICTIONS: u32 = 8;

/// Where the pages are.
enum Pages {
    /// Every page inside one block of the pool: page `i` at `offset(block) + i * page_bytes`.
    Reserved { block: Handle, free: FreeList },
    /// A block of the pool per page (`handles[page]`); page numbers of freed pages are reused.
    OnDemand { handles: Vec<Option<Handle>>, spare: Vec<u32> },
}

struct State {
    table: PageTable,
    pages: Pages,
    evictions: u64,
    closed: bool,
}

/// The shape of the cache.
#[derive(Clone, Copy)]
struct Geometry {
    num_layers: usize,
    num_kv_heads: usize,
    head_dim: usize,
    dtype_bytes: usize,
    page_tokens: usize,
    bytes_per_token: usize,
    page_bytes: usize,
    capacity_pages: Option<usize>,
}

/// The engine of `npumem.kv.KVCache`: sequences of fixed-size pages in a pool, shared by
/// reference count.
#[pyclass(module = "npumem._core", subclass, frozen)]
pub struct PagedKV {
    pool: Py<Pool>,
    core: Arc<npumem_core::Pool>,
    geometry: Geometry,
    tag: Py<PyString>,
    /// The pool's id of `tag`.
    tag_id: u32,
    /// Taken only by the thread whose turn it is ([`PagedKV::lock`]).
    state: Mutex<State>,
    turns: Turns,
    on_evict: Mutex<Option<Py<PyAny>>>,
    mover: Mutex<Option<Py<PyAny>>>,
    /// `State::closed`, readable without the mutex: set (after the pages went back) by the
    /// close that sets that, and never cleared.
    closed: AtomicBool,
    /// The fork generation (`npumem_core::fork_generation`) of the process whose thread took
    /// the turn last, stamped right after it took it: a turn held with another generation's
    /// stamp was taken by a thread of the parent process, before a `fork()`.
    locked_in: AtomicU64,
}

/// Turns at a cache's state, first come, first served: the thread that ends its call hands the
/// turn to the thread that has waited longest, so a thread that calls the cache again and
/// again cannot take it back ahead of the threads waiting for it.
///
/// The queue's own mutex is held for a few instructions at a time and never while waiting for
/// anything else (the wait for a turn lets it go), so a thread that holds the GIL may wait for
/// it; [`Turns::try_take`] does not, so that a queue whose mutex a thread of the parent
/// process held at a `fork()` cannot stop a child's thread that holds the GIL.
#[derive(Default)]
struct Turns {
    queue: Mutex<Queue>,
    handed_on: Condvar,
    /// The mark ([`thread_mark`]) of the thread that has the turn, 0 when none: a call of that
    /// thread that finds the turn taken is a call from inside one of its own calls (Python code
    /// that the call runs: a mover, the pool's out-of-memory handler, a finalizer that the
    /// garbage collector runs), which would wait for itself.
    holder: AtomicUsize,
}

#[derive(Default)]
struct Queue {
    /// The next ticket to draw.
    next: u64,
    /// The ticket whose turn it is: `serving == next` when nobody has the turn.
    serving: u64,
}

impl Turns {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the turn if nobody has it or waits for it. Never waits (`false` also while another
    /// thread is inside the queue's mutex).
    fn try_take(&self) -> bool {
        let mut queue = match self.queue.try_lock() {
            Ok(queue) => queue,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        if queue.serving != queue.next {
            return false;
        }
        queue.next += 1;
        self.holder.store(thread_mark(), Ordering::Relaxed);
        true
    }

    /// Whether the calling thread has the turn.
    fn held_here(&self) -> bool {
        self.holder.load(Ordering::Relaxed) == thread_mark()
    }

    /// Draw a ticket and wait until its turn comes. Blocks: never called with the GIL.
    fn wait_for_turn(&self) {
        let mut queue = self.queue();
        let ticket = queue.next;
        queue.next += 1;
        while queue.serving != ticket {
            queue = self.handed_on.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
        self.holder.store(thread_mark(), Ordering::Relaxed);
    }

    /// End the turn: the next ticket's turn comes.
    fn hand_on(&self) {
        self.holder.store(0, Ordering::Relaxed);
        let mut queue = self.queue();
        queue.serving += 1;
        let waiting = queue.serving != queue.next;
        drop(queue);
        if waiting {
            self.handed_on.notify_all();
        }
    }
}

/// A turn taken ([`PagedKV::lock`]): handed on when dropped.
struct Turn<'a>(&'a Turns);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.hand_on();
    }
}

/// The state of a cache while the calling thread has the turn.
struct Held<'a> {
    /// Declared before the turn: let go before the turn is handed on.
    state: MutexGuard<'a, State>,
    _turn: Turn<'a>,
}

impl Deref for Held<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        &self.state
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

/// The error of a call to a cache whose turn a thread of the parent process held at the fork
/// ([`PagedKV::wait_for_turn`]).
fn forked_mid_call() -> PyErr {
    error(
        ErrorClass::PoolBusy,
        "this process was forked while another thread was inside a call of this KV cache: that call never \
         finishes in this child, so the cache cannot be used here; make a new one in the child",
    )
}

/// How long a call waits for a turn stamped with another fork generation before it takes the
/// holder for a thread of the parent (one that took it an instant ago and has not stamped it
/// yet would be done in microseconds).
const FORKED_HOLDER_GRACE: Duration = Duration::from_secs(1);

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

/// A number that tells the calling thread from every other live thread.
fn thread_mark() -> usize {
    THREAD_MARK.with(|m| m as *const u8 as usize)
}

/// A sequence id: an int in the signed 64-bit range (not a bool).
#[inline]
fn seq_id(value: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if let Ok(int) = value.cast::<PyInt>() {
        if !value.is_instance_of::<PyBool>() {
            return match int.extract::<i64>() {
                Ok(id) => Ok(id),
                // The text through `str()`, whose signal handlers' exception (Ctrl-C) is raised.
                Err(_) => Err(error(
                    ErrorClass::InvalidArgument,
                    format!("{name} = {} is outside the signed 64-bit range", int.str()?.to_string_lossy()),
                )),
            };
        }
    }
    // Anything else through its `__index__`, whose own exception is the caller's.
    let id = args::integer(value, name, ErrorClass::ArgumentType)?;
    i64::try_from(id)
        .map_err(|_| error(ErrorClass::InvalidArgument, format!("{name} = {id} is outside the signed 64-bit range")))
}

/// A count of tokens: an int >= 0 (not a bool).
#[inline]
fn count(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if let Ok(int) = value.cast::<PyInt>() {
        if !value.is_instance_of::<PyBool>() {
            return match int.extract::<u64>() {
                Ok(n) => Ok(n),
                Err(_) => Err(error(
                    ErrorClass::InvalidArgument,
                    format!("{name} must be an int >= 0 that fits in 64 bits, got {}", int.str()?.to_string_lossy()),
                )),
            };
        }
    }
    let n = args::integer(value, name, ErrorClass::ArgumentType)?;
    u64::try_from(n).map_err(|_| {
        error(ErrorClass::InvalidArgument, format!("{name} must be an int >= 0 that fits in 64 bits, got {n}"))
    })
}

/// A shape argument: an int from 1 to the largest 64-bit count (not a bool).
fn positive(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let refuse = |got: &str| {
        error(ErrorClass::InvalidArgument, format!("{name} must be an int > 0 that fits in 64 bits, got {got}"))
    };
    let n = args::int_value(value, name, ErrorClass::ArgumentType)?.map_err(|text| refuse(&text))?;
    u64::try_from(n).ok().filter(|&n| n > 0).and_then(|n| usize::try_from(n).ok()).ok_or_else(|| refuse(&n.to_string()))
}

/// Ints from a list, a tuple, a buffer of int64 (a numpy array) or any iterable but text and
/// bytes (whose items are characters or bytes, not ids or counts).
fn ints<T>(
    value: &Bound<'_, PyAny>,
    name: &str,
    mut convert: impl FnMut(&Bound<'_, PyAny>, usize) -> PyResult<T>,
    from_i64: impl Fn(i64, usize) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() || value.is_instance_of::<PyByteArray>()
    {
        return Err(error(
            ErrorClass::ArgumentType,
            format!("{name} must be a sequence of ints, got {}", args::type_name(value)),
        ));
    }
    if let Ok(list) = value.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            out.push(convert(&item, i)?);
        }
        return Ok(out);
    }
    if let Ok(tuple) = value.cast::<PyTuple>() {
        let mut out = Vec::with_capacity(tuple.len());
        for (i, item) in tuple.iter().enumerate() {
            out.push(convert(&item, i)?);
        }
        return Ok(out);
    }
    if value.is_instance_of::<PySet>() || value.is_instance_of::<PyFrozenSet>() {
        return Err(error(
            ErrorClass::ArgumentType,
            format!("{name} must be a sequence of ints in order, got an unordered {}", args::type_name(value)),
        ));
    }
    if let Ok(buffer) = PyBuffer::<i64>::get(value) {
        if buffer.dimensions() != 1 {
            return Err(error(
                ErrorClass::InvalidArgument,
                format!("{name} must be one-dimensional, got an array of {} dimensions", buffer.dimensions()),
            ));
        }
        let items = buffer.to_vec(value.py())?;
        return items.into_iter().enumerate().map(|(i, v)| from_i64(v, i)).collect();
    }
    let items = value.try_iter().map_err(|_| {
        error(ErrorClass::ArgumentType, format!("{name} must be a sequence of ints, got {}", args::type_name(value)))
    })?;
    let mut out = Vec::new();
    for (i, item) in user_code::each(items).enumerate() {
        out.push(convert(&item?, i)?);
    }
    Ok(out)
}

/// The bytes of `data` for a page: any object with the buffer protocol, read as bytes
/// (bytes, bytearray, memoryview, a numpy array; contiguous).
fn page_bytes(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    let refused = || {
        error(
            ErrorClass::ArgumentType,
            format!(
                "data must be bytes or a contiguous buffer (bytearray, memoryview, array), got {}",
                args::type_name(data)
            ),
        )
    };
    let view = pyo3::types::PyMemoryView::from(data).map_err(|_| refused())?;
    let raw = view.call_method1("cast", ("B",)).map_err(|_| refused())?;
    let bytes = raw.call_method0("tobytes")?;
    Ok(bytes.cast::<PyBytes>().map_err(|_| refused())?.as_bytes().to_vec())
}

/// A page table refusal as a Python exception (a sequence too long for the table:
/// [`Source::refusal`], which has the figures).
fn refusal(err: KvError<PyErr>) -> PyErr {
    match err {
        KvError::Source(err) => err,
        other => error(ErrorClass::InvalidArgument, other.to_string()),
    }
}

fn out_of_pages(py: Python<'_>, needed: usize, free: usize, geometry: &Geometry) -> PyErr {
    let page = geometry.page_bytes;
    let reserved = geometry.capacity_pages.unwrap_or(0);
    let message = format!(
        "the KV cache needs {needed} page(s) of {page} bytes and {free} of its {reserved} reserved pages are free"
    );
    let made = ErrorClass::OutOfMemory.class(py).and_then(|cls| {
        let figures = (message.clone(), needed.saturating_mul(page), free.saturating_mul(page), free.min(1) * page);
        user_code::call(cls, figures)
    });
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(_) => PyMemoryError::new_err(message),
    }
}

/// The page source of one call: the cache's pages, with the GIL.
struct Source<'a, 'py> {
    py: Python<'py>,
    kv: &'a PagedKV,
    pages: &'a mut Pages,
    /// Set when `take` found too few pages: the error the call then returns is the shortage
    /// that `on_evict` may relieve (a mover's own `MemoryError` is not).
    short: bool,
}

impl Source<'_, '_> {
    /// A page table refusal as a Python exception. A sequence longer than the table can hold
    /// is a `RequestTooLargeError` with the figures of an out-of-memory error: the bytes the
    /// tokens asked for (exact, as a Python int) and what is free, in the cache's reservation
    /// or, for pages on demand, in the pool.
    fn refusal(&self, err: KvError<PyErr>) -> PyErr {
        let KvError::TooManyTokens { tokens, .. } = err else { return refusal(err) };
        let py = self.py;
        let page = self.kv.geometry.page_bytes;
        let (bytes_free, largest_free_block) = match &*self.pages {
            Pages::Reserved { free, .. } => (free.free().saturating_mul(page), free.free().min(1) * page),
            Pages::OnDemand { .. } => {
                let core = &self.kv.core;
                let stats = detached(py, || core.stats());
                (stats.bytes_free, stats.largest_free_block)
            }
        };
        let requested = PyInt::new(py, tokens).into_any().mul(self.kv.geometry.bytes_per_token);
        match requested {
            Ok(requested) => {
                with_figures(ErrorClass::RequestTooLarge, err.to_string(), &requested, bytes_free, largest_free_block)
            }
            Err(failed) => failed,
        }
    }

    /// A fresh block for a page, from the pool (its out-of-memory handler may run).
    fn alloc_page(&self) -> PyResult<Handle> {
        let kv = self.kv;
        alloc_block(self.py, kv, kv.pool.get(), kv.geometry.page_bytes, kv.tag_id)
    }

    /// The offsets of `pages` now (blocks may have moved since a compaction).
    fn offsets(&self, pages: &[u32], out: &mut Vec<i64>) -> PyResult<()> {
        let core = &self.kv.core;
        let info = |h: Handle| read_block(self.py, core, h).map_err(to_py);
        match &*self.pages {
            Pages::Reserved { block, .. } => {
                let base = info(*block)?.offset;
                let page = self.kv.geometry.page_bytes;
                out.extend(pages.iter().map(|&p| (base + p as usize * page) as i64));
            }
            Pages::OnDemand { handles, .. } => {
                for &p in pages {
                    let h = handles[p as usize].expect("a held page has a block");
                    out.push(info(h)?.offset as i64);
                }
            }
        }
        Ok(())
    }

    /// The block and the byte within it where page `index` of `seq` starts, and the page.
    fn locate(&self, table: &PageTable, seq: i64, index: u64) -> PyResult<(Handle, usize, u32)> {
        let pages = table.pages(seq).map_err(refusal)?;
        let Some(&page) = usize::try_from(index).ok().and_then(|i| pages.get(i)) else {
            return Err(error(
                ErrorClass::InvalidArgument,
                format!("sequence {seq} has {} page(s), there is no page {index}", pages.len()),
            ));
        };
        Ok(match &*self.pages {
            Pages::Reserved { block, .. } => (*block, page as usize * self.kv.geometry.page_bytes, page),
            Pages::OnDemand { handles, .. } => (handles[page as usize].expect("a held page has a block"), 0, page),
        })
    }

    /// The blocks behind `pages` (to pin them while their bytes are copied).
    fn blocks_of(&self, pages: &[(u32, u32)]) -> Vec<Handle> {
        match &*self.pages {
            Pages::Reserved { block, .. } => vec![*block],
            Pages::OnDemand { handles, .. } => pages
                .iter()
                .flat_map(|&(a, b)| [a, b])
                .map(|p| handles[p as usize].expect("a copied page has a block"))
                .collect(),
        }
    }
}

impl PageSource for Source<'_, '_> {
    type Error = PyErr;

    fn take(&mut self, count: usize, out: &mut Vec<u32>) -> PyResult<()> {
        if let Pages::Reserved { free, .. } = &mut *self.pages {
            return free.take(count, out).map_err(|e| {
                self.short = true;
                out_of_pages(self.py, e.needed, e.free, &self.kv.geometry)
            });
        }
        let start = out.len();
        for _ in 0..count {
            match self.alloc_page() {
                Ok(handle) => {
                    let Pages::OnDemand { handles, spare } = &mut *self.pages else { unreachable!() };
                    let page = match spare.pop() {
                        Some(page) => page,
                        None => {
                            handles.push(None);
                            (handles.len() - 1) as u32
                        }
                    };
                    handles[page as usize] = Some(handle);
                    out.push(page);
                }
                Err(err) => {
                    let taken: Vec<u32> = out.drain(start..).collect();
                    for page in taken {
                        self.give_back(page);
                    }
                    self.short = err.is_instance_of::<PyMemoryError>(self.py);
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    fn give_back(&mut self, page: u32) {
        match &mut *self.pages {
            Pages::Reserved { free, .. } => free.give_back(page),
            Pages::OnDemand { handles, spare } => {
                if let Some(handle) = handles[page as usize].take() {
                    self.kv.free_block(handle);
                }
                spare.push(page);
            }
        }
    }

    fn copy(&mut self, pairs: &[(u32, u32)]) -> PyResult<()> {
        let py = self.py;
        let kv = self.kv;
        let page_bytes = kv.geometry.page_bytes;
        let blocks = self.blocks_of(pairs);
        let core = kv.core.clone();
        // Pinned, the pages stay where they are while their bytes are copied.
        without_gil(py, || -> npumem_core::Result<()> {
            for (i, &h) in blocks.iter().enumerate() {
                if let Err(err) = core.pin(h) {
                    for &done in &blocks[..i] {
                        let _ = core.unpin(done);
                    }
                    return Err(err);
                }
            }
            Ok(())
        })?;
        let copied = (|| -> PyResult<()> {
            let flat: Vec<u32> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
            let mut offsets = Vec::with_capacity(flat.len());
            self.offsets(&flat, &mut offsets)?;
            if kv.core.has_backing() {
                let (base, _) = kv.core.host_ptr(blocks[0]).map_err(to_py)?;
                let base = base.as_ptr().wrapping_sub(match &*self.pages {
                    Pages::Reserved { block, .. } => kv.core.try_block(*block).map_err(to_py)?.offset,
                    Pages::OnDemand { .. } => kv.core.try_block(blocks[0]).map_err(to_py)?.offset,
                });
                for pair in offsets.chunks_exact(2) {
                    // SAFETY: both pages are live, pinned blocks (or pinned pages of one block) of
                    // `page_bytes` bytes inside the arena, which starts at `base`; a fresh
                    // destination page never overlaps its source.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            base.wrapping_add(pair[0] as usize),
                            base.wrapping_add(pair[1] as usize),
                            page_bytes,
                        )
                    };
                }
                return Ok(());
            }
            let mover = kv.mover.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|m| m.clone_ref(py));
            if let Some(mover) = mover {
                let transfers: Vec<(i64, i64, usize)> =
                    offsets.chunks_exact(2).map(|pair| (pair[0], pair[1], page_bytes)).collect();
                kv.calling_python(|| user_code::call(mover.bind(py), (transfers,)))?;
            }
            Ok(())
        })();
        for &h in &blocks {
            let _ = kv.core.unpin(h);
        }
        copied
    }

    fn available(&self) -> usize {
        match &*self.pages {
            Pages::Reserved { free, .. } => free.free(),
            Pages::OnDemand { .. } => {
                let core = &self.kv.core;
                let page = self.kv.geometry.page_bytes;
                detached(self.py, || core.blocks_available(page))
            }
        }
    }
}

/// Who runs Python code while a block is allocated (the pool's out-of-memory handler).
trait CallsPython {
    fn calling_python<T>(&self, work: impl FnOnce() -> T) -> T;
}

/// Before the cache exists, nothing can call it back.
impl CallsPython for () {
    fn calling_python<T>(&self, work: impl FnOnce() -> T) -> T {
        work()
    }
}

impl CallsPython for PagedKV {
    fn calling_python<T>(&self, work: impl FnOnce() -> T) -> T {
        PagedKV::calling_python(self, work)
    }
}

/// A block of `size` bytes from `pool`, tagged `tag_id` (the pool counts it under the tag):
/// the fast path, else the full one with the pool's out-of-memory handler (run through
/// `caller`).
fn alloc_block(py: Python<'_>, caller: &impl CallsPython, pool: &Pool, size: usize, tag_id: u32) -> PyResult<Handle> {
    let core = &pool.core;
    match core.try_alloc_fast(size, None, tag_id).map_err(to_py) {
        Ok(Some(handle)) => Ok(handle),
        Ok(None) => caller.calling_python(|| pool.oom.alloc(py, core, size, None, tag_id)),
        Err(err) => Err(err),
    }
}

impl PagedKV {
    /// Run Python code under the state mutex: a call back into the cache from it finds the
    /// turn held by its own thread and is refused rather than waiting for itself
    /// ([`PagedKV::lock`]).
    fn calling_python<T>(&self, work: impl FnOnce() -> T) -> T {
        crate::oom::under_lock(work)
    }

    /// The state, locked: at once when nobody has the turn or waits for it, else after waiting
    /// for the turn without the GIL.
    #[inline]
    fn lock(&self, py: Python<'_>) -> PyResult<Held<'_>> {
        if self.turns.try_take() {
            self.stamp();
        } else {
            if self.turns.held_here() {
                return Err(error(
                    ErrorClass::PoolBusy,
                    "the KV cache was called from Python code that one of its own calls runs on this \
                     thread (a mover, the pool's out-of-memory handler, a finalizer the garbage \
                     collector ran); call it after that call returns",
                ));
            }
            // The turn comes while this thread waits without the GIL, and it takes the GIL back
            // with the turn held (see the module's comment).
            if !detached(py, || self.wait_for_turn()) {
                return Err(forked_mid_call());
            }
        }
        let turn = Turn(&self.turns);
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                unreachable!("the state is taken only with the turn, and let go before the turn is handed on")
            }
        };
        if state.closed {
            return Err(error(ErrorClass::InvalidHandle, "the KV cache is closed: its pages went back to the pool"));
        }
        Ok(Held { state, _turn: turn })
    }

    /// Wait until this thread's turn comes (stamped); false when the turn's holder is a thread
    /// of the parent process, which never hands it on: the turn stays stamped with another
    /// fork generation for [`FORKED_HOLDER_GRACE`]. Such a turn is never waited for in line
    /// (the queue behind it never moves), only tried again now and then.
    fn wait_for_turn(&self) -> bool {
        let started = Instant::now();
        loop {
            if self.locked_in.load(Ordering::Acquire) == npumem_core::fork_generation() {
                // Held by a thread of this process: it hands the turn on.
                self.turns.wait_for_turn();
                self.stamp();
                return true;
            }
            if self.turns.try_take() {
                self.stamp();
                return true;
            }
            if started.elapsed() >= FORKED_HOLDER_GRACE {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Stamp the turn just taken with this process's fork generation.
    #[inline]
    fn stamp(&self) {
        let generation = npumem_core::fork_generation();
        if self.locked_in.load(Ordering::Relaxed) != generation {
            self.locked_in.store(generation, Ordering::Release);
        }
    }

    /// Run `op` on the table with a page source; when the pages run out and `on_evict` is set,
    /// call it (without the mutex) and try again while it returns true and frees something.
    fn with_pages<T>(
        &self,
        py: Python<'_>,
        needed: impl Fn(&PageTable) -> Result<usize, KvError<PyErr>>,
        mut op: impl FnMut(&mut PageTable, &mut Source<'_, '_>, bool) -> Result<T, KvError<PyErr>>,
    ) -> PyResult<T> {
        let mut retry = false;
        let mut idle = 0;
        loop {
            let (err, pages_needed, in_use) = {
                let mut guard = self.lock(py)?;
                let state = &mut *guard;
                let mut source = Source { py, kv: self, pages: &mut state.pages, short: false };
                match op(&mut state.table, &mut source, retry) {
                    Ok(value) => return Ok(value),
                    Err(KvError::Source(err)) if source.short => {
                        let pages_needed = needed(&state.table).unwrap_or(0);
                        (err, pages_needed, state.table.counts().pages_in_use)
                    }
                    Err(err) => return Err(source.refusal(err)),
                }
            };
            let handler = self.on_evict.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|h| h.clone_ref(py));
            let Some(handler) = handler else { return Err(err) };
            match user_code::call(handler.bind(py), (pages_needed,)).and_then(|answer| user_code::is_truthy(&answer)) {
                Ok(true) => {}
                Ok(false) => return Err(err),
                // A callback that failed (raised, or answered with something that has no truth
                // value): the call fails as it would have, with that exception as its cause, as
                // for the pool's out-of-memory handler. Ctrl-C and exits go through as they are.
                Err(raised) => return Err(caused_by(py, err, raised)),
            }
            retry = true;
            let mut state = self.lock(py)?;
            state.evictions += 1;
            // The callback made progress when it freed a page of the cache, or when the call
            // needs fewer pages now: a sequence it freed drops out of a batch, and a shared page
            // that lost holders may no longer need copying.
            let progress =
                state.table.counts().pages_in_use < in_use || needed(&state.table).is_ok_and(|now| now < pages_needed);
            if !progress {
                // Pages on demand may have found room elsewhere in the pool (a compaction): a
                // few such tries, then give up.
                idle += 1;
                if matches!(state.pages, Pages::Reserved { .. }) || idle > MAX_IDLE_EVICTIONS {
                    return Err(err);
                }
            }
        }
    }

    /// Free a block of the pool without waiting: a free the pool cannot take now (paused by
    /// another thread, the block being moved) waits in the pool's stranded frees, as the free
    /// of a collected `Block` does, and is made at the next flush, resumed pause or `stats()`.
    /// A block the cache gives up is never lost, and no call of the cache waits out a pause.
    fn free_block(&self, handle: Handle) {
        let pool = self.pool.get();
        match self.core.try_free(handle) {
            Ok(()) => {}
            Err(err) if retry_later(&err) => {
                // The stranded free gives back a hold on the cache's tag when it is made: take
                // that hold now, so the tag outlives a cache closed before the free.
                let tag_id = if pool.core.tags().hold(self.tag_id, 1).is_ok() { self.tag_id } else { 0 };
                pool.pending.strand(Pending { handle, tag_id });
            }
            // The block is no longer allocated (nothing else frees a cache's blocks).
            Err(_) => {}
        }
    }

    fn with_source<T>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut PageTable, &mut Source<'_, '_>) -> T,
    ) -> PyResult<T> {
        let mut guard = self.lock(py)?;
        let state = &mut *guard;
        let mut source = Source { py, kv: self, pages: &mut state.pages, short: false };
        Ok(work(&mut state.table, &mut source))
    }
}

#[pymethods]
impl PagedKV {
    #[new]
    #[pyo3(signature = (
        pool, *, num_layers, num_kv_heads, head_dim, dtype_bytes = None, page_tokens = None,
        capacity_tokens = None, tag = None, on_evict = None, mover = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pool: &Bound<'_, PyAny>,
        num_layers: &Bound<'_, PyAny>,
        num_kv_heads: &Bound<'_, PyAny>,
        head_dim: &Bound<'_, PyAny>,
        dtype_bytes: Option<&Bound<'_, PyAny>>,
        page_tokens: Option<&Bound<'_, PyAny>>,
        capacity_tokens: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
        on_evict: Option<&Bound<'_, PyAny>>,
        mover: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PagedKV> {
        let pool = pool.cast::<Pool>().map_err(|_| {
            error(ErrorClass::ArgumentType, format!("pool must be an npumem.Pool, got {}", args::type_name(pool)))
        })?;
        let num_layers = positive(num_layers, "num_layers")?;
        let num_kv_heads = positive(num_kv_heads, "num_kv_heads")?;
        let head_dim = positive(head_dim, "head_dim")?;
        let dtype_bytes = match given(dtype_bytes) {
            Some(v) => positive(&v, "dtype_bytes")?,
            None => 2,
        };
        let page_tokens = match given(page_tokens) {
            Some(v) => positive(&v, "page_tokens")?,
            None => 16,
        };
        if page_tokens > u32::MAX as usize {
            return Err(error(ErrorClass::InvalidArgument, format!("page_tokens = {page_tokens} is too large")));
        }
        let capacity = pool.get().core.capacity();
        let core = &pool.get().core;
        // A refusal carries the bytes asked for (the product of `factors`, exact as a Python
        // int however large) and the pool's free bytes and largest free block, as an
        // out-of-memory error does.
        let too_large = |what: String, factors: &[usize]| -> PyErr {
            let message = format!("{what} is larger than the pool ({capacity} bytes)");
            let requested = factors.iter().try_fold(PyInt::new(py, 1).into_any(), |product, &f| product.mul(f));
            match requested {
                Ok(requested) => {
                    let stats = detached(py, || core.stats());
                    with_figures(
                        ErrorClass::RequestTooLarge,
                        message,
                        &requested,
                        stats.bytes_free,
                        stats.largest_free_block,
                    )
                }
                Err(failed) => failed,
            }
        };
        let per_token = [num_layers, num_kv_heads, head_dim, 2, dtype_bytes];
        let bytes_per_token = per_token
            .into_iter()
            .try_fold(1usize, |a, b| a.checked_mul(b))
            .filter(|&b| b <= capacity)
            .ok_or_else(|| too_large("one token of KV cache".into(), &per_token))?;
        let page_bytes = bytes_per_token
            .checked_mul(page_tokens)
            .filter(|&b| b <= capacity)
            .ok_or_else(|| too_large(format!("one page ({page_tokens} tokens)"), &[bytes_per_token, page_tokens]))?;
        let tag = match given(tag) {
            Some(t) => {
                let tag = t.cast::<PyString>().map_err(|_| {
                    error(ErrorClass::ArgumentType, format!("tag must be a str, got {}", args::type_name(&t)))
                })?;
                args::tag(Some(tag.as_any()))?.unwrap_or_else(|| tag.clone())
            }
            None => PyString::new(py, "kv"),
        };
        let callable = |v: Option<Bound<'_, PyAny>>, name: &str| -> PyResult<Option<Py<PyAny>>> {
            match v {
                Some(v) if !v.is_callable() => Err(error(
                    ErrorClass::ArgumentType,
                    format!("{name} must be callable or None, got {}", args::type_name(&v)),
                )),
                other => Ok(other.map(Bound::unbind)),
            }
        };
        let on_evict = callable(given(on_evict), "on_evict")?;
        let mover = callable(given(mover), "mover")?;
        // The cache's pages carry its tag for its whole life: one hold, given back once the
        // pages are (by `close` or when the cache is dropped).
        let reserved = match given(capacity_tokens) {
            Some(v) => {
                let tokens = positive(&v, "capacity_tokens")?;
                let n = tokens.div_ceil(page_tokens);
                let bytes = n.checked_mul(page_bytes).filter(|&b| b <= capacity && n <= u32::MAX as usize).ok_or_else(
                    || {
                        too_large(
                            format!("capacity_tokens = {tokens} ({n} pages of {page_bytes} bytes)"),
                            &[n, page_bytes],
                        )
                    },
                )?;
                Some((n, bytes))
            }
            None => None,
        };
        let tag_id = pool.get().tags.acquire(py, &pool.get().core, Some(&tag), 1)?;
        let (pages, capacity_pages) = match reserved {
            Some((n, bytes)) => {
                let handle = alloc_block(py, &(), pool.get(), bytes, tag_id)
                    .inspect_err(|_| pool.get().tags.release(&pool.get().core, tag_id, 1))?;
                (Pages::Reserved { block: handle, free: FreeList::new(n as u32) }, Some(n))
            }
            None => (Pages::OnDemand { handles: Vec::new(), spare: Vec::new() }, None),
        };
        let geometry = Geometry {
            num_layers,
            num_kv_heads,
            head_dim,
            dtype_bytes,
            page_tokens,
            bytes_per_token,
            page_bytes,
            capacity_pages,
        };
        Ok(PagedKV {
            pool: pool.clone().unbind(),
            core: pool.get().core.clone(),
            geometry,
            tag: tag.unbind(),
            tag_id,
            state: Mutex::new(State { table: PageTable::new(page_tokens as u32), pages, evictions: 0, closed: false }),
            turns: Turns::default(),
            on_evict: Mutex::new(on_evict),
            mover: Mutex::new(mover),
            closed: AtomicBool::new(false),
            locked_in: AtomicU64::new(npumem_core::fork_generation()),
        })
    }

    /// Add sequence `seq_id` with pages for `num_tokens` tokens (its prompt).
    #[pyo3(signature = (seq_id, num_tokens = None))]
    fn add_sequence(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let seq = seq_id_arg(seq_id)?;
        let tokens = match num_tokens {
            Some(n) => count(n, "num_tokens")?,
            None => 0,
        };
        self.with_pages(py, |t| Ok(t.pages_for(tokens) as usize), |t, s, _| t.add(seq, tokens, s))
    }

    /// Grow sequence `seq_id` by `num_tokens` tokens; a fresh page only when the last one is
    /// full, a copy of the last page first when it is shared and partly filled.
    #[pyo3(signature = (seq_id, num_tokens = None))]
    fn append(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>, num_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let seq = seq_id_arg(seq_id)?;
        let tokens = match num_tokens {
            Some(n) => count(n, "num_tokens")?,
            None => 1,
        };
        self.with_pages(py, |t| t.pages_to_append(seq, tokens), |t, s, _| t.append(seq, tokens, s))
    }

    /// Grow every sequence of `seq_ids` by `num_tokens` (an int, or one int per sequence), all or
    /// none. A sequence may appear once.
    #[pyo3(signature = (seq_ids, num_tokens = None))]
    fn append_many(
        &self,
        py: Python<'_>,
        seq_ids: &Bound<'_, PyAny>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let seqs = ints(seq_ids, "seq_ids", |v, i| seq_id(v, &format!("seq_ids[{i}]")), |v, _| Ok(v))?;
        let per_seq: Option<Vec<u64>> = match num_tokens {
            None => None,
            // One count for every sequence: an int, or an int-like scalar (numpy's).
            Some(n) if n.is_instance_of::<PyInt>() || (n.try_iter().is_err() && n.hasattr("__index__")?) => {
                let n = count(n, "num_tokens")?;
                if n == 1 {
                    None
                } else {
                    Some(vec![n; seqs.len()])
                }
            }
            Some(n) if n.try_iter().is_err() => {
                return Err(error(
                    ErrorClass::ArgumentType,
                    format!("num_tokens must be an int or a sequence of ints, got {}", args::type_name(n)),
                ));
            }
            Some(n) => {
                let per = ints(
                    n,
                    "num_tokens",
                    |v, i| count(v, &format!("num_tokens[{i}]")),
                    |v, i| {
                        u64::try_from(v).map_err(|_| {
                            error(ErrorClass::InvalidArgument, format!("num_tokens[{i}] must be >= 0, got {v}"))
                        })
                    },
                )?;
                if per.len() != seqs.len() {
                    return Err(error(
                        ErrorClass::InvalidArgument,
                        format!("num_tokens has {} counts for {} sequences", per.len(), seqs.len()),
                    ));
                }
                Some(per)
            }
        };
        let tokens = |i: usize| per_seq.as_ref().map_or(1, |p| p[i]);
        // After `on_evict` ran, the sequences it freed drop out of the batch.
        let mut kept: Vec<usize> = Vec::new();
        self.with_pages(
            py,
            |t| Ok(t.pages_to_append_many(seqs.iter().copied(), tokens)),
            |t, s, retry| {
                if !retry {
                    return t.append_many(seqs.iter().copied(), tokens, s);
                }
                kept.clear();
                kept.extend((0..seqs.len()).filter(|&i| t.contains(seqs[i])));
                t.append_many(kept.iter().map(|&i| seqs[i]), |j| tokens(kept[j]), s)
            },
        )
    }

    /// Add sequence `child_id` sharing every page of `parent_id`.
    fn fork(&self, py: Python<'_>, parent_id: &Bound<'_, PyAny>, child_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let parent = seq_id(parent_id, "parent_id")?;
        let child = seq_id(child_id, "child_id")?;
        let mut state = self.lock(py)?;
        state.table.fork(parent, child).map_err(refusal)
    }

    /// Remove sequence `seq_id`; a page goes back when no sequence references it.
    fn free_sequence(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let seq = seq_id_arg(seq_id)?;
        self.with_source(py, |t, s| t.free(seq, s))?.map_err(refusal)
    }

    /// Tokens of sequence `seq_id`.
    fn num_tokens(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<u64> {
        let seq = seq_id_arg(seq_id)?;
        self.lock(py)?.table.num_tokens(seq).map_err(refusal)
    }

    /// Pages of sequence `seq_id`.
    fn num_pages(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let seq = seq_id_arg(seq_id)?;
        Ok(self.lock(py)?.table.pages(seq).map_err(refusal)?.len())
    }

    /// The pool offset of each page of `seq_id`, in order, as native int64 bytes.
    fn _block_table_bytes<'py>(&self, py: Python<'py>, seq_id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let seq = seq_id_arg(seq_id)?;
        let mut offsets = Vec::new();
        self.with_source(py, |t, s| -> PyResult<()> {
            let pages = t.pages(seq).map_err(refusal)?;
            s.offsets(pages, &mut offsets)
        })??;
        let bytes: Vec<u8> = offsets.iter().flat_map(|o| o.to_ne_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// The bytes of page `index` of `seq_id` (pools with host memory).
    fn read_page<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let seq = seq_id_arg(seq_id)?;
        let index = count(index, "index")?;
        let core = &self.core;
        let page = self.geometry.page_bytes;
        // Under the state mutex: a free of the sequence on another thread cannot give the page
        // to someone else in between.
        let bytes = self.with_source(py, |t, s| -> PyResult<Vec<u8>> {
            let (handle, at, _) = s.locate(t, seq, index)?;
            without_gil(py, || {
                let mut out = vec![0u8; page];
                core.read(handle, at, &mut out).map(|()| out)
            })
        })??;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Write `data` into page `index` of `seq_id` from byte `at` (pools with host memory). A
    /// page that other sequences hold too is refused (`InvalidArgumentError`, nothing written):
    /// its bytes are theirs as well; `append` gives a sequence its own copy of a shared last page.
    #[pyo3(signature = (seq_id, index, data, *, at = None))]
    fn write_page(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        index: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        at: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let seq = seq_id_arg(seq_id)?;
        let index = count(index, "index")?;
        let at = match at {
            Some(at) => usize::try_from(count(at, "at")?).unwrap_or(usize::MAX),
            None => 0,
        };
        let data = page_bytes(data)?;
        if at.checked_add(data.len()).is_none_or(|end| end > self.geometry.page_bytes) {
            return Err(error(
                ErrorClass::InvalidArgument,
                format!("{} bytes at {at} do not fit in a page of {} bytes", data.len(), self.geometry.page_bytes),
            ));
        }
        let core = &self.core;
        // Under the state mutex, as `read_page`: never into a page the sequence gave up, and
        // never into a page that other sequences hold too, whose bytes are theirs as well (full
        // pages never change; `append` gives a sequence its own copy of a shared last page).
        self.with_source(py, |t, s| -> PyResult<()> {
            let (handle, base, page) = s.locate(t, seq, index)?;
            let others = t.refs(page).saturating_sub(1);
            if others > 0 {
                return Err(error(
                    ErrorClass::InvalidArgument,
                    format!(
                        "page {index} of sequence {seq} is shared with {others} other sequence(s): \
                         writing it would change theirs too (append copies a shared last page first)"
                    ),
                ));
            }
            without_gil(py, || core.write(handle, base + at, &data))
        })?
    }

    /// Whether growing `seq_id` by `num_tokens` would find its pages now.
    #[pyo3(signature = (seq_id, num_tokens = None))]
    fn can_append(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let seq = seq_id_arg(seq_id)?;
        let tokens = match num_tokens {
            Some(n) => count(n, "num_tokens")?,
            None => 1,
        };
        self.with_source(py, |t, s| -> PyResult<bool> {
            let needed = t.pages_to_append(seq, tokens).map_err(|e| s.refusal(e))?;
            Ok(needed == 0 || needed <= s.available())
        })?
    }

    /// Whether a sequence of `num_tokens` tokens would find its pages now.
    fn can_add(&self, py: Python<'_>, num_tokens: &Bound<'_, PyAny>) -> PyResult<bool> {
        let tokens = count(num_tokens, "num_tokens")?;
        self.with_source(py, |t, s| {
            let needed = t.pages_for(tokens);
            needed == 0 || needed <= s.available() as u64
        })
    }

    /// Whether sequence `seq_id` is in the cache.
    fn __contains__(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(seq) = seq_id_arg(seq_id) else { return Ok(false) };
        Ok(self.lock(py)?.table.contains(seq))
    }

    /// Sequences in the cache.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.lock(py)?.table.len())
    }

    /// Whether the cache holds a sequence. A closed cache holds none (closing freed them):
    /// false, where `len()` refuses it as every other call does.
    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(false);
        }
        match self.lock(py) {
            Ok(state) => Ok(!state.table.is_empty()),
            // Closed by another thread meanwhile.
            Err(_) if self.closed.load(Ordering::Acquire) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// The ids of the sequences, in increasing order.
    fn sequences(&self, py: Python<'_>) -> PyResult<Vec<i64>> {
        let mut ids: Vec<i64> = self.lock(py)?.table.sequences().collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// The counts behind `stats()`, as a dict.
    fn _stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (counts, free, evictions) = {
            let mut guard = self.lock(py)?;
            let state = &mut *guard;
            let source = Source { py, kv: self, pages: &mut state.pages, short: false };
            (state.table.counts(), source.available(), state.evictions)
        };
        let g = &self.geometry;
        let d = PyDict::new(py);
        let total = g.capacity_pages.unwrap_or(counts.pages_in_use + free);
        d.set_item("sequences", counts.sequences)?;
        d.set_item("pages_total", total)?;
        d.set_item("pages_free", free)?;
        d.set_item("pages_in_use", counts.pages_in_use)?;
        d.set_item("pages_shared", counts.pages_shared)?;
        d.set_item("pages_logical", counts.pages_logical)?;
        d.set_item("tokens", counts.tokens)?;
        d.set_item("waste_bytes", counts.waste_tokens as u128 * g.bytes_per_token as u128)?;
        d.set_item("shared_saved_bytes", (counts.pages_logical - counts.pages_in_use) as u128 * g.page_bytes as u128)?;
        d.set_item("copies", counts.copies)?;
        d.set_item("bytes_copied", counts.copies as u128 * g.page_bytes as u128)?;
        d.set_item("evictions", evictions)?;
        d.set_item("page_bytes", g.page_bytes)?;
        d.set_item("preallocated", g.capacity_pages.is_some())?;
        Ok(d)
    }

    /// Every page in the pool as `(offset, references)`, by offset: 0 references for a free
    /// page of the reservation.
    fn _pages(&self, py: Python<'_>) -> PyResult<Vec<(i64, u32)>> {
        let out = self.with_source(py, |t, s| -> PyResult<Vec<(i64, u32)>> {
            let held: Vec<(u32, u32)> = match &*s.pages {
                Pages::Reserved { free, .. } => (0..free.pages()).map(|p| (p, t.refs(p))).collect(),
                Pages::OnDemand { .. } => t.held_pages().collect(),
            };
            let numbers: Vec<u32> = held.iter().map(|h| h.0).collect();
            let mut offsets = Vec::with_capacity(numbers.len());
            s.offsets(&numbers, &mut offsets)?;
            let mut pages: Vec<(i64, u32)> = offsets.into_iter().zip(held.iter().map(|h| h.1)).collect();
            pages.sort_unstable();
            Ok(pages)
        })??;
        Ok(out)
    }

    /// Free every sequence and give every page back to the pool; later calls raise
    /// `InvalidHandleError`. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = match self.lock(py) {
            Ok(guard) => guard,
            Err(err) if err.is_instance_of::<pyo3::exceptions::PyValueError>(py) => return Ok(()),
            Err(err) => return Err(err),
        };
        let state = &mut *guard;
        let mut source = Source { py, kv: self, pages: &mut state.pages, short: false };
        state.table.clear(&mut source);
        if let Pages::Reserved { block, .. } = state.pages {
            self.free_block(block);
        }
        state.closed = true;
        self.closed.store(true, Ordering::Release);
        self.pool.get().tags.release(&self.core, self.tag_id, 1);
        Ok(())
    }

    /// Bytes of one token: layers x KV heads x head dim x 2 (K and V) x dtype bytes.
    #[getter]
    fn bytes_per_token(&self) -> usize {
        self.geometry.bytes_per_token
    }

    /// Bytes of one page: `bytes_per_token * page_tokens`.
    #[getter]
    fn page_bytes(&self) -> usize {
        self.geometry.page_bytes
    }

    #[getter]
    fn page_tokens(&self) -> usize {
        self.geometry.page_tokens
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.geometry.num_layers
    }

    #[getter]
    fn num_kv_heads(&self) -> usize {
        self.geometry.num_kv_heads
    }

    #[getter]
    fn head_dim(&self) -> usize {
        self.geometry.head_dim
    }

    #[getter]
    fn dtype_bytes(&self) -> usize {
        self.geometry.dtype_bytes
    }

    /// Tokens the reservation holds (whole pages), or None when pages come on demand.
    #[getter]
    fn capacity_tokens(&self) -> Option<usize> {
        self.geometry.capacity_pages.map(|p| p * self.geometry.page_tokens)
    }

    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<Pool> {
        self.pool.clone_ref(py)
    }

    #[getter]
    fn tag(&self, py: Python<'_>) -> Py<PyString> {
        self.tag.clone_ref(py)
    }

    /// Whether the cache is closed. Never waits: a mover or an out-of-memory handler that a
    /// call of this cache runs may ask (that call holds the cache), and so may a forked child.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Called as `on_evict(pages_needed)` when pages run out; a true result retries the call.
    #[getter]
    fn get_on_evict(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.on_evict.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|h| h.clone_ref(py))
    }

    #[setter]
    fn set_on_evict(&self, handler: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let handler = handler.filter(|h| !h.is_none());
        if let Some(h) = handler {
            if !h.is_callable() {
                return Err(error(
                    ErrorClass::ArgumentType,
                    format!("on_evict must be callable or None, got {}", args::type_name(h)),
                ));
            }
        }
        *self.on_evict.lock().unwrap_or_else(|p| p.into_inner()) = handler.map(|h| h.clone().unbind());
        Ok(())
    }

    /// Called as `mover([(src, dst, nbytes)])` to copy pages on a pool without host memory.
    #[getter]
    fn mover(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.mover.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|h| h.clone_ref(py))
    }

    fn __traverse__(&self, visit: pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        // The pool too: a pool whose out-of-memory handler holds this cache is a cycle (the
        // pool's `__clear__` breaks it).
        visit.call(&self.pool)?;
        for slot in [&self.on_evict, &self.mover] {
            if let Ok(held) = slot.try_lock() {
                visit.call(held.as_ref())?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        for slot in [&self.on_evict, &self.mover] {
            if let Ok(mut held) = slot.try_lock() {
                held.take();
            }
        }
    }
}

/// An optional argument that was given (not None).
fn given<'py>(value: Option<&Bound<'py, PyAny>>) -> Option<Bound<'py, PyAny>> {
    value.filter(|v| !v.is_none()).cloned()
}

#[inline]
fn seq_id_arg(value: &Bound<'_, PyAny>) -> PyResult<i64> {
    seq_id(value, "seq_id")
}

impl Drop for PagedKV {
    /// Pages go back to the pool with the cache.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if state.closed {
            return;
        }
        let blocks: Vec<Handle> = match &state.pages {
            Pages::Reserved { block, .. } => vec![*block],
            Pages::OnDemand { handles, .. } => handles.iter().flatten().copied().collect(),
        };
        for handle in blocks {
            self.free_block(handle);
        }
        self.pool.get().tags.release(&self.core, self.tag_id, 1);
    }
}

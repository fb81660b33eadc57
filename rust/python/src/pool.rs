//! `npumem.Pool`: the arena, as Python sees it.

use std::sync::Arc;

use npumem_core::{Backing, Placement, PoolConfig};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::args;
use crate::block::Block;
use crate::errors::{error, to_py, Kind};
use crate::gil::without_gil;
use crate::monitor;
use crate::stats::PoolStats;

/// A pool over one arena: allocate blocks from any thread, read `stats()`, `check()` it.
#[pyclass(module = "npumem._core", frozen)]
pub struct Pool {
    pub(crate) core: Arc<npumem_core::Pool>,
    name: Py<PyString>,
    /// Tag strings by id (id 0 means no tag), and ids by string.
    tag_names: Py<PyList>,
    tag_ids: Py<PyDict>,
    /// Called when an allocation fails for lack of memory (compaction, issue 5).
    pub(crate) oom_handler: std::sync::Mutex<Option<Py<PyAny>>>,
}

fn config_error(message: String) -> PyErr {
    error(Kind::Config, format!("invalid pool configuration: {message}"))
}

impl Pool {
    /// The id of `tag` (interned on first use), 0 for none.
    fn tag_id(&self, py: Python<'_>, tag: Option<&Bound<'_, PyString>>) -> PyResult<u32> {
        let Some(tag) = tag else { return Ok(0) };
        let ids = self.tag_ids.bind(py);
        if let Some(id) = ids.get_item(tag)? {
            return id.extract();
        }
        let names = self.tag_names.bind(py);
        let id = names.len() as u32;
        names.append(tag)?;
        ids.set_item(tag, id)?;
        Ok(id)
    }

    /// The tag string of an id (None for 0 or unknown ids).
    pub(crate) fn tag_name<'py>(&self, py: Python<'py>, id: u32) -> Option<Bound<'py, PyAny>> {
        if id == 0 {
            return None;
        }
        self.tag_names.bind(py).get_item(id as usize).ok()
    }

    pub(crate) fn alloc_block(
        slf: &Bound<'_, Self>,
        nbytes: &Bound<'_, PyAny>,
        align: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Block> {
        let py = slf.py();
        let this = slf.get();
        let capacity = this.core.capacity();
        let size = args::size(nbytes, "nbytes", capacity)?;
        let align = args::alignment(align, capacity)?;
        let tag = args::tag(tag)?;
        let tag_id = this.tag_id(py, tag.as_ref())?;
        let core = &this.core;
        let handle = match core.try_alloc_fast(size, align, tag_id).map_err(to_py)? {
            Some(handle) => handle,
            None => crate::compaction::alloc_retrying(slf, size, align, tag_id)?,
        };
        Ok(Block::new(slf.clone().unbind(), handle, size, tag.map(Bound::unbind)))
    }
}

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(
        signature = (
            capacity, *, cores = None, chunk_size = None, min_block = None, bank_size = None,
            alignment = None, slab_sizes = None, backing = None, placement = None,
            core_reserve = None, name = None,
        ),
        text_signature = "(capacity, *, cores=None, chunk_size=2097152, min_block=256, bank_size=4096, \
            alignment=64, slab_sizes=(64, 128, 256, 512, 1024, 2048, 4096), backing='host', \
            placement='best-fit', core_reserve=1, name=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: &Bound<'_, PyAny>,
        cores: Option<&Bound<'_, PyAny>>,
        chunk_size: Option<&Bound<'_, PyAny>>,
        min_block: Option<&Bound<'_, PyAny>>,
        bank_size: Option<&Bound<'_, PyAny>>,
        alignment: Option<&Bound<'_, PyAny>>,
        slab_sizes: Option<&Bound<'_, PyAny>>,
        backing: Option<&Bound<'_, PyAny>>,
        placement: Option<&Bound<'_, PyAny>>,
        core_reserve: Option<&Bound<'_, PyAny>>,
        name: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Pool> {
        let cores = match cores.filter(|c| !c.is_none()) {
            Some(c) => args::config_int(c, "cores")?,
            None => py.import("os")?.call_method0("cpu_count")?.extract::<Option<usize>>()?.unwrap_or(1),
        };
        let defaults = PoolConfig::new(0);
        let field = |value: Option<&Bound<'_, PyAny>>, name: &str, default: usize| match value.filter(|v| !v.is_none())
        {
            Some(v) => args::config_int(v, name),
            None => Ok(default),
        };
        let mut config = PoolConfig::new(args::config_int(capacity, "capacity")?)
            .cores(cores)
            .chunk_size(field(chunk_size, "chunk_size", defaults.chunk_size)?)
            .min_block(field(min_block, "min_block", defaults.min_block)?)
            .bank_size(field(bank_size, "bank_size", defaults.bank_size)?)
            .alignment(field(alignment, "alignment", defaults.alignment)?)
            .core_reserve(field(core_reserve, "core_reserve", defaults.core_reserve)?);
        if let Some(sizes) = slab_sizes.filter(|s| !s.is_none()) {
            if sizes.is_instance_of::<PyString>() {
                return Err(config_error("slab_sizes must be a sequence of ints, got str".into()));
            }
            let items = sizes.try_iter().map_err(|_| {
                config_error(format!("slab_sizes must be a sequence of ints, got {}", args::type_name(sizes)))
            })?;
            let mut list = Vec::new();
            for (i, item) in items.enumerate() {
                list.push(args::config_int(&item?, &format!("slab_sizes[{i}]"))?);
            }
            config = config.slab_sizes(list);
        }
        let choice = |value: Option<&Bound<'_, PyAny>>, default: &str| -> PyResult<String> {
            match value.filter(|v| !v.is_none()) {
                Some(v) => Ok(v.extract::<String>().unwrap_or_else(|_| format!("<{}>", args::type_name(v)))),
                None => Ok(default.to_string()),
            }
        };
        config = config.backing(match choice(backing, "host")?.as_str() {
            "host" => Backing::Host,
            "none" => Backing::None,
            other => return Err(config_error(format!("backing must be \"host\" or \"none\", got {other:?}"))),
        });
        config = config.placement(match choice(placement, "best-fit")?.as_str() {
            "best-fit" => Placement::BestFit,
            "first-fit" => Placement::FirstFit,
            other => {
                return Err(config_error(format!("placement must be \"best-fit\" or \"first-fit\", got {other:?}")))
            }
        });
        let core = without_gil(py, || npumem_core::Pool::new(config))?;
        let name = match name.filter(|n| !n.is_none()) {
            Some(n) => n
                .cast::<PyString>()
                .map_err(|_| config_error(format!("name must be a str, got {}", args::type_name(n))))?
                .clone(),
            None => PyString::new(py, &format!("pool-{}", core.id())),
        };
        Ok(Pool {
            core: Arc::new(core),
            name: name.unbind(),
            tag_names: PyList::new(py, [py.None()])?.unbind(),
            tag_ids: PyDict::new(py).unbind(),
            oom_handler: std::sync::Mutex::new(None),
        })
    }

    /// Allocate a block of `nbytes` bytes. `align` (a power of two) overrides the pool's default
    /// alignment; `tag` is a free-form label shown in stats and snapshots.
    #[pyo3(signature = (nbytes, *, align = None, tag = None))]
    fn alloc(
        slf: &Bound<'_, Self>,
        nbytes: &Bound<'_, PyAny>,
        align: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Block> {
        Self::alloc_block(slf, nbytes, align, tag)
    }

    /// Allocate one block per size in `sizes` (all with the same `align` and `tag`), or none:
    /// if one allocation fails, the blocks already made are freed and the error says which
    /// one failed and why.
    #[pyo3(signature = (sizes, *, align = None, tag = None))]
    fn alloc_many(
        slf: &Bound<'_, Self>,
        sizes: &Bound<'_, PyAny>,
        align: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Block>> {
        let py = slf.py();
        let this = slf.get();
        let capacity = this.core.capacity();
        let items = sizes.try_iter().map_err(|_| {
            error(Kind::ArgumentType, format!("sizes must be an iterable of ints, got {}", args::type_name(sizes)))
        })?;
        let mut wanted = Vec::new();
        for (i, item) in items.enumerate() {
            wanted.push(args::size_named(&item?, || format!("sizes[{i}]"), capacity)?);
        }
        let align = args::alignment(align, capacity)?;
        let tag = args::tag(tag)?;
        let tag_id = this.tag_id(py, tag.as_ref())?;
        let handles = crate::compaction::alloc_many_retrying(slf, &wanted, align, tag_id)?;
        let pool = slf.clone().unbind();
        Ok(handles
            .into_iter()
            .zip(wanted)
            .map(|(handle, size)| {
                Block::new(pool.clone_ref(py), handle, size, tag.as_ref().map(|t| t.clone().unbind()))
            })
            .collect())
    }

    /// Free every block of `blocks`, or none: all are checked first (blocks of this pool,
    /// alive, not pinned, no block twice) and the error names the first that is not.
    fn free_many(slf: &Bound<'_, Self>, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let items = blocks.try_iter().map_err(|_| {
            error(
                Kind::ArgumentType,
                format!("blocks must be an iterable of npumem.Block, got {}", args::type_name(blocks)),
            )
        })?;
        let mut handles = Vec::new();
        for (i, item) in items.enumerate() {
            let item = item?;
            let block = item.cast::<Block>().map_err(|_| {
                error(
                    Kind::ArgumentType,
                    format!("blocks[{i}] must be an npumem.Block, got {}", args::type_name(&item)),
                )
            })?;
            handles.push(block.get().handle_in(slf.get(), i)?);
        }
        let core = &slf.get().core;
        without_gil(py, || core.free_many(&handles))
    }

    /// Free `block` (the same as `block.free()`).
    fn free(slf: &Bound<'_, Self>, block: &Bound<'_, PyAny>) -> PyResult<()> {
        let block = block.cast::<Block>().map_err(|_| {
            error(Kind::ArgumentType, format!("free() takes an npumem.Block, got {}", args::type_name(block)))
        })?;
        block.get().free_in(slf.py(), slf.get())
    }

    /// A snapshot of the pool's state and counters.
    fn stats(&self, py: Python<'_>) -> PyResult<PoolStats> {
        let core = &self.core;
        let stats = without_gil(py, || Ok(core.stats()))?;
        Ok(PoolStats::from_core(stats, self.core.config().capacity))
    }

    /// Pause the pool and prove its metadata consistent; raises `CorruptionError` with the
    /// findings otherwise. Returns the number of live blocks checked.
    fn check(&self, py: Python<'_>) -> PyResult<usize> {
        let core = &self.core;
        without_gil(py, || core.check())
    }

    /// Every live block, in offset order, as dicts: offset, nbytes, block_bytes, align, core,
    /// tag, pins.
    fn blocks<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let core = &self.core;
        let blocks = without_gil(py, || Ok(core.blocks()))?;
        blocks
            .into_iter()
            .map(|b| {
                let d = PyDict::new(py);
                d.set_item("offset", b.offset)?;
                d.set_item("nbytes", b.size)?;
                d.set_item("block_bytes", b.block_bytes)?;
                d.set_item("align", b.align)?;
                d.set_item("core", b.core)?;
                d.set_item("tag", self.tag_name(py, b.tag))?;
                d.set_item("pins", b.pins)?;
                Ok(d)
            })
            .collect()
    }

    // ----- monitoring (issue 6): conversions in monitor.rs ---------------------------------

    /// Pause the pool and return an `npumem.monitor.Snapshot`: every live block, every maximal
    /// free run, and the stats, all at one moment.
    fn snapshot<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        monitor::snapshot(slf.py(), slf)
    }

    /// Start a fresh event trace of up to `capacity` events (all cores together; the oldest are
    /// overwritten when full). Pauses the pool briefly.
    #[pyo3(signature = (capacity = None), text_signature = "(self, capacity=65536)")]
    fn trace_start(&self, py: Python<'_>, capacity: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        monitor::trace_start(py, self, capacity)
    }

    /// Stop recording; events recorded so far stay until drained.
    fn trace_stop(&self, py: Python<'_>) -> PyResult<()> {
        monitor::trace_stop(py, self)
    }

    /// The events recorded since the last drain, oldest first, as tuples
    /// `(time_ns, kind, offset, size, core, tag, handle, aux)`.
    fn trace_drain<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        monitor::trace_drain(py, self)
    }

    /// Where the trace stands: enabled, capacity, recorded, drained, dropped.
    fn trace_status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        monitor::trace_status(py, self)
    }

    /// `"best-fit"` or `"first-fit"`: how the global pool places chunk runs.
    #[getter]
    fn placement(&self) -> &'static str {
        match self.core.config().placement {
            Placement::BestFit => "best-fit",
            Placement::FirstFit => "first-fit",
        }
    }

    /// Empty chunks each core keeps in reserve.
    #[getter]
    fn core_reserve(&self) -> usize {
        self.core.config().core_reserve
    }

    // ----- end of monitoring -------------------------------------------------------------

    // ----- compaction (issue 5): conversions in compaction.rs ------------------------------

    /// Pause the pool: wait (at most `timeout` seconds) for alloc and free calls in flight, then
    /// hold other threads' calls until the returned `Pause` is resumed, each at most `timeout`
    /// seconds (then it raises `PoolBusyError`, having done nothing). The calling thread may
    /// still use the pool.
    #[pyo3(signature = (timeout = None), text_signature = "(self, timeout=10.0)")]
    fn pause(slf: &Bound<'_, Self>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<crate::compaction::Pause> {
        crate::compaction::pause(slf, timeout)
    }

    /// Move blocks while `pause` holds the pool: `moves` are `(block, offset)` pairs, validated
    /// before anything moves; `mover(transfers)` copies the bytes of `backing="none"` pools.
    /// Returns the copies made, in order, as `(src, dst, nbytes)`.
    #[pyo3(signature = (pause, moves, *, mover = None))]
    fn move_blocks<'py>(
        slf: &Bound<'py, Self>,
        pause: &Bound<'py, PyAny>,
        moves: &Bound<'py, PyAny>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        crate::compaction::move_blocks(slf, pause, moves, mover)
    }

    /// One compaction while `pause` holds the pool: `mode` is `"full"`, `"incremental"` (with
    /// `max_bytes`) or `"evacuate"` (with `chunks`). Returns what it did, as a dict.
    #[pyo3(signature = (pause, mode = "full", *, max_bytes = None, chunks = None, mover = None))]
    fn compact_step<'py>(
        slf: &Bound<'py, Self>,
        pause: &Bound<'py, PyAny>,
        mode: &str,
        max_bytes: Option<&Bound<'py, PyAny>>,
        chunks: Option<&Bound<'py, PyAny>>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::compaction::compact_step(slf, pause, mode, max_bytes, chunks, mover)
    }

    /// What `compact_step` would do, moving nothing (pauses the pool briefly unless `pause`
    /// holds it already); with `mover`, as `compact_step` with that mover would.
    #[pyo3(signature = (mode = "full", *, max_bytes = None, chunks = None, pause = None, mover = None))]
    fn plan_compaction<'py>(
        slf: &Bound<'py, Self>,
        mode: &str,
        max_bytes: Option<&Bound<'py, PyAny>>,
        chunks: Option<&Bound<'py, PyAny>>,
        pause: Option<&Bound<'py, PyAny>>,
        mover: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::compaction::plan_compaction(slf, mode, max_bytes, chunks, pause, mover)
    }

    /// Set the callable `handler(nbytes) -> bool` that a failing allocation calls before it
    /// raises `OutOfMemoryError` (a true result retries the allocation once), or `None`.
    /// Returns the previous handler.
    fn set_oom_handler(slf: &Bound<'_, Self>, handler: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        crate::compaction::set_oom_handler(slf, handler)
    }

    /// The out-of-memory handler, or None.
    #[getter]
    fn oom_handler(slf: &Bound<'_, Self>) -> Option<Py<PyAny>> {
        crate::compaction::oom_handler(slf)
    }

    fn __traverse__(&self, visit: pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Ok(handler) = self.oom_handler.try_lock() {
            visit.call(handler.as_ref())?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Ok(mut handler) = self.oom_handler.try_lock() {
            handler.take();
        }
    }

    // ----- end of compaction ---------------------------------------------------------------

    /// Give back what cores keep cached (all-free slabs, empty reserve chunks) now rather than
    /// when an allocation needs the room. Returns how many slabs and chunks went back.
    fn trim(&self, py: Python<'_>) -> PyResult<usize> {
        let core = &self.core;
        without_gil(py, || Ok(core.trim()))
    }

    /// Bytes in the arena.
    #[getter]
    fn capacity(&self) -> usize {
        self.core.capacity()
    }

    /// Number of per-core pools.
    #[getter]
    fn cores(&self) -> usize {
        self.core.cores()
    }

    #[getter]
    fn chunk_size(&self) -> usize {
        self.core.config().chunk_size
    }

    #[getter]
    fn min_block(&self) -> usize {
        self.core.config().min_block
    }

    #[getter]
    fn bank_size(&self) -> usize {
        self.core.config().bank_size
    }

    #[getter]
    fn alignment(&self) -> usize {
        self.core.config().alignment
    }

    #[getter]
    fn slab_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.core.config().slab_sizes)
    }

    /// `"host"` or `"none"`.
    #[getter]
    fn backing(&self) -> &'static str {
        match self.core.config().backing {
            Backing::Host => "host",
            Backing::None => "none",
        }
    }

    /// The pool's name (labels its metrics).
    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<npumem.Pool {:?} capacity={} cores={} backing={}>",
            self.name.bind(py).to_string(),
            self.core.capacity(),
            self.core.cores(),
            self.backing()
        )
    }
}

//! `RawSnapshot`: the arena at one moment as the core records it (`Pool.raw_snapshot()`), and
//! the view that `Pool.snapshot()` makes of it.
//!
//! The view is a Python callable `view(pool, raw)` that the `npumem` package installs when it is
//! imported (`set_snapshot_view`): it builds an `npumem.monitor.Snapshot`. Importing
//! `npumem._core` imports `npumem` first, so a pool never exists without it; the binding itself
//! knows nothing of the monitoring package.

use std::sync::Mutex;

use npumem_core::Extent;
use pyo3::prelude::*;

use crate::args;
use crate::block_info::BlockInfo;
use crate::errors::{error, ErrorClass};
use crate::stats::PoolStats;
use crate::tags::Tags;

/// Every live block, every maximal free run, and the stats, all at one moment. Extents are
/// `(offset, length)` pairs in offset order.
#[pyclass(module = "npumem._core", frozen, get_all)]
pub struct RawSnapshot {
    /// When it was taken: nanoseconds since the pool was made (the trace's clock).
    time_ns: u64,
    /// Every live block, in offset order.
    blocks: Vec<BlockInfo>,
    /// Every maximal run of free bytes.
    free_runs: Vec<(usize, usize)>,
    /// Bytes inside slabs that no live object uses.
    slab_cached: Vec<(usize, usize)>,
    /// Allocated bytes that belong to no handle (raw-API blocks).
    untracked: Vec<(usize, usize)>,
    /// The stats at the same moment.
    stats: Py<PoolStats>,
}

fn extents(list: &[Extent]) -> Vec<(usize, usize)> {
    list.iter().map(|e| (e.offset, e.len)).collect()
}

impl RawSnapshot {
    pub(crate) fn from_core(
        py: Python<'_>,
        snap: npumem_core::Snapshot,
        tags: &Tags,
        capacity: usize,
    ) -> PyResult<RawSnapshot> {
        Ok(RawSnapshot {
            time_ns: snap.time_ns,
            blocks: snap.blocks.iter().map(|b| BlockInfo::from_core(py, b, tags)).collect(),
            free_runs: extents(&snap.free_runs),
            slab_cached: extents(&snap.slab_cached),
            untracked: extents(&snap.untracked),
            stats: Py::new(py, PoolStats::from_core(snap.stats, capacity))?,
        })
    }
}

#[pymethods]
impl RawSnapshot {
    fn __repr__(&self) -> String {
        format!(
            "<npumem._core.RawSnapshot at {} ns: {} blocks, {} free runs>",
            self.time_ns,
            self.blocks.len(),
            self.free_runs.len()
        )
    }
}

/// The installed snapshot view, if any.
static VIEW: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

/// Install `view(pool, raw)`, the callable that `Pool.snapshot()` hands each raw snapshot to.
#[pyfunction]
pub(crate) fn set_snapshot_view(view: &Bound<'_, PyAny>) -> PyResult<()> {
    if !view.is_callable() {
        return Err(error(
            ErrorClass::ArgumentType,
            format!("the snapshot view must be callable, got {}", args::type_name(view)),
        ));
    }
    *VIEW.lock().unwrap_or_else(|p| p.into_inner()) = Some(view.clone().unbind());
    Ok(())
}

/// What `Pool.snapshot()` returns: the installed view of `raw` (`raw` itself without one).
pub(crate) fn present<'py>(pool: &Bound<'py, PyAny>, raw: RawSnapshot) -> PyResult<Bound<'py, PyAny>> {
    let py = pool.py();
    let view = VIEW.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|v| v.clone_ref(py));
    let raw = Bound::new(py, raw)?.into_any();
    match view {
        Some(view) => view.bind(py).call1((pool, raw)),
        None => Ok(raw),
    }
}

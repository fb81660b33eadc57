//! `RawSnapshot`: the arena at one moment as the core records it (`Pool.raw_snapshot()`).
//! `Pool.snapshot()` hands it to the snapshot view that the Python package installs (`views.rs`).

use npumem_core::Extent;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::args;
use crate::block_info::BlockInfo;
use crate::py_alloc;
use crate::stats::PoolStats;
use crate::tag_stats::TagStats;
use crate::tags::Tags;

/// Every live block, every maximal free run, and the stats, all at one moment. Extents are
/// `(offset, length)` pairs in offset order. Each list is made when it is read, fallibly
/// (`MemoryError` when the host has no memory for it).
#[pyclass(module = "npumem._core", frozen)]
pub struct RawSnapshot {
    /// When it was taken: nanoseconds since the pool was made (the trace's clock).
    #[pyo3(get)]
    time_ns: u64,
    blocks: Vec<BlockInfo>,
    free_runs: Vec<Extent>,
    slab_cached: Vec<Extent>,
    untracked: Vec<Extent>,
    /// The stats at the same moment.
    #[pyo3(get)]
    stats: Py<PoolStats>,
    regions: Vec<Extent>,
}

/// `extents` as a list of `(offset, length)` tuples.
fn extents<'py>(py: Python<'py>, extents: &[Extent]) -> PyResult<Bound<'py, PyList>> {
    py_alloc::list(
        py,
        extents.iter().map(|e| {
            Ok(py_alloc::tuple(py, [e.offset.into_pyobject(py)?.into_any(), e.len.into_pyobject(py)?.into_any()])?
                .into_any())
        }),
    )
}

impl RawSnapshot {
    pub(crate) fn from_core(
        py: Python<'_>,
        snap: npumem_core::Snapshot,
        tags: &Tags,
        core: &npumem_core::Pool,
    ) -> PyResult<RawSnapshot> {
        // Read with the rest, under the snapshot's pause.
        let by_tag = snap.by_tag.into_iter().map(TagStats::from_core).collect();
        let mut blocks = Vec::new();
        for b in &snap.blocks {
            args::push_fallibly(&mut blocks, BlockInfo::from_core(py, b, tags, core), "the snapshot's blocks")?;
        }
        Ok(RawSnapshot {
            time_ns: snap.time_ns,
            blocks,
            free_runs: snap.free_runs,
            slab_cached: snap.slab_cached,
            untracked: snap.untracked,
            stats: Py::new(py, PoolStats::from_core(snap.stats, core.capacity(), by_tag))?,
            regions: snap.regions,
        })
    }
}

#[pymethods]
impl RawSnapshot {
    /// Every live block, in offset order.
    #[getter]
    fn blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        py_alloc::list(py, self.blocks.iter().map(|b| Ok(Bound::new(py, b.clone())?.into_any())))
    }

    /// Every maximal run of free bytes (all-free slabs and cached freed blocks included).
    #[getter]
    fn free_runs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        extents(py, &self.free_runs)
    }

    /// Bytes inside slabs that hold objects that no live object uses.
    #[getter]
    fn slab_cached<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        extents(py, &self.slab_cached)
    }

    /// Allocated bytes that belong to no handle (raw-API blocks).
    #[getter]
    fn untracked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        extents(py, &self.untracked)
    }

    /// The regions with memory behind them (one unless the pool grew); bytes outside them are
    /// absent: in none of the lists above.
    #[getter]
    fn regions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        extents(py, &self.regions)
    }

    fn __repr__(&self) -> String {
        format!(
            "<npumem._core.RawSnapshot at {} ns: {} blocks, {} free runs>",
            self.time_ns,
            self.blocks.len(),
            self.free_runs.len()
        )
    }
}

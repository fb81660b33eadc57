//! `RawSnapshot`: the arena at one moment as the core records it (`Pool.raw_snapshot()`).
//! `Pool.snapshot()` hands it to the snapshot view that the Python package installs (`views.rs`).

use npumem_core::Extent;
use pyo3::prelude::*;

use crate::block_info::BlockInfo;
use crate::stats::PoolStats;
use crate::tag_stats::TagStats;
use crate::tags::Tags;

/// Every live block, every maximal free run, and the stats, all at one moment. Extents are
/// `(offset, length)` pairs in offset order.
#[pyclass(module = "npumem._core", frozen, get_all)]
pub struct RawSnapshot {
    /// When it was taken: nanoseconds since the pool was made (the trace's clock).
    time_ns: u64,
    /// Every live block, in offset order.
    blocks: Vec<BlockInfo>,
    /// Every maximal run of free bytes (all-free slabs and cached freed blocks included).
    free_runs: Vec<(usize, usize)>,
    /// Bytes inside slabs that hold objects that no live object uses.
    slab_cached: Vec<(usize, usize)>,
    /// Allocated bytes that belong to no handle (raw-API blocks).
    untracked: Vec<(usize, usize)>,
    /// The stats at the same moment.
    stats: Py<PoolStats>,
    /// The regions with memory behind them (one unless the pool grew); bytes outside them are
    /// absent: in none of the lists above.
    regions: Vec<(usize, usize)>,
}

fn extents(list: &[Extent]) -> Vec<(usize, usize)> {
    list.iter().map(|e| (e.offset, e.len)).collect()
}

impl RawSnapshot {
    pub(crate) fn from_core(
        py: Python<'_>,
        snap: npumem_core::Snapshot,
        tags: &Tags,
        core: &npumem_core::Pool,
        by_tag: Vec<TagStats>,
    ) -> PyResult<RawSnapshot> {
        Ok(RawSnapshot {
            time_ns: snap.time_ns,
            blocks: snap.blocks.iter().map(|b| BlockInfo::from_core(py, b, tags, core)).collect(),
            free_runs: extents(&snap.free_runs),
            slab_cached: extents(&snap.slab_cached),
            untracked: extents(&snap.untracked),
            stats: Py::new(py, PoolStats::from_core(snap.stats, core.capacity(), by_tag))?,
            regions: extents(&snap.regions),
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

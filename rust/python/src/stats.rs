//! `npumem.PoolStats` and `npumem.CoreStats`: plain snapshots of `npumem_core::PoolStats`.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One core pool's share of a `PoolStats`.
#[pyclass(module = "npumem._core", frozen, get_all)]
#[derive(Clone)]
pub struct CoreStats {
    core: usize,
    chunks: usize,
    bytes_in_use: usize,
    bytes_free: usize,
    alloc_count: u64,
    free_count: u64,
    overflow_allocs: u64,
    failed_allocs: u64,
}

#[pymethods]
impl CoreStats {
    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("core", self.core)?;
        d.set_item("chunks", self.chunks)?;
        d.set_item("bytes_in_use", self.bytes_in_use)?;
        d.set_item("bytes_free", self.bytes_free)?;
        d.set_item("alloc_count", self.alloc_count)?;
        d.set_item("free_count", self.free_count)?;
        d.set_item("overflow_allocs", self.overflow_allocs)?;
        d.set_item("failed_allocs", self.failed_allocs)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "CoreStats(core={}, chunks={}, bytes_in_use={}, bytes_free={}, alloc_count={}, free_count={})",
            self.core, self.chunks, self.bytes_in_use, self.bytes_free, self.alloc_count, self.free_count
        )
    }
}

/// One slab size class of a `PoolStats`.
#[pyclass(module = "npumem._core", frozen, get_all)]
#[derive(Clone)]
pub struct SizeClassStats {
    size: usize,
    blocks_in_use: u64,
    slabs: u64,
    waste_bytes: u64,
}

#[pymethods]
impl SizeClassStats {
    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("size", self.size)?;
        d.set_item("blocks_in_use", self.blocks_in_use)?;
        d.set_item("slabs", self.slabs)?;
        d.set_item("waste_bytes", self.waste_bytes)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "SizeClassStats(size={}, blocks_in_use={}, slabs={}, waste_bytes={})",
            self.size, self.blocks_in_use, self.slabs, self.waste_bytes
        )
    }
}

/// A snapshot of a pool: usage, fragmentation and counters.
#[pyclass(module = "npumem._core", frozen, get_all)]
pub struct PoolStats {
    capacity: usize,
    usable_capacity: usize,
    bytes_in_use: usize,
    bytes_free: usize,
    slab_cached_bytes: usize,
    peak_bytes_in_use: usize,
    requested_bytes_in_use: usize,
    largest_free_block: usize,
    external_fragmentation: f64,
    alloc_count: u64,
    free_count: u64,
    failed_allocs: u64,
    overflow_allocs: u64,
    slab_allocs: u64,
    core_allocs: u64,
    global_allocs: u64,
    blocks_in_use: u64,
    chunks: usize,
    chunks_free: usize,
    chunks_in_cores: usize,
    chunks_in_runs: usize,
    size_classes: Vec<SizeClassStats>,
    per_core: Vec<CoreStats>,
}

impl PoolStats {
    pub(crate) fn from_core(s: npumem_core::PoolStats, capacity: usize) -> PoolStats {
        PoolStats {
            capacity,
            usable_capacity: s.usable_capacity,
            bytes_in_use: s.bytes_in_use,
            bytes_free: s.bytes_free,
            slab_cached_bytes: s.slab_cached_bytes,
            peak_bytes_in_use: s.peak_bytes_in_use,
            requested_bytes_in_use: s.requested_bytes_in_use,
            largest_free_block: s.largest_free_block,
            external_fragmentation: s.external_fragmentation,
            alloc_count: s.alloc_count,
            free_count: s.free_count,
            failed_allocs: s.failed_allocs,
            overflow_allocs: s.overflow_allocs,
            slab_allocs: s.slab_allocs,
            core_allocs: s.core_allocs,
            global_allocs: s.global_allocs,
            blocks_in_use: s.blocks_in_use,
            chunks: s.chunks,
            chunks_free: s.chunks_free,
            chunks_in_cores: s.chunks_in_cores,
            chunks_in_runs: s.chunks_in_runs,
            size_classes: s
                .size_classes
                .into_iter()
                .map(|c| SizeClassStats {
                    size: c.size,
                    blocks_in_use: c.blocks_in_use,
                    slabs: c.slabs,
                    waste_bytes: c.waste_bytes,
                })
                .collect(),
            per_core: s
                .per_core
                .into_iter()
                .map(|c| CoreStats {
                    core: c.core,
                    chunks: c.chunks,
                    bytes_in_use: c.bytes_in_use,
                    bytes_free: c.bytes_free,
                    alloc_count: c.alloc_count,
                    free_count: c.free_count,
                    overflow_allocs: c.overflow_allocs,
                    failed_allocs: c.failed_allocs,
                })
                .collect(),
        }
    }
}

#[pymethods]
impl PoolStats {
    /// `bytes_in_use / usable_capacity` (0.0 for an empty arena).
    #[getter]
    fn usage(&self) -> f64 {
        if self.usable_capacity == 0 {
            0.0
        } else {
            self.bytes_in_use as f64 / self.usable_capacity as f64
        }
    }

    /// The fields as a dict (`per_core` as a list of dicts).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("capacity", self.capacity)?;
        d.set_item("usable_capacity", self.usable_capacity)?;
        d.set_item("bytes_in_use", self.bytes_in_use)?;
        d.set_item("bytes_free", self.bytes_free)?;
        d.set_item("slab_cached_bytes", self.slab_cached_bytes)?;
        d.set_item("peak_bytes_in_use", self.peak_bytes_in_use)?;
        d.set_item("requested_bytes_in_use", self.requested_bytes_in_use)?;
        d.set_item("largest_free_block", self.largest_free_block)?;
        d.set_item("external_fragmentation", self.external_fragmentation)?;
        d.set_item("alloc_count", self.alloc_count)?;
        d.set_item("free_count", self.free_count)?;
        d.set_item("failed_allocs", self.failed_allocs)?;
        d.set_item("overflow_allocs", self.overflow_allocs)?;
        d.set_item("slab_allocs", self.slab_allocs)?;
        d.set_item("core_allocs", self.core_allocs)?;
        d.set_item("global_allocs", self.global_allocs)?;
        d.set_item("blocks_in_use", self.blocks_in_use)?;
        d.set_item("chunks", self.chunks)?;
        d.set_item("chunks_free", self.chunks_free)?;
        d.set_item("chunks_in_cores", self.chunks_in_cores)?;
        d.set_item("chunks_in_runs", self.chunks_in_runs)?;
        let classes = self.size_classes.iter().map(|c| c.as_dict(py)).collect::<PyResult<Vec<_>>>()?;
        d.set_item("size_classes", classes)?;
        let cores = self.per_core.iter().map(|c| c.as_dict(py)).collect::<PyResult<Vec<_>>>()?;
        d.set_item("per_core", cores)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "PoolStats(capacity={}, bytes_in_use={}, bytes_free={}, peak_bytes_in_use={}, \
             largest_free_block={}, external_fragmentation={:.4}, alloc_count={}, free_count={}, \
             failed_allocs={}, overflow_allocs={})",
            self.capacity,
            self.bytes_in_use,
            self.bytes_free,
            self.peak_bytes_in_use,
            self.largest_free_block,
            self.external_fragmentation,
            self.alloc_count,
            self.free_count,
            self.failed_allocs,
            self.overflow_allocs
        )
    }
}

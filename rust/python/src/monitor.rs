//! Monitoring (issue 6): snapshots and the event trace, converted for Python. `Pool`'s methods
//! (`snapshot`, `trace_start`, `trace_stop`, `trace_drain`, `trace_status`) delegate here.

use npumem_core::{Extent, MAX_TRACE_CAPACITY};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::args;
use crate::errors::{error, Kind};
use crate::gil::{detached, without_gil};
use crate::pool::Pool;
use crate::stats::PoolStats;

/// `pool.snapshot()`: pause the pool (without the GIL), then build
/// `npumem.monitor.Snapshot` from the blocks, free runs and stats.
pub(crate) fn snapshot<'py>(py: Python<'py>, slf: &Bound<'py, Pool>) -> PyResult<Bound<'py, PyAny>> {
    static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let pool = slf.get();
    let core = &pool.core;
    let snap = without_gil(py, || core.snapshot())?;
    let blocks = snap
        .blocks
        .iter()
        .map(|b| {
            PyTuple::new(
                py,
                [
                    b.offset.into_pyobject(py)?.into_any(),
                    b.size.into_pyobject(py)?.into_any(),
                    b.block_bytes.into_pyobject(py)?.into_any(),
                    b.align.into_pyobject(py)?.into_any(),
                    b.core.into_pyobject(py)?.into_any(),
                    pool.tag_name(py, b.tag).unwrap_or_else(|| py.None().into_bound(py)),
                    b.pins.into_pyobject(py)?.into_any(),
                    b.handle.to_bits().into_pyobject(py)?.into_any(),
                ],
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    let extents = |list: &[Extent]| -> Vec<(usize, usize)> { list.iter().map(|e| (e.offset, e.len)).collect() };
    let raw = PyDict::new(py);
    raw.set_item("time_ns", snap.time_ns)?;
    raw.set_item("blocks", blocks)?;
    raw.set_item("free_runs", extents(&snap.free_runs))?;
    raw.set_item("slab_cached", extents(&snap.slab_cached))?;
    raw.set_item("untracked", extents(&snap.untracked))?;
    let capacity = core.capacity();
    raw.set_item("stats", PoolStats::from_core(snap.stats, capacity))?;
    CLASS.import(py, "npumem.monitor.snapshot", "Snapshot")?.call_method1("_from_core", (slf, raw))
}

/// Events a trace holds when `trace_start` is given no capacity.
const DEFAULT_TRACE_CAPACITY: i128 = 65536;

/// `pool.trace_start(capacity)`.
pub(crate) fn trace_start(py: Python<'_>, pool: &Pool, capacity: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let n = match capacity.filter(|c| !c.is_none()) {
        Some(c) => args::integer(c, "capacity", Kind::ArgumentType)?,
        None => DEFAULT_TRACE_CAPACITY,
    };
    if n < 1 || n > MAX_TRACE_CAPACITY as i128 {
        return Err(error(
            Kind::InvalidArgument,
            format!("capacity must be between 1 and {MAX_TRACE_CAPACITY} events, got {n}"),
        ));
    }
    let core = &pool.core;
    without_gil(py, || core.trace_start(n as usize))
}

/// `pool.trace_stop()`.
pub(crate) fn trace_stop(py: Python<'_>, pool: &Pool) -> PyResult<()> {
    let core = &pool.core;
    without_gil(py, || core.trace_stop())
}

/// `pool.trace_drain()`: `(time_ns, kind, offset, size, core, tag, handle, aux)` tuples, oldest
/// first, tags as strings.
pub(crate) fn trace_drain<'py>(py: Python<'py>, pool: &Pool) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let core = &pool.core;
    let events = detached(py, || core.trace_drain());
    events
        .into_iter()
        .map(|e| {
            PyTuple::new(
                py,
                [
                    e.time_ns.into_pyobject(py)?.into_any(),
                    e.kind.name().into_pyobject(py)?.into_any(),
                    e.offset.into_pyobject(py)?.into_any(),
                    e.size.into_pyobject(py)?.into_any(),
                    e.core.into_pyobject(py)?.into_any(),
                    pool.tag_name(py, e.tag).unwrap_or_else(|| py.None().into_bound(py)),
                    e.handle.into_pyobject(py)?.into_any(),
                    e.aux.into_pyobject(py)?.into_any(),
                ],
            )
        })
        .collect()
}

/// `pool.trace_status()`: a dict.
pub(crate) fn trace_status<'py>(py: Python<'py>, pool: &Pool) -> PyResult<Bound<'py, PyDict>> {
    let st = pool.core.trace_status();
    let d = PyDict::new(py);
    d.set_item("enabled", st.enabled)?;
    d.set_item("capacity", st.capacity)?;
    d.set_item("recorded", st.recorded)?;
    d.set_item("drained", st.drained)?;
    d.set_item("dropped", st.dropped)?;
    Ok(d)
}

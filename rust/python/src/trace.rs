//! The event trace as Python sees it: `TraceStatus` (`Pool.trace_status()`) and the event
//! tuples of `Pool.trace_drain()`.

use npumem_core::TraceEvent;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::py_alloc;
use crate::repr;
use crate::tags::Tags;

/// Where a pool's trace stands.
#[pyclass(module = "npumem._core", frozen, eq, get_all)]
#[derive(Clone, PartialEq, Eq)]
pub struct TraceStatus {
    /// Whether events are being recorded now.
    enabled: bool,
    /// Events the rings hold at most, all `cores + 1` rings together (see `Pool.trace_start`;
    /// 0 before the first start).
    capacity: usize,
    /// Events recorded since the last start (delivered, lost, or waiting to be drained).
    recorded: u64,
    /// Events drained since the last start.
    drained: u64,
    /// Events lost since the last start: overwritten before a drain (counted as soon as they are),
    /// or lost by a lapped writer.
    dropped: u64,
}

impl From<npumem_core::TraceStatus> for TraceStatus {
    fn from(s: npumem_core::TraceStatus) -> TraceStatus {
        TraceStatus {
            enabled: s.enabled,
            capacity: s.capacity,
            recorded: s.recorded,
            drained: s.drained,
            dropped: s.dropped,
        }
    }
}

#[pymethods]
impl TraceStatus {
    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("enabled", self.enabled)?;
        d.set_item("capacity", self.capacity)?;
        d.set_item("recorded", self.recorded)?;
        d.set_item("drained", self.drained)?;
        d.set_item("dropped", self.dropped)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("TraceStatus", &self.as_dict(py)?)
    }
}

/// An event as the tuple `(time_ns, kind, offset, size, core, tag, handle, aux, stack)`, its tag
/// as a string, `stack` the recorded call stack of an allocation or None.
pub(crate) fn event_tuple<'py>(
    py: Python<'py>,
    e: &TraceEvent,
    tags: &Tags,
    core: &npumem_core::Pool,
    stack: Option<Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyTuple>> {
    py_alloc::tuple(
        py,
        [
            e.time_ns.into_pyobject(py)?.into_any(),
            e.kind.name().into_pyobject(py)?.into_any(),
            e.offset.into_pyobject(py)?.into_any(),
            e.size.into_pyobject(py)?.into_any(),
            e.core.into_pyobject(py)?.into_any(),
            tags.name_object(py, core, e.tag),
            e.handle.into_pyobject(py)?.into_any(),
            e.aux.into_pyobject(py)?.into_any(),
            match stack {
                Some(s) => s.into_any(),
                None => py.None().into_bound(py),
            },
        ],
    )
}

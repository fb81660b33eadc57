//! The presentation the Python package installs when it is imported (`install_views`): the
//! snapshot view, which builds an `npumem.monitor.Snapshot` from a `RawSnapshot`.
//!
//! Importing `npumem._core` imports `npumem` first, so a pool never exists without it; the
//! binding itself imports nothing from the Python package. Without it (the extension loaded on
//! its own), `Pool.snapshot()` returns the raw snapshot.

use std::sync::Mutex;

use pyo3::prelude::*;

use crate::args;
use crate::errors::{error, ErrorClass};
use crate::snapshot::RawSnapshot;
use crate::user_code;

/// The installed snapshot view.
static SNAPSHOT_VIEW: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

fn callable(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Py<PyAny>> {
    if !value.is_callable() {
        return Err(error(
            ErrorClass::ArgumentType,
            format!("{what} must be callable, got {}", args::type_name(value)),
        ));
    }
    Ok(value.clone().unbind())
}

/// Install `snapshot_view(pool, raw)`, which `Pool.snapshot()` hands each raw snapshot to.
#[pyfunction]
pub(crate) fn install_views(snapshot_view: &Bound<'_, PyAny>) -> PyResult<()> {
    let snapshot = callable(snapshot_view, "the snapshot view")?;
    *SNAPSHOT_VIEW.lock().unwrap_or_else(|p| p.into_inner()) = Some(snapshot);
    Ok(())
}

/// What `Pool.snapshot()` returns: the installed view of `raw` (`raw` itself without one).
pub(crate) fn present_snapshot<'py>(pool: &Bound<'py, PyAny>, raw: RawSnapshot) -> PyResult<Bound<'py, PyAny>> {
    let py = pool.py();
    let raw = Bound::new(py, raw)?.into_any();
    let view = SNAPSHOT_VIEW.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|v| v.clone_ref(py));
    match view {
        Some(view) => user_code::call(view.bind(py), (pool, raw)),
        None => Ok(raw),
    }
}

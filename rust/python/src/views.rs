//! The presentation the Python package installs when it is imported (`install_views`): the
//! snapshot view, which builds an `npumem.monitor.Snapshot` from a `RawSnapshot`, and the byte
//! formatter (`npumem.sizes.format_bytes`), the one place that writes byte counts for people.
//!
//! Importing `npumem._core` imports `npumem` first, so a pool never exists without them; the
//! binding itself imports nothing from the Python package. Without them (the extension loaded on
//! its own), `Pool.snapshot()` returns the raw snapshot and byte counts are written as integers.

use std::sync::Mutex;

use pyo3::prelude::*;

use crate::args;
use crate::errors::{error, ErrorClass};
use crate::snapshot::RawSnapshot;

/// The installed callables.
struct Views {
    snapshot: Py<PyAny>,
    format_bytes: Py<PyAny>,
}

static VIEWS: Mutex<Option<Views>> = Mutex::new(None);

fn installed<R>(
    py: Python<'_>,
    pick: impl FnOnce(&Views) -> &Py<PyAny>,
    use_it: impl FnOnce(Option<Py<PyAny>>) -> R,
) -> R {
    let chosen = VIEWS.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|v| pick(v).clone_ref(py));
    use_it(chosen)
}

fn callable(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Py<PyAny>> {
    if !value.is_callable() {
        return Err(error(
            ErrorClass::ArgumentType,
            format!("{what} must be callable, got {}", args::type_name(value)),
        ));
    }
    Ok(value.clone().unbind())
}

/// Install `snapshot_view(pool, raw)`, which `Pool.snapshot()` hands each raw snapshot to, and
/// `format_bytes(n)`, which writes byte counts in the text of typed results.
#[pyfunction]
pub(crate) fn install_views(snapshot_view: &Bound<'_, PyAny>, format_bytes: &Bound<'_, PyAny>) -> PyResult<()> {
    let views = Views {
        snapshot: callable(snapshot_view, "the snapshot view")?,
        format_bytes: callable(format_bytes, "the byte formatter")?,
    };
    *VIEWS.lock().unwrap_or_else(|p| p.into_inner()) = Some(views);
    Ok(())
}

/// What `Pool.snapshot()` returns: the installed view of `raw` (`raw` itself without one).
pub(crate) fn present_snapshot<'py>(pool: &Bound<'py, PyAny>, raw: RawSnapshot) -> PyResult<Bound<'py, PyAny>> {
    let py = pool.py();
    let raw = Bound::new(py, raw)?.into_any();
    installed(
        py,
        |v| &v.snapshot,
        |view| match view {
            Some(view) => view.bind(py).call1((pool, raw)),
            None => Ok(raw),
        },
    )
}

/// `n` bytes for people, by the installed formatter (`"{n} B"` without one).
pub(crate) fn format_bytes(py: Python<'_>, n: usize) -> PyResult<String> {
    installed(
        py,
        |v| &v.format_bytes,
        |format| match format {
            Some(format) => format.bind(py).call1((n,))?.extract(),
            None => Ok(format!("{n} B")),
        },
    )
}

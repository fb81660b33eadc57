//! Byte counts written for people, by the formatter the Python package installs
//! (`npumem.sizes.format_bytes`, through `install_views` in `views.rs`): error messages and the
//! text of typed results read like the rest of npumem. Before the package installs it (the
//! extension loaded on its own), counts are written as `"{n} B"`.

use std::sync::Mutex;

use pyo3::prelude::*;

static FORMATTER: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

/// Install `format_bytes(n) -> str`.
pub(crate) fn install(format_bytes: Py<PyAny>) {
    *FORMATTER.lock().unwrap_or_else(|p| p.into_inner()) = Some(format_bytes);
}

/// `n` bytes for people, by the installed formatter (`"{n} B"` without one).
pub(crate) fn format_bytes(py: Python<'_>, n: usize) -> PyResult<String> {
    let format = FORMATTER.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|f| f.clone_ref(py));
    match format {
        Some(format) => format.bind(py).call1((n,))?.extract(),
        None => Ok(format!("{n} B")),
    }
}

/// `n` bytes for people, and exactly: `"1.5 MiB (1572864 bytes)"`; below 1 KiB just the bytes.
/// Never fails: a formatter that raises gives the plain count.
pub(crate) fn exact(py: Python<'_>, n: usize) -> String {
    match format_bytes(py, n) {
        Ok(text) if n >= 1024 => format!("{text} ({n} bytes)"),
        _ => format!("{n} bytes"),
    }
}

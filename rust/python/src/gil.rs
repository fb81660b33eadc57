//! The one place that runs npumem-core work without the GIL (and maps its errors).

use pyo3::prelude::*;

use crate::errors::to_py;

/// Run `work` with the GIL released: other Python threads run meanwhile.
pub(crate) fn detached<T, F>(py: Python<'_>, work: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    py.detach(work)
}

/// Run fallible core `work` with the GIL released and map its error.
pub(crate) fn without_gil<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    F: FnOnce() -> npumem_core::Result<T> + Send,
    T: Send,
{
    detached(py, work).map_err(to_py)
}

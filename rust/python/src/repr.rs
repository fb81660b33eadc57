//! Reprs of the typed result classes, written like a dataclass's: `Name(field=value, ...)` with
//! Python's repr of each value.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `name(key=repr(value), ...)` over the items of `fields`, in order.
pub(crate) fn dataclass_like(name: &str, fields: &Bound<'_, PyDict>) -> PyResult<String> {
    let mut parts = Vec::with_capacity(fields.len());
    for (key, value) in fields.iter() {
        parts.push(format!("{key}={}", value.repr()?));
    }
    Ok(format!("{name}({})", parts.join(", ")))
}

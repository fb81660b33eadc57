//! Tags: the strings blocks are labelled with, interned as the small ids the core stores.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

/// A pool's tag strings by id (id 0 means no tag), and ids by string.
pub(crate) struct Tags {
    names: Py<PyList>,
    ids: Py<PyDict>,
}

impl Tags {
    pub(crate) fn new(py: Python<'_>) -> PyResult<Tags> {
        Ok(Tags { names: PyList::new(py, [py.None()])?.unbind(), ids: PyDict::new(py).unbind() })
    }

    /// The id of `tag` (interned on first use), 0 for none.
    pub(crate) fn id(&self, py: Python<'_>, tag: Option<&Bound<'_, PyString>>) -> PyResult<u32> {
        let Some(tag) = tag else { return Ok(0) };
        let ids = self.ids.bind(py);
        if let Some(id) = ids.get_item(tag)? {
            return id.extract();
        }
        let names = self.names.bind(py);
        let id = names.len() as u32;
        names.append(tag)?;
        ids.set_item(tag, id)?;
        Ok(id)
    }

    /// The tag string of an id (None for 0 or unknown ids).
    pub(crate) fn name<'py>(&self, py: Python<'py>, id: u32) -> Option<Bound<'py, PyString>> {
        if id == 0 {
            return None;
        }
        self.names.bind(py).get_item(id as usize).ok().and_then(|t| t.cast_into::<PyString>().ok())
    }

    /// [`Tags::name`] as a Rust string.
    pub(crate) fn name_string(&self, py: Python<'_>, id: u32) -> Option<String> {
        self.name(py, id).map(|t| t.to_string())
    }

    /// [`Tags::name`] as a Python object (`None` without a tag).
    pub(crate) fn name_object<'py>(&self, py: Python<'py>, id: u32) -> Bound<'py, PyAny> {
        match self.name(py, id) {
            Some(t) => t.into_any(),
            None => py.None().into_bound(py),
        }
    }
}

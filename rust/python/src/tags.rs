//! Tags: the strings blocks are labelled with, as the small ids the core stores. The core's
//! table (`npumem_core::TagTable`, shared with C callers of the same pool) interns them, holds
//! recycled ids while blocks carry them and drops them after. The binding keeps the pool's
//! first tags (named ids, never recycled) in a dict of its own, so that allocating with one of
//! them takes no lock.

use npumem_core::Pool as CorePool;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::errors::to_py;

/// Ids by string of the named tags seen from Python, and their strings by id.
pub(crate) struct Tags {
    ids: Py<PyDict>,
    names: Py<PyDict>,
}

impl Tags {
    pub(crate) fn new(py: Python<'_>) -> PyResult<Tags> {
        Ok(Tags { ids: PyDict::new(py).unbind(), names: PyDict::new(py).unbind() })
    }

    /// The id of `tag` (0 for none), interned on first use, with `blocks` holds taken on it
    /// for the blocks about to carry it: give them back with [`Tags::release`] when they are
    /// freed or the allocation fails.
    pub(crate) fn acquire(
        &self,
        py: Python<'_>,
        core: &CorePool,
        tag: Option<&Bound<'_, PyString>>,
        blocks: u64,
    ) -> PyResult<u32> {
        let Some(tag) = tag else { return Ok(0) };
        let ids = self.ids.bind(py);
        if let Some(id) = ids.get_item(tag)? {
            return id.extract();
        }
        let id = core.tags().acquire(tag.to_str()?, blocks).map_err(to_py)?;
        if core.tags().is_named(id) {
            ids.set_item(tag, id)?;
            self.names.bind(py).set_item(id, tag)?;
        }
        Ok(id)
    }

    /// Give back `blocks` holds on tag `id` (nothing to do for named tags).
    #[inline]
    pub(crate) fn release(&self, core: &CorePool, id: u32, blocks: u64) {
        if !core.tags().is_named(id) {
            // The binding gives back exactly the holds it took: never refused.
            let _ = core.release_tag(id, blocks);
        }
    }

    /// The tag string of an id (None for 0 or unknown ids).
    pub(crate) fn name<'py>(&self, py: Python<'py>, core: &CorePool, id: u32) -> Option<Bound<'py, PyString>> {
        if id == 0 {
            return None;
        }
        if let Ok(Some(name)) = self.names.bind(py).get_item(id) {
            return name.cast_into::<PyString>().ok();
        }
        core.tags().name(id).map(|name| PyString::new(py, &name))
    }

    /// [`Tags::name`] as a Rust string.
    pub(crate) fn name_string(&self, py: Python<'_>, core: &CorePool, id: u32) -> Option<String> {
        // Not `to_string()`, which goes through `str()` and so runs pending signal handlers.
        self.name(py, core, id).map(|t| t.to_string_lossy().into_owned())
    }

    /// [`Tags::name`] as a Python object (`None` without a tag).
    pub(crate) fn name_object<'py>(&self, py: Python<'py>, core: &CorePool, id: u32) -> Bound<'py, PyAny> {
        match self.name(py, core, id) {
            Some(t) => t.into_any(),
            None => py.None().into_bound(py),
        }
    }
}

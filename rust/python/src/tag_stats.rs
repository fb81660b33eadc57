//! Statistics by tag: for each tag, the live blocks, the bytes they asked for, and the peak of
//! those bytes (`PoolStats.by_tag`).
//!
//! The core keeps them (`npumem_core::TagTable`), counted by whoever allocates and frees: the
//! binding for the blocks of `Pool.alloc` and `alloc_many`, freed by `Block.free`, `Pool.free`
//! and `free_many`, each after the core call succeeded; the C ABI for its tagged blocks
//! (`npumem_alloc` with a tag id), so a pool shared with C (`Pool.c_pool()`) shows both.
//!
//! Cardinality is bounded: the first 63 tags a pool sees have their own counters, later tags
//! share one (`"(other tags)"`), and blocks without a tag have theirs (`None`).

use npumem_core::{TagFigures, TagLabel, OTHER_TAGS};
use pyo3::prelude::*;

use crate::from_dict;
use crate::repr;

/// One tag's share of a pool (`PoolStats.by_tag`): its live blocks, the bytes they asked for,
/// and the highest that figure has been (since the pool was made or `reset_peak()`).
/// `tag` is None for blocks without a tag and `"(other tags)"` for the tags after the first 63.
#[pyclass(module = "npumem._core", frozen, eq, get_all)]
#[derive(Clone, PartialEq, Eq)]
pub struct TagStats {
    /// The tag (None: blocks without one).
    tag: Option<String>,
    /// Live blocks with the tag.
    blocks_in_use: usize,
    /// Bytes those blocks asked for.
    requested_bytes_in_use: usize,
    /// The highest `requested_bytes_in_use` seen.
    peak_requested_bytes_in_use: usize,
}

impl TagStats {
    /// The binding's view of the core's figures.
    pub(crate) fn from_core(f: TagFigures) -> TagStats {
        TagStats {
            tag: match f.label {
                TagLabel::Untagged => None,
                TagLabel::Named(name) => Some(name.to_string()),
                TagLabel::Others => Some(OTHER_TAGS.to_string()),
            },
            blocks_in_use: f.blocks_in_use,
            requested_bytes_in_use: f.requested_bytes_in_use,
            peak_requested_bytes_in_use: f.peak_requested_bytes_in_use,
        }
    }

    /// The figures of `core`'s tags, largest bytes in use first.
    pub(crate) fn read(core: &npumem_core::Pool) -> Vec<TagStats> {
        core.tag_figures().into_iter().map(TagStats::from_core).collect()
    }

    /// Back from a dict of [`TagStats::dict`].
    pub(crate) fn parse(d: &Bound<'_, PyAny>) -> PyResult<TagStats> {
        let d = from_dict::dict_of(d, "TagStats")?;
        Ok(TagStats {
            tag: from_dict::field(&d, "TagStats", "tag")?,
            blocks_in_use: from_dict::field(&d, "TagStats", "blocks_in_use")?,
            requested_bytes_in_use: from_dict::field(&d, "TagStats", "requested_bytes_in_use")?,
            peak_requested_bytes_in_use: from_dict::field(&d, "TagStats", "peak_requested_bytes_in_use")?,
        })
    }

    /// The fields as a dict.
    pub(crate) fn dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("tag", &self.tag)?;
        d.set_item("blocks_in_use", self.blocks_in_use)?;
        d.set_item("requested_bytes_in_use", self.requested_bytes_in_use)?;
        d.set_item("peak_requested_bytes_in_use", self.peak_requested_bytes_in_use)?;
        Ok(d)
    }
}

#[pymethods]
impl TagStats {
    /// A `TagStats` from the dict `as_dict()` gives (a missing field is 0).
    #[staticmethod]
    fn from_dict(d: &Bound<'_, PyAny>) -> PyResult<TagStats> {
        TagStats::parse(d)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, pyo3::types::PyDict>,))> {
        crate::from_dict::reduce(slf.as_any(), slf.get().dict(slf.py())?)
    }

    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        self.dict(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("TagStats", &self.as_dict(py)?)
    }
}

//! `BlockInfo`: one live block as `Pool.blocks()` and `Pool.raw_snapshot()` list it.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::repr;
use crate::tags::Tags;

/// One live block at one moment: it covers `[offset, offset + block_bytes)` and asked for
/// `nbytes`.
#[pyclass(module = "npumem._core", frozen, eq, get_all)]
#[derive(Clone, PartialEq, Eq)]
pub struct BlockInfo {
    /// Its offset in the arena.
    offset: usize,
    /// The bytes it asked for.
    nbytes: usize,
    /// The bytes it holds (its size rounded to its slab class or block layout).
    block_bytes: usize,
    /// The alignment it asked for.
    align: usize,
    /// The core pool that served it.
    core: usize,
    /// The tag given at allocation, or None.
    tag: Option<String>,
    /// Pins (explicit pins and live buffer views).
    pins: u32,
    /// Its handle as an int (as `Block.handle`).
    handle: u128,
}

impl BlockInfo {
    pub(crate) fn from_core(
        py: Python<'_>,
        b: &npumem_core::BlockInfo,
        tags: &Tags,
        core: &npumem_core::Pool,
    ) -> BlockInfo {
        BlockInfo {
            offset: b.offset,
            nbytes: b.size,
            block_bytes: b.block_bytes,
            align: b.align,
            core: b.core,
            tag: tags.name_string(py, core, b.tag),
            pins: b.pins,
            handle: b.handle.to_bits(),
        }
    }
}

#[pymethods]
impl BlockInfo {
    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("offset", self.offset)?;
        d.set_item("nbytes", self.nbytes)?;
        d.set_item("block_bytes", self.block_bytes)?;
        d.set_item("align", self.align)?;
        d.set_item("core", self.core)?;
        d.set_item("tag", &self.tag)?;
        d.set_item("pins", self.pins)?;
        d.set_item("handle", self.handle)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("BlockInfo", &self.as_dict(py)?)
    }
}

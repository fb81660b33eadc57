//! `Transfer`: one copy of a batch of moves, as a mover receives it. It reads as the 3-tuple
//! `(src, dst, nbytes)` of offsets (`src, dst, n = t`, `t[0]`, `t == (s, d, n)`), and also
//! carries the addresses of both ends (`src_address`, `dst_address`: the pool's base address
//! plus the offset), which a device runtime's copy engine wants.

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::repr;

/// One copy of a compaction batch: `nbytes` bytes from offset `src` to offset `dst` (like
/// `memmove`: the two ranges may overlap), at `src_address` and `dst_address`.
#[pyclass(module = "npumem._core", frozen, get_all, sequence)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Source offset.
    src: usize,
    /// Destination offset.
    dst: usize,
    /// Bytes to copy.
    nbytes: usize,
    /// Source address (base address + `src`).
    src_address: u64,
    /// Destination address (base address + `dst`).
    dst_address: u64,
}

impl Transfer {
    pub(crate) fn new(src: usize, dst: usize, nbytes: usize, base_address: u64) -> Transfer {
        Transfer {
            src,
            dst,
            nbytes,
            src_address: base_address.wrapping_add(src as u64),
            dst_address: base_address.wrapping_add(dst as u64),
        }
    }

    fn as_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, [self.src, self.dst, self.nbytes])
    }
}

#[pymethods]
impl Transfer {
    fn __len__(&self) -> usize {
        3
    }

    fn __getitem__(&self, index: isize) -> PyResult<usize> {
        let fields = [self.src, self.dst, self.nbytes];
        let at = if index < 0 { index + 3 } else { index };
        usize::try_from(at)
            .ok()
            .and_then(|i| fields.get(i).copied())
            .ok_or_else(|| PyIndexError::new_err("Transfer index out of range (it reads as (src, dst, nbytes))"))
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.as_tuple(py)?.into_any().try_iter()?.into_any())
    }

    /// Equal to a `Transfer` with the same fields, or to the tuple `(src, dst, nbytes)`.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        if let Ok(other) = other.cast::<Transfer>() {
            return Ok(self == other.get());
        }
        self.as_tuple(other.py())?.eq(other)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self.as_tuple(py)?.hash()
    }

    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("src", self.src)?;
        d.set_item("dst", self.dst)?;
        d.set_item("nbytes", self.nbytes)?;
        d.set_item("src_address", self.src_address)?;
        d.set_item("dst_address", self.dst_address)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("Transfer", &self.as_dict(py)?)
    }
}

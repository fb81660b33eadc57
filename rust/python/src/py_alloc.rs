//! Python lists and tuples made without a panic when the interpreter has no memory for them.
//!
//! PyO3's `PyList::new`, `PyTuple::new` and the conversion of a `Vec` to a list panic when
//! CPython cannot allocate the object: [`list`] and [`tuple`] raise the `MemoryError` that
//! CPython set instead.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// A list of `items` (each made by the caller, who may fail): `MemoryError` when the host has no
/// memory for the list.
pub(crate) fn list<'py>(
    py: Python<'py>,
    items: impl IntoIterator<Item = PyResult<Bound<'py, PyAny>>>,
) -> PyResult<Bound<'py, PyList>> {
    // SAFETY: `PyList_New` returns a new reference or NULL with an exception set.
    let list = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyList_New(0))?.cast_into_unchecked::<PyList>() };
    for item in items {
        list.append(item?)?;
    }
    Ok(list)
}

/// A tuple of `items`: `MemoryError` when the host has no memory for it.
pub(crate) fn tuple<'py, const N: usize>(
    py: Python<'py>,
    items: [Bound<'py, PyAny>; N],
) -> PyResult<Bound<'py, PyTuple>> {
    // SAFETY: `PyTuple_New` returns a new reference or NULL with an exception set; each
    // `PyTuple_SetItem` fills a slot of the fresh tuple, stealing the item's reference.
    unsafe {
        let tuple = Bound::from_owned_ptr_or_err(py, ffi::PyTuple_New(N as ffi::Py_ssize_t))?;
        for (i, item) in items.into_iter().enumerate() {
            if ffi::PyTuple_SetItem(tuple.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(tuple.cast_into_unchecked())
    }
}

//! `Pool.c_pool()`: the pool for C code in the same process, as a capsule holding an
//! `npumem_pool*` of the C ABI (`npumem.h`). The C object shares the core pool (an `Arc`) and
//! is reference counted on the C side; the capsule owns one reference and drops it when it
//! goes. The object is served by this extension's copy of the library, whichever copy's entry
//! points the C code calls.

use std::ffi::CStr;
use std::sync::Arc;

use npumem::Location;
use pyo3::ffi;
use pyo3::prelude::*;

/// The capsule's name, as C code passes it to `PyCapsule_GetPointer`.
const NAME: &CStr = c"npumem.pool";

/// Drop the capsule's reference.
unsafe extern "C" fn release(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the GIL held on a capsule made below (its name is ours).
    unsafe {
        let pool = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr());
        if pool.is_null() {
            ffi::PyErr_Clear();
            return;
        }
        npumem::npumem_pool_release(pool.cast());
    }
}

/// A capsule with a new C reference to `core`.
pub(crate) fn capsule<'py>(py: Python<'py>, core: &Arc<npumem_core::Pool>) -> PyResult<Bound<'py, PyAny>> {
    let device = core.device();
    let location =
        Location { base_address: core.base_address(), device_type: device.type_code, device_id: device.index };
    let pool = npumem::wrap(Arc::clone(core), location);
    // SAFETY: a live pool object with one reference, which the capsule's destructor releases;
    // the name is a static C string, as CPython requires.
    let made = unsafe { ffi::PyCapsule_New(pool.cast(), NAME.as_ptr(), Some(release)) };
    if made.is_null() {
        // SAFETY: the capsule was not made: the reference is still ours.
        unsafe { npumem::npumem_pool_release(pool) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference to the capsule just made.
    Ok(unsafe { Bound::from_owned_ptr(py, made) })
}

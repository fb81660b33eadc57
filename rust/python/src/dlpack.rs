//! DLPack export of a block: the capsule `Block.__dlpack__` returns.
//!
//! The capsule holds a `DLManagedTensor` (or, for consumers that ask for DLPack 1.0, a
//! `DLManagedTensorVersioned`) describing the block as a one-dimensional `uint8` tensor at the
//! block's address on the pool's device. The block is pinned while the tensor lives: the
//! tensor's deleter unpins it, on whichever thread the consumer calls it, without the GIL.
//! The export also holds a reference to the `npumem.Block` it came from, so that a block whose
//! object went is freed when the last export goes (a deleter called without the GIL hands the
//! reference to PyO3, which releases it when a thread next holds the GIL). Its unpin gives the
//! block the chance every unpin gives it (`Block::after_unpin`: a block whose `with` exit was
//! refused for its pins is freed at its last pin), which needs neither the GIL nor a wait.
//! The capsule follows the protocol: renamed `used_dltensor` once consumed; freed unconsumed,
//! its destructor calls the deleter.
//!
//! A pool without host memory and without a base address has offsets, not addresses: its blocks
//! are not exported (`NoBackingError`), whatever its device, since a tensor's data pointer would
//! be the bare offset (NULL at offset 0). A nonzero base address is the user's declaration of
//! where the memory is, taken as given.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use npumem_core::{Device, Handle, Pool};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};

use crate::args;
use crate::errors::{error, to_py, ErrorClass};
use crate::pinned::{pin_view, read_block, PinOwner};

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `kDLUInt`.
const DL_UINT: u8 = 1;

/// `DLTensor`.
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (unversioned, before DLPack 1.0).
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.0).
#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// The DLPack version this module produces.
pub(crate) const DLPACK_VERSION: (u32, u32) = (1, 0);

const LEGACY_NAME: &CStr = c"dltensor";
const LEGACY_USED: &CStr = c"used_dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";
const VERSIONED_USED: &CStr = c"used_dltensor_versioned";

/// A pinned block to export: `nbytes` bytes at `data` on `device` (DLPack type and index); the
/// pin is released when this is dropped.
pub(crate) struct PinnedBytes {
    pub(crate) pool: Arc<Pool>,
    pub(crate) handle: Handle,
    pub(crate) data: u64,
    pub(crate) nbytes: usize,
    pub(crate) device: (i32, i32),
    /// The `npumem.Block` exported, released after the pin.
    pub(crate) owner: Option<Box<dyn PinOwner>>,
}

impl Drop for PinnedBytes {
    /// The export's end: the block may move and be freed again (and is freed here when its
    /// `with` exit waited for its last pin, or when this held the last reference to its object).
    fn drop(&mut self) {
        let _ = self.pool.unpin_view(self.handle);
        if let Some(owner) = self.owner.take() {
            owner.after_unpin();
            drop(owner);
        }
    }
}

/// A managed tensor and what it points into, in one allocation (the tensor first, so the
/// deleter's pointer is the allocation's).
#[repr(C)]
struct Export<M> {
    managed: M,
    shape: [i64; 1],
    pinned: PinnedBytes,
}

fn tensor(pinned: &PinnedBytes, shape: *mut i64) -> DLTensor {
    DLTensor {
        data: pinned.data as usize as *mut c_void,
        device: DLDevice { device_type: pinned.device.0, device_id: pinned.device.1 },
        ndim: 1,
        dtype: DLDataType { code: DL_UINT, bits: 8, lanes: 1 },
        shape,
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if !managed.is_null() {
        // SAFETY: `managed` is the first field of an `Export` leaked by `capsule` below.
        drop(unsafe { Box::from_raw(managed.cast::<Export<DLManagedTensor>>()) });
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if !managed.is_null() {
        // SAFETY: as above.
        drop(unsafe { Box::from_raw(managed.cast::<Export<DLManagedTensorVersioned>>()) });
    }
}

/// The capsule destructor: an unconsumed tensor is deleted here; a consumed one belongs to
/// its consumer.
unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the GIL held on a capsule made below. Any exception
    // already set is kept across the lookups, which may set one.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_USED.as_ptr()) == 1
            || ffi::PyCapsule_IsValid(capsule, VERSIONED_USED.as_ptr()) == 1
        {
            return;
        }
        let (mut kind, mut value, mut traceback) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        ffi::PyErr_Fetch(&mut kind, &mut value, &mut traceback);
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            delete_legacy(ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast());
        } else if ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            delete_versioned(ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr()).cast());
        }
        ffi::PyErr_Restore(kind, value, traceback);
    }
}

/// The DLPack capsule of a pinned block (the capsule owns the pin from here on).
fn capsule(py: Python<'_>, pinned: PinnedBytes, versioned: bool) -> PyResult<Bound<'_, PyAny>> {
    let nbytes = pinned.nbytes as i64;
    let (pointer, name) = if versioned {
        let mut export = Box::new(Export {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: DLPACK_VERSION.0, minor: DLPACK_VERSION.1 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor: tensor(&pinned, std::ptr::null_mut()),
            },
            shape: [nbytes],
            pinned,
        });
        export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
        let raw = Box::into_raw(export);
        // SAFETY: `raw` is the allocation just leaked; the context points back at it.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        (raw.cast::<c_void>(), VERSIONED_NAME)
    } else {
        let mut export = Box::new(Export {
            managed: DLManagedTensor {
                dl_tensor: tensor(&pinned, std::ptr::null_mut()),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape: [nbytes],
            pinned,
        });
        export.managed.dl_tensor.shape = export.shape.as_mut_ptr();
        let raw = Box::into_raw(export);
        // SAFETY: as above.
        unsafe { (*raw).managed.manager_ctx = raw.cast() };
        (raw.cast::<c_void>(), LEGACY_NAME)
    };
    // SAFETY: the pointer is a leaked `Export` whose deleter the destructor calls; the name is
    // a static C string, as CPython requires.
    let made = unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(destroy_capsule)) };
    if made.is_null() {
        // SAFETY: the capsule was not made: the export is still ours to delete.
        unsafe {
            if versioned {
                delete_versioned(pointer.cast());
            } else {
                delete_legacy(pointer.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference to the capsule just made.
    Ok(unsafe { Bound::from_owned_ptr(py, made) })
}

/// `__dlpack_device__()`: the DLPack device type code and index of the pool's memory.
pub(crate) fn device_of(core: &Pool) -> (i32, i32) {
    let Device { type_code, index } = core.device();
    (type_code, index)
}

/// What `__dlpack__` was asked for, checked.
pub(crate) struct Request<'a, 'py> {
    pub(crate) stream: Option<&'a Bound<'py, PyAny>>,
    pub(crate) max_version: Option<&'a Bound<'py, PyAny>>,
    pub(crate) dl_device: Option<&'a Bound<'py, PyAny>>,
    pub(crate) copy: Option<&'a Bound<'py, PyAny>>,
}

impl Request<'_, '_> {
    /// Whether the consumer takes a versioned (DLPack 1.0) capsule; errors for what cannot be
    /// honoured (a copy, another device, a stream on CPU memory).
    fn versioned(&self, device: (i32, i32)) -> PyResult<bool> {
        if let Some(copy) = self.copy.filter(|c| !c.is_none()) {
            if !copy.is_instance_of::<PyBool>() {
                return Err(error(
                    ErrorClass::ArgumentType,
                    format!("copy must be None, True or False, got {}", args::type_name(copy)),
                ));
            }
            if copy.is_truthy()? {
                return Err(error(
                    ErrorClass::Export,
                    "npumem exports blocks without copying; call __dlpack__ with copy=None or copy=False",
                ));
            }
        }
        if let Some(wanted) = self.dl_device.filter(|d| !d.is_none()) {
            let wanted = dl_device(wanted)?;
            if wanted != device {
                return Err(error(
                    ErrorClass::Export,
                    format!(
                        "the block lives on DLPack device {device:?} and cannot be exported to device {wanted:?} without a copy"
                    ),
                ));
            }
        }
        if let Some(stream) = self.stream.filter(|s| !s.is_none()) {
            let stream = args::integer(stream, "stream", ErrorClass::ArgumentType)?;
            if device.0 == Device::CPU.type_code && stream != -1 {
                return Err(error(
                    ErrorClass::InvalidArgument,
                    format!("stream must be None for CPU memory, got {stream}"),
                ));
            }
        }
        Ok(match self.max_version.filter(|v| !v.is_none()) {
            Some(version) => max_major(version)? >= i128::from(DLPACK_VERSION.0),
            None => false,
        })
    }
}

/// The two items of `value` when it is a tuple of two; None otherwise.
fn pair<'py>(value: &Bound<'py, PyAny>) -> Option<[Bound<'py, PyAny>; 2]> {
    let tuple = value.cast::<PyTuple>().ok().filter(|t| t.len() == 2)?;
    Some([tuple.get_item(0).ok()?, tuple.get_item(1).ok()?])
}

/// Whether `value` is an int or has `__index__` (not a `bool`), as [`args::int_value`] takes.
fn int_like(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(!value.is_instance_of::<PyBool>() && (value.is_instance_of::<PyInt>() || value.hasattr("__index__")?))
}

/// The `repr` of a value for a message (its type name when it has none).
fn shown(value: &Bound<'_, PyAny>) -> String {
    value.repr().map_or_else(|_| args::type_name(value), |r| r.to_string())
}

/// The major version of `max_version`: a `(major, minor)` tuple of ints >= 0
/// (`ArgumentTypeError` for another shape or type, `InvalidArgumentError` for a negative
/// one). A consumer may know versions far beyond this module's: any size is taken.
fn max_major(version: &Bound<'_, PyAny>) -> PyResult<i128> {
    let refuse =
        |class| error(class, format!("max_version must be a (major, minor) pair of ints >= 0, got {}", shown(version)));
    let items = pair(version).ok_or_else(|| refuse(ErrorClass::ArgumentType))?;
    let mut values = [0i128; 2];
    for (value, item) in values.iter_mut().zip(&items) {
        if !int_like(item)? {
            return Err(refuse(ErrorClass::ArgumentType));
        }
        // A value beyond 128 bits is a huge version when positive.
        *value = match args::int_value(item, "max_version", ErrorClass::ArgumentType)? {
            Ok(n) => n,
            Err(text) if text.starts_with('-') => -1,
            Err(_) => i128::MAX,
        };
        if *value < 0 {
            return Err(refuse(ErrorClass::InvalidArgument));
        }
    }
    Ok(values[0])
}

/// The device `dl_device` names: a `(device type, index)` tuple of ints, as
/// `__dlpack_device__()` returns (`ArgumentTypeError` for another shape or type,
/// `InvalidArgumentError` for an item beyond the 32-bit ints of DLPack's `DLDevice`).
fn dl_device(value: &Bound<'_, PyAny>) -> PyResult<(i32, i32)> {
    let needs = "dl_device must be a (device type, index) pair of ints, as __dlpack_device__() returns";
    let Some(items) = pair(value) else {
        return Err(error(ErrorClass::ArgumentType, format!("{needs}, got {}", shown(value))));
    };
    let mut out = [0i32; 2];
    for (i, (slot, item)) in out.iter_mut().zip(&items).enumerate() {
        let what = ["the device type", "the device index"][i];
        if !int_like(item)? {
            return Err(error(
                ErrorClass::ArgumentType,
                format!("{needs}; {what}, dl_device[{i}], is {} {}", args::type_name(item), shown(item)),
            ));
        }
        let n = args::int_value(item, "dl_device", ErrorClass::ArgumentType)?;
        *slot = n.ok().and_then(|n| i32::try_from(n).ok()).ok_or_else(|| {
            error(
                ErrorClass::InvalidArgument,
                format!(
                    "{what}, dl_device[{i}] = {}, is out of range: DLPack device types and indices are \
                     32-bit ints (from {} to {})",
                    shown(item),
                    i32::MIN,
                    i32::MAX
                ),
            )
        })?;
    }
    Ok((out[0], out[1]))
}

/// Why a pool without host memory and without a base address exports nothing.
const NO_ADDRESS_MESSAGE: &str = "the pool has no base_address (backing=\"none\" without one): its blocks are \
     offsets, not addresses, and a DLPack tensor at offset 0 would be a NULL pointer (at any other offset a \
     bogus one); make the pool with base_address= the address of its memory's offset 0 to export its blocks";

/// `Block.__dlpack__`: pin the block and wrap its bytes in a DLPack capsule.
pub(crate) fn export<'py>(
    py: Python<'py>,
    core: &Arc<Pool>,
    handle: Handle,
    owner: Box<dyn PinOwner>,
    request: &Request<'_, 'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let device = device_of(core);
    let versioned = request.versioned(device)?;
    if !core.has_backing() && core.base_address() == 0 {
        // A freed or stale handle is reported as such before the missing address.
        read_block(py, core, handle).map_err(to_py)?;
        return Err(error(ErrorClass::NoBacking, NO_ADDRESS_MESSAGE));
    }
    pin_view(py, core, handle)?;
    // From here the pin is released when `pinned` is dropped (on failure) or by the deleter.
    let mut pinned = PinnedBytes { pool: Arc::clone(core), handle, data: 0, nbytes: 0, device, owner: Some(owner) };
    // Pinned: it does not move.
    let info = core.try_block(handle).map_err(to_py)?;
    pinned.data = core.base_address().wrapping_add(info.offset as u64);
    pinned.nbytes = info.size;
    capsule(py, pinned, versioned)
}

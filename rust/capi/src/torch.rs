//! The allocator functions PyTorch's `torch.cuda.memory.CUDAPluggableAllocator` loads from this
//! library by name:
//!
//! ```c
//! void* npumem_torch_alloc(ptrdiff_t size, int device, void* stream);   /* cudaStream_t */
//! void  npumem_torch_free(void* ptr, ptrdiff_t size, int device, void* stream);
//! ```
//!
//! `npumem_torch_set_pool(device, pool)` picks the pool that serves each device; its blocks are
//! raw blocks (no handle: they never move), aligned to 256 bytes like `cudaMalloc`'s, and the
//! pointer is the pool's base address plus the offset. The stream is not used: the pool is
//! shared by every stream, and PyTorch orders frees after the kernels that use the memory.
//!
//! The per-device table is a `PublishedSlots` of the core (its protocol and loom model are in
//! `rust/core/src/util/published.rs`): setting a device's pool builds its record, takes a pool
//! reference and publishes both with one swap; the swap hands the record it replaced to this
//! call alone, which drops that record's reference. Allocation and free read the slot with one
//! acquire load. A record is freed when it is replaced, so a device's pool may be replaced or
//! cleared only when no allocation or free on that device is in flight.

use std::ffi::{c_int, c_void};
use std::ptr;

use npumem_core::PublishedSlots;

use crate::exports::{
    npumem_alloc_raw, npumem_free_raw, npumem_pool_get_info, npumem_pool_release, npumem_pool_retain,
};
use crate::object::NpumemPool;
use crate::status::{fail_with, guard, set_last_error, Status, ERR_CONFIG, ERR_INVALID_POOL, OK};
use crate::types::NpumemPoolInfo;

/// Devices `npumem_torch_set_pool` accepts: 0 to `MAX_DEVICES - 1`.
pub const MAX_DEVICES: usize = 64;

/// The alignment of every block handed to PyTorch.
pub const TORCH_ALIGNMENT: usize = 256;

/// A device's pool and the address of its offset 0.
struct Served {
    pool: *mut NpumemPool,
    base: u64,
}

/// The record serving each device (null: none).
static SERVED: PublishedSlots<Served, MAX_DEVICES> = PublishedSlots::new();

/// The table index of `device`, if it is one.
fn slot(device: c_int) -> Option<usize> {
    usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES)
}

/// The record serving `device` (None when there is none).
fn served(device: c_int) -> Option<*mut Served> {
    slot(device).map(|d| SERVED.current(d)).filter(|s| !s.is_null())
}

/// Serve `device` from `pool` (a new reference is taken), or stop serving it (NULL). Set it
/// before PyTorch allocates on the device; clear or replace it only after every tensor it
/// served was freed.
///
/// # Safety
/// `pool` is NULL or a live pool object.
#[no_mangle]
pub unsafe extern "C" fn npumem_torch_set_pool(device: c_int, pool: *mut NpumemPool) -> Status {
    guard(|| {
        let Some(slot) = slot(device) else {
            return fail_with(ERR_CONFIG, &format!("device must be between 0 and {}, got {device}", MAX_DEVICES - 1));
        };
        let served = if pool.is_null() {
            ptr::null_mut()
        } else {
            let mut info = NpumemPoolInfo::default();
            // SAFETY: `pool` is a live pool object by the caller's contract.
            let status = unsafe { npumem_pool_get_info(pool, &mut info) };
            if status != OK {
                return status;
            }
            if info.base_address == 0 {
                return fail_with(
                    ERR_INVALID_POOL,
                    "a pool serving PyTorch needs a nonzero base address (offset 0 would be a NULL pointer)",
                );
            }
            // SAFETY: as above.
            let status = unsafe { npumem_pool_retain(pool) };
            if status != OK {
                return status;
            }
            Box::into_raw(Box::new(Served { pool, base: info.base_address }))
        };
        let old = SERVED.publish(slot, served).unwrap_or(ptr::null_mut());
        if !old.is_null() {
            // SAFETY: `old` came from `Box::into_raw` above and left the slot; its pool holds the
            // reference taken when it was set.
            let old = unsafe { Box::from_raw(old) };
            // SAFETY: the reference taken when it was set.
            unsafe { npumem_pool_release(old.pool) };
        }
        OK
    })
}

/// The bytes a PyTorch size takes: a block of 1 byte for 0 (PyTorch asks for empty tensors'
/// storage too), `None` for a negative size.
fn block_size(size: isize) -> Option<usize> {
    usize::try_from(size).ok().map(|size| size.max(1))
}

/// PyTorch's `alloc`: `size` bytes on `device`, or NULL (PyTorch then reports out of memory).
///
/// # Safety
/// Called by PyTorch (or any caller) with any arguments.
#[no_mangle]
pub unsafe extern "C" fn npumem_torch_alloc(size: isize, device: c_int, _stream: *mut c_void) -> *mut c_void {
    let Some(served) = served(device) else {
        set_last_error(&format!("npumem serves no pool for device {device} (npumem_torch_set_pool)"));
        return ptr::null_mut();
    };
    // SAFETY: a published `Served` stays valid while PyTorch uses the device (see set_pool).
    let served = unsafe { &*served };
    let Some(size) = block_size(size) else {
        set_last_error(&format!("size must not be negative, got {size}"));
        return ptr::null_mut();
    };
    let (mut offset, mut address) = (0usize, 0u64);
    // SAFETY: the pool is live (referenced by the slot); the outputs are local.
    let status = unsafe { npumem_alloc_raw(served.pool, size, TORCH_ALIGNMENT, &mut offset, &mut address) };
    if status != OK {
        return ptr::null_mut();
    }
    address as usize as *mut c_void
}

/// PyTorch's `free`: the block at `ptr` of `size` bytes (as allocated) on `device`.
///
/// # Safety
/// Called by PyTorch (or any caller) with any arguments.
#[no_mangle]
pub unsafe extern "C" fn npumem_torch_free(ptr: *mut c_void, size: isize, device: c_int, _stream: *mut c_void) {
    let Some(served) = served(device) else {
        set_last_error(&format!("npumem serves no pool for device {device}; the free was ignored"));
        return;
    };
    let Some(bytes) = block_size(size) else {
        set_last_error(&format!("size must not be negative, got {size}; the free was ignored"));
        return;
    };
    // SAFETY: a published `Served` stays valid while PyTorch uses the device (see set_pool).
    let served = unsafe { &*served };
    let Some(offset) = (ptr as usize as u64).checked_sub(served.base) else {
        set_last_error(&format!(
            "the pointer {ptr:p} is below the memory of device {device}'s pool (which starts at {:#x}); the free was ignored",
            served.base
        ));
        return;
    };
    let offset = offset as usize;
    // SAFETY: the pool is live (referenced by the slot). A bad pointer gets an error status
    // (left as the last error): free cannot report one to PyTorch.
    unsafe { npumem_free_raw(served.pool, offset, bytes) };
}

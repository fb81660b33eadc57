//! The C entry points declared in `npumem.h`. Each checks the pool pointer and calls the
//! functions of the copy of the library that made the pool (see `object.rs`); a failure in
//! another copy brings that copy's message along, so `npumem_last_error` tells it here too.

use std::ffi::{c_char, c_void};
use std::ptr;

use crate::native;
use crate::object::{ops_of, NpumemPool, OomCallback, Ops, ABI_VERSION};
use crate::status::{self, describe, fail, fail_with, guard, set_last_error, Status, ERR_ABI_MISMATCH, OK};
use crate::types::{NpumemBlock, NpumemConfig, NpumemHandle, NpumemPoolInfo, NpumemStats};

/// The message for a pool pointer that `ops_of` refused.
#[cold]
fn refused(status: Status) -> Status {
    let message = match status {
        status::ERR_NULL_ARGUMENT => "pool is NULL",
        status::ERR_INVALID_POOL => "pool does not point to a live npumem pool (released already?)",
        _ => "pool was made by an npumem library with another ABI version",
    };
    fail_with(status, message)
}

/// Bring another copy's last error message into this copy's.
#[cold]
fn adopt_message(ops: &Ops) {
    // SAFETY: the other copy returns its NUL-terminated per-thread message.
    let message = unsafe { std::ffi::CStr::from_ptr((ops.last_error)()) };
    set_last_error(&message.to_string_lossy());
}

/// Call `op` with the functions of `pool`'s copy.
macro_rules! dispatch {
    ($pool:expr, |$ops:ident| $call:expr) => {{
        // SAFETY: the caller passes NULL or a pool object (documented in npumem.h).
        match unsafe { ops_of($pool) } {
            Ok($ops) => {
                let status = $call;
                if status != OK && !ptr::eq($ops, &native::OPS) {
                    adopt_message($ops);
                }
                status
            }
            Err(status) => refused(status),
        }
    }};
}

/// Fill `config` with the defaults of the Python `Pool` for `capacity` bytes.
///
/// # Safety
/// `config` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_config_init(config: *mut NpumemConfig, capacity: usize) -> Status {
    guard(|| {
        if config.is_null() {
            return fail_with(status::ERR_NULL_ARGUMENT, "config is NULL");
        }
        // SAFETY: non-NULL and writable by the caller's contract.
        unsafe { config.write(crate::config::defaults(capacity)) };
        OK
    })
}

/// Make a pool; `*out` receives it with one reference.
///
/// # Safety
/// `config` is NULL or a readable config (its `slab_sizes` NULL or `slab_count` entries);
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_pool_create(config: *const NpumemConfig, out: *mut *mut NpumemPool) -> Status {
    guard(|| {
        if config.is_null() {
            return fail_with(status::ERR_NULL_ARGUMENT, "config is NULL");
        }
        if out.is_null() {
            return fail_with(status::ERR_NULL_ARGUMENT, "out is NULL");
        }
        // SAFETY: `struct_size` is the first field of every version of the struct.
        let size = unsafe { ptr::addr_of!((*config).struct_size).read() } as usize;
        if size != std::mem::size_of::<NpumemConfig>() {
            return fail_with(
                ERR_ABI_MISMATCH,
                &format!(
                    "config.struct_size is {size}, this library's npumem_config has {} bytes (call npumem_config_init)",
                    std::mem::size_of::<NpumemConfig>()
                ),
            );
        }
        // SAFETY: readable by the caller's contract, and of this library's layout.
        let config = unsafe { &*config };
        // SAFETY: the caller guarantees the slab pointer.
        match unsafe { native::create(config) } {
            Ok(pool) => {
                // SAFETY: non-NULL and writable by the caller's contract.
                unsafe { out.write(pool) };
                OK
            }
            Err(err) => fail(&err),
        }
    })
}

/// Add a reference to `pool`.
///
/// # Safety
/// `pool` is NULL or a live pool object.
#[no_mangle]
pub unsafe extern "C" fn npumem_pool_retain(pool: *mut NpumemPool) -> Status {
    // SAFETY: `ops_of` checked the pool.
    dispatch!(pool, |ops| unsafe { (ops.retain)(pool) })
}

/// Drop a reference to `pool`; the last one destroys it (its blocks with it).
///
/// # Safety
/// `pool` is NULL or a live pool object on which the caller holds a reference.
#[no_mangle]
pub unsafe extern "C" fn npumem_pool_release(pool: *mut NpumemPool) -> Status {
    // SAFETY: `ops_of` checked the pool.
    dispatch!(pool, |ops| unsafe { (ops.release)(pool) })
}

/// The id of tag `name` in `pool`, interned on first use, for `npumem_alloc` and
/// `npumem_alloc_many`.
///
/// # Safety
/// `pool` is NULL or a live pool object; `name` is NULL or a NUL-terminated string; `out` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_tag_id(pool: *mut NpumemPool, name: *const c_char, out: *mut u32) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.tag_id)(pool, name, out) })
}

/// Allocate `size` bytes aligned to `align` (0: the pool's default), with a tag id (0: none).
///
/// # Safety
/// `pool` is NULL or a live pool object; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_alloc(
    pool: *mut NpumemPool,
    size: usize,
    align: usize,
    tag: u32,
    out: *mut NpumemBlock,
) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.alloc)(pool, size, align, tag, out) })
}

/// Free the block behind `handle`.
///
/// # Safety
/// `pool` is NULL or a live pool object.
#[no_mangle]
pub unsafe extern "C" fn npumem_free(pool: *mut NpumemPool, handle: NpumemHandle) -> Status {
    // SAFETY: `ops_of` checked the pool.
    dispatch!(pool, |ops| unsafe { (ops.free)(pool, handle) })
}

/// What the handle's block is now (its offset changes when a compaction moves it).
///
/// # Safety
/// `pool` is NULL or a live pool object; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_block_info(
    pool: *mut NpumemPool,
    handle: NpumemHandle,
    out: *mut NpumemBlock,
) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.block)(pool, handle, out) })
}

/// Pin the handle's block: no compaction moves it and no free frees it until `npumem_unpin`;
/// `out` (NULL or writable) receives where it is.
///
/// # Safety
/// `pool` is NULL or a live pool object; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_pin(pool: *mut NpumemPool, handle: NpumemHandle, out: *mut NpumemBlock) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.pin)(pool, handle, out) })
}

/// Drop a pin that `npumem_pin` took.
///
/// # Safety
/// `pool` is NULL or a live pool object.
#[no_mangle]
pub unsafe extern "C" fn npumem_unpin(pool: *mut NpumemPool, handle: NpumemHandle) -> Status {
    // SAFETY: `ops_of` checked the pool.
    dispatch!(pool, |ops| unsafe { (ops.unpin)(pool, handle) })
}

/// Allocate `count` blocks, or none.
///
/// # Safety
/// `pool` is NULL or a live pool object; `sizes` and `out` NULL or of `count` entries;
/// `failed_index` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_alloc_many(
    pool: *mut NpumemPool,
    sizes: *const usize,
    count: usize,
    align: usize,
    tag: u32,
    out: *mut NpumemBlock,
    failed_index: *mut usize,
) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.alloc_many)(pool, sizes, count, align, tag, out, failed_index) })
}

/// Free `count` blocks, or none.
///
/// # Safety
/// `pool` is NULL or a live pool object; `handles` NULL or of `count` entries;
/// `failed_index` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_free_many(
    pool: *mut NpumemPool,
    handles: *const NpumemHandle,
    count: usize,
    failed_index: *mut usize,
) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.free_many)(pool, handles, count, failed_index) })
}

/// Allocate without a handle: the block never moves; free it by offset and size.
///
/// # Safety
/// `pool` is NULL or a live pool object; `offset` NULL or writable; `address` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_alloc_raw(
    pool: *mut NpumemPool,
    size: usize,
    align: usize,
    offset: *mut usize,
    address: *mut u64,
) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.alloc_raw)(pool, size, align, offset, address) })
}

/// Free a block of `npumem_alloc_raw` by its offset and the size it was allocated with.
///
/// # Safety
/// `pool` is NULL or a live pool object.
#[no_mangle]
pub unsafe extern "C" fn npumem_free_raw(pool: *mut NpumemPool, offset: usize, size: usize) -> Status {
    // SAFETY: `ops_of` checked the pool.
    dispatch!(pool, |ops| unsafe { (ops.free_raw)(pool, offset, size) })
}

/// A snapshot of the pool's usage and counters.
///
/// # Safety
/// `pool` is NULL or a live pool object; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_pool_stats(pool: *mut NpumemPool, out: *mut NpumemStats) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.stats)(pool, out) })
}

/// What the pool is: capacity, cores, backing, device and base address.
///
/// # Safety
/// `pool` is NULL or a live pool object; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn npumem_pool_get_info(pool: *mut NpumemPool, out: *mut NpumemPoolInfo) -> Status {
    // SAFETY: `ops_of` checked the pool; the rest is the caller's contract.
    dispatch!(pool, |ops| unsafe { (ops.info)(pool, out) })
}

/// Set (or clear, with NULL) the callback run when an allocation finds no room.
///
/// # Safety
/// `pool` is NULL or a live pool object; the callback is safe to call from any allocating thread.
#[no_mangle]
pub unsafe extern "C" fn npumem_set_oom_callback(
    pool: *mut NpumemPool,
    callback: Option<OomCallback>,
    user: *mut c_void,
) -> Status {
    // SAFETY: `ops_of` checked the pool.
    dispatch!(pool, |ops| unsafe { (ops.set_oom_callback)(pool, callback, user) })
}

/// The fixed description of a status code (static storage, never NULL).
#[no_mangle]
pub extern "C" fn npumem_strerror(status: Status) -> *const c_char {
    describe(status).as_ptr()
}

/// The calling thread's message of its last failed call ("" if none), valid until its next one.
#[no_mangle]
pub extern "C" fn npumem_last_error() -> *const c_char {
    status::last_error_ptr()
}

/// The library version, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn npumem_version() -> *const c_char {
    static VERSION: &std::ffi::CStr =
        match std::ffi::CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}

/// `NPUMEM_ABI_VERSION` of this library.
#[no_mangle]
pub extern "C" fn npumem_abi_version() -> u32 {
    ABI_VERSION
}

//! `npumem_pool`: the object a C caller holds. Its first two fields are the same in every copy
//! of this library: `ops`, the functions of the copy that made the pool, and a magic word. The
//! entry points call through `ops`, so a pool made by one copy (the Python extension) is served
//! by that copy's code even when the caller linked another (`libnpumem.so`): two copies of the
//! core never touch one pool. The rest of the object is private to the copy that made it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use npumem_core::{Grace, Pool};

use crate::status::{Status, ERR_ABI_MISMATCH, ERR_INVALID_POOL, ERR_NULL_ARGUMENT};
use crate::types::{NpumemBlock, NpumemHandle, NpumemPoolInfo, NpumemStats};

/// `NPUMEM_ABI_VERSION`: bumped when `Ops` or a public struct changes.
pub const ABI_VERSION: u32 = 5;

/// The magic word of a live pool object.
pub const MAGIC: u64 = 0x6e70_756d_656d_5031; // "npumemP1"

/// `npumem_oom_callback`: called when an allocation finds no room; a nonzero return asks for
/// one more try (after the callback released memory).
pub type OomCallback = unsafe extern "C" fn(pool: *mut NpumemPool, size: usize, align: usize, user: *mut c_void) -> i32;

/// The functions of one copy of the library, as the entry points call them. Arguments are
/// passed on unchecked except the pool, which the entry point checked.
#[repr(C)]
pub struct Ops {
    pub abi_version: u32,
    pub retain: unsafe extern "C" fn(*mut NpumemPool) -> Status,
    pub release: unsafe extern "C" fn(*mut NpumemPool) -> Status,
    pub alloc: unsafe extern "C" fn(*mut NpumemPool, usize, usize, u32, *mut NpumemBlock) -> Status,
    pub free: unsafe extern "C" fn(*mut NpumemPool, NpumemHandle) -> Status,
    pub block: unsafe extern "C" fn(*mut NpumemPool, NpumemHandle, *mut NpumemBlock) -> Status,
    pub alloc_many:
        unsafe extern "C" fn(*mut NpumemPool, *const usize, usize, usize, u32, *mut NpumemBlock, *mut usize) -> Status,
    pub free_many: unsafe extern "C" fn(*mut NpumemPool, *const NpumemHandle, usize, *mut usize) -> Status,
    pub alloc_raw: unsafe extern "C" fn(*mut NpumemPool, usize, usize, *mut usize, *mut u64) -> Status,
    pub free_raw: unsafe extern "C" fn(*mut NpumemPool, usize, usize) -> Status,
    pub stats: unsafe extern "C" fn(*mut NpumemPool, *mut NpumemStats) -> Status,
    pub info: unsafe extern "C" fn(*mut NpumemPool, *mut NpumemPoolInfo) -> Status,
    pub set_oom_callback: unsafe extern "C" fn(*mut NpumemPool, Option<OomCallback>, *mut c_void) -> Status,
    pub tag_id: unsafe extern "C" fn(*mut NpumemPool, *const std::ffi::c_char, *mut u32) -> Status,
    /// The calling thread's last error message in that copy.
    pub last_error: unsafe extern "C" fn() -> *const std::ffi::c_char,
    pub pin: unsafe extern "C" fn(*mut NpumemPool, NpumemHandle, *mut NpumemBlock) -> Status,
    pub unpin: unsafe extern "C" fn(*mut NpumemPool, NpumemHandle) -> Status,
}

/// Where a pool's memory is, as C and DLPack see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The address of offset 0.
    pub base_address: u64,
    /// DLPack device type and index.
    pub device_type: i32,
    pub device_id: i32,
}

/// The callback and its user pointer.
#[derive(Clone, Copy)]
pub struct OomHook {
    pub callback: OomCallback,
    pub user: *mut c_void,
}

// SAFETY: the user pointer is the caller's; npumem only passes it back to the callback, which
// the caller registered knowing it may run on any allocating thread.
unsafe impl Send for OomHook {}

/// A pool as C holds it: the `T` of an `Arc<NpumemPool>` whose strong count is the C references
/// (`npumem_pool_retain` / `npumem_pool_release` increment and decrement it).
#[repr(C)]
pub struct NpumemPool {
    /// The functions of the copy that made this object (same offset in every copy).
    pub ops: &'static Ops,
    /// `MAGIC` while the object is live, 0 once it is dropped.
    pub magic: AtomicU64,
    /// The core pool, shared with whoever else holds it (the Python `Pool`).
    pub pool: Arc<Pool>,
    pub location: Location,
    /// Read only when an allocation found no room.
    pub oom: Mutex<Option<OomHook>>,
    /// Whether `oom` holds a callback, kept beside it for the allocation paths, which read it
    /// without the lock: only an allocation that a callback may rescue leaves its failure for
    /// the entry point to record (`native.rs`). A callback set or removed while an allocation
    /// runs only decides whether that allocation's failure is recorded before or after the
    /// callback, never whether it is recorded once.
    pub oom_set: AtomicBool,
    /// The calls of the callback in progress: a replacement waits for those that began before
    /// it, so that its caller may free the callback it replaced (`native.rs`).
    pub oom_calls: Grace,
}

impl NpumemPool {
    /// A fresh object.
    pub fn new(ops: &'static Ops, pool: Arc<Pool>, location: Location) -> NpumemPool {
        NpumemPool {
            ops,
            magic: AtomicU64::new(MAGIC),
            pool,
            location,
            oom: Mutex::new(None),
            oom_set: AtomicBool::new(false),
            oom_calls: Grace::new(),
        }
    }

    /// The address of `offset`.
    #[inline]
    pub fn address(&self, offset: usize) -> u64 {
        self.location.base_address.wrapping_add(offset as u64)
    }
}

impl Drop for NpumemPool {
    fn drop(&mut self) {
        self.magic.store(0, Ordering::Relaxed);
    }
}

/// The functions of the copy that made the pool behind `pool`, after checking that it is a live
/// pool object of a compatible library.
///
/// # Safety
/// `pool` is NULL or points to memory that was an `NpumemPool` (a released one reads as
/// invalid while its memory is not reused; anything else is undefined behaviour).
#[inline]
pub unsafe fn ops_of(pool: *mut NpumemPool) -> Result<&'static Ops, Status> {
    if pool.is_null() {
        return Err(ERR_NULL_ARGUMENT);
    }
    // SAFETY: the first two fields have the same layout in every copy (repr(C)); the caller
    // guarantees the memory is (or was) a pool object.
    let (ops, magic) = unsafe { ((*pool).ops, (*pool).magic.load(Ordering::Relaxed)) };
    if magic != MAGIC {
        return Err(ERR_INVALID_POOL);
    }
    if ops.abi_version != ABI_VERSION {
        return Err(ERR_ABI_MISMATCH);
    }
    Ok(ops)
}

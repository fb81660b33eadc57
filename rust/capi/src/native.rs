//! This copy's implementation of every pool operation: the [`OPS`] table that the pool objects
//! it makes point to. Each function runs under `guard` (no panic crosses into C), checks its
//! pointer arguments, and maps core errors to status codes. The pool argument was checked by
//! the entry point.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::slice;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use npumem_core::{Error, Handle, Pool};

use crate::config;
use crate::object::{Location, NpumemPool, OomCallback, OomHook, Ops, ABI_VERSION};
use crate::status::{
    self, fail, fail_with, guard, Status, ERR_INVALID_ARGUMENT, ERR_INVALID_HANDLE, ERR_NOT_PINNED, ERR_NULL_ARGUMENT,
    ERR_TOO_LARGE, OK,
};
use crate::types::{NpumemBlock, NpumemConfig, NpumemHandle, NpumemPoolInfo, NpumemStats, BACKING_HOST, BACKING_NONE};

/// The functions of this copy of the library.
pub static OPS: Ops = Ops {
    abi_version: ABI_VERSION,
    retain,
    release,
    alloc,
    free,
    block,
    alloc_many,
    free_many,
    alloc_raw,
    free_raw,
    stats,
    info,
    set_oom_callback,
    tag_id,
    last_error,
    pin,
    unpin,
};

/// A pool object (one reference) over `pool`, served by this copy. The caller owns the
/// reference: hand it to C, or give it back with `npumem_pool_release`.
pub fn wrap(pool: Arc<Pool>, location: Location) -> *mut NpumemPool {
    Arc::into_raw(Arc::new(NpumemPool::new(&OPS, pool, location))).cast_mut()
}

/// Build a pool from a C configuration.
///
/// # Safety
/// `config.slab_sizes` is NULL or points to `config.slab_count` readable `size_t`s.
pub unsafe fn create(config: &NpumemConfig) -> Result<*mut NpumemPool, Error> {
    // SAFETY: forwarded from the caller.
    let (core_config, mut location) = unsafe { config::convert(config) }?;
    let pool = Pool::new(core_config)?;
    location.base_address = pool.base_address();
    Ok(wrap(Arc::new(pool), location))
}

/// The object behind a pointer the entry point checked.
///
/// # Safety
/// `pool` is a live pool object made by this copy.
#[inline(always)]
unsafe fn this<'a>(pool: *mut NpumemPool) -> &'a NpumemPool {
    // SAFETY: guaranteed by the caller.
    unsafe { &*pool }
}

fn null(what: &str) -> Status {
    fail_with(ERR_NULL_ARGUMENT, &format!("{what} is NULL"))
}

/// What the error for a handle whose reserved field is not 0 says.
fn forged_message(handle: NpumemHandle) -> String {
    format!(
        "the handle's reserved field is {}, not 0: it is not a handle npumem made (or it was overwritten); nothing was done",
        handle.reserved
    )
}

/// The error for a handle whose reserved field is not 0 ([`NpumemHandle::to_core`]).
fn not_made_by_npumem(handle: NpumemHandle) -> Status {
    fail_with(ERR_INVALID_HANDLE, &forged_message(handle))
}

/// Whether a batch of `count` items is more than the pool could ever hold live (each block
/// takes at least a byte of its capacity): such a count is refused before the caller's array
/// is read, so no count makes a slice longer than memory can hold.
fn beyond_any_batch(p: &NpumemPool, count: usize) -> bool {
    count > p.pool.max_capacity()
}

fn align_of(align: usize) -> Option<usize> {
    (align != 0).then_some(align)
}

thread_local! {
    /// The pools whose out-of-memory callback this thread is running now (innermost last).
    static IN_CALLBACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A reference to a pool object taken for the rest of an entry point's call: the pool outlives
/// the call even when the out-of-memory callback released the caller's last reference.
struct KeepAlive(*const NpumemPool);

impl KeepAlive {
    /// Take a reference to `pool`.
    ///
    /// # Safety
    /// `pool` is a live pool object made by this copy (from `Arc::into_raw`).
    unsafe fn take(pool: *mut NpumemPool) -> KeepAlive {
        // SAFETY: forwarded from the caller.
        unsafe { Arc::increment_strong_count(pool.cast_const()) };
        KeepAlive(pool.cast_const())
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        // SAFETY: the reference `take` took, given back once.
        unsafe { Arc::decrement_strong_count(self.0) };
    }
}

/// The calling thread runs `pool`'s callback until this is dropped.
struct InCallback(usize);

impl InCallback {
    /// Whether the thread is running `pool`'s callback.
    fn is_inside(pool: usize) -> bool {
        IN_CALLBACK.with(|inside| inside.borrow().contains(&pool))
    }

    /// None when the thread is running `pool`'s callback already.
    fn enter(pool: usize) -> Option<InCallback> {
        IN_CALLBACK.with(|inside| {
            let mut inside = inside.borrow_mut();
            (!inside.contains(&pool)).then(|| {
                inside.push(pool);
                InCallback(pool)
            })
        })
    }
}

impl Drop for InCallback {
    fn drop(&mut self) {
        IN_CALLBACK.with(|inside| {
            let mut inside = inside.borrow_mut();
            if let Some(at) = inside.iter().rposition(|&pool| pool == self.0) {
                inside.remove(at);
            }
        });
    }
}

/// After `attempt` failed with `err`: when it found no room and an out-of-memory callback is set
/// and asks for it, run `attempt` once more. An allocation that the callback itself makes on
/// this thread does not call it again (it fails as if no callback were set). The call keeps a
/// reference to the pool from the callback on, in `alive`, so that a callback that releases the
/// caller's last reference leaves the pool live until the entry point returns.
///
/// One allocation has one outcome in `failed_allocs` and the trace, as with Python's
/// out-of-memory handler. While a callback is set, the entry point's first attempt runs with
/// its out-of-memory failure left unrecorded (`Pool::failures_deferred`, see
/// [`first_attempt`]; `deferred` is then true): when that failure is final (the callback
/// declines, or is gone) `record` records it here, and a retry records its own failure, or
/// nothing when it succeeds. So no reader ever counts a rescued allocation, and the counter
/// never goes down. Without a callback the core recorded the failure itself; if a callback
/// was set since, the retry's failure is that same allocation's and is not recorded again.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn retry_after<T>(
    p: &NpumemPool,
    raw: *mut NpumemPool,
    size: usize,
    align: usize,
    (err, deferred): (Error, bool),
    alive: &mut Option<KeepAlive>,
    attempt: impl Fn() -> Result<T, Error>,
    record: impl FnOnce(&Error),
) -> Result<T, Error> {
    // Only out-of-memory failures are deferred: the core recorded any other already.
    if !matches!(err.root(), Error::OutOfMemory { .. }) {
        return Err(err);
    }
    let give_up = |err: Error| {
        if deferred {
            record(&err);
        }
        Err(err)
    };
    let Some(inside) = InCallback::enter(raw as usize) else { return give_up(err) };
    // Counted in before the hook is read: a replacement that this call's read preceded waits
    // for the call to return (`set_oom_callback`).
    let calling = p.oom_calls.enter();
    let hook = *p.oom.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(h) = hook else { return give_up(err) };
    // SAFETY: `raw` is the live pool object the entry point checked.
    *alive = Some(unsafe { KeepAlive::take(raw) });
    // SAFETY: the caller registered the callback for this pool and user pointer, and a
    // replacement waits for this call before its caller may free them.
    let again = unsafe { (h.callback)(raw, size, align, h.user) } != 0;
    drop(calling);
    drop(inside);
    if !again {
        return give_up(err);
    }
    match deferred {
        true => attempt(),
        false => p.pool.failures_deferred(attempt),
    }
}

/// An entry point's first attempt at an allocation, and whether its out-of-memory failure is
/// left for [`retry_after`] to record once it is final: only while a callback is set, so that
/// an allocation without one pays nothing for it.
#[inline(always)]
fn first_attempt<T>(p: &NpumemPool, attempt: impl Fn() -> Result<T, Error>) -> (Result<T, Error>, bool) {
    match p.oom_set.load(Ordering::Relaxed) {
        true => (p.pool.failures_deferred(attempt), true),
        false => (attempt(), false),
    }
}

/// The tag that `blocks` blocks asked for with tag number `tag` are stored with (and so
/// counted under by the pool, `blocks` holds taken on a recycled id): `tag` when it is an id
/// the pool's tag table knows (`npumem_tag_id`), 0 otherwise. Other numbers count with the
/// untagged blocks and are stored as 0, so such a block stays untagged for its whole life, even
/// if its number becomes a tag's id later, and untagged allocations from C pay nothing. A
/// block's stored tag is therefore not 0 exactly when it holds that tag, as every block Python
/// allocates: a free gives back the hold of the tag the block carries.
fn held_tag(p: &NpumemPool, tag: u32, blocks: usize) -> u32 {
    let holds = tag != 0 && (p.pool.tags().is_named(tag) || p.pool.tags().hold(tag, blocks as u64).is_ok());
    if holds {
        tag
    } else {
        0
    }
}

/// `blocks` blocks, stored with tag `stored` ([`held_tag`]), were made or could not be (their
/// holds go back). Nothing to do for 0.
fn settle_tag(p: &NpumemPool, stored: u32, blocks: usize, made: bool) {
    if stored != 0 && !made {
        // `held_tag` took these holds: never refused.
        let _ = p.pool.release_tag(stored, blocks as u64);
    }
}

/// `blocks` blocks that carried tag `tag` were freed: their holds on it go back (see
/// [`held_tag`]).
fn freed_tag(p: &NpumemPool, tag: u32, blocks: usize) {
    if tag != 0 {
        // Every block with a stored tag holds it (`held_tag`): never refused.
        let _ = p.pool.release_tag(tag, blocks as u64);
    }
}

/// The C view of a live block.
fn describe(p: &NpumemPool, handle: Handle) -> Result<NpumemBlock, Error> {
    let info = p.pool.block(handle)?;
    Ok(NpumemBlock {
        handle: NpumemHandle::from_core(handle),
        offset: info.offset,
        size: info.size,
        address: p.address(info.offset),
    })
}

unsafe extern "C" fn retain(pool: *mut NpumemPool) -> Status {
    // SAFETY: checked by the entry point: a live object made by `wrap`, from `Arc::into_raw`.
    unsafe { Arc::increment_strong_count(pool.cast_const()) };
    OK
}

unsafe extern "C" fn release(pool: *mut NpumemPool) -> Status {
    guard(|| {
        // SAFETY: as above; the caller gives back a reference it holds.
        unsafe { Arc::decrement_strong_count(pool.cast_const()) };
        OK
    })
}

unsafe extern "C" fn alloc(
    pool: *mut NpumemPool,
    size: usize,
    align: usize,
    tag: u32,
    out: *mut NpumemBlock,
) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if out.is_null() {
            return null("out");
        }
        let stored = held_tag(p, tag, 1);
        let attempt = || p.pool.alloc_with_offset(size, align_of(align), stored);
        let mut alive = None;
        let made = match first_attempt(p, attempt) {
            (Ok(made), _) => Ok(made),
            (Err(err), deferred) => {
                let record = |_: &Error| p.pool.record_failure(size, align_of(align), stored);
                retry_after(p, pool, size, align, (err, deferred), &mut alive, attempt, record)
            }
        };
        settle_tag(p, stored, 1, made.is_ok());
        match made {
            Ok((handle, offset)) => {
                let block =
                    NpumemBlock { handle: NpumemHandle::from_core(handle), offset, size, address: p.address(offset) };
                // SAFETY: `out` is non-NULL and the caller's to write.
                unsafe { out.write(block) };
                OK
            }
            Err(err) => fail(&err),
        }
    })
}

unsafe extern "C" fn free(pool: *mut NpumemPool, handle: NpumemHandle) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        let Some(handle) = handle.to_core() else { return not_made_by_npumem(handle) };
        // The tag the block carries, read before the free: the one it holds.
        let carried = p.pool.block(handle).map(|b| b.tag);
        match p.pool.free(handle) {
            Ok(()) => {
                if let Ok(tag) = carried {
                    freed_tag(p, tag, 1);
                }
                OK
            }
            Err(err) => fail(&err),
        }
    })
}

unsafe extern "C" fn block(pool: *mut NpumemPool, handle: NpumemHandle, out: *mut NpumemBlock) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if out.is_null() {
            return null("out");
        }
        let Some(core_handle) = handle.to_core() else { return not_made_by_npumem(handle) };
        match describe(p, core_handle) {
            Ok(block) => {
                // SAFETY: `out` is non-NULL and the caller's to write.
                unsafe { out.write(block) };
                OK
            }
            Err(err) => fail(&err),
        }
    })
}

unsafe extern "C" fn pin(pool: *mut NpumemPool, handle: NpumemHandle, out: *mut NpumemBlock) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        let Some(core_handle) = handle.to_core() else { return not_made_by_npumem(handle) };
        // Waits while a compaction moves the block: once pinned, it stays where it is now.
        if let Err(err) = p.pool.pin(core_handle) {
            return fail(&err);
        }
        if !out.is_null() {
            match describe(p, core_handle) {
                // SAFETY: `out` is non-NULL and the caller's to write.
                Ok(block) => unsafe { out.write(block) },
                Err(err) => {
                    // The block went meanwhile (another caller dropped this pin and freed it):
                    // the pin went with it.
                    return fail(&err);
                }
            }
        }
        OK
    })
}

unsafe extern "C" fn unpin(pool: *mut NpumemPool, handle: NpumemHandle) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        let Some(core_handle) = handle.to_core() else { return not_made_by_npumem(handle) };
        match p.pool.unpin(core_handle) {
            Ok(_) => OK,
            // The block is live but holds no pin of the kind npumem_pin takes.
            Err(Error::InvalidBlock { .. }) => fail_with(
                ERR_NOT_PINNED,
                "the block holds no pin to drop: npumem_unpin drops a pin taken with npumem_pin (or Python's \
                 Block.pin()); the pins of buffer views and DLPack exports go with them; nothing was done",
            ),
            Err(err) => fail(&err),
        }
    })
}

/// Write the index of the item a batch error names (`SIZE_MAX` when no item is to blame).
///
/// # Safety
/// `failed_index` is NULL or writable.
unsafe fn report_index(failed_index: *mut usize, err: &Error) {
    let index = match err {
        Error::Batch { index, .. } => *index,
        Error::NamedTwice { again, .. } => *again,
        _ => usize::MAX,
    };
    // SAFETY: NULL or writable by the caller's contract.
    unsafe { blame(failed_index, index) };
}

/// Write `index` to `failed_index` (if not NULL): the item of a batch to blame, `SIZE_MAX`
/// for none.
///
/// # Safety
/// `failed_index` is NULL or writable.
unsafe fn blame(failed_index: *mut usize, index: usize) {
    if !failed_index.is_null() {
        // SAFETY: non-NULL and writable by the caller's contract.
        unsafe { failed_index.write(index) };
    }
}

/// Write `SIZE_MAX` to `failed_index` (if not NULL): a batch refused as a whole, no single
/// item to blame.
///
/// # Safety
/// `failed_index` is NULL or writable.
unsafe fn blame_none(failed_index: *mut usize) {
    // SAFETY: as the caller's.
    unsafe { blame(failed_index, usize::MAX) };
}

unsafe extern "C" fn alloc_many(
    pool: *mut NpumemPool,
    sizes: *const usize,
    count: usize,
    align: usize,
    tag: u32,
    out: *mut NpumemBlock,
    failed_index: *mut usize,
) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if count == 0 {
            return OK;
        }
        let refused = |status| {
            // SAFETY: NULL or writable by the caller's contract.
            unsafe { blame_none(failed_index) };
            status
        };
        if sizes.is_null() {
            return refused(null("sizes"));
        }
        if out.is_null() {
            return refused(null("out"));
        }
        if beyond_any_batch(p, count) {
            let capacity = p.pool.max_capacity();
            return refused(fail_with(
                ERR_TOO_LARGE,
                &format!("a batch of {count} blocks can never succeed: the pool's capacity is {capacity} bytes"),
            ));
        }
        // SAFETY: `sizes` is non-NULL and holds `count` entries by the caller's contract (and
        // `count` is at most the capacity, so the slice's bytes fit in `isize`).
        let sizes = unsafe { slice::from_raw_parts(sizes, count) };
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let stored = held_tag(p, tag, count);
        let attempt = || p.pool.alloc_many(sizes, align_of(align), stored);
        let mut alive = None;
        let made = match first_attempt(p, attempt) {
            (Ok(handles), _) => Ok(handles),
            (Err(err), deferred) => {
                // The item that found no room is the allocation that failed.
                let record = |err: &Error| {
                    if let Error::Batch { index, .. } = err {
                        p.pool.record_failure(sizes[*index], align_of(align), stored);
                    }
                };
                retry_after(p, pool, largest, align, (err, deferred), &mut alive, attempt, record)
            }
        };
        settle_tag(p, stored, count, made.is_ok());
        let handles = match made {
            Ok(handles) => handles,
            Err(err) => {
                // SAFETY: NULL or writable by the caller's contract.
                unsafe { report_index(failed_index, &err) };
                return fail(&err);
            }
        };
        for (i, &handle) in handles.iter().enumerate() {
            let block = describe(p, handle).expect("a block just made is live");
            // SAFETY: `out` is non-NULL and holds `count` entries by the caller's contract.
            unsafe { out.add(i).write(block) };
        }
        OK
    })
}

unsafe extern "C" fn free_many(
    pool: *mut NpumemPool,
    handles: *const NpumemHandle,
    count: usize,
    failed_index: *mut usize,
) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if count == 0 {
            return OK;
        }
        let refused = |status| {
            // SAFETY: NULL or writable by the caller's contract.
            unsafe { blame_none(failed_index) };
            status
        };
        if handles.is_null() {
            return refused(null("handles"));
        }
        if beyond_any_batch(p, count) {
            let capacity = p.pool.max_capacity();
            return refused(fail_with(
                ERR_INVALID_HANDLE,
                &format!(
                    "a batch of {count} handles cannot all name live blocks: the pool's capacity is {capacity} bytes"
                ),
            ));
        }
        // SAFETY: `handles` is non-NULL and holds `count` entries by the caller's contract (and
        // `count` is at most the capacity, so the slice's bytes fit in `isize`).
        let given = unsafe { slice::from_raw_parts(handles, count) };
        let mut handles: Vec<Handle> = Vec::new();
        if handles.try_reserve_exact(count).is_err() {
            let bytes = count.saturating_mul(size_of::<Handle>());
            return refused(fail(&Error::HostMemory { what: "the batch's handles", bytes }));
        }
        for (index, &h) in given.iter().enumerate() {
            let Some(handle) = h.to_core() else {
                // SAFETY: NULL or writable by the caller's contract.
                unsafe { blame(failed_index, index) };
                return fail_with(
                    ERR_INVALID_HANDLE,
                    &format!("item {index} of the batch failed: {}", forged_message(h)),
                );
            };
            handles.push(handle);
        }
        // The tags the blocks carry, read before the free: the rows their allocations were
        // counted in.
        let mut carried: Vec<u32> = handles.iter().filter_map(|&h| p.pool.block(h).ok()).map(|b| b.tag).collect();
        match p.pool.free_many(&handles) {
            Ok(()) => {
                carried.sort_unstable();
                for run in carried.chunk_by(|a, b| a == b) {
                    freed_tag(p, run[0], run.len());
                }
                OK
            }
            Err(err) => {
                // SAFETY: NULL or writable by the caller's contract.
                unsafe { report_index(failed_index, &err) };
                fail(&err)
            }
        }
    })
}

unsafe extern "C" fn alloc_raw(
    pool: *mut NpumemPool,
    size: usize,
    align: usize,
    offset: *mut usize,
    address: *mut u64,
) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if offset.is_null() {
            return null("offset");
        }
        let attempt = || p.pool.alloc_raw(size, align_of(align));
        let mut alive = None;
        let made = match first_attempt(p, attempt) {
            (Ok(at), _) => Ok(at),
            (Err(err), deferred) => {
                let record = |_: &Error| p.pool.record_failure(size, align_of(align), 0);
                retry_after(p, pool, size, align, (err, deferred), &mut alive, attempt, record)
            }
        };
        match made {
            Ok(at) => {
                // SAFETY: `offset` is non-NULL, `address` NULL or writable, by the caller's contract.
                unsafe {
                    offset.write(at);
                    if !address.is_null() {
                        address.write(p.address(at));
                    }
                }
                OK
            }
            Err(err) => fail(&err),
        }
    })
}

unsafe extern "C" fn free_raw(pool: *mut NpumemPool, offset: usize, size: usize) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        match p.pool.free_raw(offset, size) {
            Ok(()) => OK,
            Err(err) => fail(&err),
        }
    })
}

unsafe extern "C" fn stats(pool: *mut NpumemPool, out: *mut NpumemStats) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if out.is_null() {
            return null("out");
        }
        let stats = NpumemStats::from_core(&p.pool.stats());
        // SAFETY: `out` is non-NULL and the caller's to write.
        unsafe { out.write(stats) };
        OK
    })
}

unsafe extern "C" fn info(pool: *mut NpumemPool, out: *mut NpumemPoolInfo) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if out.is_null() {
            return null("out");
        }
        let config = p.pool.config();
        let info = NpumemPoolInfo {
            capacity: config.capacity,
            cores: config.cores,
            alignment: config.alignment,
            backing: if p.pool.has_backing() { BACKING_HOST } else { BACKING_NONE },
            pool_id: p.pool.id(),
            device_type: p.location.device_type,
            device_id: p.location.device_id,
            base_address: p.location.base_address,
        };
        // SAFETY: `out` is non-NULL and the caller's to write.
        unsafe { out.write(info) };
        OK
    })
}

unsafe extern "C" fn set_oom_callback(
    pool: *mut NpumemPool,
    callback: Option<OomCallback>,
    user: *mut c_void,
) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        {
            let mut hook = p.oom.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            *hook = callback.map(|callback| OomHook { callback, user });
            p.oom_set.store(hook.is_some(), Ordering::Relaxed);
        }
        // The calls of the callback replaced that other threads began have returned before
        // this does, so the caller may free it and its user data. Inside a call of this pool's
        // callback, that call is one of them: the replacement then does not wait.
        if !InCallback::is_inside(pool as usize) {
            p.oom_calls.wait_for_earlier(Duration::MAX);
        }
        OK
    })
}

unsafe extern "C" fn tag_id(pool: *mut NpumemPool, name: *const c_char, out: *mut u32) -> Status {
    guard(|| {
        // SAFETY: checked by the entry point.
        let p = unsafe { this(pool) };
        if name.is_null() {
            return null("name");
        }
        if out.is_null() {
            return null("out");
        }
        // SAFETY: non-NULL and NUL-terminated by the caller's contract.
        let name = match unsafe { CStr::from_ptr(name) }.to_str() {
            Ok(name) => name,
            Err(err) => {
                let at = err.valid_up_to();
                return fail_with(
                    ERR_INVALID_ARGUMENT,
                    &format!("the tag name is not UTF-8 (byte {at} starts no character)"),
                );
            }
        };
        match p.pool.tags().acquire(name, 0) {
            Ok(id) => {
                // SAFETY: `out` is non-NULL and the caller's to write.
                unsafe { out.write(id) };
                OK
            }
            Err(err) => fail(&err),
        }
    })
}

unsafe extern "C" fn last_error() -> *const c_char {
    status::last_error_ptr()
}

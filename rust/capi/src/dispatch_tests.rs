//! The entry points against this copy's functions and against another copy's table, and the
//! struct sizes the header promises.

use std::ffi::{c_char, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use npumem_core::{Backing, Pool, PoolConfig, TagLabel};

use crate::exports::{
    npumem_alloc, npumem_alloc_many, npumem_alloc_raw, npumem_block_info, npumem_config_init, npumem_free,
    npumem_free_many, npumem_last_error, npumem_pin, npumem_pool_create, npumem_pool_release, npumem_pool_retain,
    npumem_pool_stats, npumem_set_oom_callback, npumem_tag_id, npumem_unpin,
};
use crate::native::{wrap, OPS};
use crate::object::{Location, NpumemPool, OomCallback, Ops, ABI_VERSION};
use crate::status::{self, Status, OK};
use crate::types::{NpumemBlock, NpumemConfig, NpumemHandle, NpumemPoolInfo, NpumemStats};

fn last_error() -> String {
    // SAFETY: the library returns this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(npumem_last_error()) }.to_string_lossy().into_owned()
}

#[test]
fn structs_have_the_sizes_of_the_header() {
    // Checked against the C compiler's sizeof in tests/c (x86_64 and aarch64 Linux).
    if cfg!(target_pointer_width = "64") {
        assert_eq!(std::mem::size_of::<NpumemConfig>(), 112);
        assert_eq!(std::mem::size_of::<NpumemHandle>(), 16);
        assert_eq!(std::mem::size_of::<NpumemBlock>(), 40);
        assert_eq!(std::mem::size_of::<NpumemStats>(), 184);
        assert_eq!(std::mem::size_of::<NpumemPoolInfo>(), 48);
    }
}

#[test]
fn the_header_stats_struct_has_the_core_fields_in_order() {
    let header = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../python/npumem/include/npumem.h"));
    let body = header
        .split("typedef struct npumem_stats {")
        .nth(1)
        .and_then(|rest| rest.split("} npumem_stats;").next())
        .expect("npumem.h defines npumem_stats");
    let fields: Vec<&str> = body
        .lines()
        .filter_map(|line| line.split(';').next().filter(|_| line.contains(';')))
        .filter_map(|decl| decl.split_whitespace().last())
        .collect();
    assert_eq!(fields, NpumemStats::FIELDS);
}

/// A new pool of 1 MiB on one core, made through the entry points (the caller releases it).
fn one_core_pool() -> *mut NpumemPool {
    let mut config = std::mem::MaybeUninit::<NpumemConfig>::uninit();
    let mut pool = ptr::null_mut();
    // SAFETY: local pointers; `config_init` writes the whole struct.
    unsafe {
        assert_eq!(npumem_config_init(config.as_mut_ptr(), 1 << 20), OK);
        let mut config = config.assume_init();
        config.cores = 1;
        assert_eq!(npumem_pool_create(&config, &mut pool), OK);
    }
    pool
}

#[test]
fn create_alloc_free_release() {
    let pool = one_core_pool();
    // SAFETY: local pointers; the pool is released at the end.
    unsafe {
        let mut block = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 100, 0, 0, &mut block), OK);
        assert_eq!(block.size, 100);
        let mut stats = NpumemStats::default();
        assert_eq!(npumem_pool_stats(pool, &mut stats), OK);
        assert_eq!(stats.blocks_in_use, 1);
        assert_eq!(npumem_free(pool, block.handle), OK);
        assert_eq!(npumem_free(pool, block.handle), status::ERR_DOUBLE_FREE);
        assert!(last_error().contains("double free"), "{}", last_error());
        // A zeroed handle names no pool (ids start at 1): not another pool's block.
        assert_eq!(npumem_free(pool, NpumemHandle::default()), status::ERR_INVALID_HANDLE);
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// A handle whose reserved field is not 0 was not made by npumem (or was overwritten): every
/// call that takes one refuses it, a batch names the item, and nothing is freed.
#[test]
fn a_handle_with_a_reserved_field_set_is_refused() {
    let pool = one_core_pool();
    // SAFETY: local pointers; the pool is released at the end.
    unsafe {
        let mut blocks = [NpumemBlock::default(); 2];
        for block in &mut blocks {
            assert_eq!(npumem_alloc(pool, 100, 0, 0, block), OK);
        }
        let forged = NpumemHandle { reserved: 7, ..blocks[1].handle };
        let mut info = NpumemBlock::default();
        assert_eq!(npumem_block_info(pool, forged, &mut info), status::ERR_INVALID_HANDLE);
        assert!(last_error().contains("reserved field is 7"), "{}", last_error());
        assert_eq!(info, NpumemBlock::default(), "nothing written");
        assert_eq!(npumem_free(pool, forged), status::ERR_INVALID_HANDLE);
        let mut failed = 0usize;
        let handles = [blocks[0].handle, forged];
        assert_eq!(npumem_free_many(pool, handles.as_ptr(), 2, &mut failed), status::ERR_INVALID_HANDLE);
        assert_eq!(failed, 1, "the forged item is named");
        assert!(last_error().starts_with("item 1 of the batch failed"), "{}", last_error());
        let mut stats = NpumemStats::default();
        assert_eq!(npumem_pool_stats(pool, &mut stats), OK);
        assert_eq!(stats.blocks_in_use, 2, "nothing was freed");
        assert_eq!(npumem_block_info(pool, blocks[1].handle, &mut info), OK);
        assert_eq!(info, blocks[1]);
        for block in &blocks {
            assert_eq!(npumem_free(pool, block.handle), OK);
        }
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

#[test]
fn a_pool_shared_with_rust_lives_until_both_let_go() {
    let core = Arc::new(Pool::new(PoolConfig::new(1 << 20).cores(1).backing(Backing::None)).unwrap());
    let location = Location { base_address: 1 << 40, device_type: 2, device_id: 0 };
    let pool = wrap(Arc::clone(&core), location);
    let mut block = NpumemBlock::default();
    // SAFETY: a live pool object and a local output.
    unsafe {
        assert_eq!(npumem_pool_retain(pool), OK);
        assert_eq!(npumem_pool_release(pool), OK);
        assert_eq!(npumem_alloc(pool, 4096, 0, 0, &mut block), OK);
    }
    assert_eq!(block.address, (1 << 40) + block.offset as u64);
    assert_eq!(core.stats().blocks_in_use, 1, "the Rust side sees the C block");
    // SAFETY: the reference made by `wrap`.
    assert_eq!(unsafe { npumem_pool_release(pool) }, OK);
    assert_eq!(Arc::strong_count(&core), 1, "the last C reference let go of the core pool");
    core.free(block.handle.to_core().unwrap()).unwrap();
}

// ----- another copy of the library, as a table of functions ------------------------------------

static FOREIGN_CALLS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn foreign_status(_: *mut NpumemPool) -> Status {
    FOREIGN_CALLS.fetch_add(1, Ordering::Relaxed);
    OK
}

unsafe extern "C" fn foreign_alloc(_: *mut NpumemPool, size: usize, _: usize, _: u32, out: *mut NpumemBlock) -> Status {
    FOREIGN_CALLS.fetch_add(1, Ordering::Relaxed);
    if size == 0 {
        return status::ERR_INVALID_SIZE;
    }
    // SAFETY: the caller's output.
    unsafe { out.write(NpumemBlock { size, offset: 7, ..NpumemBlock::default() }) };
    OK
}

unsafe extern "C" fn foreign_last_error() -> *const c_char {
    c"the other copy's message".as_ptr()
}

/// A table whose every other entry is this copy's (they are never called below).
static FOREIGN: Ops = Ops {
    abi_version: ABI_VERSION,
    retain: foreign_status,
    release: foreign_status,
    alloc: foreign_alloc,
    last_error: foreign_last_error,
    ..copy_of_native()
};

const fn copy_of_native() -> Ops {
    Ops {
        abi_version: OPS.abi_version,
        retain: OPS.retain,
        release: OPS.release,
        alloc: OPS.alloc,
        free: OPS.free,
        block: OPS.block,
        alloc_many: OPS.alloc_many,
        free_many: OPS.free_many,
        alloc_raw: OPS.alloc_raw,
        free_raw: OPS.free_raw,
        stats: OPS.stats,
        info: OPS.info,
        set_oom_callback: OPS.set_oom_callback,
        tag_id: OPS.tag_id,
        last_error: OPS.last_error,
        pin: OPS.pin,
        unpin: OPS.unpin,
    }
}

#[test]
fn entry_points_call_the_copy_that_made_the_pool() {
    let core = Arc::new(Pool::new(PoolConfig::new(1 << 20).cores(1).backing(Backing::None)).unwrap());
    let location = Location { base_address: 0, device_type: 12, device_id: 0 };
    let object = Arc::into_raw(Arc::new(NpumemPool::new(&FOREIGN, core, location))).cast_mut();
    let mut block = NpumemBlock::default();
    // SAFETY: a pool object that lives until the end of the test.
    unsafe {
        assert_eq!(npumem_alloc(object, 10, 0, 0, &mut block), OK);
        assert_eq!((block.size, block.offset), (10, 7), "the other copy's alloc ran");
        assert_eq!(npumem_pool_retain(object), OK);
        assert_eq!(FOREIGN_CALLS.load(Ordering::Relaxed), 2);
        assert_eq!(npumem_alloc(object, 0, 0, 0, &mut block), status::ERR_INVALID_SIZE);
        assert_eq!(last_error(), "the other copy's message", "its message is brought along");
        drop(Arc::from_raw(object.cast_const()));
    }
}

#[test]
fn a_null_or_dead_pool_is_refused() {
    let mut block = NpumemBlock::default();
    // SAFETY: NULL is allowed; the dead object's memory is still ours.
    unsafe {
        assert_eq!(npumem_alloc(ptr::null_mut(), 64, 0, 0, &mut block), status::ERR_NULL_ARGUMENT);
        let core = Arc::new(Pool::new(PoolConfig::new(1 << 20).cores(1).backing(Backing::None)).unwrap());
        let object = NpumemPool::new(&OPS, core, Location { base_address: 0, device_type: 12, device_id: 0 });
        object.magic.store(0, Ordering::Relaxed);
        let raw = &object as *const NpumemPool as *mut NpumemPool;
        assert_eq!(npumem_alloc(raw, 64, 0, 0, &mut block), status::ERR_INVALID_POOL);
        assert_eq!(object.pool.stats().alloc_count, 0);
    }
}

#[test]
fn the_oom_callback_gets_one_more_try() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn count(_: *mut NpumemPool, _: usize, _: usize, user: *mut c_void) -> i32 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        user as usize as i32
    }
    let callback: OomCallback = count;
    let core = Arc::new(Pool::new(PoolConfig::new(4 << 20).cores(1).backing(Backing::None)).unwrap());
    let pool = wrap(core, Location { base_address: 0, device_type: 12, device_id: 0 });
    let mut block = NpumemBlock::default();
    // SAFETY: a live pool object and local outputs.
    unsafe {
        assert_eq!(crate::exports::npumem_set_oom_callback(pool, Some(callback), ptr::null_mut()), OK);
        assert_eq!(npumem_alloc(pool, 8 << 20, 0, 0, &mut block), status::ERR_TOO_LARGE);
        assert_eq!(CALLS.load(Ordering::Relaxed), 0, "not for requests that can never succeed");
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut block), OK);
        assert_eq!(npumem_alloc(pool, 2 << 20, 0, 0, &mut block), status::ERR_OUT_OF_MEMORY);
        assert_eq!(CALLS.load(Ordering::Relaxed), 1);
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// A 4 MiB pool on one core (no backing) wrapped for C, and its core pool.
fn wrapped_pool() -> (Arc<Pool>, *mut NpumemPool) {
    let core = Arc::new(Pool::new(PoolConfig::new(4 << 20).cores(1).backing(Backing::None)).unwrap());
    let pool = wrap(Arc::clone(&core), Location { base_address: 0, device_type: 12, device_id: 0 });
    (core, pool)
}

/// An allocation that the out-of-memory callback makes from its own pool, and that finds no
/// room either, fails at once instead of calling the callback again (which recursed until the
/// stack overflowed).
#[test]
fn an_allocation_inside_the_oom_callback_does_not_call_it_again() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    static INNER: AtomicUsize = AtomicUsize::new(usize::MAX);
    unsafe extern "C" fn allocate_again(pool: *mut NpumemPool, size: usize, _: usize, _: *mut c_void) -> i32 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        let mut block = NpumemBlock::default();
        // SAFETY: the pool the callback was called for, and a local output.
        INNER.store(unsafe { npumem_alloc(pool, size, 0, 0, &mut block) } as usize, Ordering::Relaxed);
        0
    }
    let (_core, pool) = wrapped_pool();
    let mut block = NpumemBlock::default();
    // SAFETY: a live pool object and local outputs.
    unsafe {
        assert_eq!(crate::exports::npumem_set_oom_callback(pool, Some(allocate_again), ptr::null_mut()), OK);
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut block), OK);
        assert_eq!(npumem_alloc(pool, 2 << 20, 0, 0, &mut block), status::ERR_OUT_OF_MEMORY);
        assert_eq!(CALLS.load(Ordering::Relaxed), 1, "the callback ran once");
        assert_eq!(INNER.load(Ordering::Relaxed), status::ERR_OUT_OF_MEMORY as usize);
        // The next failing allocation calls it again: the first call's scope has ended.
        assert_eq!(npumem_alloc(pool, 2 << 20, 0, 0, &mut block), status::ERR_OUT_OF_MEMORY);
        assert_eq!(CALLS.load(Ordering::Relaxed), 2);
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// A replacement of the callback returns only once the calls of the callback it replaced that
/// other threads began have returned, so that its caller may free that callback (a caller that
/// freed a ctypes callback after clearing it crashed the thread still calling it).
#[test]
fn a_replacement_waits_for_the_calls_of_the_callback_it_replaced() {
    static ENTERED: AtomicUsize = AtomicUsize::new(0);
    static RETURNED: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn slow(_: *mut NpumemPool, _: usize, _: usize, _: *mut c_void) -> i32 {
        ENTERED.store(1, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(300));
        RETURNED.store(1, Ordering::SeqCst);
        0
    }
    let (_core, pool) = wrapped_pool();
    let mut block = NpumemBlock::default();
    // SAFETY: a live pool object and local outputs.
    unsafe {
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut block), OK);
        assert_eq!(npumem_set_oom_callback(pool, Some(slow), ptr::null_mut()), OK);
    }
    let shared = pool as usize;
    let failing = std::thread::spawn(move || {
        let mut block = NpumemBlock::default();
        // SAFETY: the pool outlives this thread (joined below); a local output.
        unsafe { npumem_alloc(shared as *mut NpumemPool, 2 << 20, 0, 0, &mut block) }
    });
    while ENTERED.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    // SAFETY: a live pool object.
    assert_eq!(unsafe { npumem_set_oom_callback(pool, None, ptr::null_mut()) }, OK);
    assert_eq!(RETURNED.load(Ordering::SeqCst), 1, "the replacement returned while the old callback ran");
    assert_eq!(failing.join().unwrap(), status::ERR_OUT_OF_MEMORY);
    // SAFETY: the test's reference.
    assert_eq!(unsafe { npumem_pool_release(pool) }, OK);
}

/// A callback that clears itself (the replacement, made inside its own call, cannot wait for
/// that call) returns, and is not called again.
#[test]
fn a_callback_may_clear_itself() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn once(pool: *mut NpumemPool, _: usize, _: usize, _: *mut c_void) -> i32 {
        CALLS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the pool the callback was called for.
        unsafe { npumem_set_oom_callback(pool, None, ptr::null_mut()) }
    }
    let (_core, pool) = wrapped_pool();
    let mut block = NpumemBlock::default();
    // SAFETY: a live pool object and local outputs.
    unsafe {
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut block), OK);
        assert_eq!(npumem_set_oom_callback(pool, Some(once), ptr::null_mut()), OK);
    }
    let shared = pool as usize;
    let (done, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut block = NpumemBlock::default();
        for _ in 0..2 {
            // SAFETY: the pool outlives these calls (the test waits for them); a local output.
            let status = unsafe { npumem_alloc(shared as *mut NpumemPool, 2 << 20, 0, 0, &mut block) };
            done.send(status).unwrap();
        }
    });
    for _ in 0..2 {
        let status = answer.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(status, Ok(status::ERR_OUT_OF_MEMORY), "the callback waited for its own call");
    }
    assert_eq!(CALLS.load(Ordering::SeqCst), 1);
    // SAFETY: the test's reference.
    assert_eq!(unsafe { npumem_pool_release(pool) }, OK);
}

/// A callback that releases the caller's last reference: the pool stays live until the
/// allocation that called it returns (it read freed memory after the callback), then goes.
#[test]
fn a_callback_that_releases_the_last_reference_leaves_the_pool_live_until_the_call_returns() {
    static CORE: std::sync::OnceLock<Arc<Pool>> = std::sync::OnceLock::new();
    static HOLDERS_INSIDE: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn release(pool: *mut NpumemPool, _: usize, _: usize, _: *mut c_void) -> i32 {
        // SAFETY: the caller's reference, given back.
        assert_eq!(unsafe { npumem_pool_release(pool) }, OK);
        // The test's clone, this static's and the pool object's (still live).
        HOLDERS_INSIDE.store(Arc::strong_count(CORE.get().unwrap()), Ordering::Relaxed);
        1
    }
    let (core, pool) = wrapped_pool();
    CORE.set(Arc::clone(&core)).unwrap();
    let mut block = NpumemBlock::default();
    // SAFETY: a live pool object until the callback releases it; local outputs.
    unsafe {
        assert_eq!(crate::exports::npumem_set_oom_callback(pool, Some(release), ptr::null_mut()), OK);
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut block), OK);
        assert_eq!(npumem_alloc(pool, 2 << 20, 0, 0, &mut block), status::ERR_OUT_OF_MEMORY);
    }
    assert_eq!(HOLDERS_INSIDE.load(Ordering::Relaxed), 3, "the pool object was live in the callback");
    assert_eq!(Arc::strong_count(&core), 2, "and was dropped when the call returned");
}

/// A tag name is compared as given: names that are not UTF-8 are refused (they were all read
/// as U+FFFD and so shared one tag).
#[test]
fn a_tag_name_that_is_not_utf8_is_refused() {
    let pool = one_core_pool();
    let (mut a, mut b) = (0u32, 0u32);
    // SAFETY: a live pool, NUL-terminated names and local outputs.
    unsafe {
        let bad = c"ok\xff\xfe";
        assert_eq!(crate::exports::npumem_tag_id(pool, bad.as_ptr(), &mut a), status::ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("not UTF-8 (byte 2"), "{}", last_error());
        assert_eq!(
            CStr::from_ptr(crate::exports::npumem_strerror(status::ERR_INVALID_ARGUMENT)),
            c"an argument is malformed"
        );
        assert_eq!(crate::exports::npumem_tag_id(pool, c"\u{fffd}".as_ptr(), &mut a), OK);
        assert_eq!(crate::exports::npumem_tag_id(pool, c"weights".as_ptr(), &mut b), OK);
        assert_ne!(a, b);
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// A request larger than what the pool's chunks can hold, though not than its capacity (the
/// arena's end is shorter than its smallest block), can never succeed: `TOO_LARGE`, and the
/// callback is not called.
#[test]
fn a_request_beyond_the_usable_bytes_is_too_large() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn count(_: *mut NpumemPool, _: usize, _: usize, _: *mut c_void) -> i32 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        0
    }
    let capacity = (3 << 20) + 100;
    let core = Arc::new(Pool::new(PoolConfig::new(capacity).cores(1).backing(Backing::None)).unwrap());
    let usable = core.stats().usable_capacity;
    assert!(usable < capacity, "the arena ends in a part shorter than a block: {usable}");
    let pool = wrap(core, Location { base_address: 0, device_type: 12, device_id: 0 });
    let mut block = NpumemBlock::default();
    // SAFETY: a live pool object and local outputs.
    unsafe {
        assert_eq!(crate::exports::npumem_set_oom_callback(pool, Some(count), ptr::null_mut()), OK);
        assert_eq!(npumem_alloc(pool, usable + 1, 0, 0, &mut block), status::ERR_TOO_LARGE);
        assert!(last_error().contains(&format!("blocks can use {usable}")), "{}", last_error());
        assert_eq!(CALLS.load(Ordering::Relaxed), 0);
        assert_eq!(npumem_alloc(pool, usable, 0, 0, &mut block), OK, "all of the usable bytes can be one block");
        assert_eq!(npumem_free(pool, block.handle), OK);
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// The live blocks and requested bytes `core` counts under `label` ((0, 0) without a row).
fn tag_row(core: &Pool, label: &TagLabel) -> (usize, usize) {
    core.tag_figures()
        .iter()
        .find(|row| &row.label == label)
        .map_or((0, 0), |row| (row.blocks_in_use, row.requested_bytes_in_use))
}

/// Blocks allocated with a tag number that was no tag id then count as untagged, and stay so
/// when a tag gets that id later: their frees (one by one or in a batch) come off the untagged
/// row, never off the tag's.
#[test]
fn a_free_is_counted_in_the_row_its_allocation_was_counted_in() {
    let (core, pool) = wrapped_pool();
    let weights = TagLabel::Named("weights".into());
    // SAFETY: a live pool object and local arrays and outputs.
    unsafe {
        let mut early = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 512, 0, 1, &mut early), OK);
        let sizes = [100usize, 200];
        let mut batch = [NpumemBlock::default(); 2];
        assert_eq!(npumem_alloc_many(pool, sizes.as_ptr(), 2, 0, 1, batch.as_mut_ptr(), ptr::null_mut()), OK);
        assert_eq!(core.block(early.handle.to_core().unwrap()).unwrap().tag, 0, "kept untagged");
        let mut id = 0u32;
        assert_eq!(npumem_tag_id(pool, c"weights".as_ptr(), &mut id), OK);
        assert_eq!(id, 1, "the tag got the number the early blocks gave");
        let mut tagged = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 64, 0, id, &mut tagged), OK);
        assert_eq!((tag_row(&core, &weights), tag_row(&core, &TagLabel::Untagged)), ((1, 64), (3, 812)));

        assert_eq!(npumem_free(pool, early.handle), OK);
        assert_eq!((tag_row(&core, &weights), tag_row(&core, &TagLabel::Untagged)), ((1, 64), (2, 300)));
        let handles = [batch[0].handle, batch[1].handle];
        assert_eq!(npumem_free_many(pool, handles.as_ptr(), 2, ptr::null_mut()), OK);
        assert_eq!((tag_row(&core, &weights), tag_row(&core, &TagLabel::Untagged)), ((1, 64), (0, 0)));
        assert_eq!(npumem_free(pool, tagged.handle), OK);
        assert_eq!(tag_row(&core, &weights), (0, 0));
        assert_eq!(npumem_pool_release(pool), OK);
    }
    assert_eq!(core.check().unwrap(), 0);
}

/// A recycled tag id (beyond the named ones) is held while a C block carries it, and its free
/// counts the block off the shared row of such tags.
#[test]
fn a_c_block_with_a_recycled_tag_id_is_counted_off_when_freed() {
    let (core, pool) = wrapped_pool();
    // SAFETY: a live pool object, NUL-terminated names and local outputs.
    unsafe {
        let mut id = 0u32;
        for n in 0..=npumem_core::NAMED_TAGS {
            let name = std::ffi::CString::new(format!("tag{n}")).unwrap();
            assert_eq!(npumem_tag_id(pool, name.as_ptr(), &mut id), OK);
        }
        assert!(id > npumem_core::NAMED_TAGS, "a pooled id: {id}");
        let mut block = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 300, 0, id, &mut block), OK);
        assert_eq!(tag_row(&core, &TagLabel::Others), (1, 300));
        assert_eq!(npumem_free(pool, block.handle), OK);
        assert_eq!(tag_row(&core, &TagLabel::Others), (0, 0));
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// With a callback that asks for a retry, an allocation counts once in `failed_allocs` when
/// the retry finds no room either, and not at all when the retry succeeds: for every kind of
/// allocation, as with Python's out-of-memory handler.
#[test]
fn an_allocation_retried_after_the_callback_counts_one_outcome() {
    static RESERVE: std::sync::Mutex<Option<NpumemHandle>> = std::sync::Mutex::new(None);
    unsafe extern "C" fn retry(pool: *mut NpumemPool, _: usize, _: usize, _: *mut c_void) -> i32 {
        if let Some(reserve) = RESERVE.lock().unwrap().take() {
            // SAFETY: the pool the callback was called for.
            assert_eq!(unsafe { npumem_free(pool, reserve) }, OK);
        }
        1
    }
    let (core, pool) = wrapped_pool();
    let failed = || core.stats().failed_allocs;
    // SAFETY: a live pool object and local arrays and outputs.
    unsafe {
        let mut hog = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut hog), OK);
        assert_eq!(npumem_set_oom_callback(pool, Some(retry), ptr::null_mut()), OK);
        let mut block = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 2 << 20, 0, 0, &mut block), status::ERR_OUT_OF_MEMORY);
        assert_eq!(failed(), 1, "alloc");
        let mut offset = 0usize;
        assert_eq!(npumem_alloc_raw(pool, 2 << 20, 0, &mut offset, ptr::null_mut()), status::ERR_OUT_OF_MEMORY);
        assert_eq!(failed(), 2, "alloc_raw");
        let sizes = [1usize << 20, 1 << 20];
        let mut out = [NpumemBlock::default(); 2];
        let mut index = 0usize;
        assert_eq!(
            npumem_alloc_many(pool, sizes.as_ptr(), 2, 0, 0, out.as_mut_ptr(), &mut index),
            status::ERR_OUT_OF_MEMORY
        );
        assert_eq!(failed(), 3, "alloc_many");
        // The callback frees the hog: the retry succeeds and the allocation never failed.
        *RESERVE.lock().unwrap() = Some(hog.handle);
        assert_eq!(npumem_alloc(pool, 2 << 20, 0, 0, &mut block), OK);
        assert_eq!(failed(), 3, "a rescued allocation");
        assert_eq!(npumem_free(pool, block.handle), OK);
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// An allocation that the callback rescues is never counted nor traced as failed, not even
/// while the callback runs (a counter that other threads read must never go down); one that
/// the callback declines is counted and traced once, when it fails for good.
#[test]
fn a_rescued_allocation_is_never_counted_as_failed() {
    static CORE: std::sync::Mutex<Option<(Arc<Pool>, NpumemHandle)>> = std::sync::Mutex::new(None);
    static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);
    unsafe extern "C" fn rescue(pool: *mut NpumemPool, _: usize, _: usize, _: *mut c_void) -> i32 {
        let Some((core, hog)) = CORE.lock().unwrap().take() else { return 0 };
        SEEN.store(core.stats().failed_allocs, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the pool the callback was called for.
        assert_eq!(unsafe { npumem_free(pool, hog) }, OK);
        1
    }
    let (core, pool) = wrapped_pool();
    core.trace_start(64).unwrap();
    // SAFETY: a live pool object and local outputs.
    unsafe {
        let mut hog = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut hog), OK);
        assert_eq!(npumem_set_oom_callback(pool, Some(rescue), ptr::null_mut()), OK);
        *CORE.lock().unwrap() = Some((Arc::clone(&core), hog.handle));
        let mut block = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 2 << 20, 0, 0, &mut block), OK);
        assert_eq!(SEEN.load(std::sync::atomic::Ordering::Relaxed), 0, "counted while the callback ran");
        assert_eq!(core.stats().failed_allocs, 0);
        // Declined (the callback has nothing left to free): one failure, traced once.
        let mut other = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 3 << 20, 0, 0, &mut other), status::ERR_OUT_OF_MEMORY);
        assert_eq!(core.stats().failed_allocs, 1);
        let kinds: Vec<_> = core.trace_drain().unwrap().iter().map(|e| (e.kind.name(), e.size)).collect();
        assert_eq!(kinds, [("alloc", 3 << 20), ("free", 3 << 20), ("alloc", 2 << 20), ("failed", 3 << 20)]);
        assert_eq!(npumem_free(pool, block.handle), OK);
        assert_eq!(npumem_pool_release(pool), OK);
    }
}

/// A pin keeps a block from being freed until it is dropped; unpinning a block that holds no
/// pin, and pinning a freed or forged handle, are refused and change nothing.
#[test]
fn a_pinned_block_is_not_freed_until_unpinned() {
    let (core, pool) = wrapped_pool();
    // SAFETY: a live pool object and local arrays and outputs.
    unsafe {
        let mut block = NpumemBlock::default();
        assert_eq!(npumem_alloc(pool, 1000, 0, 0, &mut block), OK);
        let mut pinned = NpumemBlock::default();
        assert_eq!(npumem_pin(pool, block.handle, &mut pinned), OK);
        assert_eq!(pinned, block, "where the block is");
        assert_eq!(npumem_pin(pool, block.handle, ptr::null_mut()), OK, "out may be NULL");
        let handle = block.handle.to_core().unwrap();
        assert_eq!(core.block(handle).unwrap().pins, 2);
        assert_eq!(npumem_free(pool, block.handle), status::ERR_PINNED);
        let mut index = 9usize;
        assert_eq!(npumem_free_many(pool, &block.handle, 1, &mut index), status::ERR_PINNED);
        assert_eq!(index, 0);
        assert_eq!(npumem_unpin(pool, block.handle), OK);
        assert_eq!(npumem_free(pool, block.handle), status::ERR_PINNED, "one pin is left");
        assert_eq!(npumem_unpin(pool, block.handle), OK);
        assert_eq!(npumem_unpin(pool, block.handle), status::ERR_NOT_PINNED);
        assert!(last_error().contains("holds no pin to drop"), "{}", last_error());
        assert_eq!(
            CStr::from_ptr(crate::exports::npumem_strerror(status::ERR_NOT_PINNED)),
            c"the block holds no pin to drop"
        );
        assert_eq!(core.block(handle).unwrap().pins, 0, "a refused unpin changes nothing");
        let forged = NpumemHandle { reserved: 1, ..block.handle };
        assert_eq!(npumem_pin(pool, forged, &mut pinned), status::ERR_INVALID_HANDLE);
        assert_eq!(npumem_unpin(pool, forged), status::ERR_INVALID_HANDLE);
        assert_eq!(npumem_free(pool, block.handle), OK);
        assert_eq!(npumem_pin(pool, block.handle, &mut pinned), status::ERR_INVALID_HANDLE);
        assert_eq!(npumem_unpin(pool, block.handle), status::ERR_INVALID_HANDLE);
        assert_eq!(npumem_pin(ptr::null_mut(), block.handle, &mut pinned), status::ERR_NULL_ARGUMENT);
        assert_eq!(npumem_pool_release(pool), OK);
    }
    assert_eq!(core.check().unwrap(), 0);
}

//! Fault injection at every host allocation: a pool whose host runs out of memory (a table, a
//! handle segment, the backing, a trace ring) reports a typed error, leaves nothing half-made
//! and stays usable; and metadata grows with use, not with capacity.

use crate::config::{Backing, PoolConfig};
use crate::error::Error;
use crate::pool::pool::Pool;
use crate::util::failpoint;

/// A configuration that passes every site: host backing, two cores, a partial last chunk.
fn config() -> PoolConfig {
    PoolConfig::new((16 << 20) + (1 << 20)).cores(2)
}

fn is_host_error(err: &Error) -> bool {
    matches!(err, Error::HostMemory { .. } | Error::Backing(_))
}

/// The pool works: blocks of every route, a free, a consistent check.
fn exercise(pool: &Pool) {
    let handles: Vec<_> = [64, 3000, 100_000, 3 << 20].iter().map(|&n| pool.alloc(n, None, 0).unwrap()).collect();
    for h in handles {
        pool.free(h).unwrap();
    }
    pool.check().unwrap();
}

#[test]
fn every_host_allocation_of_a_new_pool_can_fail_cleanly() {
    let (pool, hits) = failpoint::record(|| Pool::new(config()));
    exercise(&pool.unwrap());
    let sites = failpoint::sites(&hits);
    for name in ["host.table", "host.vec", "host.backing"] {
        assert!(sites.iter().any(|(n, _)| *n == name), "pool creation never passes {name}: {sites:?}");
    }
    for &(name, nth) in &sites {
        let (result, fired) = failpoint::fail_at(name, nth, || Pool::new(config()));
        assert!(fired, "{name} #{nth} was not reached again");
        match result {
            Err(err) => assert!(is_host_error(&err), "{name} #{nth}: {err:?}"),
            Ok(_) => panic!("{name} #{nth} failed, yet the pool was made"),
        }
    }
    // Every failure released what was made before it; the next pool is whole.
    exercise(&Pool::new(config()).unwrap());
}

#[test]
fn a_handle_segment_the_host_cannot_give_fails_the_allocation_only() {
    let pool = Pool::new(PoolConfig::new(4 << 20).backing(Backing::None)).unwrap();
    // The first segment of the handle table holds 4096 slots; the next block needs a new one.
    let held: Vec<_> = (0..4096).map(|_| pool.alloc(64, None, 0).unwrap()).collect();
    let before = pool.stats();
    let (result, fired) = failpoint::fail_at("host.segment", 0, || pool.alloc(64, None, 0));
    assert!(fired);
    assert!(matches!(result, Err(Error::HostMemory { .. })), "{result:?}");
    let after = pool.stats();
    assert_eq!(
        (after.bytes_in_use, after.alloc_count, after.free_count),
        (before.bytes_in_use, before.alloc_count, before.free_count)
    );
    pool.check().unwrap();
    let next = pool.alloc(64, None, 0).unwrap();
    pool.free(next).unwrap();
    for h in held {
        pool.free(h).unwrap();
    }
    pool.check().unwrap();
}

/// A batch whose tables (its requests, places and handles) the host cannot give is an error,
/// not an abort, and changes nothing; with a size refused in it, that size is the error.
#[test]
fn a_batch_the_host_cannot_list_is_an_error_that_changes_nothing() {
    let pool = Pool::new(config()).unwrap();
    let sizes = [64, 3000, 100_000, 3 << 20];
    let (made, hits) = failpoint::record(|| pool.alloc_many(&sizes, None, 0));
    pool.free_many(&made.unwrap()).unwrap();
    let tables = hits.iter().filter(|&&name| name == "host.vec").count();
    assert!(tables >= 3, "a batch reserves its three tables: {hits:?}");
    let before = pool.stats();
    for nth in 0..3 {
        let (result, fired) = failpoint::fail_at("host.vec", nth, || pool.alloc_many(&sizes, None, 0));
        assert!(fired);
        assert!(matches!(result, Err(Error::HostMemory { .. })), "table {nth}: {result:?}");
        let (result, _) = failpoint::fail_at("host.vec", nth, || pool.alloc_many(&[64, 0], None, 0));
        assert!(matches!(result, Err(Error::Batch { index: 1, .. })), "table {nth}: {result:?}");
    }
    let after = pool.stats();
    assert_eq!(
        (after.bytes_in_use, after.alloc_count, after.blocks_in_use, after.failed_allocs),
        (before.bytes_in_use, before.alloc_count, before.blocks_in_use, before.failed_allocs)
    );
    pool.check().unwrap();
    exercise(&pool);
}

#[test]
fn a_trace_ring_the_host_cannot_give_leaves_tracing_as_it_was() {
    let pool = Pool::new(config()).unwrap();
    let (result, fired) = failpoint::fail_at("host.vec", 1, || pool.trace_start(1000));
    assert!(fired);
    assert!(matches!(result, Err(Error::HostMemory { .. })), "{result:?}");
    assert!(!pool.trace_status().enabled);
    pool.trace_start(1000).unwrap();
    let h = pool.alloc(100, None, 0).unwrap();
    pool.free(h).unwrap();
    assert_eq!(pool.trace_drain().unwrap().len(), 2);
}

#[test]
fn a_pool_larger_than_the_host_is_an_error_not_an_abort() {
    // 2^48 bytes of host backing is more than any host maps.
    let err = Pool::new(PoolConfig::new(crate::config::MAX_CAPACITY)).unwrap_err();
    assert!(is_host_error(&err), "{err:?}");
}

/// `check()` of a large arena reads the lines, trees and granule states of the chunks that
/// were opened, not the zero pages of the rest (at 256 TiB, a check took over a minute), and
/// still finds a never-opened chunk that claims a core.
#[test]
fn a_check_of_a_huge_pool_reads_only_the_chunks_that_were_opened() {
    let pool = Pool::new(PoolConfig::new(1 << 40).cores(2).backing(Backing::None)).unwrap();
    let handles: Vec<_> = [64, 5000, 1 << 20, 3 << 20].iter().map(|&n| pool.alloc(n, None, 0).unwrap()).collect();
    assert_eq!(pool.check().unwrap(), handles.len());
    let a = pool.arena();
    // The per-chunk states and bitmaps are read (a few bytes per chunk); the lines (128 bytes
    // per chunk), trees and granule states only below the last opened chunk.
    let read = a.lines.resident_bytes() + a.trees.resident_bytes() + a.block_caches.resident_bytes();
    assert!(read < 4 << 20, "check() committed {read} bytes of lines, trees and granule states");
    let far = a.geometry.chunks - 1;
    assert!(far >= a.opened_to.load(std::sync::atomic::Ordering::Relaxed));
    let state = a.global.state(far);
    a.global.set_state(far, crate::arena::global::ChunkState::Core(1));
    let err = pool.check().unwrap_err();
    a.global.set_state(far, state);
    assert!(err.to_string().contains(&format!("chunk {far} (Core(1)): granted, but never opened")), "{err}");
    // A never-granted chunk that a core's owner bits claim (read 64 chunks at a time there).
    a.cores[1].own(far);
    let err = pool.check().unwrap_err();
    a.cores[1].disown(far);
    assert!(err.to_string().contains(&format!("chunk {far}: never granted, but owned by core 1")), "{err}");
    for h in handles {
        pool.free(h).unwrap();
    }
    pool.check().unwrap();
}

#[test]
fn an_empty_huge_pool_commits_almost_no_host_memory() {
    // 1 TiB of device memory: its metadata is reserved, and committed only where used.
    let pool = Pool::new(PoolConfig::new(1 << 40).cores(4).backing(Backing::None)).unwrap();
    let handles: Vec<_> = [64, 5000, 1 << 20, 300 << 20].iter().map(|&n| pool.alloc(n, None, 0).unwrap()).collect();
    for h in handles {
        pool.free(h).unwrap();
    }
    // Other tests run meanwhile, so the process's RSS says little; the metadata's own pages do.
    let committed = pool.arena().committed_metadata_bytes();
    assert!(committed < 16 << 20, "an empty 1 TiB pool committed {committed} bytes of metadata");
    pool.check().unwrap();
}

/// A pool with blocks of every route, slabs with holes, a freed block in a cache, a block of
/// the raw API and a trace recording: something for every table of the walks below.
fn filled() -> (Pool, Vec<crate::handle::id::Handle>) {
    let pool = Pool::new(config()).unwrap();
    let mut held = Vec::new();
    for (i, &n) in [64, 100, 3000, 5000, 100_000, 3 << 20, 64, 200].iter().cycle().take(24).enumerate() {
        let h = pool.alloc(n + i, None, (i % 3) as u32).unwrap();
        if i % 3 == 1 {
            pool.free(h).unwrap();
        } else {
            held.push(h);
        }
    }
    pool.alloc_raw(5000, None).unwrap();
    (pool, held)
}

/// Every growth of a table that `op` passes (failpoint `host.vec`) fails in turn: `op` reports
/// `Error::HostMemory` and the pool is as it was (its stats equal, `check()` passes).
fn every_growth_fails_cleanly<T: std::fmt::Debug>(pool: &Pool, what: &str, op: impl Fn() -> crate::Result<T>) {
    let (result, hits) = failpoint::record(&op);
    result.unwrap();
    let growths = hits.iter().filter(|&&name| name == "host.vec").count();
    assert!(growths > 0, "{what} grows no table: {hits:?}");
    let before = pool.stats();
    for nth in 0..growths {
        let (result, fired) = failpoint::fail_at("host.vec", nth, &op);
        assert!(fired, "{what}: growth {nth} was not reached again");
        match result {
            Err(Error::HostMemory { what: table, bytes }) => assert!(!table.is_empty() && bytes > 0, "{what} #{nth}"),
            other => panic!("{what}: growth {nth} failed, yet it gave {other:?}"),
        }
        assert_eq!(pool.stats(), before, "{what}: growth {nth} changed the pool");
        pool.check().unwrap();
    }
    op().unwrap();
}

#[test]
fn a_snapshot_the_host_cannot_list_is_an_error_that_changes_nothing() {
    let (pool, _held) = filled();
    let whole = pool.snapshot().unwrap();
    assert!(!whole.untracked.is_empty() && !whole.slab_cached.is_empty());
    every_growth_fails_cleanly(&pool, "snapshot()", || pool.snapshot());
    assert_eq!(pool.snapshot().unwrap().blocks, whole.blocks);
}

#[test]
fn a_list_of_blocks_the_host_cannot_give_is_an_error() {
    let (pool, held) = filled();
    assert_eq!(pool.blocks().unwrap().len(), held.len());
    every_growth_fails_cleanly(&pool, "blocks()", || pool.blocks());
}

#[test]
fn a_check_the_host_cannot_walk_is_an_error_that_changes_nothing() {
    let (pool, held) = filled();
    every_growth_fails_cleanly(&pool, "check()", || pool.check());
    assert_eq!(pool.check().unwrap(), held.len() + 1, "the raw block counts");
}

/// A drain the host has no room for leaves the events in the rings: the next drain has them
/// all, none counted dropped. Two threads record, so the merge has two streams to merge: they
/// wait for each other before and after, so that each holds a ring of its own (a thread that
/// ran after the other had ended would take over its ring, and each drain would grow its
/// tables a different number of times).
#[test]
fn a_trace_drain_the_host_cannot_hold_leaves_the_events_for_the_next() {
    let pool = Pool::new(config()).unwrap();
    let record = |pool: &Pool| {
        pool.trace_start(4096).unwrap();
        let together = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for t in 0..2 {
                let together = &together;
                s.spawn(move || {
                    together.wait();
                    for i in 0..40 {
                        let h = pool.alloc(64 + i * 100 + t, None, 0).unwrap();
                        pool.free(h).unwrap();
                    }
                    together.wait();
                });
            }
        });
    };
    record(&pool);
    let (drained, hits) = failpoint::record(|| pool.trace_drain());
    assert_eq!(drained.unwrap().len(), 160);
    let growths = hits.iter().filter(|&&name| name == "host.vec").count();
    assert!(growths >= 3, "the streams and the merge's tables: {hits:?}");
    for nth in 0..growths {
        record(&pool);
        let (result, fired) = failpoint::fail_at("host.vec", nth, || pool.trace_drain());
        assert!(fired, "growth {nth} was not reached again");
        assert!(matches!(result, Err(Error::HostMemory { .. })), "growth {nth}: {result:?}");
        let events = pool.trace_drain().unwrap();
        assert_eq!(events.len(), 160, "growth {nth}: events lost");
        let status = pool.trace_status();
        assert_eq!((status.recorded, status.drained, status.dropped), (160, 160, 0), "growth {nth}");
    }
    pool.check().unwrap();
}

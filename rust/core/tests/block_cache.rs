//! The caches of freed blocks (`arena/block_cache.rs`) seen from the pool's API: a freed block
//! serves the next request of its class where it was, a second free of a cached block is an
//! error that changes nothing, and cached blocks never make an allocation fail nor show as used
//! space.

mod common;

use common::{Rng, MIB};
use npumem_core::{Backing, Error, Pool, PoolConfig};

fn raw_pool(capacity: usize, cores: usize) -> Pool {
    Pool::new(PoolConfig::new(capacity).cores(cores).backing(Backing::None)).unwrap()
}

#[test]
fn a_freed_block_serves_the_next_request_of_its_class_in_place() {
    let p = raw_pool(64 * MIB, 1);
    let a = p.alloc_raw(100_000, None).unwrap();
    let b = p.alloc_raw(100_000, None).unwrap();
    p.free_raw(a, 100_000).unwrap();
    // Cached, the block is free for the check, the statistics and the snapshot, and nothing
    // of them gives it back to its tree: the next request of its class still takes it.
    assert_eq!(p.check().unwrap(), 1, "one live block: b");
    let s = p.stats();
    assert_eq!(s.bytes_in_use, 102_400, "b: 100,000 B trimmed to 400 units of 256 B");
    let snap = p.snapshot().unwrap();
    assert!(snap.free_runs.iter().any(|e| e.offset <= a && a + 102_400 <= e.offset + e.len), "{:?}", snap.free_runs);
    // Bytes neither free nor a handle's block: b, a raw block; not the cached one.
    assert_eq!(snap.untracked.iter().map(|e| (e.offset, e.len)).collect::<Vec<_>>(), vec![(b, 102_400)]);
    // 99,000 B has the same trimmed units as 100,000 B: the same class.
    assert_eq!(p.alloc_raw(99_000, None).unwrap(), a);
    p.free_raw(a, 99_000).unwrap();
    // Another class does not take it.
    let c = p.alloc_raw(200_000, None).unwrap();
    assert_ne!(c, a);
    for (offset, size) in [(a, 99_000), (b, 100_000), (c, 200_000)] {
        if offset != a {
            p.free_raw(offset, size).unwrap();
        }
    }
    assert_eq!(p.stats().bytes_in_use, 0);
    assert_eq!(p.check().unwrap(), 0);
}

#[test]
fn a_second_free_of_a_cached_block_is_refused_and_changes_nothing() {
    let p = raw_pool(64 * MIB, 1);
    let a = p.alloc_raw(50_000, None).unwrap();
    let keep = p.alloc_raw(70_000, None).unwrap();
    p.free_raw(a, 50_000).unwrap();
    for size in [50_000, 49_000, 40_000, 64 * 1024, 100_000] {
        match p.free_raw(a, size) {
            Err(Error::InvalidBlock { .. }) => {}
            other => panic!("second free of {size} B: {other:?}"),
        }
    }
    // The cached block is handed out once, and only once.
    let again = p.alloc_raw(50_000, None).unwrap();
    assert_eq!(again, a);
    let other = p.alloc_raw(50_000, None).unwrap();
    assert_ne!(other, a);
    for (offset, size) in [(again, 50_000), (other, 50_000), (keep, 70_000)] {
        p.free_raw(offset, size).unwrap();
    }
    assert_eq!(p.check().unwrap(), 0);
}

#[test]
fn cached_blocks_are_free_space_for_statistics_and_for_any_request() {
    for cores in [1, 3] {
        let capacity = 64 * MIB;
        let p = raw_pool(capacity, cores);
        // Fill a quarter with one class, free it all: the caches keep what they may.
        let size = 300_000;
        let mut held = Vec::new();
        while held.len() * size < capacity / 4 {
            held.push(p.alloc_raw(size, None).unwrap());
        }
        for &offset in &held {
            p.free_raw(offset, size).unwrap();
        }
        let s = p.stats();
        assert_eq!(s.bytes_in_use, 0);
        assert_eq!(s.largest_free_block, capacity, "cores {cores}");
        // A request as large as the pool needs every chunk, cached blocks included.
        let whole = p.alloc_raw(capacity, None).unwrap();
        p.free_raw(whole, capacity).unwrap();
        assert_eq!(p.check().unwrap(), 0);
    }
}

/// Random sizes across the cache classes, freed in random order and reallocated, with the pool
/// nearly full so that failing allocations drain the caches: no two live blocks overlap, a
/// failure happens only when the bytes asked for could not fit, and the pool checks clean.
#[test]
fn churn_near_full_never_overlaps_and_fails_only_without_room() {
    let capacity = 32 * MIB;
    for seed in 0..6u64 {
        let p = raw_pool(capacity, 1 + seed as usize % 2);
        let mut rng = Rng(0xCAC4_E000 + seed);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut failures = 0;
        for _ in 0..6_000 {
            if !live.is_empty() && (rng.next() % 2 == 0 || live.len() > 400) {
                let i = rng.next() as usize % live.len();
                let (offset, size) = live.swap_remove(i);
                p.free_raw(offset, size).unwrap();
            }
            let size = rng.size(5_000, 2 * MIB);
            match p.alloc_raw(size, None) {
                Ok(offset) => live.push((offset, size)),
                Err(Error::OutOfMemory { .. }) => {
                    failures += 1;
                    let in_use: usize = live.iter().map(|&(_, s)| s).sum();
                    assert!(in_use + size > capacity / 2, "failed {size} B with {in_use} B in use of {capacity}");
                }
                Err(e) => panic!("{e}"),
            }
        }
        let mut spans = live.clone();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {:?} and {:?}", w[0], w[1]);
        }
        assert_eq!(p.check().unwrap(), live.len(), "seed {seed}");
        assert!(failures < 6_000, "seed {seed}");
    }
}

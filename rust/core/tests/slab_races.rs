//! Threads that allocate small objects and free each other's, on pools of one to three cores:
//! no two live objects overlap (an occupancy map of every byte), every object keeps the pattern
//! written into it, and after each race the slab cache the statistics count from the counters is
//! the one a snapshot reads slab by slab; then everything goes back. (The race that could leave
//! an all-free slab listed needs a full slab emptied while it is being replaced: the loom model
//! of `arena/slab/caches.rs` checks it on slabs of two objects.)
#![cfg(not(loom))]
mod common;
use common::occupancy::Occupancy;
use common::{fill, verify, Rng};
use npumem_core::{Error, Handle, Pool, PoolConfig};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

#[test]
fn threads_freeing_each_others_small_objects_leave_exact_slabs() {
    let allocated = AtomicUsize::new(0);
    for seed in 0..60u64 {
        let mut rng = Rng(0xAB5_0000 + seed * 7_919);
        let threads = 2 + rng.next() % 3;
        let cores = 1 + (rng.next() % 3) as usize;
        let config = PoolConfig::new(8 << 20).cores(cores);
        let what = format!("seed {seed}: {threads} threads, {cores} cores");
        let live = Occupancy::new(config.offset_space());
        let p = Pool::new(config).unwrap();
        // Shared: a thread frees blocks that other threads allocated.
        let bag: Mutex<Vec<(Handle, usize)>> = Mutex::new(Vec::new());
        let give_back = |(h, id): (Handle, usize)| {
            verify(&p, h, id);
            let b = p.block(h).unwrap();
            live.release(b.offset, b.block_bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
            p.free(h).unwrap();
        };
        std::thread::scope(|s| {
            for t in 0..threads {
                let (p, live, what, bag, allocated, give_back) = (&p, &live, &what, &bag, &allocated, &give_back);
                s.spawn(move || {
                    let mut rng = Rng(seed * 131 + t + 1);
                    for step in 0..6000 {
                        if rng.next() % 100 < 49 {
                            let taken = {
                                let mut bag = bag.lock().unwrap();
                                let n = bag.len();
                                (n > 0).then(|| bag.swap_remove((rng.next() as usize) % n))
                            };
                            taken.into_iter().for_each(give_back);
                            continue;
                        }
                        match p.alloc(rng.size(16, 4096), None, 0) {
                            Ok(h) => {
                                let b = p.block(h).unwrap();
                                live.claim(b.offset, b.block_bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
                                let id = (seed as usize) << 32 | (t as usize) << 24 | step;
                                fill(p, h, id);
                                allocated.fetch_add(1, Ordering::Relaxed);
                                bag.lock().unwrap().push((h, id));
                            }
                            Err(Error::OutOfMemory { .. }) => {}
                            Err(e) => panic!("{what}: {e}"),
                        }
                    }
                });
            }
        });
        let snap = p.snapshot().unwrap();
        let cached: usize = snap.slab_cached.iter().map(|e| e.len).sum();
        assert_eq!(cached, snap.stats.slab_cached_bytes, "{what}: the slab cache, slab by slab and counted");
        bag.into_inner().unwrap().into_iter().for_each(give_back);
        p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(p.stats().blocks_in_use, 0, "{what}");
        assert!(live.is_empty(), "{what}");
        p.trim().unwrap();
        assert_eq!(p.stats().slab_cached_bytes, 0, "{what}");
    }
    assert!(allocated.into_inner() > 300_000, "the threads allocated");
}

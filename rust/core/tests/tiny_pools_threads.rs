//! Three threads on pools of one to four small chunks (64 KiB to 1 MiB), some of which may
//! grow: nearly every allocation contends with the others for the same chunks' nodes and free
//! counts, and most fail for want of space. No two live blocks overlap, each block keeps the
//! pattern written into it, `check()` is clean and the pool ends empty.
//!
//! Such contention takes a chunk's free count below zero for a moment (`arena/chunk_space.rs`,
//! whose unit tests check that this leaves the rest of the chunk's word alone; the race itself is
//! too rare for this test to hit reliably).
#![cfg(not(loom))]

mod common;

use common::occupancy::Occupancy;
use common::{fill, verify, Rng, MIB};
use npumem_core::{Error, Handle, Pool, PoolConfig};
use std::sync::Mutex;

const THREADS: u64 = 3;
const SEEDS: u64 = 60;
const STEPS: usize = 1500;

#[test]
fn three_threads_on_tiny_pools_never_overlap_or_corrupt_a_block() {
    let mut failed = 0;
    for seed in 0..SEEDS {
        let mut rng = Rng(0x7A1_0000 + seed * 1_000_039);
        let chunk = [64 << 10, 256 << 10, MIB][(rng.next() % 3) as usize];
        let chunks = [1usize, 2, 4][(rng.next() % 3) as usize];
        let config = PoolConfig::new(chunks * chunk).cores(2).chunk_size(chunk);
        let config = match rng.next() % 3 {
            0 => config,
            _ => config.growth(8 * chunks * chunk, [None, Some(chunk), Some(3 * chunk)][(rng.next() % 3) as usize]),
        };
        let what = format!("seed {seed}: {config:?}");
        // A block's bytes are claimed after its allocation and released before its free.
        let live = Occupancy::new(config.offset_space());
        let p = Pool::new(config).unwrap();
        let refused = Mutex::new(0);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (p, live, what, refused) = (&p, &live, &what, &refused);
                s.spawn(move || {
                    let mut rng = Rng(seed * 31 + t + 1);
                    let mut held: Vec<(Handle, usize)> = Vec::new();
                    let give_back = |(h, id): (Handle, usize)| {
                        verify(p, h, id);
                        let b = p.block(h).unwrap();
                        live.release(b.offset, b.block_bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
                        p.free(h).unwrap();
                    };
                    for step in 0..STEPS {
                        if !held.is_empty() && rng.next() % 100 < 48 {
                            give_back(held.swap_remove((rng.next() as usize) % held.len()));
                            continue;
                        }
                        match p.alloc(rng.size(64, chunk * 5 / 2), None, 0) {
                            Ok(h) => {
                                let b = p.block(h).unwrap();
                                live.claim(b.offset, b.block_bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
                                let id = (seed as usize) << 32 | (t as usize) << 24 | step;
                                fill(p, h, id);
                                held.push((h, id));
                            }
                            Err(Error::OutOfMemory { .. } | Error::TooLarge { .. }) => *refused.lock().unwrap() += 1,
                            Err(e) => panic!("{what}: {e}"),
                        }
                    }
                    held.into_iter().for_each(give_back);
                });
            }
        });
        failed += refused.into_inner().unwrap();
        p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(p.stats().blocks_in_use, 0, "{what}");
        assert!(live.is_empty(), "{what}");
    }
    // The pools are tight: allocations failed for want of space in every configuration.
    assert!(failed > SEEDS as usize * 100, "{failed} allocations refused");
}

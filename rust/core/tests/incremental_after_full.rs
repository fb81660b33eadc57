//! An incremental step after a full compaction accepts its own plan: a single-core pool with
//! mixed sizes, compacted in full, then stepped incrementally, over many random histories.
#![cfg(not(loom))]

use npumem_core::{CompactionMode, Handle, Pool, PoolConfig};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn rng(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn incremental_steps_after_a_full_compaction_accept_their_own_plans() {
    let sizes = [64, 200, 700, 3000, 5000, 20_000, 70_000, 300_000, 1_500_000, 3 * MIB, 5 * MIB + 7, 9 * MIB, 2 * MIB];
    for s in 0..40u64 {
        let mut seed = s * 7919 + 1;
        let p = Pool::new(PoolConfig::new(128 * MIB).cores(1)).unwrap();
        let mut live: Vec<Handle> = Vec::new();
        for round in 0..6 {
            for _ in 0..300 {
                if live.is_empty() || rng(&mut seed) % 3 != 0 {
                    let size = sizes[rng(&mut seed) as usize % sizes.len()];
                    if let Ok(h) = p.alloc(size, None, 0) {
                        live.push(h);
                    }
                } else {
                    let i = rng(&mut seed) as usize % live.len();
                    p.free(live.swap_remove(i)).unwrap();
                }
            }
            let token = p.pause(Duration::from_secs(5)).unwrap();
            let mode =
                if round % 3 == 0 { CompactionMode::Full } else { CompactionMode::Incremental { max_bytes: 4 * MIB } };
            let done = p.compact_step(&token, &mode, None);
            p.resume(&token).unwrap();
            if let Err(e) = done {
                panic!("seed {s} round {round} {mode:?}: {e}");
            }
            p.check().unwrap();
            if round % 3 == 0 {
                for _ in 0..3 {
                    let token = p.pause(Duration::from_secs(5)).unwrap();
                    let step = p.compact_step(&token, &CompactionMode::Incremental { max_bytes: 4 * MIB }, None);
                    p.resume(&token).unwrap();
                    if let Err(e) = step {
                        panic!("seed {s} round {round}, incremental right after full: {e}");
                    }
                }
            }
        }
    }
}

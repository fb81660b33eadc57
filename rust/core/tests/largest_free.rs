//! `stats().largest_free_block` is the largest request one allocation could get now: an
//! allocation of exactly that size succeeds, and no free stretch inside a chunk holds a request
//! much larger (a block's layout rounds up by at most 1/16). An out-of-memory error's figure is
//! a request that succeeds too.

mod common;

use common::moves::Mover;
use common::{Rng, MIB};
use npumem_core::{Backing, Error, Handle, Placement, Pool, PoolConfig};
use std::ops::Range;

const CHUNK: usize = 2 * MIB;

/// Random sizes of 256 B-3 MiB filled until allocations fail, half freed, filled again: at
/// every failure, no free piece of the snapshot inside a chunk, from its first bank boundary on,
/// less its rounding (1/16) and a bank is longer than the statistics' figure, a request of that
/// figure and one of the error's own figure succeed, and the error's figure is held by a free
/// piece.
#[test]
fn the_largest_free_block_holds_every_free_stretch_and_can_be_allocated() {
    check_the_largest_free_block(0..32, false);
}

/// The same with the thread moving between CPUs now and then (blocks of both core pools in
/// each other's chunks, freed blocks in both cores' caches).
#[test]
fn the_largest_free_block_holds_with_the_thread_moving_between_cpus() {
    check_the_largest_free_block(0..64, true);
}

/// Pools of one core (even seeds) and two (odd seeds), one per seed of `seeds`; with `moves`,
/// the thread moves to a random CPU before one allocation in eight.
fn check_the_largest_free_block(seeds: Range<u64>, moves: bool) {
    let (mut failures, mut checked, mut seen) = (0usize, 0usize, 0usize);
    for seed in seeds {
        let mut mover = moves.then(|| Mover::new(seed));
        let cores = 1 + seed as usize % 2;
        let p = Pool::new(PoolConfig::new(48 * MIB).cores(cores)).unwrap();
        let bank = p.config().bank_size;
        let mut rng = Rng(0x5EED_0000 + seed * 7_777);
        let mut held: Vec<Handle> = Vec::new();
        for round in 0..12 {
            let mut misses = 0;
            while misses < 6 {
                if let Some(mover) = mover.as_mut() {
                    mover.maybe_move();
                }
                let size = rng.size(256, 3 * MIB);
                match p.alloc(size, None, 0) {
                    Ok(h) => held.push(h),
                    Err(Error::OutOfMemory { largest_free_block, bytes_free, .. }) => {
                        failures += 1;
                        misses += 1;
                        let s = p.stats();
                        // Every free piece of the snapshot inside one chunk, from the first bank
                        // boundary in it (where a block larger than a bank may start), fits the
                        // figure. (Across chunks, a block's tail is cut to whole nodes.)
                        let snap = p.snapshot().unwrap();
                        let longest = snap
                            .free_runs
                            .iter()
                            .filter(|e| e.offset / CHUNK == (e.offset + e.len - 1) / CHUNK)
                            .map(|e| (e.offset + e.len).saturating_sub(e.offset.next_multiple_of(bank)))
                            .max()
                            .unwrap_or(0);
                        assert!(
                            longest.saturating_sub(longest / 16 + bank) <= s.largest_free_block,
                            "seed {seed}, round {round}: a free stretch of {longest} bytes from a bank \
                             boundary, the statistics say {}",
                            s.largest_free_block
                        );
                        assert!(s.largest_free_block <= s.bytes_free && bytes_free == s.bytes_free, "{s:?}");
                        // The error's figure is a block that was free (a lower bound): some free
                        // piece holds it from a bank boundary.
                        let held = longest_free_piece(&snap, bank);
                        assert!(
                            largest_free_block <= held,
                            "seed {seed}, round {round}: the error names a free block of {largest_free_block} \
                             bytes, the longest free piece from a bank boundary is {held}"
                        );
                        seen = seen.max(largest_free_block);
                        for (want, whose) in [(s.largest_free_block, "statistics"), (largest_free_block, "error")] {
                            if want > 0 {
                                let h = p.alloc(want, None, 0).unwrap_or_else(|e| {
                                    panic!("seed {seed}, round {round}: the {whose}' largest free block, {want} B: {e}")
                                });
                                p.free(h).unwrap();
                                checked += 1;
                            }
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let mut kept = Vec::with_capacity(held.len());
            for h in held.drain(..) {
                if rng.next() % 2 == 0 {
                    p.free(h).unwrap();
                } else {
                    kept.push(h);
                }
            }
            held = kept;
        }
        for h in held {
            p.free(h).unwrap();
        }
        p.check().unwrap();
    }
    assert!(failures > 100 && checked > 100 && seen > 0, "{failures} failures, {checked} checked");
}

/// Random configurations (chunks of 64 KiB to 4 MiB, a short last chunk or none, one to three
/// cores, both placements, runs with and without tails, a core reserve or none, banks of 4 or
/// 8 KiB, units of 64 or 256 B; more of them with `NPUMEM_LARGEST_FREE_SEEDS`) under random
/// allocations (64 B to 2.5 chunks, half of them next to a class or chunk boundary, one in
/// four aligned to 512 B to a chunk) and frees, the
/// thread moving between CPUs: an unaligned request fails only when its size passes the
/// largest free block; when one does, the error's figure is held by a free piece and can be
/// allocated, and so can the statistics' figure, which no free stretch of a chunk from a bank
/// boundary passes by more than its rounding (1/16) and a bank; every 100 steps a snapshot
/// agrees with its stats; the pool checks clean, before and after everything is freed.
#[test]
fn the_largest_free_block_holds_in_random_configurations() {
    let mut checked = 0;
    let seeds = std::env::var("NPUMEM_LARGEST_FREE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40u64);
    for seed in 0..seeds {
        let mut rng = Rng(0xC0FF_EE00 + seed * 1_000_003);
        let chunk = [64 << 10, 256 << 10, MIB, 2 * MIB, 4 * MIB][(rng.next() % 5) as usize];
        let chunks = [2usize, 3, 5, 8, 24][(rng.next() % 5) as usize];
        let short = if rng.next() % 3 == 0 { chunk / 2 } else { 0 };
        let cores = 1 + (rng.next() % 3) as usize;
        let placement = if rng.next() % 2 == 0 { Placement::BestFit } else { Placement::FirstFit };
        let tails = rng.next() % 4 != 0;
        let reserve = (rng.next() % 2) as usize;
        let bank_size = [4096, 8192][(rng.next() % 2) as usize];
        let min_block = [64, 256][(rng.next() % 2) as usize];
        let config = PoolConfig::new(chunks * chunk + short)
            .cores(cores)
            .chunk_size(chunk)
            .placement(placement)
            .run_tails(tails)
            .core_reserve(reserve)
            .bank_size(bank_size)
            .min_block(min_block)
            .backing(Backing::None);
        let what = format!(
            "seed {seed}: chunks of {chunk} B, {chunks} and {short} B, {cores} cores, {placement:?}, tails {tails}, \
             reserve {reserve}, banks of {bank_size} B, min_block {min_block}"
        );
        let p = Pool::new(config).unwrap_or_else(|e| panic!("{what}: {e}"));
        let bank = p.config().bank_size;
        let mut mover = Mover::new(seed);
        let mut held: Vec<Handle> = Vec::new();
        for step in 0..2000 {
            mover.maybe_move();
            if step % 100 == 99 {
                snapshot_agrees_with_its_stats(&p, &format!("{what}, step {step}"));
            }
            if !held.is_empty() && rng.next() % 100 < 40 {
                let i = (rng.next() as usize) % held.len();
                p.free(held.swap_remove(i)).unwrap();
                continue;
            }
            let size = match rng.next() % 2 {
                0 => rng.size(64, chunk * 5 / 2),
                _ => next_to_a_boundary(&mut rng, chunk),
            };
            let align =
                [Some(512), Some(4096), Some(65_536), Some(chunk)].get((rng.next() % 16) as usize).copied().flatten();
            let largest_before = p.stats().largest_free_block;
            match p.alloc(size, align, 0) {
                Ok(h) => held.push(h),
                Err(Error::OutOfMemory { largest_free_block, .. }) if align.is_none() => {
                    // Refused only when it passes the largest free block.
                    assert!(
                        size > largest_before,
                        "{what}, step {step}: {size} B refused with a largest free block of {largest_before} B"
                    );
                    let s = p.stats();
                    let snap = p.snapshot().unwrap();
                    let held = longest_free_piece(&snap, bank);
                    assert!(largest_free_block <= held, "{what}, step {step}: the error names {largest_free_block} B free, the longest free piece is {held} B");
                    let longest = snap
                        .free_runs
                        .iter()
                        .filter(|e| e.offset / chunk == (e.offset + e.len - 1) / chunk)
                        .map(|e| (e.offset + e.len).saturating_sub(e.offset.next_multiple_of(bank)))
                        .max()
                        .unwrap_or(0);
                    assert!(
                        longest.saturating_sub(longest / 16 + bank) <= s.largest_free_block,
                        "{what}, step {step}: a stretch of {longest} B, {s:?}"
                    );
                    for (want, whose) in [(s.largest_free_block, "statistics"), (largest_free_block, "error")] {
                        if want > 0 {
                            let h = p.alloc(want, None, 0).unwrap_or_else(|e| {
                                panic!("{what}, step {step}: the {whose}' largest free block, {want} B: {e}")
                            });
                            p.free(h).unwrap();
                            checked += 1;
                        }
                    }
                }
                Err(Error::OutOfMemory { .. } | Error::TooLarge { .. }) => {}
                Err(e) => panic!("{what}, step {step}: {e}"),
            }
        }
        p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
        for h in held {
            p.free(h).unwrap();
        }
        p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(p.stats().bytes_in_use, 0, "{what}");
    }
    assert!(checked > 200, "{checked} largest free blocks allocated");
}

/// The longest free piece of `snap` from a bank boundary (chunk ends included): what an
/// out-of-memory error may name as free at most.
fn longest_free_piece(snap: &npumem_core::Snapshot, bank: usize) -> usize {
    snap.free_runs.iter().map(|e| (e.offset + e.len).saturating_sub(e.offset.next_multiple_of(bank))).max().unwrap_or(0)
}

/// A snapshot's extents add up to its stats: the blocks to the bytes in use and asked for, the
/// free runs to the free bytes, the slab space to the slab cache; nothing untracked (every
/// block has a handle here).
fn snapshot_agrees_with_its_stats(p: &Pool, what: &str) {
    let snap = p.snapshot().unwrap();
    let s = &snap.stats;
    let sum = |extents: &[npumem_core::Extent]| extents.iter().map(|e| e.len).sum::<usize>();
    assert_eq!(s.bytes_in_use, snap.blocks.iter().map(|b| b.block_bytes).sum::<usize>(), "{what}: bytes in use");
    assert_eq!(s.requested_bytes_in_use, snap.blocks.iter().map(|b| b.size).sum::<usize>(), "{what}: asked for");
    assert_eq!(s.bytes_free, sum(&snap.free_runs), "{what}: free runs");
    assert_eq!(s.slab_cached_bytes, sum(&snap.slab_cached), "{what}: slab cache");
    assert!(snap.untracked.is_empty(), "{what}: untracked {:?}", snap.untracked);
    assert_eq!(s.bytes_in_use + s.bytes_free + s.slab_cached_bytes, s.usable_capacity, "{what}");
}

/// A size next to a boundary of the classes or the chunks (`chunk` bytes each): a bank, a
/// 32nd, a 16th, half, 3/4, 31/32 of a chunk, a chunk, 33/32, two and two and a half, give or
/// take a byte, a unit or a bank.
fn next_to_a_boundary(rng: &mut Rng, chunk: usize) -> usize {
    let edges = [
        64,
        4096,
        8192,
        chunk / 32,
        chunk / 16,
        chunk / 2,
        chunk / 2 + chunk / 4,
        chunk - chunk / 32,
        chunk,
        chunk + chunk / 32,
        2 * chunk,
        2 * chunk + chunk / 2,
    ];
    let base = edges[(rng.next() % edges.len() as u64) as usize] as isize;
    let delta = [0isize, 1, -1, 255, -255, 256, -256, 4095, -4095, 4096, -4096][(rng.next() % 11) as usize];
    (base + delta).max(1) as usize
}

/// An empty pool serves every request up to its usable capacity, and its largest free block
/// is that capacity: with a short last chunk (a capacity that is no multiple of the chunk), a
/// request of every chunk but the last and a rest that the last chunk holds in bytes but not
/// cut to its tail's granule takes every chunk whole. Capacities of 1 to 5 chunks and rests
/// from a unit to nearly a chunk; the sizes next to the usable capacity, a unit apart, and the
/// ones next to each multiple of the chunk.
#[test]
fn an_empty_pool_serves_every_size_up_to_its_usable_capacity() {
    let mut checked = 0;
    for tails in [true, false] {
        for chunks in 1..=5usize {
            for rest in [0, 256, 4096, 300_000, 700_000, CHUNK / 2 + 1, 1_060_921, 1_500_000, CHUNK - 4096] {
                let capacity = chunks * CHUNK + rest;
                let config = PoolConfig::new(capacity).cores(1).run_tails(tails).backing(Backing::None);
                let p = Pool::new(config).unwrap();
                let usable = p.stats().usable_capacity;
                let what = format!("{chunks} chunks and {rest} B, tails {tails}");
                assert_eq!(p.stats().largest_free_block, usable.min(p.largest_request()), "{what}");
                let near_the_end = (0..64).map(|k| usable - k * 256);
                let near_chunks = (1..=chunks + 1).flat_map(|c| [c * CHUNK - 256, c * CHUNK, c * CHUNK + 256]);
                for size in near_the_end.chain(near_chunks).filter(|&s| s > 0 && s <= p.largest_request()) {
                    let h = p.alloc(size, None, 0).unwrap_or_else(|e| panic!("{what}: {size} B on an empty pool: {e}"));
                    assert!(p.block(h).unwrap().block_bytes >= size);
                    p.free(h).unwrap();
                    checked += 1;
                }
                // A small block in the first chunk: the free run of the other chunks ends in the
                // short one, and a request of the largest free block still succeeds.
                let small = p.alloc(4096, None, 0).unwrap();
                let largest = p.stats().largest_free_block;
                let h = p
                    .alloc(largest, None, 0)
                    .unwrap_or_else(|e| panic!("{what}: {largest} B beside a small block: {e}"));
                p.free(h).unwrap();
                p.free(small).unwrap();
                p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
    }
    assert!(checked > 5000, "{checked} sizes");
}

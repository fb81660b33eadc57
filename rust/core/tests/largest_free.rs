//! `stats().largest_free_block` is the largest request one allocation could get now, exactly:
//! an allocation of that size succeeds, and a larger one fails (except where a free object of a
//! slab of the calling thread's core takes it), so no free stretch inside a chunk holds a
//! request much larger either (a block's layout rounds up by at most 1/16). An out-of-memory
//! error's figure is a request that succeeds too.

mod common;

use common::moves::Mover;
use common::{Rng, MIB};
use npumem_core::{Backing, CompactionMode, Error, Handle, Placement, Pool, PoolConfig};
use std::ops::Range;
use std::time::Duration;

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

/// A compaction gives the places its moves leave back on a paused pool without telling the
/// searches of each release, then announces each chunk it released in once. After every step,
/// incremental (64 KiB to 64 MiB a step) or full, in random histories of sizes from 1 B to 4 MiB
/// (one in four aligned to 64 B to 1 MiB) filled until they fail and half freed, the figure is
/// exact ([`assert_exact`]): the chunks the moves released in serve it, also from the free end
/// of one chunk into the free start of the next.
#[test]
fn the_largest_free_block_holds_after_compaction_steps() {
    let mut seen = Exactness::default();
    for seed in 0..24u64 {
        let cores = 1 + seed as usize % 2;
        let capacity = [16, 24, 48][seed as usize % 3] * MIB;
        let p = Pool::new(PoolConfig::new(capacity).cores(cores).backing(Backing::None)).unwrap();
        let mut rng = Rng(0xC0_4FAC7 + seed * 131);
        let mut held: Vec<Handle> = Vec::new();
        for round in 0..8 {
            let mut misses = 0;
            while misses < 3 {
                let size = rng.size(1, 4 * MIB);
                let align = (rng.next() % 4 == 0).then(|| 64usize << (rng.next() % 15));
                match p.alloc(size, align, 0) {
                    Ok(h) => held.push(h),
                    Err(Error::OutOfMemory { .. }) => misses += 1,
                    Err(e) => panic!("seed {seed}, round {round}: {size} B aligned to {align:?}: {e}"),
                }
            }
            held.retain(|&h| {
                let keep = rng.next() % 2 == 0;
                if !keep {
                    p.free(h).unwrap();
                }
                keep
            });
            let mode = match rng.next() % 4 {
                0 => CompactionMode::Full,
                _ => CompactionMode::Incremental { max_bytes: (64 << 10) << (rng.next() % 11) },
            };
            let token = p.pause(Duration::from_secs(30)).unwrap();
            p.compact_step(&token, &mode, None).unwrap();
            p.resume(&token).unwrap();
            assert_exact(&p, &mut seen, false, &format!("seed {seed}, round {round}, after {mode:?}"));
            p.check().unwrap();
        }
        for h in held {
            p.free(h).unwrap();
        }
        p.check().unwrap();
    }
    assert!(seen.refused > 500, "{} requests above the figure refused", seen.refused);
}

/// With a default alignment above the smallest block, every place the figure counts starts on
/// it: holes between blocks spaced by an alignment above the bank, holes below it with no slab
/// classes, and the free end of a chunk after one small block (its front starts on the
/// alignment, not on the next bank).
#[test]
fn the_largest_free_block_starts_on_the_default_alignment() {
    let mut seen = Exactness::default();
    let configs = [
        (PoolConfig::new(4 * MIB).alignment(16 << 10), 8 << 10),
        (PoolConfig::new(4 * MIB).alignment(1024).slab_sizes(Vec::new()), 512),
    ];
    for (config, size) in configs {
        let what = format!("alignment {}, blocks of {size} B", config.alignment);
        let p = Pool::new(config.backing(Backing::None)).unwrap();
        while p.alloc(size, None, 0).is_ok() {}
        assert_exact(&p, &mut seen, true, &what);
        assert!(p.stats().largest_free_block < size, "{what}: every hole is off the alignment");
        assert_eq!(p.blocks_available(size), 0, "{what}");
    }
    let p = Pool::new(PoolConfig::new(64 * MIB).alignment(16 << 10).backing(Backing::None)).unwrap();
    let _h = p.alloc(100, None, 0).unwrap();
    assert_exact(&p, &mut seen, false, "alignment 16 KiB, one small block");
    assert_eq!(p.stats().largest_free_block, 64 * MIB - (16 << 10));
}

/// Random configurations (chunks of 64 KiB to 4 MiB, a short last chunk or none, one to three
/// cores, both placements, runs with and without tails, a core reserve or none, banks of 4 or
/// 8 KiB or of a whole 64 KiB chunk, units of 64 or 256 B; more of them with `NPUMEM_LARGEST_FREE_SEEDS`) under random
/// allocations (64 B to 2.5 chunks, half of them next to a class or chunk boundary, one in
/// four aligned to 512 B to a chunk) and frees, the
/// thread moving between CPUs: an unaligned request fails only when its size passes the
/// largest free block; when one does, the error's figure is held by a free piece and can be
/// allocated, and so can the statistics' figure, which no free stretch of a chunk from a bank
/// boundary passes by more than its rounding (1/16) and a bank; every 10 steps the figure is
/// exact ([`assert_exact`]); every 100 steps a snapshot agrees with its stats; the pool checks
/// clean, before and after everything is freed.
#[test]
fn the_largest_free_block_holds_in_random_configurations() {
    let mut checked = 0;
    let mut exact = Exactness::default();
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
        // A bank as large as the chunk too: every block of at most a chunk is then placed as
        // a buddy block, a trimmed one in its pieces.
        let bank_size = match chunk == 64 << 10 && rng.next() % 2 == 0 {
            true => chunk,
            false => [4096, 8192][(rng.next() % 2) as usize],
        };
        let min_block = [64, 256][(rng.next() % 2) as usize];
        // A default alignment above the smallest block in a third of them: every block then
        // starts on a multiple of it, and so does every place the figure counts.
        let alignment = match rng.next() % 3 {
            0 => [128usize, 1024, 4096, 16 << 10, 64 << 10][(rng.next() % 5) as usize].min(chunk),
            _ => 64,
        };
        let config = PoolConfig::new(chunks * chunk + short)
            .alignment(alignment)
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
             reserve {reserve}, banks of {bank_size} B, min_block {min_block}, alignment {alignment}"
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
            if step % 10 == 5 {
                assert_exact(&p, &mut exact, step % 200 == 5, &format!("{what}, step {step}"));
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
                        .map(|e| (e.offset + e.len).saturating_sub(e.offset.next_multiple_of(bank.max(alignment))))
                        .max()
                        .unwrap_or(0);
                    assert!(
                        longest.saturating_sub(longest / 16 + bank) <= s.largest_free_block,
                        "{what}, step {step}: a stretch of {longest} B from a multiple of the bank and the alignment, {s:?}"
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
    // Most checks find a figure of more than a slab class: there a larger request always fails.
    assert!(
        exact.refused * 10 >= (exact.refused + exact.in_slabs) * 9 && exact.refused >= 1000 * seeds as usize,
        "{} larger requests refused, {} taken by slab objects",
        exact.refused,
        exact.in_slabs
    );
}

/// What [`assert_exact`] saw.
#[derive(Default)]
struct Exactness {
    /// Requests larger than the figure that failed.
    refused: usize,
    /// Requests larger than the figure that a free object of a slab took.
    in_slabs: usize,
}

/// `stats().largest_free_block` is exact: a request of that size succeeds, and a request of
/// one byte more fails, and so do a few larger ones (a unit, a bank, a 16th, the next whole
/// chunks, twice as much: a larger block's layout may fit where the next size's does not);
/// with `scan`, every multiple of a unit above it up to the free bytes too, where those are at
/// most 4,096.
/// The one exception is a free object of a partly used slab of the calling thread's core: slab
/// space is no free bytes, and only that core's threads take from its slabs, so the figure
/// leaves it out; such a request is told apart by the snapshot's slab extents from before it.
/// A request that fails reclaims what the figure counts free already (cached freed blocks,
/// all-free slabs, empty chunks that cores hold), which may only take away the places its
/// first try had (a block with a front in the free end of a chunk that the reclaim empties):
/// the figure never rises.
fn assert_exact(p: &Pool, seen: &mut Exactness, scan: bool, what: &str) {
    let largest = p.stats().largest_free_block;
    if largest > 0 {
        let h = p
            .alloc(largest, None, 0)
            .unwrap_or_else(|e| panic!("{what}: the largest free block, {largest} B, is refused: {e}"));
        p.free(h).unwrap();
    }
    let config = p.config();
    let (chunk, bank, unit) = (config.chunk_size, config.bank_size, config.min_block);
    let largest = p.stats().largest_free_block;
    let snap = p.snapshot().unwrap();
    let next_chunks = (largest / chunk + 1) * chunk;
    let above = [
        largest + 1,
        largest + unit,
        largest + bank,
        largest + largest / 16 + unit,
        next_chunks,
        next_chunks + chunk / 2,
    ];
    let top = snap.stats.bytes_free.min(p.largest_request());
    let units_above = (largest / unit + 1..=top / unit).filter(|_| scan && top / unit - largest / unit <= 4096);
    for size in above.into_iter().chain([2 * largest + 1]).chain(units_above.map(|u| u * unit)) {
        match p.alloc(size, None, 0) {
            Ok(h) => {
                let b = p.block(h).unwrap();
                let in_slab =
                    snap.slab_cached.iter().any(|e| e.offset <= b.offset && b.offset + b.block_bytes <= e.end());
                assert!(
                    in_slab,
                    "{what}: {size} B allocated ({} B at {}) with a largest free block of {largest} B",
                    b.block_bytes, b.offset
                );
                p.free(h).unwrap();
                seen.in_slabs += 1;
            }
            Err(Error::OutOfMemory { .. } | Error::TooLarge { .. }) => seen.refused += 1,
            Err(e) => panic!("{what}: {size} B: {e}"),
        }
        let after = p.stats().largest_free_block;
        assert!(
            after <= largest,
            "{what}: a failed request of {size} B raised the largest free block from {largest} B to {after} B"
        );
    }
}

/// The longest free piece of `snap` from a bank boundary (chunk ends included): what an
/// out-of-memory error may name as free at most.
fn longest_free_piece(snap: &npumem_core::Snapshot, bank: usize) -> usize {
    // A free run holds its length from its first bank boundary, and a node of at most a bank
    // aligned to its size anywhere in it.
    let node_within = |from: usize, to: usize| {
        let mut size = bank;
        while size > 0 && from.next_multiple_of(size) + size > to {
            size /= 2;
        }
        size
    };
    snap.free_runs
        .iter()
        .map(|e| {
            (e.offset + e.len)
                .saturating_sub(e.offset.next_multiple_of(bank))
                .max(node_within(e.offset, e.offset + e.len))
        })
        .max()
        .unwrap_or(0)
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

/// The free chunks at the arena's end after a partly used chunk (one to three cores, runs with
/// and without tails, a short last chunk or none, blocks of 4 KiB to 300 KB at that chunk's
/// start): with tails, a block with a front in that chunk's free end takes them all, so the
/// largest free block is every byte from the first bank boundary after the block (or its
/// slab) to the arena's end; without tails, the free chunks alone. Exact either way ([`assert_exact`]).
#[test]
fn a_front_before_the_free_chunks_at_the_arena_end_counts() {
    let mut exact = Exactness::default();
    for cores in 1..=3 {
        for tails in [true, false] {
            for short in [0, 256 << 10, 1536 << 10] {
                for chunks in 2..=4usize {
                    for first in [4096, 8192, 20_000, 300_000] {
                        let config = PoolConfig::new(chunks * CHUNK + short)
                            .cores(cores)
                            .run_tails(tails)
                            .backing(Backing::None);
                        let p = Pool::new(config).unwrap();
                        let what = format!("{cores} cores, tails {tails}, {chunks} chunks and {short} B, {first} B");
                        let full: Vec<Handle> = (0..chunks - 2).map(|_| p.alloc(CHUNK, None, 0).unwrap()).collect();
                        let h = p.alloc(first, None, 0).unwrap();
                        let b = p.block(h).unwrap();
                        assert_eq!(b.offset / CHUNK, chunks - 2, "{what}: the block is in the chunk before the last");
                        // The free bytes at the end (a slab object's slab takes more than the
                        // object).
                        let snap = p.snapshot().unwrap();
                        let end = snap.free_runs.last().copied().unwrap();
                        assert_eq!(end.end(), p.stats().usable_capacity, "{what}");
                        let expected = match tails {
                            true => end.end() - end.offset.next_multiple_of(p.config().bank_size),
                            false => end.end() - end.offset.next_multiple_of(CHUNK),
                        };
                        assert_eq!(p.stats().largest_free_block, expected, "{what}");
                        assert_exact(&p, &mut exact, true, &what);
                        p.free(h).unwrap();
                        for h in full {
                            p.free(h).unwrap();
                        }
                        p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
                    }
                }
            }
        }
    }
    assert_eq!(exact.in_slabs, 0);
}

/// A pool of three 64 KiB chunks filled with blocks of one unit (no slabs), then one range of
/// units freed: fixed ranges inside a bank, across banks and across chunks, and random ones,
/// with and without tails. The figure is exact ([`assert_exact`], every size above it tried):
/// a trimmed block of at most a bank needs only its pieces free from its enclosing node's
/// start (a range of 31 units from a bank boundary holds a block of 31 units, not only the
/// free node of 16), a block larger than a bank the range from a bank boundary, and one with a
/// front the range's part in each of two chunks.
#[test]
fn a_hole_in_a_full_pool_holds_exactly_its_largest_block() {
    const CHUNK: usize = 64 << 10;
    const UNIT: usize = 256;
    let units = 3 * CHUNK / UNIT;
    let mut ranges =
        vec![(0, 31), (32, 63), (33, 64), (40, 72), (5, 200), (200, 300), (224, 288), (250, 262), (320, 612)];
    let mut rng = Rng(0xB10C_0FF5);
    for _ in 0..40 {
        let from = (rng.next() % units as u64) as usize;
        let len = rng.size(1, units - from);
        ranges.push((from, from + len));
    }
    let mut exact = Exactness::default();
    for tails in [false, true] {
        for &(from, to) in &ranges {
            let config = PoolConfig::new(3 * CHUNK)
                .cores(1)
                .chunk_size(CHUNK)
                .bank_size(8192)
                .min_block(UNIT)
                .run_tails(tails)
                .slab_sizes(Vec::new())
                .backing(Backing::None);
            let p = Pool::new(config).unwrap();
            let what = format!("tails {tails}, units {from}..{to} free");
            let mut at = vec![None; units];
            while let Ok(h) = p.alloc(UNIT, None, 0) {
                at[p.block(h).unwrap().offset / UNIT] = Some(h);
            }
            assert!(at.iter().all(Option::is_some), "{what}: every unit holds a block");
            for h in at[from..to].iter_mut().map(|h| h.take().unwrap()) {
                p.free(h).unwrap();
            }
            assert_eq!(p.stats().bytes_free, (to - from) * UNIT, "{what}");
            assert_exact(&p, &mut exact, true, &what);
            p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
    assert_eq!(exact.in_slabs, 0);
}

/// A core chunk that holds only a freed block in its core's cache (which an allocation takes
/// back before it fails) counts as a free chunk, as that reclaim leaves it; until then a
/// block with a front may start past the cached block. Four chunks of 2 MiB: chunk 0 holds the
/// cached 64 KiB block at its start, chunk 1 is free, chunk 2 holds a 64 KiB block at its end,
/// chunk 3 is full. Now a block with a front takes the rest of chunk 0, chunk 1 and the free
/// start of chunk 2 (6,160,384 B); once a failed request has reclaimed the cached block, the
/// free chunks 0 and 1 hold a run and a tail in chunk 2, which a tail's rule caps at
/// 1,906,501 B (longer tails make a third whole chunk that is not free). Exact both times.
#[test]
fn a_chunk_the_reclaim_empties_holds_a_front_until_it_is_reclaimed() {
    const BLOCK: usize = 64 << 10;
    let p = Pool::new(PoolConfig::new(4 * CHUNK).cores(1).core_reserve(0).backing(Backing::None)).unwrap();
    let mut blocks: Vec<(usize, Handle)> = Vec::new();
    while let Ok(h) = p.alloc(BLOCK, None, 0) {
        blocks.push((p.block(h).unwrap().offset, h));
    }
    assert_eq!(blocks.len(), 4 * CHUNK / BLOCK, "64 KiB blocks fill the pool");
    let first = blocks.iter().find(|(offset, _)| *offset == 0).unwrap().1;
    for &(offset, h) in &blocks {
        let keep = offset == 0 || offset == 3 * CHUNK - BLOCK || offset >= 3 * CHUNK;
        if !keep {
            p.free(h).unwrap();
        }
    }
    // A failing request takes the freed blocks back from the cache and the emptied chunk 1
    // back to the global pool; then the first block goes into the cache.
    assert!(p.alloc(4 * CHUNK, None, 0).is_err());
    p.free(first).unwrap();
    let s = p.stats();
    assert_eq!((s.chunks_free, s.chunks_in_cores), (1, 3), "chunk 1 is free");
    let front = CHUNK - BLOCK;
    assert_eq!(s.largest_free_block, front + CHUNK + (CHUNK - BLOCK), "the front, chunk 1, the tail");
    let mut exact = Exactness::default();
    assert_exact(&p, &mut exact, false, "with the cached block");
    let reclaimed = p.stats().largest_free_block;
    assert_eq!(reclaimed, 2 * CHUNK + 1_906_501, "a failed request took the cached block back");
    assert_exact(&p, &mut exact, false, "after the reclaim");
    assert_eq!(exact.in_slabs, 0);
    p.check().unwrap();
}

/// In a tree deeper than its bitmap of granules (chunks of 1 MiB in units of 64 B: granules of
/// two units), the allocator reads a chunk's free start in whole granules, and so does the
/// figure: a free start of 13 units takes a tail of 12. Three chunks filled with one-unit
/// blocks (no slabs), then the end of chunk 0 from its last bank boundary, all of chunk 1 and
/// the first 13 units of chunk 2 freed: the largest free block is a front, a chunk and a tail
/// of 12 units, exactly.
#[test]
fn a_free_start_counts_in_whole_granules_of_a_deep_tree() {
    const CHUNK: usize = MIB;
    const UNIT: usize = 64;
    const BANK: usize = 4096;
    let config = PoolConfig::new(3 * CHUNK)
        .cores(1)
        .chunk_size(CHUNK)
        .min_block(UNIT)
        .slab_sizes(Vec::new())
        .backing(Backing::None);
    let p = Pool::new(config).unwrap();
    let mut at = vec![None; 3 * CHUNK / UNIT];
    while let Ok(h) = p.alloc(UNIT, None, 0) {
        at[p.block(h).unwrap().offset / UNIT] = Some(h);
    }
    assert!(at.iter().all(Option::is_some), "every unit holds a block");
    let freed = (CHUNK - BANK) / UNIT..(2 * CHUNK + 13 * UNIT) / UNIT;
    for h in at[freed].iter_mut().map(|h| h.take().unwrap()) {
        p.free(h).unwrap();
    }
    assert_eq!(p.stats().largest_free_block, BANK + CHUNK + 12 * UNIT);
    let mut exact = Exactness::default();
    assert_exact(&p, &mut exact, true, "13 units free at the start of chunk 2");
    assert_eq!(exact.in_slabs, 0);
    p.check().unwrap();
}

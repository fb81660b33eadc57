//! Pool growth through the public API: regions added on demand, the limit, a hook that fails
//! (nothing changes, a later growth still works), no block spanning two regions, trim, stats,
//! snapshots and `check()` across regions, a compaction that moves blocks between regions,
//! bad arguments, and growth racing with allocations on other threads.
#![cfg(not(loom))]

mod common;

use common::{fill, verify, MIB};
use npumem_core::{Backing, CompactionMode, Error, Handle, Move, Pool, PoolConfig, Region};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn growing(capacity: usize, max: usize, step: usize, cores: usize) -> Pool {
    Pool::new(PoolConfig::new(capacity).cores(cores).growth(max, Some(step))).unwrap()
}

/// Every live block lies inside one region.
fn assert_inside_regions(p: &Pool) {
    let regions = p.regions();
    for b in p.blocks().unwrap() {
        let inside = |r: &Region| b.offset >= r.offset && b.offset + b.block_bytes <= r.offset + r.bytes;
        assert!(regions.iter().any(inside), "block {b:?} is not inside one region of {regions:?}");
    }
}

#[test]
fn a_pool_grows_when_it_is_full_and_stays_within_its_limit() {
    let p = growing(4 * MIB, 16 * MIB, 4 * MIB, 1);
    assert_eq!((p.capacity(), p.max_capacity(), p.stats().regions, p.stats().grow_events), (4 * MIB, 16 * MIB, 1, 0));
    let mut held = Vec::new();
    for i in 0..12 {
        let h = p.alloc(MIB, None, 0).unwrap();
        fill(&p, h, i);
        held.push(h);
    }
    let s = p.stats();
    assert_eq!((s.capacity, s.regions, s.grow_events), (12 * MIB, 3, 2));
    assert_eq!(s.usable_capacity, 12 * MIB);
    assert_eq!(p.regions()[1], Region { offset: 6 * MIB, bytes: 4 * MIB }, "one absent chunk apart");
    // A request larger than the step gets a region of its own size; the limit holds.
    match p.alloc(6 * MIB, None, 0) {
        // The free bytes the error reports are those of the regions the pool has now.
        Err(Error::OutOfMemory { bytes_free, .. }) => assert_eq!(bytes_free, p.stats().bytes_free, "12 + 6 > 16 MiB"),
        other => panic!("12 + 6 > 16 MiB, yet {other:?}"),
    }
    let big = p.alloc(4 * MIB, None, 0).unwrap();
    assert_eq!(p.stats().capacity, 16 * MIB);
    assert!(matches!(p.alloc(MIB, None, 0), Err(Error::OutOfMemory { .. })));
    assert_inside_regions(&p);
    p.check().unwrap();
    for (i, &h) in held.iter().enumerate() {
        verify(&p, h, i);
    }
    // A single request may be as large as max_capacity allows, not only the first region.
    assert!(matches!(p.alloc(17 * MIB, None, 0), Err(Error::TooLarge { .. })));
    p.free(big).unwrap();
}

#[test]
fn a_region_placed_past_a_gap_for_an_aligned_block_leaves_the_gap_absent() {
    for align in [8 * MIB, 16 * MIB] {
        let p = growing(2 * MIB, 32 * MIB, 2 * MIB, 1);
        let small = p.alloc(100, None, 0).unwrap();
        let aligned = p.alloc(100, Some(align), 0).unwrap();
        let info = p.block(aligned).unwrap();
        assert_eq!(info.offset % align, 0);
        assert!(p.regions().len() == 2, "the aligned block took a region of its own: {:?}", p.regions());
        assert_inside_regions(&p);
        p.check().unwrap_or_else(|e| panic!("align {align}: {e}"));
        // The gap's chunks are no room: a request that needs them grows the pool instead.
        let more = p.alloc(3 * MIB, None, 0).unwrap();
        assert_inside_regions(&p);
        p.check().unwrap();
        for h in [small, aligned, more] {
            p.free(h).unwrap();
        }
        p.trim().unwrap();
        p.check().unwrap();
    }
}

#[test]
fn runs_never_span_two_regions() {
    let p = growing(4 * MIB, 64 * MIB, 2 * MIB, 1);
    let a = p.alloc(MIB, None, 0).unwrap();
    // Chunk 1 is free, but a 4 MiB block would need chunk 2 as well: it gets a region of its own.
    let b = p.alloc(4 * MIB, None, 0).unwrap();
    assert_eq!(p.block(b).unwrap().offset, 3 * 2 * MIB, "one absent chunk after the first region");
    let c = p.alloc(2 * MIB, None, 0).unwrap();
    assert_eq!(p.block(c).unwrap().offset, 2 * MIB, "chunk 1 still serves");
    assert_eq!(p.stats().regions, 2, "{:?}", p.regions());
    assert_inside_regions(&p);
    p.check().unwrap();
    for h in [a, b, c] {
        p.free(h).unwrap();
    }
    let d = p.alloc(4 * MIB, None, 0).unwrap();
    assert_eq!(p.stats().regions, 2, "a free region serves before the pool grows");
    assert_inside_regions(&p);
    p.free(d).unwrap();
}

#[test]
fn a_failing_hook_changes_nothing_and_a_later_growth_works() {
    let p = growing(2 * MIB, 8 * MIB, 2 * MIB, 1);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let fail = Arc::new(AtomicUsize::new(1));
    let (c, f) = (calls.clone(), fail.clone());
    p.set_on_grow(Some(Arc::new(move |offset, bytes| {
        c.lock().unwrap().push((offset, bytes));
        match f.load(Ordering::SeqCst) {
            1 => Err("the device is out of memory".into()),
            _ => Ok(()),
        }
    })));
    let first = p.alloc(2 * MIB, None, 0).unwrap();
    let before = (p.stats().capacity, p.stats().regions, p.stats().grow_events, p.regions());
    assert!(matches!(p.alloc(MIB, None, 0), Err(Error::OutOfMemory { .. })));
    assert_eq!(before, (p.stats().capacity, p.stats().regions, p.stats().grow_events, p.regions()));
    assert_eq!(p.stats().failed_allocs, 1);
    p.check().unwrap();
    fail.store(0, Ordering::SeqCst);
    let second = p.alloc(MIB, None, 0).unwrap();
    assert_eq!(p.stats().grow_events, 1);
    assert_eq!(*calls.lock().unwrap(), vec![(2 * 2 * MIB, 2 * MIB), (4 * MIB, 2 * MIB)]);
    assert_eq!(p.block(second).unwrap().offset, 4 * MIB);
    p.check().unwrap();
    p.free(first).unwrap();
    p.free(second).unwrap();
}

#[test]
fn trim_gives_back_free_regions_except_the_first() {
    let p = Pool::new(PoolConfig::new(2 * MIB).growth(32 * MIB, Some(2 * MIB)).backing(Backing::None)).unwrap();
    let trimmed = Arc::new(Mutex::new(Vec::new()));
    let t = trimmed.clone();
    p.set_on_trim(Some(Arc::new(move |offset, bytes| {
        t.lock().unwrap().push((offset, bytes));
        Ok(())
    })));
    let blocks: Vec<Handle> = (0..6).map(|_| p.alloc(MIB + MIB / 2, None, 0).unwrap()).collect();
    assert_eq!(p.stats().regions, 6);
    let held = p.stats().bytes_in_use;
    assert!(held >= 9 * MIB && p.stats().peak_bytes_in_use >= held);
    // Keep the blocks of regions 0 and 3: regions 1, 2, 4, 5 go.
    for (i, &h) in blocks.iter().enumerate() {
        if i != 0 && i != 3 {
            p.free(h).unwrap();
        }
    }
    p.trim().unwrap();
    let s = p.stats();
    assert_eq!((s.regions, s.capacity, s.grow_events), (2, 4 * MIB, 5));
    assert!(s.peak_bytes_in_use >= held, "a trim keeps the peak the regions held: {}", s.peak_bytes_in_use);
    assert_eq!(trimmed.lock().unwrap().len(), 4);
    p.check().unwrap();
    // The offsets of trimmed regions serve again.
    let again = p.alloc(MIB, None, 0).unwrap();
    assert_eq!(p.block(again).unwrap().offset, 2 * 2 * MIB, "the first hole after region 0");
    p.check().unwrap();
    p.free(blocks[0]).unwrap();
    p.free(blocks[3]).unwrap();
    p.free(again).unwrap();
    p.trim().unwrap();
    assert_eq!((p.stats().regions, p.stats().capacity), (1, 2 * MIB), "the first region stays");
    assert!(p.stats().peak_bytes_in_use >= held);
    p.check().unwrap();
}

#[test]
fn snapshots_list_regions_and_absent_space_is_not_free() {
    let p = growing(4 * MIB, 16 * MIB, 4 * MIB, 1);
    let held: Vec<Handle> = (0..5).map(|_| p.alloc(MIB, None, 0).unwrap()).collect();
    let snap = p.snapshot().unwrap();
    assert_eq!(snap.regions.len(), 2);
    assert!(snap.untracked.is_empty(), "absent space is not untracked: {:?}", snap.untracked);
    let free: usize = snap.free_runs.iter().map(|e| e.len).sum();
    assert_eq!(free, snap.stats.bytes_free, "free runs cover the free bytes of the regions only");
    assert_eq!(snap.stats.chunks, 4);
    for run in &snap.free_runs {
        assert!(snap.regions.iter().any(|r| run.offset >= r.offset && run.end() <= r.end()));
    }
    held.into_iter().for_each(|h| p.free(h).unwrap());
}

#[test]
fn a_compaction_moves_blocks_between_regions() {
    let p = growing(4 * MIB, 16 * MIB, 4 * MIB, 1);
    let blocks: Vec<Handle> = (0..6).map(|_| p.alloc(MIB, None, 0).unwrap()).collect();
    for (i, &h) in blocks.iter().enumerate() {
        fill(&p, h, i);
    }
    assert_eq!(p.stats().regions, 2);
    // Free room in the first region, then move a block of the second one there.
    p.free(blocks[0]).unwrap();
    let from = p.block(blocks[5]).unwrap().offset;
    assert!(from >= 3 * 2 * MIB);
    let token = p.pause(Duration::from_secs(5)).unwrap();
    p.move_blocks(&token, &[Move { handle: blocks[5], to: 0 }], None).unwrap();
    p.resume(&token).unwrap();
    assert_eq!(p.block(blocks[5]).unwrap().offset, 0);
    verify(&p, blocks[5], 5);
    p.check().unwrap();
    // A move into absent space is refused and changes nothing.
    let token = p.pause(Duration::from_secs(5)).unwrap();
    assert!(p.move_blocks(&token, &[Move { handle: blocks[4], to: 4 * MIB }], None).is_err());
    p.resume(&token).unwrap();
    p.check().unwrap();
    // A full compaction across regions keeps every byte.
    let token = p.pause(Duration::from_secs(5)).unwrap();
    p.compact_step(&token, &CompactionMode::Full, None).unwrap();
    p.resume(&token).unwrap();
    p.check().unwrap();
    assert_inside_regions(&p);
    for (i, &h) in blocks.iter().enumerate().skip(1) {
        verify(&p, h, i);
    }
}

#[test]
fn bad_growth_arguments_are_refused() {
    let field = |c: PoolConfig| match Pool::new(c) {
        Err(Error::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(field(PoolConfig::new(8 * MIB).growth(4 * MIB, None)), "max_capacity");
    assert_eq!(field(PoolConfig::new(8 * MIB).growth(16 * MIB, Some(0))), "grow_by");
    assert_eq!(field(PoolConfig::new(3 * MIB).growth(16 * MIB, None)), "capacity");
    assert_eq!(field(PoolConfig { grow_by: Some(MIB), ..PoolConfig::new(8 * MIB) }), "grow_by");
    // max_capacity equal to capacity: a pool that cannot grow, as without one.
    let p = Pool::new(PoolConfig::new(3 * MIB).growth(3 * MIB, None)).unwrap();
    assert_eq!((p.capacity(), p.max_capacity()), (3 * MIB, 3 * MIB));
}

#[test]
fn growth_races_with_allocations_on_other_threads() {
    let p = growing(4 * MIB, 256 * MIB, 8 * MIB, 4);
    let ids = AtomicUsize::new(1);
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (p, ids) = (&p, &ids);
            s.spawn(move || {
                let mut rng = t as u64 + 1;
                let mut held: Vec<(Handle, usize)> = Vec::new();
                for _ in 0..200 {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let size = match rng >> 62 {
                        0 => 64 + (rng >> 40) as usize % 4000,
                        1 => 8192 + (rng >> 40) as usize % 200_000,
                        2 => MIB + (rng >> 40) as usize % (3 * MIB),
                        _ => 256 + (rng >> 40) as usize % 60_000,
                    };
                    let id = ids.fetch_add(1, Ordering::Relaxed);
                    let h = p.alloc(size, None, 0).unwrap();
                    fill(p, h, id);
                    held.push((h, id));
                    if held.len() > 24 {
                        let (h, id) = held.swap_remove((rng >> 33) as usize % held.len());
                        verify(p, h, id);
                        p.free(h).unwrap();
                    }
                }
                for (h, id) in held {
                    verify(p, h, id);
                    p.free(h).unwrap();
                }
            });
        }
    });
    let s = p.stats();
    assert!(s.grow_events >= 1 && s.regions == 1 + s.grow_events as usize, "{s:?}");
    assert_eq!(s.blocks_in_use, 0);
    p.check().unwrap();
    p.trim().unwrap();
    assert_eq!(p.stats().regions, 1);
    p.check().unwrap();
}

/// Threads that only allocate whole chunks, in a pool that grows by one chunk: nearly every
/// allocation grows the pool, and the chunk a growth adds may go to another thread before the
/// grower places its own block there. No allocation fails before the pool reaches its
/// `max_capacity`: a grower whose room was taken grows again.
#[test]
fn an_allocation_whose_new_room_was_taken_grows_again() {
    const THREADS: usize = 4;
    const EACH: usize = 60;
    for round in 0..4 {
        let p = growing(2 * MIB, (THREADS * EACH + 1) * 2 * MIB, 2 * MIB, 2);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let p = &p;
                s.spawn(move || {
                    for i in 0..EACH {
                        let size = 2 * MIB - 4096 * (1 + (t * EACH + i) % 8);
                        if let Err(err) = p.alloc(size, None, 0) {
                            let s = p.stats();
                            panic!(
                                "round {round}, thread {t}, block {i}: {err} with {} of {} bytes grown",
                                s.capacity,
                                p.max_capacity()
                            );
                        }
                    }
                });
            }
        });
        let s = p.stats();
        assert_eq!(s.blocks_in_use, (THREADS * EACH) as u64);
        assert!(s.capacity <= p.max_capacity(), "{s:?}");
        p.check().unwrap();
    }
}

/// A pool grown to five regions, two blocks of three freed: a staged full compaction packs the
/// survivors into the first regions, and trim gives back the later ones it emptied.
#[test]
fn a_full_compaction_empties_later_regions_for_trim() {
    let p = growing(4 * MIB, 32 * MIB, 4 * MIB, 1);
    let all: Vec<(Handle, usize)> = (0..400)
        .map(|i| {
            let h = p.alloc(20_000 + (i % 7) * 3000, None, 0).unwrap();
            fill(&p, h, i);
            (h, i)
        })
        .collect();
    let mut kept = Vec::new();
    for (h, i) in all {
        if i % 3 == 0 {
            kept.push((h, i));
        } else {
            p.free(h).unwrap();
        }
    }
    p.trim().unwrap();
    let before = p.stats().regions;
    assert!(before >= 4, "the survivors are spread over the regions ({before})");
    let done = p.compact(&CompactionMode::Full, None, Duration::from_secs(5)).unwrap();
    assert!(done.blocks > 0);
    p.trim().unwrap();
    let live: usize = kept.iter().map(|&(h, _)| p.block(h).unwrap().size).sum();
    let after = p.stats().regions;
    assert!(after < before, "regions {before} -> {after}");
    assert!(after <= live.div_ceil(4 * MIB) + 1, "{after} regions for {live} live bytes");
    assert_inside_regions(&p);
    for &(h, i) in &kept {
        verify(&p, h, i);
    }
    p.check().unwrap();
}

#[test]
fn no_request_larger_than_the_largest_region_is_taken() {
    // 2 chunks present, 32 at most: a region added later holds at most 30 chunks (60 MiB), one
    // chunk past the first, which is never given back.
    let p = Pool::new(PoolConfig::new(4 * MIB).cores(1).growth(64 * MIB, None)).unwrap();
    assert_eq!(p.largest_request(), 60 * MIB);
    for size in [64 * MIB, 61 * MIB, 60 * MIB + 1] {
        match p.alloc(size, None, 0) {
            Err(Error::TooLarge { size: asked, capacity, usable, first_region, bytes_free, .. }) => {
                assert_eq!((asked, capacity, usable, first_region), (size, 64 * MIB, 60 * MIB, Some(4 * MIB)));
                assert_eq!(bytes_free, 4 * MIB);
            }
            other => panic!("{size}: {other:?}"),
        }
    }
    let text = p.alloc(61 * MIB, None, 0).unwrap_err().to_string();
    assert!(text.contains("no block of this pool can be larger than 62914560 bytes"), "{text}");
    assert_eq!(p.stats().grow_events, 0, "a refused request does not grow the pool");
    let h = p.alloc(60 * MIB, None, 0).unwrap();
    assert_eq!(p.regions(), [Region { offset: 0, bytes: 4 * MIB }, Region { offset: 6 * MIB, bytes: 60 * MIB }]);
    p.free(h).unwrap();
    // A first region larger than the rest of the limit is the largest.
    let p = Pool::new(PoolConfig::new(48 * MIB).cores(1).growth(64 * MIB, None)).unwrap();
    assert_eq!(p.largest_request(), 48 * MIB);
    assert!(matches!(p.alloc(49 * MIB, None, 0), Err(Error::TooLarge { .. })));
    // A limit that is not a multiple of the chunk would be passed or left short of: refused.
    match Pool::new(PoolConfig::new(2 * MIB).cores(1).growth(5 * MIB, None)) {
        Err(Error::Config { field, .. }) => assert_eq!(field, "max_capacity"),
        other => panic!("{:?}", other.map(|p| p.max_capacity())),
    }
}

#[test]
fn a_failed_batch_in_a_pool_that_grows_reports_the_room_it_had() {
    let p = growing(8 * MIB, 32 * MIB, 8 * MIB, 1);
    match p.alloc_many(&[6 * MIB; 6], None, 0) {
        Err(Error::Batch { index, error, shortfall: Some(shortfall) }) => {
            let Error::OutOfMemory { requested, bytes_free, largest_free_block, .. } = *error else {
                panic!("{error:?}")
            };
            assert_eq!(requested, 6 * MIB);
            assert!(largest_free_block < requested, "item {index}: {largest_free_block} free in one block");
            assert!(bytes_free < shortfall.free, "the batch's earlier items held room");
            assert_eq!(shortfall.asked, 36 * MIB);
            assert!(shortfall.free <= 32 * MIB, "{shortfall:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.regions(), [Region { offset: 0, bytes: 8 * MIB }], "the regions it added went back");
    p.check().unwrap();
}

/// A failed batch of mixed sizes gives back every region it added, although its earlier items'
/// places went into the caches of freed blocks on their way back: those are drained first, as
/// a failing allocation drains them, so the regions are entirely free.
#[test]
fn a_failed_batch_of_mixed_sizes_gives_back_every_region_it_added() {
    for cores in [1, 2] {
        let p = Pool::new(PoolConfig::new(8 * MIB).cores(cores).backing(Backing::None).growth(24 * MIB, Some(4 * MIB)))
            .unwrap();
        let kept: Vec<Handle> = (0..8).map(|_| p.alloc(900_000, None, 0).unwrap()).collect();
        let before = (p.capacity(), p.regions());
        let batch = [3, 1, 1, 5, 3, 5, 1, 3, 3].map(|m| m * MIB);
        assert!(matches!(p.alloc_many(&batch, None, 0), Err(Error::Batch { .. })));
        assert!(p.stats().grow_events > 0, "{cores} cores: the batch grew the pool");
        assert_eq!((p.capacity(), p.regions()), before, "{cores} cores: the regions the batch added went back");
        assert_eq!(p.check().unwrap(), kept.len());
    }
}

/// A request that fits in the free bytes but in no region fails, and its error says so: no
/// block spans two regions, so no compaction could make room for it.
#[test]
fn a_request_larger_than_every_region_says_so() {
    let p = growing(4 * MIB, 16 * MIB, 2 * MIB, 1);
    let blocks: Vec<Handle> = (0..12).map(|_| p.alloc(MIB, None, 0).unwrap()).collect();
    assert_eq!(p.regions().len(), 5, "{:?}", p.regions());
    // One block stays in every region, so that none is given back to make room.
    for (i, h) in blocks.into_iter().enumerate() {
        if ![0, 4, 6, 8, 10].contains(&i) {
            p.free(h).unwrap();
        }
    }
    let err = p.alloc(5 * MIB, None, 0).unwrap_err();
    let Error::OutOfMemory { requested, bytes_free, largest_region, .. } = err else { panic!("{err:?}") };
    assert_eq!((requested, bytes_free, largest_region), (5 * MIB, 7 * MIB, Some(4 * MIB)));
    assert!(err.to_string().contains("no region of the pool is that large (the largest holds 4194304 bytes"), "{err}");
    p.check().unwrap();
}

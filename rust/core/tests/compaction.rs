//! Compaction through the public API: held pauses, validated batches of moves (slides, cycles,
//! refusals that change nothing, a failing mover), full and incremental compaction with every
//! byte checked, and compaction while other threads allocate, write, check and free.
#![cfg(not(loom))]

mod common;

use common::{fill, fragment, pool, verify, Rng, MIB, WAIT};
use npumem_core::{Backing, BlockInfo, CompactionMode, Error, Handle, Move, Placement, Pool, PoolConfig, Transfer};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

fn device_pool(capacity: usize, cores: usize) -> Pool {
    Pool::new(PoolConfig::new(capacity).cores(cores).backing(Backing::None)).unwrap()
}

fn state(p: &Pool) -> (Vec<BlockInfo>, usize, usize) {
    let s = p.stats();
    (p.blocks().unwrap(), s.bytes_in_use, s.largest_free_block)
}

#[test]
fn a_held_pause_holds_others_lets_its_thread_in_and_resumes_once() {
    let p = pool(64 * MIB, 2);
    let token = p.pause(WAIT).unwrap();
    assert!(p.is_paused() && p.holds(&token));
    // The pausing thread may allocate and free; check() nests inside the pause.
    let h = p.alloc(1000, None, 0).unwrap();
    p.check().unwrap();
    p.free(h).unwrap();
    assert!(p.pause(Duration::from_millis(10)).is_err(), "one held pause per thread");
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            assert!(p.try_alloc_fast(100, None, 0).unwrap().is_none(), "others do not get in");
            assert!(matches!(p.pause(Duration::from_millis(20)), Err(Error::Busy { .. })));
            let h = p.alloc(100, None, 0).unwrap(); // waits for the resume
            assert!(done.load(Ordering::SeqCst), "allocated before the resume");
            p.free(h).unwrap();
        });
        std::thread::sleep(Duration::from_millis(60));
        done.store(true, Ordering::SeqCst);
        p.resume(&token).unwrap();
        other.join().unwrap();
    });
    assert_eq!(p.resume(&token), Err(Error::NotPaused), "a token resumes once");
    assert!(!p.is_paused());
    p.check().unwrap();
}

#[test]
fn callers_wait_for_a_pause_no_longer_than_its_timeout() {
    let p = pool(16 * MIB, 1);
    let h = p.alloc(5000, None, 0).unwrap();
    let limit = Duration::from_millis(100);
    let token = p.pause(limit).unwrap(); // and never resumed in time
    std::thread::scope(|s| {
        s.spawn(|| {
            let started = std::time::Instant::now();
            assert!(matches!(p.alloc(100, None, 0), Err(Error::PausedTooLong { .. })));
            assert!(started.elapsed() >= limit);
            assert!(matches!(p.free(h), Err(Error::PausedTooLong { .. })));
        })
        .join()
        .unwrap();
    });
    p.resume(&token).unwrap();
    p.free(h).unwrap(); // the refused free did nothing
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

#[test]
fn moves_of_every_kind_keep_every_byte_and_handle() {
    let p = pool(64 * MIB, 2);
    let small = p.alloc(200, None, 0).unwrap(); // slab object
    let medium = p.alloc(40_000, None, 0).unwrap(); // buddy block
    let large = p.alloc(5 * MIB, None, 0).unwrap(); // run of 3 chunks
    for (id, &h) in [small, medium, large].iter().enumerate() {
        fill(&p, h, id);
    }
    // Destinations: a free object in the same slab, a free place in another chunk, free chunks.
    let neighbour = p.alloc(200, None, 0).unwrap();
    let object_slot = p.block(neighbour).unwrap().offset;
    p.free(neighbour).unwrap();
    let token = p.pause(WAIT).unwrap();
    let moves = [
        Move { handle: small, to: object_slot },
        Move { handle: medium, to: 20 * MIB },
        Move { handle: large, to: 40 * MIB },
    ];
    let done = p.move_blocks(&token, &moves, None).unwrap();
    assert_eq!((done.blocks, done.bytes), (3, 200 + 40_000 + 5 * MIB));
    assert_eq!(p.block(small).unwrap().offset, object_slot);
    assert_eq!(p.block(medium).unwrap().offset, 20 * MIB);
    assert_eq!(p.block(large).unwrap().offset, 40 * MIB);
    p.check().unwrap();
    p.resume(&token).unwrap();
    for (id, &h) in [small, medium, large].iter().enumerate() {
        verify(&p, h, id);
    }
    for h in [small, medium, large] {
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

#[test]
fn a_trimmed_block_packs_anywhere_the_bank_rule_allows() {
    let p = pool(16 * MIB, 1);
    // 5000 bytes: 20 units of 256 B, trimmed from a 32-unit (8 KiB) buddy node.
    let a = p.alloc(5000, None, 0).unwrap();
    let b = p.alloc(9000, None, 0).unwrap();
    fill(&p, a, 1);
    fill(&p, b, 2);
    let token = p.pause(WAIT).unwrap();
    // Not on a unit, and straddling a bank: refused, nothing changes.
    let before = state(&p);
    for to in [8 * MIB + 100, 8 * MIB + 2048] {
        assert!(p.move_blocks(&token, &[Move { handle: a, to }], None).is_err(), "to {to}");
        assert_eq!(state(&p), before);
    }
    // Packed: `a` right after 4 KiB (not at its 8 KiB node), `b` right behind it on the next
    // bank: the free tail of `a`'s node is used.
    let moves = [Move { handle: a, to: 8 * MIB + 4096 }, Move { handle: b, to: 8 * MIB + 12_288 }];
    p.move_blocks(&token, &moves, None).unwrap();
    p.check().unwrap();
    p.resume(&token).unwrap();
    verify(&p, a, 1);
    verify(&p, b, 2);
    // Freed like any block; the chunk is whole again (a block of half a chunk fits there).
    p.free(a).unwrap();
    p.check().unwrap();
    p.free(b).unwrap();
    p.check().unwrap();
    assert!(p.free(a).is_err(), "a double free of a packed block is refused");
    assert_eq!(p.stats().bytes_in_use, 0);
    let halves: Vec<Handle> = (0..16).map(|_| p.alloc(MIB, None, 0).unwrap()).collect();
    p.check().unwrap();
    for h in halves {
        p.free(h).unwrap();
    }
}

#[test]
fn a_run_slides_over_its_own_source_and_blocks_swap_through_a_bounce_buffer() {
    let p = pool(64 * MIB, 1);
    let gap = p.alloc(2 * MIB, None, 0).unwrap();
    let run = p.alloc(6 * MIB, None, 0).unwrap();
    assert_eq!(p.block(run).unwrap().offset, 2 * MIB);
    fill(&p, run, 1);
    let a = p.alloc(64 << 10, None, 0).unwrap();
    let b = p.alloc(64 << 10, None, 0).unwrap();
    fill(&p, a, 2);
    fill(&p, b, 3);
    p.free(gap).unwrap();
    let (oa, ob) = (p.block(a).unwrap().offset, p.block(b).unwrap().offset);
    assert!(oa >= 8 * MIB && ob >= 8 * MIB);
    let token = p.pause(WAIT).unwrap();
    // Slide the run down one chunk (overlapping its own source); swap a and b (a cycle).
    let done = p
        .move_blocks(
            &token,
            &[Move { handle: run, to: 0 }, Move { handle: a, to: ob }, Move { handle: b, to: oa }],
            None,
        )
        .unwrap();
    assert_eq!(done.bounced, 1, "the swap needs one bounce");
    p.check().unwrap();
    p.resume(&token).unwrap();
    assert_eq!(p.block(run).unwrap().offset, 0);
    assert_eq!((p.block(a).unwrap().offset, p.block(b).unwrap().offset), (ob, oa));
    verify(&p, run, 1);
    verify(&p, a, 2);
    verify(&p, b, 3);
}

#[test]
fn refused_batches_change_nothing() {
    let p = pool(64 * MIB, 2);
    let a = p.alloc(40_000, None, 0).unwrap();
    let b = p.alloc(40_000, None, 0).unwrap();
    let c = p.alloc(300, None, 0).unwrap();
    let pinned = p.alloc(40_000, None, 0).unwrap();
    p.pin(pinned).unwrap();
    let other = pool(64 * MIB, 1);
    let foreign = other.alloc(100, None, 0).unwrap();
    let freed = p.alloc(100, None, 0).unwrap();
    p.free(freed).unwrap();
    let before = state(&p);
    let ob = p.block(b).unwrap().offset;
    let token = p.pause(WAIT).unwrap();
    let cases: Vec<(Vec<Move>, &str)> = vec![
        (vec![Move { handle: a, to: 30 * MIB }, Move { handle: pinned, to: 32 * MIB }], "pinned"),
        (vec![Move { handle: a, to: ob }], "onto a live block"),
        (vec![Move { handle: a, to: 30 * MIB + 256 }], "not a buddy start"),
        (vec![Move { handle: a, to: 64 * MIB }], "outside"),
        (vec![Move { handle: a, to: 30 * MIB }, Move { handle: b, to: 30 * MIB }], "same destination"),
        (vec![Move { handle: a, to: 30 * MIB }, Move { handle: a, to: 32 * MIB }], "twice"),
        (vec![Move { handle: c, to: 30 * MIB }], "slab object out of a slab"),
        (vec![Move { handle: foreign, to: 30 * MIB }], "foreign"),
        (vec![Move { handle: freed, to: 30 * MIB }], "freed"),
    ];
    for (moves, what) in cases {
        let err = p.move_blocks(&token, &moves, None).unwrap_err();
        assert!(matches!(err, Error::Batch { .. }), "{what}: {err}");
        assert_eq!(state(&p), before, "{what} changed the pool");
        p.check().unwrap();
    }
    p.resume(&token).unwrap();
    assert!(matches!(p.move_blocks(&token, &[Move { handle: a, to: 30 * MIB }], None), Err(Error::NotPaused)));
    assert_eq!(state(&p), before);
    p.unpin(pinned).unwrap();
}

#[test]
fn a_failing_mover_undoes_the_batch_and_a_device_cycle_is_refused() {
    let p = device_pool(64 * MIB, 2);
    let blocks: Vec<Handle> = [40_000, 3 * MIB, 300, 100_000].iter().map(|&s| p.alloc(s, None, 0).unwrap()).collect();
    let slot = {
        let t = p.alloc(300, None, 0).unwrap();
        let o = p.block(t).unwrap().offset;
        p.free(t).unwrap();
        o
    };
    let before = state(&p);
    let token = p.pause(WAIT).unwrap();
    let moves = [
        Move { handle: blocks[0], to: 30 * MIB },
        Move { handle: blocks[1], to: 40 * MIB },
        Move { handle: blocks[2], to: slot },
        Move { handle: blocks[3], to: 50 * MIB },
    ];
    let mut seen: Vec<Transfer> = Vec::new();
    let mut failing = |batch: &[Transfer]| {
        seen.extend_from_slice(batch);
        Err("device lost".to_string())
    };
    let err = p.move_blocks(&token, &moves, Some(&mut failing)).unwrap_err();
    assert_eq!(err, Error::MoverFailed("device lost".into()));
    assert_eq!(seen.len(), 4, "the mover saw the whole batch");
    assert_eq!(state(&p), before);
    p.check().unwrap();
    // A swap on a device pool: no host memory to bounce through, so one block goes through
    // free space of the arena first (three copies), which nothing else touches.
    let o0 = before.0.iter().find(|b| b.handle == blocks[0]).unwrap().offset;
    let twin = p.alloc(40_000, None, 0).unwrap();
    let ot = p.block(twin).unwrap().offset;
    let swap = [Move { handle: blocks[0], to: ot }, Move { handle: twin, to: o0 }];
    let mut copies: Vec<Transfer> = Vec::new();
    let mut record = |batch: &[Transfer]| {
        copies.extend_from_slice(batch);
        Ok(())
    };
    let done = p.move_blocks(&token, &swap, Some(&mut record)).unwrap();
    assert_eq!((done.blocks, done.bounced, copies.len()), (2, 1, 3));
    let (save, restore) = (copies[0], copies[2]);
    assert_eq!((save.dst, save.len), (restore.src, restore.len), "out to scratch and back");
    let (saved, other) = if save.src == o0 { (o0, ot) } else { (ot, o0) };
    assert_eq!(copies[1], Transfer { src: other, dst: saved, len: 40_000 }, "the other block moves");
    assert_eq!(restore.dst, other, "then the saved one lands where the other was");
    let live = state(&p).0;
    assert!(live.iter().all(|b| b.offset + b.block_bytes <= save.dst || save.dst + save.len <= b.offset));
    let back = [Move { handle: blocks[0], to: o0 }, Move { handle: twin, to: ot }];
    p.move_blocks(&token, &back, Some(&mut |_: &[Transfer]| Ok(()))).unwrap();
    p.free(twin).unwrap();
    assert_eq!(state(&p), before);
    p.check().unwrap();
    // The same batch with a working mover goes through.
    let mut calls = 0;
    let mut ok = |batch: &[Transfer]| {
        calls += batch.len();
        Ok(())
    };
    p.move_blocks(&token, &moves, Some(&mut ok)).unwrap();
    assert_eq!(calls, 4);
    p.resume(&token).unwrap();
    assert_eq!(p.block(blocks[1]).unwrap().offset, 40 * MIB);
    p.check().unwrap();
}

#[test]
fn a_device_cycle_without_free_space_to_bounce_through_is_refused() {
    let p = device_pool(4 * MIB, 1);
    let a = p.alloc(MIB, None, 0).unwrap();
    let b = p.alloc(MIB, None, 0).unwrap();
    let full = p.alloc(2 * MIB, None, 0).unwrap(); // the arena is full now
    let before = state(&p);
    let (oa, ob) = (p.block(a).unwrap().offset, p.block(b).unwrap().offset);
    let token = p.pause(WAIT).unwrap();
    let swap = [Move { handle: a, to: ob }, Move { handle: b, to: oa }];
    let mut calls = 0;
    let mut mover = |_: &[Transfer]| {
        calls += 1;
        Ok(())
    };
    assert!(matches!(p.move_blocks(&token, &swap, Some(&mut mover)), Err(Error::MoveCycle { blocks: 2 })));
    assert_eq!(calls, 0, "nothing was copied");
    assert_eq!(state(&p), before);
    p.check().unwrap();
    p.resume(&token).unwrap();
    for h in [a, b, full] {
        p.free(h).unwrap();
    }
}

#[test]
fn the_mover_cannot_use_the_pool_it_moves() {
    let p = device_pool(64 * MIB, 1);
    let h = p.alloc(40_000, None, 0).unwrap();
    let token = p.pause(WAIT).unwrap();
    let mut inner = |_: &[Transfer]| {
        assert_eq!(p.alloc(100, None, 0).unwrap_err(), Error::Relocating);
        assert_eq!(p.pin(h).unwrap_err(), Error::Relocating);
        assert_eq!(p.resume(&token).unwrap_err(), Error::Relocating);
        assert!(matches!(p.check(), Err(Error::Relocating)));
        Ok(())
    };
    p.move_blocks(&token, &[Move { handle: h, to: 30 * MIB }], Some(&mut inner)).unwrap();
    p.resume(&token).unwrap();
    p.check().unwrap();
}

#[test]
fn full_compaction_leaves_one_free_stretch_and_every_byte() {
    let p = pool(128 * MIB, 2);
    let sizes = [64, 200, 1000, 3000, 5000, 20_000, 70_000, 300_000, 900_000];
    let kept = fragment(&p, &sizes, 40);
    let pinned = kept[kept.len() / 2].0;
    p.pin(pinned).unwrap();
    let pinned_at = p.block(pinned).unwrap().offset;
    let before = p.stats();
    assert!(before.external_fragmentation > 0.2, "fragmented: {}", before.external_fragmentation);
    let token = p.pause(WAIT).unwrap();
    let plan = p.plan_compaction(Some(&token), &CompactionMode::Full).unwrap();
    assert!(plan.blocks > 0 && plan.largest_free_after > plan.largest_free_before);
    assert_eq!(state(&p).0, p.blocks().unwrap(), "planning moves nothing");
    let done = p.compact_step(&token, &CompactionMode::Full, None).unwrap();
    p.check().unwrap();
    p.resume(&token).unwrap();
    let after = p.stats();
    assert!(done.blocks > 0 && done.bytes > 0);
    assert_eq!(p.block(pinned).unwrap().offset, pinned_at, "a pinned block never moves");
    assert!(after.largest_free_block > before.largest_free_block);
    // Free space is one run but for what no packing can use: the rest of the last bank of each
    // block larger than a bank (the next one starts on a bank boundary), the partly filled last
    // chunk, the pinned block's chunk, and at most a sixteenth of the free bytes that packing
    // below a boundary leaves in holes (a repack would move every block to save that).
    let config = p.config();
    let slack: usize = p
        .blocks()
        .unwrap()
        .iter()
        .filter(|b| b.block_bytes > config.bank_size && b.block_bytes <= config.chunk_size / 2)
        .map(|b| b.block_bytes.next_multiple_of(config.bank_size) - b.block_bytes)
        .sum();
    let outside = after.bytes_free - after.largest_free_block;
    assert!(
        outside <= slack + 2 * config.chunk_size + after.bytes_free / 16,
        "{outside} free bytes outside the largest run (bank slack {slack})"
    );
    eprintln!(
        "fragmentation {:.4} -> {:.4}, largest free {} -> {} (plan said {}), {} blocks, {} bytes",
        before.external_fragmentation,
        after.external_fragmentation,
        before.largest_free_block,
        after.largest_free_block,
        plan.largest_free_after,
        done.blocks,
        done.bytes
    );
    for &(h, id) in &kept {
        verify(&p, h, id);
    }
    p.unpin(pinned).unwrap();
}

#[test]
fn an_incremental_step_evacuates_the_sparsest_chunk_above_the_boundary_first() {
    const BLOCK: usize = 64 << 10;
    let p = pool(32 * MIB, 1);
    let chunk_size = p.config().chunk_size;
    let mut by_chunk: Vec<Vec<Handle>> = vec![Vec::new(); 16];
    for _ in 0..12 * (chunk_size / BLOCK) {
        let h = p.alloc(BLOCK, None, 0).unwrap();
        by_chunk[p.block(h).unwrap().offset / chunk_size].push(h);
    }
    // Chunks 0-5 half empty (the holes), 6-7 full; above them chunks holding 4, 20, 2 and 10
    // blocks: the sparsest is chunk 10, the highest chunk 11.
    let keep = [16, 16, 16, 16, 16, 16, 32, 32, 4, 20, 2, 10];
    for (chunk, &n) in keep.iter().enumerate() {
        assert_eq!(by_chunk[chunk].len(), chunk_size / BLOCK, "blocks fill chunks in order");
        for h in by_chunk[chunk].drain(n..) {
            p.free(h).unwrap();
        }
    }
    let token = p.pause(WAIT).unwrap();
    let step = CompactionMode::Incremental { max_bytes: 3 * BLOCK };
    let plan = p.plan_compaction(Some(&token), &step).unwrap();
    let sources: Vec<usize> = plan.moves.iter().map(|m| m.from / chunk_size).collect();
    assert_eq!(sources[..2], [10, 10], "chunk 10 (2 blocks) empties first: {sources:?}");
    assert_eq!(sources[2], 8, "then the next sparsest, chunk 8: {sources:?}");
    assert!(plan.moves.iter().all(|m| m.to / chunk_size <= 5), "into the holes below the boundary");
    assert_eq!(plan.chunks_emptied, 1);
    let done = p.compact_step(&token, &step, None).unwrap();
    assert_eq!(done.bytes, 3 * BLOCK);
    p.check().unwrap();
    p.resume(&token).unwrap();
    // Steps until nothing moves: every chunk above the boundary empties.
    loop {
        let token = p.pause(WAIT).unwrap();
        let done = p.compact_step(&token, &CompactionMode::Incremental { max_bytes: 8 * BLOCK }, None).unwrap();
        p.resume(&token).unwrap();
        if done.blocks == 0 {
            break;
        }
    }
    p.check().unwrap();
    // One free run but for the partly filled chunk at its start (196 blocks of 32 per chunk).
    let stats = p.stats();
    let mut chunks: Vec<usize> = p.blocks().unwrap().iter().map(|b| b.offset / chunk_size).collect();
    chunks.sort_unstable();
    chunks.dedup();
    assert_eq!(chunks, (0..7).collect::<Vec<_>>(), "the blocks fill the lowest chunks");
    assert_eq!(stats.bytes_free - stats.largest_free_block, chunk_size - 4 * BLOCK);
}

/// A block pinned while a step plans is one the step leaves where it is, and nothing else of
/// the step depends on its move: here a run slides down into the chunk that the block's move
/// empties, so a pin that arrived after the census and before the block was marked moving left
/// a batch whose run landed on a live block. A second thread pins and unpins the block without
/// pause while steps run; every step must succeed.
#[test]
fn a_block_pinned_while_a_step_plans_stays_and_no_move_depends_on_it() {
    const BLOCK: usize = 64 << 10;
    for round in 0..150 {
        let p = Pool::new(PoolConfig::new(12 * MIB).cores(1).placement(Placement::FirstFit)).unwrap();
        let chunk = p.config().chunk_size;
        let per_chunk = chunk / BLOCK;
        // Chunks 0-2 filled with blocks, then a run of two chunks (chunks 3 and 4).
        let blocks: Vec<Handle> = (0..3 * per_chunk).map(|_| p.alloc(BLOCK, None, 0).unwrap()).collect();
        let run = p.alloc(2 * chunk, None, 0).unwrap();
        assert_eq!(p.block(run).unwrap().offset, 3 * chunk, "round {round}: the run follows the blocks");
        fill(&p, run, 1);
        // Chunk 0 keeps a hole of one block, chunk 1 one block (the one pinned), chunk 2 none.
        p.free(blocks[0]).unwrap();
        for &h in &blocks[per_chunk + 1..] {
            p.free(h).unwrap();
        }
        let pinned = blocks[per_chunk];
        fill(&p, pinned, 2);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Pinned and unpinned for about as long as a step plans.
                let hold = |micros: u64| {
                    let until = std::time::Instant::now() + Duration::from_micros(micros);
                    while std::time::Instant::now() < until {
                        std::hint::spin_loop();
                    }
                };
                let mut r = Rng(round + 1);
                while !stop.load(Ordering::Relaxed) {
                    p.pin(pinned).unwrap();
                    hold(r.next() % 40);
                    p.unpin(pinned).unwrap();
                    hold(r.next() % 40);
                }
            });
            let steps: Vec<_> = (0..4)
                .map(|_| {
                    let token = p.pause(WAIT).unwrap();
                    let step = p.compact_step(&token, &CompactionMode::Incremental { max_bytes: 4 * chunk }, None);
                    p.resume(&token).unwrap();
                    step.map_err(|e| e.to_string()).and_then(|_| p.check().map_err(|e| format!("check: {e}")))
                })
                .collect();
            stop.store(true, Ordering::Relaxed);
            for step in steps {
                step.unwrap_or_else(|e| panic!("round {round}: {e}"));
            }
        });
        verify(&p, run, 1);
        verify(&p, pinned, 2);
    }
}

/// The highest chunk holds blocks and one all-free slab (its core's current slab for the
/// class: a free does not retire it). The planners count the slab's room free, so a step that
/// moves the blocks out empties the chunk, and the chunk must go back, in every mode.
#[test]
fn a_chunk_left_with_an_all_free_slab_goes_back_after_a_step() {
    const BLOCK: usize = 64 << 10;
    let modes = [
        CompactionMode::Incremental { max_bytes: 8 * MIB },
        CompactionMode::Evacuate { chunks: vec![4] },
        CompactionMode::Full,
    ];
    for mode in modes {
        for staged in [false, true] {
            let p = pool(32 * MIB, 1);
            let chunk_size = p.config().chunk_size;
            let per_chunk = chunk_size / BLOCK;
            let full: Vec<Handle> = (0..4 * per_chunk).map(|_| p.alloc(BLOCK, None, 0).unwrap()).collect();
            let object = p.alloc(3000, None, 0).unwrap();
            assert_eq!(p.block(object).unwrap().offset / chunk_size, 4, "the slab opens chunk 4");
            let above: Vec<Handle> = (0..4).map(|_| p.alloc(BLOCK, None, 0).unwrap()).collect();
            assert!(above.iter().all(|&h| p.block(h).unwrap().offset / chunk_size == 4));
            p.free(object).unwrap();
            for &h in full.iter().step_by(2) {
                p.free(h).unwrap();
            }
            let before = p.stats().chunks_free;
            let done = if staged {
                p.compact(&mode, None, WAIT).unwrap()
            } else {
                let token = p.pause(WAIT).unwrap();
                let done = p.compact_step(&token, &mode, None).unwrap();
                p.resume(&token).unwrap();
                done
            };
            p.check().unwrap();
            let snapshot = p.snapshot().unwrap();
            let in_chunk_4 = |offset: usize| offset / chunk_size == 4;
            assert!(!p.blocks().unwrap().iter().any(|b| in_chunk_4(b.offset)), "{mode:?}: blocks stayed in chunk 4");
            assert!(
                !snapshot.slab_cached.iter().any(|e| in_chunk_4(e.offset)),
                "{mode:?} (staged: {staged}): the all-free slab kept chunk 4"
            );
            assert!(done.chunks_freed >= 1, "{mode:?} (staged: {staged}): {done:?}");
            assert!(p.stats().chunks_free > before, "{mode:?} (staged: {staged}): chunk 4 was not given back");
        }
    }
}

#[test]
fn incremental_steps_respect_their_budget_and_empty_chunks() {
    let p = pool(64 * MIB, 2);
    let kept = fragment(&p, &[3000, 20_000, 60_000, 130_000], 40);
    let before = p.stats();
    let budget = 2 * MIB;
    let mut freed = 0;
    for _ in 0..20 {
        let token = p.pause(WAIT).unwrap();
        let done = p.compact_step(&token, &CompactionMode::Incremental { max_bytes: budget }, None).unwrap();
        p.resume(&token).unwrap();
        assert!(done.bytes <= budget, "a step moved {} bytes", done.bytes);
        freed += done.chunks_freed;
        if done.blocks == 0 {
            break;
        }
    }
    p.check().unwrap();
    let after = p.stats();
    assert!(freed > 0, "no chunk was emptied");
    assert!(after.chunks_free > before.chunks_free);
    for &(h, id) in &kept {
        verify(&p, h, id);
    }
}

#[test]
fn evacuating_named_chunks_gives_them_back() {
    let p = pool(64 * MIB, 1);
    let kept = fragment(&p, &[3000, 40_000, 200, 100_000], 30);
    let chunk = p.block(kept[0].0).unwrap().offset / (2 * MIB);
    let token = p.pause(WAIT).unwrap();
    p.compact_step(&token, &CompactionMode::Evacuate { chunks: vec![chunk] }, None).unwrap();
    p.resume(&token).unwrap();
    p.check().unwrap();
    assert!(p.blocks().unwrap().iter().all(|b| b.offset / (2 * MIB) != chunk), "chunk {chunk} still holds blocks");
    for &(h, id) in &kept {
        verify(&p, h, id);
    }
}

#[test]
fn compaction_under_load_loses_nothing() {
    let p = pool(96 * MIB, 2);
    let stop = AtomicBool::new(false);
    let steps = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..2usize {
            let (p, stop) = (&p, &stop);
            s.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                let mut held: Vec<(Handle, usize)> = Vec::new();
                let mut id = t << 40;
                while !stop.load(Ordering::Relaxed) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if held.len() < 300 && rng % 3 != 0 {
                        let size = [100, 900, 5000, 30_000, 200_000, 3 * MIB][(rng >> 20) as usize % 6];
                        if let Ok(h) = p.alloc(size, None, 0) {
                            id += 1;
                            fill(p, h, id);
                            held.push((h, id));
                        }
                    } else if !held.is_empty() {
                        let (h, i) = held.swap_remove((rng >> 24) as usize % held.len());
                        verify(p, h, i);
                        p.free(h).unwrap();
                    }
                }
                for (h, i) in held {
                    verify(p, h, i);
                    p.free(h).unwrap();
                }
            });
        }
        s.spawn(|| {
            for k in 0..60 {
                let token = p.pause(WAIT).unwrap();
                let mode =
                    if k % 10 == 9 { CompactionMode::Full } else { CompactionMode::Incremental { max_bytes: MIB } };
                p.compact_step(&token, &mode, None).unwrap();
                if k % 15 == 0 {
                    p.check().unwrap();
                }
                p.resume(&token).unwrap();
                steps.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    assert_eq!(steps.load(Ordering::Relaxed), 60);
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// Random allocations, frees, pins and compactions of every mode on small pools, checked after
/// every compaction: the metadata stays consistent and every byte stays with its block.
#[test]
fn random_operations_and_compactions_stay_consistent() {
    let sizes = [100, 900, 5000, 30_000, 200_000, 700_000, 3 * MIB];
    for seed in 0..6u64 {
        let p = pool(32 * MIB, 2);
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut held: Vec<(Handle, usize, bool)> = Vec::new();
        let mut id = 0;
        for step in 0..150 {
            for _ in 0..1 + next() % 20 {
                if held.len() < 120 && next() % 10 < 6 {
                    if let Ok(h) = p.alloc(sizes[next() as usize % sizes.len()], None, 0) {
                        id += 1;
                        fill(&p, h, id);
                        let pinned = next() % 10 == 0;
                        if pinned {
                            p.pin(h).unwrap();
                        }
                        held.push((h, id, pinned));
                    }
                } else if !held.is_empty() {
                    let (h, i, pinned) = held.swap_remove(next() as usize % held.len());
                    verify(&p, h, i);
                    if pinned {
                        p.unpin(h).unwrap();
                    }
                    p.free(h).unwrap();
                }
            }
            let mode = match next() % 4 {
                0 => CompactionMode::Full,
                1 => {
                    let chunk = held.first().map_or(0, |&(h, _, _)| p.block(h).unwrap().offset / (2 * MIB));
                    CompactionMode::Evacuate { chunks: vec![chunk] }
                }
                _ => CompactionMode::Incremental { max_bytes: (1 + next() as usize % 4) * MIB },
            };
            let pinned_at: Vec<(Handle, usize)> =
                held.iter().filter(|x| x.2).map(|&(h, _, _)| (h, p.block(h).unwrap().offset)).collect();
            let token = p.pause(WAIT).unwrap();
            let result = p.compact_step(&token, &mode, None);
            p.resume(&token).unwrap();
            match (&mode, result) {
                (_, Ok(_)) => {}
                // Naming a chunk with pinned blocks (or one too full to empty) is refused.
                (CompactionMode::Evacuate { .. }, Err(Error::InvalidMove { .. })) => {}
                (_, Err(e)) => panic!("seed {seed} step {step} {mode:?}: {e}"),
            }
            p.check().unwrap_or_else(|e| panic!("seed {seed} step {step} {mode:?}: {e}"));
            for (h, at) in pinned_at {
                assert_eq!(p.block(h).unwrap().offset, at, "a pinned block moved");
            }
        }
        for (h, i, pinned) in held {
            verify(&p, h, i);
            if pinned {
                p.unpin(h).unwrap();
            }
            p.free(h).unwrap();
        }
        p.check().unwrap();
    }
}

/// Random configurations (chunks of 1 or 2 MiB, a short last chunk or none, one to three
/// cores, both placements, tails on and off, a core reserve or none, pools that grow): three
/// threads allocate (64 B to 2.5 chunks, some aligned), fill, verify and free while a fourth
/// compacts in every mode, staged (`compact`, or staged and run a moment later, when the
/// workers changed the pool) or in held pauses (`compact_step`), evacuating random chunks too
/// (a refused evacuation moves nothing), and trims now and then. No block loses a byte, and the
/// pool checks clean.
#[test]
fn compaction_under_load_loses_nothing_in_random_configurations() {
    for seed in 0..8u64 {
        let mut rng = Rng(0x7777_0000 + seed * 1_000_003);
        let chunk = [MIB, 2 * MIB][(rng.next() % 2) as usize];
        let chunks = [6usize, 12, 24][(rng.next() % 3) as usize];
        let short = if rng.next() % 3 == 0 { chunk / 2 } else { 0 };
        let cores = 1 + (rng.next() % 3) as usize;
        let placement = if rng.next() % 2 == 0 { Placement::BestFit } else { Placement::FirstFit };
        let tails = rng.next() % 4 != 0;
        let reserve = (rng.next() % 2) as usize;
        // Odd seeds: a pool that grows (its capacity whole chunks) up to three times its start.
        let grows = seed % 2 == 1;
        let short = if grows { 0 } else { short };
        let config = PoolConfig::new(chunks * chunk + short)
            .cores(cores)
            .chunk_size(chunk)
            .placement(placement)
            .run_tails(tails)
            .core_reserve(reserve);
        let config = if grows { config.growth(3 * chunks * chunk, Some(chunk)) } else { config };
        let what = format!(
            "seed {seed}: chunks of {chunk} B, {chunks} and {short} B, {cores} cores, {placement:?}, tails {tails}, reserve {reserve}, grows {grows}"
        );
        let p = Pool::new(config).unwrap();
        let stop = AtomicBool::new(false);
        let all_chunks = (chunks * chunk + short).div_ceil(chunk);
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let (p, stop, what) = (&p, &stop, &what);
                s.spawn(move || {
                    let mut rng = Rng(seed * 31 + t * 7 + 1);
                    let mut held: Vec<(Handle, usize)> = Vec::new();
                    let mut id = (t as usize) << 40;
                    while !stop.load(Ordering::Relaxed) {
                        if held.len() < 200 && rng.next() % 3 != 0 {
                            let size = rng.size(64, chunk * 5 / 2);
                            let align = [Some(4096), Some(65_536)].get((rng.next() % 8) as usize).copied().flatten();
                            match p.alloc(size, align, 0) {
                                Ok(h) => {
                                    id += 1;
                                    fill(p, h, id);
                                    held.push((h, id));
                                }
                                Err(Error::OutOfMemory { .. } | Error::TooLarge { .. }) => {}
                                Err(e) => panic!("{what}: {e}"),
                            }
                        } else if !held.is_empty() {
                            let (h, i) = held.swap_remove((rng.next() as usize) % held.len());
                            verify(p, h, i);
                            p.free(h).unwrap();
                        }
                    }
                    for (h, i) in held {
                        verify(p, h, i);
                        p.free(h).unwrap();
                    }
                });
            }
            s.spawn(|| {
                let mut rng = Rng(seed + 99);
                for k in 0..60 {
                    let mode = match rng.next() % 4 {
                        0 => CompactionMode::Full,
                        1 => CompactionMode::Incremental { max_bytes: chunk },
                        2 => CompactionMode::Evacuate { chunks: vec![(rng.next() as usize) % all_chunks] },
                        _ => CompactionMode::Incremental { max_bytes: 4 * chunk },
                    };
                    if rng.next() % 5 == 0 {
                        // A stir: refused (nothing given back) when the wait for another
                        // thread's pause gives up, as an allocation would be.
                        let _ = p.trim();
                    }
                    let done = match rng.next() % 3 {
                        0 => p.compact(&mode, None, WAIT).map(|_| ()),
                        // Staged, then run after the workers changed the pool: moves whose block
                        // or destination changed are left out.
                        1 => p.stage_compaction(&mode, false).and_then(|staged| {
                            std::thread::sleep(Duration::from_millis(1));
                            let token = p.pause(WAIT).unwrap();
                            let done = p.run_staged(&token, staged, None).map(|_| ());
                            p.check().unwrap_or_else(|e| panic!("{what}, step {k}, staged: {e}"));
                            p.resume(&token).unwrap();
                            done
                        }),
                        _ => {
                            let token = p.pause(WAIT).unwrap();
                            let done = p.compact_step(&token, &mode, None).map(|_| ());
                            if k % 8 == 0 {
                                p.check().unwrap_or_else(|e| panic!("{what}, step {k}: {e}"));
                            }
                            p.resume(&token).unwrap();
                            done
                        }
                    };
                    match done {
                        Ok(()) | Err(Error::InvalidMove { .. }) => {}
                        Err(e) => panic!("{what}, step {k}, {mode:?}: {e}"),
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                stop.store(true, Ordering::Relaxed);
            });
        });
        p.check().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(p.stats().bytes_in_use, 0, "{what}");
    }
}

/// Free a random half of `made` (drawn from `rng`); returns the other half.
fn free_a_random_half(p: &Pool, rng: &mut Rng, mut made: Vec<Handle>) -> Vec<Handle> {
    for i in (1..made.len()).rev() {
        made.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let kept = made.split_off(made.len() / 2);
    for h in made {
        p.free(h).unwrap();
    }
    kept
}

/// The full plan predicts what a full compaction leaves: the largest free block that
/// `stats()` reads after it, in random pools of 1-4 MiB chunks with a few blocks pinned (those
/// stay, so the free space stays cut in places that only the free stretches and the chunk ends
/// joined across a boundary hold, not a power-of-two node or a run of free chunks).
#[test]
fn the_full_plan_predicts_the_largest_free_block_a_full_compaction_leaves() {
    for seed in 1..=60u64 {
        let mut rng = Rng(seed * 0x9E37_79B9_7F4A_7C15);
        let chunk = [MIB, 2 * MIB, 4 * MIB][(rng.next() % 3) as usize];
        let capacity = [16 * MIB, 32 * MIB][(rng.next() % 2) as usize];
        let p = Pool::new(PoolConfig::new(capacity).chunk_size(chunk).cores(1)).unwrap();
        let mut made = Vec::new();
        for _ in 0..300 {
            match p.alloc(rng.size(64, 2 * MIB), None, 0) {
                Ok(h) => made.push(h),
                Err(_) => break,
            }
        }
        let kept = free_a_random_half(&p, &mut rng, made);
        for &h in &kept {
            if rng.next() % 20 == 0 {
                p.pin(h).unwrap();
            }
        }
        let plan = p.plan_compaction(None, &CompactionMode::Full).unwrap();
        p.compact(&CompactionMode::Full, None, WAIT).unwrap();
        assert_eq!(p.stats().bytes_free, plan.bytes_free_after, "seed {seed}: the plan predicts the free bytes");
        assert_eq!(
            p.stats().largest_free_block,
            plan.largest_free_after,
            "seed {seed} ({} MiB chunks, {} MiB): the plan predicts the compaction",
            chunk / MIB,
            capacity / MIB
        );
        assert_eq!(p.check().unwrap(), kept.len());
    }
}

/// A full compaction of a pool whose slabs are mostly empty packs their objects and gives the
/// emptied slabs back: the plan's free bytes afterwards count them, as `stats()` then does.
#[test]
fn the_full_plan_predicts_the_free_bytes_that_packed_slabs_give_back() {
    let p = pool(16 * MIB, 1);
    let mut rng = Rng(11);
    let mut small: Vec<Handle> = (0..10_000).map(|i| p.alloc([64, 256, 1024, 2048][i % 4], None, 0).unwrap()).collect();
    let big: Vec<Handle> = (0..6).map(|_| p.alloc(MIB, None, 0).unwrap()).collect();
    for i in (1..small.len()).rev() {
        small.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    for h in small.drain(..9_000) {
        p.free(h).unwrap();
    }
    for &h in big.iter().step_by(2) {
        p.free(h).unwrap();
    }
    p.pin(big[3]).unwrap();
    let before = p.stats();
    let plan = p.plan_compaction(None, &CompactionMode::Full).unwrap();
    p.compact(&CompactionMode::Full, None, WAIT).unwrap();
    let after = p.stats();
    assert!(after.bytes_free > before.bytes_free, "the compaction gave slabs back");
    assert_eq!((plan.bytes_free, plan.bytes_free_after), (before.bytes_free, after.bytes_free));
    assert_eq!(plan.largest_free_after, after.largest_free_block);
    assert_eq!(p.check().unwrap(), small.len() + 3);
}

/// An incremental step does what its plan says: the largest free block after it is the one the
/// plan predicts, and never smaller than before (a step that would leave less moves nothing),
/// in random pools of 1-2 MiB chunks, sizes of every kind and budgets of 256 KiB to 64 MiB.
#[test]
fn an_incremental_plan_predicts_its_step_and_no_step_leaves_less_room() {
    for seed in 1..=80u64 {
        let mut rng = Rng(seed * 0x2545_F491_4F6C_DD1D);
        let chunk = [MIB, 2 * MIB][(rng.next() % 2) as usize];
        let capacity = [8 * MIB, 16 * MIB, 32 * MIB][(rng.next() % 3) as usize];
        let budget = [256 << 10, MIB, 4 * MIB, 64 * MIB][(rng.next() % 4) as usize];
        let p = Pool::new(PoolConfig::new(capacity).chunk_size(chunk).cores(1)).unwrap();
        let mut made = Vec::new();
        while p.stats().bytes_in_use <= capacity * 4 / 5 {
            match p.alloc(rng.size(64, 3 * MIB), None, 0) {
                Ok(h) => made.push(h),
                Err(_) => break,
            }
        }
        let kept = free_a_random_half(&p, &mut rng, made);
        let mode = CompactionMode::Incremental { max_bytes: budget };
        for step in 0..4 {
            let before = p.stats().largest_free_block;
            let plan = p.plan_compaction(None, &mode).unwrap();
            let token = p.pause(WAIT).unwrap();
            let done = p.compact_step(&token, &mode, None).unwrap();
            p.resume(&token).unwrap();
            let after = p.stats().largest_free_block;
            assert_eq!(done.blocks, plan.blocks, "seed {seed}, step {step}: the step makes the plan's moves");
            if plan.blocks > 0 {
                assert_eq!(after, plan.largest_free_after, "seed {seed}, step {step}: the plan predicts the step");
            }
            assert!(after >= before, "seed {seed}, step {step}: {before} -> {after}");
            if done.blocks == 0 {
                break;
            }
        }
        assert_eq!(p.check().unwrap(), kept.len());
    }
}

/// A plan counts what its step gives back, and the step counts what the pool shows: the
/// plan's `chunks_emptied`, the step's `chunks_freed` and the change in `stats().chunks_free`
/// are one number, and the free bytes and largest free block the plan predicts are those
/// `stats()` reads after the step. In random pools (1-3 cores, growing or not, slab objects to
/// chunk runs, 30-90% of the blocks freed), for full, incremental and evacuating steps; a
/// staged compaction's `chunks_freed` matches the pool too.
#[test]
fn a_plan_counts_the_chunks_and_bytes_its_step_gives_back() {
    for seed in 1..=60u64 {
        let mut rng = Rng(seed * 0x9E37_79B9_7F4A_7C15);
        let capacity = [16 * MIB, 32 * MIB][(rng.next() % 2) as usize];
        let cores = 1 + (rng.next() % 3) as usize;
        let mut config = PoolConfig::new(capacity).cores(cores).backing(Backing::None);
        if rng.next() % 2 == 0 {
            config = PoolConfig::new(capacity / 4).cores(cores).backing(Backing::None).growth(capacity, None);
        }
        let p = Pool::new(config).unwrap();
        let hi = [4096, MIB, 8 * MIB][(rng.next() % 3) as usize];
        let mut made = Vec::new();
        while let Ok(h) = p.alloc(rng.size(64, hi), None, 0) {
            made.push(h);
        }
        for i in (1..made.len()).rev() {
            made.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let freed = made.len() * (3 + 2 * (rng.next() % 4) as usize) / 10;
        for h in made.drain(..freed) {
            p.free(h).unwrap();
        }
        let mode = match rng.next() % 3 {
            0 => CompactionMode::Full,
            1 => CompactionMode::Incremental { max_bytes: [MIB, 4 * MIB][(rng.next() % 2) as usize] },
            _ => {
                // Chunks that hold only core blocks can be evacuated; take up to two of them.
                let chunk_size = p.config().chunk_size;
                let mut core_chunks: Vec<usize> =
                    p.blocks().unwrap().iter().filter(|b| b.size < chunk_size).map(|b| b.offset / chunk_size).collect();
                core_chunks.sort_unstable();
                core_chunks.dedup();
                let runs: Vec<usize> = p
                    .blocks()
                    .unwrap()
                    .iter()
                    .filter(|b| b.size >= chunk_size)
                    .map(|b| b.offset / chunk_size)
                    .collect();
                core_chunks.retain(|c| !runs.iter().any(|r| r.abs_diff(*c) <= 1 + capacity / chunk_size));
                let n = core_chunks.len().min(2);
                CompactionMode::Evacuate { chunks: core_chunks[..n].to_vec() }
            }
        };
        let token = p.pause(WAIT).unwrap();
        // Chunks whose blocks do not fit elsewhere cannot be evacuated: then a full step.
        let (mode, plan) = match p.plan_compaction(Some(&token), &mode) {
            Err(Error::InvalidMove { .. }) => {
                (CompactionMode::Full, p.plan_compaction(Some(&token), &CompactionMode::Full))
            }
            planned => (mode, planned),
        };
        let plan = plan.unwrap();
        let what = format!("seed {seed}, {cores} cores, {mode:?}");
        let before = p.stats().chunks_free;
        let done = p.compact_step(&token, &mode, None).unwrap();
        let after = p.stats();
        p.resume(&token).unwrap();
        assert_eq!(done.chunks_freed, after.chunks_free.saturating_sub(before), "{what}: the step's count");
        assert_eq!(plan.chunks_emptied, done.chunks_freed, "{what}: the plan's count");
        if plan.blocks > 0 {
            assert_eq!(plan.bytes_free_after, after.bytes_free, "{what}: free bytes");
            assert_eq!(plan.largest_free_after, after.largest_free_block, "{what}: largest free block");
        }
        // A staged compaction of what is left counts the same way.
        for h in made.drain(..made.len() / 3) {
            p.free(h).unwrap();
        }
        let staged = p.stage_compaction(&CompactionMode::Incremental { max_bytes: 2 * MIB }, false).unwrap();
        let token = p.pause(WAIT).unwrap();
        let before = p.stats().chunks_free;
        let done = p.run_staged(&token, staged, None).unwrap();
        let after = p.stats().chunks_free;
        p.resume(&token).unwrap();
        assert_eq!(done.chunks_freed, after.saturating_sub(before), "{what}: the staged step's count");
        assert_eq!(p.check().unwrap(), made.len(), "{what}");
    }
}

/// A thread that asks for a block (or pins it) while a mover moves it waits as an allocation
/// waits for the pause the move runs under: at most the pause's timeout, then
/// `PausedTooLong`, however long the mover takes.
#[test]
fn another_thread_waits_for_a_moving_block_no_longer_than_the_pause() {
    use std::sync::{mpsc, Arc};
    let p = Arc::new(Pool::new(PoolConfig::new(16 * MIB).cores(1)).unwrap());
    let pad = p.alloc(4 * MIB, None, 0).unwrap();
    let h = p.alloc(40_000, None, 0).unwrap();
    p.free(pad).unwrap();
    let start = p.block(h).unwrap().offset;
    let token = p.pause(Duration::from_millis(200)).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut mover = |_: &[Transfer]| -> std::result::Result<(), String> {
        let (p, tx) = (p.clone(), tx.clone());
        std::thread::spawn(move || tx.send((p.block(h).map(|b| b.offset), p.pin(h))).unwrap());
        // The mover waits for that thread far longer than the pause's timeout: it would wait
        // to the end were the thread's calls to wait for the move.
        let Ok((read, pinned)) = rx.recv_timeout(Duration::from_secs(10)) else {
            return Err("the other thread was still waiting for the move".to_string());
        };
        assert!(matches!(read, Err(Error::PausedTooLong { .. })), "{read:?}");
        assert!(matches!(pinned, Err(Error::PausedTooLong { .. })), "{pinned:?}");
        Ok(())
    };
    let done = p.compact_step(&token, &CompactionMode::Full, Some(&mut mover)).unwrap();
    p.resume(&token).unwrap();
    assert_eq!(done.blocks, 1);
    let moved = p.block(h).unwrap();
    assert_ne!(moved.offset, start);
    assert_eq!(moved.pins, 0, "the refused pin left none");
    p.check().unwrap();
}

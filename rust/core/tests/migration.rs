//! A thread may move to another CPU between any two calls, and its core pool moves with it: its
//! blocks then come from the chunks and slabs of several cores. Every operation must stay
//! correct, and a compaction must still give back every chunk it empties. The tests move their
//! own thread between the CPUs it may run on (on a machine with one CPU they run without moves
//! and check the same things).

mod common;

use common::moves::Mover;
use common::{byte, fill, pool, verify, Rng, MIB, WAIT};
use npumem_core::{CompactionMode, Handle, Pool};
use std::collections::BTreeSet;

/// Chunks that hold a byte of a live block (slab objects count by their own offset).
fn chunks_with_blocks(p: &Pool) -> BTreeSet<usize> {
    let chunk_size = p.config().chunk_size;
    p.blocks().unwrap().iter().flat_map(|b| b.offset / chunk_size..=(b.offset + b.size - 1) / chunk_size).collect()
}

/// A pool of two cores fragmented by a moving thread (blocks of every kind below a chunk,
/// every other one freed), then compacted step by step: every step gives back the chunks it
/// empties, so afterwards every chunk cores hold has a live block, and the blocks kept their
/// bytes.
#[test]
fn steps_give_back_every_chunk_they_empty_whatever_core_the_blocks_came_from() {
    let sizes = [64, 700, 3000, 20_000, 60_000, 130_000, 400_000];
    for seed in 0..24u64 {
        let p = pool(64 * MIB, 2);
        let mut mover = Mover::new(seed);
        let mut rng = Rng(seed * 7919 + 11);
        let mut all = Vec::new();
        for id in 0..400 {
            mover.maybe_move();
            let size = sizes[(rng.next() % sizes.len() as u64) as usize];
            if let Ok(h) = p.alloc(size, None, 0) {
                all.push((h, id));
            }
        }
        let mut kept: Vec<(Handle, usize)> = Vec::new();
        for (i, (h, id)) in all.into_iter().enumerate() {
            mover.maybe_move();
            if i % 2 == 0 {
                p.free(h).unwrap();
            } else {
                fill(&p, h, id);
                kept.push((h, id));
            }
        }
        let mode = CompactionMode::Incremental { max_bytes: 2 * MIB };
        for _ in 0..64 {
            mover.maybe_move();
            let token = p.pause(WAIT).unwrap();
            let done = p.compact_step(&token, &mode, None).unwrap();
            p.resume(&token).unwrap();
            if done.blocks == 0 {
                break;
            }
        }
        p.check().unwrap();
        let stats = p.stats();
        let held = stats.chunks_in_cores + stats.chunks_in_runs;
        let used = chunks_with_blocks(&p);
        assert_eq!(held, used.len(), "seed {seed}: cores hold {held} chunks, {} with blocks: {used:?}", used.len());
        for &(h, id) in &kept {
            verify(&p, h, id);
        }
    }
}

/// Blocks allocated, written and freed by a thread that moves between CPUs: no two live blocks
/// overlap, every block keeps its bytes, and the pool checks clean with every block freed.
#[test]
fn a_moving_thread_never_gets_overlapping_or_corrupted_blocks() {
    let p = pool(32 * MIB, 2);
    let mut mover = Mover::new(99);
    let mut rng = Rng(12345);
    let mut live: Vec<(Handle, usize)> = Vec::new();
    for id in 0..6000 {
        mover.maybe_move();
        if live.len() > 300 || (!live.is_empty() && rng.next() % 3 == 0) {
            let (h, id) = live.swap_remove((rng.next() % live.len() as u64) as usize);
            verify(&p, h, id);
            p.free(h).unwrap();
        } else if let Ok(h) = p.alloc(rng.size(16, 600_000), None, 0) {
            let n = p.block(h).unwrap().size;
            p.write(h, 0, &(0..n).map(|i| byte(id, i)).collect::<Vec<u8>>()).unwrap();
            live.push((h, id));
        }
    }
    let mut extents: Vec<(usize, usize)> =
        live.iter().map(|&(h, _)| p.block(h).unwrap()).map(|b| (b.offset, b.size)).collect();
    extents.sort_unstable();
    for pair in extents.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "blocks overlap: {pair:?}");
    }
    for (h, id) in live {
        verify(&p, h, id);
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().blocks_in_use, 0);
}

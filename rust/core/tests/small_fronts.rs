//! Blocks of at most half a chunk with a front (`arena/front.rs`): the free end of one core
//! chunk and the free start of the next. They are placed, freed and refused like the larger
//! blocks with a front: checked against a model of units, misused without effect, and never
//! placed without `run_tails`.

mod common;

use common::Rng;
use npumem_core::{Backing, CompactionMode, Error, Handle, Pool, PoolConfig};
use std::time::Duration;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const CHUNK: usize = 2 * MIB;
const UNIT: usize = 256;

/// Whether the block `[offset, +size)` starts inside a chunk and its requested bytes go on past
/// that chunk's end.
fn has_front(offset: usize, size: usize) -> bool {
    offset % CHUNK != 0 && offset % CHUNK + size > CHUNK
}

/// One flag per unit of the arena: which units live blocks hold.
struct Units(Vec<bool>);

impl Units {
    /// Mark the units of `[offset, offset + len)` held (`on`) or free; each must be the other.
    fn set(&mut self, offset: usize, len: usize, on: bool) {
        assert_eq!(offset % UNIT, 0, "a block starts on a unit: {offset}");
        for u in offset / UNIT..(offset + len).div_ceil(UNIT) {
            assert_eq!(self.0[u], !on, "[{offset}, +{len}): unit {u} already {on}");
            self.0[u] = on;
        }
    }
}

fn pattern(size: usize, seed: usize) -> Vec<u8> {
    (0..size).map(|j| (j.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8).collect()
}

/// Random sizes of 4 KiB-1 MiB on two cores with host memory, filled until an allocation
/// fails, three in four freed, filled again and so on, in several pools, against a model of
/// units: every block lies inside the arena, holds at least its request, overlaps no other
/// block (those across a chunk boundary included) and keeps its bytes; one with a front
/// reserves its request rounded up to a unit; many blocks take a front; each pool checks clean
/// after every step and its snapshot tiles the arena, and every block frees to an empty pool
/// whose chunks all join again.
#[test]
fn small_blocks_with_a_front_against_a_unit_model() {
    let capacity = 24 * MIB;
    let (mut fronted, mut placed) = (0usize, 0usize);
    for seed in 0..10u64 {
        let p = Pool::new(PoolConfig::new(capacity).cores(2).core_reserve(0)).unwrap();
        let mut model = Units(vec![false; capacity / UNIT]);
        let mut rng = Rng(77 + seed * 1000);
        let mut held: Vec<(Handle, usize, usize, usize)> = Vec::new(); // handle, offset, size, seed
        let give_back = |p: &Pool, model: &mut Units, (h, offset, size, seed): (Handle, usize, usize, usize)| {
            let mut back = vec![0u8; size];
            p.read(h, 0, &mut back).unwrap();
            assert!(back == pattern(size, seed), "the block at {offset} lost its bytes");
            let bytes = p.block(h).unwrap().block_bytes;
            p.free(h).unwrap();
            model.set(offset, bytes, false);
        };
        for _round in 0..3 {
            loop {
                let size = rng.size(4 * KIB, MIB);
                let Ok(h) = p.alloc(size, None, 0) else { break };
                let b = p.block(h).unwrap();
                assert!(b.offset + b.block_bytes <= capacity && b.block_bytes >= size, "{b:?} for {size}");
                assert_eq!(b.offset % 4096, 0, "a block past a bank starts on a bank boundary");
                model.set(b.offset, b.block_bytes, true);
                if has_front(b.offset, size) {
                    fronted += 1;
                    assert_eq!(b.block_bytes, size.next_multiple_of(UNIT), "a block with a front of {size} bytes");
                }
                p.write(h, 0, &pattern(size, placed)).unwrap();
                held.push((h, b.offset, size, placed));
                placed += 1;
            }
            p.check().unwrap();
            // The snapshot accounts for every unit: blocks, free runs and slabs tile the arena.
            let snap = p.snapshot().unwrap();
            assert!(snap.untracked.is_empty(), "{:?}", snap.untracked);
            let blocks: usize = snap.blocks.iter().map(|b| b.block_bytes).sum();
            let free: usize = snap.free_runs.iter().chain(&snap.slab_cached).map(|e| e.len).sum();
            assert_eq!(blocks + free, capacity, "the snapshot tiles the arena");
            for _ in 0..held.len() * 3 / 4 {
                let i = rng.next() as usize % held.len();
                give_back(&p, &mut model, held.swap_remove(i));
            }
            p.check().unwrap();
        }
        for block in held.drain(..) {
            give_back(&p, &mut model, block);
        }
        p.check().unwrap();
        let stats = p.stats();
        assert_eq!(stats.bytes_in_use, 0);
        assert_eq!(stats.largest_free_block, capacity, "every chunk went back and joined");
    }
    eprintln!("{placed} blocks placed, {fronted} with a front");
    assert!(fronted >= 20, "only {fronted} of {placed} blocks took a front");
}

/// A block of 640 KiB that the core's chunk cannot hold (three are in use back to back, 47% of
/// the arena, 128 KiB left at the chunk's end) takes the free end of that chunk and a tail at
/// the start of the next. A free of another
/// size that also crosses the chunk's end, one from inside the block, and a second free are
/// refused with a typed error and change nothing.
#[test]
fn a_small_block_with_a_front_refuses_a_wrong_free() {
    let p = Pool::new(PoolConfig::new(4 * MIB).cores(1).backing(Backing::None)).unwrap();
    let size = 640 * KIB;
    let packed: Vec<usize> = (0..3).map(|_| p.alloc_raw(size, None).unwrap()).collect();
    assert_eq!(packed, [0, size, 2 * size], "back to back in a free stretch");
    let fourth = p.alloc_raw(size, None).unwrap();
    assert!(has_front(fourth, size), "the fourth crosses the end of chunk 0: at {fourth}");
    assert_eq!(fourth, 3 * size);
    let before = p.stats();
    let crossing = CHUNK - fourth;
    for wrong in [size + UNIT, size + 64 * KIB, crossing + 4 * KIB, size + CHUNK] {
        match p.free_raw(fourth, wrong) {
            Err(Error::InvalidBlock { .. }) => {}
            other => panic!("a free of {wrong} bytes for {size}: {other:?}"),
        }
    }
    for inside in [fourth + 4096, fourth + crossing - 4096, CHUNK, CHUNK + 4096] {
        match p.free_raw(inside, size) {
            Err(Error::InvalidBlock { .. }) => {}
            other => panic!("a free from inside at {inside}: {other:?}"),
        }
    }
    let after = p.stats();
    assert_eq!((after.bytes_in_use, after.bytes_free), (before.bytes_in_use, before.bytes_free));
    p.check().unwrap();
    p.free_raw(fourth, size).unwrap();
    assert!(matches!(p.free_raw(fourth, size), Err(Error::InvalidBlock { .. })), "a second free");
    for offset in packed {
        p.free_raw(offset, size).unwrap();
    }
    p.check().unwrap();
    let stats = p.stats();
    assert_eq!(stats.bytes_in_use, 0);
    assert_eq!(stats.largest_free_block, 4 * MIB);
}

/// Without `run_tails`, no block of any size has a front.
#[test]
fn without_run_tails_no_small_block_has_a_front() {
    let p = Pool::new(PoolConfig::new(32 * MIB).cores(1).backing(Backing::None).run_tails(false)).unwrap();
    let mut rng = Rng(5);
    let mut placed = 0;
    loop {
        let size = rng.size(4 * KIB, MIB);
        let Ok(offset) = p.alloc_raw(size, None) else { break };
        assert!(!has_front(offset, size), "{size} bytes at {offset} cross the end of their chunk");
        placed += 1;
    }
    assert!(placed > 50);
    p.check().unwrap();
}

/// Blocks of at most half a chunk with a front keep their bytes and their reserved size in a
/// compaction: an evacuation of the chunk that holds a front and of the chunk that holds a
/// tail is refused with a typed error and leaves the block where it is (as for larger blocks
/// with a front), a full compaction
/// moves it only to another place with a front, and the pool checks clean after each, with
/// every kept block's bytes, `block_bytes` and the bytes in use unchanged.
#[test]
fn small_blocks_with_a_front_move_with_their_bytes() {
    let p = Pool::new(PoolConfig::new(32 * MIB).cores(1)).unwrap();
    let mut rng = Rng(404);
    let mut live: Vec<(Handle, usize, usize)> = Vec::new(); // handle, size, seed
    for seed in 0..400 {
        let size = rng.size(64 * KIB, MIB);
        let Ok(h) = p.alloc(size, None, 0) else { break };
        p.write(h, 0, &pattern(size, seed)).unwrap();
        live.push((h, size, seed));
    }
    let fronted = |p: &Pool, live: &[(Handle, usize, usize)]| {
        live.iter().filter(|(h, size, _)| has_front(p.block(*h).unwrap().offset, *size)).count()
    };
    assert!(fronted(&p, &live) >= 4, "{} blocks with a front", fronted(&p, &live));
    // Free every other block: holes to compact into.
    let mut kept = Vec::new();
    for (i, block) in live.into_iter().enumerate() {
        if i % 2 == 0 {
            p.free(block.0).unwrap();
        } else {
            kept.push(block);
        }
    }
    let verify = |p: &Pool, kept: &[(Handle, usize, usize)]| {
        for &(h, size, seed) in kept {
            let mut back = vec![0u8; size];
            p.read(h, 0, &mut back).unwrap();
            assert!(back == pattern(size, seed), "a kept block lost its bytes");
        }
    };
    // Evacuate the chunks of one block with a front: its front's and its tail's.
    {
        let &(h, size, _) = kept
            .iter()
            .find(|(h, size, _)| has_front(p.block(*h).unwrap().offset, *size))
            .expect("a kept block with a front");
        let offset = p.block(h).unwrap().offset;
        let chunks = vec![offset / CHUNK, (offset + size - 1) / CHUNK];
        let token = p.pause(Duration::from_secs(5)).unwrap();
        let done = p.compact_step(&token, &CompactionMode::Evacuate { chunks: chunks.clone() }, None);
        p.resume(&token).unwrap();
        let err = format!("{:?}", done.expect_err("an evacuation of a chunk that holds a front or a tail"));
        assert!(err.contains("InvalidMove"), "{err}");
        p.check().unwrap();
        assert_eq!(p.block(h).unwrap().offset, offset, "an evacuation moved a block with a front");
        verify(&p, &kept);
    }
    let before = p.stats();
    let reserved: Vec<usize> = kept.iter().map(|(h, _, _)| p.block(*h).unwrap().block_bytes).collect();
    let token = p.pause(Duration::from_secs(5)).unwrap();
    let done = p.compact_step(&token, &CompactionMode::Full, None);
    p.resume(&token).unwrap();
    done.unwrap();
    p.check().unwrap();
    verify(&p, &kept);
    let after = p.stats();
    assert!(after.largest_free_block >= before.largest_free_block, "{before:?} -> {after:?}");
    assert_eq!(after.bytes_in_use, before.bytes_in_use, "a compaction changed the bytes in use");
    for ((h, _, _), bytes) in kept.iter().zip(reserved) {
        assert_eq!(p.block(*h).unwrap().block_bytes, bytes, "a compaction changed a block's reserved bytes");
    }
    for (h, _, _) in kept {
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// The last 888 KiB of chunk 0 are free from a bank boundary, and the first 48 KiB of chunk 1.
/// A request of 873.5 KiB fits that free end in bytes, but its buddy layout (its request
/// rounded up to a class) does not; starting at the first bank boundary from which it crosses
/// the chunk's end (1176 KiB), it ends in chunk 1 as a block with a front and a 1.5 KiB tail:
/// what `stats()` counts when it names the largest free block (the free end and the free start
/// joined).
#[test]
fn a_block_whose_class_overruns_a_free_end_starts_later_and_takes_a_front() {
    let p = Pool::new(PoolConfig::new(2 * CHUNK).cores(1).slab_sizes(Vec::new())).unwrap();
    let at = |h: Handle| p.block(h).unwrap().offset;
    let a = [p.alloc(MIB, None, 0).unwrap(), p.alloc(MIB, None, 0).unwrap()];
    let b: Vec<Handle> =
        [32, 16, 16, 64, 128, 256, 512, 1024].iter().map(|&k| p.alloc(k * KIB, None, 0).unwrap()).collect();
    let layout: Vec<usize> = a.iter().chain(&b).map(|&h| at(h)).collect();
    assert_eq!(
        layout,
        [
            0,
            MIB,
            CHUNK,
            CHUNK + 32 * KIB,
            CHUNK + 48 * KIB,
            CHUNK + 64 * KIB,
            CHUNK + 128 * KIB,
            CHUNK + 256 * KIB,
            CHUNK + 512 * KIB,
            CHUNK + MIB
        ],
        "both chunks filled in address order"
    );
    p.free(a[1]).unwrap();
    let head = [p.alloc(128 * KIB, None, 0).unwrap(), p.alloc(8 * KIB, None, 0).unwrap()];
    assert_eq!([at(head[0]), at(head[1])], [MIB, MIB + 128 * KIB], "chunk 0 free from 1160 KiB on");
    p.free(b[0]).unwrap();
    p.free(b[1]).unwrap();
    let s = p.stats();
    assert_eq!(s.largest_free_block, 936 * KIB, "the free end and the free start joined: {s:?}");
    let size = 894_464; // 873.5 KiB
    let h = p.alloc(size, None, 0).unwrap();
    let info = p.block(h).unwrap();
    assert!(has_front(info.offset, size), "{info:?}");
    assert_eq!(info.offset, 1176 * KIB, "the first bank boundary from which it crosses the chunk's end");
    assert_eq!(info.block_bytes, size);
    p.check().unwrap();
    p.free(h).unwrap();
    p.check().unwrap();
}

/// Chunk 0 is free from 16 KiB on, and chunk 1's first 64 KiB are free: the largest free block
/// is those two joined, 2,096 KiB from a bank boundary. A request of 7,994 units (more than a
/// chunk's tree holds trimmed, 7,936 units: a run of one chunk) fits chunk 0's free end in
/// bytes, but no chunk is free for a run; starting at the first bank boundary from which it
/// crosses chunk 0's end (52 KiB), it is a block with a front and a 2.5 KiB tail in chunk 1.
/// The blocks freed before it wait in the caches of freed blocks, so the first try finds the
/// free end taken and the failing path's drain gives it back.
#[test]
fn a_block_of_nearly_a_chunk_takes_a_front_in_a_free_end_when_no_chunk_is_free() {
    let p = Pool::new(PoolConfig::new(2 * CHUNK).cores(1).slab_sizes(Vec::new())).unwrap();
    let at = |h: Handle| p.block(h).unwrap().offset;
    let kib = |sizes: &[usize]| sizes.iter().map(|&k| k * KIB).collect::<Vec<_>>();
    let (first_sizes, second_sizes) =
        (kib(&[16, 16, 32, 64, 128, 256, 512, 1024]), kib(&[64, 64, 128, 256, 512, 1024]));
    let first: Vec<Handle> = first_sizes.iter().map(|&n| p.alloc(n, None, 0).unwrap()).collect();
    let second: Vec<Handle> = second_sizes.iter().map(|&n| p.alloc(n, None, 0).unwrap()).collect();
    let starts = |c: usize, sizes: &[usize]| {
        sizes.iter().scan(c * CHUNK, |next, &n| Some(std::mem::replace(next, *next + n))).collect::<Vec<_>>()
    };
    assert_eq!(first.iter().map(|&h| at(h)).collect::<Vec<_>>(), starts(0, &first_sizes), "chunk 0 in address order");
    assert_eq!(second.iter().map(|&h| at(h)).collect::<Vec<_>>(), starts(1, &second_sizes), "chunk 1 in address order");
    for &h in &first[1..] {
        p.free(h).unwrap();
    }
    p.free(second[0]).unwrap();
    let s = p.stats();
    assert_eq!(s.largest_free_block, 2096 * KIB, "the free end and the free start joined: {s:?}");
    let size = 7_994 * UNIT;
    let h = p.alloc(size, None, 0).unwrap();
    let info = p.block(h).unwrap();
    assert!(has_front(info.offset, size), "{info:?}");
    assert_eq!(info.offset, 52 * KIB, "the first bank boundary from which it crosses the chunk's end");
    assert_eq!(info.block_bytes, size);
    p.check().unwrap();
    p.free(h).unwrap();
    p.check().unwrap();
    for h in [first[0]].into_iter().chain(second[1..].iter().copied()) {
        p.free(h).unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().bytes_in_use, 0);
}

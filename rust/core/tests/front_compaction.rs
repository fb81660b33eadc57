//! A full compaction of a pool whose blocks took fronts (`arena/front.rs`: a block larger than
//! a bank that starts in the free end of one core chunk and ends in a tail at the start of the
//! next) packs it as tightly as a pool without them: a 64 MiB pool on one core, filled through
//! `Pool::alloc` with random sizes of 1-100 KiB until the first failure, every other block
//! freed, compacted fully. No packing can free more whole chunks than the live bytes and the
//! bank slack (the rest of the last bank of every block larger than a bank and at most half a
//! chunk) leave; the compaction frees that many on most seeds and at most one fewer on any.
//! Every kept byte, every block's `block_bytes`, the bytes in use and `check()` are checked;
//! the plan predicts the largest free block the compaction leaves.
#![cfg(not(loom))]

mod common;

use common::{byte, MIB, WAIT};
use npumem_core::{Backing, CompactionMode, Handle, Pool, PoolConfig, Transfer};

/// A seeded generator (splitmix64): one sequence of sizes per seed.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// The bytes of a pool: the pool's own (host memory) or a mirror the mover copies in
/// (`Backing::None`, as a device's memory).
enum Bytes {
    Host,
    Mirror(Vec<u8>),
}

impl Bytes {
    fn fill(&mut self, p: &Pool, h: Handle, id: usize) {
        let b = p.block(h).unwrap();
        let pattern: Vec<u8> = (0..b.size).map(|i| byte(id, i)).collect();
        match self {
            Bytes::Host => p.write(h, 0, &pattern).unwrap(),
            Bytes::Mirror(m) => m[b.offset..b.offset + b.size].copy_from_slice(&pattern),
        }
    }

    fn intact(&self, p: &Pool, h: Handle, id: usize) -> bool {
        let b = p.block(h).unwrap();
        let mut out = vec![0u8; b.size];
        match self {
            Bytes::Host => p.read(h, 0, &mut out).unwrap(),
            Bytes::Mirror(m) => out.copy_from_slice(&m[b.offset..b.offset + b.size]),
        }
        out.iter().enumerate().all(|(i, &v)| v == byte(id, i))
    }
}

/// What one compacted pool leaves.
struct Left {
    /// Whole chunks the largest free block falls short of the most that any packing frees:
    /// the chunks beyond those that the live block bytes and the bank slack fill.
    lost: usize,
    /// Live blocks with a front before the compaction.
    fronted: usize,
}

/// Whether a live block has a front: it starts inside a chunk and its bytes cross the chunk's end.
fn has_front(offset: usize, size: usize, chunk: usize) -> bool {
    offset % chunk != 0 && offset % chunk + size > chunk
}

/// The scenario for `seed` on a pool with `backing` (with `Backing::None` a mover copies the
/// bytes in a host mirror, as a device mover would), every invariant checked; what it leaves.
fn odd_sizes_compacted(seed: u64, backing: Backing) -> Left {
    let capacity = 64 * MIB;
    let device = backing == Backing::None;
    let p = Pool::new(PoolConfig::new(capacity).cores(1).backing(backing)).unwrap();
    let mut bytes = if device { Bytes::Mirror(vec![0u8; capacity]) } else { Bytes::Host };
    let mut draw = Draw(seed);
    let mut made = Vec::new();
    while let Ok(h) = p.alloc(draw.between(1024, 100 * 1024), None, 0) {
        made.push(h);
    }
    let mut kept = Vec::new();
    for (i, h) in made.into_iter().enumerate() {
        if i % 2 == 0 {
            p.free(h).unwrap();
        } else {
            bytes.fill(&p, h, i);
            kept.push((h, i));
        }
    }
    let (chunk, bank) = (p.config().chunk_size, p.config().bank_size);
    let before = p.stats();
    assert!(before.external_fragmentation > 0.9, "seed {seed}: {}", before.external_fragmentation);
    let blocks_before = p.blocks().unwrap();
    let fronted = blocks_before.iter().filter(|b| has_front(b.offset, b.size, chunk)).count();

    let plan = p.plan_compaction_with(None, &CompactionMode::Full, device).unwrap();
    let mut mirror = |wave: &[Transfer]| {
        if let Bytes::Mirror(m) = &mut bytes {
            for t in wave {
                m.copy_within(t.src..t.src + t.len, t.dst);
            }
        }
        Ok(())
    };
    let mover: Option<npumem_core::Mover<'_>> = if device { Some(&mut mirror) } else { None };
    let done = p.compact(&CompactionMode::Full, mover, WAIT).unwrap();
    assert_eq!(done.stale, 0, "seed {seed}: nothing changed between planning and the pause");

    let after = p.stats();
    assert_eq!(p.check().unwrap(), kept.len(), "seed {seed}");
    assert_eq!(after.bytes_in_use, before.bytes_in_use, "seed {seed}: a compaction keeps the bytes in use");
    assert_eq!(after.largest_free_block, plan.largest_free_after, "seed {seed}: the plan predicts the compaction");
    let mut blocks_after = p.blocks().unwrap();
    blocks_after.sort_by_key(|b| b.handle.to_bits());
    let mut sorted_before = blocks_before;
    sorted_before.sort_by_key(|b| b.handle.to_bits());
    for (a, b) in sorted_before.iter().zip(&blocks_after) {
        assert_eq!((a.handle, a.size, a.block_bytes), (b.handle, b.size, b.block_bytes), "seed {seed}");
    }
    for &(h, id) in &kept {
        assert!(bytes.intact(&p, h, id), "seed {seed}: block {id} lost its bytes");
    }
    let slack: usize = blocks_after
        .iter()
        .filter(|b| bank < b.block_bytes && b.block_bytes <= chunk / 2)
        .map(|b| b.block_bytes.next_multiple_of(bank) - b.block_bytes)
        .sum();
    // The live bytes and the slack fill at least this many chunks; a packing frees the rest.
    let filled = (capacity - after.bytes_free + slack).div_ceil(chunk);
    let most = (capacity / chunk - filled) * chunk;
    Left { lost: most.saturating_sub(after.largest_free_block).div_ceil(chunk), fronted }
}

/// Of the compactions that `lost` counts (one per seed), each frees at most one whole chunk
/// less than the most any packing frees, and at most `short` fall short at all.
fn at_most_one_chunk_short(lost: &[usize], short: usize) {
    assert!(lost.iter().all(|&l| l <= 1), "chunks lost per seed: {lost:?}");
    let fell_short = lost.iter().filter(|&&l| l > 0).count();
    assert!(fell_short <= short, "{fell_short} seeds fell a chunk short: {lost:?}");
}

/// Over 40 seeds on a device pool (a mover, so a slide), at most a quarter fall a chunk short
/// (measured: 6; 9 with free stretches first in a tight arena only from 1/32 of a chunk). The free bytes outside the largest free block are no measure of the packing
/// here: they hold the partly filled last chunk, whose share follows the live bytes, and so
/// how far the fill went (`tests/test_compaction_integrity.py` bounds them for blocks placed
/// through the binding, which mostly take no front).
#[test]
fn full_compaction_packs_blocks_with_fronts_over_many_seeds() {
    let mut lost = Vec::new();
    let mut fronted = 0;
    for seed in 0..40 {
        let left = odd_sizes_compacted(seed, Backing::None);
        fronted += left.fronted;
        lost.push(left.lost);
    }
    assert!(fronted >= 100, "the scenario gives many blocks a front: {fronted}");
    eprintln!("chunks short of the most any packing frees: {lost:?}");
    at_most_one_chunk_short(&lost, 10);
}

/// The same on host memory (the pool copies, slab consolidation first, a repack rather than a
/// slide), over fewer seeds.
#[test]
fn full_compaction_packs_blocks_with_fronts_on_host_memory() {
    let lost: Vec<usize> = (0..10).map(|seed| odd_sizes_compacted(seed, Backing::Host).lost).collect();
    eprintln!("host memory, chunks short of the most any packing frees: {lost:?}");
    at_most_one_chunk_short(&lost, 2);
}

//! A failing allocation in a nearly full, fragmented pool: it leaves the pool as it was and
//! answers with the typed out-of-memory error: the bytes free as the statistics count them, and
//! a largest free block short of the request.

use npumem_core::{Backing, Error, Pool, PoolConfig, PoolStats};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A small xorshift generator: the test is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A size from `lo` to `hi` bytes, uniform on a log scale.
    fn size(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let x = a + (b - a) * (self.next() % 1_000_000) as f64 / 1_000_000.0;
        (x.exp() as usize).clamp(lo, hi)
    }
}

/// The figures a failed allocation must not change.
fn held(s: &PoolStats) -> (usize, usize, usize, usize, u64, u64) {
    (s.bytes_in_use, s.bytes_free, s.requested_bytes_in_use, s.largest_free_block, s.blocks_in_use, s.alloc_count)
}

#[test]
fn a_failing_allocation_leaves_a_fragmented_pool_unchanged() {
    let capacity = 64 * MIB;
    let p = Pool::new(PoolConfig::new(capacity).cores(2).backing(Backing::None)).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    let mut live = 0;
    // Churn at about 92% of the capacity requested: random frees and allocations fragment it.
    for _ in 0..20_000 {
        if live > capacity * 92 / 100 || (live > capacity * 85 / 100 && rng.next() % 2 == 0) {
            let i = (rng.next() % blocks.len() as u64) as usize;
            let (offset, size) = blocks.swap_remove(i);
            p.free_raw(offset, size).unwrap();
            live -= size;
        }
        let size = rng.size(4 * KIB, MIB);
        if let Ok(offset) = p.alloc_raw(size, None) {
            blocks.push((offset, size));
            live += size;
        }
    }
    // A request a little larger than the largest free block fails.
    let before = p.stats();
    let request = before.largest_free_block + before.largest_free_block / 8 + 64 * KIB;
    assert!(request < before.bytes_free, "the pool is fragmented: more is free than one block");
    match p.alloc_raw(request, None) {
        Err(Error::OutOfMemory { requested, bytes_free, largest_free_block, .. }) => {
            assert_eq!(requested, request);
            assert_eq!(bytes_free, before.bytes_free);
            // What the failed search found (a lower bound, in bounded work): not enough.
            assert!(largest_free_block < request);
        }
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
    let after = p.stats();
    assert_eq!(held(&after), held(&before));
    assert_eq!(after.failed_allocs, before.failed_allocs + 1);
    // Every block is still there, and the pool is whole again once they go.
    for (offset, size) in blocks {
        p.free_raw(offset, size).unwrap();
    }
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// A failing allocation reads the ends of two chunks that might together hold its block across
/// their boundary and records them; frees at those ends afterwards must be seen by the next
/// allocation, which finds the place across the boundary only through the records the frees
/// kept (a record that still said the free start was 0 would rule the pair out).
#[test]
fn frees_at_chunk_ends_after_a_failing_scan_make_room_across_the_boundary() {
    const BLOCK: usize = 256 * KIB;
    let p = Pool::new(PoolConfig::new(8 * MIB).cores(1).slab_sizes(Vec::new()).backing(Backing::None)).unwrap();
    // Four chunks of eight blocks each: the arena is full.
    let blocks: Vec<usize> = (0..32).map(|_| p.alloc_raw(BLOCK, None).unwrap()).collect();
    let at =
        |chunk: usize, block: usize| blocks.iter().copied().find(|&o| o == chunk * 2 * MIB + block * BLOCK).unwrap();
    // The end of chunk 0 (512 KiB) and the middle of chunk 1 (512 KiB) go free: 600 KiB fits
    // nowhere, not even across the boundary (chunk 1 starts with a block).
    for (chunk, block) in [(0, 6), (0, 7), (1, 3), (1, 4)] {
        p.free_raw(at(chunk, block), BLOCK).unwrap();
    }
    let request = 600 * KIB;
    assert!(matches!(p.alloc_raw(request, None), Err(Error::OutOfMemory { .. })));
    // Now the start of chunk 1 goes free too: the end of chunk 0 and the start of chunk 1 hold
    // 1 MiB together.
    for block in [0, 1] {
        p.free_raw(at(1, block), BLOCK).unwrap();
    }
    let offset = p.alloc_raw(request, None).expect("room across the boundary of chunks 0 and 1");
    assert_eq!(offset, 2 * MIB - 2 * BLOCK, "the block starts in the free end of chunk 0");
    p.free_raw(offset, request).unwrap();
    p.check().unwrap();
}

/// A slab object whose class has no slab with room needs a whole new slab: the failing path
/// reveals chunks with room for that slab, not for the object. Here (found by the stateful
/// test) the only room is the hidden rest of the chunk that a block with a front took its tail
/// from; revealing chunks with room for a 2 KiB object found three others first, none with a
/// free slab's worth, and the allocation failed with 60 KiB free in one stretch.
#[test]
fn a_slab_object_reveals_room_for_a_whole_slab() {
    let config = PoolConfig::new(7 * 65536).cores(1).chunk_size(65536).bank_size(4096).min_block(64).core_reserve(0);
    let p = Pool::new(config).unwrap();
    let steps: [(usize, Option<usize>); 22] = [
        (1, Some(1)),
        (1, None),
        (1, Some(4096)),
        (1, Some(4096)),
        (1, Some(4096)),
        (321, None),
        (385, None),
        (449, None),
        (12289, None),
        (513, Some(256)),
        (1, None),
        (1, None),
        (1, None),
        (129, None),
        (193, None),
        (257, None),
        (513, None),
        (1, Some(65536)),
        (258_049, None),
        (1, None),
        (65, None),
        (12289, None),
    ];
    for (size, align) in steps {
        p.alloc(size, align, 0).unwrap();
    }
    let largest = p.stats().largest_free_block;
    assert!(largest >= 60 * 1024, "the setting: {largest} bytes free in one stretch");
    p.alloc(2049, None, 0).expect("a 2 KiB object with 60 KiB free in one stretch");
    p.check().unwrap();
}

/// The rest of the chunk a run's tail starts is hidden from searches until nothing else has
/// room; an allocation that finds no room elsewhere then takes it. Here (chunks of 64 KiB,
/// banks of 8 KiB) the run's tail is one unit at the start of the last chunk, and slab objects
/// and blocks fill the first three chunks; a block of 4097 bytes fits the last chunk's rest.
#[test]
fn a_block_that_only_the_rest_of_a_tail_chunk_holds_goes_there() {
    let config =
        PoolConfig::new(8 * 64 * KIB).cores(1).chunk_size(64 * KIB).bank_size(8 * KIB).min_block(64).core_reserve(0);
    let p = Pool::new(config).unwrap();
    let sequence: [(usize, Option<usize>); 17] = [
        (641, None),
        (12289, None),
        (1, None),
        (385, None),
        (449, None),
        (705, None),
        (16385, None),
        (1, Some(4096)),
        (65, None),
        (257, None),
        (321, None),
        (513, None),
        (577, None),
        (129, None),
        (193, None),
        (40961, None),
        (262_145, None),
    ];
    for (size, align) in sequence {
        p.alloc(size, align, 0).unwrap();
    }
    let largest = p.stats().largest_free_block;
    assert!(largest >= 56 * KIB, "the rest of the last chunk: {largest}");
    p.alloc(4097, None, 0).unwrap_or_else(|e| panic!("{e} (largest free block {largest} B)"));
    p.check().unwrap();
}

/// A small object whose slab does not fit the only room left, the rest of a tail's chunk (one
/// bank), goes there on its own as a buddy block: the failing path reveals the rests that hold
/// the object, not only those that hold a whole slab of its class.
#[test]
fn a_small_object_that_only_the_rest_of_a_tail_chunk_holds_goes_there() {
    let config = PoolConfig::new(8 * 64 * KIB).cores(1).chunk_size(64 * KIB).core_reserve(0);
    let p = Pool::new(config).unwrap();
    // A run of one chunk and a tail of 60 KiB: the tail's chunk keeps one bank, hidden.
    let run = p.alloc(124 * KIB, None, 0).unwrap();
    assert_eq!(p.block(run).unwrap().block_bytes, 124 * KIB);
    while p.alloc(64 * KIB, None, 0).is_ok() {}
    let s = p.stats();
    assert_eq!((s.bytes_free, s.largest_free_block), (4 * KIB, 4 * KIB));
    let h = p.alloc(1000, None, 0).unwrap_or_else(|e| panic!("{e}"));
    assert!(p.block(h).unwrap().offset >= 124 * KIB && p.block(h).unwrap().offset < 128 * KIB);
    p.check().unwrap();
}

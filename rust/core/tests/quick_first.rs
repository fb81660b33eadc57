//! A caller that holds a lock such as the GIL makes the quick attempt of an allocation
//! (`Pool::try_alloc_fast`) and, when it gives up, the long part without the lock
//! (`Pool::alloc_quick_first`). Whether the quick attempt ran depends on timing (a pause shuts
//! it out); the long part starts with the quick attempt's steps, so a block lands in the same
//! place either way, and two runs of one program lay out, and fragment, the arena alike.

mod common;

use common::Rng;
use npumem_core::{Handle, Pool, PoolConfig};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The quick attempt, then the long part where it gave up: what the Python binding does.
fn quick_then_long(p: &Pool, size: usize, align: Option<usize>) -> Option<Handle> {
    match p.try_alloc_fast(size, align, 0) {
        Ok(Some(h)) => Some(h),
        Ok(None) => p.alloc_quick_first(size, align, 0).ok(),
        Err(err) => panic!("the quick attempt refused a valid request of {size} bytes: {err}"),
    }
}

fn offset(p: &Pool, h: Handle) -> usize {
    p.block(h).unwrap().offset
}

/// One random size of every kind the arena places differently: slab objects, buddy blocks of
/// at most a bank, blocks across chunk ends, blocks of more than half a chunk, runs of chunks,
/// now and then with an alignment.
fn draw(rng: &mut Rng) -> (usize, Option<usize>) {
    let size = match rng.next() % 8 {
        0 | 1 => rng.size(16, 4 * KIB),
        2..=4 => rng.size(4 * KIB, MIB),
        5 => rng.size(MIB, 2 * MIB),
        _ => rng.size(2 * MIB, 9 * MIB),
    };
    let align = match rng.next() % 16 {
        0 => Some(64 * KIB),
        1 => Some(4 * KIB),
        _ => None,
    };
    (size, align)
}

/// The same random churn (allocations until one fails or the arena is 3/4 full, then a random
/// half freed, again and again) on two pools of one core: one allocates through the quick
/// attempt and then the long part, the other through the long part only (as when a pause shut
/// the quick attempt out). Every block lands at the same offset
/// in both, and an allocation fails in one exactly when it fails in the other; the churn goes
/// through the arena's every mode (chunks to be had, blocks across chunk ends from 27% of the
/// capacity, free stretches first from 2/3, a tight arena).
#[test]
fn a_block_lands_in_the_same_place_whether_the_quick_attempt_ran_or_not() {
    let capacity = 96 * MIB;
    let (mut quick_allocs, mut failures) = (0usize, 0usize);
    for seed in 0..6u64 {
        let config = || PoolConfig::new(capacity).cores(1);
        let (a, b) = (Pool::new(config()).unwrap(), Pool::new(config()).unwrap());
        let mut rng = Rng(0x9E37_79B9 + seed * 7919);
        let mut held: Vec<(Handle, Handle, usize)> = Vec::new();
        for round in 0..40 {
            let mut in_use: usize = held.iter().map(|&(_, _, size)| size).sum();
            for _ in 0..400 {
                if in_use > capacity * 3 / 4 {
                    break;
                }
                let (size, align) = draw(&mut rng);
                let quick = quick_then_long(&a, size, align);
                let full = b.alloc_quick_first(size, align, 0).ok();
                match (quick, full) {
                    (Some(ha), Some(hb)) => {
                        assert_eq!(
                            offset(&a, ha),
                            offset(&b, hb),
                            "seed {seed}, round {round}: {size} bytes (align {align:?}) went elsewhere \
                             through the quick attempt"
                        );
                        held.push((ha, hb, size));
                        in_use += size;
                        quick_allocs += 1;
                    }
                    (None, None) => {
                        failures += 1;
                        break;
                    }
                    (q, f) => panic!(
                        "seed {seed}, round {round}: {size} bytes (align {align:?}): quick attempt \
                         first {:?}, long part only {:?}",
                        q.map(|h| offset(&a, h)),
                        f.map(|h| offset(&b, h))
                    ),
                }
            }
            let mut kept = Vec::with_capacity(held.len());
            for entry in held.drain(..) {
                if rng.next() % 2 == 0 {
                    a.free(entry.0).unwrap();
                    b.free(entry.1).unwrap();
                } else {
                    kept.push(entry);
                }
            }
            held = kept;
        }
        for (ha, hb, _) in held {
            a.free(ha).unwrap();
            b.free(hb).unwrap();
        }
        assert_eq!(a.check().unwrap(), b.check().unwrap());
    }
    assert!(quick_allocs > 5_000, "the churn placed {quick_allocs} blocks");
    assert!(failures > 0, "the churn never filled the arena");
}

/// In a tight arena a block of 1/64 of a chunk or more goes to the best-fitting free stretch
/// first. The quick attempt leaves it to the long part, which places it as `Pool::alloc` does,
/// even where a free node of its size would serve it at once; a smaller block larger than a
/// bank still takes the quick attempt.
#[test]
fn a_block_that_goes_to_a_free_stretch_first_is_left_to_the_long_part() {
    let config = || PoolConfig::new(8 * MIB).cores(1).slab_sizes(Vec::new());
    let (quick, full) = (Pool::new(config()).unwrap(), Pool::new(config()).unwrap());
    let mut blocks = Vec::new();
    // Full of 64 KiB blocks: the last allocation finds no chunk to be granted (a tight arena).
    while let (Ok(a), Ok(b)) = (quick.alloc(64 * KIB, None, 0), full.alloc(64 * KIB, None, 0)) {
        assert_eq!(offset(&quick, a), offset(&full, b));
        blocks.push((a, b));
    }
    for &(a, b) in [blocks[5], blocks[70]].iter() {
        quick.free(a).unwrap();
        full.free(b).unwrap();
    }
    let size = 40 * KIB;
    assert_eq!(quick.try_alloc_fast(size, None, 0).unwrap(), None, "left to the long part");
    let (a, b) = (quick.alloc_quick_first(size, None, 0).unwrap(), full.alloc(size, None, 0).unwrap());
    assert_eq!(offset(&quick, a), offset(&full, b), "placed as Pool::alloc places it");
    let small = quick.try_alloc_fast(8 * KIB, None, 0).unwrap();
    assert!(small.is_some(), "a block below the threshold takes the quick attempt");
    quick.check().unwrap();
    full.check().unwrap();
}

/// A block of more than half a chunk that goes to a free stretch first (here once 2/3 of the
/// capacity is in use, with chunks still free) is left to the long part too: the quick attempt
/// must not take a whole chunk for it, the fallback for a block that no chunk's tree can hold.
/// Through either path it reserves at most 1/16 more than it asks for, at the offset where
/// `Pool::alloc` puts it.
#[test]
fn a_block_of_more_than_half_a_chunk_that_goes_to_a_stretch_first_takes_no_whole_chunk() {
    let config = || PoolConfig::new(64 * MIB).cores(1).slab_sizes(Vec::new());
    let (quick, full) = (Pool::new(config()).unwrap(), Pool::new(config()).unwrap());
    while quick.stats().bytes_in_use < 44 * MIB {
        let (a, b) = (quick.alloc(512 * KIB, None, 0).unwrap(), full.alloc(512 * KIB, None, 0).unwrap());
        assert_eq!(offset(&quick, a), offset(&full, b));
    }
    assert!(quick.stats().chunks_free > 0, "chunks are still to be had");
    let size = MIB + 1;
    let h = quick_then_long(&quick, size, None).expect("room");
    let reserved = quick.block(h).unwrap().block_bytes;
    assert!(reserved <= size + size / 16, "{size} B reserve {reserved} B");
    let b = full.alloc(size, None, 0).unwrap();
    assert_eq!(offset(&quick, h), offset(&full, b), "placed as Pool::alloc places it");
    quick.check().unwrap();
    full.check().unwrap();
}

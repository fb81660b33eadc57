//! The default slab size classes through the public API: what a small request reserves at every
//! size and alignment (the waste sweep), and how full an arena of small blocks gets before the
//! first allocation fails (the fill bound).
#![cfg(not(loom))]

use npumem_core::{Backing, Pool, PoolConfig};

const BANK: usize = 4096;

/// A request of `n` bytes aligned to `align` reserves at most `n * 9 / 8` bytes, or `n` rounded
/// up to `align` when that is more (no placement can do better: two objects of a class cannot
/// start closer than the alignment). Every size from 1 byte to a bank, at every alignment up to
/// a bank, so every size next to a class boundary too.
#[test]
fn waste_below_a_bank_is_at_most_an_eighth_of_the_request() {
    let p = Pool::new(PoolConfig::new(64 << 20).backing(Backing::None)).unwrap();
    let mut worst = (1.0f64, 0usize, 0usize);
    let mut align = 1;
    while align <= BANK {
        for n in 1..=BANK {
            let h = p.alloc(n, Some(align), 0).unwrap();
            let info = p.block(h).unwrap();
            let rounded = n.next_multiple_of(align);
            let reserved = info.block_bytes;
            assert!(
                reserved * 8 <= n * 9 || reserved == rounded,
                "{n} bytes aligned to {align} reserve {reserved} (rounded up to the alignment: {rounded})"
            );
            assert!(reserved >= n);
            assert_eq!(info.offset % align, 0, "{n} bytes aligned to {align} at {}", info.offset);
            assert_eq!(info.offset / BANK, (info.offset + n - 1) / BANK, "{n} bytes straddle a bank");
            let ratio = reserved as f64 / rounded as f64;
            if ratio > worst.0 {
                worst = (ratio, n, align);
            }
            p.free(h).unwrap();
        }
        align *= 2;
    }
    eprintln!(
        "worst reserved / max(requested, rounded to alignment): {:.4} at {} B aligned to {}",
        worst.0, worst.1, worst.2
    );
    assert!(worst.0 <= 1.125);
    assert_eq!(p.check().unwrap(), 0);
    assert_eq!(p.stats().bytes_in_use, 0);
}

/// The classes keep objects apart: every object of a burst of each size, held at once, is
/// distinct, inside its bank and aligned; `check()` agrees.
#[test]
fn bursts_of_every_default_class_hold_the_rules() {
    let p = Pool::new(PoolConfig::new(64 << 20).backing(Backing::None)).unwrap();
    let mut previous = 0;
    for &size in &PoolConfig::default_slab_sizes() {
        for n in [previous + 1, size] {
            let blocks: Vec<_> = (0..70).map(|_| p.alloc(n, Some(1), 0).unwrap()).collect();
            let mut extents: Vec<(usize, usize)> = blocks
                .iter()
                .map(|&h| {
                    let info = p.block(h).unwrap();
                    assert_eq!(info.block_bytes, size, "{n} bytes take the {size}-byte class");
                    assert_eq!(info.offset % (1 << size.trailing_zeros()), 0);
                    assert_eq!(info.offset / BANK, (info.offset + size - 1) / BANK);
                    (info.offset, info.offset + size)
                })
                .collect();
            extents.sort_unstable();
            assert!(extents.windows(2).all(|w| w[0].1 <= w[1].0), "objects of {size} bytes overlap");
            assert_eq!(p.check().unwrap(), 70);
            for h in blocks {
                p.free(h).unwrap();
            }
        }
        previous = size;
    }
    p.trim().unwrap();
    assert_eq!(p.check().unwrap(), 0);
}

/// Fill a 1 GiB arena with random sizes in `lo..=hi` and no frees until the first allocation
/// fails: the requested bytes and the bytes in use then, as shares of the capacity.
fn fill(lo: usize, hi: usize, align: Option<usize>) -> (f64, f64) {
    let capacity = 1usize << 30;
    let p = Pool::new(PoolConfig::new(capacity).backing(Backing::None)).unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut requested = 0usize;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = lo + (x % (hi - lo + 1) as u64) as usize;
        if p.alloc_raw(n, align).is_err() {
            break;
        }
        requested += n;
    }
    let in_use = p.stats().bytes_in_use;
    assert!(in_use * 8 <= requested.next_multiple_of(64) * 9, "reserved {in_use} for {requested} requested");
    (requested as f64 / capacity as f64, in_use as f64 / capacity as f64)
}

/// Sizes whose classes pack banks well fill the arena to 92-95% of its capacity requested.
/// Classes above 512 bytes lose the end of each bank (a 2304-byte class fits once in a 4 KiB
/// bank), which bounds the 64 B - 4 KiB band near 77%: one class per slab cannot use those
/// ends, and the rest of the gap (the first failure at 95% requested) is not closed here.
#[test]
fn small_blocks_fill_the_arena() {
    let (tiny, _) = fill(1, 64, Some(1));
    let (small, _) = fill(8, 256, Some(8));
    let (band, in_use) = fill(64, 4096, None);
    eprintln!("first failure at requested/capacity: 1-64 B {tiny:.3}, 8-256 B {small:.3}, 64 B-4 KiB {band:.3} ({in_use:.3} in use)");
    assert!(tiny >= 0.93, "1-64 B: {tiny:.3}");
    assert!(small >= 0.92, "8-256 B: {small:.3}");
    assert!(band >= 0.76, "64 B-4 KiB: {band:.3}");
}

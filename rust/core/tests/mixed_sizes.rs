//! Mixed sizes: what a block of every size from 4 KiB up reserves (the waste sweep), how full an
//! arena gets before the first failure when filled with random sizes (the fill floors), and
//! placement staying correct through churn at high occupancy.

use npumem_core::{Backing, Pool, PoolConfig};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const CHUNK: usize = 2 * MIB;
const UNIT: usize = 256;

fn pool(capacity: usize) -> Pool {
    Pool::new(PoolConfig::new(capacity).cores(1).backing(Backing::None)).unwrap()
}

/// Every size on a log grid (16 steps per doubling) from 4 KiB to 64 MiB, and each size next
/// to a power of two, a chunk multiple and a trimming granule.
fn sweep_sizes() -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut x = 4.0 * KIB as f64;
    while x <= (64 * MIB) as f64 {
        sizes.push(x as usize);
        x *= 2f64.powf(1.0 / 16.0);
    }
    for shift in 12..=26 {
        let p = 1usize << shift;
        sizes.extend([p - 1, p, p + 1, p + p / 32 + 1, p + p / 16 + 1, p - p / 32 + 1]);
    }
    for k in 1..=32 {
        sizes.extend([k * CHUNK - 1, k * CHUNK, k * CHUNK + 1]);
    }
    sizes.retain(|&s| (4 * KIB..=64 * MIB).contains(&s));
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Whole chunks for blocks between one chunk and 16 chunks: up to a chunk less one byte over
/// (not yet carved as a run plus a tail).
fn in_the_run_gap(size: usize) -> bool {
    size > CHUNK && size < 16 * CHUNK
}

#[test]
fn waste_is_at_most_an_eighth_from_4_kib_up() {
    let p = pool(160 * MIB);
    let mut worst = (0.0f64, 0usize, 0usize);
    let mut worst_gap = (0.0f64, 0usize, 0usize);
    for size in sweep_sizes() {
        let h = p.alloc(size, None, 0).unwrap_or_else(|e| panic!("{size} bytes: {e}"));
        let reserved = p.block(h).unwrap().block_bytes;
        assert!(reserved >= size);
        let ratio = reserved as f64 / size as f64;
        if in_the_run_gap(size) {
            if ratio > worst_gap.0 {
                worst_gap = (ratio, size, reserved);
            }
        } else {
            // A trimmed buddy block is cut at 1/16 of its enclosing power of two, so it
            // reserves less than 1/8 more than asked (1/16 needs the finer 1/32 cut, which
            // leaves a full compaction's packing more holes than its bound allows). The unit
            // (256 B) is the rounding every block pays; the bank rule adds nothing here, a
            // block of a bank or more starting on a bank boundary.
            assert!(
                reserved <= size + size / 8 + UNIT,
                "{size} bytes reserve {reserved} (more than 1/8 over, plus a unit)"
            );
            if ratio > worst.0 {
                worst = (ratio, size, reserved);
            }
        }
        p.free(h).unwrap();
    }
    p.check().unwrap();
    eprintln!("worst waste from 4 KiB up: {:.4} ({} bytes reserve {})", worst.0, worst.1, worst.2);
    eprintln!("worst in runs of 2-16 chunks: {:.4} ({} bytes reserve {})", worst_gap.0, worst_gap.1, worst_gap.2);
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Log-uniform in `[lo, hi]`.
    fn size(&mut self, lo: usize, hi: usize) -> usize {
        let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((l + u * (h - l)).exp() as usize).clamp(lo, hi)
    }
}

/// The share of the arena requested when the first allocation fails, filling with random sizes
/// of `[lo, hi]` and never freeing.
fn fill(capacity: usize, lo: usize, hi: usize, seed: u64) -> f64 {
    let p = pool(capacity);
    let mut rng = Rng(seed);
    let mut requested = 0usize;
    loop {
        let size = rng.size(lo, hi);
        match p.alloc_raw(size, None) {
            Ok(_) => requested += size,
            Err(_) => break,
        }
    }
    p.check().unwrap();
    requested as f64 / capacity as f64
}

/// Floors on the fill per band (256 MiB, a few seeds each): what this build reaches, so that a
/// change that strands more of the arena fails here. The goals are higher (95% in every band,
/// 98% from 1 to 8 MiB): blocks start at their enclosing node until no such node is free
/// anywhere, and the tails then left are mostly shorter than the next request (a free stretch
/// serves a block only where it fits); runs are rounded to whole chunks above.
#[test]
fn fill_floors_per_band() {
    let bands: [(usize, usize, f64); 4] =
        [(4 * KIB, 64 * KIB, 0.83), (64 * KIB, MIB, 0.82), (MIB, 8 * MIB, 0.76), (64, 8 * MIB, 0.76)];
    for (lo, hi, floor) in bands {
        for seed in [1u64, 7, 12345] {
            let share = fill(256 * MIB, lo, hi, seed);
            eprintln!("fill {lo}-{hi} seed {seed}: {share:.4}");
            assert!(share >= floor, "{lo}-{hi} (seed {seed}): first failure at {share:.4} of the arena, below {floor}");
        }
    }
}

/// Churn at 85% with random sizes: every block placed is inside the arena and disjoint from
/// the others, every failure is an out-of-memory error, and the pool checks clean after.
#[test]
fn churn_at_85_percent_stays_consistent() {
    let capacity = 128 * MIB;
    let p = pool(capacity);
    let mut rng = Rng(99);
    let mut held: Vec<(usize, usize)> = Vec::new();
    let mut bytes = 0usize;
    while bytes < capacity * 85 / 100 {
        let size = rng.size(256, MIB);
        match p.alloc_raw(size, None) {
            Ok(o) => {
                held.push((o, size));
                bytes += size;
            }
            Err(_) => break,
        }
    }
    for _ in 0..40_000 {
        let i = rng.next() as usize % held.len();
        let (o, s) = held[i];
        p.free_raw(o, s).unwrap();
        let size = rng.size(256, MIB);
        match p.alloc_raw(size, None) {
            Ok(o) => held[i] = (o, size),
            Err(npumem_core::Error::OutOfMemory { .. }) => {
                held.swap_remove(i);
            }
            Err(e) => panic!("{e}"),
        }
    }
    let mut extents: Vec<(usize, usize)> = held.clone();
    extents.sort_unstable();
    for pair in extents.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{:?} overlaps {:?}", pair[0], pair[1]);
    }
    p.check().unwrap();
    for (o, s) in held {
        p.free_raw(o, s).unwrap();
    }
    assert_eq!(p.stats().bytes_in_use, 0);
}

//! What the integration tests share: pools, a byte pattern per block, a fragmented pool to
//! compact, a seeded generator of sizes, moves between CPUs (`moves.rs`) and an overlap oracle
//! (`occupancy.rs`).
#![allow(dead_code)] // each test file uses its own part

pub mod moves;
pub mod occupancy;

use npumem_core::{Handle, Pool, PoolConfig};
use std::time::Duration;

pub const MIB: usize = 1 << 20;
/// How long a test waits for a pause.
pub const WAIT: Duration = Duration::from_secs(5);
/// Block sizes of every kind: slab objects, buddy blocks, a chunk run.
pub const SIZES: [usize; 9] = [64, 200, 900, 3000, 5000, 20_000, 70_000, 300_000, 3 * MIB];

pub fn pool(capacity: usize, cores: usize) -> Pool {
    Pool::new(PoolConfig::new(capacity).cores(cores)).unwrap()
}

/// A byte pattern unique to block `id` at position `i`.
pub fn byte(id: usize, i: usize) -> u8 {
    (id.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 8)) as u8
}

/// Write block `id`'s pattern over all of `h`.
pub fn fill(p: &Pool, h: Handle, id: usize) {
    let n = p.block(h).unwrap().size;
    let bytes: Vec<u8> = (0..n).map(|i| byte(id, i)).collect();
    p.write(h, 0, &bytes).unwrap();
}

/// `h` holds block `id`'s pattern.
pub fn verify(p: &Pool, h: Handle, id: usize) {
    let n = p.block(h).unwrap().size;
    let mut out = vec![0u8; n];
    p.read(h, 0, &mut out).unwrap();
    for (i, &b) in out.iter().enumerate() {
        assert_eq!(b, byte(id, i), "block {id} byte {i} of {n}");
    }
}

/// Blocks of `sizes`, `rounds` times, every other one freed: a fragmented pool. Returns the
/// survivors, each filled with its pattern, with its id.
pub fn fragment(p: &Pool, sizes: &[usize], rounds: usize) -> Vec<(Handle, usize)> {
    let mut all = Vec::new();
    for r in 0..rounds {
        for (k, &s) in sizes.iter().enumerate() {
            if let Ok(h) = p.alloc(s, None, 0) {
                all.push((h, r * sizes.len() + k));
            }
        }
    }
    let mut kept = Vec::new();
    for (i, (h, id)) in all.into_iter().enumerate() {
        if i % 2 == 0 {
            p.free(h).unwrap();
        } else {
            fill(p, h, id);
            kept.push((h, id));
        }
    }
    kept
}

/// A small xorshift generator: a test draws the same sequence on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Log-uniform in `[lo, hi]`.
    pub fn size(&mut self, lo: usize, hi: usize) -> usize {
        let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((l + u * (h - l)).exp() as usize).clamp(lo, hi)
    }
}

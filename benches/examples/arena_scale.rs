//! How npumem's churn scales with the size of the arena: random sizes from 256 B to 1 MiB
//! (log-uniform, the workload of `mixed_sizes`), the arena filled to OCCUPANCY percent, then
//! STEPS steps of: free a random held block, allocate a new random size in its place (the old
//! size again when that fails). Prints ns per step and the failing allocations (how many,
//! median / 90th percentile / max latency). A step's time includes the harness (a random
//! size and a clock read), as for every capacity alike.
//!
//! `cargo run --release -p npumem-benches --example arena_scale [-- GIB [OCCUPANCY [STEPS]]]`
//! (GIB: the arena in GiB, 1 by default; OCCUPANCY: 1-95, 85 by default; STEPS: 300,000 by
//! default).
use std::time::Instant;

use npumem_benches::{cli, prefill, Allocator, NpumemRaw, Rng};
use npumem_core::{Backing, Pool, PoolConfig};

const LO: usize = 256;
const HI: usize = 1 << 20;

fn main() {
    const USAGE: &str = "arena_scale [GIB [OCCUPANCY [STEPS]]]";
    let args = cli::args();
    cli::at_most(USAGE, &args, 3);
    let gib = cli::positional(USAGE, &args, 0, "GIB", 1..=1024, 1);
    let occupancy = cli::positional(USAGE, &args, 1, "OCCUPANCY", 1..=95, 85) as f64 / 100.0;
    let steps = cli::positional(USAGE, &args, 2, "STEPS", 1..=usize::MAX, 300_000);
    let capacity = gib << 30;
    let config = PoolConfig::new(capacity).cores(2).backing(Backing::None);
    let pool = NpumemRaw(Pool::new(config).unwrap_or_else(|e| cli::fail(USAGE, format!("a pool of {gib} GiB: {e}"))));
    let mut rng = Rng::new(7);
    let mut held = prefill(&pool, &mut rng, capacity, occupancy, LO, HI);
    let mut failing = Vec::new();
    let start = Instant::now();
    for _ in 0..steps {
        if held.is_empty() {
            break;
        }
        let i = (rng.next_u64() as usize) % held.len();
        let (offset, size) = held[i];
        pool.free(offset, size);
        let size = rng.size(LO, HI);
        let t0 = Instant::now();
        match pool.alloc(size) {
            Some(offset) => held[i] = (offset, size),
            None => {
                failing.push(t0.elapsed().as_nanos() as f64 / 1e3);
                match pool.alloc(held[i].1) {
                    Some(offset) => held[i].0 = offset,
                    None => {
                        held.swap_remove(i);
                    }
                }
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / steps as f64;
    failing.sort_by(f64::total_cmp);
    let at = |q: usize| failing.get(failing.len() * q / 100).map_or("-".to_string(), |us| format!("{us:.1}"));
    let max = failing.last().map_or("-".to_string(), |us| format!("{us:.1}"));
    println!(
        "{gib} GiB at {:.0}%: {ns:.0} ns per step, {} failed (us: median {}, p90 {}, max {max})",
        occupancy * 100.0,
        failing.len(),
        at(50),
        at(90)
    );
}

//! Bursts: `N` rounds of 1000 allocations of `SIZE` bytes (aligned to `ALIGN`, the pool's
//! default when absent), then their 1000 frees (one thread, `backing="none"`). Usage:
//! `slab_burst [N] [SIZE] [ALIGN]`; for instruction counts run it under
//! `valgrind --tool=callgrind` at two values of `N` and take the difference.
use npumem_benches::cli;
use npumem_core::{Backing, Pool, PoolConfig};
use std::hint::black_box;
fn main() {
    let p = Pool::new(PoolConfig::new(256 << 20).cores(2).backing(Backing::None)).unwrap();
    const USAGE: &str = "slab_burst [BURSTS] [SIZE] [ALIGN]";
    let args = cli::args();
    cli::at_most(USAGE, &args, 3);
    let n = cli::positional(USAGE, &args, 0, "BURSTS", 1..=usize::MAX, 10_000);
    let size = cli::positional(USAGE, &args, 1, "SIZE", 1..=64 << 10, 4096);
    let align = args.get(2).map(|a| match cli::number(USAGE, "ALIGN", a, 1..=1 << 20) {
        a if a.is_power_of_two() => a,
        _ => cli::fail(USAGE, format!("ALIGN must be a power of two, got '{a}'")),
    });
    let mut live = Vec::with_capacity(1000);
    let t = std::time::Instant::now();
    for _ in 0..n {
        for _ in 0..1000 {
            live.push(p.alloc_raw(black_box(size), align).unwrap());
        }
        for o in live.drain(..) {
            p.free_raw(black_box(o), size).unwrap();
        }
    }
    println!("{:.1} ns/op", t.elapsed().as_nanos() as f64 / (2000 * n) as f64);
}

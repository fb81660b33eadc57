//! Bursts: `N` rounds of 1000 allocations of `SIZE` bytes (aligned to `ALIGN`, the pool's
//! default when absent), then their 1000 frees (one thread, `backing="none"`). Usage:
//! `slab_burst [N] [SIZE] [ALIGN]`; for instruction counts run it under
//! `valgrind --tool=callgrind` at two values of `N` and take the difference.
use npumem_core::{Backing, Pool, PoolConfig};
use std::hint::black_box;
fn main() {
    let p = Pool::new(PoolConfig::new(256 << 20).cores(2).backing(Backing::None)).unwrap();
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(10_000);
    let size: usize = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(4096);
    let align: Option<usize> = std::env::args().nth(3).map(|s| s.parse().unwrap());
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

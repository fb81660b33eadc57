use npumem_core::{Backing, Pool, PoolConfig};
use std::hint::black_box;
fn main() {
    let p = Pool::new(PoolConfig::new(256 << 20).cores(2).backing(Backing::None)).unwrap();
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(20_000_000);
    let size: usize = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(4096);
    let t = std::time::Instant::now();
    for _ in 0..n {
        let o = p.alloc_raw(black_box(size), None).unwrap();
        p.free_raw(black_box(o), size).unwrap();
    }
    println!("{:.1} ns/pair", t.elapsed().as_nanos() as f64 / n as f64);
}

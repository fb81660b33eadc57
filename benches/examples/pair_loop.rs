use npumem_benches::cli;
use npumem_core::{Backing, Pool, PoolConfig};
use std::hint::black_box;
fn main() {
    let p = Pool::new(PoolConfig::new(256 << 20).cores(2).backing(Backing::None)).unwrap();
    const USAGE: &str = "pair_loop [PAIRS] [SIZE]";
    let args = cli::args();
    cli::at_most(USAGE, &args, 2);
    let n = cli::positional(USAGE, &args, 0, "PAIRS", 1..=usize::MAX, 20_000_000);
    let size = cli::positional(USAGE, &args, 1, "SIZE", 1..=128 << 20, 4096);
    let t = std::time::Instant::now();
    for _ in 0..n {
        let o = p.alloc_raw(black_box(size), None).unwrap();
        p.free_raw(black_box(o), size).unwrap();
    }
    println!("{:.1} ns/pair", t.elapsed().as_nanos() as f64 / n as f64);
}

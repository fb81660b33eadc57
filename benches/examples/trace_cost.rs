//! The cost of one trace event on the alloc/free path, robust to a loaded machine: alloc/free
//! pairs through handles on two pools, one with the trace off and one with it on (rings never
//! drained, so every event overwrites an old one), timed in short batches taken in turn. A
//! batch that the scheduler interrupts reads long, so the low percentile of many batches is
//! what the code costs on a CPU of its own; the middle is printed too.
//!
//! `cargo run --release -p npumem-benches --example trace_cost [-- BATCHES]`
use std::hint::black_box;
use std::time::Instant;

use npumem_benches::cli;
use npumem_core::{Backing, Pool, PoolConfig};

const ARENA: usize = 256 << 20;
const PAIRS: usize = 200;

fn pool(trace: bool) -> Pool {
    let p = Pool::new(PoolConfig::new(ARENA).cores(2).backing(Backing::None)).expect("config");
    if trace {
        p.trace_start(1 << 16).expect("trace starts");
    }
    p
}

fn batch(p: &Pool, size: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..PAIRS {
        let h = p.alloc(black_box(size), None, 1).expect("room");
        p.free(black_box(h)).expect("valid free");
    }
    start.elapsed().as_nanos() as f64 / PAIRS as f64
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

fn main() {
    const USAGE: &str = "trace_cost [BATCHES]";
    let args = cli::args();
    cli::at_most(USAGE, &args, 1);
    let batches = cli::positional(USAGE, &args, 0, "BATCHES", 1..=usize::MAX, 20_000);
    println!("| size | off p10 | on p10 | per event p10 | off p50 | on p50 | per event p50 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for size in [256usize, 64 << 10] {
        let (off, on) = (pool(false), pool(true));
        for _ in 0..200 {
            batch(&off, size);
            batch(&on, size);
        }
        let (mut t_off, mut t_on) = (Vec::with_capacity(batches), Vec::with_capacity(batches));
        for _ in 0..batches {
            t_off.push(batch(&off, size));
            t_on.push(batch(&on, size));
        }
        let (off10, on10) = (quantile(&mut t_off, 0.1), quantile(&mut t_on, 0.1));
        let (off50, on50) = (quantile(&mut t_off, 0.5), quantile(&mut t_on, 0.5));
        println!(
            "| {size} | {off10:.1} | {on10:.1} | {:.1} | {off50:.1} | {on50:.1} | {:.1} |",
            (on10 - off10) / 2.0,
            (on50 - off50) / 2.0
        );
        assert!(on.trace_status().recorded > 0);
    }
}

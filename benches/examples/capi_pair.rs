//! Alloc/free pair cost through the C ABI against the Rust API, in the same run: rounds that
//! alternate between the four ways, the median of each.
//!
//! `cargo run --release -p npumem-benches --example capi_pair -- [pairs per round] [size] [way]`
//!
//! With a `way` (`rust`, `c`, `rust-raw`, `c-raw`) only that one runs: for counting its
//! instructions (`perf stat -e instructions`), which a busy machine does not disturb.

use std::hint::black_box;
use std::time::Instant;

use npumem::{
    npumem_alloc, npumem_alloc_raw, npumem_config_init, npumem_free, npumem_free_raw, npumem_pool_create,
    npumem_pool_release, NpumemBlock, NpumemConfig, BACKING_NONE,
};
use npumem_benches::cli;
use npumem_core::{Backing, Pool, PoolConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    const USAGE: &str = "capi_pair [PAIRS] [SIZE] [rust|c|rust-raw|c-raw]";
    const WAYS: [&str; 4] = ["rust", "c", "rust-raw", "c-raw"];
    let args = cli::args();
    cli::at_most(USAGE, &args, 3);
    let pairs = cli::positional(USAGE, &args, 0, "PAIRS", 1..=usize::MAX, 2_000_000);
    let size = cli::positional(USAGE, &args, 1, "SIZE", 1..=1 << 20, 256);
    let only = cli::choice(USAGE, &args, 2, "the way", &WAYS).map(|w| WAYS.iter().position(|&x| x == w).unwrap_or(0));
    let runs = |way: usize| only.is_none_or(|o| o == way);
    let rounds = 7;
    let pool = Pool::new(PoolConfig::new(256 << 20).cores(2).backing(Backing::None)).unwrap();
    let mut config = std::mem::MaybeUninit::<NpumemConfig>::uninit();
    let c_pool = unsafe {
        // SAFETY: the pointers are valid; the pool is released at the end.
        assert_eq!(npumem_config_init(config.as_mut_ptr(), 256 << 20), 0);
        let mut config = config.assume_init();
        config.cores = 2;
        config.backing = BACKING_NONE;
        let mut made = std::ptr::null_mut();
        assert_eq!(npumem_pool_create(&config, &mut made), 0);
        made
    };
    let mut times: [Vec<f64>; 4] = Default::default();
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..pairs * runs(0) as usize {
            let h = pool.alloc(black_box(size), None, 0).unwrap();
            pool.free(black_box(h)).unwrap();
        }
        times[0].push(t.elapsed().as_nanos() as f64 / pairs as f64);
        let t = Instant::now();
        let mut block = NpumemBlock::default();
        for _ in 0..pairs * runs(1) as usize {
            // SAFETY: a live pool and a local output.
            unsafe {
                assert_eq!(npumem_alloc(c_pool, black_box(size), 0, 0, &mut block), 0);
                assert_eq!(npumem_free(c_pool, black_box(block.handle)), 0);
            }
        }
        times[1].push(t.elapsed().as_nanos() as f64 / pairs as f64);
        let t = Instant::now();
        for _ in 0..pairs * runs(2) as usize {
            let o = pool.alloc_raw(black_box(size), None).unwrap();
            pool.free_raw(black_box(o), size).unwrap();
        }
        times[2].push(t.elapsed().as_nanos() as f64 / pairs as f64);
        let t = Instant::now();
        let (mut offset, mut address) = (0usize, 0u64);
        for _ in 0..pairs * runs(3) as usize {
            // SAFETY: a live pool and local outputs.
            unsafe {
                assert_eq!(npumem_alloc_raw(c_pool, black_box(size), 0, &mut offset, &mut address), 0);
                assert_eq!(npumem_free_raw(c_pool, black_box(offset), size), 0);
            }
        }
        times[3].push(t.elapsed().as_nanos() as f64 / pairs as f64);
    }
    let [rust, c, rust_raw, c_raw] = times.map(median);
    println!("size {size} B, {pairs} pairs x {rounds} rounds, median ns per alloc+free pair:");
    println!("  handles: Rust {rust:.1}  C ABI {c:.1}  (+{:.1} ns)", c - rust);
    println!("  raw:     Rust {rust_raw:.1}  C ABI {c_raw:.1}  (+{:.1} ns)", c_raw - rust_raw);
    // SAFETY: the reference made above.
    unsafe { npumem_pool_release(c_pool) };
}

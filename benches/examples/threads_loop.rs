//! The mixed-size workload of `alloc_path`'s `threads/N` groups as a plain loop, to check how
//! throughput scales from one thread to two:
//! `cargo run --release -p npumem-benches --example threads_loop [-- PAIRS_PER_THREAD [PEER]]`,
//! PEER one of npumem-buddy (default), npumem, npumem-handles, mutex-tree, slabs, glibc.
//!
//! It reports two scalings, medians of 7 runs each after 3 warm-up runs. *Wall*: aggregate pairs per second of wall
//! time, what a user sees. *CPU*: the same with each thread's own CPU time (the slowest thread's)
//! instead of wall time: on a shared VM the host often takes a vCPU away for part of a run, which
//! no allocator causes, while contention (cache-line transfers, CAS retries) still costs CPU
//! time. A lock that puts waiters to sleep looks good by CPU time; judge it by wall time.
use npumem_benches::{churn, cli, timed_threads, Allocator, Glibc, MutexTree, NpumemBuddy, NpumemHandles, NpumemRaw};
use std::sync::Mutex;

const ARENA: usize = 256 << 20;
const SIZES: [usize; 8] = [256, 4096, 1024, 65536, 512, 16384, 2048, 8192];
const CLASSES: [usize; 7] = [64, 128, 256, 512, 1024, 2048, 4096];

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill; the thread CPU clock exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Million pairs per second by wall time and by the slowest thread's CPU time.
fn run<A: Allocator>(a: &A, sizes: &[usize], threads: usize, pairs: usize) -> (f64, f64) {
    let cpu = Mutex::new(0f64);
    let wall = timed_threads(threads, |t| {
        let start = thread_cpu_seconds();
        churn(a, sizes, t, pairs);
        let used = thread_cpu_seconds() - start;
        let mut slowest = cpu.lock().expect("not poisoned");
        *slowest = slowest.max(used);
    });
    let total = (threads * pairs) as f64 / 1e6;
    (total / wall.as_secs_f64(), total / cpu.into_inner().expect("not poisoned"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report<A: Allocator>(a: &A, sizes: &[usize], pairs: usize) {
    // Warm up first: the first runs on each core fault in the pool's lazily committed tables.
    for _ in 0..3 {
        run(a, sizes, 2, pairs);
    }
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        one.push(run(a, sizes, 1, pairs));
        two.push(run(a, sizes, 2, pairs));
    }
    let wall = (median(one.iter().map(|r| r.0).collect()), median(two.iter().map(|r| r.0).collect()));
    let cpu = (median(one.iter().map(|r| r.1).collect()), median(two.iter().map(|r| r.1).collect()));
    println!(
        "{}: wall {:.1} -> {:.1} M pairs/s ({:.2}x); CPU time {:.1} -> {:.1} M pairs/s ({:.2}x)",
        a.name(),
        wall.0,
        wall.1,
        wall.1 / wall.0,
        cpu.0,
        cpu.1,
        cpu.1 / cpu.0
    );
}

fn main() {
    const USAGE: &str = "threads_loop [PAIRS] [mutex-tree|npumem|slabs|glibc|npumem-handles|npumem-buddy]";
    let args = cli::args();
    cli::at_most(USAGE, &args, 2);
    let pairs = cli::positional(USAGE, &args, 0, "PAIRS", 1..=usize::MAX, 3_000_000);
    let peers = ["mutex-tree", "npumem", "slabs", "glibc", "npumem-handles", "npumem-buddy"];
    match cli::choice(USAGE, &args, 1, "PEER", &peers) {
        Some("mutex-tree") => report(&MutexTree::new(ARENA), &SIZES, pairs),
        Some("npumem") => report(&NpumemRaw::new(ARENA, 2), &SIZES, pairs),
        // The slab classes only (the `slab_threads/N` groups).
        Some("slabs") => report(&NpumemRaw::new(ARENA, 2), &CLASSES, pairs),
        Some("glibc") => report(&Glibc, &CLASSES, pairs),
        Some("npumem-handles") => report(&NpumemHandles::new(ARENA, 2), &SIZES, pairs),
        _ => report(&NpumemBuddy::new(ARENA, 2), &SIZES, pairs),
    }
}

//! The random-size workload of `alloc_path` (256 B to 1 MiB, 50% full) as a plain loop, for
//! profilers: `cargo run --release -p npumem-benches --example random_loop [-- ITERATIONS [PEER]]`.
use npumem_benches::{cli, prefill, replace_random, Allocator, LockedFrames, MutexTree, NpumemBuddy, NpumemRaw, Rng};

const ARENA: usize = 256 << 20;

fn run<A: Allocator>(a: &A, n: usize) {
    let mut rng = Rng::new(7);
    let mut held = prefill(a, &mut rng, ARENA, 0.5, 256, 1 << 20);
    let mut failed = 0usize;
    let start = std::time::Instant::now();
    for _ in 0..n {
        if !replace_random(a, &mut rng, &mut held, 256, 1 << 20) {
            failed += 1;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    println!("{}: {ns:.1} ns per free+alloc, {} blocks held, {failed} failed", a.name(), held.len());
}

fn main() {
    const USAGE: &str = "random_loop [ITERATIONS] [mutex-tree|buddy_system_allocator|npumem|npumem-buddy]";
    let args = cli::args();
    cli::at_most(USAGE, &args, 2);
    let n = cli::positional(USAGE, &args, 0, "ITERATIONS", 1..=usize::MAX, 2_000_000);
    let peers = ["mutex-tree", "buddy_system_allocator", "npumem", "npumem-buddy"];
    match cli::choice(USAGE, &args, 1, "PEER", &peers) {
        Some("mutex-tree") => run(&MutexTree::new(ARENA), n),
        Some("buddy_system_allocator") => run(&LockedFrames::new(ARENA), n),
        Some("npumem") => run(&NpumemRaw::new(ARENA, 2), n),
        _ => run(&NpumemBuddy::new(ARENA, 2), n),
    }
}

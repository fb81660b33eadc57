//! The allocation path of npumem against peers, side by side in one run.
//!
//! Workloads: alloc/free pairs at 256 B, 4 KiB, 64 KiB, 1 MiB; random sizes 256 B to
//! 1 MiB at 50% occupancy; 1 and 2 threads; a producer/consumer pair where every free is remote.
//! Peers: npumem's buddy path (slab classes off: this bench measures the buddy trees), npumem with
//! handles, the same structure behind one Mutex, buddy_system_allocator's FrameAllocator behind a
//! Mutex, branch_allocator.
//!
//! branch_allocator 1.0.8 runs only where every block has one size (pairs, producer/consumer):
//! with mixed sizes it hands out overlapping blocks. Single-threaded, on a 16-block tree:
//! `try_allocate(0, 0)`, `try_allocate(2, 0)`, `deallocate(2, 0)`, then `try_allocate(0, 3)`
//! succeeds although block 0 is still allocated (see BENCHMARKS.md).

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use npumem_benches::{
    churn, prefill, producer_consumer, replace_random, timed_threads, Allocator, Branch, LockedFrames, MutexTree,
    NpumemBuddy, NpumemHandles, Rng,
};

const ARENA: usize = 256 << 20;

fn pair<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A, size: usize) {
    g.bench_function(a.name(), |b| {
        b.iter(|| {
            let t = a.alloc(black_box(size)).expect("room");
            a.free(black_box(t), size);
        })
    });
}

fn pairs(c: &mut Criterion) {
    for size in [256usize, 4 << 10, 64 << 10, 1 << 20] {
        let mut g = c.benchmark_group(format!("pair/{size}"));
        g.throughput(Throughput::Elements(1));
        pair(&mut g, &NpumemBuddy::new(ARENA, 2), size);
        pair(&mut g, &NpumemHandles::new(ARENA, 2), size);
        pair(&mut g, &MutexTree::new(ARENA), size);
        pair(&mut g, &LockedFrames::new(ARENA), size);
        pair(&mut g, &Branch::new(ARENA), size);
        g.finish();
    }
}

fn random_half_full<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A) {
    let mut rng = Rng::new(7);
    let mut held = prefill(a, &mut rng, ARENA, 0.5, 256, 1 << 20);
    g.bench_function(a.name(), |b| b.iter(|| replace_random(a, &mut rng, &mut held, 256, 1 << 20)));
    for (t, size) in held {
        a.free(t, size);
    }
}

fn random_sizes(c: &mut Criterion) {
    let mut g = c.benchmark_group("random_256B_1MiB_50pct");
    g.throughput(Throughput::Elements(1));
    random_half_full(&mut g, &NpumemBuddy::new(ARENA, 2));
    random_half_full(&mut g, &MutexTree::new(ARENA));
    random_half_full(&mut g, &LockedFrames::new(ARENA));
    g.finish();
}

/// `threads` threads (pinned to CPUs 0..threads) each run `iters` alloc/free pairs of mixed small
/// and medium sizes; the wall time of the slowest gives the aggregate throughput.
fn parallel<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A, threads: usize) {
    const SIZES: [usize; 8] = [256, 4096, 1024, 65536, 512, 16384, 2048, 8192];
    g.throughput(Throughput::Elements(threads as u64));
    g.bench_function(a.name(), |b| {
        b.iter_custom(|iters| timed_threads(threads, |t| churn(a, &SIZES, t, iters as usize)))
    });
}

fn threads(c: &mut Criterion) {
    for threads in [1usize, 2] {
        let mut g = c.benchmark_group(format!("threads/{threads}"));
        parallel(&mut g, &NpumemBuddy::new(ARENA, 2), threads);
        parallel(&mut g, &NpumemHandles::new(ARENA, 2), threads);
        parallel(&mut g, &MutexTree::new(ARENA), threads);
        parallel(&mut g, &LockedFrames::new(ARENA), threads);
        g.finish();
    }
}

/// One thread allocates 4 KiB blocks and sends them to another that frees them: every free is
/// remote.
fn remote<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A) {
    g.bench_function(a.name(), |b| b.iter_custom(|iters| producer_consumer(a, 4096, iters as usize)));
}

fn remote_frees(c: &mut Criterion) {
    let mut g = c.benchmark_group("producer_consumer_4KiB");
    g.throughput(Throughput::Elements(1));
    remote(&mut g, &NpumemBuddy::new(ARENA, 2));
    remote(&mut g, &NpumemHandles::new(ARENA, 2));
    remote(&mut g, &MutexTree::new(ARENA));
    remote(&mut g, &LockedFrames::new(ARENA));
    remote(&mut g, &Branch::new(ARENA));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = pairs, random_sizes, threads, remote_frees
}
criterion_main!(benches);

//! The slab fast path against peers, side by side in one run.
//!
//! Peers: glibc `malloc`/`free` of the same sizes (host memory, the everyday reference),
//! `sharded-slab` insert/remove of `()` values, and npumem's own buddy path for the same sizes
//! (slab classes off). Workloads: alloc/free pairs per class; bursts of 1000 allocations then
//! 1000 frees; a producer/consumer pair where every free is remote; 1 and 2 threads.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use npumem_benches::{churn, producer_consumer, timed_threads, Allocator, Glibc, NpumemBuddy, NpumemRaw, ShardedSlab};

const ARENA: usize = 256 << 20;
const CLASSES: [usize; 7] = [64, 128, 256, 512, 1024, 2048, 4096];

fn pair<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A, size: usize) {
    g.bench_function(a.name(), |b| {
        b.iter(|| {
            let t = a.alloc(black_box(size)).expect("room");
            a.free(black_box(t), size);
        })
    });
}

fn pairs(c: &mut Criterion) {
    for size in CLASSES {
        let mut g = c.benchmark_group(format!("slab_pair/{size}"));
        g.throughput(Throughput::Elements(1));
        pair(&mut g, &NpumemRaw::new(ARENA, 2), size);
        pair(&mut g, &NpumemBuddy::new(ARENA, 2), size);
        pair(&mut g, &Glibc, size);
        pair(&mut g, &ShardedSlab::new(), size);
        g.finish();
    }
}

/// 1000 allocations, then 1000 frees (in allocation order); time per allocation+free.
fn burst<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A, size: usize) {
    let mut held = Vec::with_capacity(1000);
    g.bench_function(a.name(), |b| {
        b.iter(|| {
            for _ in 0..1000 {
                held.push(a.alloc(black_box(size)).expect("room"));
            }
            for t in held.drain(..) {
                a.free(black_box(t), size);
            }
        })
    });
}

fn bursts(c: &mut Criterion) {
    for size in [64usize, 256, 4096] {
        let mut g = c.benchmark_group(format!("slab_burst_1000/{size}"));
        g.throughput(Throughput::Elements(1000));
        burst(&mut g, &NpumemRaw::new(ARENA, 2), size);
        burst(&mut g, &NpumemBuddy::new(ARENA, 2), size);
        burst(&mut g, &Glibc, size);
        burst(&mut g, &ShardedSlab::new(), size);
        g.finish();
    }
}

/// `threads` threads (pinned to CPUs 0..threads) each run `iters` alloc/free pairs over the
/// classes; aggregate throughput.
fn parallel<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A, threads: usize) {
    g.throughput(Throughput::Elements(threads as u64));
    g.bench_function(a.name(), |b| {
        b.iter_custom(|iters| timed_threads(threads, |t| churn(a, &CLASSES, t, iters as usize)))
    });
}

fn threads(c: &mut Criterion) {
    for threads in [1usize, 2] {
        let mut g = c.benchmark_group(format!("slab_threads/{threads}"));
        parallel(&mut g, &NpumemRaw::new(ARENA, 2), threads);
        parallel(&mut g, &NpumemBuddy::new(ARENA, 2), threads);
        parallel(&mut g, &Glibc, threads);
        parallel(&mut g, &ShardedSlab::new(), threads);
        g.finish();
    }
}

/// One thread allocates 256-byte blocks and sends them to another that frees them: every free
/// is remote.
fn remote<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A) {
    g.bench_function(a.name(), |b| b.iter_custom(|iters| producer_consumer(a, 256, iters as usize)));
}

fn remote_frees(c: &mut Criterion) {
    let mut g = c.benchmark_group("slab_producer_consumer_256B");
    g.throughput(Throughput::Elements(1));
    remote(&mut g, &NpumemRaw::new(ARENA, 2));
    remote(&mut g, &NpumemBuddy::new(ARENA, 2));
    remote(&mut g, &Glibc);
    remote(&mut g, &ShardedSlab::new());
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = pairs, bursts, threads, remote_frees
}
criterion_main!(benches);

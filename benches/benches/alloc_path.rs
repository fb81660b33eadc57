//! The allocation path of npumem against peers, side by side in one run.
//!
//! Workloads (issue 2): alloc/free pairs at 256 B, 4 KiB, 64 KiB, 1 MiB; random sizes 256 B to
//! 1 MiB at 50% occupancy; 1 and 2 threads; a producer/consumer pair where every free is remote.
//! Peers: npumem's buddy path (slab classes off: issue 2 measures the buddy trees), npumem with
//! handles, the same structure behind one Mutex, buddy_system_allocator's FrameAllocator behind a
//! Mutex, branch_allocator.

use std::hint::black_box;
use std::sync::{mpsc, Barrier};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use npumem_benches::{prefill, Allocator, Branch, LockedFrames, MutexTree, NpumemBuddy, NpumemHandles, Rng};

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
    g.bench_function(a.name(), |b| {
        b.iter(|| {
            let i = (rng.next_u64() as usize) % held.len();
            let (t, size) = held[i];
            a.free(t, size);
            let size = rng.size(256, 1 << 20);
            if let Some(t) = a.alloc(size) {
                held[i] = (t, size);
            } else {
                held.swap_remove(i);
            }
        })
    });
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
    random_half_full(&mut g, &Branch::new(ARENA));
    g.finish();
}

/// `threads` threads each run `iters` alloc/free pairs of mixed small and medium sizes; the
/// wall time of the slowest gives the aggregate throughput.
fn parallel<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A, threads: usize) {
    g.throughput(Throughput::Elements(threads as u64));
    g.bench_function(a.name(), |b| {
        b.iter_custom(|iters| {
            let barrier = Barrier::new(threads + 1);
            std::thread::scope(|s| {
                for t in 0..threads {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let sizes = [256usize, 4096, 1024, 65536, 512, 16384, 2048, 8192];
                        let mut held = Vec::with_capacity(8);
                        barrier.wait();
                        for i in 0..iters as usize {
                            let size = sizes[(i + t) % sizes.len()];
                            held.push((a.alloc(size).expect("room"), size));
                            if held.len() == 8 {
                                for (tok, size) in held.drain(..) {
                                    a.free(tok, size);
                                }
                            }
                        }
                        for (tok, size) in held {
                            a.free(tok, size);
                        }
                        barrier.wait();
                    });
                }
                barrier.wait();
                let start = Instant::now();
                barrier.wait();
                start.elapsed()
            })
        })
    });
}

fn threads(c: &mut Criterion) {
    for threads in [1usize, 2] {
        let mut g = c.benchmark_group(format!("threads/{threads}"));
        parallel(&mut g, &NpumemBuddy::new(ARENA, 2), threads);
        parallel(&mut g, &NpumemHandles::new(ARENA, 2), threads);
        parallel(&mut g, &MutexTree::new(ARENA), threads);
        parallel(&mut g, &LockedFrames::new(ARENA), threads);
        parallel(&mut g, &Branch::new(ARENA), threads);
        g.finish();
    }
}

/// One thread allocates 4 KiB blocks and sends them, 256 at a time, to another that frees them:
/// every free is remote.
fn producer_consumer<A: Allocator>(g: &mut BenchmarkGroup<'_, WallTime>, a: &A) {
    g.bench_function(a.name(), |b| {
        b.iter_custom(|iters| {
            let (tx, rx) = mpsc::sync_channel::<Vec<A::Token>>(16);
            let start = Instant::now();
            std::thread::scope(|s| {
                s.spawn(move || {
                    for batch in rx {
                        for t in batch {
                            a.free(t, 4096);
                        }
                    }
                });
                let mut left = iters as usize;
                while left > 0 {
                    let n = left.min(256);
                    let batch: Vec<A::Token> = (0..n).map(|_| a.alloc(4096).expect("room")).collect();
                    tx.send(batch).expect("consumer alive");
                    left -= n;
                }
                drop(tx);
            });
            start.elapsed()
        })
    });
}

fn remote_frees(c: &mut Criterion) {
    let mut g = c.benchmark_group("producer_consumer_4KiB");
    g.throughput(Throughput::Elements(1));
    producer_consumer(&mut g, &NpumemBuddy::new(ARENA, 2));
    producer_consumer(&mut g, &NpumemHandles::new(ARENA, 2));
    producer_consumer(&mut g, &MutexTree::new(ARENA));
    producer_consumer(&mut g, &LockedFrames::new(ARENA));
    producer_consumer(&mut g, &Branch::new(ARENA));
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

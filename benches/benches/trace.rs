//! The cost of the event trace on the alloc/free path: the same alloc/free pairs on
//! two pools in one run, one with the trace off (the default) and one with it on. The ring is
//! never drained, so every event also overwrites an old one (the steady state of a full ring).
//!
//! Groups: `trace_pair/{256,65536}` (one thread), `trace_threads/2` (two threads, mixed sizes).
//! Report the `on` time as a ratio against `off` of the same group.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use npumem_benches::timed_threads;
use npumem_core::{Backing, Pool, PoolConfig};

const ARENA: usize = 256 << 20;
const TRACE_CAPACITY: usize = 1 << 16;

fn pool(trace: bool) -> Pool {
    let p = Pool::new(PoolConfig::new(ARENA).cores(2).backing(Backing::None)).expect("config");
    if trace {
        p.trace_start(TRACE_CAPACITY).expect("trace starts");
    }
    p
}

fn label(trace: bool) -> &'static str {
    if trace {
        "on"
    } else {
        "off"
    }
}

fn pairs(c: &mut Criterion) {
    for size in [256usize, 64 << 10] {
        let mut g = c.benchmark_group(format!("trace_pair/{size}"));
        g.throughput(Throughput::Elements(1));
        for trace in [false, true] {
            let p = pool(trace);
            g.bench_function(BenchmarkId::from_parameter(label(trace)), |b| {
                b.iter(|| {
                    let h = p.alloc(black_box(size), None, 1).expect("room");
                    p.free(black_box(h)).expect("valid free");
                })
            });
            assert_eq!(p.trace_status().enabled, trace);
        }
        g.finish();
    }
}

fn threads(c: &mut Criterion) {
    let threads = 2usize;
    let mut g = c.benchmark_group(format!("trace_threads/{threads}"));
    g.throughput(Throughput::Elements(threads as u64));
    for trace in [false, true] {
        let p = pool(trace);
        g.bench_function(BenchmarkId::from_parameter(label(trace)), |b| {
            b.iter_custom(|iters| {
                timed_threads(threads, |t| {
                    let sizes = [256usize, 4096, 1024, 65536, 512, 16384, 2048, 8192];
                    let mut held = Vec::with_capacity(8);
                    for i in 0..iters as usize {
                        let size = sizes[(i + t) % sizes.len()];
                        held.push(p.alloc(size, None, 1).expect("room"));
                        if held.len() == 8 {
                            for h in held.drain(..) {
                                p.free(h).expect("valid free");
                            }
                        }
                    }
                    for h in held {
                        p.free(h).expect("valid free");
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = pairs, threads
}
criterion_main!(benches);

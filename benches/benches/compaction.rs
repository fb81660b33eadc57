//! Moving blocks on host memory against a plain `memmove` of the same bytes, in the
//! same run: `n` blocks of one size (32 MiB per iteration) go to free places of the same shape
//! and back, each iteration one batch (`pause`, `relocate`, `resume`); the baseline copies the
//! same number of blocks of the same size between two buffers with `ptr::copy`. Every page is
//! touched before timing (a long-running pool has its pages committed).
//!
//! The throughput ratio `memmove time / relocate time` is the figure of BENCHMARKS.md (target:
//! at least 0.5 for blocks of 64 KiB and up). The full-compaction pause of a 1 GiB pool is the
//! `compaction_pause` example.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use npumem_core::{Move, Pool, PoolConfig};

const MIB: usize = 1 << 20;
const PER_ITERATION: usize = 32 * MIB;

fn throughput(c: &mut Criterion) {
    for size in [64 << 10, 256 << 10, MIB, 4 * MIB] {
        let n = PER_ITERATION / size;
        let mut g = c.benchmark_group(format!("move/{}KiB", size >> 10));
        g.throughput(Throughput::Bytes((n * size) as u64));
        g.sample_size(20);

        // Baseline: the same copies between two buffers.
        let mut from = vec![0xA5u8; n * size];
        let mut to = vec![0x5Au8; n * size];
        g.bench_function("memmove", |b| {
            b.iter(|| {
                for i in 0..n {
                    // SAFETY: both ranges are inside their own buffers.
                    unsafe { std::ptr::copy(from.as_ptr().add(i * size), to.as_mut_ptr().add(i * size), size) };
                }
                std::mem::swap(&mut from, &mut to);
                black_box(&to);
            })
        });

        // npumem: n blocks, n free places of the same shape; every page touched.
        let pool = Pool::new(PoolConfig::new(4 * PER_ITERATION + 16 * MIB).cores(1)).unwrap();
        let blocks: Vec<_> = (0..n).map(|_| pool.alloc(size, None, 0).unwrap()).collect();
        let places: Vec<_> = (0..n).map(|_| pool.alloc(size, None, 0).unwrap()).collect();
        let bytes = vec![0xC3u8; size];
        for &h in blocks.iter().chain(places.iter()) {
            pool.write(h, 0, &bytes).unwrap();
        }
        let mut there: Vec<usize> = places.iter().map(|&h| pool.block(h).unwrap().offset).collect();
        for h in places {
            pool.free(h).unwrap();
        }
        let mut here: Vec<usize> = blocks.iter().map(|&h| pool.block(h).unwrap().offset).collect();
        g.bench_function("relocate", |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let moves: Vec<Move> =
                        blocks.iter().zip(&there).map(|(&handle, &to)| Move { handle, to }).collect();
                    let started = Instant::now();
                    let token = pool.pause(Duration::from_secs(5)).unwrap();
                    pool.move_blocks(&token, &moves, None).unwrap();
                    pool.resume(&token).unwrap();
                    spent += started.elapsed();
                    std::mem::swap(&mut here, &mut there);
                }
                spent
            })
        });
        g.finish();
        for h in blocks {
            pool.free(h).unwrap();
        }
        pool.check().unwrap();
    }
}

criterion_group!(benches, throughput);
criterion_main!(benches);

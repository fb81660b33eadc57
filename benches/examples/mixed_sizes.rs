//! Mixed sizes against the O(1) heaps: npumem (raw offset API, `backing = none`) beside
//! `offset-allocator`, `rlsf` (TLSF), `buddy_system_allocator` and npumem's single-mutex tree,
//! each managing the same 1 GiB arena (behind a `Mutex` where it is not thread-safe), on the same
//! seeded sequences, in one run. Prints one Markdown table per measurement (medians of `--runs`):
//!
//! - churn: random sizes 256 B-1 MiB at 50% and 85% occupancy, ns per free+alloc step, failed
//!   allocations, and the latency of a failing allocation (median, max, and the share over
//!   10 us);
//! - two threads (or `--threads N`), the churn at 50% shared between them: throughput over one
//!   thread's on the same churn, beside the same threads on a pool each (what sharing one pool
//!   costs them) and what the machine gives threads that share nothing;
//! - fixed-size alloc+free pairs at 256 B, 4 KiB, 64 KiB, 1 MiB on an empty arena;
//! - fill: random sizes, and fixed mixes of a few sizes, no frees, until the first failure:
//!   requested bytes over capacity;
//! - waste: every size 1 B-64 MiB on a log grid plus sizes next to class and chunk boundaries,
//!   reserved over requested, worst case per range.
//!
//! `cargo run --release -p npumem-benches --example mixed_sizes [-- --quick] [--steps N]
//! [--runs N] [--only TABLE] [--peer NAME] [--occupancy PERCENT] [--threads N] [--seed S]`
//! (TABLE: churn, threads, pairs, fill, waste; NAME: one row of every table, e.g. `npumem`;
//! PERCENT: the churn table at that one occupancy, 1-95, instead of 50 and 85; N: the threads
//! table's threads, 2 by default, pinned to the first N CPUs the process may use; S: the seed of
//! the churn and fill tables' sequences, 7 and 3 by default, so that failures and fill can be
//! measured on sequences never published).
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use npumem_benches::{cli, ticks, timed_threads, Allocator, LockedFrames, MutexTree, NpumemRaw, Rng, TickClock, UNIT};
use npumem_core::{Backing, Pool, PoolConfig};

const ARENA: usize = 1 << 30;
/// The unit of the peers that count units of their own (offset-allocator), and everyone's
/// alignment: npumem's default.
const ALIGN: usize = 64;

/// `offset-allocator` (Sebastian Aaltonen's OffsetAllocator) in 64-byte units, behind a mutex.
struct OffsetAlloc(Mutex<offset_allocator::Allocator>);

impl OffsetAlloc {
    fn new() -> Self {
        let units = (ARENA / ALIGN) as u32;
        OffsetAlloc(Mutex::new(offset_allocator::Allocator::with_max_allocs(units, 1 << 21)))
    }
    fn reserved(&self, size: usize) -> Option<usize> {
        let mut a = self.0.lock().unwrap();
        let got = a.allocate(size.div_ceil(ALIGN) as u32)?;
        let bytes = a.allocation_size(got) as usize * ALIGN;
        a.free(got);
        Some(bytes)
    }
}

impl Allocator for OffsetAlloc {
    type Token = offset_allocator::Allocation;
    fn name(&self) -> &'static str {
        "offset-allocator"
    }
    fn alloc(&self, size: usize) -> Option<Self::Token> {
        self.0.lock().unwrap().allocate(size.div_ceil(ALIGN) as u32)
    }
    fn free(&self, token: Self::Token, _size: usize) {
        self.0.lock().unwrap().free(token);
    }
}

type Tlsf = rlsf::Tlsf<'static, u32, u32, 28, 32>;

/// `rlsf` (TLSF) behind a mutex. It keeps its block headers inside the memory it manages, so its
/// arena is a real 1 GiB mapping, committed up front (page faults are not the allocator's cost)
/// and made once: every measurement frees all it allocated, which leaves one free block.
struct RlsfHeap {
    tlsf: Mutex<Tlsf>,
    base: *mut u8,
}

// SAFETY: the heap and its mapping are only touched under the mutex; the pointer is the
// mapping's base, owned by this value.
unsafe impl Send for RlsfHeap {}
// SAFETY: as above.
unsafe impl Sync for RlsfHeap {}

impl RlsfHeap {
    fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "a 1 GiB mapping for rlsf");
        let mut tlsf = Tlsf::new();
        let block = NonNull::slice_from_raw_parts(NonNull::new(base as *mut u8).expect("mapped"), ARENA);
        // SAFETY: the mapping is ours, valid and lives as long as the heap.
        unsafe { tlsf.insert_free_block_ptr(block) };
        RlsfHeap { tlsf: Mutex::new(tlsf), base: base as *mut u8 }
    }
    /// Bytes a block of `size` takes: the distance to the next block placed after it.
    fn reserved(&self, size: usize) -> Option<usize> {
        let a = self.alloc(size)?;
        let b = self.alloc(1);
        let bytes = b.map(|b| b - a);
        if let Some(b) = b {
            self.free(b, 1);
        }
        self.free(a, size);
        bytes
    }
}

impl Drop for RlsfHeap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, ARENA) };
    }
}

impl Allocator for RlsfHeap {
    type Token = usize;
    fn name(&self) -> &'static str {
        "rlsf"
    }
    fn alloc(&self, size: usize) -> Option<usize> {
        let layout = Layout::from_size_align(size, ALIGN).ok()?;
        self.tlsf.lock().unwrap().allocate(layout).map(|p| p.as_ptr() as usize - self.base as usize)
    }
    fn free(&self, offset: usize, _size: usize) {
        // SAFETY: `offset` came from `alloc` of this heap and is freed once.
        unsafe {
            let ptr = NonNull::new_unchecked(self.base.add(offset));
            self.tlsf.lock().unwrap().deallocate(ptr, ALIGN);
        }
    }
}

fn rlsf_heap() -> &'static RlsfHeap {
    static HEAP: std::sync::OnceLock<RlsfHeap> = std::sync::OnceLock::new();
    HEAP.get_or_init(RlsfHeap::new)
}

/// The peers, in table order.
const PEERS: [&str; 5] = ["npumem", "offset-allocator", "rlsf", "buddy_system_allocator", "mutex-tree"];

/// Run `f` on a fresh allocator of peer `name`.
fn with_peer<R>(name: &str, f: &mut dyn FnMut(&dyn Peer) -> R) -> R {
    with_peer_of_cores(name, 2, f)
}

/// [`with_peer`], npumem with `cores` core pools.
fn with_peer_of_cores<R>(name: &str, cores: usize, f: &mut dyn FnMut(&dyn Peer) -> R) -> R {
    match name {
        "npumem" => f(&NpumemRaw::new(ARENA, cores)),
        "offset-allocator" => f(&OffsetAlloc::new()),
        "rlsf" => f(rlsf_heap()),
        "buddy_system_allocator" => f(&LockedFrames::new(ARENA)),
        "mutex-tree" => f(&MutexTree::new(ARENA)),
        _ => unreachable!("unknown peer {name}"),
    }
}

/// What the measurements need of a peer, object-safe: offsets as `usize` tokens.
trait Peer: Sync {
    fn alloc_any(&self, size: usize) -> Option<u128>;
    fn free_any(&self, token: u128, size: usize);
}

macro_rules! peer_via_usize {
    ($($t:ty),*) => {$(
        impl Peer for $t {
            #[inline]
            fn alloc_any(&self, size: usize) -> Option<u128> {
                Allocator::alloc(self, size).map(|o| o as u128)
            }
            #[inline]
            fn free_any(&self, token: u128, size: usize) {
                Allocator::free(self, token as usize, size)
            }
        }
    )*};
}
peer_via_usize!(NpumemRaw, RlsfHeap, LockedFrames, MutexTree);

impl Peer for OffsetAlloc {
    #[inline]
    fn alloc_any(&self, size: usize) -> Option<u128> {
        // The allocation's offset and node index fit one token; rebuilt on free.
        let a = Allocator::alloc(self, size)?;
        // SAFETY: `Allocation` is two `u32`-sized fields (offset, node index); plain data.
        let bits: u64 = unsafe { std::mem::transmute::<offset_allocator::Allocation, u64>(a) };
        Some(bits as u128)
    }
    #[inline]
    fn free_any(&self, token: u128, size: usize) {
        // SAFETY: the bits of an `Allocation` made by `alloc_any`, freed once.
        let a = unsafe { std::mem::transmute::<u64, offset_allocator::Allocation>(token as u64) };
        Allocator::free(self, a, size)
    }
}

struct Options {
    steps: usize,
    runs: usize,
    pairs: usize,
    only: Option<String>,
    peer: Option<String>,
    /// The churn table's occupancies: 50% and 85% unless `--occupancy` names one.
    occupancies: Vec<f64>,
    /// The threads table's threads.
    threads: usize,
    /// The seed of the churn and fill tables' sequences, when not their defaults.
    seed: Option<u64>,
}

impl Options {
    /// The peers to measure, in table order.
    fn peers(&self) -> impl Iterator<Item = &'static str> + '_ {
        PEERS.into_iter().filter(|&name| self.peer.as_deref().is_none_or(|p| p == name))
    }
}

const USAGE: &str = "mixed_sizes [--quick] [--steps N] [--runs N] [--pairs N] [--only TABLE] [--peer NAME] \
     [--occupancy PERCENT] [--threads N] [--seed S]";
const TABLES: [&str; 5] = ["churn", "threads", "pairs", "fill", "waste"];

fn options() -> Options {
    let mut o = Options {
        steps: 1_000_000,
        runs: 3,
        pairs: 1_000_000,
        only: None,
        peer: None,
        occupancies: vec![0.5, 0.85],
        threads: 2,
        seed: None,
    };
    let mut args = cli::args().into_iter();
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| cli::fail(USAGE, format!("{a} needs a value")));
        match a.as_str() {
            "--quick" => {
                o.steps = 50_000;
                o.runs = 1;
                o.pairs = 100_000;
            }
            "--steps" => o.steps = cli::number(USAGE, "--steps", &value(), 2..=usize::MAX),
            "--runs" => o.runs = cli::number(USAGE, "--runs", &value(), 1..=1000),
            "--pairs" => o.pairs = cli::number(USAGE, "--pairs", &value(), 1..=usize::MAX),
            "--only" => {
                let table = value();
                if !TABLES.contains(&table.as_str()) {
                    cli::fail(USAGE, format!("--only must be one of {}, got '{table}'", TABLES.join(", ")));
                }
                o.only = Some(table);
            }
            "--peer" => {
                let peer = value();
                if !PEERS.contains(&peer.as_str()) {
                    cli::fail(USAGE, format!("--peer must be one of {}, got '{peer}'", PEERS.join(", ")));
                }
                o.peer = Some(peer);
            }
            "--occupancy" => {
                let percent: usize = cli::number(USAGE, "--occupancy", &value(), 1..=95);
                o.occupancies = vec![percent as f64 / 100.0];
            }
            "--threads" => o.threads = cli::number(USAGE, "--threads", &value(), 2..=1024),
            "--seed" => o.seed = Some(cli::number(USAGE, "--seed", &value(), 0..=usize::MAX) as u64),
            other => cli::fail(USAGE, format!("unknown option '{other}'")),
        }
    }
    o
}

/// The calling thread's CPU time in ns: loops are timed by it, so time the scheduler gives to
/// other processes on a shared machine does not count.
fn cpu_ns() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// Run `work(t, start)` on `threads` threads pinned to CPUs 0, 1, ...; each calls `start()`
/// when its timed part begins (every thread waits there for the others, so set-up is not timed).
/// The wall time from the first timed start to the last thread's end, as the threads read it.
fn wall_of_threads(threads: usize, work: impl Fn(usize, &dyn Fn()) + Sync) -> f64 {
    let spans = Mutex::new(Vec::new());
    let ready = Barrier::new(threads);
    timed_threads(threads, |t| {
        let start = std::cell::Cell::new(None);
        work(t, &|| {
            ready.wait();
            start.set(Some(Instant::now()));
        });
        let start = start.get().expect("the work marks its timed start");
        spans.lock().unwrap().push((start, Instant::now()));
    });
    let spans = spans.into_inner().unwrap();
    let first = spans.iter().map(|s| s.0).min().expect("a thread");
    let last = spans.iter().map(|s| s.1).max().expect("a thread");
    (last - first).as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn fmt_ns(ns: f64) -> String {
    if ns.is_nan() {
        "-".into()
    } else if ns >= 10_000.0 {
        format!("{:.0}", ns)
    } else {
        format!("{:.1}", ns)
    }
}

const LO: usize = 256;
const HI: usize = 1 << 20;

/// Fill to `occupancy` of the arena with seeded sizes, then `steps` steps of: free a random
/// held block, allocate a new random size in its place. Returns (ns per step, failed
/// allocations, latencies of the failing allocations in ns).
fn churn(p: &dyn Peer, occupancy: f64, steps: usize, seed: u64) -> (f64, usize, Vec<f64>) {
    churn_timed_from(p, occupancy, steps, seed, &|| {})
}

/// Draws made at once, between timed stretches of steps (16 MiB of them): the default steps
/// (1,000,000, and half of them per thread in the threads table) are all drawn before the timed
/// part begins. With more steps the rest is drawn between timed stretches, which the CPU time
/// leaves out but the threads table's wall time does not.
const DRAWS_AT_ONCE: usize = 1 << 20;

/// One churn step's random draws, made before the timed steps so that they time the
/// allocator, not the generator (a logarithm and an exponential per size): which held block
/// to free (the high half of `pick`, scaled to the blocks held then) and the size to allocate.
#[derive(Clone, Copy)]
struct Draw {
    pick: u64,
    size: usize,
}

/// [`churn`], calling `start()` between the fill and the timed steps. A step reads the time
/// stamp counter once ([`ticks`], about 10 ns where a clock read costs about 25) so that a
/// failing allocation's latency is known; every peer pays it alike.
fn churn_timed_from(p: &dyn Peer, occupancy: f64, steps: usize, seed: u64, start: &dyn Fn()) -> (f64, usize, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let mut held: Vec<(u128, usize)> = Vec::new();
    let mut bytes = 0usize;
    while (bytes as f64) < occupancy * ARENA as f64 {
        let size = rng.size(LO, HI);
        match p.alloc_any(size) {
            Some(t) => {
                held.push((t, size));
                bytes += size;
            }
            None => break,
        }
    }
    let mut failed = Vec::new();
    let mut left = steps;
    let mut draw_next = || {
        let n = left.min(DRAWS_AT_ONCE);
        left -= n;
        (0..n).map(|_| Draw { pick: rng.next_u64(), size: rng.size(LO, HI) }).collect::<Vec<_>>()
    };
    let mut draws = draw_next();
    let mut cpu = 0.0;
    start();
    let clock = TickClock::start();
    while !draws.is_empty() && !held.is_empty() {
        let start = cpu_ns();
        for draw in &draws {
            if held.is_empty() {
                break;
            }
            let i = (((draw.pick >> 32) * held.len() as u64) >> 32) as usize;
            let (token, size) = held[i];
            p.free_any(token, size);
            let t0 = ticks();
            match p.alloc_any(draw.size) {
                Some(token) => held[i] = (token, draw.size),
                None => {
                    failed.push(ticks() - t0);
                    // Keep the occupancy: the slot keeps a block of the old size if that fits.
                    match p.alloc_any(held[i].1) {
                        Some(token) => held[i].0 = token,
                        None => {
                            held.swap_remove(i);
                        }
                    }
                }
            }
        }
        cpu += cpu_ns() - start;
        draws = draw_next();
    }
    let ns = cpu / steps as f64;
    let ns_per_tick = clock.ns_per_tick();
    for (t, size) in held {
        p.free_any(t, size);
    }
    (ns, failed.len(), failed.into_iter().map(|t| t as f64 * ns_per_tick).collect())
}

/// The latency a failing allocation should stay within (the churn table gives the share of
/// those that took longer: a maximum is one sample, which one preemption decides).
const FAILING_BOUND_US: f64 = 10.0;

/// The share of `ns` above `bound` (NaN when empty).
fn share_over(ns: &[f64], bound: f64) -> f64 {
    if ns.is_empty() {
        return f64::NAN;
    }
    ns.iter().filter(|&&t| t > bound).count() as f64 / ns.len() as f64
}

fn fmt_share(share: f64) -> String {
    if share.is_nan() {
        "-".into()
    } else {
        format!("{:.1}%", share * 100.0)
    }
}

fn churn_tables(o: &Options) {
    for &occupancy in &o.occupancies {
        println!(
            "\n### Churn, random sizes 256 B-1 MiB at {:.0}% occupancy ({} steps, medians of {})\n",
            occupancy * 100.0,
            o.steps,
            o.runs
        );
        println!(
            "| | ns per free+alloc | failed allocations | failing alloc: median us | failing alloc: max us | \
             failing alloc: share over {FAILING_BOUND_US} us |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        for name in o.peers() {
            let (mut ns, mut fails, mut fail_med, mut fail_max) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut fail_over = Vec::new();
            for _ in 0..o.runs {
                let (n, f, mut lat) = with_peer(name, &mut |p| churn(p, occupancy, o.steps, o.seed.unwrap_or(7)));
                ns.push(n);
                fails.push(f as f64);
                fail_max.push(lat.iter().cloned().fold(f64::NAN, f64::max) / 1e3);
                fail_over.push(share_over(&lat, FAILING_BOUND_US * 1e3));
                fail_med.push(median(&mut lat) / 1e3);
            }
            println!(
                "| {name} | {} | {:.0} | {} | {} | {} |",
                fmt_ns(median(&mut ns)),
                median(&mut fails),
                fmt_ns(median(&mut fail_med)),
                fmt_ns(median(&mut fail_max)),
                fmt_share(median(&mut fail_over))
            );
        }
    }
}

fn threads_table(o: &Options) {
    let (n, steps) = (o.threads, o.steps / 2);
    // The same workload in both runs, the churn with half the arena held: one thread holds all
    // of it, each of the n threads its share.
    println!("\n### {n} threads, the churn at 50% in all ({steps} steps per thread, medians of {})\n", o.runs);
    println!("| | one thread (M steps/s) | {n} threads (M steps/s) | {n} / one | {n} / one by CPU time |");
    println!("|---|---:|---:|---:|---:|");
    for name in o.peers() {
        // A fresh arena for each run (npumem with a core pool per thread): the one-thread run
        // would leave its chunks, slabs and cached blocks to the next otherwise.
        scaling_row(o, n, steps, name, &|threads, cpu| {
            with_peer_of_cores(name, n, &mut |p| {
                wall_of_threads(threads, |t, start| {
                    let (ns, ..) = churn_timed_from(p, 0.5 / threads as f64, steps, 11 + t as u64, start);
                    cpu.lock().unwrap().push(ns);
                })
            })
        });
    }
    // What npumem loses to what its threads share inside one pool: the same churn with a pool
    // of its own (one core pool, 1/n of the arena) for each thread, so that the threads share
    // no line of npumem's.
    if o.peers().any(|name| name == "npumem") {
        scaling_row(o, n, steps, "npumem, a pool per thread (shares nothing)", &|threads, cpu| {
            let pools: Vec<NpumemRaw> = (0..threads).map(|_| NpumemRaw::new(ARENA / threads, 1)).collect();
            wall_of_threads(threads, |t, start| {
                let (ns, ..) = churn_timed_from(&pools[t], 0.5 / threads as f64, steps, 11 + t as u64, start);
                cpu.lock().unwrap().push(ns);
            })
        });
    }
    // What the machine gives n threads that share nothing: steps of arithmetic in registers,
    // and steps of random reads in memory of their own (as an allocator's step reads metadata
    // at random places).
    baseline_row(o, n, steps, "compute only (no allocator)", &|_, t| {
        // Constants the compiler cannot see, so that it cannot fold the steps together.
        let (a, c) = std::hint::black_box((6_364_136_223_846_793_005u64, 1_442_695_040_888_963_407u64));
        let mut x = 1 + t as u64;
        for _ in 0..steps * 64 {
            x = x.wrapping_mul(a).wrapping_add(c);
        }
        x
    });
    baseline_row(o, n, steps, "memory only (4 random reads a step, 64 MiB per thread)", &|memory, t| {
        let mask = memory.len() - 1;
        let (mut x, mut sum) = (1 + t as u64, 0u64);
        for _ in 0..steps * 4 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            sum = sum.wrapping_add(memory[(x >> 20) as usize & mask]);
        }
        sum
    });
    println!(
        "\n(Half the arena is held in both runs: the one thread fills it, each of the {n} threads {:.1}%; wall time of the churn steps, from a common start after every thread's fill. By CPU time: {n} x one thread's CPU time per step over the {n} threads' mean, what the threads would reach running side by side on CPUs of their own: time the machine gives other processes does not count, waits for shared cache lines do; so does a spin, but not a sleep on a peer's mutex, so for those peers only the wall figure tells. A pool per thread: npumem with a pool of its own (one core pool, 1/{n} of the arena) for each thread, the threads sharing no line of npumem's: the gap to the npumem row is what the threads of one pool lose to what they share. Compute only: each step 64 multiply-adds in registers. Memory only: each step 4 independent reads at random places of 64 MiB of the thread's own. What the machine itself gives {n} threads that share nothing.)",
        50.0 / n as f64
    );
}

/// One row of the threads table for a baseline: `work(memory, t)` runs `steps` steps on thread
/// `t` with 64 MiB of its own (touched before the timed part).
fn baseline_row(o: &Options, n: usize, steps: usize, name: &str, work: &(dyn Fn(&[u64], usize) -> u64 + Sync)) {
    scaling_row(o, n, steps, name, &|threads, cpu| {
        // Each thread's memory is given back after the run, not inside its timed part.
        let kept = Mutex::new(Vec::new());
        wall_of_threads(threads, |t, start| {
            let memory: Vec<u64> = (0..8u64 << 20).collect();
            start();
            let begin = cpu_ns();
            std::hint::black_box(work(&memory, t));
            cpu.lock().unwrap().push((cpu_ns() - begin) / steps as f64);
            kept.lock().unwrap().push(memory);
        })
    });
}

/// One row of the threads table: `run(threads, cpu)` runs `steps` steps on each of `threads`
/// threads, pushes each thread's CPU time per step to `cpu` and returns the wall time; one
/// thread, then `n`, `o.runs` times, medians printed.
fn scaling_row(o: &Options, n: usize, steps: usize, name: &str, run: &dyn Fn(usize, &Mutex<Vec<f64>>) -> f64) {
    let (mut one, mut all, mut by_cpu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.runs {
        let cpu = Mutex::new(Vec::new());
        let t1 = run(1, &cpu);
        let alone = std::mem::take(&mut *cpu.lock().unwrap())[0];
        let tn = run(n, &cpu);
        let together = cpu.lock().unwrap().iter().sum::<f64>() / n as f64;
        one.push(steps as f64 / t1 / 1e6);
        all.push((n * steps) as f64 / tn / 1e6);
        by_cpu.push(n as f64 * alone / together);
    }
    let (a, b) = (median(&mut one), median(&mut all));
    println!("| {name} | {a:.2} | {b:.2} | {:.2}x | {:.2}x |", b / a, median(&mut by_cpu));
}

fn pairs_table(o: &Options) {
    let sizes = [256usize, 4 << 10, 64 << 10, 1 << 20];
    println!("\n### Fixed-size alloc+free pairs, empty arena ({} pairs, medians of {})\n", o.pairs, o.runs);
    println!("| | 256 B | 4 KiB | 64 KiB | 1 MiB |");
    println!("|---|---:|---:|---:|---:|");
    for name in o.peers() {
        let mut cells = Vec::new();
        for size in sizes {
            let mut ns = Vec::new();
            for _ in 0..o.runs {
                ns.push(with_peer(name, &mut |p| {
                    for _ in 0..1000 {
                        let t = p.alloc_any(size).expect("room");
                        p.free_any(t, size);
                    }
                    let start = cpu_ns();
                    for _ in 0..o.pairs {
                        let t = p.alloc_any(std::hint::black_box(size)).expect("room");
                        p.free_any(std::hint::black_box(t), size);
                    }
                    (cpu_ns() - start) / o.pairs as f64
                }));
            }
            cells.push(fmt_ns(median(&mut ns)));
        }
        println!("| {name} | {} |", cells.join(" | "));
    }
}

/// The requested share of the arena at which the sequence of [`fill`] needs more than the
/// arena under the bank rule, with blocks of at most a bank in per-class slabs: `None` when the
/// band mixes both kinds of blocks (then small blocks could share a large block's last bank).
fn bank_rule_bound(lo: usize, hi: usize, seed: u64) -> Option<f64> {
    let bank = PoolConfig::new(ARENA).bank_size;
    if lo < bank && hi > bank {
        return None;
    }
    let mut rng = Rng::new(seed);
    Some(bank_rule_bound_of(&mut || rng.size(lo, hi)))
}

/// [`bank_rule_bound`] of the sizes `next_size` gives: each block of more than a bank takes
/// whole banks, each of at most a bank its share of a bank tiled by its default slab class.
fn bank_rule_bound_of(next_size: &mut dyn FnMut() -> usize) -> f64 {
    let config = PoolConfig::new(ARENA);
    let bank = config.bank_size;
    let classes = config.slab_sizes;
    let (mut requested, mut reserved) = (0usize, 0f64);
    loop {
        let size = next_size();
        let cost = if size > bank {
            size.next_multiple_of(bank) as f64
        } else {
            let aligned = size.next_multiple_of(ALIGN);
            let class = classes.iter().copied().find(|&c| c >= aligned && c % ALIGN == 0).unwrap_or(bank);
            bank as f64 / (bank / class) as f64
        };
        if reserved + cost > ARENA as f64 {
            return requested as f64 / ARENA as f64;
        }
        reserved += cost;
        requested += size;
    }
}

/// What the bank rule alone leaves to a band of blocks of at most a bank (`None` for other
/// bands): the requested share of the arena at the first failure of the same sequence placed
/// best fit over the banks, each block (its size rounded up to the alignment) appended in the
/// bank with the least room that holds it, whatever its size. Blocks of many sizes share a bank
/// there, where per-class slabs give each bank to one class ([`bank_rule_bound`]).
fn shared_banks_fill(lo: usize, hi: usize, seed: u64) -> Option<f64> {
    let bank = PoolConfig::new(ARENA).bank_size;
    if hi > bank {
        return None;
    }
    // Banks by their room, in steps of the alignment: a fill never frees, so a bank's room is
    // one piece at its end.
    let mut banks_with_room = vec![0usize; bank / ALIGN + 1];
    banks_with_room[bank / ALIGN] = ARENA / bank;
    let mut rng = Rng::new(seed);
    let mut requested = 0usize;
    loop {
        let size = rng.size(lo, hi);
        let steps = size.div_ceil(ALIGN);
        let Some(room) = (steps..banks_with_room.len()).find(|&r| banks_with_room[r] > 0) else {
            return Some(requested as f64 / ARENA as f64);
        };
        banks_with_room[room] -= 1;
        banks_with_room[room - steps] += 1;
        requested += size;
    }
}

/// Allocate seeded sizes in `[lo, hi]`, no frees, until the first failure: requested bytes over
/// the arena's capacity then.
/// Failing allocations timed in each full arena of the fill table.
const FULL_FAILURES: usize = 100;
/// Their size: the largest of the churn, which a full arena of small blocks holds nowhere.
const FULL_FAILURE_SIZE: usize = 1 << 20;

/// Fill the arena with seeded sizes from `lo` to `hi`, no frees, until the first failure.
/// Returns requested / capacity then, and the latencies (ns) of [`FULL_FAILURES`] allocations
/// of [`FULL_FAILURE_SIZE`] in the full arena that failed (fewer if some did not).
fn fill(p: &dyn Peer, lo: usize, hi: usize, seed: u64) -> Filled {
    let mut rng = Rng::new(seed);
    fill_with(p, &mut || rng.size(lo, hi))
}

/// Fixed mixes: a few shapes each, as a runtime with fixed tensor shapes allocates.
const FIXED_MIXES: [&[usize]; 7] = [
    &[256, 3000, 4096, 70_000],
    &[70_000],
    &[100_000],
    &[1000, 12_288],
    &[5000, 200_000],
    &[300_000, (1 << 20) + 1],
    &[140, 172, 4808, 109_006, 727_288],
];

/// Each size one of `mix`, equally likely, from a generator seeded with `seed`.
fn mix_sizes(mix: &[usize], seed: u64) -> impl FnMut() -> usize + '_ {
    let mut rng = Rng::new(seed);
    move || mix[(rng.next_u64() % mix.len() as u64) as usize]
}

/// What a fill measured.
struct Filled {
    /// Requested bytes at the first failure, as a share of the arena.
    share: f64,
    /// The time the first failing allocation took (the fill's own, of its random size), ns.
    first_failure_ns: f64,
    /// The times of [`FULL_FAILURES`] allocations of [`FULL_FAILURE_SIZE`] after it that failed,
    /// ns ([`failures_then_free`]).
    failures: Vec<f64>,
}

/// [`fill`] with the sizes `next_size` gives.
fn fill_with(p: &dyn Peer, next_size: &mut dyn FnMut() -> usize) -> Filled {
    let mut held = Vec::new();
    let mut requested = 0usize;
    let first_failure_ns = fill_until_failure(p, &mut held, next_size, &mut |size| requested += size);
    Filled { share: requested as f64 / ARENA as f64, first_failure_ns, failures: failures_then_free(p, held) }
}

/// Allocate the sizes `next_size` gives into `held` (telling `placed` each size placed) until
/// one fails; returns the time that failing allocation took, ns.
fn fill_until_failure(
    p: &dyn Peer,
    held: &mut Vec<(u128, usize)>,
    next_size: &mut dyn FnMut() -> usize,
    placed: &mut dyn FnMut(usize),
) -> f64 {
    let clock = TickClock::start();
    loop {
        let size = next_size();
        let t0 = ticks();
        match p.alloc_any(size) {
            Some(t) => {
                held.push((t, size));
                placed(size);
            }
            None => {
                let took = ticks() - t0;
                return took as f64 * clock.ns_per_tick();
            }
        }
    }
}

/// Time [`FULL_FAILURES`] allocations of [`FULL_FAILURE_SIZE`] in a full arena (ns, those that
/// failed; one that does not is kept), then free everything `held` holds.
fn failures_then_free(p: &dyn Peer, mut held: Vec<(u128, usize)>) -> Vec<f64> {
    let clock = TickClock::start();
    let mut failed = Vec::new();
    for _ in 0..FULL_FAILURES {
        let t0 = ticks();
        match p.alloc_any(FULL_FAILURE_SIZE) {
            Some(t) => held.push((t, FULL_FAILURE_SIZE)),
            None => failed.push(ticks() - t0),
        }
    }
    let ns_per_tick = clock.ns_per_tick();
    for (t, size) in held {
        p.free_any(t, size);
    }
    failed.into_iter().map(|t| t as f64 * ns_per_tick).collect()
}

/// Fill the arena with 64 B-4 KiB, free every other block, fill again with 64-512 B until the
/// first failure (slabs of every small class, most of them partial), then time
/// [`FULL_FAILURES`] allocations of [`FULL_FAILURE_SIZE`] that fail: the time of the refill's
/// own failing allocation, and those (ns).
fn fragmented_failures(p: &dyn Peer, seed: u64) -> (f64, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let mut held = Vec::new();
    let mut refill = |held: &mut Vec<(u128, usize)>, lo: usize, hi: usize| {
        fill_until_failure(p, held, &mut || rng.size(lo, hi), &mut |_| {})
    };
    refill(&mut held, 64, 4 << 10);
    let mut kept = Vec::new();
    for (i, (t, size)) in held.drain(..).enumerate() {
        if i % 2 == 0 {
            p.free_any(t, size);
        } else {
            kept.push((t, size));
        }
    }
    let first_failure_ns = refill(&mut kept, 64, 512);
    (first_failure_ns, failures_then_free(p, kept))
}

/// `median / max` of latencies in ns, in us (`-` when there are none).
fn median_and_max_us(mut ns: Vec<f64>) -> String {
    if ns.is_empty() {
        return "-".to_string();
    }
    let max = ns.iter().cloned().fold(f64::NAN, f64::max) / 1e3;
    format!("{} / {}", fmt_ns(median(&mut ns) / 1e3), fmt_ns(max))
}

fn fill_table(o: &Options) {
    let bands = [(64usize, 4 << 10), (4 << 10, 64 << 10), (64 << 10, 1 << 20), (1 << 20, 8 << 20), (64, 8 << 20)];
    println!("\n### Fill: random sizes, no frees, requested / capacity at the first failure\n");
    println!("| | 64 B-4 KiB | 4-64 KiB | 64 KiB-1 MiB | 1-8 MiB | 64 B-8 MiB |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut failing = Vec::new();
    for name in o.peers() {
        let mut cells = Vec::new();
        let (mut latencies, mut firsts) = (Vec::new(), Vec::new());
        for (lo, hi) in bands {
            let filled = with_peer(name, &mut |p| fill(p, lo, hi, o.seed.unwrap_or(3)));
            cells.push(format!("{:.3}", filled.share));
            latencies.push(median_and_max_us(filled.failures));
            firsts.push(fmt_ns(filled.first_failure_ns / 1e3));
        }
        let (first, failed) = with_peer(name, &mut |p| fragmented_failures(p, o.seed.unwrap_or(3)));
        latencies.push(median_and_max_us(failed));
        firsts.push(fmt_ns(first / 1e3));
        println!("| {name} | {} |", cells.join(" | "));
        failing.push(format!("| {name} | {} |", latencies.join(" | ")));
        failing.push(format!("| {name}, the fill's own first failure | {} |", firsts.join(" | ")));
    }
    if o.peer.as_deref().is_none_or(|p| p == "npumem") {
        let cells: Vec<String> = bands
            .iter()
            .map(|&(lo, hi)| bank_rule_bound(lo, hi, o.seed.unwrap_or(3)).map_or("-".into(), |b| format!("{b:.3}")))
            .collect();
        println!("| bound under the bank rule, with per-class slabs | {} |", cells.join(" | "));
        let cells: Vec<String> = bands
            .iter()
            .map(|&(lo, hi)| shared_banks_fill(lo, hi, o.seed.unwrap_or(3)).map_or("-".into(), |b| format!("{b:.3}")))
            .collect();
        println!("| best fit over banks that blocks of every size share | {} |", cells.join(" | "));
        println!(
            "\n(The bound: the same sequence, each block of more than a 4 KiB bank taking whole banks (it \
             starts on a bank boundary and no smaller block shares its last bank in these bands), each of \
             at most a bank taking its share of a bank tiled by its default slab class; no allocator that \
             keeps the bank rule and per-class slabs can pass it. Not given for the mixed band, where small \
             blocks could fill the rest of a large block's last bank. The row below it: the same \
             sequence of blocks of at most a bank, each rounded up to the 64 B alignment and appended \
             best fit in the bank with the least room that holds it, blocks of every size sharing a bank; \
             the bank rule itself allows that much.)"
        );
    }
    println!(
        "\n### Fill with fixed mixes: each size of the mix equally likely, requested / capacity at the first failure\n"
    );
    let heads: Vec<String> = FIXED_MIXES.iter().map(|m| format!("{m:?}")).collect();
    println!("| | {} |", heads.join(" | "));
    println!("|---|{}", "---:|".repeat(FIXED_MIXES.len()));
    let seed = o.seed.unwrap_or(3);
    for name in o.peers() {
        let cells: Vec<String> = FIXED_MIXES
            .iter()
            .map(|m| format!("{:.3}", with_peer(name, &mut |p| fill_with(p, &mut mix_sizes(m, seed)).share)))
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    if o.peer.as_deref().is_none_or(|p| p == "npumem") {
        let bank = PoolConfig::new(ARENA).bank_size;
        let cells: Vec<String> = FIXED_MIXES
            .iter()
            .map(|m| match m.iter().all(|&s| s > bank) || m.iter().all(|&s| s <= bank) {
                true => format!("{:.3}", bank_rule_bound_of(&mut mix_sizes(m, seed))),
                false => "-".into(),
            })
            .collect();
        println!("| bound under the bank rule, with per-class slabs | {} |", cells.join(" | "));
    }
    println!(
        "\n### Failing allocations in the full arena: {FULL_FAILURES} allocations of {} MiB after each fill, \
         us, median / max; and the fill's own failing allocation (of its random size), us\n",
        FULL_FAILURE_SIZE >> 20
    );
    println!("| | 64 B-4 KiB | 4-64 KiB | 64 KiB-1 MiB | 1-8 MiB | 64 B-8 MiB | 64 B-4 KiB, half freed, refilled with 64-512 B |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for row in failing {
        println!("{row}");
    }
}

/// Sizes 1 B-64 MiB: 16 per doubling, each power of two and its neighbours, each slab class of
/// npumem's default configuration and its neighbours, and chunk multiples and their neighbours.
fn waste_sizes() -> Vec<usize> {
    let mut sizes = Vec::new();
    let max = 64usize << 20;
    let mut x = 1.0f64;
    while x <= max as f64 {
        sizes.push(x as usize);
        x *= 2f64.powf(1.0 / 16.0);
    }
    let mut p = 1usize;
    while p <= max {
        sizes.extend([p - 1, p, p + 1, p + p / 2]);
        p *= 2;
    }
    let config = PoolConfig::new(ARENA);
    for &c in &config.slab_sizes {
        sizes.extend([c - 1, c, c + 1]);
    }
    let chunk = config.chunk_size;
    for k in 1..=32 {
        sizes.extend([k * chunk - 1, k * chunk, k * chunk + 1, k * chunk + chunk / 2 + 5]);
    }
    sizes.retain(|&s| (1..=max).contains(&s));
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Reserved bytes of one block of `size` on a fresh allocator of `name`, or `None` if refused.
fn reserved_of(name: &str, pools: &WastePools, size: usize) -> Option<usize> {
    match name {
        "npumem" | "mutex-tree" => {
            let pool = if name == "npumem" { &pools.npumem } else { &pools.tree };
            let h = pool.alloc(size, None, 0).ok()?;
            let bytes = pool.block(h).expect("live").block_bytes;
            pool.free(h).expect("valid free");
            Some(bytes)
        }
        "offset-allocator" => pools.offset.reserved(size),
        "rlsf" => pools.rlsf.reserved(size),
        "buddy_system_allocator" => Some(size.div_ceil(UNIT).next_power_of_two() * UNIT),
        _ => unreachable!(),
    }
}

struct WastePools {
    npumem: Pool,
    tree: Pool,
    offset: OffsetAlloc,
    rlsf: &'static RlsfHeap,
}

fn waste_table(o: &Options) {
    let sizes = waste_sizes();
    let config = || PoolConfig::new(ARENA).cores(2).backing(Backing::None);
    let pools = WastePools {
        npumem: Pool::new(config()).expect("config"),
        tree: Pool::new(config().cores(1).slab_sizes(Vec::new())).expect("config"),
        offset: OffsetAlloc::new(),
        rlsf: rlsf_heap(),
    };
    println!("\n### Waste: reserved / requested, worst case ({} sizes from 1 B to 64 MiB)\n", sizes.len());
    println!("| | 1-63 B | 64 B-4 KiB | 4 KiB-64 MiB | worst size >= 4 KiB |");
    println!("|---|---:|---:|---:|---:|");
    for name in o.peers() {
        let mut worst = [(0.0f64, 0usize); 3];
        for &s in &sizes {
            let Some(r) = reserved_of(name, &pools, s) else { continue };
            let range = if s < 64 {
                0
            } else if s < 4096 {
                1
            } else {
                2
            };
            let ratio = r as f64 / s as f64;
            if ratio > worst[range].0 {
                worst[range] = (ratio, s);
            }
        }
        println!("| {name} | {:.2} | {:.3} | {:.3} | {} B |", worst[0].0, worst[1].0, worst[2].0, worst[2].1);
    }
    println!("\n(npumem and mutex-tree: `BlockInfo::block_bytes`; offset-allocator: its bin size; rlsf: the distance to the next block, header included; buddy_system_allocator: its power of two of 256-byte frames.)");
}

fn main() {
    let o = options();
    let wants = |t: &str| o.only.as_deref().is_none_or(|only| only == t);
    let start = Instant::now();
    println!("Arena 1 GiB; npumem: raw offset API, backing none, 2 core pools (the threads table: one per thread), default classes.");
    if wants("churn") {
        churn_tables(&o);
    }
    if wants("threads") {
        threads_table(&o);
    }
    if wants("pairs") {
        pairs_table(&o);
    }
    if wants("fill") {
        fill_table(&o);
    }
    if wants("waste") {
        waste_table(&o);
    }
    let took: Duration = start.elapsed();
    println!("\n({:.0} s)", took.as_secs_f64());
}

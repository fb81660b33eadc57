//! The host memory a compaction takes stays below `Pool::compaction_host_bytes`, the bound that
//! `plan_compaction`, `stage_compaction` and `compact_step` ask the host for before they start:
//! the bytes the calling thread allocates are counted (a counting global allocator, per thread)
//! on pools of many shapes (capacities from 16 MiB to 64 GiB, one to four cores, slab objects,
//! buddy blocks and runs, sparse and dense), and their peak during each call is compared with
//! the bound read just before it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use npumem_core::{Backing, CompactionMode, Pool, PoolConfig};

/// The system allocator, counting the bytes each thread holds and their peak.
struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// A size not counted: the probe of `compaction_host_bytes` bytes that each call makes and
    /// gives back before it plans (the bound itself, not what the planning holds).
    static PROBE: Cell<usize> = const { Cell::new(0) };
}

fn count(size: usize, sign: isize) {
    if PROBE.try_with(Cell::get) == Ok(size) {
        return;
    }
    let delta = size as isize * sign;
    // `try_with`: a thread's last frees may come after its thread-locals are gone.
    let _ = HELD.try_with(|held| {
        held.set(held.get() + delta);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(held.get())));
    });
}

// SAFETY: every call is passed to the system allocator unchanged; the counting only reads
// sizes and touches const-initialized thread-locals (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), 1);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), 1);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(layout.size(), -1);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as both blocks at once: a move to a new place holds both for a moment.
        count(new_size, 1);
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        count(layout.size(), -1);
        moved
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// The most bytes the calling thread held at once during `f`, over what it held before.
/// The most bytes the calling thread held at once during `f`, over what it held before, not
/// counting allocations of `probe` bytes.
fn peak_during<R>(probe: usize, f: impl FnOnce() -> R) -> (R, usize) {
    PROBE.with(|p| p.set(probe));
    let before = HELD.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let out = f();
    PROBE.with(|p| p.set(0));
    (out, (PEAK.with(Cell::get) - before).max(0) as usize)
}

/// A generator of sizes (xorshift), seeded.
struct Sizes(u64);

impl Sizes {
    fn next(&mut self, mix: &[usize]) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        mix[(self.0 % mix.len() as u64) as usize]
    }
}

/// A pool of `capacity` bytes and `cores` cores holding up to `blocks` blocks of `mix`, every
/// `keep`th one kept and the others freed.
fn fragmented(capacity: usize, cores: usize, mix: &[usize], blocks: usize, keep: usize, seed: u64) -> Pool {
    let pool = Pool::new(PoolConfig::new(capacity).cores(cores).backing(Backing::None)).unwrap();
    let mut sizes = Sizes(seed);
    let made: Vec<_> = (0..blocks).filter_map(|_| pool.alloc(sizes.next(mix), None, 0).ok()).collect();
    for (i, &h) in made.iter().enumerate() {
        if i % keep != 0 {
            pool.free(h).unwrap();
        }
    }
    pool
}

/// Each planning call's peak against the bound read before it.
fn within_bound(name: &str, pool: &Pool) {
    let wait = Duration::from_secs(5);
    let bound = pool.compaction_host_bytes();
    let (_, plan) = peak_during(bound, || pool.plan_compaction(None, &CompactionMode::Full).unwrap());
    let (_, stage) = peak_during(bound, || pool.stage_compaction(&CompactionMode::Full, false).unwrap());
    let (_, step) = peak_during(bound, || {
        let token = pool.pause(wait).unwrap();
        let done = pool.compact_step(&token, &CompactionMode::Full, None).unwrap();
        pool.resume(&token).unwrap();
        done
    });
    for (call, peak) in [("plan_compaction", plan), ("stage_compaction", stage), ("compact_step", step)] {
        assert!(peak <= bound, "{name}: {call} held {peak} bytes at once, over the bound of {bound}");
    }
    pool.check().unwrap();
}

const MIB: usize = 1 << 20;
const MIXED: [usize; 7] = [64, 256, 900, 3000, 5000, 70_000, 200_000];
const SMALL: [usize; 4] = [64, 100, 200, 500];
const LARGE: [usize; 4] = [300_000, MIB + 1, 3 * MIB, 9 * MIB];

/// A named pool: capacity, cores, the sizes, how many blocks, one in how many kept.
type Shape = (&'static str, usize, usize, &'static [usize], usize, usize);

#[test]
fn a_compaction_holds_no_more_host_memory_than_its_bound() {
    let shapes: [Shape; 8] = [
        ("empty 16 MiB", 16 * MIB, 1, &MIXED, 0, 1),
        ("mixed 1 GiB, half freed", 1 << 30, 2, &MIXED, 20_000, 2),
        ("mixed 1 GiB, four cores, a tenth kept", 1 << 30, 4, &MIXED, 40_000, 10),
        ("slab objects, one in 97 kept", 1 << 30, 2, &SMALL, 400_000, 97),
        ("slab objects, all kept", 256 * MIB, 1, &SMALL, 200_000, 1),
        ("runs and large blocks, a third kept", 4 << 30, 2, &LARGE, 2_000, 3),
        ("sparse 64 GiB", 64 << 30, 2, &MIXED, 10_000, 2),
        ("tiny 16 MiB, dense", 16 * MIB, 1, &MIXED, 2_000, 2),
    ];
    for (seed, (name, capacity, cores, mix, blocks, keep)) in shapes.into_iter().enumerate() {
        let pool = fragmented(capacity, cores, mix, blocks, keep, seed as u64 + 1);
        within_bound(name, &pool);
    }
    // Shapes drawn at random: capacity, cores, sizes, how many blocks and how many kept.
    let mut draw = Sizes(0x5eed);
    let all = [64, 200, 900, 3000, 5000, 20_000, 70_000, 300_000, MIB + 1, 3 * MIB];
    for round in 0..6 {
        let capacity = draw.next(&[64 * MIB, 512 * MIB, 2 << 30]);
        let cores = draw.next(&[1, 2, 3, 4]);
        let mix: Vec<usize> = (0..3).map(|_| draw.next(&all)).collect();
        let blocks = draw.next(&[1_000, 10_000, 50_000]);
        let keep = draw.next(&[1, 2, 3, 5, 20]);
        let pool = fragmented(capacity, cores, &mix, blocks, keep, round + 100);
        let name = format!("{capacity} bytes, {cores} cores, sizes {mix:?}, {blocks} blocks, one in {keep} kept");
        within_bound(&name, &pool);
    }
}

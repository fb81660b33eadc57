//! The allocators the benches compare, behind one small trait, and the workloads they run.
//!
//! Every peer manages the same arena in 256-byte units and hands out offsets; none touches the
//! bytes (npumem's device use case), so the benches measure bookkeeping only.

pub mod cli;

use std::cell::Cell;
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Barrier, Mutex};
use std::time::{Duration, Instant};

use branch_allocator::BranchAllocator;
use buddy_system_allocator::FrameAllocator;
use npumem_core::{Backing, Handle, Pool, PoolConfig};

/// Bytes per unit for the peers that count units (frames, leaves).
pub const UNIT: usize = 256;

/// An allocator under test: it hands out tokens for blocks of at least `size` bytes.
pub trait Allocator: Sync {
    /// What `alloc` returns and `free` takes back.
    type Token: Copy + Send;
    /// A short name for reports.
    fn name(&self) -> &'static str;
    /// A block of at least `size` bytes, or `None` when full.
    fn alloc(&self, size: usize) -> Option<Self::Token>;
    /// Give a block back (`size` as allocated).
    fn free(&self, token: Self::Token, size: usize);
}

fn config(capacity: usize, cores: usize) -> PoolConfig {
    PoolConfig::new(capacity).cores(cores).backing(Backing::None)
}

/// npumem's offset API with its default size classes: slab caches up to 4 KiB, per-core
/// lock-free buddy pools above, no handles.
pub struct NpumemRaw(pub Pool);

impl NpumemRaw {
    pub fn new(capacity: usize, cores: usize) -> Self {
        NpumemRaw(Pool::new(config(capacity, cores)).expect("valid config"))
    }
}

impl Allocator for NpumemRaw {
    type Token = usize;
    fn name(&self) -> &'static str {
        "npumem"
    }
    #[inline]
    fn alloc(&self, size: usize) -> Option<usize> {
        self.0.alloc_raw(size, None).ok()
    }
    #[inline]
    fn free(&self, offset: usize, size: usize) {
        self.0.free_raw(offset, size).expect("valid free");
    }
}

/// npumem's buddy path alone (no slab classes): every size goes to the per-core buddy trees.
pub struct NpumemBuddy(pub Pool);

impl NpumemBuddy {
    pub fn new(capacity: usize, cores: usize) -> Self {
        NpumemBuddy(Pool::new(config(capacity, cores).slab_sizes(Vec::new())).expect("valid config"))
    }
}

impl Allocator for NpumemBuddy {
    type Token = usize;
    fn name(&self) -> &'static str {
        "npumem-buddy"
    }
    #[inline]
    fn alloc(&self, size: usize) -> Option<usize> {
        self.0.alloc_raw(size, None).ok()
    }
    #[inline]
    fn free(&self, offset: usize, size: usize) {
        self.0.free_raw(offset, size).expect("valid free");
    }
}

/// glibc's `malloc`/`free` of the same sizes (host memory; the everyday reference).
pub struct Glibc;

impl Allocator for Glibc {
    type Token = usize;
    fn name(&self) -> &'static str {
        "glibc-malloc"
    }
    #[inline]
    fn alloc(&self, size: usize) -> Option<usize> {
        // SAFETY: malloc has no preconditions; a null result is reported as `None`.
        let p = unsafe { libc::malloc(size) };
        (!p.is_null()).then_some(p as usize)
    }
    #[inline]
    fn free(&self, ptr: usize, _size: usize) {
        // SAFETY: `ptr` came from `malloc` above and is freed once.
        unsafe { libc::free(ptr as *mut libc::c_void) };
    }
}

/// `sharded-slab` storing `()` values (its insert/remove is the slot bookkeeping alone).
pub struct ShardedSlab(pub sharded_slab::Slab<()>);

impl ShardedSlab {
    pub fn new() -> Self {
        ShardedSlab(sharded_slab::Slab::new())
    }
}

impl Default for ShardedSlab {
    fn default() -> Self {
        Self::new()
    }
}

impl Allocator for ShardedSlab {
    type Token = usize;
    fn name(&self) -> &'static str {
        "sharded-slab"
    }
    #[inline]
    fn alloc(&self, _size: usize) -> Option<usize> {
        self.0.insert(())
    }
    #[inline]
    fn free(&self, key: usize, _size: usize) {
        self.0.remove(key);
    }
}

/// npumem with generation-checked handles (what Python uses).
pub struct NpumemHandles(pub Pool);

impl NpumemHandles {
    pub fn new(capacity: usize, cores: usize) -> Self {
        NpumemHandles(Pool::new(config(capacity, cores)).expect("valid config"))
    }
}

impl Allocator for NpumemHandles {
    type Token = Handle;
    fn name(&self) -> &'static str {
        "npumem-handles"
    }
    #[inline]
    fn alloc(&self, size: usize) -> Option<Handle> {
        self.0.alloc(size, None, 0).ok()
    }
    #[inline]
    fn free(&self, handle: Handle, _size: usize) {
        self.0.free(handle).expect("valid free");
    }
}

/// The same npumem buddy structure (slab classes off) with one core pool behind one `Mutex`:
/// the single-lock design the seed articles measured.
pub struct MutexTree {
    lock: Mutex<()>,
    pool: Pool,
}

impl MutexTree {
    pub fn new(capacity: usize) -> Self {
        MutexTree {
            lock: Mutex::new(()),
            pool: Pool::new(config(capacity, 1).slab_sizes(Vec::new())).expect("valid config"),
        }
    }
}

impl Allocator for MutexTree {
    type Token = usize;
    fn name(&self) -> &'static str {
        "mutex-tree"
    }
    #[inline]
    fn alloc(&self, size: usize) -> Option<usize> {
        let _guard = self.lock.lock().unwrap();
        self.pool.alloc_raw(size, None).ok()
    }
    #[inline]
    fn free(&self, offset: usize, size: usize) {
        let _guard = self.lock.lock().unwrap();
        self.pool.free_raw(offset, size).expect("valid free");
    }
}

/// `buddy_system_allocator::FrameAllocator` (free lists in B-trees) behind a `Mutex`.
pub struct LockedFrames(Mutex<FrameAllocator<33>>);

impl LockedFrames {
    pub fn new(capacity: usize) -> Self {
        let mut frames = FrameAllocator::<33>::new();
        frames.add_frame(0, capacity / UNIT);
        LockedFrames(Mutex::new(frames))
    }
}

impl Allocator for LockedFrames {
    type Token = usize;
    fn name(&self) -> &'static str {
        "buddy_system_allocator"
    }
    #[inline]
    fn alloc(&self, size: usize) -> Option<usize> {
        self.0.lock().unwrap().alloc(size.div_ceil(UNIT)).map(|frame| frame * UNIT)
    }
    #[inline]
    fn free(&self, offset: usize, size: usize) {
        self.0.lock().unwrap().dealloc(offset / UNIT, size.div_ceil(UNIT));
    }
}

thread_local! {
    static BRANCH_CURSOR: Cell<usize> = const { Cell::new(0) };
}

/// `branch_allocator` (a published port of the lock-free bunch allocator). It leaves the search
/// to its caller; this wrapper scans aligned indices from a per-thread cursor, as its README
/// suggests.
pub struct Branch {
    tree: BranchAllocator<'static>,
    order: usize,
}

impl Branch {
    pub fn new(capacity: usize) -> Self {
        let order = (capacity / UNIT).trailing_zeros() as usize;
        let storage: &'static [AtomicU64] =
            Box::leak((0..BranchAllocator::required(order)).map(|_| AtomicU64::new(0)).collect());
        Branch { tree: BranchAllocator::new(storage, order).expect("enough storage"), order }
    }
}

impl Allocator for Branch {
    type Token = usize;
    fn name(&self) -> &'static str {
        "branch_allocator"
    }
    #[inline]
    fn alloc(&self, size: usize) -> Option<usize> {
        let order = size.div_ceil(UNIT).next_power_of_two().trailing_zeros() as usize;
        let blocks = 1usize << (self.order - order);
        BRANCH_CURSOR.with(|cursor| {
            let start = cursor.get() % blocks;
            for i in 0..blocks {
                let block = (start + i) % blocks;
                if self.tree.try_allocate(block << order, order).is_some() {
                    cursor.set(block);
                    return Some((block << order) * UNIT);
                }
            }
            None
        })
    }
    #[inline]
    fn free(&self, offset: usize, size: usize) {
        let order = size.div_ceil(UNIT).next_power_of_two().trailing_zeros() as usize;
        self.tree.deallocate(offset / UNIT, order).expect("valid free");
    }
}

/// Pin the calling thread to the `i`-th CPU this process may run on (modulo their number), so a
/// run of N threads really uses N CPUs: on a small VM the scheduler often leaves two busy
/// threads stacked on one CPU for a whole short run, which measures the scheduler, not the
/// allocator. Does nothing where the affinity cannot be read or set.
pub fn pin_to_cpu(i: usize) {
    // SAFETY: cpu_set_t is plain data, zero is a valid empty set; the calls get its size.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) != 0 {
            return;
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &allowed)).collect();
        if cpus.is_empty() {
            return;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus[i % cpus.len()], &mut one);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one);
    }
}

/// Run `work(t)` on `threads` threads, thread `t` pinned to CPU `t`; the wall time from their
/// common start to the last one's end.
pub fn timed_threads(threads: usize, work: impl Fn(usize) + Sync) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, work) = (&barrier, &work);
            s.spawn(move || {
                pin_to_cpu(t);
                barrier.wait();
                work(t);
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

/// `pairs` allocations cycling through `sizes` (thread `t` starts at `sizes[t]`), each freed in
/// a batch of eight: the per-thread work of the `threads/N` groups. The batch lives on the
/// stack: a heap buffer of one thread next to another's would put the harness itself in the
/// way (false sharing).
pub fn churn<A: Allocator>(a: &A, sizes: &[usize], t: usize, pairs: usize) {
    let mut held: [Option<(A::Token, usize)>; 8] = [None; 8];
    for i in 0..pairs {
        let size = sizes[(i + t) % sizes.len()];
        held[i % 8] = Some((a.alloc(size).expect("room"), size));
        if i % 8 == 7 {
            for (token, size) in held.iter_mut().filter_map(Option::take) {
                a.free(token, size);
            }
        }
    }
    for (token, size) in held.iter_mut().filter_map(Option::take) {
        a.free(token, size);
    }
}

/// One thread (on CPU 0) allocates `blocks` blocks of `size` bytes and sends them, 256 at a
/// time, to another (on CPU 1) that frees them: every free is remote. The wall time of it all.
pub fn producer_consumer<A: Allocator>(a: &A, size: usize, blocks: usize) -> Duration {
    let (tx, rx) = mpsc::sync_channel::<Vec<A::Token>>(16);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            pin_to_cpu(1);
            for batch in rx {
                for token in batch {
                    a.free(token, size);
                }
            }
        });
        s.spawn(move || {
            pin_to_cpu(0);
            let mut left = blocks;
            while left > 0 {
                let n = left.min(256);
                let batch: Vec<A::Token> = (0..n).map(|_| a.alloc(size).expect("room")).collect();
                tx.send(batch).expect("consumer alive");
                left -= n;
            }
        });
    });
    start.elapsed()
}

/// A small deterministic generator (xorshift), so workloads are the same for every peer.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A size between `lo` and `hi` bytes, log-uniform (as real tensor sizes are).
    pub fn size(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((a + (b - a) * u).exp() as usize).clamp(lo, hi)
    }
}

/// A time stamp: the CPU's time stamp counter on x86-64 (constant rate on the machines these
/// benches run on; about 10 ns to read, where `Instant::now` costs about 25), nanoseconds
/// since the first call elsewhere. [`TickClock`] converts.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// The rate of [`ticks`], measured against `Instant` over the span it is used in.
pub struct TickClock {
    instant: Instant,
    ticks: u64,
}

impl TickClock {
    pub fn start() -> TickClock {
        TickClock { instant: Instant::now(), ticks: ticks() }
    }

    /// Nanoseconds per tick since [`TickClock::start`] (1 when no tick has passed).
    pub fn ns_per_tick(&self) -> f64 {
        let ticks = ticks().wrapping_sub(self.ticks);
        if ticks == 0 {
            return 1.0;
        }
        self.instant.elapsed().as_nanos() as f64 / ticks as f64
    }
}

/// Fill `alloc` to `occupancy` of `capacity` with random sizes in `[lo, hi]`; returns the blocks.
pub fn prefill<A: Allocator>(
    a: &A,
    rng: &mut Rng,
    capacity: usize,
    occupancy: f64,
    lo: usize,
    hi: usize,
) -> Vec<(A::Token, usize)> {
    let mut held = Vec::new();
    let mut bytes = 0usize;
    while (bytes as f64) < occupancy * capacity as f64 {
        let size = rng.size(lo, hi);
        match a.alloc(size) {
            Some(t) => {
                held.push((t, size));
                bytes += size;
            }
            None => break,
        }
    }
    held
}

/// One step of the random-size workload: free a random held block and allocate a new size in
/// `[lo, hi]` in its place (the slot is dropped when that fails). Returns whether it succeeded.
pub fn replace_random<A: Allocator>(
    a: &A,
    rng: &mut Rng,
    held: &mut Vec<(A::Token, usize)>,
    lo: usize,
    hi: usize,
) -> bool {
    let i = (rng.next_u64() as usize) % held.len();
    let (token, size) = held[i];
    a.free(token, size);
    let size = rng.size(lo, hi);
    match a.alloc(size) {
        Some(token) => {
            held[i] = (token, size);
            true
        }
        None => {
            held.swap_remove(i);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<A: Allocator>(a: &A) {
        let mut held = Vec::new();
        for size in [256, 4096, 65536, 1 << 20, 300, 5000] {
            held.push((a.alloc(size).expect("room"), size));
        }
        for (t, size) in held {
            a.free(t, size);
        }
    }

    #[test]
    fn every_peer_allocates_and_frees() {
        round_trip(&NpumemRaw::new(64 << 20, 2));
        round_trip(&NpumemBuddy::new(64 << 20, 2));
        round_trip(&Glibc);
        round_trip(&ShardedSlab::new());
        round_trip(&NpumemHandles::new(64 << 20, 2));
        round_trip(&MutexTree::new(64 << 20));
        round_trip(&LockedFrames::new(64 << 20));
        round_trip(&Branch::new(64 << 20));
    }
}

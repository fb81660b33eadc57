//! The multi-threaded stress test: mixed sizes, remote frees, pattern fill, and an overlap
//! oracle that checks every live block against every other.
//!
//! The oracle is an occupancy bitmap with one bit per byte of the arena. Registering a block
//! sets its bits with `fetch_or` and fails if any was already set; so any two live blocks that
//! share a byte are caught, whichever threads hold them, without a lock that would serialize
//! the threads (a shared ordered map behind a mutex made 32 threads on 2 cores measure the
//! mutex, not the pool).
#![cfg(not(loom))]

mod common;

use common::occupancy::Occupancy;
use npumem_core::{Handle, Pool, PoolConfig};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

const MIB: usize = 1 << 20;

/// A knob of the stress test from the environment, or its CI default.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn occupancy_catches_every_overlap_and_nothing_else() {
    for (off, len) in [(0, 1), (63, 2), (100, 1), (263, 1), (1263, 5), (10, 3000)] {
        let o = Occupancy::new(4096);
        for (a, n) in [(0, 1), (1, 63), (64, 200), (264, 1000)] {
            o.claim(a, n).unwrap();
        }
        assert!(o.claim(off, len).is_err(), "[{off}, +{len}) overlaps and must be refused");
    }
    let o = Occupancy::new(4096);
    o.claim(1264, 2832).unwrap();
    o.claim(0, 100).unwrap();
    o.release(0, 100).unwrap();
    o.release(1264, 2832).unwrap();
    assert!(o.is_empty());
    o.claim(5, 3).unwrap();
    assert!(o.release(4, 3).is_err(), "byte 4 was never claimed");
}

/// Blocks handed on to one thread, which frees them there (remote frees). Bounded: a thread
/// that the scheduler keeps off the CPU drains nothing while its neighbour goes on handing
/// blocks to it, and an unbounded mailbox then grows until the live set fills the arena (32
/// threads on 2 cores: 44,650 blocks, 240 MB of 256 MiB, waiting in mailboxes), so the
/// allocations that fail measure the scheduler, not the pool. A full mailbox refuses the
/// block, which stays in its sender's slot.
struct Mailbox {
    items: Mutex<Vec<(Handle, u8)>>,
    capacity: usize,
}

impl Mailbox {
    fn new(capacity: usize) -> Mailbox {
        Mailbox { items: Mutex::default(), capacity }
    }

    /// Hand `item` on; it comes back when the mailbox is full.
    fn offer(&self, item: (Handle, u8)) -> Option<(Handle, u8)> {
        let mut items = self.items.lock().unwrap();
        if items.len() >= self.capacity {
            return Some(item);
        }
        items.push(item);
        None
    }

    fn take_all(&self) -> Vec<(Handle, u8)> {
        std::mem::take(&mut *self.items.lock().unwrap())
    }
}

#[test]
fn a_full_mailbox_gives_the_block_back() {
    let p = Pool::new(PoolConfig::new(16 * MIB)).unwrap();
    let (a, b) = (p.alloc(64, None, 0).unwrap(), p.alloc(64, None, 0).unwrap());
    let mailbox = Mailbox::new(1);
    assert!(mailbox.offer((a, 1)).is_none());
    assert_eq!(mailbox.offer((b, 2)), Some((b, 2)), "a full mailbox refuses");
    assert_eq!(mailbox.take_all(), vec![(a, 1)]);
    assert!(mailbox.offer((b, 2)).is_none(), "a drained mailbox takes blocks again");
}

/// The scale of one stress run.
#[derive(Debug, Clone, Copy)]
struct Scale {
    threads: usize,
    /// Operations per thread, half of them allocations.
    ops: usize,
    /// Live blocks per thread in its slots (and four times as many in its mailbox at most).
    slots: usize,
    max_size: usize,
    capacity: usize,
}

impl Scale {
    /// Blocks a mailbox holds at most: a few slots' worth, so that most hand-overs find room
    /// while a receiver is off the CPU, and the live set stays far below the arena
    /// (`make stress`: 32 threads x (64 + 256) blocks of at most 8 KiB, 80 MiB of 256).
    fn mailbox(&self) -> usize {
        4 * self.slots
    }
}

/// What the threads of one stress run share: the pool, the occupancy oracle, the mailboxes and
/// the counters.
struct Run {
    scale: Scale,
    pool: Pool,
    live: Occupancy,
    mailboxes: Vec<Mailbox>,
    allocations: AtomicU64,
    /// Allocations that failed for want of space.
    failures: AtomicU64,
    /// Of those, the small ones (at most a sixteenth of a chunk) that came while the live set
    /// and the request together were at most half the arena all through the failing call (the
    /// first is described in `starved_example`): the pool had room and must not fail them. (A
    /// larger request may fail below half the arena when no run of whole chunks is free,
    /// however many bytes are.)
    starved: AtomicU64,
    starved_example: Mutex<Option<String>>,
    /// Bytes of the blocks registered live (block sizes), and their peak. An allocation counts
    /// an upper bound of its block's bytes before it calls the pool ([`Run::reserve`]) and
    /// corrects it after, and a free counts its bytes out after the pool has them back, so
    /// this is never less than what the pool holds for the test's blocks (the peak counts the
    /// bounds of allocations in flight in other threads too).
    live_bytes: AtomicUsize,
    /// The sum of those upper bounds over every allocation so far: the live set can grow during
    /// a call by at most this count's growth over the call.
    reserved_bytes: AtomicUsize,
    peak_live_bytes: AtomicUsize,
    verified: AtomicU64,
    /// Blocks that stayed with their sender because the receiver's mailbox was full.
    kept: AtomicU64,
    /// Blocks freed by a thread other than the one that allocated them (from a mailbox).
    remote_frees: AtomicU64,
    /// Blocks placed with a front: from inside a chunk past its end (`arena/front.rs`).
    fronted: AtomicU64,
    /// Of those, blocks of at most half a chunk: across the boundary of two core chunks.
    straddling: AtomicU64,
}

impl Run {
    fn new(scale: Scale) -> Run {
        Run {
            pool: Pool::new(PoolConfig::new(scale.capacity).cores(2).core_reserve(0)).unwrap(),
            live: Occupancy::new(scale.capacity),
            mailboxes: (0..scale.threads).map(|_| Mailbox::new(scale.mailbox())).collect(),
            allocations: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            starved: AtomicU64::new(0),
            starved_example: Mutex::default(),
            live_bytes: AtomicUsize::new(0),
            reserved_bytes: AtomicUsize::new(0),
            peak_live_bytes: AtomicUsize::new(0),
            verified: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            remote_frees: AtomicU64::new(0),
            fronted: AtomicU64::new(0),
            straddling: AtomicU64::new(0),
            scale,
        }
    }

    /// Check a block's pattern, unregister it and free it.
    fn check_and_free(&self, h: Handle, pattern: u8, buf: &mut Vec<u8>) {
        let info = self.pool.block(h).unwrap();
        buf.clear();
        buf.resize(info.size, 0);
        self.pool.read(h, 0, buf).unwrap();
        assert!(buf.iter().all(|&b| b == pattern), "block at {} corrupted", info.offset);
        self.verified.fetch_add(info.size as u64, Ordering::Relaxed);
        self.live.release(info.offset, info.block_bytes).unwrap();
        self.pool.free(h).unwrap();
        // Counted out only once the pool has it back: the live bytes never fall below what the
        // pool holds for the blocks, so the starvation check below never blames the pool for
        // bytes a thread still had.
        self.live_bytes.fetch_sub(info.block_bytes, Ordering::Relaxed);
    }

    /// Before an allocation of `size` bytes: the live set and the reserved bytes now, for
    /// [`Run::failed`], then an upper bound of its block's bytes counted live and reserved
    /// (returned; the allocation checks it holds).
    fn reserve(&self, size: usize) -> ((usize, usize), usize) {
        let before = (self.live_bytes.load(Ordering::SeqCst), self.reserved_bytes.load(Ordering::SeqCst));
        let bound = 2 * size + self.pool.config().bank_size;
        self.live_bytes.fetch_add(bound, Ordering::SeqCst);
        self.reserved_bytes.fetch_add(bound, Ordering::SeqCst);
        (before, bound)
    }

    /// An allocation of `size` bytes failed: count it, and note it if it was small and the
    /// live set far below the capacity all through the call, which began at `before`
    /// ([`Run::reserve`]). The live set at the failure alone is not enough: on a machine with
    /// fewer CPUs than threads, a thread can be off the CPU for milliseconds between the
    /// pool's failure and this check, while the others allocate and free megabytes. So the
    /// live set the pool may have held during the call is bounded by the live set at its start
    /// plus every byte reserved since (frees during the call only lower it).
    fn failed(&self, size: usize, err: &npumem_core::Error, before: (usize, usize)) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let live = before.0 + (self.reserved_bytes.load(Ordering::SeqCst) - before.1);
        let small = size <= self.pool.config().chunk_size / 16;
        if small && live + size <= self.scale.capacity / 2 && self.starved.fetch_add(1, Ordering::Relaxed) == 0 {
            let s = self.pool.stats();
            *self.starved_example.lock().unwrap() = Some(format!(
                "{size} bytes failed ({err}) with at most {live} bytes live during the call, of {}: pool \
                 bytes in use {}, free {}, cached in slabs {}, largest free block {}, chunks free {} of {}",
                self.scale.capacity,
                s.bytes_in_use,
                s.bytes_free,
                s.slab_cached_bytes,
                s.largest_free_block,
                s.chunks_free,
                s.chunks
            ));
        }
    }

    /// Thread `t`'s operations: allocate into a random slot (freeing what was there), hand a
    /// slot's block on to the next thread, or free what was handed to this one.
    fn worker(&self, t: usize) {
        let Scale { threads, ops, slots: slot_count, max_size, .. } = self.scale;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut slots: Vec<Option<(Handle, u8)>> = vec![None; slot_count];
        let (mut buf, mut fill) = (Vec::new(), Vec::new());
        for i in 0..ops {
            let r = next();
            let slot = (r >> 40) as usize % slot_count;
            match r % 10 {
                0..=4 => {
                    if let Some((h, pattern)) = slots[slot].take() {
                        self.check_and_free(h, pattern, &mut buf);
                    }
                    let size = match r >> 8 & 7 {
                        0 => 1 + (r >> 16) as usize % 256,
                        1..=4 => 256 + (r >> 16) as usize % 8192,
                        5 | 6 => 8192 + (r >> 16) as usize % (256 << 10),
                        _ => (1 << 20) + (r >> 16) as usize % (3 << 20),
                    }
                    .min(max_size);
                    let (before, bound) = self.reserve(size);
                    match self.pool.alloc(size, None, t as u32) {
                        Ok(h) => {
                            let info = self.pool.block(h).unwrap();
                            assert!(info.block_bytes >= size);
                            assert!(info.block_bytes <= bound, "{size} bytes took {} bytes", info.block_bytes);
                            // Counted in before the call, corrected before the occupancy claim,
                            // which takes a while for a large block (see `check_and_free`).
                            let extra = bound - info.block_bytes;
                            let now = self.live_bytes.fetch_sub(extra, Ordering::SeqCst) - extra;
                            self.peak_live_bytes.fetch_max(now, Ordering::Relaxed);
                            self.live.claim(info.offset, info.block_bytes).unwrap();
                            let chunk = self.pool.config().chunk_size;
                            if info.offset % chunk != 0 && info.offset % chunk + size > chunk {
                                self.fronted.fetch_add(1, Ordering::Relaxed);
                                if size <= chunk / 2 {
                                    self.straddling.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            self.allocations.fetch_add(1, Ordering::Relaxed);
                            let pattern = (i % 251) as u8 + 1;
                            fill.clear();
                            fill.resize(size, pattern);
                            self.pool.write(h, 0, &fill).unwrap();
                            slots[slot] = Some((h, pattern));
                        }
                        Err(err) => {
                            self.live_bytes.fetch_sub(bound, Ordering::SeqCst);
                            self.failed(size, &err, before);
                        }
                    }
                }
                5..=6 => {
                    if let Some(item) = slots[slot].take() {
                        if let Some(refused) = self.mailboxes[(t + 1) % threads].offer(item) {
                            self.kept.fetch_add(1, Ordering::Relaxed);
                            slots[slot] = Some(refused);
                        }
                    }
                }
                _ => {
                    for (h, pattern) in self.mailboxes[t].take_all() {
                        self.check_and_free(h, pattern, &mut buf);
                        self.remote_frees.fetch_add(1, Ordering::Relaxed);
                    }
                    if r % 3 == 0 {
                        if let Some((h, pattern)) = slots[slot].take() {
                            self.check_and_free(h, pattern, &mut buf);
                        }
                    }
                }
            }
        }
        for (h, pattern) in slots.into_iter().flatten() {
            self.check_and_free(h, pattern, &mut buf);
        }
    }

    /// After the workers: free what the mailboxes hold, then check that every byte is free and
    /// merged, the metadata consistent, and no allocation failed while the pool had room.
    fn finish(&self) {
        let mut buf = Vec::new();
        for mailbox in &self.mailboxes {
            for (h, pattern) in mailbox.take_all() {
                self.check_and_free(h, pattern, &mut buf);
            }
        }
        assert!(self.live.is_empty(), "every registered block was released");
        assert_eq!(self.pool.check().unwrap(), 0);
        let s = self.pool.stats();
        assert_eq!(s.bytes_in_use, 0);
        assert_eq!(s.alloc_count, s.free_count);
        assert_eq!(s.largest_free_block, self.scale.capacity, "every byte free and merged");
        assert!(self.allocations.load(Ordering::Relaxed) > 0, "the stress test allocated nothing");
        let starved = self.starved.load(Ordering::Relaxed);
        assert_eq!(
            starved,
            0,
            "{starved} small allocations failed for want of space although the live set and the \
             request together were at most half the arena (the first: {})",
            self.starved_example.lock().unwrap().as_deref().unwrap_or("?")
        );
    }
}

fn scale_from_env() -> Scale {
    Scale {
        threads: knob("NPUMEM_STRESS_THREADS", 4).max(1),
        ops: knob("NPUMEM_STRESS_ITERS", 6000),
        slots: knob("NPUMEM_STRESS_SLOTS", 64).max(1),
        max_size: knob("NPUMEM_STRESS_MAX_SIZE", usize::MAX).max(1),
        capacity: knob("NPUMEM_STRESS_CAPACITY_MIB", 64).max(8) * MIB,
    }
}

/// Many threads allocate mixed sizes into a fixed number of slots each (as mimalloc's
/// test-stress does), fill each block with a pattern, hand blocks to each other through
/// bounded mailboxes (so many frees are remote, and the live set stays bounded at any number
/// of operations however the threads are scheduled), check the pattern at free, and register
/// every live block in the occupancy bitmap (every live block against every other). Blocks
/// take fronts (`arena/front.rs`) as they come and go: some must be placed so when the sizes
/// reach that far. A second run caps the sizes at half a chunk with fewer slots (16) in a
/// 32 MiB arena, which stays below the occupancy at which the arena counts as tight: there,
/// blocks of at most half a chunk must be placed across the boundary of two core chunks, in
/// one of up to three runs (every run prints how many were). At the end of each run every
/// byte is free and `check()` passes, and no small allocation failed while the live set and
/// the request together were at most half the arena. Knobs from the environment:
/// `NPUMEM_STRESS_THREADS`, `NPUMEM_STRESS_ITERS` (operations per thread, half of them
/// allocations), `NPUMEM_STRESS_SLOTS` (live blocks per thread; a mailbox holds four times as many),
/// `NPUMEM_STRESS_MAX_SIZE` (caps the sizes) and `NPUMEM_STRESS_CAPACITY_MIB` (the arena).
/// `make stress` runs it at the scale of mimalloc's test-stress and prints the figures.
#[test]
fn stress_mixed_sizes_remote_frees_no_overlap_no_corruption() {
    let scale = scale_from_env();
    let (fronted, _) = stress_run(scale);
    if scale.max_size > 3 << 20 && scale.ops >= 1000 {
        assert!(fronted > 0, "no block was placed with a front: the stress test does not exercise them");
    }
    let small = Scale { slots: 16, max_size: scale.max_size.min(1 << 20), capacity: 32 * MIB, ..scale };
    // Most runs place dozens so; how many depends on how the threads were scheduled, and on a
    // loaded machine one run in many places none: up to three runs (each checked in full).
    let mut straddling = 0;
    for _ in 0..3 {
        straddling = stress_run(small).1;
        if straddling > 0 {
            break;
        }
    }
    if small.max_size > 64 << 10 && small.ops >= 1000 {
        assert!(straddling > 0, "no block of at most half a chunk was placed across a chunk boundary in three runs");
    }
}

/// One run of the stress test at `scale`, its figures printed: the blocks placed with a front,
/// and those of them of at most half a chunk.
fn stress_run(scale: Scale) -> (u64, u64) {
    let started = std::time::Instant::now();
    let run = Run::new(scale);
    std::thread::scope(|s| {
        for t in 0..scale.threads {
            let run = &run;
            s.spawn(move || run.worker(t));
        }
    });
    run.finish();
    let verified = run.verified.load(Ordering::Relaxed);
    let fronted = run.fronted.load(Ordering::Relaxed);
    let straddling = run.straddling.load(Ordering::Relaxed);
    println!(
        "stress: {} threads x {} operations, {} slots, on {} MiB: {} allocations ({} failed for want of space, \
         {fronted} with a front, {straddling} of them of at most half a chunk), peak live set {:.1} MiB, {} \
         remote frees, {} hand-overs refused by a full mailbox, {verified} bytes verified ({:.1} GB), {:.1} s",
        scale.threads,
        scale.ops,
        scale.slots,
        scale.capacity / MIB,
        run.allocations.load(Ordering::Relaxed),
        run.failures.load(Ordering::Relaxed),
        run.peak_live_bytes.load(Ordering::Relaxed) as f64 / MIB as f64,
        run.remote_frees.load(Ordering::Relaxed),
        run.kept.load(Ordering::Relaxed),
        verified as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    (fronted, straddling)
}

/// The scheduling that filled the arena, made deterministic: thread 0 runs all its operations
/// before thread 1 starts, so nothing drains the mailbox thread 0 hands its blocks to (as when
/// the scheduler keeps a thread off the CPU for a long slice). With an unbounded mailbox,
/// thread 0 hands on thousands of blocks of 5 KiB on average, more than the 16 MiB arena holds,
/// and allocations fail; bounded, the live set stays within the slots and the mailbox, and
/// none fails.
#[test]
fn a_receiver_that_never_runs_does_not_fill_the_arena() {
    let scale = Scale { threads: 2, ops: 40_000, slots: 64, max_size: 8192, capacity: 16 * MIB };
    let run = Run::new(scale);
    run.worker(0);
    run.worker(1);
    run.finish();
    assert_eq!(run.failures.load(Ordering::Relaxed), 0, "no allocation fails with a bounded live set");
    let bound = (scale.threads * (scale.slots + scale.mailbox()) * 9) << 10; // blocks of at most 9 KiB
    let peak = run.peak_live_bytes.load(Ordering::Relaxed);
    assert!(peak <= bound, "the live set peaked at {peak} bytes, over its bound of {bound}");
    assert!(run.kept.load(Ordering::Relaxed) > 0, "the mailbox filled up and refused blocks");
}

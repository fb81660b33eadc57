//! The multi-threaded stress test: mixed sizes, remote frees, pattern fill, and an overlap
//! oracle that checks every live block against every other.
//!
//! The oracle is an occupancy bitmap with one bit per byte of the arena. Registering a block
//! sets its bits with `fetch_or` and fails if any was already set; so any two live blocks that
//! share a byte are caught, whichever threads hold them, without a lock that would serialize
//! the threads (a shared ordered map behind a mutex made 32 threads on 2 cores measure the
//! mutex, not the pool).
#![cfg(not(loom))]

use npumem_core::{Handle, Pool, PoolConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const MIB: usize = 1 << 20;

/// A knob of the stress test from the environment, or its CI default.
fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One bit per byte of the arena: set while a live block covers that byte.
struct Occupancy {
    words: Vec<AtomicU64>,
}

impl Occupancy {
    fn new(capacity: usize) -> Occupancy {
        Occupancy { words: (0..capacity.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// The words covering `[offset, offset + len)`, each with the mask of the bytes it holds.
    fn masks(offset: usize, len: usize) -> impl Iterator<Item = (usize, u64)> {
        let end = offset + len;
        (offset / 64..end.div_ceil(64)).map(move |w| {
            let lo = offset.max(w * 64) - w * 64;
            let hi = end.min(w * 64 + 64) - w * 64;
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            (w, mask)
        })
    }

    /// Marks a block live; an error if any of its bytes belongs to another live block (the
    /// bits set before the clash stay set: the caller fails the test).
    fn claim(&self, offset: usize, len: usize) -> Result<(), String> {
        for (w, mask) in Self::masks(offset, len) {
            let old = self.words[w].fetch_or(mask, Ordering::AcqRel);
            if old & mask != 0 {
                let byte = w * 64 + (old & mask).trailing_zeros() as usize;
                return Err(format!("block [{offset}, +{len}) overlaps a live block at byte {byte}"));
            }
        }
        Ok(())
    }

    /// Marks a block free; an error if any of its bytes was not marked live.
    fn release(&self, offset: usize, len: usize) -> Result<(), String> {
        for (w, mask) in Self::masks(offset, len) {
            let old = self.words[w].fetch_and(!mask, Ordering::AcqRel);
            if old & mask != mask {
                return Err(format!("block [{offset}, +{len}) was not registered whole"));
            }
        }
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.words.iter().all(|w| w.load(Ordering::Acquire) == 0)
    }
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

/// Many threads allocate mixed sizes into a fixed number of slots each (as mimalloc's
/// test-stress does, so the live set stays bounded and allocations keep succeeding at any
/// number of operations), fill each block with a pattern, hand blocks to each other (so many
/// frees are remote), check the pattern at free, and register every live block in the occupancy
/// bitmap (every live block against every other). At the end every byte is free and `check()`
/// passes. Knobs from the environment: `NPUMEM_STRESS_THREADS`, `NPUMEM_STRESS_ITERS`
/// (operations per thread, half of them allocations), `NPUMEM_STRESS_SLOTS` (live blocks per
/// thread), `NPUMEM_STRESS_MAX_SIZE` (caps the sizes) and `NPUMEM_STRESS_CAPACITY_MIB` (the
/// arena). `make stress` runs it at the scale of mimalloc's test-stress and prints the figures.
#[test]
fn stress_mixed_sizes_remote_frees_no_overlap_no_corruption() {
    let threads = knob("NPUMEM_STRESS_THREADS", 4).max(1);
    let ops = knob("NPUMEM_STRESS_ITERS", 6000);
    let max_size = knob("NPUMEM_STRESS_MAX_SIZE", usize::MAX).max(1);
    let capacity = knob("NPUMEM_STRESS_CAPACITY_MIB", 64).max(8) * MIB;
    let slot_count = knob("NPUMEM_STRESS_SLOTS", 64).max(1);
    let started = std::time::Instant::now();
    let allocations = AtomicU64::new(0);
    let failures = AtomicU64::new(0);
    let verified = AtomicU64::new(0);
    let p = Pool::new(PoolConfig::new(capacity).cores(2).core_reserve(0)).unwrap();
    let live = Occupancy::new(capacity);
    type Mailbox = Mutex<Vec<(Handle, u8)>>;
    let mailboxes: Vec<Mailbox> = (0..threads).map(|_| Mutex::default()).collect();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (p, live, mailboxes) = (&p, &live, &mailboxes);
            let (allocations, failures, verified) = (&allocations, &failures, &verified);
            s.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut slots: Vec<Option<(Handle, u8)>> = vec![None; slot_count];
                let mut buf: Vec<u8> = Vec::new();
                let mut check_and_free = |h: Handle, pattern: u8| {
                    let info = p.block(h).unwrap();
                    buf.clear();
                    buf.resize(info.size, 0);
                    p.read(h, 0, &mut buf).unwrap();
                    assert!(buf.iter().all(|&b| b == pattern), "block at {} corrupted", info.offset);
                    verified.fetch_add(info.size as u64, Ordering::Relaxed);
                    live.release(info.offset, info.block_bytes).unwrap();
                    p.free(h).unwrap();
                };
                let mut fill: Vec<u8> = Vec::new();
                for i in 0..ops {
                    let r = next();
                    let slot = (r >> 40) as usize % slot_count;
                    match r % 10 {
                        0..=4 => {
                            if let Some((h, pattern)) = slots[slot].take() {
                                check_and_free(h, pattern);
                            }
                            let size = match r >> 8 & 7 {
                                0 => 1 + (r >> 16) as usize % 256,
                                1..=4 => 256 + (r >> 16) as usize % 8192,
                                5 | 6 => 8192 + (r >> 16) as usize % (256 << 10),
                                _ => (1 << 20) + (r >> 16) as usize % (3 << 20),
                            }
                            .min(max_size);
                            match p.alloc(size, None, t as u32) {
                                Ok(h) => {
                                    let info = p.block(h).unwrap();
                                    assert!(info.block_bytes >= size);
                                    live.claim(info.offset, info.block_bytes).unwrap();
                                    allocations.fetch_add(1, Ordering::Relaxed);
                                    let pattern = (i % 251) as u8 + 1;
                                    fill.clear();
                                    fill.resize(size, pattern);
                                    p.write(h, 0, &fill).unwrap();
                                    slots[slot] = Some((h, pattern));
                                }
                                Err(_) => {
                                    failures.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        5..=6 => {
                            if let Some(item) = slots[slot].take() {
                                mailboxes[(t + 1) % threads].lock().unwrap().push(item);
                            }
                        }
                        _ => {
                            let received = std::mem::take(&mut *mailboxes[t].lock().unwrap());
                            for (h, pattern) in received {
                                check_and_free(h, pattern);
                            }
                            if r % 3 == 0 {
                                if let Some((h, pattern)) = slots[slot].take() {
                                    check_and_free(h, pattern);
                                }
                            }
                        }
                    }
                }
                for (h, pattern) in slots.into_iter().flatten() {
                    check_and_free(h, pattern);
                }
            });
        }
    });
    for mailbox in mailboxes.iter() {
        for (h, _) in mailbox.lock().unwrap().drain(..) {
            let info = p.block(h).unwrap();
            live.release(info.offset, info.block_bytes).unwrap();
            p.free(h).unwrap();
        }
    }
    assert!(live.is_empty(), "every registered block was released");
    assert_eq!(p.check().unwrap(), 0);
    let s = p.stats();
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.alloc_count, s.free_count);
    assert_eq!(s.largest_free_block, capacity, "every byte free and merged");
    let allocations = allocations.into_inner();
    assert!(allocations > 0, "the stress test allocated nothing");
    let verified = verified.into_inner();
    println!(
        "stress: {threads} threads x {ops} operations, {slot_count} slots, on {} MiB: {allocations} allocations \
         ({} failed for want of space), {verified} bytes verified ({:.1} GB), {:.1} s",
        capacity / MIB,
        failures.into_inner(),
        verified as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
}

//! Statistics: the pool's counters, summed into a `PoolStats` snapshot on demand. Every count the
//! allocation and free paths move is kept per thread (`thread.rs`), with plain stores: an
//! allocation pays no locked instruction and no shared cache line for statistics. Only failed
//! allocations (rare) are counted per core in shared atomics.
//!
//! The peak needs a running total, which one shared counter would make a contended cache line.
//! Each thread publishes its running byte count to a shared total only when it has moved by more
//! than a slack since the block's last publication. After each allocation the thread estimates
//! the total as the published total plus its own unpublished change, and raises the peak if the
//! estimate passes it. So as not to read the line that the other threads' publications write
//! at every allocation (with eight threads on sixteen cores, a miss at nearly every one), the
//! thread keeps a *view* (`thread.rs`): how far the peak stood above the published total when
//! it last read them, its *room*. While its own unpublished change stays within that room, the
//! estimate cannot pass the peak it read, and the allocation reads nothing shared. It reads
//! the totals again when its change passes the room, at its own publications, and after a
//! snapshot sampled the slab part or a peak was reset (a count of those on a line of its own).
//! The estimate is exact when one thread allocates at a time; with several, it may miss the
//! threads' unpublished changes (the others', and the caller's own while the others'
//! publications since its last read are not in its view): at most the sum of every thread's
//! slack, which shrinks once more threads than cores have used the pool, so that all of them
//! together miss less than `cores x` the slack of one thread per core. Slab objects enter the
//! estimate through the bytes they held at the last sample (taken whenever a slab is carved and
//! at every snapshot), less the bytes of those the estimating thread freed since (each thread
//! counts its slab frees; a sample marks where every thread's count stood), so the peak is
//! exact for blocks above the largest slab class and sampled below. With several threads, an
//! estimate may still count slab objects that another thread freed since the last sample.
//!
//! The requested bytes of blocks counted under no tag (the untagged row of the counters by tag,
//! `tags.rs`) are not counted on their own: they are the pool's requested bytes less those of
//! the blocks counted under a tag, a total that only tagged allocations and frees move
//! ([`Counters::on_tagged`], one line of its own). Their peak is estimated the same way as the
//! bytes' peak, from the requested bytes each thread publishes past the slack, so an untagged
//! allocation pays no counter of its own. Callers count a tagged block before allocating it and
//! after freeing it, so a tagged block never enters the untagged estimate.

use crate::config::ClassTable;
use crate::stats::thread::{ClassTotals, ThreadCounters, ThreadStats};
use crate::util::index_cache::IndexCache;
use crate::util::sync::{AtomicU64, CachePadded, Ordering};

/// Which part of the pool served an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A slab cache.
    Slab,
    /// A core pool's buddy tree (the caller's core or, with `overflow`, another one).
    Core,
    /// A run of whole chunks from the global pool.
    Global,
}

/// The counters summed over every thread (or over every thread for one core pool, where the
/// bytes are not kept and read 0). *Counts* only grow; *balances* go up and down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Allocations served by a core pool's buddy trees.
    pub(crate) core_allocs: u64,
    /// Allocations served by the global pool (chunk runs).
    pub(crate) global_allocs: u64,
    /// Allocations served outside the caller's own core pool.
    pub(crate) overflow_allocs: u64,
    /// Allocations that raised out-of-memory.
    pub(crate) failed_allocs: u64,
    /// Frees of buddy blocks and runs.
    pub(crate) frees: u64,
    /// Bytes of buddy blocks and runs in use.
    pub(crate) bytes: i64,
    /// Their requested bytes.
    pub(crate) requested: i64,
}

impl Totals {
    pub(crate) fn allocs(&self) -> u64 {
        self.core_allocs + self.global_allocs
    }
}

/// The most a thread's running byte count may move before it publishes it (see
/// [`Counters::new`]).
const MAX_SLACK: u64 = 1 << 20;

pub(crate) struct Counters {
    threads: ThreadStats,
    /// Failed allocations per core: rare, so shared atomics.
    failed: Box<[CachePadded<AtomicU64>]>,
    /// Written on publications and new peaks only; on lines of their own, apart from the
    /// per-thread blocks, which every allocation writes.
    shared: CachePadded<SharedCounters>,
    /// Requested bytes of the blocks counted under a tag: written by tagged allocations and
    /// frees only, read by every estimate of the untagged peak.
    tagged: CachePadded<AtomicU64>,
    /// How many times a peak was reset or a slab part sampled: a thread whose view was read
    /// before the last of them reads the shared totals again. Written by snapshots only.
    resets: CachePadded<AtomicU64>,
}

#[derive(Default)]
struct SharedCounters {
    /// The sum of the blocks' `published`.
    published_total: AtomicU64,
    peak: AtomicU64,
    /// Bytes of slab objects at the last sample.
    slab_bytes: AtomicU64,
    /// The sum of the blocks' `published_requested`.
    published_requested_total: AtomicU64,
    /// Requested bytes of slab objects at the last sample (wrapping, like the balances).
    slab_requested: AtomicU64,
    /// The peak of the requested bytes of blocks counted under no tag.
    untagged_peak: AtomicU64,
}

impl Counters {
    pub(crate) fn new(cores: usize, classes: usize, capacity: usize) -> Counters {
        // The estimate may miss what the other threads have not published: with up to one
        // thread per core, up to 1/64 of the capacity per core and 1 MiB per thread; with more
        // threads, each publishes past a share of that (`ThreadStats::slack`), so all of them
        // together still leave less than `cores x` that unpublished. A larger slack would make
        // publications (which move a line every other thread's allocations read) rarer: a
        // thread's running count is a random walk, and the steps between two publications grow
        // as the square of the slack over the block size (with random blocks of up to 1 MiB,
        // one every 17 steps at 1 MiB, every 791 at 8 MiB: `BENCHMARKS.md`). 8 MiB made no
        // difference that two threads on the test machine could measure, and let the peak of
        // 32 threads holding 1 MiB each read 16 MiB; 1 MiB keeps it within 2 MiB.
        let slack = (capacity as u64 / (64 * cores as u64)).min(MAX_SLACK);
        Counters {
            threads: ThreadStats::new(classes, cores, slack),
            failed: (0..cores).map(|_| CachePadded(AtomicU64::new(0))).collect(),
            shared: CachePadded(SharedCounters::default()),
            tagged: CachePadded(AtomicU64::new(0)),
            resets: CachePadded(AtomicU64::new(0)),
        }
    }

    /// The bytes of buddy blocks and runs in use as the calling thread can tell them cheaply:
    /// the published total as it last read it and its own unpublished change. Exact when one
    /// thread allocates at a time (its own publications refresh what it read); with several,
    /// the others' unpublished changes (at most a slack each) and their publications since the
    /// thread last read the total (it reads it again every [`VIEW_READS`] estimates) are left
    /// out. For the occupancy thresholds of the placement policies and of the caches of freed
    /// blocks, which such a lag moves a little.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn bytes_in_use_estimate(&self) -> u64 {
        self.threads.with(|t| {
            let view = &t.view;
            let left = view.reads_left.load(Ordering::Relaxed);
            let total = if left == 0 {
                let total = self.shared.published_total.load(Ordering::Relaxed);
                view.total.store(total, Ordering::Relaxed);
                view.reads_left.store(VIEW_READS, Ordering::Relaxed);
                total
            } else {
                view.reads_left.store(left - 1, Ordering::Relaxed);
                view.total.load(Ordering::Relaxed)
            };
            let own = t.bytes.load(Ordering::Relaxed).wrapping_sub(t.published.load(Ordering::Relaxed));
            (total.wrapping_add(own) as i64).max(0) as u64
        })
    }

    /// The calling thread's cache of free handle slots of this pool (`handle/table.rs`),
    /// which lives in its block.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn with_slot_cache<R>(&self, f: impl FnOnce(&IndexCache) -> R) -> R {
        self.threads.with(|t| f(&t.slots))
    }

    /// Call `f` on every thread's cache of free handle slots (threads running or gone): for
    /// `check()`, which pauses the pool first.
    pub(crate) fn for_each_slot_cache(&self, mut f: impl FnMut(&IndexCache)) {
        self.threads.for_each(|t| f(&t.slots));
    }

    /// The bytes of buddy blocks and runs that the threads have published (each thread's own
    /// count may be up to its slack away).
    #[cfg(test)]
    pub(crate) fn published_bytes(&self) -> u64 {
        self.shared.published_total.load(Ordering::Relaxed)
    }

    /// A slab object of class `class` was allocated.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn on_slab_alloc(&self, class: usize, requested: usize) {
        self.threads.with(|t| {
            let c = &t.classes[class];
            ThreadCounters::bump(&c.allocs, 1);
            ThreadCounters::bump(&c.requested, requested as u64);
        });
    }

    /// A slab object of class `class` (`bytes` bytes) was freed.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn on_slab_free(&self, class: usize, bytes: usize, requested: usize) {
        self.threads.with(|t| {
            let c = &t.classes[class];
            ThreadCounters::bump(&c.frees, 1);
            ThreadCounters::bump(&c.requested, (requested as u64).wrapping_neg());
            ThreadCounters::bump(&t.slab_freed, bytes as u64);
        });
    }

    /// The slab objects are about to be read for a sample of their bytes (`bytes`) or of
    /// their requested bytes (`requested`): every thread's frees of slab objects so far are
    /// in it. Read before the objects, so that a free racing the sample is left out of the
    /// sample or counted by the estimates below it, never both ways.
    pub(crate) fn mark_slab_sample(&self, bytes: bool, requested: bool) {
        self.threads.for_each(|t| {
            let freed = t.slab_freed.load(Ordering::Relaxed);
            if bytes {
                t.slab_freed_at_sample.store(freed, Ordering::Relaxed);
            }
            if requested {
                t.slab_freed_at_requested_sample.store(freed, Ordering::Relaxed);
            }
        });
    }

    /// The slab objects' part of the calling thread's estimates, bytes and requested bytes:
    /// the last samples', less the bytes of the objects this thread freed since (a sample
    /// taken before frees of its objects would otherwise count them still: an estimate above
    /// anything in use). The requested part loses the objects' whole bytes, at least what
    /// they were asked for: it may fall short, never above. Never below 0.
    #[inline]
    fn slab_parts(&self, t: &ThreadCounters) -> (u64, u64) {
        let s = &self.shared;
        let freed = t.slab_freed.load(Ordering::Relaxed);
        let since = freed.wrapping_sub(t.slab_freed_at_sample.load(Ordering::Relaxed));
        let since_requested = freed.wrapping_sub(t.slab_freed_at_requested_sample.load(Ordering::Relaxed));
        let bytes = (s.slab_bytes.load(Ordering::Relaxed) as i64).wrapping_sub(since as i64).max(0);
        let requested = (s.slab_requested.load(Ordering::Relaxed) as i64).wrapping_sub(since_requested as i64).max(0);
        (bytes as u64, requested as u64)
    }

    /// A buddy block or run of `bytes` bytes (`requested` asked for) was allocated on `core`.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn on_alloc(&self, core: usize, route: Route, overflow: bool, bytes: usize, requested: usize) {
        self.threads.with(|t| self.count_alloc(t, core, route, overflow, bytes, requested));
    }

    /// A buddy block or run of `bytes` bytes (`requested` asked for) of `core` was freed.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn on_free(&self, core: usize, bytes: usize, requested: usize) {
        self.threads.with(|t| self.count_free(t, core, bytes, requested));
    }

    /// A live block's bytes went from `old` to `new` (a compaction reshaped it).
    #[cfg(not(loom))]
    pub(crate) fn on_resize(&self, old: usize, new: usize) {
        self.threads.with(|t| {
            let now = ThreadCounters::bump(&t.bytes, (new as u64).wrapping_sub(old as u64));
            self.maybe_publish(t, now, t.requested.load(Ordering::Relaxed));
        });
    }

    /// [`Counters::on_alloc`] in the block `t`, which the calling thread holds.
    #[inline]
    fn count_alloc(
        &self,
        t: &ThreadCounters,
        core: usize,
        route: Route,
        overflow: bool,
        bytes: usize,
        requested: usize,
    ) {
        let c = &t.cores[core];
        match route {
            Route::Core => ThreadCounters::bump(&c.core_allocs, 1),
            Route::Global => ThreadCounters::bump(&c.global_allocs, 1),
            Route::Slab => unreachable!("slab allocations are counted by class"),
        };
        if overflow {
            ThreadCounters::bump(&c.overflow_allocs, 1);
        }
        let requested_now = ThreadCounters::bump(&t.requested, requested as u64);
        let now = ThreadCounters::bump(&t.bytes, bytes as u64);
        self.maybe_publish(t, now, requested_now);
        let unpublished = now.wrapping_sub(t.published.load(Ordering::Relaxed)) as i64;
        let untagged = requested_now
            .wrapping_sub(t.published_requested.load(Ordering::Relaxed))
            .wrapping_sub(self.tagged.load(Ordering::Relaxed)) as i64;
        let view = &t.view;
        if unpublished > view.room.load(Ordering::Relaxed) as i64
            || untagged > view.untagged_room.load(Ordering::Relaxed) as i64
            || self.resets.load(Ordering::Acquire) != view.resets.load(Ordering::Relaxed)
        {
            self.raise_peaks(t, unpublished, untagged);
        }
    }

    /// Read the shared totals: raise each peak to the estimate of its running total (the
    /// published part, the caller's unpublished change `unpublished` or `untagged`, and the
    /// slab objects' part at the last sample), and keep in the caller's view how far each peak
    /// is above what the estimate adds to the caller's change.
    #[inline(never)]
    fn raise_peaks(&self, t: &ThreadCounters, unpublished: i64, untagged: i64) {
        // Before the totals: a reset that comes after this load sends the next allocation here.
        let resets = self.resets.load(Ordering::Acquire);
        let s = &self.shared;
        let (slab_bytes, slab_requested) = self.slab_parts(t);
        let total = s.published_total.load(Ordering::Relaxed);
        let base = total.wrapping_add(slab_bytes) as i64;
        let peak = raise(&s.peak, base.wrapping_add(unpublished));
        let requested_base = s.published_requested_total.load(Ordering::Relaxed).wrapping_add(slab_requested) as i64;
        let untagged_peak = raise(&s.untagged_peak, requested_base.wrapping_add(untagged));
        let view = &t.view;
        view.room.store(peak.wrapping_sub(base) as u64, Ordering::Relaxed);
        view.untagged_room.store(untagged_peak.wrapping_sub(requested_base) as u64, Ordering::Relaxed);
        view.resets.store(resets, Ordering::Relaxed);
        view.total.store(total, Ordering::Relaxed);
    }

    /// [`Counters::on_free`] in the block `t`, which the calling thread holds.
    #[inline]
    fn count_free(&self, t: &ThreadCounters, core: usize, bytes: usize, requested: usize) {
        ThreadCounters::bump(&t.cores[core].frees, 1);
        let requested_now = ThreadCounters::bump(&t.requested, (requested as u64).wrapping_neg());
        let now = ThreadCounters::bump(&t.bytes, (bytes as u64).wrapping_neg());
        self.maybe_publish(t, now, requested_now);
    }

    pub(crate) fn on_failed(&self, core: usize) {
        self.failed[core].fetch_add(1, Ordering::Relaxed);
    }

    /// Publish the block's bytes, and its requested bytes, each when it has moved past the
    /// slack since its last publication; a publication of the bytes may raise the peak.
    #[inline]
    fn maybe_publish(&self, t: &ThreadCounters, now: u64, requested_now: u64) {
        let s = &self.shared;
        // A publication moves the caller's change into the total: the view's rooms, read
        // against the total, are read again here (the line is in the cache after the RMW).
        if let Some(total) = self.publish(&t.published, now, &s.published_total) {
            let at_least = (total as i64).max(0) as u64;
            let peak = s.peak.fetch_max(at_least, Ordering::AcqRel).max(at_least);
            let base = total.wrapping_add(self.slab_parts(t).0);
            t.view.room.store(peak.wrapping_sub(base), Ordering::Relaxed);
            t.view.total.store(total, Ordering::Relaxed);
        }
        if let Some(total) = self.publish(&t.published_requested, requested_now, &s.published_requested_total) {
            let base = total.wrapping_add(self.slab_parts(t).1);
            t.view.untagged_room.store(s.untagged_peak.load(Ordering::Relaxed).wrapping_sub(base), Ordering::Relaxed);
        }
    }

    /// Move `total` by what `now` has moved since `published` (the block's own, which only the
    /// calling thread writes), if that passes the slack; returns the new total.
    #[inline]
    fn publish(&self, published: &AtomicU64, now: u64, total: &AtomicU64) -> Option<u64> {
        let delta = now.wrapping_sub(published.load(Ordering::Relaxed));
        if (delta as i64).unsigned_abs() <= self.threads.slack() {
            return None;
        }
        published.store(now, Ordering::Relaxed);
        Some(total.fetch_add(delta, Ordering::AcqRel).wrapping_add(delta))
    }

    /// The counters summed over every thread.
    pub(crate) fn totals(&self) -> Totals {
        let mut t = Totals::default();
        self.threads.for_each(|block| {
            for c in block.cores.iter() {
                t.core_allocs += c.core_allocs.load(Ordering::Relaxed);
                t.global_allocs += c.global_allocs.load(Ordering::Relaxed);
                t.overflow_allocs += c.overflow_allocs.load(Ordering::Relaxed);
                t.frees += c.frees.load(Ordering::Relaxed);
            }
            t.bytes = t.bytes.wrapping_add(block.bytes.load(Ordering::Relaxed) as i64);
            t.requested = t.requested.wrapping_add(block.requested.load(Ordering::Relaxed) as i64);
        });
        t.failed_allocs = self.failed.iter().map(|f| f.load(Ordering::Relaxed)).sum();
        t
    }

    /// The counts of core pool `core`, summed over every thread (bytes read 0: they are kept
    /// per thread, not per core).
    pub(crate) fn core(&self, core: usize) -> Totals {
        let mut t = Totals::default();
        self.threads.for_each(|block| {
            let c = &block.cores[core];
            t.core_allocs += c.core_allocs.load(Ordering::Relaxed);
            t.global_allocs += c.global_allocs.load(Ordering::Relaxed);
            t.overflow_allocs += c.overflow_allocs.load(Ordering::Relaxed);
            t.frees += c.frees.load(Ordering::Relaxed);
        });
        t.failed_allocs = self.failed[core].load(Ordering::Relaxed);
        t
    }

    /// The slab counters summed over every thread, per class.
    pub(crate) fn class_totals(&self) -> ClassTable<ClassTotals> {
        self.threads.class_totals()
    }

    /// Set the peak to `current` (an exact total just taken, as for [`Counters::sample`]);
    /// returns the peak it replaces.
    pub(crate) fn reset_peak(&self, current: u64, slab_bytes: u64) -> u64 {
        self.shared.slab_bytes.store(slab_bytes, Ordering::Relaxed);
        let replaced = self.shared.peak.swap(current, Ordering::AcqRel);
        self.resets.fetch_add(1, Ordering::Release);
        replaced
    }

    /// Raise the peak to at least `value`.
    pub(crate) fn raise_peak(&self, value: u64) {
        self.shared.peak.fetch_max(value, Ordering::AcqRel);
    }

    /// The peak, raised to `current` first (an exact total just taken, slab objects included,
    /// whose slab part `slab_bytes` is remembered for later estimates).
    pub(crate) fn sample(&self, current: u64, slab_bytes: u64) -> u64 {
        self.shared.slab_bytes.store(slab_bytes, Ordering::Relaxed);
        let peak = self.shared.peak.fetch_max(current, Ordering::AcqRel).max(current);
        self.resets.fetch_add(1, Ordering::Release);
        peak
    }

    /// Blocks counted under a tag were allocated (`requested` > 0) or freed (< 0): callers
    /// count an allocation before making it and a free after it.
    #[inline]
    pub(crate) fn on_tagged(&self, requested: i64) {
        self.tagged.fetch_add(requested as u64, Ordering::Relaxed);
    }

    /// The requested bytes of blocks counted under a tag (wrapping below zero while a racing
    /// free is counted before its allocation).
    pub(crate) fn tagged_requested(&self) -> i64 {
        self.tagged.load(Ordering::Relaxed) as i64
    }

    /// The peak of the untagged requested bytes, raised to `current` first (an exact figure
    /// just taken, whose slab part `slab_requested` is remembered for later estimates).
    pub(crate) fn sample_untagged(&self, current: u64, slab_requested: i64) -> u64 {
        self.shared.slab_requested.store(slab_requested as u64, Ordering::Relaxed);
        let peak = self.shared.untagged_peak.fetch_max(current, Ordering::AcqRel).max(current);
        self.resets.fetch_add(1, Ordering::Release);
        peak
    }

    /// Set the untagged peak to `current` (as for [`Counters::sample_untagged`]).
    pub(crate) fn reset_untagged_peak(&self, current: u64, slab_requested: i64) {
        self.shared.slab_requested.store(slab_requested as u64, Ordering::Relaxed);
        self.shared.untagged_peak.store(current, Ordering::Release);
        self.resets.fetch_add(1, Ordering::Release);
    }
}

/// Estimates of the bytes in use that a thread makes from the published total it read last
/// before it reads it again.
const VIEW_READS: u64 = 64;

/// Raise `peak` to `estimate` if it passes it (a load, and an RMW only on a new peak); returns
/// the peak after, as far as the caller can tell.
#[inline]
fn raise(peak: &AtomicU64, estimate: i64) -> i64 {
    let seen = peak.load(Ordering::Relaxed) as i64;
    if estimate > seen {
        return (peak.fetch_max(estimate as u64, Ordering::AcqRel) as i64).max(estimate);
    }
    seen
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn totals_and_exact_peak_on_one_core() {
        let c = Counters::new(1, 0, 1 << 30);
        c.on_alloc(0, Route::Core, false, 256, 200);
        c.on_alloc(0, Route::Global, false, 4 << 20, 3 << 20);
        c.on_free(0, 256, 200);
        c.on_failed(0);
        let t = c.totals();
        assert_eq!((t.allocs(), t.frees, t.failed_allocs), (2, 1, 1));
        assert_eq!((t.bytes, t.requested), (4 << 20, 3 << 20));
        assert_eq!(c.sample(t.bytes as u64, 0), (4 << 20) + 256);
    }

    #[test]
    fn peak_is_exact_for_one_thread_on_many_cores() {
        let c = Counters::new(4, 0, 1 << 30);
        c.on_alloc(2, Route::Core, false, 1000, 1000);
        c.on_alloc(1, Route::Core, true, 3000, 3000);
        c.on_free(2, 1000, 1000);
        c.on_free(1, 3000, 3000);
        assert_eq!(c.sample(0, 0), 4000);
        let (two, one) = (c.core(2), c.core(1));
        assert_eq!((two.allocs(), two.frees, two.overflow_allocs), (1, 1, 0));
        assert_eq!((one.allocs(), one.frees, one.overflow_allocs), (1, 1, 1));
    }

    #[test]
    fn threads_count_apart_and_add_up() {
        // A slack of 512 KiB: the thousand allocations publish several times.
        let c = std::sync::Arc::new(Counters::new(2, 0, 64 << 20));
        let allocating = {
            let c = c.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    c.on_alloc(0, Route::Core, false, 4096, 4000);
                }
            })
        };
        allocating.join().unwrap();
        for _ in 0..1000 {
            c.on_free(1, 4096, 4000);
        }
        let t = c.totals();
        assert_eq!((t.allocs(), t.frees, t.bytes, t.requested), (1000, 1000, 0, 0));
        let peak = c.sample(0, 0);
        assert!(peak <= 4096 * 1000 && peak + 2 * c.threads.slack() >= 4096 * 1000, "peak {peak}");
        let mut published = 0u64;
        c.threads.for_each(|b| published = published.wrapping_add(b.published.load(Ordering::Relaxed)));
        assert_eq!(published, c.published_bytes(), "the published total is the blocks' published sum");
    }

    #[test]
    fn the_peaks_after_a_reset_or_a_sample_count_the_next_allocation() {
        let c = Counters::new(1, 0, 1 << 30);
        c.on_alloc(0, Route::Core, false, 1 << 20, 1 << 20);
        c.on_free(0, 1 << 20, 1 << 20);
        // The thread's view holds a room of 1 MiB over what it allocates now.
        assert_eq!(c.reset_peak(0, 0), 1 << 20);
        c.on_alloc(0, Route::Core, false, 4096, 4000);
        assert_eq!(c.sample(4096, 0), 4096, "the reset peak counts the allocation after it");
        c.reset_untagged_peak(0, 0);
        c.on_alloc(0, Route::Core, false, 4096, 4000);
        assert_eq!(c.sample_untagged(0, 0), 8000);
        // A sample that finds slab objects: the next estimate adds them.
        assert_eq!(c.sample(8192 + 1000, 1000), 8192 + 1000);
        c.on_alloc(0, Route::Core, false, 4096, 4000);
        assert_eq!(c.sample(0, 1000), 3 * 4096 + 1000);
    }

    #[test]
    fn a_view_read_before_another_threads_publication_misses_at_most_the_slacks() {
        // A slack of 512 KiB per thread: 64 MiB over two cores.
        let c = std::sync::Arc::new(Counters::new(2, 0, 64 << 20));
        let slack = c.threads.slack();
        // This thread reads the totals with 100 KiB of its own, then the other thread
        // publishes 3 MiB, then this thread allocates 400 KiB more without publishing: its
        // view does not have the other thread's publication.
        c.on_alloc(0, Route::Core, false, 100 << 10, 100 << 10);
        let other = c.clone();
        std::thread::spawn(move || other.on_alloc(1, Route::Core, false, 3 << 20, 3 << 20)).join().unwrap();
        for _ in 0..4 {
            c.on_alloc(0, Route::Core, false, 100 << 10, 100 << 10);
        }
        let in_use = (3 << 20) + 5 * (100 << 10);
        let peak = c.sample(0, 0);
        assert!(peak <= in_use && peak + 2 * slack >= in_use, "peak {peak} of {in_use}");
    }

    #[test]
    fn the_untagged_peak_leaves_out_tagged_blocks() {
        let c = Counters::new(1, 0, 1 << 30);
        c.on_alloc(0, Route::Core, false, 8192, 5000);
        c.on_free(0, 8192, 5000);
        c.on_tagged(1 << 20);
        c.on_alloc(0, Route::Global, false, 2 << 20, 1 << 20);
        assert_eq!(c.sample_untagged(0, 0), 5000);
        c.reset_untagged_peak(0, 0);
        assert_eq!(c.sample_untagged(0, 0), 0);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A thread that takes a block, counts a 4 KiB allocation and its free, and gives it back.
    fn alloc_and_free_in_a_thread(c: &Arc<Counters>) -> thread::JoinHandle<()> {
        let c = c.clone();
        thread::spawn(move || {
            let block = c.threads.acquire();
            c.count_alloc(&block, 0, Route::Core, false, 4096, 4000);
            c.count_free(&block, 0, 4096, 4000);
            ThreadStats::release(&block);
        })
    }

    /// Two threads each take a block, count an allocation and a free in it and give it back;
    /// the second may take the first one's block (a handover) or push a new one. Once both are
    /// done, the totals are exact, the published total is the sum of the blocks' published
    /// values, and a block taken afterwards goes on from the counts its last owner left.
    #[test]
    fn blocks_hand_over_and_publish_exactly() {
        loom::model(|| {
            // A slack of 1 KiB: every 4 KiB allocation and free publishes.
            let c = Arc::new(Counters::new(1, 0, 64 << 10));
            let worker = alloc_and_free_in_a_thread(&c);
            let block = c.threads.acquire();
            c.count_alloc(&block, 0, Route::Core, false, 4096, 4000);
            ThreadStats::release(&block);
            worker.join().unwrap();
            let t = c.totals();
            assert_eq!((t.allocs(), t.frees, t.bytes, t.requested), (2, 1, 4096, 4000));
            let mut published = 0u64;
            c.threads.for_each(|b| published = published.wrapping_add(b.published.load(Ordering::Relaxed)));
            assert_eq!(published, c.published_bytes());
            assert_eq!(c.published_bytes(), 4096);
            assert!(c.sample(4096, 0) <= 2 * 4096, "the peak passed what was ever in use");
        });
    }

    /// A thread caches a free handle slot in its block and exits (gives the block back) while
    /// another takes a block: whoever takes that block finds the slot, once, and a walk of the
    /// blocks afterwards finds it exactly when no one took it (`handle/table.rs`). Loom
    /// reaches poorly the schedules in which a spawned thread's first steps come before the
    /// spawner's next ones, so the model runs with the cacher spawned and with it in the
    /// model's own thread.
    fn a_cached_slot_hands_over(cacher_spawned: bool) {
        loom::model(move || {
            let c = Arc::new(Counters::new(1, 0, 64 << 20));
            let cache = |c: &Counters| {
                let block = c.threads.acquire();
                assert!(block.slots.put(7));
                ThreadStats::release(&block);
                None
            };
            let take = |c: &Counters| {
                let block = c.threads.acquire();
                let taken = block.slots.take();
                assert!(taken.is_none() || taken == Some(7), "a slot that was never cached: {taken:?}");
                assert_eq!(block.slots.take(), None, "the slot was taken twice");
                ThreadStats::release(&block);
                taken
            };
            type Role = fn(&Counters) -> Option<u32>;
            let (spawned, own): (Role, Role) = if cacher_spawned { (cache, take) } else { (take, cache) };
            let other = {
                let c = c.clone();
                thread::spawn(move || spawned(&c))
            };
            let taken = own(&c).or(other.join().unwrap());
            let mut held = Vec::new();
            c.for_each_slot_cache(|cache| held.extend(cache.held()));
            let expected: &[u32] = if taken.is_some() { &[] } else { &[7] };
            assert_eq!(held, expected);
        });
    }

    #[test]
    fn a_cached_slot_hands_over_with_its_block() {
        a_cached_slot_hands_over(true);
    }

    #[test]
    fn a_cached_slot_hands_over_with_its_block_with_the_roles_swapped() {
        a_cached_slot_hands_over(false);
    }

    /// A peak reset while another thread counts: once the reset is done, that thread's next
    /// allocation raises the reset peaks to its estimates, whatever its view held from before.
    #[test]
    fn a_reset_peak_counts_the_next_allocation() {
        loom::model(|| {
            // A slack of 1 MiB: nothing here publishes.
            let c = Arc::new(Counters::new(1, 0, 64 << 20));
            let resetter = {
                let c = c.clone();
                thread::spawn(move || {
                    c.reset_peak(0, 0);
                    c.reset_untagged_peak(0, 0);
                })
            };
            let block = c.threads.acquire();
            c.count_alloc(&block, 0, Route::Core, false, 4096, 4000);
            c.count_free(&block, 0, 4096, 4000);
            resetter.join().unwrap();
            c.count_alloc(&block, 0, Route::Core, false, 1024, 1000);
            assert!(c.shared.peak.load(Ordering::Relaxed) >= 1024, "the reset peak missed the allocation");
            assert!(c.shared.untagged_peak.load(Ordering::Relaxed) >= 1000);
            ThreadStats::release(&block);
        });
    }

    /// A snapshot taken while another thread counts sees no count that was not made, and the
    /// peak estimate never passes what was in use.
    #[test]
    fn a_racing_snapshot_sees_only_counts_made() {
        loom::model(|| {
            let c = Arc::new(Counters::new(1, 0, 64 << 10));
            let worker = alloc_and_free_in_a_thread(&c);
            // Relaxed counters: a racing snapshot may see the free before the allocation, never
            // a count that was not made.
            let t = c.totals();
            assert!(t.frees <= 1 && t.allocs() <= 1);
            assert!(c.sample(0, 0) <= 4096);
            worker.join().unwrap();
            let t = c.totals();
            assert_eq!((t.allocs(), t.frees, t.bytes, t.requested), (1, 1, 0, 0));
        });
    }
}

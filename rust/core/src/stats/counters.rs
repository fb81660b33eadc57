//! Statistics: per-core counters of the buddy and run paths, each core's on its own cache
//! lines, summed into a `PoolStats` snapshot on demand. (The slab fast path counts per thread,
//! in `thread.rs`, so that a small allocation pays no shared counter.)
//!
//! The peak needs a running total, which one shared counter would make a contended cache line.
//! Each core publishes its running byte count to a shared total only when it has moved by more
//! than a slack since the last publication. After each allocation the core estimates the total
//! as the published total plus its own unpublished change, and raises the peak if the estimate
//! passes it (a read of two rarely written lines, and an RMW only on a new peak). The estimate
//! is exact when one thread allocates at a time; with several, it may miss the others'
//! unpublished changes, at most `(cores - 1) x slack` bytes. Slab objects enter the estimate
//! through the bytes they held at the last sample (taken whenever a slab is carved and at every
//! snapshot), so the peak is exact for blocks above the largest slab class and sampled below.

use crate::util::sync::{AtomicU64, CachePadded, Ordering};

/// Which part of the pool served an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A slab cache (counted per thread, not here).
    Slab,
    /// A core pool's buddy tree (the caller's core or, with `overflow`, another one).
    Core,
    /// A run of whole chunks from the global pool.
    Global,
}

/// Defines the per-core counters from one list: `CoreCounters` (atomics, one set per core),
/// `Totals` (their values) and `Counters::core` / `Counters::totals` (one core's values, and
/// their sum over the cores). *Counts* only grow; *balances* go up and down (wrapping: a core
/// that frees others' blocks goes negative) and read as `i64`.
macro_rules! core_counters {
    (
        counts: { $($(#[$cdoc:meta])* $count:ident,)* }
        balances: { $($(#[$bdoc:meta])* $balance:ident,)* }
    ) => {
        #[derive(Default)]
        pub(crate) struct CoreCounters {
            $($(#[$cdoc])* $count: AtomicU64,)*
            $($(#[$bdoc])* $balance: AtomicU64,)*
            /// `bytes` at the last publication.
            published: AtomicU64,
            /// `requested` at the last publication.
            published_requested: AtomicU64,
        }

        /// The counters of one core, or summed over all.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub(crate) struct Totals {
            $($(#[$cdoc])* pub(crate) $count: u64,)*
            $($(#[$bdoc])* pub(crate) $balance: i64,)*
        }

        impl Counters {
    /// The bytes of buddy blocks and runs that the cores have published (each core's own
    /// count may be up to its slack away): one relaxed load of a line that changes seldom.
    #[inline]
    pub(crate) fn published_bytes(&self) -> u64 {
        self.shared.published_total.load(Ordering::Relaxed)
    }

            pub(crate) fn core(&self, core: usize) -> Totals {
                let c = &self.cores[core];
                Totals {
                    $($count: c.$count.load(Ordering::Relaxed),)*
                    $($balance: c.$balance.load(Ordering::Relaxed) as i64,)*
                }
            }

            pub(crate) fn totals(&self) -> Totals {
                let mut t = Totals::default();
                for core in 0..self.cores.len() {
                    let c = self.core(core);
                    $(t.$count += c.$count;)*
                    $(t.$balance = t.$balance.wrapping_add(c.$balance);)*
                }
                t
            }
        }
    };
}

core_counters! {
    counts: {
        /// Allocations served by a core pool's buddy trees (the caller's or, with overflow, another's).
        core_allocs,
        /// Allocations served by the global pool (chunk runs).
        global_allocs,
        /// Allocations served outside the caller's own core pool.
        overflow_allocs,
        /// Allocations that raised out-of-memory.
        failed_allocs,
        /// Frees (of blocks of any core).
        frees,
    }
    balances: {
        /// Block bytes allocated minus freed on this core.
        bytes,
        /// Requested bytes, same convention.
        requested,
    }
}

pub(crate) struct Counters {
    cores: Box<[CachePadded<CoreCounters>]>,
    slack: u64,
    /// Written on publications and new peaks only; on lines of their own, apart from the fields
    /// above, which every allocation reads.
    shared: CachePadded<SharedCounters>,
    /// Requested bytes of the blocks counted under a tag: written by tagged allocations and
    /// frees only, read by every estimate of the untagged peak.
    tagged: CachePadded<AtomicU64>,
}

#[derive(Default)]
struct SharedCounters {
    published_total: AtomicU64,
    peak: AtomicU64,
    /// Bytes of slab objects at the last sample.
    slab_bytes: AtomicU64,
    /// The sum of the cores' `requested` at their last publications.
    published_requested_total: AtomicU64,
    /// Requested bytes of slab objects at the last sample (wrapping, like the balances).
    slab_requested: AtomicU64,
    /// The peak of the requested bytes of blocks counted under no tag.
    untagged_peak: AtomicU64,
}

impl Totals {
    pub(crate) fn allocs(&self) -> u64 {
        self.core_allocs + self.global_allocs
    }
}

impl Counters {
    pub(crate) fn new(cores: usize, capacity: usize) -> Counters {
        // The estimate may miss (cores - 1) x slack bytes: at most 1/64 of the capacity, and at
        // most 1 MiB per core; large enough that a core churning a few blocks rarely publishes.
        let slack = (capacity as u64 / (64 * cores as u64)).min(1 << 20);
        Counters {
            cores: (0..cores).map(|_| CachePadded(CoreCounters::default())).collect(),
            slack,
            shared: CachePadded(SharedCounters::default()),
            tagged: CachePadded(AtomicU64::new(0)),
        }
    }

    #[inline]
    pub(crate) fn on_alloc(&self, core: usize, route: Route, overflow: bool, bytes: usize, requested: usize) {
        let c = &self.cores[core];
        match route {
            Route::Core => c.core_allocs.fetch_add(1, Ordering::Relaxed),
            Route::Global => c.global_allocs.fetch_add(1, Ordering::Relaxed),
            Route::Slab => unreachable!("slab allocations are counted per thread"),
        };
        if overflow {
            c.overflow_allocs.fetch_add(1, Ordering::Relaxed);
        }
        let requested_now = c.requested.fetch_add(requested as u64, Ordering::Relaxed).wrapping_add(requested as u64);
        let now = c.bytes.fetch_add(bytes as u64, Ordering::Relaxed).wrapping_add(bytes as u64);
        self.maybe_publish(c, now, requested_now);
        let unpublished = now.wrapping_sub(c.published.load(Ordering::Relaxed));
        let estimate = self.estimate(&self.shared.published_total, unpublished, &self.shared.slab_bytes, 0);
        raise(&self.shared.peak, estimate);
        let unpublished = requested_now.wrapping_sub(c.published_requested.load(Ordering::Relaxed));
        let tagged = self.tagged.load(Ordering::Relaxed);
        let untagged =
            self.estimate(&self.shared.published_requested_total, unpublished, &self.shared.slab_requested, tagged);
        raise(&self.shared.untagged_peak, untagged);
    }

    /// A running total estimated from its published part, the caller's unpublished change and
    /// the slab objects' part at the last sample, less `less`.
    #[inline]
    fn estimate(&self, published: &AtomicU64, unpublished: u64, slab: &AtomicU64, less: u64) -> i64 {
        published
            .load(Ordering::Relaxed)
            .wrapping_add(unpublished)
            .wrapping_add(slab.load(Ordering::Relaxed))
            .wrapping_sub(less) as i64
    }

    #[inline]
    pub(crate) fn on_free(&self, core: usize, bytes: usize, requested: usize) {
        let c = &self.cores[core];
        c.frees.fetch_add(1, Ordering::Relaxed);
        let requested_now = c.requested.fetch_sub(requested as u64, Ordering::Relaxed).wrapping_sub(requested as u64);
        let now = c.bytes.fetch_sub(bytes as u64, Ordering::Relaxed).wrapping_sub(bytes as u64);
        self.maybe_publish(c, now, requested_now);
    }

    /// A live block's bytes went from `old` to `new` (a compaction reshaped it).
    pub(crate) fn on_resize(&self, core: usize, old: usize, new: usize) {
        let c = &self.cores[core];
        let delta = (new as u64).wrapping_sub(old as u64);
        let now = c.bytes.fetch_add(delta, Ordering::Relaxed).wrapping_add(delta);
        self.maybe_publish(c, now, c.requested.load(Ordering::Relaxed));
    }

    pub(crate) fn on_failed(&self, core: usize) {
        self.cores[core].failed_allocs.fetch_add(1, Ordering::Relaxed);
    }

    /// Take back one failure (the allocation was retried after a compaction and succeeded),
    /// from `core` or, if it has none (the thread moved), another core.
    pub(crate) fn on_rescued(&self, core: usize) {
        let n = self.cores.len();
        for i in 0..n {
            let cell = &self.cores[(core + i) % n].failed_allocs;
            if cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| f.checked_sub(1)).is_ok() {
                return;
            }
        }
    }

    /// Publish the core's bytes, and its requested bytes, each when it has moved past the
    /// slack since its last publication; a publication of the bytes may raise the peak.
    #[inline]
    fn maybe_publish(&self, c: &CoreCounters, now: u64, requested_now: u64) {
        if let Some(total) = self.publish(&c.published, now, &self.shared.published_total) {
            self.shared.peak.fetch_max((total as i64).max(0) as u64, Ordering::AcqRel);
        }
        self.publish(&c.published_requested, requested_now, &self.shared.published_requested_total);
    }

    /// Move `total` by what `now` has moved since `published`, if that passes the slack and no
    /// other thread published this core's count meanwhile; returns the new total.
    #[inline]
    fn publish(&self, published: &AtomicU64, now: u64, total: &AtomicU64) -> Option<u64> {
        let last = published.load(Ordering::Relaxed);
        let delta = now.wrapping_sub(last) as i64;
        if delta.unsigned_abs() > self.slack
            && published.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            Some(total.fetch_add(delta as u64, Ordering::AcqRel).wrapping_add(delta as u64))
        } else {
            None
        }
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
        self.shared.untagged_peak.fetch_max(current, Ordering::AcqRel).max(current)
    }

    /// Set the untagged peak to `current` (as for [`Counters::sample_untagged`]).
    pub(crate) fn reset_untagged_peak(&self, current: u64, slab_requested: i64) {
        self.shared.slab_requested.store(slab_requested as u64, Ordering::Relaxed);
        self.shared.untagged_peak.store(current, Ordering::Release);
    }

    /// Set the peak to `current` (an exact total just taken, as for [`Counters::sample`]);
    /// returns the peak it replaces.
    pub(crate) fn reset_peak(&self, current: u64, slab_bytes: u64) -> u64 {
        self.shared.slab_bytes.store(slab_bytes, Ordering::Relaxed);
        self.shared.peak.swap(current, Ordering::AcqRel)
    }

    /// Raise the peak to at least `value`.
    pub(crate) fn raise_peak(&self, value: u64) {
        self.shared.peak.fetch_max(value, Ordering::AcqRel);
    }

    /// The peak, raised to `current` first (an exact total just taken, slab objects included,
    /// whose slab part `slab_bytes` is remembered for later estimates).
    pub(crate) fn sample(&self, current: u64, slab_bytes: u64) -> u64 {
        self.shared.slab_bytes.store(slab_bytes, Ordering::Relaxed);
        self.shared.peak.fetch_max(current, Ordering::AcqRel).max(current)
    }
}

/// Raise `peak` to `estimate` if it passes it (a load, and an RMW only on a new peak).
#[inline]
fn raise(peak: &AtomicU64, estimate: i64) {
    if estimate > peak.load(Ordering::Relaxed) as i64 {
        peak.fetch_max(estimate as u64, Ordering::AcqRel);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn totals_and_exact_peak_on_one_core() {
        let c = Counters::new(1, 1 << 30);
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
        let c = Counters::new(4, 1 << 30);
        c.on_alloc(2, Route::Core, false, 1000, 1000);
        c.on_alloc(2, Route::Core, false, 3000, 3000);
        c.on_free(2, 1000, 1000);
        c.on_free(2, 3000, 3000);
        assert_eq!(c.sample(0, 0), 4000);
    }

    #[test]
    fn remote_frees_balance_across_cores() {
        let c = Counters::new(2, 1 << 30);
        for _ in 0..1000 {
            c.on_alloc(0, Route::Core, false, 4096, 4000);
        }
        for _ in 0..1000 {
            c.on_free(1, 4096, 4000);
        }
        assert_eq!(c.totals().bytes, 0);
        assert!(c.core(1).bytes < 0);
        let peak = c.sample(0, 0);
        assert!(peak <= 4096 * 1000 && peak + 2 * c.slack >= 4096 * 1000, "peak {peak}");
    }
}

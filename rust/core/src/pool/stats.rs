//! The statistics snapshot of a pool: usage, fragmentation, counters, per core and per slab
//! class. Exact when no other thread changes the pool meanwhile.

use std::collections::HashMap;

use crate::arena::buddy::Node;
use crate::arena::front::FrontLayout;
use crate::arena::global::ChunkState;
use crate::arena::layout::Layout;
use crate::pool::largest_free::Reads;
use crate::pool::pool::Pool;
use crate::stats::summary::{ClassStats, CoreStats, PoolStats};

use crate::stats::counters::Totals;
use crate::stats::thread::ClassTotals;

impl Pool {
    /// A snapshot of the pool's state and counters (see [`PoolStats`]).
    pub fn stats(&self) -> PoolStats {
        let totals = self.counters.totals();
        self.counters.mark_slab_sample(true, false);
        let classes = self.counters.class_totals();
        let (slab_bytes, slab_requested) = self.slab_objects(&classes);
        let slab_allocs: u64 = classes.iter().map(|c| c.allocs).sum();
        let slab_frees: u64 = classes.iter().map(|c| c.frees).sum();
        let usable = self.usable_capacity();
        let bytes_in_use = (totals.bytes.max(0) as u64 + slab_bytes) as usize;
        let slab_cached_bytes = self.slab_cached_bytes(&classes);
        let bytes_free = usable.saturating_sub(bytes_in_use).saturating_sub(slab_cached_bytes);
        let largest_free_block = self.largest_free_block(Reads::Pruned);
        // From bitmaps, a word per 64 chunks: the free ones from the global pool's, the cores'
        // from theirs, and the runs' the rest of the chunks the regions hold.
        let chunks_free = self.arena.global.free_in_bitmap();
        let chunks_in_cores: usize = self.arena.cores.iter().map(|c| c.owned_count()).sum();
        let present =
            if self.config.grows() { self.arena.regions.present_chunks() } else { self.arena.geometry.chunks };
        let chunks_in_runs = present.saturating_sub(chunks_free + chunks_in_cores);
        let per_core = (0..self.arena.cores.len())
            .map(|core| {
                let c = self.counters.core(core);
                let (mut used, mut free) = (0usize, 0usize);
                let owned: Vec<usize> = self.arena.cores[core].owned().collect();
                for &chunk in &owned {
                    let f = self.arena.lines[chunk].space.free_units() as usize * self.arena.geometry.min_block;
                    free += f;
                    used += self.arena.geometry.usable_bytes(chunk).saturating_sub(f);
                }
                // Cached freed blocks (`arena/block_cache.rs`) are free, though allocated in
                // their trees.
                let cached = (self.arena.block_caches.cached_bytes_of(core) as usize).min(used);
                free += cached;
                used -= cached;
                CoreStats {
                    core,
                    chunks: owned.len(),
                    bytes_in_use: used,
                    bytes_free: free,
                    alloc_count: c.allocs(),
                    free_count: c.frees,
                    overflow_allocs: c.overflow_allocs,
                    failed_allocs: c.failed_allocs,
                }
            })
            .collect();
        let size_classes = classes
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let live = t.allocs.saturating_sub(t.frees);
                let size = self.arena.slabs.classes.classes[k].size as u64;
                ClassStats {
                    size: size as usize,
                    blocks_in_use: live,
                    slabs: self.arena.slabs.live_slabs(k),
                    waste_bytes: (live * size).saturating_sub(t.requested.max(0) as u64),
                }
            })
            .collect();
        let alloc_count = totals.allocs() + slab_allocs;
        let free_count = totals.frees + slab_frees;
        PoolStats {
            capacity: self.capacity(),
            usable_capacity: usable,
            bytes_in_use,
            bytes_free,
            slab_cached_bytes,
            // The running estimate counts slab objects as of the last sample, so it may pass
            // what can be in use: never more than the pool could hold. For a pool that grows
            // that is its maximum capacity, not its capacity now: a trim that gives regions
            // back does not lower a peak that the regions held.
            peak_bytes_in_use: (self.counters.sample(bytes_in_use as u64, slab_bytes) as usize)
                .min(if self.config.grows() { self.config.limit() } else { usable }),
            requested_bytes_in_use: (totals.requested + slab_requested).max(0) as usize,
            largest_free_block,
            external_fragmentation: if bytes_free == 0 {
                0.0
            } else {
                (1.0 - largest_free_block as f64 / bytes_free as f64).max(0.0)
            },
            alloc_count,
            free_count,
            failed_allocs: totals.failed_allocs,
            overflow_allocs: totals.overflow_allocs,
            slab_allocs,
            core_allocs: totals.core_allocs,
            global_allocs: totals.global_allocs,
            blocks_in_use: alloc_count.saturating_sub(free_count),
            chunks: chunks_free + chunks_in_cores + chunks_in_runs,
            chunks_free,
            chunks_in_cores,
            chunks_in_runs,
            regions: self.arena.regions.lock().len(),
            grow_events: self.arena.regions.grow_events(),
            size_classes,
            per_core,
        }
    }

    /// At a failed allocation: raise the peak as [`Pool::sample_peak`] does, and return
    /// `stats().bytes_free` (an out-of-memory error reports it), both from one sum of the
    /// counters over every thread.
    pub(crate) fn sample_peak_and_bytes_free(&self) -> usize {
        let totals = self.counters.totals();
        self.counters.mark_slab_sample(true, true);
        let classes = self.counters.class_totals();
        let (slab_bytes, _) = self.sample_peak_of(&totals, &classes);
        self.bytes_free_of(&totals, &classes, slab_bytes)
    }

    /// `stats().bytes_free`, from one sum of the counters over every thread.
    pub(crate) fn bytes_free_now(&self) -> usize {
        let totals = self.counters.totals();
        let classes = self.counters.class_totals();
        let (slab_bytes, _) = self.slab_objects(&classes);
        self.bytes_free_of(&totals, &classes, slab_bytes)
    }

    /// `stats().bytes_free` from the counters summed over every thread, of which `slab_bytes`
    /// are the live slab objects' bytes.
    fn bytes_free_of(&self, totals: &Totals, classes: &[ClassTotals], slab_bytes: u64) -> usize {
        let bytes_in_use = (totals.bytes.max(0) as u64 + slab_bytes) as usize;
        self.usable_capacity().saturating_sub(bytes_in_use).saturating_sub(self.slab_cached_bytes(classes))
    }

    /// How many more blocks of `size` bytes (allocated with the pool's default alignment) the
    /// pool could hand out now if no free hole were too small for them: for a size that a slab
    /// class takes, the free objects of that class's slabs plus what the free bytes would carve
    /// into slabs of it; for other sizes, the free bytes over what one such block takes of the
    /// arena (its rounded size, and for a block larger than a bank the rest of its last bank,
    /// which only blocks of at most a bank can use; none when no free block holds one). An
    /// admission estimate (a KV cache's free pages on demand): exact for a slab class while no
    /// other thread allocates or frees, with the free bytes in whole slabs.
    pub fn blocks_available(&self, size: usize) -> usize {
        let totals = self.counters.totals();
        let classes = self.counters.class_totals();
        let (slab_bytes, _) = self.slab_objects(&classes);
        let free = self.bytes_free_of(&totals, &classes, slab_bytes);
        let slabs = &self.arena.slabs;
        let align = self.config.alignment;
        let Some(k) = (size > 0).then(|| slabs.classes.class_for(size, align)).flatten() else {
            return if size == 0 || size > self.largest_request || self.largest_free_block(Reads::Pruned) < size {
                0
            } else {
                free / self.arena_bytes_of_block(size, align)
            };
        };
        let class = &slabs.classes.classes[k];
        let live = classes.get(k).map_or(0, |t| t.allocs.saturating_sub(t.frees));
        let carved = free / class.slab_bytes * class.objects as usize;
        slabs.free_objects(k, live) as usize + carved
    }

    /// The bytes of the arena that one of many blocks of `size` bytes aligned to `align` takes
    /// (a request the pool can hold): its rounded size, up to the next bank for a block larger
    /// than a bank (the next such block starts on a bank boundary).
    fn arena_bytes_of_block(&self, size: usize, align: usize) -> usize {
        let g = &self.arena.geometry;
        let bytes = match g.layout(size, align) {
            Layout::Buddy(b) => b.units as usize * g.min_block,
            Layout::Run { chunks, .. } => chunks * g.chunk_size,
            Layout::RunTail { chunks, tail, .. } => chunks * g.chunk_size + tail.units as usize * g.min_block,
        };
        let bank = self.config.bank_size;
        if bytes > bank { bytes.div_ceil(bank) * bank } else { bytes }.max(1)
    }

    /// Blocks in use (`stats().blocks_in_use`), from one sum of the counters over every
    /// thread: no walk of the arena.
    pub(crate) fn live_blocks(&self) -> u64 {
        let totals = self.counters.totals();
        let slab_objects: u64 = self.counters.class_totals().iter().map(|t| t.allocs.saturating_sub(t.frees)).sum();
        totals.allocs().saturating_sub(totals.frees) + slab_objects
    }

    /// Unused bytes of the slabs that hold objects (all-free slabs count as free instead),
    /// given the slab counters summed over every thread.
    fn slab_cached_bytes(&self, classes: &[ClassTotals]) -> usize {
        self.arena.slabs.unused_bytes(&|k| classes.get(k).map_or(0, |t| t.allocs.saturating_sub(t.frees)))
    }

    /// Bytes and requested bytes of the live slab objects.
    fn slab_objects(&self, classes: &[ClassTotals]) -> (u64, i64) {
        let mut bytes = 0u64;
        let mut requested = 0i64;
        for (k, t) in classes.iter().enumerate() {
            bytes += t.allocs.saturating_sub(t.frees) * self.arena.slabs.classes.classes[k].size as u64;
            requested = requested.wrapping_add(t.requested);
        }
        (bytes, requested)
    }

    /// Start a new peak: `peak_bytes_in_use` becomes the bytes in use now. Returns the peak it
    /// replaces (a scope that measures its own peak gives it back with [`Pool::raise_peak`]).
    pub fn reset_peak(&self) -> usize {
        self.counters.mark_slab_sample(true, false);
        let (slab_bytes, _) = self.slab_objects(&self.counters.class_totals());
        let total = self.counters.totals().bytes.max(0) as u64 + slab_bytes;
        self.counters.reset_peak(total, slab_bytes) as usize
    }

    /// Raise `peak_bytes_in_use` to at least `bytes` (an earlier peak, after a scope that reset
    /// it has ended), at most the largest capacity the pool may reach (no peak was larger).
    pub fn raise_peak(&self, bytes: usize) {
        self.counters.raise_peak(bytes.min(self.config.limit()) as u64);
    }

    /// Bytes blocks can use now: the arena's, or the regions' of a pool that can grow (whole
    /// chunks each).
    pub(crate) fn usable_capacity(&self) -> usize {
        match self.config.grows() {
            true => self.capacity(),
            false => self.arena.geometry.usable_capacity(),
        }
    }

    /// Raise the peak to the exact bytes in use now (slab objects included), and the peak of
    /// the untagged requested bytes to theirs.
    pub(crate) fn sample_peak(&self) {
        self.counters.mark_slab_sample(true, true);
        self.sample_peak_of(&self.counters.totals(), &self.counters.class_totals());
    }

    /// [`Pool::sample_peak`] from the counters summed over every thread (the slab objects'
    /// read after [`crate::stats::counters::Counters::mark_slab_sample`]); returns the bytes and the requested bytes of
    /// the live slab objects.
    fn sample_peak_of(&self, totals: &Totals, classes: &[ClassTotals]) -> (u64, i64) {
        let (slab_bytes, slab_requested) = self.slab_objects(classes);
        let total = totals.bytes.max(0) as u64 + slab_bytes;
        self.counters.sample(total, slab_bytes);
        let untagged = self.untagged_of(totals.requested.wrapping_add(slab_requested));
        self.counters.sample_untagged(untagged, slab_requested);
        (slab_bytes, slab_requested)
    }

    /// The requested bytes of blocks counted under no tag, out of `requested` in all.
    pub(crate) fn untagged_of(&self, requested: i64) -> u64 {
        requested.wrapping_sub(self.counters.tagged_requested()).max(0) as u64
    }

    /// Blocks in use, their requested bytes, and the slab objects' share of those bytes.
    pub(crate) fn blocks_and_requested(&self) -> (u64, i64, i64) {
        let totals = self.counters.totals();
        let classes = self.counters.class_totals();
        let (_, slab_requested) = self.slab_objects(&classes);
        let allocs = totals.allocs() + classes.iter().map(|c| c.allocs).sum::<u64>();
        let frees = totals.frees + classes.iter().map(|c| c.frees).sum::<u64>();
        (allocs.saturating_sub(frees), totals.requested.wrapping_add(slab_requested), slab_requested)
    }

    /// The nodes that an allocation takes back before it fails, by chunk: those of the blocks
    /// in the caches of freed blocks and of the all-free slabs. Free space that the trees have
    /// allocated: the statistics and snapshots count it free.
    pub(crate) fn reclaimable_nodes(&self) -> HashMap<usize, Vec<Node>> {
        let g = &self.arena.geometry;
        let mut nodes = self.cached_nodes();
        for view in self.arena.slabs.views() {
            if view.free == self.arena.slabs.classes.classes[view.class].objects_mask() {
                let node = Node::covering(g.depth, g.unit_in_chunk(view.base), (view.bytes >> g.unit_shift) as u64);
                nodes.entry(g.chunk_of(view.base)).or_default().push(node);
            }
        }
        nodes
    }

    /// The nodes of the blocks in the caches of freed blocks (`arena/block_cache.rs`), by
    /// chunk: free space that the trees have allocated.
    pub(crate) fn cached_nodes(&self) -> HashMap<usize, Vec<Node>> {
        let g = &self.arena.geometry;
        let mut nodes: HashMap<usize, Vec<Node>> = HashMap::new();
        for (offset, class) in self.arena.block_caches.cached() {
            let b = g.cached_layout(class);
            nodes.entry(g.chunk_of(offset)).or_default().extend(b.pieces_at(g.depth, g.unit_in_chunk(offset)));
        }
        nodes
    }

    /// The free unit ranges `[from, to)` of core chunk `chunk`, in order, read from its tree
    /// (allocated nodes for which `counts_free` is true count as free).
    pub(crate) fn free_holes(&self, chunk: usize, counts_free: &dyn Fn(Node) -> bool) -> Vec<(u64, u64)> {
        let g = &self.arena.geometry;
        let usable = g.usable_units(chunk);
        let mut taken: Vec<(u64, u64)> = Vec::new();
        self.arena.shape.for_each_allocated(self.arena.tree(chunk), &mut |n| {
            if !counts_free(n) {
                taken.push((n.start(g.depth), n.units(g.depth)));
            }
        });
        taken.sort_unstable();
        let mut holes = Vec::new();
        let mut at = 0u64; // the first unit not known to be allocated
        for (start, units) in taken.into_iter().chain(std::iter::once((usable, 0))) {
            if at < start.min(usable) {
                holes.push((at, start.min(usable)));
            }
            at = at.max(start + units);
        }
        holes
    }

    /// The bytes the block of `size` requested bytes at `offset` holds.
    pub(crate) fn block_bytes_at(&self, offset: usize, size: usize, align: usize) -> usize {
        if let Some(slab) = self.arena.slabs.lookup(offset) {
            return self.arena.slabs.classes.classes[slab.class].size;
        }
        let g = &self.arena.geometry;
        if g.unit_in_chunk(offset) as usize * g.min_block + size > g.chunk_size {
            if let Some(f) = FrontLayout::of(g, offset, size) {
                return f.bytes(g);
            }
        }
        match (self.arena.global.state(g.chunk_of(offset)), g.layout(size, align)) {
            // A block too large for a chunk's tree trimmed, or one that took a whole chunk
            // where no tree could hold it (see `Pool::place_once`).
            (ChunkState::RunHead(len), _) => g.run_bytes(g.chunk_of(offset), len),
            (ChunkState::TailedRunHead(len), Layout::RunTail { tail, .. }) => {
                self.arena.tailed_run_bytes(g.chunk_of(offset), len, &tail)
            }
            (_, Layout::Buddy(b)) => b.units as usize * g.min_block,
            (_, Layout::Run { chunks, .. } | Layout::RunTail { chunks, .. }) => g.run_bytes(g.chunk_of(offset), chunks),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::arena::stretches::tests::Rng;
    use crate::config::{Backing, PoolConfig};
    use crate::pool::pool::Pool;

    /// The slab cache the statistics count from the slab counters (the current slots and the
    /// partial stacks read, not every slab) is what a read of every slab finds, after random
    /// small allocations and frees of one thread, then of two threads racing on one core's
    /// slabs (which may leave all-free slabs listed).
    #[test]
    fn the_slab_cache_from_the_counters_is_what_every_slab_says() {
        for threads in [1usize, 2] {
            let p = Pool::new(PoolConfig::new(64 << 20).cores(1).backing(Backing::None)).unwrap();
            std::thread::scope(|s| {
                for t in 0..threads {
                    let p = &p;
                    s.spawn(move || {
                        let mut rng = Rng::new(17 + t as u64);
                        let mut held = Vec::new();
                        for step in 0..60_000 {
                            if !held.is_empty() && rng.next() % 100 < 48 {
                                let h = held.swap_remove((rng.next() % held.len() as u64) as usize);
                                p.free(h).unwrap();
                            } else if let Ok(h) = p.alloc(64 + (rng.next() % 8192) as usize, None, 0) {
                                held.push(h);
                            }
                            if threads == 1 && step % 5_000 == 0 {
                                let classes = p.counters.class_totals();
                                assert_eq!(
                                    p.slab_cached_bytes(&classes),
                                    p.arena.slabs.unused_bytes_by_slab(),
                                    "step {step}"
                                );
                            }
                        }
                        // Half of them stay for the check below.
                        held.truncate(held.len() / 2);
                        std::mem::forget(held);
                    });
                }
            });
            let classes = p.counters.class_totals();
            let by_slab = p.arena.slabs.unused_bytes_by_slab();
            assert!(by_slab > 0, "{threads} threads: some slabs hold objects");
            assert_eq!(p.slab_cached_bytes(&classes), by_slab, "{threads} threads");
            assert_eq!(p.stats().slab_cached_bytes, by_slab);
        }
    }
}

//! Where a block goes: validating a request, then the slab, buddy and run paths of the
//! allocation (see `pool.rs` for the order), and reclaiming what cores hold empty before giving
//! up, or growing (chunk grants and retirements are `arena/chunks.rs`, growth `growth.rs`).

use crate::arena::chunk_space::Probe;
use crate::arena::global::ChunkState;
use crate::arena::layout::{BuddyLayout, Layout};
use crate::arena::packed::{Missed, Search, Taken};
use crate::arena::release::Vouched;
use crate::arena::reveal::Revealed;
use crate::arena::slab::caches::SlabBlocks;
use crate::error::{Error, Result, Shortfall};
use crate::handle::id::Handle;
use crate::pool::pool::Pool;
use crate::stats::counters::Route;
use crate::util::cpu;
use crate::util::grow::try_vec;
use std::cell::Cell;

/// A validated request. (The buddy or run layout is derived only when the request leaves the
/// slab path: the slab path pays for nothing it does not use.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) size: usize,
    pub(crate) align: usize,
    /// The slab class that serves it, if any.
    pub(crate) class: Option<usize>,
}

/// What an allocation got before it became a handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) offset: usize,
    pub(crate) block_bytes: usize,
    pub(crate) route: Route,
    pub(crate) overflow: bool,
    /// The slab class, for slab objects.
    pub(crate) class: Option<usize>,
}

/// In a tight arena, a block of at least `1 / PACK_FIRST` of a chunk goes to the best-fitting
/// free stretch first (`arena/tight.rs`).
const PACK_FIRST: u64 = 64;

/// A block that may take a front tries the frontier and the free ends before free chunks only
/// once the bytes the cores published for buddy blocks and runs reach this share of the
/// capacity (`Pool::place_straddling`): below it, fresh chunks keep blocks inside one chunk,
/// where a compaction can move them out of chunks it empties and holes stay inside chunks.
/// From the start, 64 KiB-1 MiB would fill to 0.98 of the arena; from 27%, 0.95; from half,
/// 0.91 (`benches/examples/mixed_sizes --only fill`).
const STRADDLE_FROM: (u64, u64) = (27, 100);

/// Where a block that took a front went (`Arena::claim_large` and its kin): its offset and bytes.
fn spanned((offset, block_bytes): (usize, usize)) -> Placed {
    Placed { offset, block_bytes, route: Route::Global, overflow: false, class: None }
}

thread_local! {
    /// The longest free stretch (in units) that the calling thread's last failed search for a
    /// free stretch learnt of (`Pool::place_packed`), for its out-of-memory error.
    static STRETCH_SEEN: Cell<u64> = const { Cell::new(0) };
    /// Blocks that the calling thread's allocation gave back from its core's cache of freed
    /// blocks on the way (`Pool::place_in_other_chunks`): room that the attempt searched for
    /// its enclosing node only, so that the failing path tries the whole placement again.
    static DRAINED_OWN: Cell<usize> = const { Cell::new(0) };
    /// The pool (by id) whose out-of-memory failures on this thread its caller records itself,
    /// once they are final (`Pool::failures_deferred`).
    static DEFERRED: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Chunks an out-of-memory error looks at, trees it reads, and words of the level maps it
/// reads past their summaries, at most, to find the largest free block.
const LARGEST_VISITS: usize = 64;
const LARGEST_READS: usize = 1;
const LARGEST_WORDS: usize = 256;

/// How many placements [`Pool::alloc_many_until`] makes between two questions to its caller.
pub(crate) const BATCH_CHECK_EVERY: usize = 1 << 16;

/// How far an allocation may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// The caller's slab cache and core pool and a fresh chunk: quick, for callers that hold a
    /// lock (the GIL).
    Fast,
    /// Everything: other cores' chunks, reclaiming empty slabs and chunks.
    Full,
}

/// Carves slabs from the buddy pool of one core (uncounted: slab objects are counted instead).
struct SlabCarver<'a> {
    pool: &'a Pool,
    core: usize,
    reach: Reach,
}

impl SlabBlocks for SlabCarver<'_> {
    fn carve(&self, bytes: usize) -> Option<usize> {
        let Layout::Buddy(b) = self.pool.arena.geometry.layout(bytes, bytes) else {
            return None;
        };
        self.pool.place_buddy(&b, self.core, self.reach).map(|p| p.offset)
    }

    fn release(&self, base: usize, bytes: usize) {
        self.pool.arena.release_slab_block(base, bytes);
    }
}

impl Pool {
    /// Allocate `size` bytes aligned to `align` (the pool's default alignment when `None`),
    /// with a tag id (0 = none; an id from [`TagTable::acquire`](crate::TagTable::acquire),
    /// held while the block lives when it is pooled): the block counts under it until it is
    /// freed. An id of the named range that no name has is stored as 0. Waits while the pool
    /// is paused.
    pub fn alloc(&self, size: usize, align: Option<usize>, tag: u32) -> Result<Handle> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.arena.cores.len());
        let _entered = self.enter()?;
        match self.place(&request, core, Reach::Full) {
            Some(placed) => self.finish(placed, &request, core, tag),
            None => Err(self.out_of_memory(&request, core, tag)),
        }
    }

    /// The quick part of an allocation only (the caller's slab cache, core pool and a fresh
    /// chunk, no waiting while paused): `Ok(None)` means "call [`Pool::alloc_quick_first`]",
    /// which may take longer. Meant for callers holding a lock they would rather release for
    /// the long part (the GIL).
    pub fn try_alloc_fast(&self, size: usize, align: Option<usize>, tag: u32) -> Result<Option<Handle>> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.arena.cores.len());
        let Some(_entered) = self.gate.try_enter() else {
            return Ok(None);
        };
        match self.place(&request, core, Reach::Fast) {
            Some(placed) => self.finish(placed, &request, core, tag).map(Some),
            None => Ok(None),
        }
    }

    /// [`Pool::alloc`] that tries the quick part's steps first (those of
    /// [`Pool::try_alloc_fast`]: the core's chunks and a fresh chunk before the frontier, the
    /// free stretches and the runs that the full path may try before them), then the full
    /// path. The long part for a caller of `try_alloc_fast`: a block lands where one call of
    /// this would put it, whether the quick attempt ran or a pause shut it out, so the layout
    /// does not depend on timing (`tests/quick_first.rs`). Waits while the pool is paused.
    pub fn alloc_quick_first(&self, size: usize, align: Option<usize>, tag: u32) -> Result<Handle> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.arena.cores.len());
        let _entered = self.enter()?;
        let placed = self.place(&request, core, Reach::Fast).or_else(|| self.place(&request, core, Reach::Full));
        match placed {
            Some(placed) => self.finish(placed, &request, core, tag),
            None => Err(self.out_of_memory(&request, core, tag)),
        }
    }

    /// Allocate every size of `sizes` (each aligned to `align`), or none of them: on the first
    /// failure [`Error::Batch`] says which one failed and why, and the pool's counters are as
    /// they were (one failed allocation counted). Every size is validated before anything is
    /// allocated. Waits while paused.
    pub fn alloc_many(&self, sizes: &[usize], align: Option<usize>, tag: u32) -> Result<Vec<Handle>> {
        let done = self.alloc_many_until(sizes, align, tag, || true)?;
        Ok(done.expect("a batch that is never stopped completes"))
    }

    /// [`Pool::alloc_many`] that asks `keep_going` every 65,536 placements and
    /// stops when it answers false: then nothing stays allocated and the answer is `Ok(None)`.
    ///
    /// Blocks are placed first and only counted, traced and given handles once all are placed,
    /// so a batch that fails or stops gives its places back without touching a counter. In a
    /// pool that grows, it then gives back the regions it added that are entirely free again
    /// (as `trim` would; `on_trim` is called for each), so that a failed batch leaves the
    /// capacity as it was; `grow_events` keeps counting those growths. Its growths give back
    /// no region that was there before it (a single request may, at the limit).
    pub fn alloc_many_until(
        &self,
        sizes: &[usize],
        align: Option<usize>,
        tag: u32,
        mut keep_going: impl FnMut() -> bool,
    ) -> Result<Option<Vec<Handle>>> {
        let request = |(index, &size): (usize, &usize)| self.request(size, align).map_err(|e| Error::batch(index, e));
        if sizes.is_empty() {
            // Nothing to allocate, but the alignment is checked as any request's.
            self.request(1, align)?;
            return Ok(Some(Vec::new()));
        }
        // The batch's own tables are reserved first (a count no host memory can list is an
        // error, not an abort), unless a size is refused: then that size is the error.
        let n = sizes.len();
        let tables = (|| {
            Ok((
                try_vec(n, "the batch's requests")?,
                try_vec(n, "the batch's places")?,
                try_vec(n, "the batch's handles")?,
            ))
        })();
        let (mut requests, mut placed, mut handles) = match tables {
            Ok(tables) => tables,
            Err(no_room) => {
                sizes.iter().enumerate().try_for_each(|item| request(item).map(drop))?;
                return Err(no_room);
            }
        };
        for item in sizes.iter().enumerate() {
            requests.push(request(item)?);
        }
        let core = cpu::current_core(self.arena.cores.len());
        let _entered = self.enter()?;
        // Its growths give back no region that was there before (see `Pool::place_grown`).
        let _keeping = self.keeping_regions();
        let regions_before = self.regions_now();
        for (index, request) in requests.iter().enumerate() {
            if index % BATCH_CHECK_EVERY == BATCH_CHECK_EVERY - 1 && !keep_going() {
                self.give_back_placed(&placed, &requests, core);
                self.trim_regions_since(regions_before.as_deref());
                return Ok(None);
            }
            match self.place(request, core, Reach::Full) {
                Some(p) => placed.push(p),
                None => {
                    // The error describes the pool as this item found it: before the batch's
                    // places (not counted yet, so not in the counters) and regions go back.
                    let taken = placed.iter().fold(0usize, |sum, p| sum.saturating_add(p.block_bytes));
                    let error = self.out_of_memory_beside(request, core, tag, taken);
                    self.give_back_placed(&placed, &requests, core);
                    // What was free for the batch: the bytes free with its places given back
                    // (not those at the failure, which count the slabs carved for its small
                    // items as taken), and the regions it added still there.
                    let free = self.bytes_free_now();
                    self.trim_regions_since(regions_before.as_deref());
                    let asked = requests.iter().fold(0usize, |sum, r| sum.saturating_add(r.size));
                    let shortfall = (asked > free).then_some(Shortfall { asked, free });
                    return Err(Error::Batch { index, error: Box::new(error), shortfall });
                }
            }
        }
        for (index, (p, request)) in placed.iter().zip(&requests).enumerate() {
            match self.finish(*p, request, core, tag) {
                Ok(handle) => handles.push(handle),
                Err(err) => {
                    // `finish` gave back this place; free what became blocks, give back the rest.
                    for handle in handles {
                        self.free_entered(handle).expect("a block just made can be freed");
                    }
                    self.give_back_placed(&placed[index + 1..], &requests[index + 1..], core);
                    self.trim_regions_since(regions_before.as_deref());
                    return Err(Error::batch(index, err));
                }
            }
        }
        // Slab objects publish no running total: the peak learns of them from the exact sample
        // taken when a slab is carved, which here came before the batch was counted.
        if placed.iter().any(|p| p.class.is_some()) {
            self.sample_peak();
        }
        Ok(Some(handles))
    }

    /// Give back places that never became blocks (uncounted), then what cores now hold empty,
    /// as a failed allocation does before it gives up: the blocks the caches of freed blocks
    /// took from those places (`arena/block_cache.rs`), all-free slabs and empty chunks. So
    /// the regions the batch added are entirely free again, and go back too.
    #[cold]
    fn give_back_placed(&self, placed: &[Placed], requests: &[Request], core: usize) {
        for (p, request) in placed.iter().zip(requests) {
            self.release_block(p.offset, request.size, Vouched::Yes).expect("a block just placed can be given back");
        }
        if !placed.is_empty() {
            self.arena.drain_block_caches_before_failing();
            let carver = SlabCarver { pool: self, core, reach: Reach::Full };
            self.arena.slabs.reclaim(&carver);
            self.arena.reclaim_empty_chunks(false);
        }
    }

    /// [`Pool::alloc`], also returning the block's offset (for callers that report it, such as
    /// the C ABI, without a second look-up).
    pub fn alloc_with_offset(&self, size: usize, align: Option<usize>, tag: u32) -> Result<(Handle, usize)> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.arena.cores.len());
        let _entered = self.enter()?;
        match self.place(&request, core, Reach::Full) {
            Some(placed) => {
                let offset = placed.offset;
                self.finish(placed, &request, core, tag).map(|handle| (handle, offset))
            }
            None => Err(self.out_of_memory(&request, core, tag)),
        }
    }

    /// Allocate without a handle: the block's offset. Free it with [`Pool::free_raw`] and the
    /// same size.
    pub fn alloc_raw(&self, size: usize, align: Option<usize>) -> Result<usize> {
        let request = self.request(size, align)?;
        let core = cpu::current_core(self.arena.cores.len());
        let _entered = self.enter()?;
        match self.place(&request, core, Reach::Full) {
            Some(placed) => {
                self.account_alloc(&placed, core, size);
                Ok(placed.offset)
            }
            None => Err(self.out_of_memory(&request, core, 0)),
        }
    }

    #[inline(always)]
    pub(crate) fn request(&self, size: usize, align: Option<usize>) -> Result<Request> {
        let align = align.unwrap_or(self.config.alignment);
        let capacity = self.limit;
        if size != 0 && size <= self.largest_request && align.is_power_of_two() && align <= capacity {
            return Ok(Request { size, align, class: self.arena.slabs.classes.class_for(size, align) });
        }
        Err(self.refusal(size, align))
    }

    /// Why `request` refused: the error for a size or alignment it cannot take. A request larger
    /// than the arena counts as a failed allocation (and is traced as one, without a tag).
    #[cold]
    fn refusal(&self, size: usize, align: usize) -> Error {
        let capacity = self.limit;
        if size == 0 {
            Error::InvalidSize { size: 0, reason: "a block must have at least 1 byte" }
        } else if size > self.largest_request {
            self.refuse_too_large(size, Some(align), 0)
        } else if !align.is_power_of_two() {
            Error::InvalidAlignment {
                align: align as u128,
                reason: "must be a power of two (1, 2, 4, ... bytes)".into(),
            }
        } else {
            Error::InvalidAlignment {
                align: align as u128,
                reason: format!("must not be larger than the arena ({capacity} bytes)"),
            }
        }
    }

    /// The error for a request of `size` bytes, larger than [`Pool::largest_request`], from a
    /// caller that checked the size itself (the binding): it counts as a failed allocation and is
    /// traced as one, like a request nothing could place. It carries the pool's free bytes and
    /// a largest free block found in bounded work, as an out-of-memory error does.
    #[cold]
    pub fn refuse_too_large(&self, size: usize, align: Option<usize>, tag: u32) -> Error {
        self.record_failure(size, align, tag);
        Error::TooLarge {
            size,
            capacity: self.limit,
            usable: self.largest_request,
            first_region: self.config.grows().then_some(self.config.capacity),
            bytes_free: self.bytes_free_now(),
            largest_free_block: self.largest_free_after_failure(None),
        }
    }

    /// Run `f` with the out-of-memory failures of this pool's allocations on the calling thread
    /// left unrecorded: such an allocation returns its error as usual but counts nothing in
    /// `failed_allocs` and traces no `failed` event. For a caller that may still rescue the
    /// allocation (an out-of-memory handler that makes room, then a retry): it records the
    /// final failure with [`Pool::record_failure`], once, or nothing when the retry succeeds,
    /// so that the counter never counts an allocation that succeeded and never goes down. A
    /// request refused as too large is recorded as usual (no handler can rescue it).
    pub fn failures_deferred<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<u32>);
        impl Drop for Restore {
            fn drop(&mut self) {
                DEFERRED.with(|d| d.set(self.0));
            }
        }
        let _restore = Restore(DEFERRED.with(|d| d.replace(Some(self.id))));
        f()
    }

    /// Record the final failure of an allocation of `size` bytes aligned to `align` (the
    /// pool's default when `None`) with tag id `tag`: one more `failed_allocs`, and a `failed`
    /// event in the trace. For the caller of [`Pool::failures_deferred`], and for a request
    /// refused before it entered the pool ([`Pool::refuse_too_large`]).
    ///
    /// It enters the pool as an allocation does: the trace's rings are replaced only while the
    /// pool is paused, so an event written from outside could land in rings being freed. A
    /// pause another thread holds is waited for; where the wait is refused (the pause outlasted
    /// its timeout, or the process forked mid-call), the failure is counted but not traced.
    #[cold]
    pub fn record_failure(&self, size: usize, align: Option<usize>, tag: u32) {
        let core = cpu::current_core(self.arena.cores.len());
        self.counters.on_failed(core);
        if let Ok(_entered) = self.enter() {
            self.trace.on_failed(core, size, align.unwrap_or(self.config.alignment), tag);
        }
    }

    pub(crate) fn finish(&self, placed: Placed, request: &Request, core: usize, tag: u32) -> Result<Handle> {
        let align_log2 = request.align.trailing_zeros() as u8;
        let tag = if tag == 0 { 0 } else { self.tags.stored(tag) };
        let inserted = self
            .counters
            .with_slot_cache(|cache| self.handles.insert(core, cache, placed.offset, request.size, align_log2, tag));
        match inserted {
            Ok(handle) => {
                // Counted under its tag inside the call, as its free counts it back: a pause
                // (and so a snapshot) sees every tag's figures add up to the blocks. Before the
                // pool's own counters, so that the untagged blocks' figures (the pool's less the
                // tagged ones) never count it, not even for a moment (their peak is sampled).
                self.count_tagged_alloc(tag, request.size);
                self.account_alloc(&placed, core, request.size);
                self.trace.on_alloc(core, handle, placed.offset, request.size, request.align, tag);
                Ok(handle)
            }
            Err(err) => {
                self.release_block(placed.offset, request.size, Vouched::Yes)
                    .expect("a block just placed can be freed");
                Err(err)
            }
        }
    }

    /// Count an allocation (in the calling thread's counters: `stats/thread.rs`).
    #[inline(always)]
    pub(crate) fn account_alloc(&self, placed: &Placed, core: usize, size: usize) {
        match placed.class {
            Some(k) => self.counters.on_slab_alloc(k, size),
            None => self.counters.on_alloc(core, placed.route, placed.overflow, placed.block_bytes, size),
        }
    }

    /// The error (and the count and trace event, unless [`Pool::failures_deferred`] leaves
    /// them to the caller) for a request nothing could place.
    #[cold]
    pub(crate) fn out_of_memory(&self, request: &Request, core: usize, tag: u32) -> Error {
        self.out_of_memory_beside(request, core, tag, 0)
    }

    /// [`Pool::out_of_memory`] beside `taken` bytes that the caller placed and has not counted
    /// yet (a batch's earlier items): they are not free.
    #[cold]
    fn out_of_memory_beside(&self, request: &Request, core: usize, tag: u32, taken: usize) -> Error {
        if DEFERRED.with(Cell::get) != Some(self.id) {
            self.counters.on_failed(core);
            self.trace.on_failed(core, request.size, request.align, tag);
        }
        // The peak is exact at a failure (as a statistics snapshot makes it).
        let free = self.sample_peak_and_bytes_free();
        Error::OutOfMemory {
            requested: request.size,
            bytes_free: free.saturating_sub(taken),
            largest_free_block: self.largest_free_after_failure(Some(request)),
            largest_region: self.largest_region(),
            unplaced_growth: self.take_unplaced_growth(),
        }
    }

    /// The largest free block, right after an allocation failed (and gave back what cores held
    /// empty), in bounded work: the largest free chunk run (looked for only when the global
    /// pool has a free chunk), or the longest free stretch from a bank boundary of a core chunk
    /// read from its tree. For a block larger than a bank, that is the longest its own failed
    /// search read (of every chunk that might have held it), if it read any. Otherwise the
    /// chunks of the highest length classes of the stretch index (`Arena::longest_stretch_by_class`:
    /// mostly one chunk, whose place gives its longest stretch without a read); when the index
    /// knows of no stretch, the chunks are visited through the level maps from the largest free
    /// node down and read from their trees. At most [`LARGEST_VISITS`] chunks,
    /// [`LARGEST_READS`] trees and [`LARGEST_WORDS`] words of the level maps in all (on a large
    /// arena whose chunks are full, the maps of each level name most chunks as may-hold and
    /// the level above names them too: without that bound, a failing allocation of 64 GiB read
    /// every word of every level), skipping the chunks whose stretch memo (an upper bound) says
    /// they cannot pass what was found. What is not read is left out: the answer is a lower
    /// bound, a block that was free when it was read. Without a request (one refused as too
    /// large, which searched nothing), the chunks are read as for a small block. A free stretch
    /// counts as the largest request whose block it holds (the layout's rounding taken off), so
    /// that a request of the answer's size succeeds while nothing changes.
    #[cold]
    fn largest_free_after_failure(&self, request: Option<&Request>) -> usize {
        let g = &self.arena.geometry;
        // A stretch counts from a bank boundary; at a default alignment above a bank, a block
        // starts on the next multiple of the alignment, at most this many units later.
        let from_aligned = |units: u64| units.saturating_sub(g.banked_start_units() - g.bank_units);
        let mut largest = 0;
        if self.arena.global.has_free() {
            let runs = self.arena.global.free_runs_now();
            largest = runs.iter().map(|&run| self.arena.largest_block_in_run(run)).max().unwrap_or(0);
        }
        if let Some(request) = request.filter(|r| r.class.is_none()) {
            if let Layout::Buddy(b) = g.layout(request.size, request.align) {
                let seen = g.largest_request_in_stretch(from_aligned(STRETCH_SEEN.with(Cell::get)));
                // A search that ruled every chunk out by its memo read no tree: then the chunks
                // are read as for a small block.
                if b.units as usize * g.min_block > self.config.bank_size && seen > 0 {
                    return largest.max(seen);
                }
            }
        }
        let bank = g.bank_units(self.config.bank_size);
        let node_bytes = |level: u32| (1usize << (g.depth - level)) * g.min_block;
        // A free stretch from a bank boundary holds a node as long as its largest power of two
        // up to a bank, at its start.
        let node_bytes_within = |units: u64| match from_aligned(units).min(bank) {
            0 => 0,
            u => (1usize << u.ilog2()) * g.min_block,
        };
        let (mut visits, mut reads, mut words) = (LARGEST_VISITS, LARGEST_READS, LARGEST_WORDS);
        let by_class = g.largest_request_in_stretch(from_aligned(self.arena.longest_stretch_by_class(
            bank,
            &mut reads,
            &mut visits,
        )));
        if by_class > 0 {
            return largest.max(by_class);
        }
        // Past this point a chunk adds to the answer only by a read of its tree (the level maps
        // say where a free node may be, not that one is).
        if reads == 0 {
            return largest;
        }
        for level in 0..=g.depth {
            // The chunks left have no free node of the level above: no free stretch of twice
            // its size.
            if level > 0 && largest >= 2 * node_bytes(level - 1) {
                break;
            }
            for pool in self.arena.cores.iter() {
                let owned = |w: usize| pool.owned_word(w);
                let mut from = 0;
                while let Some(chunk) = pool.maps.next_largest_at(level, from, &owned, &mut words) {
                    from = chunk + 1;
                    visits = match visits.checked_sub(1) {
                        Some(left) => left,
                        None => return largest,
                    };
                    let above = (largest / g.min_block) as u64;
                    if let Some(units) = self.arena.longest_stretch_above(chunk, bank, above, &mut reads) {
                        largest = largest
                            .max(g.largest_request_in_stretch(from_aligned(units)).max(node_bytes_within(units)));
                    }
                    // A free node that no stretch from a bank boundary holds (the rest of a
                    // bank whose start a block larger than a bank took) serves a request of
                    // its size: the tree's largest free node, where the maps say it may pass
                    // what was found.
                    if node_bytes(level) > largest && reads > 0 {
                        reads -= 1;
                        let tree = self.arena.tree(chunk);
                        // One smaller than the default alignment may not start on it.
                        let free_level = self.arena.shape.largest_free_level_with(tree, &|_| false);
                        if let Some(free_level) = free_level.filter(|&l| (1u64 << (g.depth - l)) >= g.align_units) {
                            largest = largest.max(node_bytes(free_level).min(self.largest_request));
                        }
                    }
                    if reads == 0 {
                        return largest;
                    }
                }
                if words == 0 {
                    return largest;
                }
            }
        }
        largest
    }

    /// Find a place for `request`: first the fast path (an object of the core's current slab),
    /// then everything else; with [`Reach::Full`], empty slabs and chunks are reclaimed, hidden
    /// levels of the cores' chunks revealed, and the request tried once more before giving up.
    #[inline(always)]
    pub(crate) fn place(&self, request: &Request, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(k) = request.class {
            if let Some(offset) = self.arena.slabs.take_current(k, core) {
                return Some(Placed {
                    offset,
                    block_bytes: self.arena.slabs.classes.classes[k].size,
                    route: Route::Slab,
                    overflow: false,
                    class: Some(k),
                });
            }
        } else if let Some(placed) = self.take_cached(request, core) {
            return Some(placed);
        }
        self.place_slow(request, core, reach)
    }

    /// A block of the request's class from the core's cache of freed blocks
    /// (`arena/block_cache.rs`), if it holds one and the request's alignment is at most a bank
    /// (every cached block starts on one).
    #[inline(always)]
    fn take_cached(&self, request: &Request, core: usize) -> Option<Placed> {
        let g = &self.arena.geometry;
        if request.align > g.bank_units as usize * g.min_block {
            return None;
        }
        let Layout::Buddy(b) = g.layout(request.size, request.align) else {
            return None;
        };
        let class = g.cache_class(&b)?;
        let block_bytes = b.units as usize * g.min_block;
        let offset = self.arena.block_caches.take(core, class, block_bytes as u64)?;
        Some(Placed { offset, block_bytes, route: Route::Core, overflow: false, class: None })
    }

    /// Everything after the fast path. With [`Reach::Full`], when nothing had room: the caches
    /// of freed blocks give their blocks back to the trees, the cores'
    /// all-free current slabs go back (the free that empties any other slab retires it), hidden
    /// room is revealed (`arena/reveal.rs`) and the empty chunks that cores hold go back; the
    /// request is tried once more everywhere when that gave something back or revealed every
    /// chunk, and otherwise only in the few chunks revealed, so a failure costs a few
    /// searches; then a pool that can grow grows.
    #[inline(never)]
    fn place_slow(&self, request: &Request, core: usize, reach: Reach) -> Option<Placed> {
        DRAINED_OWN.with(|d| d.set(0));
        if let Some(placed) = self.place_once(request, core, reach) {
            return Some(placed);
        }
        if reach == Reach::Fast {
            return None;
        }
        let cached = self.arena.drain_block_caches_before_failing() + DRAINED_OWN.with(Cell::get);
        let carver = SlabCarver { pool: self, core, reach };
        let slabs = self.arena.slabs.reclaim_before_failing(&carver);
        // A slab object that no slab can be carved for goes to the buddy path on its own, so
        // any request may fit the room of its own size.
        let units = request.size.div_ceil(self.arena.geometry.min_block) as u64;
        let revealed = self.arena.reveal_hidden(units);
        let chunks = self.arena.reclaim_empty_mapped();
        if cached + slabs + chunks + revealed.rests > 0 || revealed.every {
            if let Some(placed) = self.place_once(request, core, reach) {
                return Some(placed);
            }
        } else if let Some(placed) = self.place_in_revealed(request, core, &revealed) {
            return Some(placed);
        }
        self.place_grown(request, core, reach)
    }

    /// A buddy block in the chunks a failing allocation revealed (a slab object tries
    /// everything again: its slab may come from anywhere).
    #[cold]
    fn place_in_revealed(&self, request: &Request, core: usize, revealed: &Revealed) -> Option<Placed> {
        if revealed.count == 0 {
            return None;
        }
        if request.class.is_some() {
            return self.place_once(request, core, Reach::Full);
        }
        let g = &self.arena.geometry;
        let Layout::Buddy(b) = g.layout(request.size, request.align) else {
            return None;
        };
        let align_units = g.packed_alignment(b.units, request.align, self.config.bank_size);
        let bank = g.bank_units(self.config.bank_size);
        revealed.chunks[..revealed.count].iter().find_map(|&(chunk, owner)| {
            if self.arena.global.state(chunk) != ChunkState::Core(owner) {
                return None;
            }
            let probe = self.arena.lines[chunk].space.probe(b.units)?;
            let mut placed = match self.alloc_in_chunk(chunk, &b, owner, probe, true) {
                Some(placed) => placed,
                None if b.units as usize * g.min_block > self.config.bank_size => {
                    let start = self.arena.take_stretch(chunk, &b, align_units, bank).ok()?;
                    Placed {
                        offset: g.offset_of(chunk, start),
                        block_bytes: b.units as usize * g.min_block,
                        route: Route::Core,
                        overflow: false,
                        class: None,
                    }
                }
                None => return None,
            };
            placed.overflow = owner != core;
            Some(placed)
        })
    }

    pub(crate) fn place_once(&self, request: &Request, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(k) = request.class {
            let carver = SlabCarver { pool: self, core, reach };
            if let Some((offset, carved)) = self.arena.slabs.alloc(k, core, &carver) {
                if carved {
                    self.sample_peak();
                }
                return Some(Placed {
                    offset,
                    block_bytes: self.arena.slabs.classes.classes[k].size,
                    route: Route::Slab,
                    overflow: false,
                    class: Some(k),
                });
            }
            // No slab could be carved: the buddy path may still fit the object on its own.
        }
        match self.arena.geometry.layout(request.size, request.align) {
            // A block of more than half a chunk that no chunk's tree can hold (the arena's
            // short last chunk is too short for its trimmed pieces): a whole chunk, as a run.
            // More than half a chunk: first across two chunks where that fills a tight spot.
            // Only the full path can tell that no tree holds it: the quick part leaves some
            // blocks to the full path (`Pool::place_block`), which always follows a quick
            // attempt that placed nothing.
            Layout::Buddy(b) if b.level == 0 => self
                .place_large(request, Layout::Buddy(b), core)
                .or_else(|| self.place_block(&b, request.align, core, reach))
                .or_else(|| (reach == Reach::Full).then(|| self.place_run(1, 1, request.size)).flatten()),
            // Larger than a bank: maybe across two chunks (`Pool::place_straddling`), and
            // across two chunks when nothing else has room (the full path only).
            Layout::Buddy(b) if self.straddles(&b, request.align) => {
                if self.straddles_first() {
                    return self.place_straddling(request, b, core, reach);
                }
                self.place_block(&b, request.align, core, reach)
                    .or_else(|| (reach == Reach::Full).then(|| self.place_across(request, b, core)).flatten())
            }
            Layout::Buddy(b) => self.place_block(&b, request.align, core, reach),
            layout @ (Layout::Run { .. } | Layout::RunTail { .. }) => self.place_large(request, layout, core),
        }
    }

    /// Whether buddy block `b` (of at most half a chunk) may take a front: with `run_tails`, a
    /// block larger than a bank (a smaller one never straddles a bank, let alone a chunk),
    /// aligned to at most a chunk.
    #[inline]
    fn straddles(&self, b: &BuddyLayout, align: usize) -> bool {
        let g = &self.arena.geometry;
        g.tails && b.units as usize * g.min_block > self.config.bank_size && align <= g.chunk_size
    }

    /// Whether a block that may take a front looks across chunk ends before the buddy path
    /// cuts a fresh chunk: once [`STRADDLE_FROM`] of the capacity is in use (as the calling
    /// thread can tell) and while the arena is not tight (then free stretches come first, and
    /// then the buddy path: with blocks with a front before fresh chunks there too, a full
    /// compaction of an arena filled with 1-100 KiB blocks, every other one freed, fell up to
    /// three chunks short of the best packing, `tests/front_compaction.rs`).
    #[inline]
    fn straddles_first(&self) -> bool {
        let in_use = self.counters.bytes_in_use_estimate();
        !self.packs_first() && in_use * STRADDLE_FROM.1 >= self.capacity() as u64 * STRADDLE_FROM.0
    }

    /// Whether block `b`, larger than a bank, goes to the best-fitting free stretch anywhere
    /// first: one of [`PACK_FIRST`] of a chunk or more, or a trimmed one, once the arena is
    /// tight or its buddy blocks and runs hold 2/3 of it ([`Pool::packs_first`]).
    #[inline]
    fn packs_anywhere_first(&self, b: &BuddyLayout) -> bool {
        (b.units >= self.arena.geometry.units_per_chunk() / PACK_FIRST || !b.is_whole()) && self.packs_first()
    }

    /// A buddy block that may take a front (`arena/front.rs`), when [`Pool::straddles_first`]:
    /// a block that the core's own chunks cannot hold ([`Pool::place_in_own`]) takes the
    /// *frontier* (the free end of the chunk where the last such block left room, or a front
    /// there and a tail in the next chunk), else the best fit among the free ends of core
    /// chunks before free chunks, before the buddy path cuts a fresh chunk: so such blocks
    /// tile the arena across chunk ends instead of leaving each chunk's end to smaller blocks.
    /// Then the buddy path, then [`Pool::place_across`]. The quick part ([`Reach::Fast`])
    /// takes only the first step, so that a caller who tries it first (the binding) places the
    /// block as [`Pool::alloc`] does: with a fresh chunk there before the fronts, one size of
    /// 700,000 B filled the arena from Python to 0.67, against 0.79 this way.
    #[inline(never)]
    fn place_straddling(&self, request: &Request, b: BuddyLayout, core: usize, reach: Reach) -> Option<Placed> {
        let align = self.straddle_align(request);
        let g = &self.arena.geometry;
        let held = self.place_in_own(&b, g.packed_alignment(b.units, request.align, self.config.bank_size), core);
        if reach == Reach::Fast {
            return held;
        }
        held.or_else(|| self.arena.claim_at_frontier(request.size, &b, align, core).map(spanned))
            .or_else(|| self.arena.claim_large_in(request.size, Layout::Buddy(b), align, core, false).map(spanned))
            .or_else(|| self.place_block(&b, request.align, core, reach))
            .or_else(|| self.place_across(request, b, core))
    }

    /// The last resort of a block that may take a front and found no room elsewhere: the best
    /// fit among the free ends of every core chunk and the boundaries of two core chunks (a
    /// front and a tail).
    #[cold]
    #[inline(never)]
    fn place_across(&self, request: &Request, b: BuddyLayout, core: usize) -> Option<Placed> {
        let align = self.straddle_align(request);
        self.arena.claim_large(request.size, Layout::Buddy(b), align, core).map(spanned)
    }

    /// The alignment, in units, of a block that takes a front: a bank at least.
    fn straddle_align(&self, request: &Request) -> u64 {
        let g = &self.arena.geometry;
        g.bank_units.max((request.align >> g.unit_shift) as u64)
    }

    pub(crate) fn place_buddy(&self, b: &BuddyLayout, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(placed) = self.alloc_in_core(b, core) {
            return Some(placed);
        }
        self.place_buddy_elsewhere(b, core, reach)
    }

    /// [`Pool::place_buddy`] after the core's own chunks had no room: a fresh chunk, other
    /// cores' chunks, then a trimmed block's pieces.
    fn place_buddy_elsewhere(&self, b: &BuddyLayout, core: usize, reach: Reach) -> Option<Placed> {
        self.place_in_other_chunks(b, core, reach).or_else(|| match reach {
            Reach::Full => self.place_pieces(b, core),
            Reach::Fast => None,
        })
    }

    /// A fresh chunk, then (with [`Reach::Full`]) other cores' chunks. Whether the global pool
    /// had a chunk to grant sets the arena's *tight* mode (`arena/tight.rs`).
    fn place_in_other_chunks(&self, b: &BuddyLayout, core: usize, reach: Reach) -> Option<Placed> {
        // A chunk that holds the trimmed block will do (the arena's last chunk may be short).
        let bytes = b.units as usize * self.arena.geometry.min_block;
        let grant = || self.arena.global.has_free().then(|| self.arena.grant(core, bytes)).flatten();
        if let Some(chunk) = grant() {
            self.arena.tight.leave();
            if let Some(placed) = self.alloc_in_fresh_chunk(chunk, b, core) {
                return Some(placed);
            }
        } else {
            // No chunk to be had: the blocks the core's cache keeps are room of its own chunks,
            // which comes before room of other cores' (and does not make the arena tight).
            let drained = if reach == Reach::Full { self.arena.drain_block_cache_of(core) } else { 0 };
            if drained > 0 {
                DRAINED_OWN.with(|d| d.set(d.get() + drained));
                if let Some(placed) = self.alloc_in_core(b, core) {
                    return Some(placed);
                }
            }
            self.arena.tight.enter();
        }
        if reach == Reach::Fast {
            return None;
        }
        // Overflow: room in other cores' chunks (including the ones they keep in reserve).
        let cores = self.arena.cores.len();
        for i in 1..cores {
            if let Some(mut placed) = self.alloc_in_core(b, (core + i) % cores) {
                placed.overflow = true;
                return Some(placed);
            }
        }
        // A chunk may have come free meanwhile.
        let chunk = grant()?;
        self.alloc_in_fresh_chunk(chunk, b, core)
    }

    /// A trimmed block fits where its pieces are free, though no whole enclosing node is: the
    /// chunks that may hold a free node of half its enclosing size.
    fn place_pieces(&self, b: &BuddyLayout, core: usize) -> Option<Placed> {
        if b.is_whole() {
            return None;
        }
        let cores = self.arena.cores.len();
        (0..cores).find_map(|i| {
            let owner = (core + i) % cores;
            let pool = &self.arena.cores[owner];
            let owned = |w: usize| pool.owned_word(w);
            let mut from = 0;
            while let Some(chunk) = pool.maps.next(b.level + 1, from, &owned) {
                from = chunk + 1;
                let Some(probe) = self.arena.lines[chunk].space.probe(b.units) else {
                    continue;
                };
                if let Some(mut placed) = self.alloc_in_chunk(chunk, b, owner, probe, true) {
                    placed.overflow = owner != core;
                    return Some(placed);
                }
            }
            None
        })
    }

    /// A buddy block of a request. A block of at most a bank: the buddy path. A larger one that
    /// packs anywhere first ([`Pool::packs_anywhere_first`]: of [`PACK_FIRST`] of a chunk or
    /// more, or trimmed, in a tight arena): the best-fitting free stretch of any core's chunk
    /// first (`arena/tight.rs` says why). Otherwise the calling core's own chunks first
    /// ([`Pool::place_in_own`]), then a fresh chunk or other cores' chunks, then the
    /// best-fitting free stretch anywhere. A free stretch holds every place where a trimmed
    /// block's pieces fit, so the pieces are not searched for such a block. The quick part
    /// ([`Reach::Fast`]) leaves a block that goes to a free stretch first to the full path, so
    /// that a caller who tries the quick part first (the binding, with the GIL held) places it
    /// as [`Pool::alloc`] does: taken at their enclosing nodes, such blocks break up the
    /// stretches (a churn at 85% from Python then fails about 2% of its allocations).
    #[inline]
    fn place_block(&self, b: &BuddyLayout, align: usize, core: usize, reach: Reach) -> Option<Placed> {
        let g = &self.arena.geometry;
        if b.units as usize * g.min_block <= self.config.bank_size {
            return self.place_buddy(b, core, reach);
        }
        let align_units = g.packed_alignment(b.units, align, self.config.bank_size);
        if self.packs_anywhere_first(b) {
            if reach == Reach::Fast {
                return None;
            }
            if let Some(placed) = self.place_packed(b, align_units, core, reach) {
                return Some(placed);
            }
            return self.place_in_other_chunks(b, core, reach);
        }
        if let Some(placed) = self.place_in_own(b, align_units, core) {
            return Some(placed);
        }
        self.place_in_other_chunks(b, core, reach).or_else(|| self.place_packed(b, align_units, core, reach))
    }

    /// Block `b`, larger than a bank, in the calling core's own chunks, first fit in address
    /// order (small blocks gather low, the high chunks stay whole for large blocks): a whole
    /// power of two at a free enclosing node, a trimmed block in the best-fitting free stretch
    /// of the first chunk that has a stretch that holds it (`Search::FirstOwn`), from a
    /// multiple of `align_units`, next to the blocks around it. At its enclosing node a trimmed
    /// block would leave the rest of the node to smaller blocks only, and blocks of one fixed
    /// size would strand that rest every time: 70,000 bytes take 72 KiB of a 128 KiB node, and
    /// an arena filled with them held 0.53 of its bytes in requests at the first failure (0.94
    /// in stretches; `benches/examples/mixed_sizes --only fill`, the fixed mixes).
    #[inline]
    fn place_in_own(&self, b: &BuddyLayout, align_units: u64, core: usize) -> Option<Placed> {
        if b.is_whole() {
            return self.alloc_in_core(b, core);
        }
        let bank = self.arena.geometry.bank_units(self.config.bank_size);
        let t = self.arena.take_best_stretch(b, align_units, bank, Search::FirstOwn(core), &mut 0).ok()?;
        Some(self.taken_stretch(b, t, core))
    }

    /// What block `b` got in the free stretch a search took for core `core`.
    fn taken_stretch(&self, b: &BuddyLayout, t: Taken, core: usize) -> Placed {
        let g = &self.arena.geometry;
        Placed {
            offset: g.offset_of(t.chunk, t.start),
            block_bytes: b.units as usize * g.min_block,
            route: Route::Core,
            overflow: t.owner != core,
            class: None,
        }
    }

    /// Whether a large block goes to the best-fitting free stretch first: in a tight arena, or
    /// once the bytes of buddy blocks and runs in use (as the calling thread can tell) reach
    /// 2/3 of the capacity, before the last chunks are granted (`arena/tight.rs` says why).
    #[inline]
    fn packs_first(&self) -> bool {
        self.arena.tight.is_on() || self.packs_for_bytes()
    }

    /// Whether the bytes of buddy blocks and runs in use (as the calling thread can tell)
    /// reach 2/3 of the capacity: from there large blocks pack for room, below it only
    /// because the global pool ran out of chunks (many cores each hold part-filled chunks).
    #[inline]
    fn packs_for_bytes(&self) -> bool {
        self.counters.bytes_in_use_estimate() / 2 >= self.capacity() as u64 / 3
    }

    /// A block larger than a bank in a free stretch, from a bank boundary (or the caller's
    /// coarser alignment): the best fit across the cores' chunks (`arena/packed.rs`; below the
    /// bytes threshold of [`Pool::packs_for_bytes`], the calling core's own chunks first), then,
    /// when no chunk took it and that search could not rule out every chunk, the best-fitting
    /// stretch of the first chunk that has one, the calling core's chunks first. When none
    /// has, the longest stretch the search learnt of is left in [`STRETCH_SEEN`] for the
    /// out-of-memory error.
    #[inline(never)]
    fn place_packed(&self, b: &BuddyLayout, align_units: u64, core: usize, reach: Reach) -> Option<Placed> {
        if reach == Reach::Fast {
            return None;
        }
        let g = &self.arena.geometry;
        let cores = self.arena.cores.len();
        let mut seen = 0;
        let bank = g.bank_units(self.config.bank_size);
        // Below the bytes threshold there is room to spare: a core's own chunks come first,
        // so that its threads do not write the trees other cores' threads use. From there,
        // every block takes the best fit anywhere, which fails far fewer allocations.
        let from = match self.packs_for_bytes() {
            true => Search::Anywhere(core),
            false => Search::OwnFirst(core),
        };
        let placed = match self.arena.take_best_stretch(b, align_units, bank, from, &mut seen) {
            Ok(t) => return Some(self.taken_stretch(b, t, core)),
            // Every chunk's memo or tree ruled the block out: the first fit would read the
            // same memos again (on a failing allocation, the larger part of its work).
            Err(Missed::Everywhere) => None,
            Err(Missed::Unsure) => {
                (0..cores).find_map(|i| self.place_packed_in(b, align_units, core, (core + i) % cores, &mut seen))
            }
        };
        if placed.is_none() {
            STRETCH_SEEN.with(|s| s.set(seen));
        }
        placed
    }

    /// The best-fitting free stretch for `b` in the first chunk of `owner` that has one. Only
    /// chunks that may hold a free node of the largest size every such stretch contains are
    /// read, and one whose stretch memo rules the block out costs two loads. `seen` keeps the
    /// longest stretch (in units) learnt of on the way.
    fn place_packed_in(
        &self,
        b: &BuddyLayout,
        align_units: u64,
        core: usize,
        owner: usize,
        seen: &mut u64,
    ) -> Option<Placed> {
        let g = &self.arena.geometry;
        // A free stretch of `units` units holds a naturally aligned node of 2^j units when
        // units >= 2^(j+1) - 1.
        let j = 63 - (b.units + 1).leading_zeros() - 1;
        let level = g.depth - j.min(g.depth);
        let bank = g.bank_units(self.config.bank_size);
        let pool = &self.arena.cores[owner];
        let owned = |w: usize| pool.owned_word(w);
        let mut from = 0;
        while let Some(chunk) = pool.maps.next(level, from, &owned) {
            from = chunk + 1;
            match self.arena.take_stretch(chunk, b, align_units, bank) {
                Ok(start) => {
                    return Some(Placed {
                        offset: g.offset_of(chunk, start),
                        block_bytes: b.units as usize * g.min_block,
                        route: Route::Core,
                        overflow: owner != core,
                        class: None,
                    })
                }
                Err(longest) => *seen = (*seen).max(longest),
            }
        }
        None
    }

    /// [`Arena::alloc_in_core`](crate::arena::arena::Arena::alloc_in_core): block `b` in the
    /// chunks owned by `owner`.
    #[inline(always)]
    fn alloc_in_core(&self, b: &BuddyLayout, owner: usize) -> Option<Placed> {
        self.arena.alloc_in_core(b, owner).map(|offset| self.in_core(b, offset))
    }

    /// [`Arena::alloc_in_chunk`](crate::arena::arena::Arena::alloc_in_chunk): block `b` in
    /// chunk `chunk`, searched after `probe`.
    #[inline(always)]
    fn alloc_in_chunk(
        &self,
        chunk: usize,
        b: &BuddyLayout,
        hint_owner: usize,
        probe: Probe,
        thorough: bool,
    ) -> Option<Placed> {
        self.arena.alloc_in_chunk(chunk, b, hint_owner, probe, thorough).map(|offset| self.in_core(b, offset))
    }

    /// [`Arena::alloc_in_fresh_chunk`](crate::arena::arena::Arena::alloc_in_fresh_chunk): block
    /// `b` in chunk `chunk`, just granted to `core`.
    fn alloc_in_fresh_chunk(&self, chunk: usize, b: &BuddyLayout, core: usize) -> Option<Placed> {
        self.arena.alloc_in_fresh_chunk(chunk, b, core).map(|offset| self.in_core(b, offset))
    }

    /// What block `b`, placed at `offset` by the buddy path in a core's chunk, got.
    #[inline(always)]
    fn in_core(&self, b: &BuddyLayout, offset: usize) -> Placed {
        Placed {
            offset,
            block_bytes: b.units as usize * self.arena.geometry.min_block,
            route: Route::Core,
            overflow: false,
            class: None,
        }
    }

    /// Give back what cores keep cached: every freed block in their caches of freed blocks
    /// (`arena/block_cache.rs`, not counted in the result), every all-free slab and every
    /// empty chunk (an
    /// allocation does this by itself before it fails; a caller may want it earlier, e.g.
    /// before a snapshot or when the pool goes idle); then, in a pool that grew, every region
    /// that is entirely free except the first (`pool/growth.rs`). Returns the slabs and chunks
    /// given back, the chunks of the regions given back included.
    ///
    /// Waits for another thread's pause as an allocation does, and fails as one does when it
    /// cannot enter the pool: the pause outlasted its timeout ([`Error::PausedTooLong`]), the
    /// caller's interrupt check stopped the wait, the calling thread is moving blocks (inside
    /// a mover) or this child process cannot use the pool ([`Error::ForkedMidCall`]). Nothing
    /// is given back then.
    pub fn trim(&self) -> Result<usize> {
        let core = crate::util::cpu::current_core(self.arena.cores.len());
        let _entered = self.enter()?;
        let carver = SlabCarver { pool: self, core, reach: Reach::Full };
        self.arena.drain_block_caches();
        let given_back = self.arena.slabs.reclaim(&carver) + self.arena.reclaim_empty_chunks(false);
        Ok(given_back + self.trim_regions())
    }

    fn place_run(&self, chunks: usize, align_chunks: usize, size: usize) -> Option<Placed> {
        let start = self.arena.global.claim(&self.arena.geometry, chunks, size, align_chunks)?;
        self.arena.mark_run(start, chunks);
        Some(Placed {
            offset: start * self.arena.geometry.chunk_size,
            block_bytes: self.arena.geometry.run_bytes(start, chunks),
            route: Route::Global,
            overflow: false,
            class: None,
        })
    }

    /// A block of layout `layout`: with `run_tails` and an alignment of at most a chunk, the
    /// best fit among runs and blocks with a front (`arena/front.rs`); otherwise a run. A
    /// buddy block (of more than half a chunk) only where it fits with a front (`None`
    /// otherwise: the buddy path places it).
    #[inline(never)]
    fn place_large(&self, request: &Request, layout: Layout, core: usize) -> Option<Placed> {
        let g = &self.arena.geometry;
        match layout {
            Layout::Run { align_chunks: 1, .. } | Layout::RunTail { align_chunks: 1, .. } | Layout::Buddy(_)
                if g.tails && request.align <= g.chunk_size =>
            {
                let align = g.bank_units.max((request.align >> g.unit_shift) as u64);
                let (offset, block_bytes) = self.arena.claim_large(request.size, layout, align, core)?;
                Some(Placed { offset, block_bytes, route: Route::Global, overflow: false, class: None })
            }
            Layout::RunTail { chunks, align_chunks, tail } => self.place_tailed_run(chunks, align_chunks, &tail, core),
            Layout::Run { chunks, align_chunks } => self.place_run(chunks, align_chunks, request.size),
            Layout::Buddy(_) => None,
        }
    }

    /// A run of whole chunks and a tail at the start of the chunk after it (`arena/tail.rs`).
    #[inline(never)]
    fn place_tailed_run(&self, chunks: usize, align_chunks: usize, tail: &BuddyLayout, core: usize) -> Option<Placed> {
        let start = self.arena.claim_tailed_run(chunks, align_chunks, tail, core)?;
        Some(Placed {
            offset: start * self.arena.geometry.chunk_size,
            block_bytes: self.arena.tailed_run_bytes(start, chunks, tail),
            route: Route::Global,
            overflow: false,
            class: None,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Placed, Reach, PACK_FIRST};
    use crate::arena::buddy::{Conflict, Node};
    use crate::arena::global::ChunkState;
    use crate::arena::layout::Layout;
    use crate::config::PoolConfig;
    use crate::pool::pool::Pool;

    const MIB: usize = 1 << 20;

    /// Allocate `size` bytes as core `core` would.
    fn alloc_on(pool: &Pool, size: usize, core: usize) -> Placed {
        let request = pool.request(size, None).unwrap();
        let placed = pool.place(&request, core, Reach::Full).expect("room");
        pool.account_alloc(&placed, core, size);
        placed
    }

    /// Core 1's two chunks hold only blocks its cache keeps (the freed blocks of a thread that
    /// ran on core 1 for a moment). Statistics count them free, with the chunks core 1's; a
    /// drain gives them back to the trees and leaves the chunks with core 1, so the statistics
    /// read the same (a compaction whose mover fails must leave the pool exactly as it was,
    /// and drains first); the next reclaim (here a trim) gives the chunks back.
    #[test]
    fn a_drain_leaves_emptied_chunks_with_their_cores_until_a_reclaim() {
        let pool = Pool::new(PoolConfig::new(64 * MIB).cores(2).slab_sizes(Vec::new())).unwrap();
        let chunk = |offset: usize| offset >> 21;
        alloc_on(&pool, 64 << 10, 0);
        let blocks: Vec<usize> = (0..4).map(|_| alloc_on(&pool, MIB, 1).offset).collect();
        let mut chunks: Vec<usize> = blocks.iter().map(|&o| chunk(o)).collect();
        chunks.dedup();
        assert_eq!(chunks.len(), 2, "core 1 holds two chunks");
        for &o in &blocks {
            pool.free_raw(o, MIB).unwrap();
        }
        assert_eq!(pool.arena().block_caches.cached().len(), 4, "every block is cached");
        let before = pool.stats();
        assert_eq!(before.per_core[1].chunks, 2);
        assert_eq!(pool.arena().drain_block_caches(), 4);
        assert!(pool.arena().block_caches.cached().is_empty());
        assert_eq!(pool.stats(), before, "a drain shows in the statistics");
        pool.check().unwrap();
        pool.trim().unwrap();
        assert_eq!(pool.stats().per_core[1].chunks, 0, "the trim gives both chunks back");
        pool.check().unwrap();
    }

    /// Random blocks of every kind (slab objects, buddy blocks, runs) allocated on either core
    /// and some freed, so that cached blocks, all-free slabs and free runs lie side by side:
    /// statistics count cached blocks free, so a drain changes none of them.
    #[test]
    fn statistics_read_the_same_before_and_after_a_drain() {
        for seed in 1..=40u64 {
            let pool = Pool::new(PoolConfig::new(32 * MIB).cores(2)).unwrap();
            let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let mut live: Vec<(usize, usize)> = Vec::new();
            // Mostly allocations, then mostly frees: chunks left with cached blocks alone.
            for step in 0..600 {
                let frees = if step < 300 { 1 } else { 4 };
                if !live.is_empty() && next() % 5 < frees {
                    let (offset, size) = live.swap_remove((next() % live.len() as u64) as usize);
                    pool.free_raw(offset, size).unwrap();
                } else {
                    // 64 B to 1 MiB, a power of two apart and a little more.
                    let size = (64usize << (next() % 15)) + (next() % 64) as usize;
                    let (request, core) = (pool.request(size, None).unwrap(), (next() % 2) as usize);
                    if let Some(placed) = pool.place(&request, core, Reach::Full) {
                        pool.account_alloc(&placed, core, size);
                        live.push((placed.offset, size));
                    }
                }
            }
            let before = pool.stats();
            pool.arena().drain_block_caches();
            assert_eq!(pool.stats(), before, "seed {seed}");
            pool.check().unwrap();
        }
    }

    /// The last two chunks hold only blocks the cache keeps (and one the tree has back): a
    /// request for a run of both fails at first, drains the caches, and the chunks the drain
    /// empties go back to the global pool for the run.
    #[test]
    fn a_failing_request_for_a_run_gets_the_chunks_a_drain_empties() {
        let pool = Pool::new(PoolConfig::new(8 * MIB).cores(1).slab_sizes(Vec::new()).core_reserve(0)).unwrap();
        let blocks: Vec<usize> = (0..16).map(|_| alloc_on(&pool, MIB / 2, 0).offset).collect();
        let upper: Vec<usize> = blocks.iter().copied().filter(|&o| o >= 4 * MIB).collect();
        assert_eq!(upper.len(), 8);
        for &o in &upper {
            pool.free_raw(o, MIB / 2).unwrap();
        }
        assert!(!pool.arena().block_caches.cached().is_empty(), "some of them are cached");
        let run = pool.alloc_raw(4 * MIB, None).unwrap();
        assert_eq!(run, 4 * MIB, "the run takes the two emptied chunks");
        pool.check().unwrap();
    }

    /// A retired chunk's tree keeps marks under its root that lead nowhere (what an allocation
    /// leaves when its climb meets the retired root: one from a stale hint). The next block
    /// granted the chunk is trimmed, and its last piece lies over those marks: the search in
    /// the granted chunk fails once, the marks go, and the block lands at the chunk's start.
    #[test]
    fn a_fresh_chunk_with_orphan_marks_under_a_trimmed_block_still_takes_it() {
        let pool = Pool::new(PoolConfig::new(2 * MIB).cores(1).slab_sizes(Vec::new()).core_reserve(0)).unwrap();
        let a = pool.arena();
        let g = &a.geometry;
        let first = alloc_on(&pool, 3 * MIB / 2, 0);
        pool.free_raw(first.offset, 3 * MIB / 2).unwrap();
        assert_eq!(a.global.state(0), ChunkState::Free, "the emptied chunk went back");
        // A claim of a leaf inside the retired chunk climbs to its allocated root and rolls
        // back: its marks stay.
        let upc = g.units_per_chunk();
        let orphan = Node { level: g.depth, index: upc - 512 };
        assert_eq!(a.shape.try_alloc(a.tree(0), orphan), Err(Conflict::Ancestor));
        let size = (upc - upc / 32) as usize * g.min_block;
        let Layout::Buddy(b) = g.layout(size, 1) else { panic!("a trimmed buddy block") };
        assert!(!b.is_whole() && orphan.start(g.depth) < b.units, "the block covers the marked leaf");
        assert_eq!(a.grant(0, size), Some(0));
        let placed = pool.alloc_in_fresh_chunk(0, &b, 0).expect("a fresh chunk holds the block");
        pool.account_alloc(&placed, 0, size);
        assert_eq!((placed.offset, placed.block_bytes), (0, size));
        pool.free_raw(placed.offset, size).unwrap();
        pool.check().unwrap();
    }

    /// Every chunk granted, each half full: core 1's with a free half at its end, core 0's with
    /// free blocks of 512 KiB at 512 KiB and 1.5 MiB. Core 0 frees the block before the first of
    /// those, which its cache keeps, and core 1 the other half of its first chunk. A request of
    /// 1 MiB on core 0 finds no node in its trees and no chunk to be granted: core 0's cache goes
    /// back to its trees, where the freed block and its buddy make the node, so the block lands
    /// there and not in core 1's free halves; the arena is not tight, and core 1's cache keeps
    /// its block.
    #[test]
    fn a_core_without_a_chunk_to_be_granted_uses_its_cached_blocks_before_other_cores_room() {
        let pool = Pool::new(PoolConfig::new(32 * MIB).cores(2).slab_sizes(Vec::new())).unwrap();
        let chunk = |offset: usize| offset >> 21;
        let halves: Vec<usize> = (0..16).map(|_| alloc_on(&pool, MIB, 1).offset).collect();
        let quarters: Vec<usize> = (0..32).map(|_| alloc_on(&pool, MIB / 2, 0).offset).collect();
        assert!(!pool.arena().global.has_free(), "every chunk is granted");
        assert!(halves.iter().all(|&o| pool.arena().global.state(chunk(o)) == ChunkState::Core(1)));
        assert!(quarters.iter().all(|&o| pool.arena().global.state(chunk(o)) == ChunkState::Core(0)));
        for &o in halves.iter().filter(|&&o| o % (2 * MIB) != 0) {
            pool.free_raw(o, MIB).unwrap();
        }
        for &o in quarters.iter().filter(|&&o| (o / (MIB / 2)) % 2 == 1) {
            pool.free_raw(o, MIB / 2).unwrap();
        }
        pool.arena().drain_block_caches();
        let first = *quarters.iter().min().unwrap();
        let kept = *halves.iter().min().unwrap();
        pool.free_raw(first, MIB / 2).unwrap();
        pool.free_raw(kept, MIB).unwrap();
        let mut cached: Vec<usize> = pool.arena().block_caches.cached().iter().map(|&(o, _)| o).collect();
        cached.sort_unstable();
        assert_eq!(cached, [kept, first], "both frees are cached");
        let placed = alloc_on(&pool, MIB, 0);
        assert!(!placed.overflow, "placed in another core's chunk at {}", placed.offset);
        assert_eq!(pool.arena().global.state(chunk(placed.offset)), ChunkState::Core(0));
        assert_eq!(placed.offset, first, "where the cached block and its buddy were");
        assert!(!pool.arena().tight.is_on(), "the arena was made tight");
        let left: Vec<usize> = pool.arena().block_caches.cached().iter().map(|&(o, _)| o).collect();
        assert_eq!(left, [kept], "core 1's cache keeps its block");
        pool.check().unwrap();
    }

    /// A block of half the size that goes to a free stretch first in a tight arena, in a chunk
    /// of 2 MiB.
    const BLOCK: usize = (2 << 20) / (2 * PACK_FIRST as usize);
    /// Its tree level.
    const LEVEL: u32 = (2 * PACK_FIRST).trailing_zeros();

    /// Two chunks full of blocks of one level, that level hidden by an allocation that found
    /// no room; one block of each is freed, and its free records it as the only free node of
    /// its level in its chunk. Two allocations take them again, the first through the hint of
    /// the last free, the second through the record alone: neither leaves the level shown in
    /// the core's maps, where no free node of it remains.
    #[test]
    fn a_take_through_a_free_node_record_hides_the_level_it_empties() {
        let pool = Pool::new(PoolConfig::new(4 << 20).cores(1).slab_sizes(Vec::new())).unwrap();
        let count = (4 << 20) / BLOCK;
        let blocks: Vec<usize> = (0..count).map(|_| pool.alloc_raw(BLOCK, None).unwrap()).collect();
        let chunk = |offset: usize| offset >> 21;
        let (x, y) = (blocks[10], blocks[count - 10]);
        let (a, b) = (chunk(x), chunk(y));
        assert_ne!(a, b);
        assert!(pool.try_alloc_fast(BLOCK, None, 0).unwrap().is_none(), "the arena is full");
        let maps = &pool.arena().cores[0].maps;
        assert!(!maps.may_serve(LEVEL, a) && !maps.may_serve(LEVEL, b), "the failed allocation hid both");
        pool.free_raw(x, BLOCK).unwrap();
        pool.free_raw(y, BLOCK).unwrap();
        assert!(maps.may_serve(LEVEL, a) && maps.may_serve(LEVEL, b), "each free shows its block");
        assert_eq!(pool.alloc_raw(BLOCK, None).unwrap(), y, "the hint of the last free");
        assert!(!maps.may_serve(LEVEL, b), "a stale bit: chunk {b} has no free node of the level left");
        assert_eq!(pool.alloc_raw(BLOCK, None).unwrap(), x, "the record of the first free");
        assert!(!maps.may_serve(LEVEL, a), "a stale bit: chunk {a} has no free node of the level left");
        // A free shows the level again.
        pool.free_raw(x, BLOCK).unwrap();
        assert!(maps.may_serve(LEVEL, a));
        assert_eq!(pool.alloc_raw(BLOCK, None).unwrap(), x);
        pool.check().unwrap();
    }
}

//! Pool growth: a pool with a `max_capacity` above its `capacity` adds a region when an
//! allocation finds no room after the pool's own remedies (its slabs and empty chunks
//! reclaimed), and `trim` gives back regions that are entirely free, except the first. The
//! region table and absent chunks are `arena/regions.rs` and `arena/global.rs`.
//!
//! A growth, one at a time: try the request once more (another grower may have made room), pick
//! the region's chunks (at least `grow_by`, at least what the request needs, within
//! `max_capacity`), call the `on_grow(offset, nbytes)` hook (the runtime maps device memory
//! there; a host-backed pool has its whole offset space mapped already), then publish the chunks
//! as free and place the request. A hook that fails leaves the chunks absent, counts no growth,
//! and fails the allocation with `OutOfMemory`; regions that a pool at its `max_capacity` gave
//! back to make room for the new one stay given back (`on_trim` saw them go, so that a runtime
//! unmaps before it maps again).

use std::cell::Cell;
use std::thread::LocalKey;

use crate::arena::layout::Layout;
use crate::arena::regions::{Placement, Region};
use crate::pool::alloc::{Placed, Reach, Request};
use crate::pool::pool::Pool;
use crate::pool::region_hooks::{GrowthHooks, RegionHook};
use crate::util::failpoint;

thread_local! {
    /// Set while this thread allocates inside [`Pool::without_growth`].
    static GROWTH_HELD: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread places a batch (`Pool::alloc_many`): its growths give back no
    /// region it did not add, so that a batch that fails leaves the regions as they were.
    static KEEPING_REGIONS: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread adds or gives back a region (it holds the regions' change lock,
    /// and runs the `on_grow` or `on_trim` hook inside): a hook that allocates or trims through
    /// the pool would wait for that lock forever.
    static CHANGING_REGIONS: Cell<bool> = const { Cell::new(false) };
    /// The bytes that this thread's last growth could still have added under `max_capacity`,
    /// when it failed for want of a place in the offset space alone: for the error of the
    /// allocation that failed ([`Pool::take_unplaced_growth`]).
    static UNPLACED_GROWTH: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Why [`Pool::make_room_for`] placed no region.
enum NoRoom {
    /// Not even in the room of the regions left free.
    Anywhere,
    /// Another thread took a chunk of a region left free before it was withdrawn.
    Raced,
}

/// Times a growth looks again for room after another thread took a chunk of a region left
/// free ([`NoRoom::Raced`]), at most: each time that thread made progress.
const MAX_RACES: usize = 8;

/// One of this thread's flags above, set while the guard lives and then as it was before.
pub(crate) struct ThreadFlag {
    flag: &'static LocalKey<Cell<bool>>,
    before: bool,
}

impl ThreadFlag {
    fn set(flag: &'static LocalKey<Cell<bool>>) -> ThreadFlag {
        ThreadFlag { flag, before: flag.with(|f| f.replace(true)) }
    }
}

impl Drop for ThreadFlag {
    fn drop(&mut self) {
        self.flag.with(|f| f.set(self.before));
    }
}

/// Marks this thread as changing regions while it lives.
struct Changing;

impl Changing {
    /// `None` when this thread changes regions already (a call from inside a region hook).
    fn enter() -> Option<Changing> {
        // `then`, not `then_some`: a guard made and dropped here would clear the mark.
        (!CHANGING_REGIONS.with(|c| c.replace(true))).then(|| Changing)
    }
}

impl Drop for Changing {
    fn drop(&mut self) {
        CHANGING_REGIONS.with(|c| c.set(false));
    }
}

impl Pool {
    /// What this thread's last growth left in [`UNPLACED_GROWTH`], taken: every failed
    /// allocation tried a growth just before it builds its error ([`Pool::place_grown`], which
    /// clears it first).
    pub(crate) fn take_unplaced_growth(&self) -> Option<usize> {
        UNPLACED_GROWTH.with(Cell::take)
    }

    /// Run `f` with growth held on this thread: an allocation inside it that finds no room
    /// fails with `OutOfMemory` instead of adding a region. A caller with remedies of its own
    /// (an out-of-memory handler that compacts or frees caches) tries them first and then
    /// allocates again outside, so that growth comes last.
    pub fn without_growth<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = ThreadFlag::set(&GROWTH_HELD);
        f()
    }

    /// Mark this thread as placing a batch until the guard drops: its growths give back no
    /// region that was there before ([`Pool::place_grown`]).
    pub(crate) fn keeping_regions(&self) -> ThreadFlag {
        ThreadFlag::set(&KEEPING_REGIONS)
    }

    /// Set the hook called before a region is added (`None`: none); returns the previous one.
    pub fn set_on_grow(&self, hook: Option<RegionHook>) -> Option<RegionHook> {
        GrowthHooks::set(&self.growth.on_grow, hook)
    }

    /// Set the hook called after a region is given back (`None`: none); returns the previous one.
    pub fn set_on_trim(&self, hook: Option<RegionHook>) -> Option<RegionHook> {
        GrowthHooks::set(&self.growth.on_trim, hook)
    }

    /// The most bytes the pool may hold (its `max_capacity`, or its `capacity` if it cannot grow).
    pub fn max_capacity(&self) -> usize {
        self.limit
    }

    /// The regions with memory behind them, by offset.
    pub fn regions(&self) -> Vec<Region> {
        self.arena.regions.list(&self.arena.geometry)
    }

    /// The bytes of the largest region, in a pool that has more than one now (`None` in one
    /// that cannot grow or has not): for the error of a failed allocation, which reads the
    /// table only in a pool that can grow, whose failures tried a growth already.
    #[cold]
    pub(crate) fn largest_region(&self) -> Option<usize> {
        if !self.config.grows() {
            return None;
        }
        let regions = self.regions();
        (regions.len() > 1).then(|| regions.iter().map(|r| r.bytes).max().unwrap_or(0))
    }

    /// The allocation's last resort: add a region and place `request` there. `None` when the
    /// pool cannot grow (no `max_capacity`, the limit reached, the hook failed).
    #[cold]
    pub(crate) fn place_grown(&self, request: &Request, core: usize, reach: Reach) -> Option<Placed> {
        UNPLACED_GROWTH.with(|unplaced| unplaced.set(None));
        if reach != Reach::Full || !self.config.grows() || GROWTH_HELD.with(Cell::get) {
            return None;
        }
        // An allocation from inside a region hook finds room without a growth, or fails.
        let _changing = Changing::enter()?;
        let regions = &self.arena.regions;
        let _one = regions.change();
        let g = &self.arena.geometry;
        let (need, align) = match g.layout(request.size, request.align) {
            Layout::Run { chunks, align_chunks } => (chunks, align_chunks),
            // The tail's chunk comes from the same region: a block never spans two.
            Layout::RunTail { chunks, align_chunks, .. } => (chunks + 1, align_chunks),
            Layout::Buddy(_) => (1, 1),
        };
        // Other threads allocate meanwhile (only growth waits for `change`): the room a new
        // region brought may be gone before this request gets to it. Then grow again, up to
        // `max_capacity`, rather than fail while the pool may still grow.
        let mut races = 0;
        loop {
            if let Some(placed) = self.place_once(request, core, reach) {
                return Some(placed); // another growth (or a free) made room meanwhile
            }
            // The table's lock goes with the statement: giving regions back takes it again.
            // A batch joins no region: the region it joined would not be its own to give back.
            let keeping = KEEPING_REGIONS.with(Cell::get);
            let placed = regions.place(&regions.lock(), need, align, g.chunks, !keeping);
            let p = match placed {
                Some(p) => p,
                // The limit reached: the regions that earlier growths added and that are
                // entirely free now go back first, as `trim` gives them back (a pool holding no
                // block at all refused a request of its documented largest size), and the
                // region is placed again; but only when it then fits (a request that fails
                // anyway leaves the regions as they were), and not for a batch, which gives
                // back no region it did not add.
                None if keeping => return None,
                None => match self.make_room_for(need, align) {
                    Ok(p) => p,
                    // Another thread took a chunk of a region left free, which is no longer
                    // free: try again with the regions as they are now.
                    Err(NoRoom::Raced) if races < MAX_RACES => {
                        races += 1;
                        continue;
                    }
                    Err(_) => return None,
                },
            };
            let (offset, bytes) = (p.start * g.chunk_size, g.run_bytes(p.start, p.len));
            if let Some(hook) = GrowthHooks::get(&self.growth.on_grow) {
                hook(offset, bytes).ok()?;
            }
            // Listed before its chunks are published: another thread may take them at once, and
            // every block lies inside a region that `regions()` lists.
            regions.insert(&mut regions.lock(), p);
            self.arena.global.publish(p.start, p.len);
            regions.count_growth();
        }
    }

    /// Give back the regions (but the first) that are entirely free, to place a region of `need`
    /// chunks starting at a multiple of `align` in the room they leave under the limit; where
    /// that region goes, or why not, with nothing given back: it would not fit even then, or
    /// another thread took a chunk of one of them meanwhile. The caller holds the regions'
    /// change lock and has marked this thread as changing regions.
    fn make_room_for(&self, need: usize, align: usize) -> Result<Placement, NoRoom> {
        let regions = &self.arena.regions;
        let g = &self.arena.geometry;
        let free = self.free_regions();
        let mut without: Vec<(usize, usize)> = regions.lock().clone();
        without.retain(|r| free.binary_search(r).is_err());
        let Some(placed) = regions.place(&without, need, align, g.chunks, true) else {
            let room = regions.room_chunks(&without);
            if need <= room {
                // The limit has room: only the offsets have no place.
                UNPLACED_GROWTH.with(|unplaced| unplaced.set(Some(room * g.chunk_size)));
            }
            return Err(NoRoom::Anywhere);
        };
        // All of them or none: a withdrawal fails when another thread took one of its chunks.
        for (i, &(start, len)) in free.iter().enumerate() {
            if failpoint::fire("growth.withdraw") || !self.arena.global.withdraw(start, len) {
                for &(start, len) in &free[..i] {
                    self.arena.global.publish(start, len);
                }
                return Err(NoRoom::Raced);
            }
        }
        self.let_go(&free);
        Ok(placed)
    }

    /// Give back every region that is entirely free, except the first (after the slabs and
    /// chunks that cores hold empty went back). Returns how many chunks went with them.
    pub(crate) fn trim_regions(&self) -> usize {
        self.trim_regions_where(|_| true)
    }

    /// The regions now, for [`Pool::trim_regions_since`] (`None` for a pool that cannot grow).
    pub(crate) fn regions_now(&self) -> Option<Vec<(usize, usize)>> {
        self.config.grows().then(|| self.arena.regions.lock().clone())
    }

    /// Give back the regions added since `before` ([`Pool::regions_now`]) that are entirely
    /// free: what a batch that failed added, once it gave its places back. A region that another
    /// thread grew meanwhile is taken only if it is empty too: a region is withdrawn in one step
    /// that fails if any chunk of it is in use, so no allocation loses its room, and a growth in
    /// progress (which places its request before it lets go of the change lock) is never seen
    /// empty. Growths stay counted in `grow_events`; returns how many chunks went with them.
    pub(crate) fn trim_regions_since(&self, before: Option<&[(usize, usize)]>) -> usize {
        // `before` is sorted as the table is.
        let new = |region: &(usize, usize)| before.is_some_and(|before| before.binary_search(region).is_err());
        if self.arena.regions.lock().iter().any(new) {
            self.trim_regions_where(|region| new(&region))
        } else {
            0
        }
    }

    /// [`Pool::trim_regions`] for the regions (`(start, len)` in chunks) that `wanted` accepts.
    fn trim_regions_where(&self, wanted: impl Fn((usize, usize)) -> bool) -> usize {
        if !self.config.grows() {
            return 0;
        }
        // A trim from inside a region hook gives back no region.
        let Some(_changing) = Changing::enter() else { return 0 };
        let _one = self.arena.regions.change();
        self.give_back_free_regions(&wanted)
    }

    /// The regions, but the first, whose chunks are all free now.
    fn free_regions(&self) -> Vec<(usize, usize)> {
        let global = &self.arena.global;
        let regions = self.arena.regions.lock();
        regions.iter().copied().filter(|&(s, l)| s != 0 && (s..s + l).all(|c| !global.is_taken(c))).collect()
    }

    /// Give back the regions, but the first, that `wanted` accepts and that are entirely free
    /// now, each calling `on_trim`; returns how many chunks went with them. The caller holds
    /// the regions' change lock and has marked this thread as changing regions.
    fn give_back_free_regions(&self, wanted: &dyn Fn((usize, usize)) -> bool) -> usize {
        let regions = &self.arena.regions;
        let candidates: Vec<(usize, usize)> =
            regions.lock().iter().copied().filter(|&(s, l)| s != 0 && wanted((s, l))).collect();
        let withdrawn: Vec<(usize, usize)> =
            candidates.into_iter().filter(|&(start, len)| self.arena.global.withdraw(start, len)).collect();
        self.let_go(&withdrawn);
        withdrawn.iter().map(|&(_, len)| len).sum()
    }

    /// Drop the withdrawn regions `gone` (by start) from the table, their host pages back to
    /// the host, and tell `on_trim`, once for each growth a region is made of.
    fn let_go(&self, gone: &[(usize, usize)]) {
        if gone.is_empty() {
            return;
        }
        let g = &self.arena.geometry;
        let parts = self.arena.regions.remove(gone);
        if let Some(backing) = &self.arena.backing {
            for &(start, len) in gone {
                backing.discard(start * g.chunk_size, g.run_bytes(start, len));
            }
        }
        if let Some(hook) = GrowthHooks::get(&self.growth.on_trim) {
            for (start, len) in parts {
                let _ = hook(start * g.chunk_size, g.run_bytes(start, len)); // gone either way
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::config::{Backing, PoolConfig};
    use crate::error::Error;
    use crate::pool::pool::Pool;

    #[test]
    fn a_small_pool_that_may_grow_to_a_tebibyte_commits_almost_nothing() {
        let pool = Pool::new(PoolConfig::new(64 << 20).cores(4).backing(Backing::None).growth(1 << 40, Some(64 << 20)))
            .unwrap();
        let handles: Vec<_> = [64, 5000, 1 << 20, 300 << 20].iter().map(|&n| pool.alloc(n, None, 0).unwrap()).collect();
        assert_eq!(pool.stats().grow_events, 1, "300 MiB takes a region of its own");
        for h in handles {
            pool.free(h).unwrap();
        }
        // One bit per absent chunk, and what the two regions used.
        let committed = pool.arena().committed_metadata_bytes();
        assert!(committed < 2 << 20, "an empty pool that may grow to 1 TiB committed {committed} bytes");
        pool.check().unwrap();
    }

    const MIB: usize = 1 << 20;

    /// A one-core pool of 4 MiB that may grow to 64 MiB, a region at a time of what a request
    /// needs.
    fn four_mib_growing_to_64() -> Pool {
        Pool::new(PoolConfig::new(4 * MIB).cores(1).backing(Backing::None).growth(64 * MIB, None)).unwrap()
    }

    /// A pool that reached its limit with regions that are entirely free gives them back
    /// before it refuses a request: holding no block, it takes its documented largest request
    /// (`max_capacity` less `capacity`, here 60 MiB less two chunks of rounding), where it
    /// refused it while a freed region of 8 MiB counted against the limit.
    #[test]
    fn a_request_at_the_limit_takes_the_room_of_regions_left_free() {
        let pool = four_mib_growing_to_64();
        let earlier = pool.alloc(8 * MIB, None, 0).unwrap();
        pool.free(earlier).unwrap();
        assert_eq!(pool.regions().len(), 2, "the growth's region stays until trimmed");
        let large = pool.alloc(58 * MIB, None, 0).unwrap();
        let regions = pool.regions();
        assert_eq!(regions.len(), 2, "{regions:?}");
        assert!(regions[1].bytes >= 58 * MIB, "{regions:?}");
        assert!(pool.stats().capacity <= 64 * MIB);
        pool.free(large).unwrap();
        pool.check().unwrap();
    }

    /// A growth at the limit that finds a region left free taken by another thread before it
    /// could withdraw it looks again rather than fail: here the race is injected, and the
    /// region is still free the second time.
    #[test]
    fn a_growth_that_loses_a_free_region_to_another_thread_looks_again() {
        let pool = four_mib_growing_to_64();
        let earlier = pool.alloc(8 * MIB, None, 0).unwrap();
        pool.free(earlier).unwrap();
        let (large, fired) = crate::util::failpoint::fail_at("growth.withdraw", 0, || pool.alloc(58 * MIB, None, 0));
        assert!(fired, "the growth withdrew the free region");
        let large = large.expect("the second look takes the free region's room");
        assert_eq!(pool.regions().len(), 2, "{:?}", pool.regions());
        pool.free(large).unwrap();
        pool.check().unwrap();
    }

    /// `trim` counts the chunks of the regions it gives back with the slabs and chunks.
    #[test]
    fn trim_counts_the_chunks_of_the_regions_it_gives_back() {
        let pool = four_mib_growing_to_64();
        let run = pool.alloc(16 * MIB, None, 0).unwrap();
        pool.free(run).unwrap();
        assert_eq!(pool.regions().len(), 2);
        assert_eq!(pool.trim().unwrap(), 8, "a region of 16 MiB: eight chunks");
        assert_eq!(pool.regions().len(), 1);
        assert_eq!(pool.trim().unwrap(), 0, "nothing left to give back");
        pool.check().unwrap();
    }

    /// A request that does not fit even where the regions left free would go fails without
    /// giving them back: the pool is as it was.
    #[test]
    fn a_request_that_fails_anyway_keeps_the_regions_left_free() {
        let pool = Pool::new(PoolConfig::new(8 * MIB).cores(1).backing(Backing::None).growth(16 * MIB, Some(4 * MIB)))
            .unwrap();
        let first = pool.alloc(8 * MIB, None, 0).unwrap();
        let second = pool.alloc(4 * MIB, None, 0).unwrap();
        let third = pool.alloc(4 * MIB, None, 0).unwrap();
        pool.free(second).unwrap();
        let before = (pool.regions(), pool.stats().capacity, pool.stats().bytes_free);
        assert_eq!(before.0.len(), 3);
        assert!(matches!(pool.alloc(5 * MIB, None, 0), Err(Error::OutOfMemory { .. })));
        assert_eq!((pool.regions(), pool.stats().capacity, pool.stats().bytes_free), before);
        // A request that fits once they are given back still takes their room.
        pool.free(third).unwrap();
        let fits = pool.alloc(6 * MIB, None, 0).unwrap();
        assert_eq!(pool.regions().len(), 2, "{:?}", pool.regions());
        assert!(pool.stats().capacity <= 16 * MIB);
        for b in [first, fits] {
            pool.free(b).unwrap();
        }
        pool.check().unwrap();
    }

    /// A batch gives back no region it did not add: at the limit, with older regions entirely
    /// free, a batch that needs their room fails and leaves them (a single request takes it).
    #[test]
    fn a_batch_at_the_limit_keeps_the_older_regions_left_free() {
        let pool = Pool::new(PoolConfig::new(8 * MIB).cores(1).backing(Backing::None).growth(16 * MIB, Some(2 * MIB)))
            .unwrap();
        let first = pool.alloc(8 * MIB, None, 0).unwrap();
        let grown: Vec<_> = (0..4).map(|_| pool.alloc(2 * MIB, None, 0).unwrap()).collect();
        assert_eq!(pool.regions().len(), 5);
        for &h in &grown[..2] {
            pool.free(h).unwrap();
        }
        let before = (pool.regions(), pool.stats().capacity, pool.stats().bytes_free);
        let failed = pool.alloc_many(&[4 * MIB, 4 * MIB], None, 0);
        assert!(matches!(failed, Err(Error::Batch { .. })), "{failed:?}");
        assert_eq!((pool.regions(), pool.stats().capacity, pool.stats().bytes_free), before);
        let one = pool.alloc_many(&[4 * MIB], None, 0);
        assert!(matches!(one, Err(Error::Batch { .. })), "a batch of one too: {one:?}");
        assert_eq!(pool.regions(), before.0);
        let single = pool.alloc(4 * MIB, None, 0).unwrap();
        assert_eq!(pool.regions().len(), 4, "the two free regions went for one of 4 MiB");
        for h in [first, grown[2], grown[3], single] {
            pool.free(h).unwrap();
        }
        pool.check().unwrap();
    }

    /// A pool that grew a chunk at a time to its limit and gave back every other region (the
    /// last one kept) has holes of three chunks between its regions and none at the end: a request of two chunks, well within the
    /// limit, joins a region that a growth added (it was refused for good before). The joined
    /// region goes back as a whole, `on_trim` once for each growth, as `on_grow` saw them.
    #[test]
    fn a_growth_that_no_hole_holds_joins_a_region() {
        use std::sync::{Arc, Mutex};
        let pool = Pool::new(PoolConfig::new(2 * MIB).cores(1).backing(Backing::None).growth(32 * MIB, Some(2 * MIB)))
            .unwrap();
        let (grown, trimmed) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let log = |calls: &Arc<Mutex<Vec<(usize, usize)>>>| -> crate::pool::region_hooks::RegionHook {
            let calls = Arc::clone(calls);
            Arc::new(move |offset, bytes| {
                calls.lock().unwrap().push((offset, bytes));
                Ok(())
            })
        };
        pool.set_on_grow(Some(log(&grown)));
        pool.set_on_trim(Some(log(&trimmed)));
        let mut held = Vec::new();
        while let Ok(h) = pool.alloc(2 * MIB, None, 0) {
            held.push(h);
        }
        assert_eq!(pool.stats().capacity, 32 * MIB);
        held.sort_by_key(|&h| pool.block(h).unwrap().offset);
        let mut kept = Vec::new();
        let mut freed = Vec::new();
        for (i, h) in held.into_iter().enumerate() {
            if i % 2 == 0 && i > 0 {
                freed.push((pool.block(h).unwrap().offset, 2 * MIB));
                pool.free(h).unwrap();
            } else {
                kept.push(h);
            }
        }
        pool.trim().unwrap();
        assert_eq!(*trimmed.lock().unwrap(), freed, "every region freed goes, once, by offset");
        let before = pool.regions();
        assert!(before.windows(2).all(|w| w[1].offset - (w[0].offset + w[0].bytes) <= 3 * 2 * MIB), "{before:?}");
        assert_eq!(before.last().map(|r| r.offset + r.bytes), Some(62 * MIB), "one free chunk at the end: {before:?}");
        let large = pool.alloc(4 * MIB, None, 0).expect("a request of two chunks within the limit");
        let at = pool.block(large).unwrap().offset;
        let after = pool.regions();
        assert_eq!(after.len(), before.len(), "the growth joined a region: {after:?}");
        let joined = *after.iter().find(|r| r.offset <= at && at < r.offset + r.bytes).unwrap();
        assert_eq!(joined.bytes, 6 * MIB, "{after:?}");
        let grown_for_it = *grown.lock().unwrap().last().unwrap();
        assert_eq!(grown_for_it.1, 4 * MIB);
        pool.check().unwrap();
        pool.free(large).unwrap();
        let mine = kept.iter().position(|&h| pool.block(h).unwrap().offset == joined.offset).unwrap();
        pool.free(kept.remove(mine)).unwrap();
        trimmed.lock().unwrap().clear();
        pool.trim().unwrap();
        let mut parts = trimmed.lock().unwrap().clone();
        parts.sort_unstable();
        let mut expected = vec![(joined.offset, 2 * MIB), grown_for_it];
        expected.sort_unstable();
        assert_eq!(parts, expected, "one on_trim per growth of the joined region");
        for h in kept {
            pool.free(h).unwrap();
        }
        pool.check().unwrap();
    }

    /// A pool of one 2 MiB chunk that may grow to 16 MiB, two chunks at a time, filled a chunk
    /// at a time to its limit (regions at chunks 0, 2, ..., 14 of its 16 chunks of offsets);
    /// then every block freed but those at `kept` (chunks), and the free regions trimmed.
    fn grown_to_the_limit_keeping(kept: &[usize]) -> (Pool, Vec<crate::handle::id::Handle>) {
        let pool = Pool::new(PoolConfig::new(2 * MIB).cores(1).backing(Backing::None).growth(16 * MIB, Some(2 * MIB)))
            .unwrap();
        let mut held = Vec::new();
        while let Ok(h) = pool.alloc(2 * MIB, None, 0) {
            held.push(h);
        }
        let offsets: Vec<usize> = held.iter().map(|&h| pool.block(h).unwrap().offset / (2 * MIB)).collect();
        assert_eq!(offsets.len(), 8, "{offsets:?}");
        let mut live = Vec::new();
        for (h, chunk) in held.into_iter().zip(offsets) {
            if kept.contains(&chunk) {
                live.push(h);
            } else {
                pool.free(h).unwrap();
            }
        }
        pool.trim().unwrap();
        (pool, live)
    }

    /// Regions kept at chunks 6 and 12 leave gaps of four, five and three chunks: a request
    /// of five chunks (all the limit leaves) fills the gap between them and bridges the two.
    #[test]
    fn a_growth_fills_the_whole_gap_between_two_kept_regions() {
        let (pool, live) = grown_to_the_limit_keeping(&[6, 12]);
        assert_eq!(pool.regions().len(), 3);
        let large = pool.alloc(10 * MIB, None, 0).expect("10 MiB: what the limit leaves");
        assert_eq!(pool.block(large).unwrap().offset, 14 * MIB);
        let regions = pool.regions();
        assert_eq!(regions.len(), 2, "{regions:?}");
        assert_eq!((regions[1].offset, regions[1].bytes), (12 * MIB, 14 * MIB));
        pool.check().unwrap();
        for h in live.into_iter().chain([large]) {
            pool.free(h).unwrap();
        }
        assert_eq!(pool.trim().unwrap(), 7, "the bridged region goes back whole");
        pool.check().unwrap();
    }

    /// Regions kept at chunks 4, 8 and 12 leave no gap of four chunks: a request of four
    /// chunks, all the limit leaves, has no place. The error says so, and the pool is as it
    /// was; once a kept region's block is freed, the request takes its room.
    #[test]
    fn a_growth_that_the_offsets_do_not_hold_says_so() {
        let (pool, mut live) = grown_to_the_limit_keeping(&[4, 8, 12]);
        let before = (pool.regions(), pool.stats().capacity, pool.stats().bytes_free);
        let err = pool.alloc(8 * MIB, None, 0).unwrap_err();
        let Error::OutOfMemory { unplaced_growth, .. } = err else { panic!("{err:?}") };
        assert_eq!(unplaced_growth, Some(8 * MIB));
        assert!(err.to_string().contains("may still grow by 8388608 bytes"), "{err}");
        assert_eq!((pool.regions(), pool.stats().capacity, pool.stats().bytes_free), before);
        let err = pool.alloc(10 * MIB, None, 0).unwrap_err();
        assert!(
            matches!(err, Error::OutOfMemory { unplaced_growth: None, .. }),
            "beyond the limit the offsets are not the cause: {err:?}"
        );
        pool.free(live.remove(1)).unwrap();
        let large = pool.alloc(8 * MIB, None, 0).unwrap();
        pool.check().unwrap();
        for h in live.into_iter().chain([large]) {
            pool.free(h).unwrap();
        }
        pool.check().unwrap();
    }

    #[test]
    fn a_failed_batch_gives_back_the_regions_it_added_and_keeps_older_ones() {
        let pool = Pool::new(PoolConfig::new(2 * MIB).cores(1).backing(Backing::None).growth(16 * MIB, Some(2 * MIB)))
            .unwrap();
        let older = pool.alloc(3 * MIB, None, 0).unwrap();
        pool.free(older).unwrap(); // an empty region of an earlier call: not the batch's to give back
        let before = pool.regions();
        assert_eq!(before.len(), 2);
        let failed = pool.alloc_many(&[MIB, 3 * MIB, 3 * MIB, 3 * MIB, 14 * MIB], None, 0);
        assert!(matches!(failed, Err(crate::Error::Batch { index: 4, .. })), "{failed:?}");
        assert_eq!(pool.regions(), before);
        assert!(pool.stats().grow_events > 1, "the batch grew the pool before it failed");
        assert_eq!(pool.stats().blocks_in_use, 0);
        pool.check().unwrap();
    }
}

//! The generation-checked handle table.
//!
//! A [`Handle`] is a slot index plus a generation (and the id of its pool). The slot holds the
//! block's current offset, so compaction moves a block by updating its slot and every handle
//! stays valid. Freeing bumps the slot's generation: a stale handle no longer matches and is
//! refused instead of touching whichever block reuses the slot.
//!
//! Slot state word: `generation (bits 0..32) | LIVE (bit 32) | MOVING (bit 33) | user pins
//! (34..49) | view pins (49..64)`. Every operation on a handle is one atomic on this word.
//!
//! # Pins: user pins and view pins
//!
//! A pinned block is never freed or moved. *User pins* are the ones a caller takes and drops
//! explicitly (`Pool::pin`, `Pool::unpin`); *view pins* are held by buffer views and by the
//! pool's own reads and writes (`Pool::pin_view`, `Pool::unpin_view`). They are counted apart,
//! so a user can never drop a pin they did not take: `unpin` without a user pin is refused,
//! whatever views are alive.
//!
//! # Generations
//!
//! Freeing bumps the slot's generation. A slot whose generation reaches the last one
//! (`u32::MAX`) is retired when it is freed instead of going back on a free list: it is never
//! reused, so a generation never wraps and a stale handle can never match a later block.
//!
//! So a slot's generations only grow, and a handle that does not match its slot tells what it
//! is: one of a generation below the slot's names a block the slot held and that was freed (a
//! use after free, a double free); one above it names a block the slot never held (a handle
//! made up, not handed out), and is refused as [`HandleFault::Unknown`]. A retired slot's word
//! reads generation 0, as does a fresh slot's before its first block: there every handle
//! counts as freed.
//!
//! Free slots sit in the freeing thread's cache (`util/index_cache.rs`, taken back first by its next
//! allocation) and, when that is full, on per-core lock-free stacks (`util/index_stack.rs`,
//! tagged against ABA); slots live in lazily allocated segments (`util/segments.rs`) that never
//! move, so handles, caches and stacks can hold slot indices safely.
//!
//! # Moving: the `MOVING` flag of the slot state word
//!
//! A relocation marks each block it moves with one CAS that succeeds only while the slot is
//! live, matches the handle and has no pins, so no pin or free can slip in between the check and
//! the move. While the flag is set, `remove` waits, `try_pin` says [`Error::Moving`] (the pool
//! waits out the move as it waits for the pause the move runs under: `Pool::wait_out_move`),
//! and `get` may read the old or the new offset. The relocation stores the new offset, then
//! clears the flag with a release store: whoever pins after that sees the new offset.

use super::id::{pool_id_issued, Handle};
use crate::error::{Error, HandleFault, Result};
use crate::util::index_cache::{IndexCache, CACHED_INDICES};
use crate::util::index_stack::{IndexStack, NIL};
use crate::util::segments::Segmented;
use crate::util::sync::{AtomicU32, AtomicU64, CachePadded, Ordering};

const GENERATION_MASK: u64 = 0xFFFF_FFFF;
const LIVE: u64 = 1 << 32;
const MOVING: u64 = 1 << 33;
const USER_PIN_SHIFT: u32 = 34;
const VIEW_PIN_SHIFT: u32 = 49;
/// At most 2^15 - 1 pins of each kind per block.
const MAX_PINS: u64 = (1 << 15) - 1;
/// Every pin bit, of both kinds.
const PINS: u64 = !((1 << USER_PIN_SHIFT) - 1);
/// The last generation: a slot freed with it is retired.
const LAST_GENERATION: u64 = GENERATION_MASK;

/// Which count a pin goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinKind {
    /// Taken and dropped explicitly by the caller.
    User,
    /// Held by a buffer view, or by one read or write of the pool.
    View,
}

impl PinKind {
    fn shift(self) -> u32 {
        match self {
            PinKind::User => USER_PIN_SHIFT,
            PinKind::View => VIEW_PIN_SHIFT,
        }
    }

    fn count(self, state: u64) -> u64 {
        (state >> self.shift()) & MAX_PINS
    }
}

/// The error for a slot index the table never handed out (out of line: the hot paths only
/// branch to it, and build no error value they would drop).
#[cold]
fn unknown_handle() -> Error {
    Error::InvalidHandle(HandleFault::Unknown)
}

/// Pins of both kinds.
fn pins_of(state: u64) -> u32 {
    (PinKind::User.count(state) + PinKind::View.count(state)) as u32
}

/// What a live slot records about its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotInfo {
    pub(crate) offset: usize,
    pub(crate) size: usize,
    pub(crate) align_log2: u8,
    pub(crate) core: u16,
    pub(crate) tag: u32,
    pub(crate) pins: u32,
}

/// A slot, on a cache line of its own: it is written when its block is allocated, freed, pinned
/// or moved, and slots of different cores' blocks would otherwise sit side by side (40 bytes
/// each), so two threads churning handles would stall each other (1.7x one thread's throughput
/// instead of 2x).
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    state: AtomicU64,
    offset: AtomicU64,
    size: AtomicU64,
    /// `tag (0..32) | core (32..48) | align_log2 (48..56)`.
    info: AtomicU64,
    next: AtomicU32,
}

fn pack_info(tag: u32, core: u16, align_log2: u8) -> u64 {
    tag as u64 | (core as u64) << 32 | (align_log2 as u64) << 48
}

pub(crate) struct HandleTable {
    pool: u32,
    slots: Segmented<Slot>,
    fresh: AtomicU32,
    /// Free slots, one stack per core.
    free: Box<[CachePadded<IndexStack>]>,
    /// Slots retired at their last generation (never reused).
    retired: AtomicU32,
    /// The generation a fresh slot starts at (0; tests start near the last one).
    first_generation: AtomicU32,
}

impl HandleTable {
    /// A table for up to `max_live` live blocks at once, with `cores` free lists, and room for
    /// the slots the threads' caches hold besides (`util/index_cache.rs`); `Error::HostMemory` when
    /// the host has no room for it.
    pub(crate) fn new(pool: u32, max_live: usize, cores: usize) -> Result<HandleTable> {
        Ok(HandleTable {
            pool,
            slots: Segmented::new(max_live.saturating_add(CACHED_INDICES).clamp(1, (NIL - 1) as usize))?,
            fresh: AtomicU32::new(0),
            free: (0..cores.max(1)).map(|_| CachePadded(IndexStack::new())).collect(),
            retired: AtomicU32::new(0),
            first_generation: AtomicU32::new(0),
        })
    }

    fn max_slots(&self) -> u32 {
        self.slots.capacity() as u32
    }

    fn slot(&self, index: u32) -> &Slot {
        self.slots.get(index)
    }

    /// A slot that was handed out at least once, or `None` for indices never used.
    fn existing_slot(&self, index: u32) -> Option<&Slot> {
        if index >= self.fresh.load(Ordering::Acquire).min(self.max_slots()) {
            return None;
        }
        self.slots.get_existing(index)
    }

    fn pop(&self, stack: &IndexStack) -> Option<u32> {
        stack.pop(|i| &self.slot(i).next)
    }

    fn push(&self, stack: &IndexStack, slot: u32) {
        stack.push(slot, |i| &self.slot(i).next)
    }

    /// The free list of core `core`. Callers pass their own core, which is below the number of
    /// lists: the remainder (a division) is only taken for a larger number.
    #[inline]
    fn free_list(&self, core: usize) -> &IndexStack {
        let lists = self.free.len();
        &self.free[if core < lists { core } else { core % lists }]
    }

    /// A free slot for core `core`: from the calling thread's `cache`, else from the core's
    /// stack, else a fresh one (its segment installed first, so a fresh index always has
    /// storage), else from another core's stack. `Ok(None)` when the table is full; `Err` when
    /// the host has no memory for a new segment.
    #[inline]
    fn take_slot(&self, core: usize, cache: &IndexCache) -> Result<Option<u32>> {
        if let Some(slot) = cache.take() {
            return Ok(Some(slot));
        }
        self.take_shared_slot(core)
    }

    /// [`HandleTable::take_slot`] past the thread's cache.
    fn take_shared_slot(&self, core: usize) -> Result<Option<u32>> {
        let cores = self.free.len();
        if let Some(slot) = self.pop(self.free_list(core)) {
            return Ok(Some(slot));
        }
        let mut fresh = self.fresh.load(Ordering::Acquire);
        while fresh < self.max_slots() {
            self.slots.try_get(fresh)?;
            match self.fresh.compare_exchange_weak(fresh, fresh + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let first = self.first_generation.load(Ordering::Relaxed);
                    if first != 0 {
                        self.slot(fresh).state.store(first as u64, Ordering::Relaxed);
                    }
                    return Ok(Some(fresh));
                }
                Err(seen) => fresh = seen,
            }
        }
        Ok((1..cores).find_map(|i| self.pop(&self.free[(core + i) % cores])))
    }

    /// Record a new block; `Err` when the table is full or the host has no memory for it.
    pub(crate) fn insert(
        &self,
        core: usize,
        cache: &IndexCache,
        offset: usize,
        size: usize,
        align_log2: u8,
        tag: u32,
    ) -> Result<Handle> {
        let Some(index) = self.take_slot(core, cache)? else {
            return Err(Error::OutOfMemory {
                requested: size,
                bytes_free: 0,
                largest_free_block: 0,
                largest_region: None,
                unplaced_growth: None,
            });
        };
        let slot = self.slot(index);
        let generation = slot.state.load(Ordering::Acquire) & GENERATION_MASK;
        slot.offset.store(offset as u64, Ordering::Relaxed);
        slot.size.store(size as u64, Ordering::Relaxed);
        slot.info.store(pack_info(tag, core as u16, align_log2), Ordering::Relaxed);
        slot.state.store(generation | LIVE, Ordering::Release);
        Ok(Handle { pool: self.pool, slot: index, generation: generation as u32 })
    }

    fn live_slot(&self, handle: Handle) -> Result<&Slot> {
        if handle.pool != self.pool {
            // A handle naming a pool id that no pool got (0, that of a zeroed handle, among
            // them) came from no pool.
            let fault = if pool_id_issued(handle.pool) { HandleFault::Foreign } else { HandleFault::Unknown };
            return Err(Error::InvalidHandle(fault));
        }
        self.existing_slot(handle.slot).ok_or_else(unknown_handle)
    }

    fn matches(state: u64, handle: Handle) -> bool {
        state & LIVE != 0 && state & GENERATION_MASK == handle.generation as u64
    }

    /// Whether `handle`, which does not match `state`, names a generation its slot never had
    /// (see the module documentation): above the slot's, unless the slot reads generation 0
    /// and is not live (retired, or before its first block), where no handle is newer.
    fn never_held(state: u64, handle: Handle) -> bool {
        let generation = state & GENERATION_MASK;
        handle.generation as u64 > generation && (generation != 0 || state & LIVE != 0)
    }

    /// The error for `handle`, which does not match `state`: `stale` (what a freed block's
    /// handle gets from this call) unless the handle names a block the slot never held.
    #[cold]
    fn mismatch(state: u64, handle: Handle, stale: Error) -> Error {
        if Self::never_held(state, handle) {
            unknown_handle()
        } else {
            stale
        }
    }

    fn read_info(slot: &Slot, state: u64) -> SlotInfo {
        let info = slot.info.load(Ordering::Acquire);
        SlotInfo {
            offset: slot.offset.load(Ordering::Acquire) as usize,
            size: slot.size.load(Ordering::Acquire) as usize,
            tag: info as u32,
            core: (info >> 32) as u16,
            align_log2: (info >> 48) as u8,
            pins: pins_of(state),
        }
    }

    /// The block behind a live handle.
    #[inline]
    pub(crate) fn get(&self, handle: Handle) -> Result<SlotInfo> {
        self.get_and_moving(handle).map(|(info, _)| info)
    }

    /// [`HandleTable::get`], and whether the block was being moved while its slot was read.
    pub(crate) fn get_and_moving(&self, handle: Handle) -> Result<(SlotInfo, bool)> {
        let slot = self.live_slot(handle)?;
        loop {
            let state = slot.state.load(Ordering::Acquire);
            if !Self::matches(state, handle) {
                return Err(Self::mismatch(state, handle, Error::InvalidHandle(HandleFault::Freed)));
            }
            let info = Self::read_info(slot, state);
            // Seqlock-style: the slot must not have been freed and reused while we read it.
            let identity = !(MOVING | PINS);
            let again = slot.state.load(Ordering::Acquire);
            if again & identity == state & identity {
                return Ok((info, (state | again) & MOVING != 0));
            }
        }
    }

    /// Retire a live, unpinned handle: its generation moves on. Returns what it recorded.
    pub(crate) fn remove(&self, handle: Handle) -> Result<SlotInfo> {
        // The slot is ours until `recycle`: its fields cannot change under us.
        let (slot, state) = self.change_unpinned(handle, |state| (state + 1) & GENERATION_MASK)?;
        Ok(Self::read_info(slot, state))
    }

    /// Change the state word of `handle`'s live, unpinned slot to `next(state)` in one CAS,
    /// waiting while a move holds it; returns the slot and the word before. A freed or foreign
    /// handle is refused as a free refuses it ([`Error::DoubleFree`] for a freed one), a pinned
    /// one with [`Error::Pinned`].
    #[inline(always)]
    fn change_unpinned(&self, handle: Handle, next: impl Fn(u64) -> u64) -> Result<(&Slot, u64)> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Self::mismatch(state, handle, Error::DoubleFree));
            }
            if state & PINS != 0 {
                return Err(Error::Pinned { pins: pins_of(state) });
            }
            if state & MOVING != 0 {
                crate::util::sync::spin_hint();
                state = slot.state.load(Ordering::Acquire);
                continue;
            }
            match slot.state.compare_exchange_weak(state, next(state), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok((slot, state)),
                Err(seen) => state = seen,
            }
        }
    }

    /// Claim every handle of `handles` for a batch free, or none: each live, unpinned block is
    /// marked moving (waiting, as [`HandleTable::remove`] does, while a move holds it), so that
    /// no pin or free slips in between this check and [`HandleTable::remove_claimed`]. At the
    /// first handle that is freed, foreign or pinned, the marks made are cleared and its index
    /// and error returned (as [`HandleTable::remove`] would answer). `handles` must name no
    /// slot twice (the second mark would wait for the first).
    pub(crate) fn claim_for_free(&self, handles: &[Handle]) -> std::result::Result<(), (usize, Error)> {
        for (k, &handle) in handles.iter().enumerate() {
            if let Err(e) = self.change_unpinned(handle, |state| state | MOVING) {
                handles[..k].iter().for_each(|&done| self.end_move(done));
                return Err((k, e));
            }
        }
        Ok(())
    }

    /// Retire a handle that [`HandleTable::claim_for_free`] claimed: its generation moves on
    /// and the mark goes with it. Returns what its slot recorded.
    pub(crate) fn remove_claimed(&self, handle: Handle) -> SlotInfo {
        let slot = self.slot(handle.slot());
        // While marked, nothing else writes the word: pins and frees wait, and an unpin finds
        // no pin to take.
        let state = slot.state.load(Ordering::Acquire);
        debug_assert!(Self::matches(state, handle) && state & MOVING != 0 && state & PINS == 0);
        let info = Self::read_info(slot, state);
        slot.state.store((state + 1) & GENERATION_MASK, Ordering::Release);
        info
    }

    /// Put a removed slot in the calling thread's `cache`, or on `core`'s free list when the
    /// cache is full, or retire it at its last generation.
    pub(crate) fn recycle(&self, core: usize, cache: &IndexCache, handle: Handle) {
        if handle.generation as u64 == LAST_GENERATION {
            self.retired.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !cache.put(handle.slot) {
            self.push(self.free_list(core), handle.slot);
        }
    }

    /// Remove a pin of `kind`; `Err` if the handle is not live or has no pin of that kind.
    /// Returns the pins of that kind left.
    pub(crate) fn unpin(&self, handle: Handle, kind: PinKind) -> Result<u32> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Self::mismatch(state, handle, Error::InvalidHandle(HandleFault::Freed)));
            }
            let pins = kind.count(state);
            if pins == 0 {
                return Err(Error::InvalidBlock {
                    offset: slot.offset.load(Ordering::Relaxed) as usize,
                    size: slot.size.load(Ordering::Relaxed) as usize,
                    reason: match kind {
                        PinKind::User => "unpin without a matching pin (a buffer view's pin is released with the view)",
                        PinKind::View => "a view's pin released without a view",
                    },
                });
            }
            match slot.state.compare_exchange_weak(
                state,
                state - (1 << kind.shift()),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(pins as u32 - 1),
                Err(seen) => state = seen,
            }
        }
    }

    /// Visit every live slot: `(handle, info)`. Meant for a quiescent (paused) pool.
    pub(crate) fn for_each_live(&self, f: &mut dyn FnMut(Handle, SlotInfo)) {
        let fresh = self.fresh.load(Ordering::Acquire).min(self.max_slots());
        for index in 0..fresh {
            let Some(slot) = self.existing_slot(index) else {
                continue;
            };
            let state = slot.state.load(Ordering::Acquire);
            if state & LIVE == 0 {
                continue;
            }
            let handle = Handle { pool: self.pool, slot: index, generation: state as u32 };
            if let Ok(info) = self.get(handle) {
                f(handle, info);
            }
        }
    }

    /// Whether slot `index` was handed out and is not live now (a check of the slots the
    /// threads' caches hold).
    pub(crate) fn is_free_slot(&self, index: u32) -> bool {
        self.existing_slot(index).is_some_and(|slot| slot.state.load(Ordering::Acquire) & LIVE == 0)
    }

    /// Slots on the shared free lists (not those in the threads' caches): a check that none
    /// got lost.
    pub(crate) fn count_free_listed(&self) -> usize {
        let limit = self.max_slots() as usize + 1;
        self.free.iter().map(|stack| stack.snapshot(limit, |i| &self.slot(i).next).len()).sum()
    }

    /// Slots ever handed out.
    pub(crate) fn slots_used(&self) -> usize {
        self.fresh.load(Ordering::Acquire).min(self.max_slots()) as usize
    }

    /// Slots retired at their last generation.
    pub(crate) fn slots_retired(&self) -> usize {
        self.retired.load(Ordering::Relaxed) as usize
    }

    /// Start the generations of slots not yet handed out at `generation` (tests: generations
    /// near the last one).
    pub(crate) fn start_generations_at(&self, generation: u32) {
        self.first_generation.store(generation, Ordering::Relaxed);
    }
}

/// A cache that holds nothing: every free goes to the shared stacks (tests of the stacks).
#[cfg(test)]
fn no_cache() -> IndexCache {
    IndexCache::numbered(usize::MAX)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::util::index_cache;

    #[test]
    fn generations_refuse_stale_handles() {
        let table = HandleTable::new(crate::handle::id::new_pool_id(), 100, 2).unwrap();
        let a = table.insert(0, &no_cache(), 4096, 100, 6, 3).unwrap();
        let info = table.get(a).unwrap();
        assert_eq!((info.offset, info.size, info.tag, info.align_log2), (4096, 100, 3, 6));
        table.remove(a).unwrap();
        assert_eq!(table.remove(a), Err(Error::DoubleFree));
        assert_eq!(table.get(a), Err(Error::InvalidHandle(HandleFault::Freed)));
        table.recycle(0, &no_cache(), a);
        let b = table.insert(0, &no_cache(), 8192, 10, 6, 0).unwrap();
        assert_eq!(b.slot(), a.slot(), "slot reused");
        assert_ne!(b.generation(), a.generation());
        assert_eq!(table.get(a), Err(Error::InvalidHandle(HandleFault::Freed)));
        assert_eq!(table.remove(a), Err(Error::DoubleFree));
        assert_eq!(table.get(b).unwrap().offset, 8192);
        let foreign = Handle { pool: crate::handle::id::new_pool_id(), ..b };
        assert_eq!(table.get(foreign), Err(Error::InvalidHandle(HandleFault::Foreign)));
        let no_pool = Handle { pool: u32::MAX, ..b };
        assert_eq!(table.get(no_pool), Err(Error::InvalidHandle(HandleFault::Unknown)), "no pool got this id");
        let unknown = Handle { slot: 99, ..b };
        assert_eq!(table.get(unknown), Err(Error::InvalidHandle(HandleFault::Unknown)));
        // A generation the slot never had (above its own) names no block: neither freed nor
        // freed twice. Each call that a freed handle fails fails it so.
        let forged = Handle { generation: b.generation() + 1, ..b };
        assert_eq!(table.remove(forged), Err(Error::InvalidHandle(HandleFault::Unknown)));
        assert_eq!(table.get(forged), Err(Error::InvalidHandle(HandleFault::Unknown)));
        assert_eq!(table.try_pin(forged, PinKind::User), Err(Error::InvalidHandle(HandleFault::Unknown)));
        assert_eq!(table.unpin(forged, PinKind::User), Err(Error::InvalidHandle(HandleFault::Unknown)));
        assert_eq!(table.try_pin(forged, PinKind::User), Err(Error::InvalidHandle(HandleFault::Unknown)));
        assert_eq!(table.begin_move(forged), Err(Error::InvalidHandle(HandleFault::Unknown)));
        table.remove(b).unwrap();
        // Freed: the slot's generation is the forged one now, and no longer above it.
        assert_eq!(table.remove(forged), Err(Error::DoubleFree));
        assert_eq!(
            table.remove(Handle { generation: b.generation() + 2, ..b }),
            Err(Error::InvalidHandle(HandleFault::Unknown))
        );
        assert_eq!(table.remove(b), Err(Error::DoubleFree));
        let zeroed = Handle { pool: 0, slot: 0, generation: 0 };
        assert_eq!(table.get(zeroed), Err(Error::InvalidHandle(HandleFault::Unknown)), "no pool has id 0");
        assert_eq!(Handle::from_bits(b.to_bits()), b);
    }

    #[test]
    fn a_full_pin_count_is_its_own_error_and_changes_nothing() {
        let table = HandleTable::new(1, 10, 1).unwrap();
        let h = table.insert(0, &no_cache(), 0, 64, 6, 0).unwrap();
        for n in 1..=MAX_PINS {
            assert_eq!(table.try_pin(h, PinKind::View), Ok(n as u32));
        }
        let most = MAX_PINS as u32;
        assert_eq!(table.try_pin(h, PinKind::View), Err(Error::PinLimit { most }));
        assert!(Error::PinLimit { most }.to_string().contains("the most it can"));
        assert_eq!(table.try_pin(h, PinKind::User), Ok(1), "the other kind counts apart");
        assert_eq!(table.unpin(h, PinKind::View), Ok(most - 1));
        assert_eq!(table.try_pin(h, PinKind::View), Ok(most));
    }

    #[test]
    fn pins_block_removal() {
        let table = HandleTable::new(1, 10, 1).unwrap();
        let h = table.insert(0, &no_cache(), 0, 64, 6, 0).unwrap();
        assert_eq!(table.try_pin(h, PinKind::User), Ok(1));
        assert_eq!(table.try_pin(h, PinKind::User), Ok(2));
        assert_eq!(table.remove(h), Err(Error::Pinned { pins: 2 }));
        assert_eq!(table.unpin(h, PinKind::User), Ok(1));
        assert_eq!(table.unpin(h, PinKind::User), Ok(0));
        assert!(table.unpin(h, PinKind::User).is_err());
        table.remove(h).unwrap();
        assert!(table.try_pin(h, PinKind::User).is_err());
    }

    #[test]
    fn capacity_is_bounded() {
        let table = HandleTable::new(1, 3, 2).unwrap();
        let slots = 3 + CACHED_INDICES;
        let hs: Vec<_> = (0..slots).map(|i| table.insert(i % 2, &no_cache(), i, 1, 0, 0).unwrap()).collect();
        assert!(table.insert(0, &no_cache(), 9, 1, 0, 0).is_err());
        table.remove(hs[1]).unwrap();
        table.recycle(1, &no_cache(), hs[1]);
        // Core 0's list is empty and nothing is fresh: it steals core 1's slot.
        assert!(table.insert(0, &no_cache(), 9, 1, 0, 0).is_ok());
    }

    #[test]
    fn a_thread_takes_back_the_slot_it_freed_last() {
        let table = HandleTable::new(1, 100, 2).unwrap();
        let cache = IndexCache::numbered(0);
        let a = table.insert(0, &cache, 0, 8, 0, 0).unwrap();
        let b = table.insert(0, &cache, 64, 8, 0, 0).unwrap();
        for h in [a, b] {
            table.remove(h).unwrap();
            table.recycle(1, &cache, h);
        }
        assert_eq!(table.count_free_listed(), 0, "both slots are in the cache, not on a stack");
        assert_eq!(cache.held().count(), 2);
        let c = table.insert(0, &cache, 128, 8, 0, 0).unwrap();
        assert_eq!(c.slot(), b.slot());
        assert_ne!(c.generation(), b.generation());
        assert_eq!(table.get(b), Err(Error::InvalidHandle(HandleFault::Freed)));
        assert_eq!(table.remove(b), Err(Error::DoubleFree));
        assert_eq!(table.get(c).unwrap().offset, 128);
        // Another thread's cache does not see the first one's slot.
        let other = IndexCache::numbered(1);
        let d = table.insert(0, &other, 192, 8, 0, 0).unwrap();
        assert_ne!(d.slot(), a.slot());
    }

    #[test]
    fn full_caches_never_take_a_slot_a_live_block_needs() {
        let max_live = 1000;
        let table = HandleTable::new(1, max_live, 2).unwrap();
        // Every cache the budget allows, each filled with freed slots.
        let caches: Vec<IndexCache> = (0..CACHED_INDICES / index_cache::CAPACITY).map(IndexCache::numbered).collect();
        for cache in &caches {
            let hs: Vec<_> = (0..index_cache::CAPACITY).map(|i| table.insert(0, cache, i, 1, 0, 0).unwrap()).collect();
            for h in hs {
                table.remove(h).unwrap();
                table.recycle(0, cache, h);
            }
            assert_eq!(cache.held().count(), index_cache::CAPACITY);
        }
        let cached: usize = caches.iter().map(|c| c.held().count()).sum();
        assert_eq!(cached, CACHED_INDICES);
        // Threads past the budget cache nothing, and find a slot for every live block.
        let late = IndexCache::numbered(caches.len());
        let live: Vec<_> = (0..max_live).map(|i| table.insert(1, &late, i, 1, 0, 0).unwrap()).collect();
        assert!(table.insert(1, &late, 0, 1, 0, 0).is_err(), "the table is full");
        table.remove(live[0]).unwrap();
        table.recycle(1, &late, live[0]);
        assert_eq!(late.held().count(), 0);
        assert!(table.insert(0, &late, 0, 1, 0, 0).is_ok());
    }

    #[test]
    fn concurrent_insert_remove_keeps_every_slot() {
        let table = HandleTable::new(1, 1 << 16, 2).unwrap();
        std::thread::scope(|s| {
            for t in 0..4usize {
                let table = &table;
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..20_000usize {
                        if i % 3 == 2 {
                            if let Some(h) = held.pop() {
                                table.remove(h).unwrap();
                                table.recycle(t, &no_cache(), h);
                            }
                        } else {
                            let h = table.insert(t, &no_cache(), i * 4 + t, 1, 0, t as u32).unwrap();
                            assert_eq!(table.get(h).unwrap().offset, i * 4 + t);
                            held.push(h);
                        }
                    }
                    for h in held {
                        table.remove(h).unwrap();
                        table.recycle(t, &no_cache(), h);
                    }
                });
            }
        });
        let mut live = 0;
        table.for_each_live(&mut |_, _| live += 1);
        assert_eq!(live, 0);
        assert_eq!(table.count_free_listed(), table.slots_used());
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A buffer view pins and unpins while its block's user pins once and unpins twice: the
    /// user's second unpin is refused whatever the view does (it never drops the view's pin),
    /// the view's unpin always finds its pin, and afterwards the block frees.
    #[test]
    fn user_pins_never_drop_view_pins() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 4, 1).unwrap());
            let h = table.insert(0, &no_cache(), 0, 8, 0, 0).unwrap();
            let t2 = table.clone();
            let viewer = thread::spawn(move || {
                t2.try_pin(h, PinKind::View).unwrap();
                let freed = t2.remove(h).is_ok();
                t2.unpin(h, PinKind::View).unwrap();
                freed
            });
            table.try_pin(h, PinKind::User).unwrap();
            table.unpin(h, PinKind::User).unwrap();
            assert!(table.unpin(h, PinKind::User).is_err(), "a user unpin dropped a view's pin");
            assert!(!viewer.join().unwrap(), "a pinned block was freed");
            table.remove(h).unwrap();
        });
    }

    /// A batch free of two blocks races a pin of the second and a free of the first: either the
    /// batch claims both (the pin fails, the free waits and finds the block freed) or it claims
    /// neither and frees nothing (no mark left behind, the other calls succeed).
    #[test]
    fn a_batch_free_is_claimed_whole_or_not_at_all() {
        crate::util::sync::loom_model_bounded(3, || {
            let table = Arc::new(HandleTable::new(1, 4, 1).unwrap());
            let a = table.insert(0, &no_cache(), 100, 8, 0, 0).unwrap();
            let b = table.insert(0, &no_cache(), 300, 8, 0, 0).unwrap();
            let (t2, t3) = (table.clone(), table.clone());
            // The pin that does not wait (the waiting one spins: too many branches for loom
            // beside the free's wait): it fails while the batch holds b.
            let pinner = thread::spawn(move || t3.try_pin(b, PinKind::User).is_ok());
            let freer = thread::spawn(move || t2.remove(a).is_ok());
            let batch = table.claim_for_free(&[a, b]);
            if batch.is_ok() {
                assert_eq!(table.remove_claimed(a).offset, 100);
                assert_eq!(table.remove_claimed(b).offset, 300);
            }
            let pinned = pinner.join().unwrap();
            let freed_alone = freer.join().unwrap();
            match batch {
                Ok(()) => assert!(!pinned && !freed_alone, "a call went through a claimed block"),
                Err((0, e)) => {
                    assert!(freed_alone && e == Error::DoubleFree, "{e:?}");
                    // b was never claimed: the pin went through, and b is unmarked.
                    assert!(pinned);
                    table.unpin(b, PinKind::User).unwrap();
                    table.remove(b).unwrap();
                }
                Err((1, e)) => {
                    assert!(pinned && matches!(e, Error::Pinned { .. }), "{e:?}");
                    assert!(freed_alone, "a's mark was not cleared: the free would still wait");
                    table.unpin(b, PinKind::User).unwrap();
                    table.remove(b).unwrap();
                }
                Err(other) => panic!("{other:?}"),
            }
        });
    }

    /// Two threads free the same handle: exactly one succeeds.
    #[test]
    fn racing_double_free_has_one_winner() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 4, 1).unwrap());
            let h = table.insert(0, &no_cache(), 0, 1, 0, 0).unwrap();
            let t2 = table.clone();
            let other = thread::spawn(move || t2.remove(h).is_ok());
            let mine = table.remove(h).is_ok();
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs);
        });
    }
}

impl HandleTable {
    /// Mark a live, unpinned block as moving; returns what its slot records. Refused (and
    /// nothing changes) for a freed or foreign handle, a pinned block, or one already moving.
    pub(crate) fn begin_move(&self, handle: Handle) -> Result<SlotInfo> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Self::mismatch(state, handle, Error::InvalidHandle(HandleFault::Freed)));
            }
            if state & PINS != 0 {
                return Err(Error::Pinned { pins: pins_of(state) });
            }
            if state & MOVING != 0 {
                return Err(Error::InvalidMove { reason: "the block is named twice in the batch".into() });
            }
            match slot.state.compare_exchange_weak(state, state | MOVING, Ordering::AcqRel, Ordering::Acquire) {
                // Moving and unpinned: the slot's fields cannot change under us now.
                Ok(_) => return Ok(Self::read_info(slot, state)),
                Err(seen) => state = seen,
            }
        }
    }

    /// Point a moving block's slot at `offset` (its bytes are there already).
    pub(crate) fn set_moved_offset(&self, handle: Handle, offset: usize) {
        let slot = self.slot(handle.slot());
        debug_assert!(slot.state.load(Ordering::Relaxed) & MOVING != 0, "only a moving slot is re-pointed");
        slot.offset.store(offset as u64, Ordering::Release);
    }

    /// Mark every handle of `handles` moving (as [`HandleTable::begin_move`]) if each is live,
    /// unpinned and `ok(k, offset)` holds for it (`offset`: where its slot says it is now);
    /// otherwise clear the marks made and say no. A batch planned while the pool ran claims its
    /// blocks all or none this way: a free racing with the claim either wins (the claim fails
    /// and leaves nothing marked) or waits until the batch clears its marks.
    pub(crate) fn begin_moves(&self, handles: &[Handle], ok: impl Fn(usize, usize) -> bool) -> bool {
        for (k, &h) in handles.iter().enumerate() {
            let good = match self.begin_move(h) {
                Ok(info) => {
                    let good = ok(k, info.offset);
                    if !good {
                        self.end_move(h);
                    }
                    good
                }
                Err(_) => false,
            };
            if !good {
                handles[..k].iter().for_each(|&done| self.end_move(done));
                return false;
            }
        }
        true
    }

    /// The move of `handle` is over (done or undone): pins and frees may go on.
    pub(crate) fn end_move(&self, handle: Handle) {
        let slot = self.slot(handle.slot());
        let before = slot.state.fetch_and(!MOVING, Ordering::AcqRel);
        debug_assert!(before & MOVING != 0 && before & GENERATION_MASK == handle.generation() as u64);
    }

    /// Add a pin of `kind` without waiting: [`Error::Moving`] while the block is being moved.
    pub(crate) fn try_pin(&self, handle: Handle, kind: PinKind) -> Result<u32> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Self::mismatch(state, handle, Error::InvalidHandle(HandleFault::Freed)));
            }
            if state & MOVING != 0 {
                return Err(Error::Moving);
            }
            let pins = kind.count(state);
            if pins >= MAX_PINS {
                return Err(Error::PinLimit { most: MAX_PINS as u32 });
            }
            let one = 1 << kind.shift();
            match slot.state.compare_exchange_weak(state, state + one, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(pins as u32 + 1),
                Err(seen) => state = seen,
            }
        }
    }

    /// Visit every live slot of a paused pool as `(handle, info, claimed)`: each unpinned block
    /// is marked moving on the way (`claimed`; the caller clears every mark), pinned ones are
    /// only reported. One pass, one CAS per block.
    pub(crate) fn claim_live(&self, f: &mut dyn FnMut(Handle, SlotInfo, bool)) {
        let fresh = self.fresh.load(Ordering::Acquire).min(self.max_slots());
        for index in 0..fresh {
            let Some(slot) = self.existing_slot(index) else {
                continue;
            };
            let mut state = slot.state.load(Ordering::Acquire);
            loop {
                if state & LIVE == 0 || state & MOVING != 0 {
                    break;
                }
                let handle = Handle { pool: self.pool, slot: index, generation: state as u32 };
                if state & PINS != 0 {
                    f(handle, Self::read_info(slot, state), false);
                    break;
                }
                match slot.state.compare_exchange_weak(state, state | MOVING, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        f(handle, Self::read_info(slot, state), true);
                        break;
                    }
                    Err(seen) => state = seen,
                }
            }
        }
    }

    /// Whether `handle`'s block is live and being moved now.
    #[cfg(test)]
    pub(crate) fn is_moving(&self, handle: Handle) -> bool {
        self.live_slot(handle).is_ok_and(|slot| {
            let state = slot.state.load(Ordering::Acquire);
            Self::matches(state, handle) && state & MOVING != 0 && state & LIVE != 0
        })
    }
}

#[cfg(all(test, not(loom)))]
mod move_tests {
    use super::*;

    #[test]
    fn a_moving_block_refuses_pins_and_second_moves_until_it_lands() {
        let table = HandleTable::new(1, 8, 1).unwrap();
        let h = table.insert(0, &no_cache(), 4096, 100, 6, 0).unwrap();
        let info = table.begin_move(h).unwrap();
        assert_eq!(info.offset, 4096);
        assert!(table.is_moving(h));
        assert_eq!(table.try_pin(h, PinKind::User), Err(Error::Moving));
        assert!(matches!(table.begin_move(h), Err(Error::InvalidMove { .. })));
        table.set_moved_offset(h, 8192);
        table.end_move(h);
        assert!(!table.is_moving(h));
        assert_eq!(table.try_pin(h, PinKind::User), Ok(1));
        assert_eq!(table.get(h).unwrap().offset, 8192);
        assert_eq!(table.begin_move(h), Err(Error::Pinned { pins: 1 }));
        table.unpin(h, PinKind::User).unwrap();
        table.remove(h).unwrap();
        assert_eq!(table.begin_move(h), Err(Error::InvalidHandle(HandleFault::Freed)));
    }
}

#[cfg(all(test, loom))]
mod loom_moves {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A relocation moves a block while another thread pins it, reads its offset twice and
    /// unpins: the offset never changes under a pin, and a pin taken after the move sees the
    /// new offset.
    #[test]
    fn a_pin_never_sees_a_block_move_under_it() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 4, 1).unwrap());
            let h = table.insert(0, &no_cache(), 100, 8, 0, 0).unwrap();
            let t2 = table.clone();
            let pinner = thread::spawn(move || {
                // As the pool pins: again after each `Moving` (it waits out the move meanwhile).
                while let Err(err) = t2.try_pin(h, PinKind::User) {
                    assert_eq!(err, Error::Moving);
                    thread::yield_now();
                }
                let first = t2.get(h).unwrap().offset;
                let second = t2.get(h).unwrap().offset;
                t2.unpin(h, PinKind::User).unwrap();
                (first, second)
            });
            let moved = match table.begin_move(h) {
                Ok(_) => {
                    table.set_moved_offset(h, 200);
                    table.end_move(h);
                    true
                }
                Err(Error::Pinned { .. }) => false,
                Err(other) => panic!("unexpected {other:?}"),
            };
            let (first, second) = pinner.join().unwrap();
            assert_eq!(first, second, "the block moved under a pin");
            if !moved {
                assert_eq!(first, 100, "nothing moved, the offset is the old one");
            }
            assert_eq!(table.get(h).unwrap().offset, if moved { 200 } else { 100 });
        });
    }

    /// A free races a move: the free waits for the move to land (or the move sees the block
    /// freed), and the slot is never re-pointed after it was freed.
    #[test]
    fn a_free_and_a_move_never_overlap() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 4, 1).unwrap());
            let h = table.insert(0, &no_cache(), 100, 8, 0, 0).unwrap();
            let t2 = table.clone();
            let freer = thread::spawn(move || t2.remove(h).map(|info| info.offset));
            let moved = table.begin_move(h).is_ok();
            if moved {
                table.set_moved_offset(h, 200);
                table.end_move(h);
            }
            let freed_at = freer.join().unwrap().expect("the free succeeds, after the move if any");
            assert_eq!(freed_at, if moved { 200 } else { 100 }, "the free saw a half-done move");
        });
    }

    /// A batch of two blocks planned while the pool ran is claimed on the paused pool while a
    /// free of one of them (a call admitted before the pause, or the pause holder's own) and
    /// a pin of the other race with it: the batch is claimed whole or not at all; when claimed,
    /// the free waits and frees the block at its new place; when not, no mark is left behind
    /// and nothing moves.
    #[test]
    fn a_batch_is_claimed_whole_or_not_at_all_against_a_free_and_a_pin() {
        crate::util::sync::loom_model_bounded(3, || {
            let table = Arc::new(HandleTable::new(1, 4, 1).unwrap());
            let a = table.insert(0, &no_cache(), 100, 8, 0, 0).unwrap();
            let b = table.insert(0, &no_cache(), 300, 8, 0, 0).unwrap();
            let (t2, t3) = (table.clone(), table.clone());
            let freer = thread::spawn(move || t2.remove(a).map(|info| info.offset));
            let pinner = thread::spawn(move || t3.try_pin(b, PinKind::User).is_ok());
            let claimed = table.begin_moves(&[a, b], |k, offset| offset == [100, 300][k]);
            if claimed {
                table.set_moved_offset(a, 200);
                table.set_moved_offset(b, 400);
                table.end_move(a);
                table.end_move(b);
            }
            let freed_at = freer.join().unwrap().expect("the free succeeds, after the batch if any");
            let pinned = pinner.join().unwrap();
            assert_eq!(freed_at, if claimed { 200 } else { 100 }, "the free saw a half-done batch");
            let b_now = table.get(b).unwrap().offset;
            assert_eq!(b_now, if claimed { 400 } else { 300 });
            // No mark is left: b can be claimed again (unless the pin holds it).
            match table.begin_move(b) {
                Ok(_) => {
                    assert!(!pinned);
                    table.end_move(b);
                }
                Err(e) => assert!(pinned && matches!(e, Error::Pinned { .. }), "{e:?}"),
            }
        });
    }
}

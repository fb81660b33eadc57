//! Freed blocks kept for reuse: per core and size class, a few buddy blocks that were freed but
//! stay allocated in their chunk's tree. The next allocation of the same class takes one with a
//! single atomic swap instead of a tree search, and the free that put it there skipped the
//! tree's release and its announcements (summaries, records, memos).
//!
//! # What is cached
//!
//! A buddy block inside one chunk (no run, no front) of more than a bank and at most half a
//! chunk. A block larger than a bank starts on a bank boundary, so one *state* per bank granule
//! describes it. Its *class* is its unit count (`Geometry::buddy_layout`), which its requested
//! size decides: every block of a class has the same units and the same pieces at its start, so
//! a cached block serves any request of its class whose alignment is at most a bank.
//!
//! # How much
//!
//! [`SLOTS`] per class and core, and a *budget* of bytes over all cores: a core keeps up to
//! its share of the budget, or up to what the other cores' caches left of the budget when it
//! last looked, if more (it looks again every [`RECHECK`]th put that its limit refuses), so a
//! thread that frees alone may use all of it. Together they hold at most the budget, except
//! when cores fill their shares after one has borrowed the rest (then less than twice the
//! budget until the borrower's blocks are taken); racing frees may pass either bound by a
//! block each. The pool caches nothing while it is fuller than its gate
//! (`Pool::may_cache`). A failing allocation, a trim and every compaction *drain* the
//! caches into the trees first, so cached blocks are never what makes an allocation fail, and
//! a core that finds no chunk to be granted drains its own cache before it looks at other
//! cores' chunks, so cached blocks do not use up the free chunks either;
//! statistics, snapshots and `check()` count cached blocks free without draining them
//! ([`BlockCaches::cached`]), so that reading a pool never changes where its next block goes,
//! and a drain changes nothing they show (the chunks it empties stay with their cores until
//! the next reclaim; a failing allocation's drain gives them back at once).
//!
//! # Protocol
//!
//! A slot holds `offset + 1` or 0; whoever swaps a block out of a slot owns it. A granule's state
//! is `NONE`, `CACHED` (its block sits in a slot) or `BUSY` (its block is being released to
//! the tree), two bits in a word of 32 granules:
//!
//! * *Free* a block (validated against its tree by the caller): CAS `NONE -> CACHED`, check the
//!   tree again (a drain may have released the block since: then this is a second free, and the
//!   state goes back to `NONE`) and put it in an empty slot, or, when the cache is full or the CAS of every empty slot fails, CAS
//!   `NONE -> BUSY` (or `CACHED -> BUSY`), release it to the tree and *settle* (`BUSY -> NONE`).
//!   A free that finds `CACHED` is a second free of a cached block: an error, nothing changes. A
//!   free that finds `BUSY` releases to the tree without touching the state: the tree's release
//!   decides between it and the `BUSY` owner, as it decides any two racing frees.
//! * *Take*: swap a slot to 0; the block is the taker's; clear its state (`CACHED -> NONE`)
//!   before handing it out, so the new owner's free finds `NONE`.
//! * *Drain*: swap a slot to 0, `CACHED -> BUSY`, release to the tree, settle.
//!
//! So a live block's state is `NONE` or, while a drain that released its start moments before is
//! finishing, `BUSY`; never `CACHED`. The loom models below check the protocol: two racing frees
//! of one block, a take and a drain.

use crate::util::grow::try_boxed;
use crate::util::sync::{AtomicU64, CachePadded, Ordering};
use crate::util::zeroed::Zeroed;

use crate::error::Result;

/// Cached blocks per class and core: two 64-byte lines of slots.
pub(crate) const SLOTS: usize = 16;

const NONE: u64 = 0;
const CACHED: u64 = 1;
const BUSY: u64 = 2;
const STATE_MASK: u64 = 3;
/// Granule states per word.
const PER_WORD: usize = 32;

/// How many of the [`PER_WORD`] states in word `w` are `CACHED`, and how many `BUSY`.
fn count_states(w: u64) -> (usize, usize) {
    const LOW_BITS: u64 = 0x5555_5555_5555_5555;
    let (low, high) = (w & LOW_BITS, (w >> 1) & LOW_BITS);
    const _: () = assert!(CACHED == 1 && BUSY == 2 && STATE_MASK == 3);
    ((low & !high).count_ones() as usize, (high & !low).count_ones() as usize)
}

/// What a free should do with its block (see [`BlockCaches::put`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// The block is cached: nothing else to do.
    Kept,
    /// Release the block to its tree, then call [`BlockCaches::settle`].
    ReleaseThenSettle,
    /// Release the block to its tree; its state belongs to another caller.
    Release,
    /// The block is cached already: this is a second free.
    Twice,
}

/// Over-limit puts of a core between two reads of what the other cores' caches hold.
const RECHECK: u64 = 32;

/// One core's cache: `classes * SLOTS` slots and what they hold.
struct CoreCache {
    slots: Box<[AtomicU64]>,
    held: CachePadded<Held>,
}

/// The bytes a core's cache holds and how many it may hold, on a line of its own.
struct Held {
    bytes: AtomicU64,
    /// Its share of the budget, or more: what the other cores' caches left of the budget when
    /// it last looked (`BlockCaches::has_room`).
    limit: AtomicU64,
    /// Puts refused by the limit since the cache last looked at the others.
    over: AtomicU64,
}

/// Every core's cache of freed blocks and the arena's granule states (see the module
/// documentation).
pub(crate) struct BlockCaches {
    cores: Box<[CoreCache]>,
    states: Zeroed<AtomicU64>,
    /// `log2` of a granule's bytes.
    granule_shift: u32,
    /// Bytes all the caches may hold together.
    budget: u64,
    /// A core's share of the budget: bytes its cache may hold without looking at the others.
    share: u64,
}

impl BlockCaches {
    /// Caches for `cores` cores of `classes` classes each over `bytes` bytes of offsets, in
    /// granules of `granule` bytes (a power of two), holding at most `budget` bytes together.
    pub(crate) fn new(cores: usize, classes: usize, bytes: usize, granule: usize, budget: u64) -> Result<BlockCaches> {
        debug_assert!(granule.is_power_of_two());
        let granules = bytes.div_ceil(granule);
        let states = Zeroed::new(granules.div_ceil(PER_WORD), "the block caches' granule states")?;
        let per_core = classes * SLOTS;
        let mut all = Vec::new();
        all.try_reserve_exact(cores).map_err(|_| crate::error::Error::HostMemory {
            what: "the block caches",
            bytes: cores.saturating_mul(std::mem::size_of::<CoreCache>()),
        })?;
        for _ in 0..cores {
            all.push(CoreCache {
                slots: try_boxed(per_core, "the block caches' slots", |_| AtomicU64::new(0))?,
                held: CachePadded(Held {
                    bytes: AtomicU64::new(0),
                    limit: AtomicU64::new(budget / cores.max(1) as u64),
                    over: AtomicU64::new(0),
                }),
            });
        }
        let share = budget / cores.max(1) as u64;
        Ok(BlockCaches {
            cores: all.into_boxed_slice(),
            states,
            granule_shift: granule.trailing_zeros(),
            budget,
            share,
        })
    }

    /// Whether core `owner`'s cache may take a block of `bytes` bytes more: within its limit
    /// (its share of the budget, or what the other cores' caches left of the budget when it
    /// last looked, if more). Past its limit, every [`RECHECK`]th put looks again (one relaxed
    /// load per other core), so that a core that frees alone keeps as much as all of them
    /// would, while cores that all keep their shares seldom read each other's lines.
    #[inline]
    fn has_room(&self, owner: usize, bytes: u64) -> bool {
        let held = &self.cores[owner].held;
        let mine = held.bytes.load(Ordering::Relaxed) + bytes;
        if mine <= held.limit.load(Ordering::Relaxed) {
            return true;
        }
        if held.over.fetch_add(1, Ordering::Relaxed) % RECHECK != 0 {
            return false;
        }
        let limit = self.budget.saturating_sub(self.others_bytes(owner)).max(self.share);
        held.limit.store(limit, Ordering::Relaxed);
        mine <= limit
    }

    #[inline(never)]
    fn others_bytes(&self, owner: usize) -> u64 {
        let others = self.cores.iter().enumerate().filter(|&(core, _)| core != owner);
        others.map(|(_, cache)| cache.held.bytes.load(Ordering::Relaxed)).sum()
    }

    fn class_slots(&self, core: usize, class: usize) -> &[AtomicU64] {
        &self.cores[core].slots[class * SLOTS..(class + 1) * SLOTS]
    }

    /// The word and shift of the state of the granule at `offset`.
    #[inline]
    fn state_of(&self, offset: usize) -> (&AtomicU64, u32) {
        let granule = offset >> self.granule_shift;
        (&self.states[granule / PER_WORD], 2 * (granule % PER_WORD) as u32)
    }

    /// Move the state at `offset` from `NONE` to `to`; the state found otherwise.
    #[inline]
    fn claim_state(&self, offset: usize, to: u64) -> std::result::Result<(), u64> {
        let (word, shift) = self.state_of(offset);
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let state = (current >> shift) & STATE_MASK;
            if state != NONE {
                return Err(state);
            }
            match word.compare_exchange_weak(current, current | to << shift, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => current = now,
            }
        }
    }

    /// Turn the state at `offset`, which the caller owns, from `from` to `to`.
    #[inline]
    fn turn_state(&self, offset: usize, from: u64, to: u64) {
        let (word, shift) = self.state_of(offset);
        let before = word.fetch_xor((from ^ to) << shift, Ordering::AcqRel);
        debug_assert_eq!((before >> shift) & STATE_MASK, from, "granule state of offset {offset}");
    }

    /// Decide what the free of the block at `offset` (`bytes` bytes, class `class`, in a chunk
    /// of core `owner`) does; `room`: whether the pool may cache at all now. The caller checked
    /// that the block's nodes are allocated; `allocated` checks it again once the state is
    /// `CACHED` (a drain may have released the block in between: then this free is a second
    /// one).
    #[inline]
    pub(crate) fn put(
        &self,
        owner: usize,
        class: usize,
        offset: usize,
        bytes: u64,
        room: bool,
        allocated: impl FnOnce() -> bool,
    ) -> Put {
        let cache = &self.cores[owner];
        let slots = self.class_slots(owner, class);
        let wanted = room && self.has_room(owner, bytes) && slots.iter().any(|s| s.load(Ordering::Relaxed) == 0);
        let to = if wanted { CACHED } else { BUSY };
        match self.claim_state(offset, to) {
            Ok(()) => {}
            Err(CACHED) => return Put::Twice,
            Err(_) => return Put::Release,
        }
        if !wanted {
            return Put::ReleaseThenSettle;
        }
        if !allocated() {
            self.turn_state(offset, CACHED, NONE);
            return Put::Twice;
        }
        let value = offset as u64 + 1;
        for slot in slots {
            if slot.load(Ordering::Relaxed) == 0
                && slot.compare_exchange(0, value, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                cache.held.bytes.fetch_add(bytes, Ordering::Relaxed);
                return Put::Kept;
            }
        }
        self.turn_state(offset, CACHED, BUSY);
        Put::ReleaseThenSettle
    }

    /// The release that [`Put::ReleaseThenSettle`] asked for is done: the state at `offset`
    /// goes back to `NONE`.
    #[inline]
    pub(crate) fn settle(&self, offset: usize) {
        self.turn_state(offset, BUSY, NONE);
    }

    /// A cached block of class `class` from core `core`'s cache, now the caller's (its state
    /// `NONE`), with its bytes `bytes`.
    #[inline]
    pub(crate) fn take(&self, core: usize, class: usize, bytes: u64) -> Option<usize> {
        for slot in self.class_slots(core, class) {
            if slot.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let value = slot.swap(0, Ordering::AcqRel);
            if value != 0 {
                let offset = (value - 1) as usize;
                self.turn_state(offset, CACHED, NONE);
                self.cores[core].held.bytes.fetch_sub(bytes, Ordering::Relaxed);
                return Some(offset);
            }
        }
        None
    }

    /// Empty every cache: each block goes to `release(offset, class)` (which gives it back to
    /// its tree) between `CACHED -> BUSY` and the settle. `bytes_of(class)`: a class's bytes.
    /// Returns the number of blocks released.
    pub(crate) fn drain(&self, bytes_of: impl Fn(usize) -> u64, release: impl FnMut(usize, usize)) -> usize {
        self.drain_cores(0..self.cores.len(), bytes_of, release)
    }

    /// [`BlockCaches::drain`] of core `core`'s cache alone.
    pub(crate) fn drain_core(
        &self,
        core: usize,
        bytes_of: impl Fn(usize) -> u64,
        release: impl FnMut(usize, usize),
    ) -> usize {
        self.drain_cores(core..core + 1, bytes_of, release)
    }

    fn drain_cores(
        &self,
        cores: std::ops::Range<usize>,
        bytes_of: impl Fn(usize) -> u64,
        mut release: impl FnMut(usize, usize),
    ) -> usize {
        let mut released = 0;
        for cache in &self.cores[cores] {
            if cache.held.bytes.load(Ordering::Relaxed) == 0 {
                continue;
            }
            for (i, slot) in cache.slots.iter().enumerate() {
                if slot.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                let value = slot.swap(0, Ordering::AcqRel);
                if value == 0 {
                    continue;
                }
                let offset = (value - 1) as usize;
                let class = i / SLOTS;
                self.turn_state(offset, CACHED, BUSY);
                cache.held.bytes.fetch_sub(bytes_of(class), Ordering::Relaxed);
                release(offset, class);
                self.settle(offset);
                released += 1;
            }
        }
        released
    }

    /// Every cached block now, as `(offset, class)` (relaxed loads: a block taken or cached
    /// meanwhile may be missing or listed; for statistics and snapshots).
    pub(crate) fn cached(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for cache in self.cores.iter().filter(|c| c.held.bytes.load(Ordering::Relaxed) != 0) {
            for (i, slot) in cache.slots.iter().enumerate() {
                let value = slot.load(Ordering::Relaxed);
                if value != 0 {
                    out.push(((value - 1) as usize, i / SLOTS));
                }
            }
        }
        out
    }

    /// What is inconsistent in the caches of a paused pool (no free, take or drain in flight),
    /// given every cached block's bytes by class: a core's byte count against its blocks, a
    /// cached block whose state is not `CACHED`, a state `CACHED` without its block, a state
    /// `BUSY`. Only the states of the arena's first `opened_bytes` are read: a block is cached
    /// in an opened chunk, and no state past the last one was ever written.
    pub(crate) fn findings(&self, bytes_of: impl Fn(usize) -> u64, opened_bytes: usize) -> Vec<String> {
        let mut findings = Vec::new();
        let mut cached_states = 0usize;
        for (core, cache) in self.cores.iter().enumerate() {
            let mut bytes = 0;
            for (i, slot) in cache.slots.iter().enumerate() {
                let value = slot.load(Ordering::Acquire);
                if value == 0 {
                    continue;
                }
                let offset = (value - 1) as usize;
                bytes += bytes_of(i / SLOTS);
                let (word, shift) = self.state_of(offset);
                let state = (word.load(Ordering::Acquire) >> shift) & STATE_MASK;
                if state != CACHED {
                    findings.push(format!("cached block at {offset} (core {core}): granule state {state}"));
                }
                cached_states += 1;
            }
            let counted = cache.held.bytes.load(Ordering::Acquire);
            if counted != bytes {
                findings.push(format!("core {core}'s cache of freed blocks counts {counted} bytes, holds {bytes}"));
            }
        }
        // Every granule of the arena has a state: on a large arena, mostly zero words, read a
        // word at a time (an arena of 8 TiB has a thousand million granules).
        let (mut cached, mut busy) = (0usize, 0usize);
        let words = (opened_bytes >> self.granule_shift).div_ceil(PER_WORD).min(self.states.len());
        for word in self.states.iter().take(words) {
            let w = word.load(Ordering::Acquire);
            if w != 0 {
                let (cached_in, busy_in) = count_states(w);
                cached += cached_in;
                busy += busy_in;
            }
        }
        if cached != cached_states {
            findings.push(format!("{cached} granules say cached, the caches hold {cached_states} blocks"));
        }
        if busy != 0 {
            findings.push(format!("{busy} granule(s) stay busy with no release in flight"));
        }
        findings
    }

    /// Bytes core `core`'s cache holds now (of blocks in `core`'s chunks).
    pub(crate) fn cached_bytes_of(&self, core: usize) -> u64 {
        self.cores[core].held.bytes.load(Ordering::Relaxed)
    }

    /// Bytes the caches hold now (a sum of relaxed loads).
    #[cfg(test)]
    pub(crate) fn cached_bytes(&self) -> u64 {
        self.cores.iter().map(|c| c.held.bytes.load(Ordering::Relaxed)).sum()
    }

    /// Bytes of host memory the granule states use.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.states.resident_bytes()
            + self.cores.iter().map(|c| c.slots.len() * std::mem::size_of::<AtomicU64>()).sum::<usize>()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The word-at-a-time count of states matches one state at a time, on random words.
    #[test]
    fn states_are_counted_a_word_at_a_time_as_one_at_a_time() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (mut cached, mut busy) = (0, 0);
            for k in 0..PER_WORD {
                match (x >> (2 * k)) & STATE_MASK {
                    CACHED => cached += 1,
                    BUSY => busy += 1,
                    _ => {}
                }
            }
            assert_eq!(count_states(x), (cached, busy), "{x:#x}");
        }
        assert_eq!(count_states(u64::MAX), (0, 0), "state 3 is neither");
        assert_eq!(count_states(0x5555_5555_5555_5555), (32, 0));
    }

    #[test]
    fn a_block_is_taken_once_and_a_second_free_of_a_cached_block_is_refused() {
        let c = BlockCaches::new(2, 4, 1 << 20, 4096, 1 << 20).unwrap();
        assert_eq!(c.put(1, 2, 8192, 8192, true, || true), Put::Kept);
        assert_eq!(c.put(1, 2, 8192, 8192, true, || true), Put::Twice);
        assert_eq!(c.cached_bytes(), 8192);
        assert_eq!(c.take(0, 2, 8192), None, "another core's cache");
        assert_eq!(c.take(1, 1, 8192), None, "another class");
        assert_eq!(c.take(1, 2, 8192), Some(8192));
        assert_eq!(c.take(1, 2, 8192), None);
        assert_eq!(c.cached_bytes(), 0);
        // Taken, the block is live again: its next free may cache it.
        assert_eq!(c.put(1, 2, 8192, 8192, true, || true), Put::Kept);
    }

    /// A core keeps its share of the budget, and past it what the other caches leave of the
    /// budget when it looks (every [`RECHECK`]th put refused by its limit).
    #[test]
    fn a_core_alone_uses_the_whole_budget_and_past_its_share_a_core_borrows_only_what_is_left() {
        const BANK: u64 = 4096;
        // Two cores, a budget of 4 blocks: a share of 2 each.
        let c = BlockCaches::new(2, 4, 1 << 20, 4096, 4 * BANK).unwrap();
        // The put until one is kept, at most `RECHECK` of them (each refused one settles).
        let put_within_a_recheck = |core: usize, offset: usize| {
            (0..RECHECK).any(|_| match c.put(core, 1, offset, BANK, true, || true) {
                Put::Kept => true,
                refused => {
                    assert_eq!(refused, Put::ReleaseThenSettle);
                    c.settle(offset);
                    false
                }
            })
        };
        for i in 0..4 {
            assert!(put_within_a_recheck(0, i * 4096), "block {i}: core 1 caches nothing");
        }
        assert!(!put_within_a_recheck(0, 4 * 4096), "the budget is used");
        assert_eq!(c.put(1, 1, 8 * 4096, BANK, true, || true), Put::Kept, "core 1 within its share");
        assert_eq!(c.put(1, 1, 9 * 4096, BANK, true, || true), Put::Kept, "core 1 within its share");
        assert!(!put_within_a_recheck(1, 10 * 4096), "past its share: none left");
        assert_eq!(c.cached_bytes_of(0) + c.cached_bytes_of(1), 6 * BANK);
        // Core 0 takes three of its blocks back: core 1 may borrow one block's room now.
        for _ in 0..3 {
            assert!(c.take(0, 1, BANK).is_some());
        }
        assert!(put_within_a_recheck(1, 10 * 4096), "borrowed: 4 blocks in all");
        assert!(!put_within_a_recheck(1, 11 * 4096), "the budget again");
        assert_eq!(c.cached_bytes(), 4 * BANK);
    }

    #[test]
    fn a_full_cache_and_a_pool_without_room_release_with_the_state_held() {
        let c = BlockCaches::new(1, 1, 1 << 20, 4096, 3 * 4096).unwrap();
        assert_eq!(c.put(0, 0, 0, 4096, false, || true), Put::ReleaseThenSettle, "no room");
        assert_eq!(c.put(0, 0, 0, 4096, true, || true), Put::Release, "busy: the tree decides");
        c.settle(0);
        for i in 0..3 {
            assert_eq!(c.put(0, 0, i * 4096, 4096, true, || true), Put::Kept);
        }
        assert_eq!(c.put(0, 0, 3 * 4096, 4096, true, || true), Put::ReleaseThenSettle, "over the byte limit");
        c.settle(3 * 4096);
        let mut drained = Vec::new();
        assert_eq!(c.drain(|_| 4096, |offset, class| drained.push((offset, class))), 3);
        drained.sort_unstable();
        assert_eq!(drained, vec![(0, 0), (4096, 0), (8192, 0)]);
        assert_eq!(c.cached_bytes(), 0);
        for i in 0..4 {
            assert_eq!(c.claim_state(i * 4096, NONE), Ok(()), "every state is NONE after the drain");
        }
    }

    #[test]
    fn every_slot_of_a_class_fills_before_a_free_is_released() {
        let c = BlockCaches::new(1, 2, 1 << 24, 4096, u64::MAX).unwrap();
        for i in 0..SLOTS {
            assert_eq!(c.put(0, 1, i * 4096, 4096, true, || true), Put::Kept);
        }
        assert_eq!(c.put(0, 1, SLOTS * 4096, 4096, true, || true), Put::ReleaseThenSettle);
        c.settle(SLOTS * 4096);
        assert_eq!(c.put(0, 0, SLOTS * 4096, 4096, true, || true), Put::Kept, "the other class has room");
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! The tree is one block's allocated bit: a release clears it with a CAS, which fails when
    //! it was clear (the block freed already). Every model ends by checking that the block is in
    //! exactly one place: allocated to a taker, in a cache slot (allocated in the tree, state
    //! `CACHED`), or free in the tree (state `NONE`). One model checks the budget shared by two
    //! cores.
    use super::*;
    use loom::sync::Arc;
    use loom::thread;
    use std::sync::atomic::AtomicBool as StdBool;

    const AT: usize = 4096;

    /// A free through the cache protocol: `Ok(true)` kept, `Ok(false)` released, `Err` refused.
    fn free(c: &BlockCaches, tree: &AtomicU64, room: bool) -> std::result::Result<bool, ()> {
        if tree.load(Ordering::Acquire) == 0 {
            return Err(());
        }
        match c.put(0, 0, AT, 4096, room, || tree.load(Ordering::Acquire) == 1) {
            Put::Kept => Ok(true),
            Put::Twice => Err(()),
            Put::Release => release(tree).map(|_| false),
            Put::ReleaseThenSettle => {
                let released = release(tree);
                c.settle(AT);
                released.map(|_| false)
            }
        }
    }

    fn release(tree: &AtomicU64) -> std::result::Result<(), ()> {
        tree.compare_exchange(1, 0, Ordering::AcqRel, Ordering::Acquire).map(|_| ()).map_err(|_| ())
    }

    fn state(c: &BlockCaches) -> u64 {
        let (word, shift) = c.state_of(AT);
        (word.load(Ordering::Acquire) >> shift) & STATE_MASK
    }

    fn cached(c: &BlockCaches) -> usize {
        c.class_slots(0, 0).iter().filter(|s| s.load(Ordering::Acquire) != 0).count()
    }

    #[test]
    fn of_two_racing_frees_of_one_block_exactly_one_succeeds() {
        // Each free with or without room to cache (a pool's gate may differ between them).
        for (my_room, their_room) in [(true, true), (false, false), (true, false), (false, true)] {
            loom::model(move || {
                let c = Arc::new(BlockCaches::new(1, 1, 1 << 16, 4096, 1 << 16).unwrap());
                let tree = Arc::new(AtomicU64::new(1));
                let (c2, tree2) = (c.clone(), tree.clone());
                let other = thread::spawn(move || free(&c2, &tree2, their_room));
                let mine = free(&c, &tree, my_room);
                let theirs = other.join().unwrap();
                assert!(mine.is_ok() ^ theirs.is_ok(), "{mine:?} {theirs:?}");
                let kept = mine == Ok(true) || theirs == Ok(true);
                assert_eq!(cached(&c), usize::from(kept));
                assert_eq!(tree.load(Ordering::Acquire), u64::from(kept));
                assert_eq!(state(&c), if kept { CACHED } else { NONE });
            });
        }
    }

    /// A free by `core` of the block at `offset` (allocated while `tree` is 1): `true` kept,
    /// `false` released to the tree.
    fn free_of(c: &BlockCaches, core: usize, offset: usize, tree: &AtomicU64) -> bool {
        match c.put(core, 0, offset, 4096, true, || tree.load(Ordering::Acquire) == 1) {
            Put::Kept => true,
            Put::ReleaseThenSettle => {
                release(tree).expect("the free owns the block");
                c.settle(offset);
                false
            }
            other => panic!("a single free of a live block: {other:?}"),
        }
    }

    #[test]
    fn cores_that_pass_their_share_of_the_budget_while_another_frees_lose_no_block() {
        // Two cores, a budget of two blocks (a share of one each). Core 0 holds one block
        // already; its next free is past its share (it looks at core 1's cache), while core 1
        // frees a block of its own within its share. Each block ends in exactly one place and
        // the byte counts match the blocks kept; together at most the budget and a block.
        loom::model(|| {
            let c = Arc::new(BlockCaches::new(2, 1, 1 << 16, 4096, 2 * 4096).unwrap());
            let trees: Arc<[AtomicU64; 3]> = Arc::new([AtomicU64::new(1), AtomicU64::new(1), AtomicU64::new(1)]);
            assert!(free_of(&c, 0, 0, &trees[0]), "core 0 within its share");
            let (c2, trees2) = (c.clone(), trees.clone());
            let other = thread::spawn(move || free_of(&c2, 1, 2 * 4096, &trees2[2]));
            let mine = free_of(&c, 0, 4096, &trees[1]);
            let theirs = other.join().unwrap();
            assert!(theirs, "core 1 within its share");
            for (i, tree) in trees.iter().enumerate() {
                let (word, shift) = c.state_of(i * 4096);
                let state = (word.load(Ordering::Acquire) >> shift) & STATE_MASK;
                let kept = tree.load(Ordering::Acquire) == 1;
                assert_eq!(state, if kept { CACHED } else { NONE }, "block {i}");
            }
            assert_eq!(trees[1].load(Ordering::Acquire) == 1, mine);
            let kept = 2 + usize::from(mine);
            assert_eq!(c.cached().len(), kept);
            assert_eq!(c.cached_bytes(), kept as u64 * 4096);
            assert!(c.cached_bytes() <= 3 * 4096);
        });
    }

    #[test]
    fn a_drain_racing_a_second_free_of_a_cached_block_releases_it_once() {
        loom::model(|| {
            let c = Arc::new(BlockCaches::new(1, 1, 1 << 16, 4096, 1 << 16).unwrap());
            let tree = Arc::new(AtomicU64::new(1));
            assert_eq!(free(&c, &tree, true), Ok(true));
            let (c2, tree2) = (c.clone(), tree.clone());
            let failed = Arc::new(StdBool::new(false));
            let failed2 = failed.clone();
            let drainer = thread::spawn(move || {
                c2.drain(
                    |_| 4096,
                    |_, _| {
                        if release(&tree2).is_err() {
                            failed2.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    },
                )
            });
            // A buggy second free: refused, or (once the drain made it BUSY) it races the
            // drain's release in the tree, and exactly one of the two releases wins.
            let second = free(&c, &tree, true);
            let drained = drainer.join().unwrap();
            assert_eq!(drained, 1);
            let drain_failed = failed.load(std::sync::atomic::Ordering::Relaxed);
            assert_ne!(second, Ok(true), "a second free never caches the block again");
            assert_eq!(second == Ok(false), drain_failed, "exactly one of the two releases wins");
            assert_eq!(tree.load(Ordering::Acquire), 0, "free in the tree");
            assert_eq!(cached(&c), 0);
            assert_eq!(state(&c), NONE);
        });
    }

    #[test]
    fn a_taken_block_is_live_again_for_its_new_owner() {
        // A take racing a drain: the block goes to exactly one of them; the taker's later free
        // finds the state NONE and may cache it again.
        loom::model(|| {
            let c = Arc::new(BlockCaches::new(1, 1, 1 << 16, 4096, 1 << 16).unwrap());
            let tree = Arc::new(AtomicU64::new(1));
            assert_eq!(free(&c, &tree, true), Ok(true));
            let (c2, tree2) = (c.clone(), tree.clone());
            let drainer =
                thread::spawn(move || c2.drain(|_| 4096, |_, _| release(&tree2).expect("the drain owns the block")));
            let taken = c.take(0, 0, 4096);
            let drained = drainer.join().unwrap();
            assert_eq!(usize::from(taken.is_some()) + drained, 1);
            if taken.is_some() {
                assert_eq!(tree.load(Ordering::Acquire), 1);
                assert_eq!(free(&c, &tree, true), Ok(true), "the new owner's free");
            } else {
                assert_eq!(tree.load(Ordering::Acquire), 0);
            }
            assert_eq!(c.cached_bytes(), if taken.is_some() { 4096 } else { 0 });
        });
    }
}

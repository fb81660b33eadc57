//! The generation-checked handle table.
//!
//! A [`Handle`] is a slot index plus a generation (and the id of its pool). The slot holds the
//! block's current offset, so compaction moves a block by updating its slot and every handle
//! stays valid. Freeing bumps the slot's generation: a stale handle no longer matches and is
//! refused instead of touching whichever block reuses the slot.
//!
//! Slot state word: `generation (bits 0..32) | LIVE (bit 32) | MOVING (bit 33) | pins (34..64)`.
//!
//! Free slots sit on per-core Treiber stacks whose heads carry a tag that every successful CAS
//! increments, so the classic ABA schedule (pop A reads next = B; others pop A, pop B, push A;
//! the first pop's CAS would install the freed B) fails on the tag. Slots live in segments that
//! are allocated on first use and never freed while the table lives, so reading a slot's `next`
//! after someone else popped it is harmless (the CAS then fails).

use crate::error::{Error, HandleFault, Result};
use crate::sync::{AtomicU32, AtomicU64, CachePadded, Ordering};
#[cfg(loom)]
use loom::sync::atomic::AtomicPtr;
#[cfg(not(loom))]
use std::sync::atomic::AtomicPtr;

const GENERATION_MASK: u64 = 0xFFFF_FFFF;
const LIVE: u64 = 1 << 32;
const MOVING: u64 = 1 << 33;
const PIN_SHIFT: u32 = 34;
const PIN_ONE: u64 = 1 << PIN_SHIFT;
/// At most 2^30 - 1 pins per block.
const MAX_PINS: u64 = (1 << 30) - 1;

const SEGMENT_SHIFT: u32 = 12;
/// Slots per segment.
const SEGMENT: usize = 1 << SEGMENT_SHIFT;
const NIL: u32 = u32::MAX;

/// A reference to a block that survives moves and detects reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    pool: u32,
    slot: u32,
    generation: u32,
}

impl Handle {
    /// The id of the pool that made it.
    pub fn pool_id(self) -> u32 {
        self.pool
    }

    /// The slot index.
    pub fn slot(self) -> u32 {
        self.slot
    }

    /// The generation of the slot when the block was allocated.
    pub fn generation(self) -> u32 {
        self.generation
    }

    /// Pack into one integer (for foreign callers that store handles as numbers).
    pub fn to_bits(self) -> u128 {
        (self.pool as u128) << 64 | (self.slot as u128) << 32 | self.generation as u128
    }

    /// The inverse of [`Handle::to_bits`]. Any bits make a handle; the pool validates it.
    pub fn from_bits(bits: u128) -> Handle {
        Handle {
            pool: (bits >> 64) as u32,
            slot: (bits >> 32) as u32,
            generation: bits as u32,
        }
    }
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

#[derive(Default)]
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
    segments: Box<[AtomicPtr<Slot>]>,
    max_slots: u32,
    fresh: AtomicU32,
    /// Per core: `tag (32..64) | slot + 1 (0..32)`, 0 meaning empty.
    heads: Box<[CachePadded<AtomicU64>]>,
}

// SAFETY: segments are heap arrays of atomics, shared by design; raw pointers are only
// dereferenced while the table lives.
unsafe impl Send for HandleTable {}
// SAFETY: as above: every access goes through atomics.
unsafe impl Sync for HandleTable {}

impl Drop for HandleTable {
    fn drop(&mut self) {
        for cell in self.segments.iter() {
            let ptr = cell.load(Ordering::Acquire);
            if !ptr.is_null() {
                // SAFETY: installed by `segment` from a `Box<[Slot]>` of SEGMENT slots; dropped
                // once, here.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, SEGMENT)) });
            }
        }
    }
}

impl HandleTable {
    /// A table for up to `max_slots` live blocks at once, with `cores` free lists.
    pub(crate) fn new(pool: u32, max_slots: usize, cores: usize) -> HandleTable {
        let max_slots = max_slots.clamp(1, (NIL - 1) as usize) as u32;
        let segments = (max_slots as usize).div_ceil(SEGMENT);
        HandleTable {
            pool,
            segments: (0..segments)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            max_slots,
            fresh: AtomicU32::new(0),
            heads: (0..cores.max(1))
                .map(|_| CachePadded(AtomicU64::new(0)))
                .collect(),
        }
    }

    fn segment(&self, index: usize) -> &[Slot] {
        let cell = &self.segments[index];
        let mut ptr = cell.load(Ordering::Acquire);
        if ptr.is_null() {
            let fresh: Box<[Slot]> = (0..SEGMENT).map(|_| Slot::default()).collect();
            let fresh = Box::into_raw(fresh) as *mut Slot;
            match cell.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => ptr = fresh,
                Err(winner) => {
                    // SAFETY: `fresh` came from Box::into_raw above and lost the race: ours to drop.
                    drop(unsafe {
                        Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, SEGMENT))
                    });
                    ptr = winner;
                }
            }
        }
        // SAFETY: non-null segment pointers point to SEGMENT slots that live as long as `self`.
        unsafe { std::slice::from_raw_parts(ptr, SEGMENT) }
    }

    fn slot(&self, index: u32) -> &Slot {
        &self.segment(index as usize >> SEGMENT_SHIFT)[index as usize & (SEGMENT - 1)]
    }

    /// A slot that was handed out at least once, or `None` for indices never used.
    fn existing_slot(&self, index: u32) -> Option<&Slot> {
        if index >= self.fresh.load(Ordering::Acquire).min(self.max_slots) {
            return None;
        }
        let ptr = self
            .segments
            .get(index as usize >> SEGMENT_SHIFT)?
            .load(Ordering::Acquire);
        if ptr.is_null() {
            return None;
        }
        // SAFETY: a non-null segment holds SEGMENT slots and lives as long as `self`.
        Some(unsafe { &*ptr.add(index as usize & (SEGMENT - 1)) })
    }

    fn pop(&self, head: &AtomicU64) -> Option<u32> {
        let mut current = head.load(Ordering::Acquire);
        loop {
            let index = current as u32;
            if index == 0 {
                return None;
            }
            let slot = index - 1;
            let next = self.slot(slot).next.load(Ordering::Acquire);
            let tag = (current >> 32).wrapping_add(1);
            let new = tag << 32 | next.wrapping_add(1) as u64;
            match head.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(slot),
                Err(seen) => current = seen,
            }
        }
    }

    fn push(&self, head: &AtomicU64, slot: u32) {
        let mut current = head.load(Ordering::Acquire);
        loop {
            let top = (current as u32).wrapping_sub(1); // NIL when empty
            self.slot(slot).next.store(top, Ordering::Relaxed);
            let tag = (current >> 32).wrapping_add(1);
            let new = tag << 32 | (slot + 1) as u64;
            match head.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    fn take_slot(&self, core: usize) -> Option<u32> {
        let cores = self.heads.len();
        if let Some(slot) = self.pop(&self.heads[core % cores]) {
            return Some(slot);
        }
        let fresh = self.fresh.fetch_add(1, Ordering::AcqRel);
        if fresh < self.max_slots {
            return Some(fresh);
        }
        self.fresh.fetch_sub(1, Ordering::AcqRel);
        (1..cores).find_map(|i| self.pop(&self.heads[(core + i) % cores]))
    }

    /// Record a new block; `Err` only when the table is full.
    pub(crate) fn insert(
        &self,
        core: usize,
        offset: usize,
        size: usize,
        align_log2: u8,
        tag: u32,
    ) -> Result<Handle> {
        let Some(index) = self.take_slot(core) else {
            return Err(Error::OutOfMemory {
                requested: size,
                bytes_free: 0,
                largest_free_block: 0,
            });
        };
        let slot = self.slot(index);
        let generation = slot.state.load(Ordering::Acquire) & GENERATION_MASK;
        slot.offset.store(offset as u64, Ordering::Relaxed);
        slot.size.store(size as u64, Ordering::Relaxed);
        slot.info
            .store(pack_info(tag, core as u16, align_log2), Ordering::Relaxed);
        slot.state.store(generation | LIVE, Ordering::Release);
        Ok(Handle {
            pool: self.pool,
            slot: index,
            generation: generation as u32,
        })
    }

    fn live_slot(&self, handle: Handle) -> Result<&Slot> {
        if handle.pool != self.pool {
            return Err(Error::InvalidHandle(HandleFault::Foreign));
        }
        self.existing_slot(handle.slot)
            .ok_or(Error::InvalidHandle(HandleFault::Unknown))
    }

    fn matches(state: u64, handle: Handle) -> bool {
        state & LIVE != 0 && state & GENERATION_MASK == handle.generation as u64
    }

    fn read_info(slot: &Slot, state: u64) -> SlotInfo {
        let info = slot.info.load(Ordering::Acquire);
        SlotInfo {
            offset: slot.offset.load(Ordering::Acquire) as usize,
            size: slot.size.load(Ordering::Acquire) as usize,
            tag: info as u32,
            core: (info >> 32) as u16,
            align_log2: (info >> 48) as u8,
            pins: (state >> PIN_SHIFT) as u32,
        }
    }

    /// The block behind a live handle.
    pub(crate) fn get(&self, handle: Handle) -> Result<SlotInfo> {
        let slot = self.live_slot(handle)?;
        loop {
            let state = slot.state.load(Ordering::Acquire);
            if !Self::matches(state, handle) {
                return Err(Error::InvalidHandle(HandleFault::Freed));
            }
            let info = Self::read_info(slot, state);
            // Seqlock-style: the slot must not have been freed and reused while we read it.
            let identity = !(MOVING | (MAX_PINS << PIN_SHIFT));
            if slot.state.load(Ordering::Acquire) & identity == state & identity {
                return Ok(info);
            }
        }
    }

    /// Retire a live, unpinned handle: its generation moves on. Returns what it recorded.
    pub(crate) fn remove(&self, handle: Handle) -> Result<SlotInfo> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Error::DoubleFree);
            }
            let pins = (state >> PIN_SHIFT) as u32;
            if pins > 0 {
                return Err(Error::Pinned { pins });
            }
            if state & MOVING != 0 {
                crate::sync::spin_hint();
                state = slot.state.load(Ordering::Acquire);
                continue;
            }
            let next_generation = (state + 1) & GENERATION_MASK;
            match slot.state.compare_exchange_weak(
                state,
                next_generation,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // The slot is ours until `recycle`: its fields cannot change under us.
                Ok(_) => return Ok(Self::read_info(slot, state)),
                Err(seen) => state = seen,
            }
        }
    }

    /// Put a removed slot on `core`'s free list.
    pub(crate) fn recycle(&self, core: usize, handle: Handle) {
        self.push(&self.heads[core % self.heads.len()], handle.slot);
    }

    /// Add a pin (a buffer view or an explicit pin).
    pub(crate) fn pin(&self, handle: Handle) -> Result<u32> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Error::InvalidHandle(HandleFault::Freed));
            }
            if state & MOVING != 0 {
                crate::sync::spin_hint();
                state = slot.state.load(Ordering::Acquire);
                continue;
            }
            let pins = state >> PIN_SHIFT;
            if pins >= MAX_PINS {
                return Err(Error::Pinned { pins: pins as u32 });
            }
            match slot.state.compare_exchange_weak(
                state,
                state + PIN_ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(pins as u32 + 1),
                Err(seen) => state = seen,
            }
        }
    }

    /// Remove a pin; `Err` if the handle is not live or has no pins.
    pub(crate) fn unpin(&self, handle: Handle) -> Result<u32> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Error::InvalidHandle(HandleFault::Freed));
            }
            let pins = state >> PIN_SHIFT;
            if pins == 0 {
                return Err(Error::InvalidBlock {
                    offset: slot.offset.load(Ordering::Relaxed) as usize,
                    size: slot.size.load(Ordering::Relaxed) as usize,
                    reason: "unpin without a matching pin",
                });
            }
            match slot.state.compare_exchange_weak(
                state,
                state - PIN_ONE,
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
        let fresh = self.fresh.load(Ordering::Acquire).min(self.max_slots);
        for index in 0..fresh {
            let Some(slot) = self.existing_slot(index) else {
                continue;
            };
            let state = slot.state.load(Ordering::Acquire);
            if state & LIVE == 0 {
                continue;
            }
            let handle = Handle {
                pool: self.pool,
                slot: index,
                generation: state as u32,
            };
            if let Ok(info) = self.get(handle) {
                f(handle, info);
            }
        }
    }

    /// Slots on free lists plus never-used ones: a check that none got lost.
    pub(crate) fn count_free_listed(&self) -> usize {
        let mut count = 0;
        for head in self.heads.iter() {
            let mut at = head.load(Ordering::Acquire) as u32;
            while at != 0 {
                count += 1;
                at = self
                    .slot(at - 1)
                    .next
                    .load(Ordering::Acquire)
                    .wrapping_add(1);
                if count > self.max_slots as usize {
                    break; // a cycle: reported by the caller as a mismatch
                }
            }
        }
        count
    }

    /// Slots ever handed out.
    pub(crate) fn slots_used(&self) -> usize {
        self.fresh.load(Ordering::Acquire).min(self.max_slots) as usize
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn generations_refuse_stale_handles() {
        let table = HandleTable::new(9, 100, 2);
        let a = table.insert(0, 4096, 100, 6, 3).unwrap();
        let info = table.get(a).unwrap();
        assert_eq!(
            (info.offset, info.size, info.tag, info.align_log2),
            (4096, 100, 3, 6)
        );
        table.remove(a).unwrap();
        assert_eq!(table.remove(a), Err(Error::DoubleFree));
        assert_eq!(table.get(a), Err(Error::InvalidHandle(HandleFault::Freed)));
        table.recycle(0, a);
        let b = table.insert(0, 8192, 10, 6, 0).unwrap();
        assert_eq!(b.slot(), a.slot(), "slot reused");
        assert_ne!(b.generation(), a.generation());
        assert_eq!(table.get(a), Err(Error::InvalidHandle(HandleFault::Freed)));
        assert_eq!(table.remove(a), Err(Error::DoubleFree));
        assert_eq!(table.get(b).unwrap().offset, 8192);
        let foreign = Handle { pool: 10, ..b };
        assert_eq!(
            table.get(foreign),
            Err(Error::InvalidHandle(HandleFault::Foreign))
        );
        let unknown = Handle { slot: 99, ..b };
        assert_eq!(
            table.get(unknown),
            Err(Error::InvalidHandle(HandleFault::Unknown))
        );
        assert_eq!(Handle::from_bits(b.to_bits()), b);
    }

    #[test]
    fn pins_block_removal() {
        let table = HandleTable::new(1, 10, 1);
        let h = table.insert(0, 0, 64, 6, 0).unwrap();
        assert_eq!(table.pin(h), Ok(1));
        assert_eq!(table.pin(h), Ok(2));
        assert_eq!(table.remove(h), Err(Error::Pinned { pins: 2 }));
        assert_eq!(table.unpin(h), Ok(1));
        assert_eq!(table.unpin(h), Ok(0));
        assert!(table.unpin(h).is_err());
        table.remove(h).unwrap();
        assert!(table.pin(h).is_err());
    }

    #[test]
    fn capacity_is_bounded() {
        let table = HandleTable::new(1, 3, 2);
        let hs: Vec<_> = (0..3)
            .map(|i| table.insert(i % 2, i, 1, 0, 0).unwrap())
            .collect();
        assert!(table.insert(0, 9, 1, 0, 0).is_err());
        table.remove(hs[1]).unwrap();
        table.recycle(1, hs[1]);
        // Core 0's list is empty and nothing is fresh: it steals core 1's slot.
        assert!(table.insert(0, 9, 1, 0, 0).is_ok());
    }

    #[test]
    fn concurrent_insert_remove_keeps_every_slot() {
        let table = HandleTable::new(1, 1 << 16, 2);
        std::thread::scope(|s| {
            for t in 0..4usize {
                let table = &table;
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..20_000usize {
                        if i % 3 == 2 {
                            if let Some(h) = held.pop() {
                                table.remove(h).unwrap();
                                table.recycle(t, h);
                            }
                        } else {
                            let h = table.insert(t, i * 4 + t, 1, 0, t as u32).unwrap();
                            assert_eq!(table.get(h).unwrap().offset, i * 4 + t);
                            held.push(h);
                        }
                    }
                    for h in held {
                        table.remove(h).unwrap();
                        table.recycle(t, h);
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

    /// The ABA schedule: T1 pops while T2 pops twice and pushes the first slot back. Every slot
    /// must come out exactly once, and the list must stay a list.
    #[test]
    fn free_list_survives_aba() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 8, 1));
            // Slots 0, 1, 2 on core 0's list (2 on top).
            let hs: Vec<_> = (0..3)
                .map(|i| table.insert(0, i, 1, 0, 0).unwrap())
                .collect();
            for &h in &hs {
                table.remove(h).unwrap();
                table.recycle(0, h);
            }
            let t2 = table.clone();
            let other = thread::spawn(move || {
                let a = t2.pop(&t2.heads[0]).unwrap();
                let b = t2.pop(&t2.heads[0]).unwrap();
                t2.push(&t2.heads[0], a);
                (a, b)
            });
            let mine = table.pop(&table.heads[0]).unwrap();
            let (_, b) = other.join().unwrap();
            let mut rest = Vec::new();
            while let Some(s) = table.pop(&table.heads[0]) {
                rest.push(s);
            }
            let mut all = vec![mine, b];
            all.extend(rest);
            all.sort();
            assert_eq!(all, vec![0, 1, 2], "a slot was lost or handed out twice");
        });
    }

    /// Two threads free the same handle: exactly one succeeds.
    #[test]
    fn racing_double_free_has_one_winner() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 4, 1));
            let h = table.insert(0, 0, 1, 0, 0).unwrap();
            let t2 = table.clone();
            let other = thread::spawn(move || t2.remove(h).is_ok());
            let mine = table.remove(h).is_ok();
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs);
        });
    }
}

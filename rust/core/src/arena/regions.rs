//! The arena's regions: the ranges of chunks that have memory behind them. A pool that cannot
//! grow has one region, the whole arena. A pool that can grow (`PoolConfig::max_capacity`)
//! starts with one region of `capacity` bytes at offset 0 and adds regions when an allocation
//! finds no room (`pool/growth.rs`); `trim` gives back regions that are entirely free, except
//! the first.
//!
//! Every chunk outside the regions is *absent* (`global.rs`): taken in the bitmap, so nothing
//! claims it. Two regions are always at least one absent chunk apart, so no run, and hence no
//! block, spans two regions; offsets stay unique because a region only ever uses absent
//! offsets. The offset space is twice `max_capacity` (`PoolConfig::offset_space`), enough for
//! regions of one growth step each, a chunk apart, up to the limit. Regions given back leave
//! holes, each two chunks longer than the region that was there; when no hole holds a growth
//! with an absent chunk on both sides, the growth *joins* a region that an earlier growth
//! added: it goes right before or after it (or fills the whole gap between two such regions),
//! and they are one region from then on (a block may span the parts; the runtime maps each
//! part at `base_address + offset`, so their addresses are contiguous). Without that, a pool
//! that grew a chunk at a time and gave back every other region had holes of three chunks
//! only, and refused every request of two chunks or more for good, far below its limit. A
//! joined region goes back as a whole, with one `on_trim` call per growth it is made of (its
//! *parts*), as `on_grow` saw them. Nothing joins the first region, which is never given back.
//! Regions that live blocks keep can still split the offset space so that no place holds a
//! growth that the limit allows: the failed allocation's error says so
//! (`Error::OutOfMemory::unplaced_growth`).
//!
//! One grower or trimmer at a time holds `changing` for the whole change (growth is rare and
//! slow, and never on the allocation's fast path); it may call out to the runtime meanwhile.
//! The table itself is behind a second mutex, held only for a quick read or write, so readers
//! (stats, snapshots, `check()`) never wait for a runtime's callback.

use std::sync::{Mutex, MutexGuard};

use super::geometry::Geometry;
use crate::util::sync::{AtomicU64, Ordering};

/// A range of chunks with memory behind it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Region {
    /// Offset of its first byte.
    pub offset: usize,
    /// Its bytes.
    pub bytes: usize,
}

/// The regions of an arena, as chunk ranges `(start, len)` sorted by start.
pub(crate) struct Regions {
    table: Mutex<Vec<(usize, usize)>>,
    /// The growths that the regions are made of, as `on_grow` saw them (`(start, len)` in
    /// chunks, by start): a region joined by later growths has several. Changed only under
    /// `changing`.
    parts: Mutex<Vec<(usize, usize)>>,
    changing: Mutex<()>,
    /// Most chunks the regions may hold together (`max_capacity` in whole chunks).
    limit_chunks: usize,
    /// Least chunks one growth adds.
    step_chunks: usize,
    /// Growths so far (also the table's version: a grower that finds it changed retries).
    grow_events: AtomicU64,
}

/// A way to place `len` chunks aligned to `align` among the regions of a table, in an arena of
/// `chunks` chunks: `(table, len, align, chunks)`.
type Placer = fn(&[(usize, usize)], usize, usize, usize) -> Option<Placement>;

/// Where a new region goes: its first chunk and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl Regions {
    /// One region of `present` chunks at chunk 0; at most `limit_chunks` chunks in all, at least
    /// `step_chunks` per growth.
    pub(crate) fn new(present: usize, limit_chunks: usize, step_chunks: usize) -> Regions {
        Regions {
            table: Mutex::new(vec![(0, present)]),
            parts: Mutex::new(vec![(0, present)]),
            changing: Mutex::new(()),
            limit_chunks: limit_chunks.max(present),
            step_chunks: step_chunks.max(1),
            grow_events: AtomicU64::new(0),
        }
    }

    /// The table, for a quick read or write.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<(usize, usize)>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The right to change the regions (held across a growth or a trim).
    pub(crate) fn change(&self) -> MutexGuard<'_, ()> {
        self.changing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Chunks the regions hold now.
    pub(crate) fn present_chunks(&self) -> usize {
        self.lock().iter().map(|&(_, len)| len).sum()
    }

    /// Whether `chunk` lies in a region.
    pub(crate) fn contains(table: &[(usize, usize)], chunk: usize) -> bool {
        Self::holding(table, chunk).is_some()
    }

    /// The region of `table` (sorted by start) that holds `chunk`, if any: one binary search.
    fn holding(table: &[(usize, usize)], chunk: usize) -> Option<(usize, usize)> {
        let after = table.partition_point(|&(s, _)| s <= chunk);
        let &(s, l) = table[..after].last()?;
        (chunk < s + l).then_some((s, l))
    }

    /// The regions now, in bytes, by offset.
    pub(crate) fn list(&self, geometry: &Geometry) -> Vec<Region> {
        self.lock()
            .iter()
            .map(|&(start, len)| Region { offset: start * geometry.chunk_size, bytes: geometry.run_bytes(start, len) })
            .collect()
    }

    /// Growths so far.
    pub(crate) fn grow_events(&self) -> u64 {
        self.grow_events.load(Ordering::Acquire)
    }

    /// Count a growth (the table's lock held).
    pub(crate) fn count_growth(&self) {
        self.grow_events.fetch_add(1, Ordering::AcqRel);
    }

    /// The most chunks one region can ever hold: the first region, which is never given back,
    /// or one added next to it once every other region is gone, which gets all the chunks the
    /// limit leaves (it lies one absent chunk past the first, and the offsets, twice the limit,
    /// hold it). No block spans two regions, so no block is longer. Fixed from the start: the
    /// first region and the limit never change.
    pub(crate) fn largest_region_chunks(&self, first: usize) -> usize {
        first.max(self.limit_chunks.saturating_sub(first))
    }

    /// The chunks that regions may add to those of `table` under the limit.
    pub(crate) fn room_chunks(&self, table: &[(usize, usize)]) -> usize {
        self.limit_chunks.saturating_sub(table.iter().map(|&(_, len)| len).sum())
    }

    /// Where a region for a block of `need` chunks starting at a multiple of `align` chunks
    /// goes: at least the growth step, at least `need`, within the limit, one absent chunk away
    /// from every other region, inside an arena of `chunks` chunks. A growth that would leave
    /// less than a step before the limit takes that rest as well (where the offsets have room
    /// for it): no block spans two regions, so a last region smaller than a step would serve
    /// only blocks smaller than itself, while the same chunks joined to this region serve a
    /// block as large as both. `None`: the limit or the offsets leave no room. Where no hole
    /// holds it apart from every region and `may_join` allows, it joins a region that a growth
    /// added (see the module documentation): [`Regions::insert`] makes the two one region.
    pub(crate) fn place(
        &self,
        table: &[(usize, usize)],
        need: usize,
        align: usize,
        chunks: usize,
        may_join: bool,
    ) -> Option<Placement> {
        let room = self.room_chunks(table);
        let len = self.step_chunks.max(need).min(room);
        if len < need || len == 0 {
            return None;
        }
        let takes_the_rest = room - len < self.step_chunks && room > len;
        let placers: [Placer; 2] = [Self::place_len, Self::place_joined];
        for place in &placers[..if may_join { 2 } else { 1 }] {
            for len in [room, len].into_iter().skip(if takes_the_rest { 0 } else { 1 }) {
                if let Some(p) = place(table, len, align, chunks) {
                    return Some(p);
                }
            }
        }
        None
    }

    /// The first start, a multiple of `align`, of `len` chunks one absent chunk away from every
    /// region of `table` in an arena of `chunks` chunks.
    fn place_len(table: &[(usize, usize)], len: usize, align: usize, chunks: usize) -> Option<Placement> {
        let align = align.max(1);
        // Holes between regions (the table is in address order), each shrunk by the one absent
        // chunk that separates regions; the last one ends past the arena's last chunk.
        let mut from = 0usize;
        for (hole_end, next_from) in table.iter().map(|&(s, l)| (s, s + l + 1)).chain(std::iter::once((chunks + 1, 0)))
        {
            let start = from.next_multiple_of(align);
            if start + len < hole_end {
                return Some(Placement { start, len });
            }
            from = next_from;
        }
        None
    }

    /// The first start, a multiple of `align`, of `len` chunks right before or right after a
    /// region of `table` other than the first (at chunk 0), in an arena of `chunks` chunks: it
    /// overlaps no region and keeps one absent chunk away from the first; it may touch a
    /// region on its other side too, and then bridges the two (a gap between two regions that
    /// live blocks keep is used whole).
    fn place_joined(table: &[(usize, usize)], len: usize, align: usize, chunks: usize) -> Option<Placement> {
        let align = align.max(1);
        let fits = |start: usize| {
            start % align == 0
                && start + len <= chunks
                && table.iter().all(|&(s, l)| if s == 0 { start > l } else { start + len <= s || start >= s + l })
        };
        let mut first: Option<usize> = None;
        for &(s, l) in table.iter().filter(|&&(s, _)| s != 0) {
            let before = s.checked_sub(len).filter(|&b| fits(b));
            let after = Some(s + l).filter(|&a| fits(a));
            for start in before.into_iter().chain(after) {
                first = Some(first.map_or(start, |f| f.min(start)));
            }
        }
        first.map(|start| Placement { start, len })
    }

    /// Add region `p` (the table's lock held): a region of its own, or a part of the region it
    /// lies right before or after ([`Regions::place`]).
    pub(crate) fn insert(&self, table: &mut Vec<(usize, usize)>, p: Placement) {
        let at = table.partition_point(|&(s, _)| s < p.start);
        table.insert(at, (p.start, p.len));
        if at + 1 < table.len() && table[at].0 + table[at].1 == table[at + 1].0 {
            table[at].1 += table.remove(at + 1).1;
        }
        if at > 0 && table[at - 1].0 + table[at - 1].1 == table[at].0 {
            table[at - 1].1 += table.remove(at).1;
        }
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let at = parts.partition_point(|&(s, _)| s < p.start);
        parts.insert(at, (p.start, p.len));
    }

    /// Drop the regions `gone` (withdrawn, and by start, as the table is) from the table, in
    /// one pass however many go; returns the parts they were made of, by start.
    pub(crate) fn remove(&self, gone: &[(usize, usize)]) -> Vec<(usize, usize)> {
        let is_gone = |&(s, _): &(usize, usize)| Self::holding(gone, s).is_some();
        self.lock().retain(|r| !is_gone(r));
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let left = parts.iter().copied().filter(|p| !is_gone(p)).collect();
        let removed = parts.iter().copied().filter(is_gone).collect();
        *parts = left;
        removed
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A xorshift generator of numbers below its argument, from `seed`.
    fn xorshift(mut seed: u64) -> impl FnMut(usize) -> usize {
        move |bound| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % bound as u64) as usize
        }
    }

    /// Regions of 1-6 chunks from chunk `at` on, each one to five absent chunks after the last,
    /// appended to `table` while they fit in `chunks` chunks.
    fn add_random_regions(
        table: &mut Vec<(usize, usize)>,
        mut at: usize,
        chunks: usize,
        next: &mut impl FnMut(usize) -> usize,
    ) {
        while at < chunks {
            let len = 1 + next(6);
            if at + len <= chunks {
                table.push((at, len));
            }
            at += len + 1 + next(5);
        }
    }

    /// The first start that `place_len` must find, by trying every start in turn.
    fn first_start_by_trial(table: &[(usize, usize)], len: usize, align: usize, chunks: usize) -> Option<usize> {
        (0..=chunks)
            .step_by(align.max(1))
            .find(|&start| start + len <= chunks && table.iter().all(|&(s, l)| start + len < s || start > s + l))
    }

    #[test]
    fn a_region_goes_where_a_trial_of_every_start_puts_it() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2000 {
            let chunks = 8 + next(120);
            let mut table = Vec::new();
            let at = next(4);
            add_random_regions(&mut table, at, chunks, &mut next);
            let (len, align) = (1 + next(8), 1 << next(4));
            let found = Regions::place_len(&table, len, align, chunks).map(|p| p.start);
            assert_eq!(found, first_start_by_trial(&table, len, align, chunks), "{table:?} len {len} align {align}");
        }
    }

    #[test]
    fn regions_keep_an_absent_chunk_between_them() {
        let r = Regions::new(4, 16, 2);
        let mut t = r.lock().clone();
        let p = r.place(&t, 1, 1, 32, true).unwrap();
        assert_eq!(p, Placement { start: 5, len: 2 });
        r.insert(&mut t, p);
        let p = r.place(&t, 3, 4, 32, true).unwrap();
        assert_eq!(p, Placement { start: 8, len: 3 });
        r.insert(&mut t, p);
        // 9 chunks present, 7 left: a request of 8 does not fit the limit.
        assert_eq!(r.place(&t, 8, 1, 32, true), None);
        // A given-back region's offsets are used again.
        t.remove(1);
        assert_eq!(r.place(&t, 2, 1, 32, true), Some(Placement { start: 5, len: 2 }));
    }

    #[test]
    fn a_growth_that_would_leave_less_than_a_step_takes_the_rest() {
        let r = Regions::new(4, 16, 4);
        let mut t = r.lock().clone();
        // 12 chunks of room: a growth of 4 leaves 8, two steps.
        let p = r.place(&t, 1, 1, 32, true).unwrap();
        assert_eq!(p, Placement { start: 5, len: 4 });
        r.insert(&mut t, p);
        // 8 left: a growth of 5 would leave 3, less than a step, so it takes all 8.
        assert_eq!(r.place(&t, 5, 1, 32, true), Some(Placement { start: 10, len: 8 }));
        // Where the offsets hold the growth but not the rest, the growth alone.
        let r = Regions::new(2, 7, 3);
        let t = r.lock().clone();
        assert_eq!(r.place(&t, 2, 1, 6, true), Some(Placement { start: 3, len: 3 }));
    }

    #[test]
    fn the_largest_region_is_the_first_or_the_rest_of_the_limit() {
        // 2 chunks present, 32 at most: an added region holds at most 30.
        let r = Regions::new(2, 32, 2);
        assert_eq!(r.largest_region_chunks(2), 30);
        let t = r.lock().clone();
        assert_eq!(r.place(&t, 30, 1, 64, true), Some(Placement { start: 3, len: 30 }));
        assert_eq!(r.place(&t, 31, 1, 64, true), None);
        // A first region larger than the rest.
        assert_eq!(Regions::new(24, 32, 2).largest_region_chunks(24), 24);
    }

    #[test]
    fn the_offsets_run_out_before_the_limit_only_when_they_must() {
        let r = Regions::new(2, 100, 2);
        let t = r.lock().clone();
        // An arena of 5 chunks: [0, 2) present, chunk 2 the gap, [3, 5) the last room.
        assert_eq!(r.place(&t, 2, 1, 5, true), Some(Placement { start: 3, len: 2 }));
        assert_eq!(r.place(&t, 3, 1, 5, true), None);
    }

    /// The first start that `place_joined` must find, by trying every start in turn: right
    /// before or after one or two regions but the first, and apart from every other.
    fn first_joined_start_by_trial(table: &[(usize, usize)], len: usize, align: usize, chunks: usize) -> Option<usize> {
        (0..=chunks).step_by(align.max(1)).find(|&start| {
            let touches = |&&(s, l): &&(usize, usize)| start + len == s || start == s + l;
            let overlaps = |&(s, l): &(usize, usize)| start < s + l && s < start + len;
            let joined: Vec<_> = table.iter().filter(touches).collect();
            start + len <= chunks
                && !joined.is_empty()
                && joined.iter().all(|&&(s, _)| s != 0)
                && !table.iter().any(overlaps)
                && table.iter().filter(|r| !touches(r)).all(|&(s, l)| start + len < s || start > s + l)
        })
    }

    #[test]
    fn a_joining_region_goes_where_a_trial_of_every_start_puts_it() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let mut joined = 0;
        for _ in 0..3000 {
            let chunks = 8 + next(120);
            let mut table = vec![(0, 1 + next(4))];
            let at = table[0].1 + 1 + next(3);
            add_random_regions(&mut table, at, chunks, &mut next);
            let (len, align) = (1 + next(8), 1 << next(3));
            let found = Regions::place_joined(&table, len, align, chunks).map(|p| p.start);
            assert_eq!(
                found,
                first_joined_start_by_trial(&table, len, align, chunks),
                "{table:?} len {len} align {align}"
            );
            joined += usize::from(found.is_some());
        }
        assert!(joined > 1000, "only {joined} of 3000 tables had a place to join");
    }

    /// Regions of one chunk, every other one given back: holes of three chunks hold no growth
    /// of two apart from the regions, so it joins one, and goes back with it as two parts.
    #[test]
    fn a_growth_that_no_hole_holds_joins_a_region_and_goes_back_with_it() {
        let r = Regions::new(1, 8, 1);
        let mut t = r.lock().clone();
        for start in [2, 4, 6, 8, 10, 12, 14] {
            let p = r.place(&t, 1, 1, 16, true).unwrap();
            assert_eq!(p, Placement { start, len: 1 });
            r.insert(&mut t, p);
        }
        *r.lock() = t;
        assert_eq!(r.remove(&[(4, 1), (8, 1)]), vec![(4, 1), (8, 1)]);
        assert_eq!(r.remove(&[(12, 1)]), vec![(12, 1)]);
        let mut t = r.lock().clone();
        assert_eq!(t, vec![(0, 1), (2, 1), (6, 1), (10, 1), (14, 1)]);
        assert_eq!(r.place(&t, 2, 1, 16, false), None, "no hole of four chunks");
        let p = r.place(&t, 2, 1, 16, true).unwrap();
        assert_eq!(p, Placement { start: 3, len: 2 }, "right after the region at 2");
        r.insert(&mut t, p);
        assert_eq!(t, vec![(0, 1), (2, 3), (6, 1), (10, 1), (14, 1)]);
        *r.lock() = t;
        assert_eq!(r.remove(&[(2, 3)]), vec![(2, 1), (3, 2)], "one part per growth");
        assert_eq!(r.lock().clone(), vec![(0, 1), (6, 1), (10, 1), (14, 1)]);
    }
}

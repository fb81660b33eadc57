//! The largest request that a free place holds, as the allocator lays a block out there: a
//! free run of chunks with the front and the tail around it, and the free end of a core chunk
//! joined to the free start of the next (the statistics' largest free block, an out-of-memory
//! error's figure, a compaction plan's prediction).

use super::front::{FrontLayout, FrontTail};
use super::geometry::Geometry;
use super::layout::Layout;
use super::stretches::granule_shift;

/// What the free holes of a core chunk hold, in units (`Geometry::free_stretches`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FreeStretches {
    /// Free units at the chunk's start (whole granules).
    pub(crate) at_start: u64,
    /// The longest free stretch from a bank boundary.
    pub(crate) longest: u64,
    /// Free units from a bank boundary (past whole granules) to the chunk's end.
    pub(crate) at_end: u64,
    /// The largest block of at most a bank that a free stretch holds at its enclosing node's
    /// start (`Geometry::largest_banked_buddy_in`), in units.
    pub(crate) banked_block: u64,
}

impl FreeStretches {
    /// The largest request a place inside the chunk holds: a block larger than a bank from a
    /// bank boundary, or a block of at most a bank at its enclosing node's start.
    pub(crate) fn largest_request(&self, g: &Geometry) -> usize {
        g.largest_request_in_stretch(self.longest).max(self.banked_block as usize * g.min_block)
    }
}

impl Geometry {
    /// What the free `holes` (`[from, to)` in units, in address order) of a core chunk of
    /// `usable` units hold, as the allocator reads a chunk's tree: the statistics read the holes
    /// from the trees, a compaction plan from its model.
    pub(crate) fn free_stretches(&self, holes: impl Iterator<Item = (u64, u64)>, usable: u64) -> FreeStretches {
        let granule = 1u64 << granule_shift(self.depth);
        let mut out = FreeStretches::default();
        for (from, to) in holes {
            if from == 0 {
                out.at_start = to.min(usable) & !(granule - 1);
            }
            // No hole holds more than its length.
            if to - from > out.banked_block {
                out.banked_block = out.banked_block.max(self.largest_banked_buddy_in(from, to));
            }
            let banked = from.next_multiple_of(self.banked_start_units());
            if banked < to {
                out.longest = out.longest.max(to - banked);
            }
            let front_start = from.next_multiple_of(granule).next_multiple_of(self.banked_start_units());
            if to == usable && front_start < to {
                out.at_end = to - front_start;
            }
        }
        out
    }

    /// The largest request that the free run of `len` chunks from chunk `start` (the last one
    /// maybe the arena's short one) holds, as the allocator lays it out there
    /// (`Arena::claim_large`, `Arena::claim_tailed_run`), with `front` bytes free at the end of
    /// the core chunk before it from a bank boundary (0: none) and `tail_room` units free at the
    /// start of the core chunk after it (0: none).
    ///
    /// A block with a front (`front.rs`) reserves its request rounded up to a unit, and its tail
    /// is exactly its units: where the front's layout allows one, every byte from the front's
    /// start to the end of the tail room counts, the run's end at the arena's end too. Otherwise
    /// the larger of two: the run with a tail in the tail room, the largest request whose layout
    /// is the run's chunks and a tail that the room holds (a tail is taken only where one more
    /// whole chunk would waste more than 1/32 of the request, so not every size up to the room
    /// has one); and the run alone, when its bytes' layout fits it: a run of its chunks, or a
    /// run and a tail that its last chunk holds (a short last chunk may not hold the tail cut to
    /// its granule: then every chunk of the run but the last and the largest tail the last one
    /// holds). A run of at most half a chunk (the short last chunk alone) holds a buddy block; a
    /// short last chunk of more than half a chunk, all its bytes.
    pub(crate) fn largest_request_in_run(&self, (start, len): (usize, usize), front: usize, tail_room: u64) -> usize {
        // A default alignment above a chunk: the run's block starts on a multiple of it, with
        // no front (a front starts inside a chunk).
        let align_chunks = (self.align_units >> self.depth).max(1) as usize;
        let (start, len, front) = match align_chunks {
            1 => (start, len, front),
            _ => {
                let aligned = start.next_multiple_of(align_chunks);
                (aligned, (start + len).saturating_sub(aligned), 0)
            }
        };
        if len == 0 {
            return 0;
        }
        let bytes = self.run_bytes(start, len);
        if let (true, Some(before)) = (self.tails && front > 0, start.checked_sub(1)) {
            let upc = self.units_per_chunk();
            let front_start = upc - (front >> self.unit_shift) as u64;
            // A tail of a whole chunk would be one more whole chunk, which the room is not.
            let tail = tail_room.min(upc - 1);
            let size = front + bytes + tail as usize * self.min_block;
            let fits = FrontLayout::at(self, before, front_start, size).is_some_and(|f| {
                f.tail_in_run(len, tail > 0).is_some_and(|t| t != FrontTail::Shared || f.tail_units <= tail)
            });
            if fits {
                return size;
            }
        }
        let buddy_within = |units: u64| self.largest_buddy_within(units) as usize * self.min_block;
        if bytes <= self.chunk_size / 2 {
            return buddy_within((bytes / self.min_block) as u64);
        }
        // The run and a tail in the room after it: its sizes whose layout is a tail are those up
        // to a bound (a tail only where a whole chunk would waste more), and its tail grows with
        // the size.
        let tailed = |size: usize| matches!(self.layout(size, 1), Layout::RunTail { chunks, tail, .. } if chunks == len && tail.units <= tail_room);
        let with_tail = match tail_room > 0 && tailed(bytes + 1) {
            true => largest_where(bytes + 1, bytes + tail_room as usize * self.min_block, tailed),
            false => 0,
        };
        let last = start + len - 1;
        let alone = match self.layout(bytes, 1) {
            Layout::Run { chunks, .. } if chunks <= len => bytes,
            // More than half a chunk that the short last chunk's tree cannot hold trimmed:
            // that chunk whole, as a run.
            Layout::Buddy(b) if b.level == 0 => bytes,
            Layout::RunTail { chunks, tail, .. } if chunks < len && tail.units <= self.usable_units(start + chunks) => {
                bytes
            }
            _ => (len - 1) * self.chunk_size + buddy_within(self.usable_units(last).min(self.largest_trimmed())),
        };
        alone.max(with_tail)
    }

    /// The largest request whose block has its front from unit `front_start` of whole core
    /// chunk `chunk` to that chunk's end and its tail in the free start of the core chunk
    /// after it, `tail_room` units, with no whole chunk between (`Arena::pair_candidates`):
    /// every byte of both, but a chunk less a unit for the tail at most (a tail of a whole
    /// chunk is a whole chunk). 0 where no such block is larger than a bank (a smaller one
    /// never straddles a bank boundary, let alone a chunk's).
    pub(crate) fn largest_request_across(&self, chunk: usize, front_start: u64, tail_room: u64) -> usize {
        let upc = self.units_per_chunk();
        if !self.tails || front_start == 0 || front_start >= upc || tail_room == 0 {
            return 0;
        }
        let units = upc - front_start + tail_room.min(upc - 1);
        let size = units as usize * self.min_block;
        match FrontLayout::at(self, chunk, front_start, size) {
            Some(f) if f.chunks == 0 && f.tail_units > 0 && units > self.bank_units => size,
            _ => 0,
        }
    }
}

/// The largest size in `[lo, hi]` for which `holds` is true, where it is true for `lo` and, for
/// any size, for every smaller one in the range (`lo` when it holds for no larger one).
fn largest_where(lo: usize, hi: usize, holds: impl Fn(usize) -> bool) -> usize {
    let (mut yes, mut no) = (lo, hi + 1);
    while no - yes > 1 {
        let mid = yes + (no - yes) / 2;
        match holds(mid) {
            true => yes = mid,
            false => no = mid,
        }
    }
    yes
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::config::PoolConfig;

    /// A run of whole chunks and a tail in the free start of the chunk after it holds only the
    /// sizes whose layout has a tail: two chunks and a rest below 30/33 of a chunk (one more
    /// whole chunk would waste more than a 32nd), not every size up to the room.
    #[test]
    fn a_run_and_a_tail_hold_the_sizes_whose_layout_is_a_tail() {
        let g = Geometry::new(&PoolConfig::new(64 << 20));
        let chunk = 2 << 20;
        let largest = g.largest_request_in_run((3, 2), 0, 7936);
        assert_eq!(largest, 2 * chunk + 1_906_501);
        assert!(matches!(g.layout(largest, 1), Layout::RunTail { chunks: 2, tail, .. } if tail.units <= 7936));
        assert_eq!(g.layout(largest + 1, 1), Layout::Run { chunks: 3, align_chunks: 1 });
        // A tail room below that bound: all of it.
        assert_eq!(g.largest_request_in_run((3, 2), 0, 4096), 2 * chunk + (1 << 20));
        // With a front, every byte: the front, the chunks and the room.
        assert_eq!(g.largest_request_in_run((3, 2), 65_536, 7936), 65_536 + 2 * chunk + 7936 * 256);
    }
}

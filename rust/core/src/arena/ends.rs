//! The ends records of the chunks (`chunk_ends.rs`) on the arena's paths: a free of a buddy
//! block carries its chunk's record over its epoch step, a search learns a chunk's bounds in a
//! few loads, and a read of a tree for its ends records what it found.

use super::arena::Arena;
use super::chunk_ends::{ChunkEnds, Ends};
use super::chunk_space::{ChunkSpace, Probe};
use super::exact::Unmarked;
use super::layout::BuddyLayout;
use super::stretches::{granule_shift, StretchMemo};
use crate::util::sync::Ordering;

impl Arena {
    /// [`Arena::unmark_buddy_raising`] (the free path's release of block `b` at unit `within`
    /// of `chunk`, which keeps the stretch memo) that also carries the chunk's ends record over
    /// the free. Until a search wrote a record anywhere, a free costs one load of a flag more.
    #[inline(always)]
    pub(crate) fn unmark_buddy_keeping_ends(
        &self,
        chunk: usize,
        b: &BuddyLayout,
        within: u64,
    ) -> Result<Unmarked, &'static str> {
        let before = match self.ends_recorded.load(Ordering::Relaxed) {
            0 => None,
            _ => self.lines[chunk].ends.before_free(&self.lines[chunk].space),
        };
        let released = self.unmark_buddy_raising(chunk, b, within)?;
        if let Some(before) = before {
            self.keep_ends_after_free(chunk, before, within, within + b.units);
        }
        Ok(released)
    }

    /// The second half of [`Arena::unmark_buddy_keeping_ends`], once units `[from, to)` of
    /// `chunk` are released, the epoch advanced and the stretch memo raised: an end the freed
    /// units may reach takes the memo's bound (no tree is read).
    #[inline(never)]
    fn keep_ends_after_free(&self, chunk: usize, before: Probe, from: u64, to: u64) {
        self.lines[chunk].ends.after_free(
            &self.lines[chunk].space,
            before,
            (from, to),
            self.geometry.usable_units(chunk),
            self.ends_slack(),
            |epoch| {
                let longest = self.lines[chunk].stretch.known(epoch).unwrap_or(u64::MAX);
                Ends { start: longest, end: longest }
            },
        );
    }

    /// Carry `chunk`'s ends record (valid at `before`, read before anything was released) over
    /// the release and epoch step of units `[from, to)` that no buddy free kept: the front or the
    /// tail of a block with a front. An end they may reach takes its bound from the free run
    /// around them, read from the tree.
    pub(crate) fn keep_ends_around(&self, chunk: usize, before: Probe, from: u64, to: u64) {
        let usable = self.geometry.usable_units(chunk);
        self.lines[chunk].ends.after_free(
            &self.lines[chunk].space,
            before,
            (from, to),
            usable,
            self.ends_slack(),
            |_| {
                let (lo, hi) = self.shape.free_run_around(self.tree(chunk), from, to);
                let hi = hi.min(usable);
                Ends { start: if lo == 0 { hi } else { lo }, end: if hi == usable { usable - lo } else { usable - hi } }
            },
        );
    }

    /// How near a freed unit must come to an end's bound to count as reaching it: a granule
    /// for the free start, a bank (or a granule when larger) for the free end
    /// ([`ChunkEnds::after_free`](super::chunk_ends::ChunkEnds::after_free)).
    fn ends_slack(&self) -> (u64, u64) {
        let granule = 1u64 << granule_shift(self.geometry.depth);
        (granule, self.geometry.bank_units.max(granule))
    }

    /// Upper bounds, in units, of the free start of chunk `chunk` and of its free end from the
    /// first bank boundary in it (where a front would start), in a few loads and no tree
    /// read: its ends record when valid, else the longest stretch its stretch memo knows (a
    /// free start or a free end from a bank boundary is such a stretch); no more than its free
    /// units, nor than a chunk.
    pub(crate) fn ends_bound(&self, chunk: usize) -> Ends {
        let upc = self.geometry.units_per_chunk();
        bound(&self.lines[chunk].space, &self.lines[chunk].ends, &self.lines[chunk].stretch, upc)
    }

    /// The free units at the start and at the end of core chunk `chunk`, read from its tree
    /// ([`Arena::free_ends`], which also records its stretch memo when out of date), recorded
    /// in its ends record, so that the next search bounds them in two loads while nothing is
    /// freed there (or only what frees keep).
    pub(crate) fn read_ends(&self, chunk: usize) -> (u64, u64) {
        if self.ends_recorded.load(Ordering::Relaxed) == 0 {
            self.ends_recorded.store(1, Ordering::Relaxed);
        }
        let (_, probe) = self.lines[chunk].space.look();
        let (start, end) = match self.lines[chunk].stretch.known(probe.epoch()) {
            Some(_) => self.free_ends_from_the_ends(chunk),
            // The whole tree is read: its longest stretch is recorded on the way.
            None => self.free_ends(chunk, self.geometry.bank_units),
        };
        self.lines[chunk].ends.record(probe.epoch(), start, end);
        (start, end)
    }

    /// [`Arena::free_ends`] without the stretch memo: each free end read from the chunk's end
    /// inwards to the first allocated unit ([`Arena::free_units_at_start`],
    /// [`Arena::free_units_at_end`]: the bunches on the way down from the root and beside it,
    /// not the whole tree), in whole granules as `free_ends` counts them.
    pub(crate) fn free_ends_from_the_ends(&self, chunk: usize) -> (u64, u64) {
        (self.free_units_at_start(chunk), self.free_units_at_end(chunk))
    }
}

/// The bounds of [`Arena::ends_bound`] from a chunk's free-space word, ends record and stretch
/// memo, in a chunk of `upc` units.
#[inline(always)]
fn bound(space: &ChunkSpace, record: &ChunkEnds, memo: &StretchMemo, upc: u64) -> Ends {
    let (free, probe) = space.look();
    let free = free.min(upc);
    match record.known(probe.epoch()) {
        Some(Ends { start, end }) => Ends { start: start.min(free), end: end.min(free) },
        None => {
            let room = memo.known(probe.epoch()).map_or(free, |longest| longest.min(free));
            Ends { start: room, end: room }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    //! Random allocations and frees in a nearly full pool, where failing allocations scan the
    //! pairs of chunk ends and write records that frees then carry: after every step, no record
    //! valid at its chunk's epoch (nor any bound) says an end is shorter than the tree has it.
    use crate::arena::global::ChunkState;
    use crate::arena::stretches::granule_shift;
    use crate::arena::stretches::tests::Rng;
    use crate::config::{Backing, PoolConfig};
    use crate::pool::pool::Pool;

    #[test]
    fn records_and_bounds_never_cut_an_end_short() {
        let capacity = 32 << 20;
        let pool = Pool::new(PoolConfig::new(capacity).cores(2).backing(Backing::None)).unwrap();
        let a = pool.arena();
        let g = &a.geometry;
        let bank = g.bank_units;
        let mut rng = Rng::new(16);
        let mut blocks: Vec<(usize, usize)> = Vec::new();
        let (mut live, mut failed, mut checked) = (0usize, 0, 0);
        for step in 0..6_000 {
            if live > capacity * 93 / 100 || (live > capacity * 85 / 100 && rng.next() % 2 == 0) {
                let (offset, size) = blocks.swap_remove((rng.next() % blocks.len() as u64) as usize);
                pool.free_raw(offset, size).unwrap();
                live -= size;
            }
            let size = 4096 + (rng.next() % (1 << 20)) as usize;
            match pool.alloc_raw(size, None) {
                Ok(offset) => {
                    blocks.push((offset, size));
                    live += size;
                }
                Err(_) => failed += 1,
            }
            for (chunk, bound) in (0..g.chunks).map(|c| (c, a.ends_bound(c))) {
                if !matches!(a.global.state(chunk), ChunkState::Core(_)) {
                    continue;
                }
                let (_, probe) = a.lines[chunk].space.look();
                let known = a.lines[chunk].ends.known(probe.epoch());
                let (start, end) = a.free_ends(chunk, bank);
                // The free end from its first bank boundary.
                let end = end / bank * bank;
                assert!(bound.start >= start && bound.end >= end, "step {step}, chunk {chunk}");
                if let Some(known) = known {
                    checked += 1;
                    assert!(known.start >= start, "step {step}, chunk {chunk}: free start {start}, record {known:?}");
                    assert!(known.end >= end, "step {step}, chunk {chunk}: free end {end}, record {known:?}");
                }
            }
        }
        assert!(failed > 100, "the pool is full enough to fail ({failed} failed)");
        assert!(checked > 1000, "records were written and kept ({checked} checked)");
    }

    /// The free ends read inwards from each end of a chunk's tree are the ends a read of the
    /// whole tree finds, on random trees of chunks of several depths, the arena's short last
    /// chunk among them.
    #[test]
    fn free_ends_read_from_the_ends_match_a_read_of_the_whole_tree() {
        // (Granules of several units where a chunk has more units than a read of the whole
        // tree counts granules: 4 MiB of 256-byte units, 2 MiB of 64-byte units.)
        let configs = [
            (32 << 20, 2 << 20, 256, 3),
            (7 << 20, 1 << 20, 256, 4),
            (9 << 19, 4 << 20, 256, 5),
            (9 << 20, 2 << 20, 64, 6),
        ];
        let mut coarse = 0;
        for (capacity, chunk_size, min_block, seed) in configs {
            let config = PoolConfig::new(capacity).cores(2).chunk_size(chunk_size).min_block(min_block);
            let pool = Pool::new(config.backing(Backing::None)).unwrap();
            let a = pool.arena();
            let g = &a.geometry;
            coarse += usize::from(granule_shift(g.depth) > 0);
            let mut rng = Rng::new(seed);
            let mut blocks: Vec<(usize, usize)> = Vec::new();
            let mut compared = 0;
            for step in 0..3_000 {
                if !blocks.is_empty() && rng.next() % 5 < 2 {
                    let (offset, size) = blocks.swap_remove((rng.next() % blocks.len() as u64) as usize);
                    pool.free_raw(offset, size).unwrap();
                }
                let size = (64 + (rng.next() % (chunk_size as u64 / 2)) as usize) >> (rng.next() % 8);
                if let Ok(offset) = pool.alloc_raw(size.max(1), None) {
                    blocks.push((offset, size.max(1)));
                }
                // Cached blocks stay allocated in their trees: both reads see them.
                for chunk in 0..g.chunks {
                    if matches!(a.global.state(chunk), ChunkState::Core(_)) {
                        let whole = a.free_ends(chunk, g.bank_units);
                        assert_eq!(a.free_ends_from_the_ends(chunk), whole, "seed {seed} step {step} chunk {chunk}");
                        compared += 1;
                    }
                }
            }
            assert!(compared > 1000, "chunks compared: {compared}");
        }
        assert_eq!(coarse, 2, "configurations whose granules are several units");
    }
}

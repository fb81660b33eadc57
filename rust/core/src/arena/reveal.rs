//! The last resort of an allocation that found no room: make every level of every core's
//! chunks searchable again.
//!
//! The level maps (`level_maps.rs`) and the bunch summaries (`buddy.rs`) only ever hide room
//! after a search found none, and a free re-announces what its release may have made
//! servable. A search can still record a miss that no free undoes: one that met a leaf bunch
//! sealed for a moment by a thread cleaning a phantom mark (a cleaner seals only an empty
//! bunch, and unseals it without an epoch step). The bunch is empty, so no free happens in it
//! until a block smaller than the missed level lands there; its room, and the chunk's levels
//! that it alone could serve, stay hidden, and a long run can hide enough of them to fail
//! allocations that the arena could serve. Before an allocation answers that there is
//! no room, it reveals every hidden level of the chunks that cores own and searches once
//! more: failures are rare, so they pay for it.
//!
//! Only a search that met a sealed bunch can record such a miss, and the trees count every time
//! one does (`TreeShape::reveal_ticket`). When none did since the last complete reveal (or
//! ever), every miss since was true, and a failing allocation reveals only the next [`REVEAL_SOME`] chunks
//! with enough free units (from a cursor that goes round the arena) instead of all of them:
//! a failure then costs a few searches. It also reveals every chunk granted for a tail whose
//! rest is still hidden on purpose (`tail.rs`: the rest serves other blocks once nothing else
//! has room), wherever it lies: the arena keeps them in a set (`hidden_rests.rs`), so the
//! rest of a tail's chunk far from the cursor does not fail a request it holds.
//!
//! A reveal does what a free does, with nothing released: an epoch step on the chunk's
//! free-space word ([`ChunkSpace::refresh`]), so that a miss recorded concurrently either
//! sees the step and undoes itself or is undone by what follows; then it forgets the bunch
//! summaries and sets the chunk's bits of every level ([`LevelMaps::reveal`]).
//!
//! [`ChunkSpace::refresh`]: super::chunk_space::ChunkSpace::refresh
//! [`LevelMaps::reveal`]: super::level_maps::LevelMaps::reveal

use super::arena::Arena;
use super::buddy::TreeShape;
use super::chunk_sets::ChunkWords;
use super::core_pool::CorePool;
use super::global::ChunkState;
use super::stretch_classes;
use crate::util::sync::Ordering;

/// Chunks a failing allocation reveals when no search met a sealed bunch since the last
/// complete reveal.
pub(crate) const REVEAL_SOME: usize = 2;
/// Chunks such a reveal looks at, at most (the next failure goes on from there): each look
/// reads the chunk's line, cold on a failing path.
const REVEAL_LOOKS: usize = 16;

/// What a reveal made searchable again.
#[derive(Debug, Default)]
pub(crate) struct Revealed {
    /// Every level of every chunk that cores own.
    pub(crate) every: bool,
    /// Chunks granted for a tail whose hidden rest it revealed.
    pub(crate) rests: usize,
    /// Otherwise these chunks, with their owners (the first `count`).
    pub(crate) chunks: [(usize, usize); REVEAL_SOME],
    pub(crate) count: usize,
}

impl Arena {
    /// Reveal every level of every chunk that cores own with a free unit; or, when no search
    /// met a sealed bunch since the last complete reveal (so every miss since was true), only
    /// the next [`REVEAL_SOME`] chunks with at least `units` free units (and, for a block
    /// larger than a bank, a memo that does not rule it out) among the next [`REVEAL_LOOKS`],
    /// from a cursor that goes round the arena: a failure then costs a few searches, not one
    /// of every tree.
    #[cold]
    pub(crate) fn reveal_hidden(&self, units: u64) -> Revealed {
        match self.shape.reveal_ticket() {
            // No search ever met a seal: nothing was hidden by mistake.
            Some(0) => self.shape.revealed(0),
            Some(ticket) => {
                for pool in self.cores.iter() {
                    for chunk in pool.owned() {
                        self.reveal_chunk(pool, chunk, 1);
                    }
                }
                self.shape.revealed(ticket);
                return Revealed { every: true, ..Revealed::default() };
            }
            None => {}
        }
        Revealed { rests: self.reveal_rests(units), ..self.reveal_some(units) }
    }

    /// Reveal every chunk granted for a tail whose rest is still hidden, has at least `units`
    /// free units, and, for a request larger than a bank, may have a free stretch that long
    /// from a bank boundary (`hidden_rests.rs`); returns how many. The stretch index
    /// (`stretch_classes.rs`, exact) names the chunks that may have such a stretch (its memos
    /// count the stretches from a bank boundary, where such a block starts): the other members
    /// cannot hold the request and are not even read. A member whose rest is still hidden with
    /// fewer free units is read but not taken out: a visit would read the same and put it
    /// back, at the cost of two read-modify-writes of the set. (After a fill of large blocks,
    /// about 300 of 512 chunks are members, most of them too small for the next failing
    /// request.)
    fn reveal_rests(&self, units: u64) -> usize {
        let units = units.max(1);
        let depth = self.geometry.depth;
        let mut may = ChunkWords::from_elem(u64::MAX, self.geometry.chunks.div_ceil(64));
        if units > self.geometry.bank_units {
            may.fill(0);
            let top = stretch_classes::classes_up_to(self.geometry.units_per_chunk());
            self.stretch_classes.may_hold(units, top, &mut may);
        }
        // Stale members (retired, or their rest shown) are visited, which drops them.
        let wanted = |chunk: usize| {
            let space = &self.lines[chunk].space;
            !matches!(self.global.state(chunk), ChunkState::Core(_))
                || space.hidden() <= depth
                || space.free_units() >= units
        };
        let mut revealed = 0;
        self.hidden_rests.pass(&|w| may.get(w).copied().unwrap_or(0), &wanted, &mut |chunk| {
            let ChunkState::Core(owner) = self.global.state(chunk) else {
                return false; // retired since
            };
            if self.lines[chunk].space.hidden() <= self.geometry.depth {
                return false; // a free there announced room, or a reveal came first
            }
            if self.reveal_chunk(&self.cores[owner], chunk, units) {
                revealed += 1;
                return false;
            }
            true
        });
        revealed
    }

    fn reveal_some(&self, units: u64) -> Revealed {
        let chunks = self.geometry.chunks;
        let from = self.reveal_cursor.load(Ordering::Relaxed) as usize;
        let mut revealed = Revealed::default();
        let mut next = from + chunks.min(REVEAL_LOOKS);
        for i in 0..chunks.min(REVEAL_LOOKS) {
            let chunk = (from + i) % chunks;
            if let ChunkState::Core(owner) = self.global.state(chunk) {
                if self.memo_rules_out(chunk, units) {
                    continue;
                }
                if self.reveal_chunk(&self.cores[owner], chunk, units.max(1)) {
                    revealed.chunks[revealed.count] = (chunk, owner);
                    revealed.count += 1;
                    if revealed.count == REVEAL_SOME {
                        next = from + i + 1;
                        break;
                    }
                }
            }
        }
        self.reveal_cursor.store((next % chunks) as u64, Ordering::Relaxed);
        revealed
    }

    /// Give back the empty chunks that cores hold, found through their level maps (an empty
    /// chunk may serve level 0) rather than by reading every owned chunk, and the arena's
    /// last chunk when it is short (it never serves level 0, so its maps hide that level).
    /// Returns how many went back.
    ///
    /// A chunk whose level-0 bit is set but that is not empty has no free node of level 0 (the
    /// whole chunk): its level is hidden as a search that found no such node hides it
    /// (`Arena::hide_whole_chunk`), so the next failure does not read it again. The first
    /// block placed in a chunk just granted hides that level too; what is left here are the
    /// chunks that a reveal, or another path's grant, left with the bit set.
    #[cold]
    pub(crate) fn reclaim_empty_mapped(&self) -> usize {
        let mut reclaimed = 0;
        for (owner, pool) in self.cores.iter().enumerate() {
            let owned = |w: usize| pool.owned_word(w);
            let mut from = 0;
            while let Some(chunk) = pool.maps.next(0, from, &owned) {
                from = chunk + 1;
                if self.chunk_is_empty(chunk) {
                    reclaimed += usize::from(self.retire(chunk, owner));
                } else {
                    self.hide_whole_chunk(chunk, owner);
                }
            }
        }
        let g = &self.geometry;
        let last = g.chunks - 1;
        if g.usable_units(last) < g.units_per_chunk() {
            if let ChunkState::Core(owner) = self.global.state(last) {
                if self.chunk_is_empty(last) && self.retire(last, owner) {
                    reclaimed += 1;
                }
            }
        }
        reclaimed
    }

    /// Whether `chunk`'s valid stretch memo says that no block of `units` units, larger than a
    /// bank, fits there: such a block starts on a bank boundary (a node of the buddy path
    /// too), and the memo bounds every free stretch from one. Revealing such a chunk would
    /// not help the request, and its retry would read the chunk's tree for nothing.
    fn memo_rules_out(&self, chunk: usize, units: u64) -> bool {
        if units <= self.geometry.bank_units {
            return false;
        }
        let (_, probe) = self.lines[chunk].space.look();
        self.lines[chunk].stretch.rules_out(probe.epoch(), units)
    }

    /// Reveal `chunk` of `pool` if it has at least `units` free units. Its stretch memo and its
    /// ends record, when valid, stay valid across the reveal's epoch step (nothing was
    /// released: every stretch and both ends are as long as before or shorter), as a free
    /// keeps them (`stretches.rs`, `chunk_ends.rs`).
    fn reveal_chunk(&self, pool: &CorePool, chunk: usize, units: u64) -> bool {
        let space = &self.lines[chunk].space;
        if space.free_units() < units {
            return false;
        }
        // Two epoch steps: the refresh, then the maps' announcement. When the memo is carried
        // over both, the chunk stays sure (`stretch_classes.rs`): a failing allocation that
        // revealed many chunks would otherwise make its retry read every one's tree.
        let refreshed = self.carry_records_over(chunk, || {
            space.refresh();
        });
        TreeShape::reset_summaries(self.summaries(chunk));
        let announced = self.carry_records_over(chunk, || pool.maps.reveal(space, chunk));
        if !(refreshed && announced) {
            self.stretch_classes.mark_unsure(chunk);
        }
        true
    }

    /// Run `step`, an epoch step of `chunk` that releases nothing, and carry the chunk's stretch
    /// memo and ends record, where valid before it, over it (when it is the only step since);
    /// whether the memo is valid after it.
    fn carry_records_over(&self, chunk: usize, step: impl FnOnce()) -> bool {
        let line = &self.lines[chunk];
        let memo_before = line.stretch.before_free(&line.space);
        let ends_before = line.ends.before_free(&line.space);
        step();
        if let Some(before) = ends_before {
            line.ends.after_step(&line.space, before);
        }
        memo_before.is_some_and(|before| {
            line.stretch.after_free(&line.space, before, self.geometry.bank_units, 0, || (0, 0)).is_some()
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::config::PoolConfig;
    use crate::pool::pool::Pool;

    const MIB: usize = 1 << 20;

    /// Every bunch summary and every level of every owned chunk hidden, as misses that no free
    /// undoes can leave them (a search that met a bunch sealed by a cleaner, over a long run).
    fn hide_everything(p: &Pool) {
        let depth = p.arena().geometry.depth;
        for pool in p.arena().cores.iter() {
            for chunk in pool.owned() {
                for word in p.arena().summaries(chunk) {
                    word.store(u64::from(depth) + 1, std::sync::atomic::Ordering::Release);
                }
                let space = &p.arena().lines[chunk].space;
                let probe = space.probe(0).unwrap();
                pool.maps.hide(space, chunk, depth, probe);
            }
        }
    }

    #[test]
    fn a_failing_allocation_finds_room_that_misses_hid() {
        for size in [MIB, 3000, 40_000] {
            let p = Pool::new(PoolConfig::new(16 * MIB).cores(2).core_reserve(0)).unwrap();
            let blocks: Vec<_> = std::iter::from_fn(|| p.alloc(MIB, None, 0).ok()).collect();
            // Every chunk granted, half of each free.
            let (freed, kept): (Vec<_>, Vec<_>) = blocks.iter().enumerate().partition(|(i, _)| i % 2 == 0);
            for (_, &h) in &freed {
                p.free(h).unwrap();
            }
            assert!(p.stats().bytes_free >= freed.len() * MIB);
            hide_everything(&p);
            let h = p.alloc(size, None, 0).expect("room hidden by misses is found before failing");
            p.free(h).unwrap();
            assert_eq!(p.check().unwrap(), kept.len());
        }
    }

    /// A run's tail hides the rest of its chunk on purpose and lists the chunk; the free that
    /// gives the tail back announces that room and takes the chunk off the list, so no failing
    /// allocation reads it later only to drop it.
    /// A reveal steps a chunk's epoch twice (its refresh, then the maps' announcement) and
    /// releases nothing: a chunk whose memo was valid stays sure with its memo valid, so the
    /// failing allocation's retry reads no tree of a chunk it revealed for nothing.
    #[test]
    fn a_reveal_keeps_a_valid_memo_and_the_chunk_sure() {
        let p = Pool::new(PoolConfig::new(16 * MIB).cores(1).core_reserve(0)).unwrap();
        let a = p.arena();
        let h = p.alloc(MIB + 4096, None, 0).unwrap();
        let chunk = a.geometry.chunk_of(p.block(h).unwrap().offset);
        let (_, probe) = a.lines[chunk].space.look();
        let before = a.lines[chunk].stretch.known(probe.epoch()).expect("a grant writes the memo");
        let sure = |c: usize| a.stretch_classes.unsure_word(c / 64) >> (c % 64) & 1 == 0;
        assert!(sure(chunk));
        assert!(a.reveal_chunk(&a.cores[0], chunk, 1));
        let (_, now) = a.lines[chunk].space.look();
        assert_eq!(now.epoch(), probe.epoch() + 2, "two epoch steps");
        assert_eq!(a.lines[chunk].stretch.known(now.epoch()), Some(before), "the memo carried over both");
        assert!(sure(chunk), "the chunk stays sure");
        // A memo out of date before the reveal leaves the chunk unsure.
        a.lines[chunk].space.refresh();
        a.stretch_classes.mark_unsure(chunk);
        assert!(a.reveal_chunk(&a.cores[0], chunk, 1));
        assert!(!sure(chunk));
        p.free(h).unwrap();
        assert_eq!(p.check().unwrap(), 0);
    }

    #[test]
    fn a_free_that_shows_a_hidden_rest_takes_its_chunk_off_the_list() {
        let p = Pool::new(PoolConfig::new(16 * MIB).cores(1).core_reserve(0).slab_sizes(Vec::new())).unwrap();
        let a = p.arena();
        let run = p.alloc(3 * MIB, None, 0).unwrap();
        let tail_chunk = (p.block(run).unwrap().offset + 2 * MIB) / (2 * MIB);
        assert_eq!(a.hidden_rests.members(), [tail_chunk], "the tail's chunk has its rest hidden");
        let small = p.alloc(64 << 10, None, 0).unwrap();
        assert_ne!(p.block(small).unwrap().offset / (2 * MIB), tail_chunk, "a hidden rest serves nothing");
        p.free(run).unwrap();
        assert_eq!(a.hidden_rests.members(), Vec::<usize>::new(), "the free showed the rest");
        p.free(small).unwrap();
        assert_eq!(p.check().unwrap(), 0);
    }

    /// A failing allocation reveals a hidden rest only when it has the request's units free
    /// and, for a block larger than a bank, its stretch memo does not rule out a free stretch
    /// that long; one that cannot hold the request stays in the set, hidden, for a smaller
    /// request.
    #[test]
    fn a_hidden_rest_too_small_for_the_request_stays_hidden_and_listed() {
        for memo_out_of_date in [true, false] {
            let p = Pool::new(PoolConfig::new(16 * MIB).cores(1).core_reserve(0).slab_sizes(Vec::new())).unwrap();
            let a = p.arena();
            let run = p.alloc(3 * MIB, None, 0).unwrap();
            let tail_chunk = (p.block(run).unwrap().offset + 2 * MIB) / (2 * MIB);
            let space = &a.lines[tail_chunk].space;
            let free = space.free_units();
            assert_eq!(a.hidden_rests.members(), [tail_chunk]);
            assert_eq!(a.reveal_rests(free + 1), 0, "too few free units: not revealed");
            assert_eq!(a.hidden_rests.members(), [tail_chunk], "and still listed");
            assert!(space.hidden() > a.geometry.depth, "its rest still hidden");
            // A memo that says no stretch is as long as the free units (a hint taken as true).
            let (_, probe) = space.look();
            let longest = free / 2;
            let before = a.lines[tail_chunk].stretch.record(probe.epoch(), longest);
            a.stretch_classes.moved(tail_chunk, before, longest, || a.lines[tail_chunk].stretch.recorded());
            a.stretch_classes.settle(tail_chunk, || false);
            assert_eq!(a.reveal_rests(free), 0, "no stretch long enough: not revealed");
            assert_eq!(a.hidden_rests.members(), [tail_chunk], "and still listed");
            if memo_out_of_date {
                a.stretch_classes.mark_unsure(tail_chunk);
                assert_eq!(a.reveal_rests(free), 1, "enough free units, the memo out of date: revealed");
            } else {
                let bank = a.geometry.bank_units;
                assert!(bank < longest);
                assert_eq!(a.reveal_rests(bank), 1, "a block of a bank: the memo does not count");
            }
            assert_eq!(a.hidden_rests.members(), Vec::<usize>::new());
            assert!(space.hidden() <= a.geometry.depth, "its rest shown");
            p.free(run).unwrap();
            assert_eq!(p.check().unwrap(), 0);
        }
    }

    /// The arena's short last chunk, empty and kept by its core, with the whole-chunk level
    /// hidden in the core's maps (it has no such node, so no free shows that level again): a
    /// failing allocation's reclaim gives it back all the same, and a run of the chunk before
    /// it and that short chunk then fits.
    #[test]
    fn the_failing_path_gives_back_the_empty_short_last_chunk() {
        let chunk = 2 * MIB;
        let p = Pool::new(PoolConfig::new(3 * chunk + chunk / 2).cores(1).slab_sizes(Vec::new())).unwrap();
        let a = p.arena();
        let runs: Vec<usize> = (0..3).map(|_| p.alloc_raw(chunk, None).unwrap()).collect();
        let small = p.alloc_raw(4096, None).unwrap();
        assert_eq!(small, 3 * chunk, "the short chunk, granted to the core");
        p.free_raw(small, 4096).unwrap();
        p.free_raw(runs[2], chunk).unwrap();
        let last = 3;
        assert!(a.chunk_is_empty(last) && a.cores[0].owned().any(|c| c == last), "kept as the reserve");
        let space = &a.lines[last].space;
        a.cores[0].maps.hide(space, last, 0, space.probe(0).unwrap());
        assert_eq!(space.hidden(), 1);
        assert_eq!(a.reclaim_empty_mapped(), 1);
        let size = chunk + chunk / 2 - 4096;
        let run = p.alloc_raw(size, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run, 2 * chunk);
        p.free_raw(run, size).unwrap();
        for offset in &runs[..2] {
            p.free_raw(*offset, chunk).unwrap();
        }
        p.check().unwrap();
    }

    /// Chunks granted to a core keep their whole-chunk level set until something searches
    /// that level, which few allocations do. The failing path's reclaim hides it in every
    /// chunk it finds not empty, so the next failure does not read those chunks again; an
    /// empty chunk keeps its bit, and a free that empties a chunk shows it again.
    #[test]
    fn a_failing_allocation_hides_the_whole_chunk_level_of_chunks_that_are_not_empty() {
        let p = Pool::new(PoolConfig::new(32 * MIB).cores(1).core_reserve(0).slab_sizes(Vec::new())).unwrap();
        let a = p.arena();
        // Every chunk full, without a failure.
        let blocks: Vec<usize> = (0..128).map(|_| p.alloc_raw(256 << 10, None).unwrap()).collect();
        let pool = &a.cores[0];
        let owned = |w: usize| pool.owned_word(w);
        let level_zero = || {
            let mut chunks = Vec::new();
            while let Some(c) = pool.maps.next(0, chunks.last().map_or(0, |&c: &usize| c + 1), &owned) {
                chunks.push(c);
            }
            chunks
        };
        assert_eq!(level_zero(), Vec::<usize>::new(), "the first block placed in a chunk granted hides the level");
        // A reveal sets every level of a chunk, the whole chunk's too.
        for chunk in pool.owned() {
            pool.maps.reveal(&a.lines[chunk].space, chunk);
        }
        assert_eq!(level_zero(), pool.owned().collect::<Vec<_>>(), "revealed chunks may serve the level");
        // Every other block of every chunk freed: no chunk is empty, none serves 2 MiB.
        for offset in blocks.iter().step_by(2) {
            p.free_raw(*offset, 256 << 10).unwrap();
        }
        assert!(p.alloc_raw(2 * MIB, None).is_err());
        assert_eq!(level_zero(), Vec::<usize>::new(), "no chunk that is not empty keeps level 0");
        // The blocks left in the first chunk freed: it is whole again and serves level 0.
        let first = blocks[0] / (2 * MIB);
        for offset in blocks.iter().skip(1).step_by(2).filter(|&&o| o / (2 * MIB) == first) {
            p.free_raw(*offset, 256 << 10).unwrap();
        }
        let whole = p.alloc_raw(2 * MIB, None).unwrap_or_else(|e| panic!("{e}"));
        p.free_raw(whole, 2 * MIB).unwrap();
        for offset in blocks.iter().skip(1).step_by(2).filter(|&&o| o / (2 * MIB) != first) {
            p.free_raw(*offset, 256 << 10).unwrap();
        }
        p.check().unwrap();
    }
}

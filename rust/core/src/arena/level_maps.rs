//! Per core and per tree level, which of the core's chunks may hold a free node of that level:
//! the summary that lets an allocation go straight to a chunk that can serve it instead of
//! searching the core's chunks in address order.
//!
//! # Shape
//!
//! For each level, one bit per chunk of the arena (64 chunks a word) and one summary bit per
//! word (set when the word may be non-zero), as the two-level bitmaps of TLSF. Finding the
//! lowest candidate chunk at or after a position reads one summary word per 4,096 chunks and
//! one bitmap word; the tables are lazily committed ([`Zeroed`]).
//!
//! # What a bit means
//!
//! A chunk's levels are monotone: a chunk with a free node at level `l` has free nodes at every
//! level below it in size (`l + 1`, ...). So a chunk's state is one threshold, and its bits are
//! kept *safely conservative*: a clear bit at level `l` means a search found no free node of
//! level `l` in the chunk and no free has happened there since; a set bit means there may be
//! one. A set bit costs at most one failed search (which clears it); a clear bit never hides
//! room, because every free re-sets the bits its release may have made servable.
//!
//! The chunk's [`ChunkSpace`] keeps the threshold `hidden`: bits of levels `>= hidden` are set,
//! bits below may be clear. A free reads it (one load on the line its own update just wrote)
//! and does nothing more unless its release reaches a hidden level.
//!
//! # Protocol
//!
//! *Hide* (a search at `level` found nothing, after a [`ChunkSpace::probe`]): raise `hidden` to
//! `level + 1` (refused when a free came since the probe), clear the chunk's bits of levels
//! `0..=level`, then ask whether a free came since the probe; if one did, set those bits again
//! (the search may have missed the freed nodes).
//!
//! *Announce* (after a free released its nodes; its epoch step also returned `hidden`): the
//! largest free node around the released block is at level `l`; while `hidden > l`, set the
//! bits of levels `l..hidden` and lower `hidden` to `l` with a compare-and-swap that also
//! requires the epoch to be the free's own (on failure, read it again and repeat). When the
//! epoch moved since, another free stepped in between and may have seen the threshold still
//! high (see *Take*): the announcement steps the epoch once more and goes on with that step's
//! epoch as its own.
//!
//! *Take* (an allocation took, by a claim made after reading its record, the node of level `l`
//! that a free recorded: `core_pool.rs`): if that free's announcement lowered the threshold
//! itself from above `l` with the epoch still its own, then until the next epoch step the node
//! was the only free node of level `l` or larger in the chunk (no other free had one: one that
//! stepped before it either left the threshold at most its own level, or had not finished its
//! announcement and steps again, after). The allocation then hides `l` as a miss does, with
//! that free's epoch as its probe: refused if any free came since, undone by the same handshake
//! if one comes meanwhile. So a take that empties a level leaves no stale bit.
//!
//! *Fill* (an allocation's count of its units left the chunk with none free,
//! `Arena::take_units`): it hides every level as a miss does, with the epoch its count read
//! as its probe. The count may read no free unit while a free has released its nodes and not
//! counted them yet; that free's epoch step comes after the probe, so the hide is refused or
//! undone, or the free announces the levels itself.
//!
//! A hide reads the chunk's word only by read-modify-write operations, so it and a free's epoch
//! step are ordered: either the hide sees the free's step (and undoes itself), or the free's
//! step reads what the hide wrote before (the raised threshold, then its cleared bits), and the
//! free sets the bits itself. The summary bits follow the same rule: a setter sets the word bit
//! then the summary bit; a scanner that finds a word empty clears the summary bit and reads the
//! word again with a read-modify-write, setting the summary bit back when it is not empty.
//!
//! The loom models in this module check these handshakes exhaustively.

use super::chunk_sets::ChunkSets;
use super::chunk_space::{ChunkSpace, Probe};
use crate::error::Result;

/// The per-level chunk bitmaps of one core.
pub(crate) struct LevelMaps {
    levels: usize,
    /// Set `level`: the chunks that may serve `level`.
    sets: ChunkSets,
}

impl LevelMaps {
    /// Empty maps over `chunks` chunks and `levels` tree levels; `Error::HostMemory` when the
    /// host has no room for them.
    pub(crate) fn new(chunks: usize, levels: usize) -> Result<LevelMaps> {
        Ok(LevelMaps { levels, sets: ChunkSets::new(chunks, levels, "a core pool's level bitmaps")? })
    }

    /// Bytes of its tables the host has committed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.sets.resident_bytes()
    }

    /// Whether chunk `chunk` may serve `level`.
    #[cfg(test)]
    pub(crate) fn may_serve(&self, level: u32, chunk: usize) -> bool {
        self.sets.contains(level as usize, chunk)
    }

    /// Mark chunk `chunk` as a candidate for `level`.
    #[inline]
    fn set(&self, level: usize, chunk: usize) {
        self.sets.insert(level, chunk);
    }

    #[inline]
    fn clear(&self, level: usize, chunk: usize) {
        self.sets.remove(level, chunk);
    }

    /// A chunk just granted to the core: it may serve every level.
    pub(crate) fn open(&self, space: &ChunkSpace, chunk: usize) {
        for level in 0..self.levels {
            self.set(level, chunk);
        }
        space.reset_hidden();
    }

    /// A chunk leaving the core: it serves nothing here.
    pub(crate) fn close(&self, chunk: usize) {
        for level in 0..self.levels {
            self.clear(level, chunk);
        }
    }

    /// A search at `level` (natural alignment) found nothing in `chunk` after `probe`.
    pub(crate) fn hide(&self, space: &ChunkSpace, chunk: usize, level: u32, probe: Probe) {
        if !space.raise_hidden(level + 1, probe) {
            return; // a free came meanwhile: the search may have missed its nodes
        }
        for l in 0..=level as usize {
            self.clear(l, chunk);
        }
        if space.moved_since(probe) {
            for l in 0..=level as usize {
                self.set(l, chunk);
            }
        }
    }

    /// A free left a free node at `level` in `chunk`, after its release and its epoch step,
    /// which made epoch `given` (`None` when the caller does not know it: the announcement then
    /// steps the epoch itself first). Returns whether it lowered the threshold itself, from
    /// above `level`, with the epoch still `given`: then, while the epoch stays `given`, the
    /// free's node of `level` is the only free node of that level or a larger one in the chunk,
    /// and the allocation that takes it may hide the level again (see *Take* above).
    pub(crate) fn announce(&self, space: &ChunkSpace, chunk: usize, level: u32, given: Option<Probe>) -> bool {
        let (mut epoch, mut own) = match given {
            Some(probe) => (probe, true),
            None => (space.step().1, false),
        };
        loop {
            let (hidden, now) = space.threshold();
            if now != epoch {
                // Another step since ours: a free after ours may count on the threshold it saw,
                // which this announcement lowers. A step of our own voids whatever it counts on.
                epoch = space.step().1;
                own = false;
                continue;
            }
            if hidden <= level {
                return false;
            }
            for l in level..hidden {
                self.set(l as usize, chunk);
            }
            if space.lower_hidden_at(epoch, hidden, level) {
                return own;
            }
        }
    }

    /// The last resort of a failed allocation (`reveal.rs`), after an epoch step on `space`:
    /// set the chunk's bits of every level, then lower the threshold to 0. Setting bits is
    /// always safe (a set bit costs at most one failed search), so this repairs whatever a
    /// miss left hidden, whatever the threshold says.
    #[cold]
    pub(crate) fn reveal(&self, space: &ChunkSpace, chunk: usize) {
        for level in 0..self.levels {
            self.set(level, chunk);
        }
        self.announce(space, chunk, 0, None);
    }

    /// The lowest chunk at or after `from` whose bit of `level` is set and that `owned` (a
    /// bitmap word of the core's owned chunks, by word index) keeps. Summary bits of empty
    /// words are cleared on the way.
    #[inline]
    pub(crate) fn next(&self, level: u32, from: usize, owned: &dyn Fn(usize) -> u64) -> Option<usize> {
        self.sets.next(level as usize, from, owned)
    }

    /// [`LevelMaps::next`] over the chunks whose largest free node may be of `level`: its bit
    /// of `level` set and of the level above clear (every chunk once over all levels), among
    /// the bitmap words that `words` lasts for below level 0 ([`ChunkSets::next_without`]).
    pub(crate) fn next_largest_at(
        &self,
        level: u32,
        from: usize,
        owned: &dyn Fn(usize) -> u64,
        words: &mut usize,
    ) -> Option<usize> {
        if level == 0 {
            return self.next(0, from, owned);
        }
        self.sets.next_without(level as usize, level as usize - 1, from, owned, words)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn all(_: usize) -> u64 {
        u64::MAX
    }

    #[test]
    fn next_finds_candidates_in_address_order_across_summary_words() {
        let maps = LevelMaps::new(10_000, 3).unwrap();
        let space = ChunkSpace::new(16);
        for chunk in [5, 64, 4_100, 9_999] {
            maps.open(&space, chunk);
        }
        let mut seen = Vec::new();
        let mut from = 0;
        while let Some(c) = maps.next(1, from, &all) {
            seen.push(c);
            from = c + 1;
        }
        assert_eq!(seen, vec![5, 64, 4_100, 9_999]);
        maps.close(64);
        assert_eq!(maps.next(2, 6, &all), Some(4_100));
        assert_eq!(maps.next(0, 4_101, &|w| if w == 9_999 / 64 { 0 } else { u64::MAX }), None, "not owned");
        // Chunk 5 hidden at levels 0 and 1: its largest free node is of level 2.
        let probe = space.probe(0).unwrap();
        maps.hide(&space, 5, 1, probe);
        let at = |level| {
            let (mut seen, mut from, mut plenty) = (Vec::new(), 0, usize::MAX);
            while let Some(c) = maps.next_largest_at(level, from, &all, &mut plenty) {
                seen.push(c);
                from = c + 1;
            }
            seen
        };
        assert_eq!((at(0), at(1), at(2)), (vec![4_100, 9_999], vec![], vec![5]));
        maps.close(4_100);
        maps.close(5);
        maps.close(9_999);
        assert_eq!(maps.next(0, 0, &all), None);
    }

    #[test]
    fn hide_and_announce_keep_the_threshold() {
        let maps = LevelMaps::new(64, 8).unwrap();
        let space = ChunkSpace::new(128);
        maps.open(&space, 3);
        let probe = space.probe(1).unwrap();
        maps.hide(&space, 3, 4, probe);
        for level in 0..8 {
            assert_eq!(maps.may_serve(level, 3), level > 4, "level {level}");
        }
        assert_eq!(space.hidden(), 5);
        maps.announce(&space, 3, 2, None);
        for level in 0..8 {
            assert_eq!(maps.may_serve(level, 3), level >= 2, "level {level}");
        }
        assert_eq!(space.hidden(), 2);
    }

    #[test]
    fn a_hide_after_a_free_it_did_not_see_is_undone() {
        let maps = LevelMaps::new(64, 4).unwrap();
        let space = ChunkSpace::new(128);
        maps.open(&space, 0);
        let probe = space.probe(1).unwrap();
        space.give(0); // a free between the probe and the hide
        maps.hide(&space, 0, 3, probe);
        assert!((0..4).all(|l| maps.may_serve(l, 0)));
    }

    /// A randomized comparison with a reference model: a chunk's true largest free level
    /// changes by hides (only true misses) and frees; a chunk whose true level serves a
    /// request is never skipped.
    #[test]
    fn never_hides_a_chunk_that_can_serve() {
        let levels = 10u32;
        let chunks = 300;
        let maps = LevelMaps::new(chunks, levels as usize).unwrap();
        let spaces: Vec<ChunkSpace> = (0..chunks).map(|_| ChunkSpace::new(1)).collect();
        // The reference: the level of each chunk's largest free node (levels = nothing free).
        let mut truth = vec![0u32; chunks];
        for (c, space) in spaces.iter().enumerate() {
            maps.open(space, c);
        }
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..50_000 {
            let c = next() as usize % chunks;
            let level = next() as u32 % levels;
            if next() % 2 == 0 {
                // An allocation at `level` in chunk c shrinks what it can serve; a search that
                // finds nothing hides it.
                let probe = spaces[c].probe(0).unwrap();
                if truth[c] > level {
                    maps.hide(&spaces[c], c, level, probe);
                } else if next() % 3 == 0 {
                    truth[c] = (truth[c] + 1).min(levels);
                }
            } else {
                // A free: the chunk's largest free node may grow, to `level` at most.
                let l = level.min(truth[c]);
                truth[c] = l;
                let (_, hidden, epoch) = spaces[c].give_stepped(0);
                if hidden > l {
                    maps.announce(&spaces[c], c, l, Some(epoch));
                }
            }
            let want = next() as u32 % levels;
            let first_true = (0..chunks).find(|&c| truth[c] <= want);
            if let Some(t) = first_true {
                let found = maps.next(want, 0, &all).expect("a chunk can serve");
                assert!(found <= t, "chunk {t} serves level {want} but the maps skip it");
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! The hide/free handshake against a real tree, and the summary's set/tidy race.
    use super::*;
    use crate::arena::buddy::{Node, TreeShape};
    use crate::arena::loom_chunk::tree_with;
    use crate::util::sync::AtomicU64;
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn a_miss_racing_a_free_never_hides_the_freed_block() {
        loom::model(|| {
            let shape = Arc::new(TreeShape::with_heights(2, 1, 1));
            let tree: Arc<Vec<AtomicU64>> = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
            let space = Arc::new(ChunkSpace::new(4));
            let maps = Arc::new(LevelMaps::new(1, 3).unwrap());
            maps.open(&space, 0);
            // Leaves 0 and 2 taken: two units free by count, but no free pair (level 1) until
            // leaf 0 comes back.
            for index in [0, 2] {
                shape.try_alloc(&tree, Node { level: 2, index }).unwrap();
                space.take(1);
            }
            let (s2, t2, sp2, m2) = (shape.clone(), tree.clone(), space.clone(), maps.clone());
            let freer = thread::spawn(move || {
                s2.release(&t2, Node { level: 2, index: 0 }).unwrap();
                // The largest free node around leaf 0 is now the pair (level 1).
                let (_, hidden, epoch) = sp2.give_stepped(1);
                if hidden > 1 {
                    m2.announce(&sp2, 0, 1, Some(epoch));
                }
            });
            if let Some(probe) = space.probe(2) {
                if shape.search(&tree, 1, 1, &mut |_| Ok(())).is_none() {
                    maps.hide(&space, 0, 1, probe);
                }
            }
            freer.join().unwrap();
            assert!(maps.may_serve(1, 0), "the maps hide a pair freed during the search");
            assert!(maps.next(1, 0, &|_| u64::MAX) == Some(0));
        });
    }

    /// The failing path's reclaim hides the whole-chunk level of a chunk whose free count says
    /// it is not empty (`reveal.rs`): that count, read with the epoch in one load, is the
    /// search. Racing the free of the chunk's last block, the level ends up visible.
    #[test]
    fn a_hide_by_the_free_count_racing_the_last_free_leaves_the_whole_chunk_visible() {
        loom::model(|| {
            let (shape, tree, space) = tree_with(2, &[Node { level: 1, index: 0 }]);
            let maps = Arc::new(LevelMaps::new(1, 3).unwrap());
            maps.open(&space, 0);
            let (s2, t2, sp2, m2) = (shape.clone(), tree.clone(), space.clone(), maps.clone());
            let freer = thread::spawn(move || {
                s2.release(&t2, Node { level: 1, index: 0 }).unwrap();
                // The block's buddy is free: the whole chunk (level 0) is free now.
                let (_, hidden, epoch) = sp2.give_stepped(2);
                if hidden > 0 {
                    m2.announce(&sp2, 0, 0, Some(epoch));
                }
            });
            let (free, probe) = space.look();
            if free != 4 {
                maps.hide(&space, 0, 0, probe);
            }
            freer.join().unwrap();
            assert!(maps.may_serve(0, 0), "the maps hide a chunk that the free emptied");
            assert_eq!(maps.next(0, 0, &|_| u64::MAX), Some(0));
        });
    }

    #[test]
    fn a_reveal_racing_a_miss_leaves_the_room_visible() {
        // Room came back that no free counted (a leaf bunch that a cleaner sealed for a moment,
        // here leaf 0 released without its epoch step): a search that missed it records the
        // miss in the bunch summary and the level maps, racing the last resort of a failed
        // allocation (an epoch step, summaries forgotten, every level revealed). Afterwards
        // both the maps and a summarized search find the pair.
        use crate::arena::buddy::{Conflict, Summary};
        loom::model(|| {
            let shape = Arc::new(TreeShape::with_heights(2, 2, 1));
            let words = shape.words();
            let tree: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
            let summaries: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
            let space = Arc::new(ChunkSpace::new(4));
            let maps = Arc::new(LevelMaps::new(1, 3).unwrap());
            maps.open(&space, 0);
            for index in [0, 2] {
                shape.try_alloc(&tree, Node { level: 2, index }).unwrap();
                space.take(1);
            }
            let probe = space.probe(0).unwrap();
            shape.release(&tree, Node { level: 2, index: 0 }).unwrap();
            let (sm2, sp2, m2) = (summaries.clone(), space.clone(), maps.clone());
            let revealer = thread::spawn(move || {
                sp2.refresh();
                TreeShape::reset_summaries(&sm2);
                m2.reveal(&sp2, 0);
            });
            // A stale search: it reads the tree as it was before leaf 0 came back.
            let moved = || space.moved_since(probe);
            let summary = Summary::new(&summaries, &moved);
            let _ = shape.search_summarized(&tree, &summary, 1, 1, None, &mut |_| Err(Conflict::Taken));
            maps.hide(&space, 0, 1, probe);
            revealer.join().unwrap();
            assert!(maps.next(1, 0, &|_| u64::MAX) == Some(0), "the maps hide the pair");
            let probe = space.probe(0).unwrap();
            let moved = || space.moved_since(probe);
            let summary = Summary::new(&summaries, &moved);
            let found = shape.search_summarized(&tree, &summary, 1, 1, None, &mut |n| shape.try_alloc(&tree, n));
            assert_eq!(found, Some(Node { level: 1, index: 0 }), "the summary hides the pair");
        });
    }

    #[test]
    fn two_misses_and_a_free_leave_the_free_level_visible() {
        loom::model(|| {
            let space = Arc::new(ChunkSpace::new(4));
            let maps = Arc::new(LevelMaps::new(1, 3).unwrap());
            maps.open(&space, 0);
            let probe = space.probe(1).unwrap();
            let (sp2, m2) = (space.clone(), maps.clone());
            let freer = thread::spawn(move || {
                let (_, hidden, epoch) = sp2.give_stepped(1);
                if hidden > 1 {
                    m2.announce(&sp2, 0, 1, Some(epoch));
                }
            });
            // Two stale misses (their probe predates the free).
            maps.hide(&space, 0, 2, probe);
            maps.hide(&space, 0, 1, probe);
            freer.join().unwrap();
            assert!(maps.may_serve(1, 0) && maps.may_serve(2, 0));
        });
    }

    /// One free of a leaf, racing a second free of a leaf in the same chunk whose node an
    /// allocation then takes through its record (every level hidden before: the chunk was
    /// full). The second free counts on its announcement to be the only free leaf there, and
    /// the take hides the leaf level with its epoch; the first free's leaf stays visible
    /// however the two frees' steps and announcements interleave.
    #[test]
    fn a_take_that_empties_a_level_never_hides_another_free() {
        loom::model(|| {
            let shape = Arc::new(TreeShape::with_heights(2, 1, 1));
            let tree: Arc<Vec<AtomicU64>> = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
            let space = Arc::new(ChunkSpace::new(4));
            let maps = Arc::new(LevelMaps::new(1, 3).unwrap());
            maps.open(&space, 0);
            for index in 0..4 {
                shape.try_alloc(&tree, Node { level: 2, index }).unwrap();
                space.take(1);
            }
            let probe = space.probe(0).unwrap();
            maps.hide(&space, 0, 2, probe);
            let free = |shape: &TreeShape, tree: &[AtomicU64], space: &ChunkSpace, maps: &LevelMaps, leaf: u64| {
                let node = Node { level: 2, index: leaf };
                shape.release(tree, node).unwrap();
                let (_, hidden, epoch) = space.give_stepped(1);
                let level = shape.coalesced_level(tree, node);
                (level < hidden && maps.announce(space, 0, level, Some(epoch)) && level == 2).then_some(epoch)
            };
            let (s2, t2, sp2, m2) = (shape.clone(), tree.clone(), space.clone(), maps.clone());
            let first = thread::spawn(move || {
                free(&s2, &t2, &sp2, &m2, 0);
            });
            let sole = free(&shape, &tree, &space, &maps, 2);
            // The record is read, then its node claimed, then the level hidden.
            shape.try_alloc(&tree, Node { level: 2, index: 2 }).unwrap();
            space.take(1);
            if let Some(epoch) = sole {
                maps.hide(&space, 0, 2, epoch);
            }
            first.join().unwrap();
            assert!(maps.may_serve(2, 0), "the maps hide the first free's leaf");
            assert!(maps.next(2, 0, &|_| u64::MAX) == Some(0));
        });
    }

    fn leaf(index: u64) -> Node {
        Node { level: 2, index }
    }

    /// A chunk of four units whose leaves 0, 1 and 2 are taken, and its owner's maps.
    #[allow(clippy::type_complexity)]
    fn three_leaves_taken() -> (Arc<TreeShape>, Arc<Vec<AtomicU64>>, Arc<ChunkSpace>, Arc<LevelMaps>) {
        let (shape, tree, space) = tree_with(2, &[leaf(0), leaf(1), leaf(2)]);
        let maps = Arc::new(LevelMaps::new(1, 3).unwrap());
        maps.open(&space, 0);
        (shape, tree, space, maps)
    }

    /// Count a claimed leaf taken, and hide every level when that left no unit free, as
    /// `Arena::take_units` does.
    fn take_leaf_hiding_when_full(space: &ChunkSpace, maps: &LevelMaps) {
        let (free, probe) = space.take(1);
        if free == 0 {
            maps.hide(space, 0, 2, probe);
        }
    }

    /// An allocation that leaves its chunk without a free unit hides every level, with the
    /// epoch its take read as its probe (`Arena::take_units`). Racing the free of another
    /// block of the chunk, the freed leaf ends up visible.
    #[test]
    fn a_take_that_fills_the_chunk_never_hides_a_racing_free() {
        loom::model(|| {
            let (shape, tree, space, maps) = three_leaves_taken();
            let (s2, t2, sp2, m2) = (shape.clone(), tree.clone(), space.clone(), maps.clone());
            let freer = thread::spawn(move || {
                s2.release(&t2, leaf(0)).unwrap();
                let (_, hidden, epoch) = sp2.give_stepped(1);
                let level = s2.coalesced_level(&t2, leaf(0));
                if level < hidden {
                    m2.announce(&sp2, 0, level, Some(epoch));
                }
            });
            shape.try_alloc(&tree, leaf(3)).unwrap();
            take_leaf_hiding_when_full(&space, &maps);
            freer.join().unwrap();
            assert!(maps.may_serve(2, 0), "the maps hide the leaf freed during the fill");
            assert_eq!(maps.next(2, 0, &|_| u64::MAX), Some(0));
        });
    }

    /// The same, with the allocation claiming the very leaf the free released before that free
    /// counted it: the count reads no free unit for a moment although leaf 3 is free. The
    /// hide it makes then is undone, and leaf 3 stays visible.
    #[test]
    fn a_take_of_a_leaf_freed_but_not_yet_counted_never_hides_the_other_free_leaf() {
        loom::model(|| {
            let (shape, tree, space, maps) = three_leaves_taken();
            let (s2, t2, sp2, m2) = (shape.clone(), tree.clone(), space.clone(), maps.clone());
            let freer = thread::spawn(move || {
                s2.release(&t2, leaf(0)).unwrap();
                let (_, hidden, epoch) = sp2.give_stepped(1);
                // The largest free node around leaf 0 when it was released: the leaf itself.
                if hidden > 2 {
                    m2.announce(&sp2, 0, 2, Some(epoch));
                }
            });
            // The allocation takes leaf 0 if the free released it already, else leaf 3.
            let taken = if shape.try_alloc(&tree, leaf(0)).is_ok() { 0 } else { 3 };
            if taken == 3 {
                shape.try_alloc(&tree, leaf(3)).unwrap();
            }
            take_leaf_hiding_when_full(&space, &maps);
            freer.join().unwrap();
            assert!(maps.may_serve(2, 0), "the maps hide the free leaf (the allocation took leaf {taken})");
            assert_eq!(maps.next(2, 0, &|_| u64::MAX), Some(0));
        });
    }

    #[test]
    fn a_tidy_racing_a_set_keeps_the_summary() {
        loom::model(|| {
            let space = Arc::new(ChunkSpace::new(4));
            let maps = Arc::new(LevelMaps::new(128, 1).unwrap());
            // Word 1 was seen empty by a scan that is about to tidy it, while chunk 70 opens.
            maps.open(&space, 70);
            maps.close(70);
            let (sp2, m2) = (space.clone(), maps.clone());
            let opener = thread::spawn(move || m2.open(&sp2, 70));
            let _ = maps.next(0, 0, &|_| u64::MAX);
            opener.join().unwrap();
            assert_eq!(maps.next(0, 0, &|_| u64::MAX), Some(70));
        });
    }
}

//! One pool per core: the set of chunks it owns (a bitmap over all chunks, so any thread can add
//! or drop one with a single atomic operation), a search hint per tree level (the chunk and
//! bunch of the last success or of the last local free of that size, so the next allocation of
//! that size usually finds room at once, and a search resumes there as a cursor), per level the
//! last few nodes that frees left entirely free (an allocation of that level takes one of them
//! with a claim and no search at all),
//! the few fully free chunks it keeps in reserve instead of giving them back (so a core that
//! empties and refills a chunk does not trade it with the global pool each time), and its level
//! maps: which of its chunks may serve which tree level (`level_maps.rs`).

use super::chunk_space::Probe;
use super::level_maps::LevelMaps;
use crate::config::MAX_TREE_DEPTH;
use crate::error::Result;
use crate::util::grow::try_boxed;
use crate::util::sync::{AtomicU64, Ordering};
use crate::util::zeroed::Zeroed;

/// Where a core's hint of a level points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hint {
    /// A bunch (of the level's band) where a search of that level last succeeded.
    Bunch(u64),
    /// The node of that level that a free of a block of that level last released (or the
    /// node its block started in).
    Freed(u64),
}

/// The hint word's flag for [`Hint::Freed`].
const FREED_NODE: u64 = 1 << 31;

/// Nodes a core's free-node record keeps per level (fewer under loom, whose atomics are larger,
/// so that a core pool fits the stack of a modelled thread).
const FREE_SLOTS: u64 = if cfg!(loom) { 4 } else { 32 };

/// The last [`FREE_SLOTS`] nodes of one level recorded as free, a ring of
/// `(chunk + 1) << 32 | index` (0 for an empty slot).
#[repr(align(128))]
struct FreeNodes {
    slots: [AtomicU64; FREE_SLOTS as usize],
    /// Per slot, when the free that recorded it left its node the only free node of that level
    /// or a larger one in the chunk (`LevelMaps::announce`): that free's `epoch << 32 |
    /// (chunk + 1)` (low 32 bits of the chunk); else 0. Written before the slot, read after it,
    /// and trusted only with the chunk of the slot (see [`CorePool::take_free`]).
    sole: [AtomicU64; FREE_SLOTS as usize],
}

/// The `sole` word of a record of `chunk` by a free whose epoch was `epoch`.
fn sole_word(chunk: usize, epoch: Option<Probe>) -> u64 {
    epoch.map_or(0, |e| (e.epoch() << 32) | ((chunk as u64 + 1) & 0xFFFF_FFFF))
}

/// The epoch in a `sole` word, if the word belongs to a record of `chunk`.
fn sole_epoch(word: u64, chunk: usize) -> Option<Probe> {
    (word != 0 && word & 0xFFFF_FFFF == (chunk as u64 + 1) & 0xFFFF_FFFF).then(|| Probe::of(word >> 32))
}

/// A record found by [`CorePool::free_holding`].
pub(crate) struct Held {
    /// The record's level.
    pub(crate) level: u32,
    top: u64,
    word: u64,
    /// As [`CorePool::take_free`]'s.
    pub(crate) sole: Option<Probe>,
}

pub(crate) struct CorePool {
    /// One bit per chunk of the arena (lazily committed: see `util/zeroed.rs`).
    owned: Zeroed<AtomicU64>,
    /// Per level: `(chunk + 1) << 32 | bunch`, or `(chunk + 1) << 32 | FREED_NODE | index` (see
    /// [`Hint`]), 0 meaning no hint. Inline, so that it shares the
    /// padded lines of this core only: a hint is written on most allocations and local frees.
    hints: [AtomicU64; MAX_TREE_DEPTH as usize + 1],
    /// Per level: how many nodes were ever recorded in `free_nodes` less how many were taken
    /// out (wrapping); the newest is in slot `(tops[level] - 1) % FREE_SLOTS`.
    tops: [AtomicU64; MAX_TREE_DEPTH as usize + 1],
    /// Per level, the nodes of this core's chunks that a free or a split left entirely free
    /// most recently: where an allocation of that level (or a smaller one, split off) looks
    /// before it searches. Advisory, as the hints: a node taken since fails its claim and is
    /// dropped, a node overwritten is only found by a search.
    free_nodes: [FreeNodes; MAX_TREE_DEPTH as usize + 1],
    /// Reserve slots: `chunk + 1`, or 0 for an empty slot.
    reserve: Box<[AtomicU64]>,
    /// Per level, the chunks that may hold a free node of that level.
    pub(crate) maps: LevelMaps,
}

impl CorePool {
    /// A core pool over `chunks` chunks, owning none; `Error::HostMemory` when the host has no
    /// room for its tables.
    pub(crate) fn new(chunks: usize, levels: usize, reserve: usize) -> Result<CorePool> {
        assert!(levels <= MAX_TREE_DEPTH as usize + 1, "a tree has at most MAX_TREE_DEPTH + 1 levels");
        Ok(CorePool {
            owned: Zeroed::new(chunks.div_ceil(64), "a core pool's chunk bitmap")?,
            hints: std::array::from_fn(|_| AtomicU64::new(0)),
            tops: std::array::from_fn(|_| AtomicU64::new(0)),
            free_nodes: std::array::from_fn(|_| FreeNodes {
                slots: std::array::from_fn(|_| AtomicU64::new(0)),
                sole: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
            reserve: try_boxed(reserve, "a core pool's reserve slots", |_| AtomicU64::new(0))?,
            maps: LevelMaps::new(chunks, levels)?,
        })
    }

    /// Bytes of its chunk bitmap the host has committed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.owned.resident_bytes() + self.maps.resident_bytes()
    }

    pub(crate) fn own(&self, chunk: usize) {
        self.owned[chunk / 64].fetch_or(1 << (chunk % 64), Ordering::AcqRel);
    }

    pub(crate) fn disown(&self, chunk: usize) {
        self.owned[chunk / 64].fetch_and(!(1 << (chunk % 64)), Ordering::AcqRel);
    }

    /// Word `w` of the owned-chunk bitmap (chunks `64 * w ..`); 0 past the end.
    #[inline]
    pub(crate) fn owned_word(&self, w: usize) -> u64 {
        self.owned.get(w).map_or(0, |word| word.load(Ordering::Acquire))
    }

    pub(crate) fn owns(&self, chunk: usize) -> bool {
        self.owned[chunk / 64].load(Ordering::Acquire) & (1 << (chunk % 64)) != 0
    }

    /// How many chunks the core owns, a word at a time.
    pub(crate) fn owned_count(&self) -> usize {
        self.owned.iter().map(|word| word.load(Ordering::Acquire).count_ones() as usize).sum()
    }

    /// The owned chunks in address order.
    pub(crate) fn owned(&self) -> impl Iterator<Item = usize> + '_ {
        self.owned.iter().enumerate().flat_map(|(w, word)| {
            let mut bits = word.load(Ordering::Acquire);
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    w * 64 + b
                })
            })
        })
    }

    #[inline]
    pub(crate) fn hint(&self, level: u32) -> Option<(usize, Hint)> {
        let h = self.hints[level as usize].load(Ordering::Relaxed);
        (h != 0).then(|| {
            let value = h & 0x7FFF_FFFF;
            let hint = if h & FREED_NODE != 0 { Hint::Freed(value) } else { Hint::Bunch(value) };
            ((h >> 32) as usize - 1, hint)
        })
    }

    /// Point the hint of `level` at bunch `bunch` of `chunk` (where a search just succeeded).
    #[inline]
    pub(crate) fn set_hint(&self, level: u32, chunk: usize, bunch: u64) {
        self.store_hint(level, ((chunk as u64 + 1) << 32) | bunch);
    }

    /// Point the hint of `level` at node `index` of `chunk`, which a free just released.
    #[inline]
    pub(crate) fn set_hint_freed(&self, level: u32, chunk: usize, index: u64) {
        self.store_hint(level, ((chunk as u64 + 1) << 32) | FREED_NODE | index);
    }

    #[inline]
    fn store_hint(&self, level: u32, h: u64) {
        if self.hints[level as usize].load(Ordering::Relaxed) != h {
            self.hints[level as usize].store(h, Ordering::Relaxed);
        }
    }

    /// Record node `index` of `level` in `chunk` as entirely free (over the oldest record of
    /// that level when all slots are taken), with the epoch of the free that left it the only
    /// free node of its level or a larger one in the chunk, if it did. Plain stores: a record is
    /// only a place to try (the `sole` word is stored with `Release`, after the free's epoch
    /// step, so that a take that reads it comes after that step).
    #[inline]
    pub(crate) fn record_free(&self, level: u32, chunk: usize, index: u64, sole: Option<Probe>) {
        let top = &self.tops[level as usize];
        let t = top.load(Ordering::Relaxed);
        let nodes = &self.free_nodes[level as usize];
        let i = (t % FREE_SLOTS) as usize;
        nodes.sole[i].store(sole_word(chunk, sole), Ordering::Release);
        nodes.slots[i].store(((chunk as u64 + 1) << 32) | index, Ordering::Relaxed);
        top.store(t.wrapping_add(1), Ordering::Relaxed);
    }

    /// Take out the newest free node recorded at `level`: `(chunk, index, sole)`, `sole` the
    /// epoch of a free that left the node the only free node of its level or a larger one in
    /// the chunk. The `sole` word is read after the slot and may belong to another record of
    /// the same chunk (two frees that record at once): an allocation that takes the node
    /// after this read, while the chunk's epoch is still that epoch, still takes the only such
    /// node (the other record's node, if free, was free at that free's step: it is the same
    /// node).
    #[inline]
    pub(crate) fn take_free(&self, level: u32) -> Option<(usize, u64, Option<Probe>)> {
        let top = &self.tops[level as usize];
        let t = top.load(Ordering::Relaxed).wrapping_sub(1);
        let nodes = &self.free_nodes[level as usize];
        let i = (t % FREE_SLOTS) as usize;
        let h = nodes.slots[i].load(Ordering::Relaxed);
        if h == 0 {
            return None;
        }
        let chunk = (h >> 32) as usize - 1;
        let sole = sole_epoch(nodes.sole[i].load(Ordering::Acquire), chunk);
        nodes.slots[i].store(0, Ordering::Relaxed);
        top.store(t, Ordering::Relaxed);
        Some((chunk, h & 0xFFFF_FFFF, sole))
    }

    /// The newest free node recorded at `level`, if it is node `index` of `chunk` or holds it
    /// (`index` at level `inner`, at or below `level`): the record that a node taken otherwise
    /// than through it (the hint of a free) leaves stale. Read before that node is claimed:
    /// its `sole` epoch is then as good as [`CorePool::take_free`]'s.
    #[inline]
    pub(crate) fn free_holding(&self, level: u32, chunk: usize, inner: u32, index: u64) -> Option<Held> {
        let t = self.tops[level as usize].load(Ordering::Relaxed).wrapping_sub(1);
        let nodes = &self.free_nodes[level as usize];
        let i = (t % FREE_SLOTS) as usize;
        let h = nodes.slots[i].load(Ordering::Relaxed);
        if h == 0 || h != ((chunk as u64 + 1) << 32) | (index >> (inner - level)) {
            return None;
        }
        let sole = sole_epoch(nodes.sole[i].load(Ordering::Acquire), chunk);
        Some(Held { level, top: t, word: h, sole })
    }

    /// Drop the record [`CorePool::free_holding`] found, unless it changed since.
    #[inline]
    pub(crate) fn drop_held(&self, held: &Held) {
        let slot = &self.free_nodes[held.level as usize].slots[(held.top % FREE_SLOTS) as usize];
        if slot.load(Ordering::Relaxed) == held.word {
            slot.store(0, Ordering::Relaxed);
            self.tops[held.level as usize].store(held.top, Ordering::Relaxed);
        }
    }

    /// `chunk` just became empty: keep it in reserve if it is already there or a slot is free
    /// (or holds a chunk that is no longer a reserve: refilled, or given away). `still_reserve`
    /// tells whether a slot's chunk is still an empty chunk of this core. `false`: retire it.
    pub(crate) fn keep_in_reserve(&self, chunk: usize, still_reserve: impl Fn(usize) -> bool) -> bool {
        let tag = chunk as u64 + 1;
        if self.reserve.iter().any(|slot| slot.load(Ordering::Acquire) == tag) {
            return true;
        }
        for slot in self.reserve.iter() {
            let held = slot.load(Ordering::Acquire);
            if (held == 0 || !still_reserve(held as usize - 1))
                && slot.compare_exchange(held, tag, Ordering::AcqRel, Ordering::Acquire).is_ok()
            {
                return true;
            }
        }
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn owned_iteration_wraps_from_a_start() {
        let c = CorePool::new(200, 14, 1).unwrap();
        for chunk in [3, 64, 70, 130, 199] {
            c.own(chunk);
        }
        assert_eq!(c.owned().collect::<Vec<_>>(), vec![3, 64, 70, 130, 199]);
        c.disown(70);
        assert!(!c.owns(70) && c.owns(64));
        assert_eq!(CorePool::new(0, 1, 1).unwrap().owned().count(), 0);
    }

    #[test]
    fn reserve_keeps_a_few_empty_chunks() {
        let c = CorePool::new(10, 14, 2).unwrap();
        let empty = |chunk: usize| chunk != 3; // chunk 3 got refilled
        assert!(c.keep_in_reserve(3, empty));
        assert!(c.keep_in_reserve(5, empty));
        assert!(c.keep_in_reserve(5, empty), "already in reserve");
        assert!(c.keep_in_reserve(7, empty), "replaces chunk 3, which is no longer empty");
        assert!(!c.keep_in_reserve(8, empty), "both slots hold empty chunks");
        assert!(!CorePool::new(10, 14, 0).unwrap().keep_in_reserve(1, empty));
    }

    #[test]
    fn free_records_are_taken_newest_first_and_keep_the_last_few() {
        let c = CorePool::new(10, 14, 1).unwrap();
        assert_eq!(c.take_free(3), None);
        c.record_free(3, 2, 5, None);
        c.record_free(3, 9, 1, None);
        c.record_free(4, 7, 0, None);
        let node = |taken: Option<(usize, u64, Option<Probe>)>| taken.map(|(chunk, index, _)| (chunk, index));
        assert_eq!(node(c.take_free(3)), Some((9, 1)));
        assert_eq!(node(c.take_free(3)), Some((2, 5)));
        assert_eq!(node(c.take_free(3)), None);
        assert_eq!(node(c.take_free(4)), Some((7, 0)));
        for i in 0..FREE_SLOTS + 3 {
            c.record_free(6, 1, i, None);
        }
        let kept: Vec<u64> = std::iter::from_fn(|| c.take_free(6).map(|(_, i, _)| i)).collect();
        assert_eq!(kept, (3..FREE_SLOTS + 3).rev().collect::<Vec<_>>(), "the oldest records were overwritten");
    }

    #[test]
    fn hints_round_trip() {
        let c = CorePool::new(10, 14, 1).unwrap();
        assert_eq!(c.hint(5), None);
        c.set_hint(5, 0, 0);
        assert_eq!(c.hint(5), Some((0, Hint::Bunch(0))));
        c.set_hint(5, 9, 255);
        assert_eq!(c.hint(5), Some((9, Hint::Bunch(255))));
        c.set_hint_freed(5, 9, 31);
        assert_eq!(c.hint(5), Some((9, Hint::Freed(31))));
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! Two chunks of one core become empty at once with one reserve slot, whose chunk was
    //! refilled: exactly one of them is kept, the other goes back (is retired). And a core's
    //! level maps hiding a chunk that is short of units, racing the free that fills it up.
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn one_free_slot_keeps_exactly_one_of_two_emptied_chunks() {
        loom::model(|| {
            let c = Arc::new(CorePool::new(16, 4, 1).unwrap());
            let refilled = |chunk: usize| chunk != 3;
            assert!(c.keep_in_reserve(3, |_| true));
            let c2 = c.clone();
            let other = thread::spawn(move || c2.keep_in_reserve(5, refilled));
            let mine = c.keep_in_reserve(7, refilled);
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "kept 5: {theirs}, kept 7: {mine}");
            let kept = if mine { 7 } else { 5 };
            assert!(c.keep_in_reserve(kept, refilled), "the kept chunk is in the slot");
        });
    }

    #[test]
    fn owning_and_disowning_neighbours_never_lose_a_bit() {
        loom::model(|| {
            let c = Arc::new(CorePool::new(64, 4, 1).unwrap());
            c.own(1);
            let c2 = c.clone();
            let other = thread::spawn(move || c2.own(2));
            c.disown(1);
            other.join().unwrap();
            assert_eq!(c.owned().collect::<Vec<_>>(), vec![2]);
        });
    }

    #[test]
    fn a_take_through_a_record_racing_two_frees_never_hides_a_free_leaf() {
        // Two frees of leaves of one full chunk (every level hidden) record their leaves,
        // racing an allocation that takes the newest record it finds, claims its leaf and, when
        // the record says its free left the only free leaf, hides the leaf level: a leaf that
        // stays free stays visible, however the records' words are read.
        use crate::arena::buddy::{Node, TreeShape};
        use crate::arena::chunk_space::ChunkSpace;
        use crate::util::sync::AtomicU64;
        loom::model(|| {
            let shape = Arc::new(TreeShape::with_heights(2, 1, 1));
            let tree: Arc<Vec<AtomicU64>> = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
            let space = Arc::new(ChunkSpace::new(4));
            let core = Arc::new(CorePool::new(1, 3, 1).unwrap());
            core.maps.open(&space, 0);
            for index in 0..4 {
                shape.try_alloc(&tree, Node { level: 2, index }).unwrap();
                space.take(1);
            }
            core.maps.hide(&space, 0, 2, space.probe(0).unwrap());
            let free = |shape: &TreeShape, tree: &[AtomicU64], space: &ChunkSpace, core: &CorePool, leaf: u64| {
                let node = Node { level: 2, index: leaf };
                shape.release(tree, node).unwrap();
                let (_, hidden, epoch) = space.give_stepped(1);
                let level = shape.coalesced_level(tree, node);
                let sole = level < hidden && core.maps.announce(space, 0, level, Some(epoch));
                core.record_free(level, 0, leaf >> (2 - level), sole.then_some(epoch));
            };
            let (s2, t2, sp2, c2) = (shape.clone(), tree.clone(), space.clone(), core.clone());
            let other = thread::spawn(move || free(&s2, &t2, &sp2, &c2, 0));
            free(&shape, &tree, &space, &core, 2);
            if let Some((chunk, index, sole)) = core.take_free(2) {
                if shape.try_alloc(&tree, Node { level: 2, index }).is_ok() {
                    space.take(1);
                    if let Some(epoch) = sole {
                        core.maps.hide(&space, chunk, 2, epoch);
                    }
                }
            }
            other.join().unwrap();
            let free_leaf = [0, 2].iter().any(|&index| !shape.is_allocated(&tree, Node { level: 2, index }));
            assert!(!free_leaf || core.maps.may_serve(2, 0), "a free leaf is hidden");
        });
    }

    #[test]
    fn a_hide_for_want_of_units_racing_a_free_never_hides_the_freed_block() {
        // A chunk hidden because it has fewer free units than a block (as an allocation hides
        // one when it meets it in the level maps), racing the free that gives it the room: the
        // free's announcement or the hide's refusal keeps the room visible.
        use crate::arena::buddy::{Node, TreeShape};
        use crate::arena::chunk_space::ChunkSpace;
        use crate::util::sync::AtomicU64;
        loom::model(|| {
            let shape = Arc::new(TreeShape::with_heights(2, 1, 1));
            let tree: Arc<Vec<AtomicU64>> = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
            let space = Arc::new(ChunkSpace::new(4));
            let maps = Arc::new(LevelMaps::new(1, 3).unwrap());
            maps.open(&space, 0);
            // The whole chunk taken as one pair and two leaves: no unit free.
            for node in [Node { level: 1, index: 0 }, Node { level: 2, index: 2 }, Node { level: 2, index: 3 }] {
                shape.try_alloc(&tree, node).unwrap();
            }
            space.take(4);
            let (s2, t2, sp2, m2) = (shape.clone(), tree.clone(), space.clone(), maps.clone());
            let freer = thread::spawn(move || {
                let pair = Node { level: 1, index: 0 };
                s2.release(&t2, pair).unwrap();
                // The largest free node around the pair is the pair itself (level 1).
                let (_, hidden, epoch) = sp2.give_stepped(2);
                if hidden > s2.coalesced_level(&t2, pair) {
                    m2.announce(&sp2, 0, s2.coalesced_level(&t2, pair), Some(epoch));
                }
            });
            // An allocation of a pair (two units) reads the chunk's count.
            let (free_units, probe) = space.look();
            if free_units < 2 {
                maps.hide(&space, 0, 1, probe);
            }
            freer.join().unwrap();
            assert!(maps.may_serve(1, 0), "the maps hide a pair freed while the chunk was full");
        });
    }
}

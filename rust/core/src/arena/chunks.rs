//! The chunk life cycle, in one place: a chunk is *granted* from the global pool to a core
//! (its buddy tree opened), serves that core's buddy blocks, and is *retired* back to the
//! global pool once empty (its tree closed again); *reclaiming* retires every empty chunk that
//! cores hold. `Pool::trim` and the allocation's last resort reclaim; a compaction grants and
//! retires exact chunks.
//!
//! Chunks in the global pool have their buddy tree *retired*: the nodes covering the chunk are
//! marked allocated, so a thread that still holds a stale hint to the chunk fails its climb and
//! never places a block in a chunk that is now part of a run. Granting a chunk releases those
//! nodes; retiring one allocates them, which succeeds only while the chunk is empty.
//!
//! A chunk that was never granted is *pristine*: its tree and free-space word are all zero, as
//! the host handed them out, and the host commits no memory for them. No hint or owner bitmap
//! names such a chunk (only a grant puts a chunk in an owner bitmap, and a hint follows), so
//! nothing searches its all-free tree; a run may use it and give it back pristine. Its first
//! grant sets its free-space word instead of releasing retire nodes.

use super::arena::Arena;
use super::buddy::{Node, TreeShape};
use super::chunk_space::Probe;
use super::global::ChunkState;
use super::slab::caches::SlabBlocks;
use crate::util::sync::Ordering;
use crate::util::zeroed::back_with_writes;

impl Arena {
    /// Take a free chunk from the global pool for core `core` (one that can hold a node of
    /// `bytes` bytes).
    pub(crate) fn grant(&self, core: usize, bytes: usize) -> Option<usize> {
        let chunk = self.global.claim_grant(&self.geometry, bytes, &|before| self.keeps_front_room(before))?;
        self.open(chunk, core);
        Some(chunk)
    }

    /// Grant free chunk `chunk` to core `owner` (as an allocation would, but this very chunk);
    /// `false` (and no change) if it is not free.
    pub(crate) fn grant_exact(&self, chunk: usize, owner: usize) -> bool {
        if chunk >= self.geometry.chunks || !self.global.try_take(chunk, 1) {
            return false;
        }
        self.open(chunk, owner);
        true
    }

    /// Hand chunk `chunk`, just taken from the global pool, to core `owner`: its tree opens.
    pub(crate) fn open(&self, chunk: usize, owner: usize) {
        let space = &self.lines[chunk].space;
        self.opened_to.fetch_max(chunk + 1, Ordering::AcqRel);
        if space.is_pristine() {
            // Its tree is all free already; its word is set before the core can search it. Its
            // tree, summaries and slab directory entries are written before their first read
            // (see `back_with_writes`).
            back_with_writes(self.tree(chunk));
            back_with_writes(self.summaries(chunk));
            self.slabs.back_directory(self.geometry.offset_of(chunk, 0), self.geometry.chunk_bytes(chunk));
            space.init(self.geometry.usable_units(chunk));
            self.cores[owner].maps.open(space, chunk);
            self.global.set_state(chunk, ChunkState::Core(owner));
            self.cores[owner].own(chunk);
            self.know_stretch_of_opened(chunk);
            return;
        }
        self.global.set_state(chunk, ChunkState::Core(owner));
        self.cores[owner].own(chunk);
        let tree = self.tree(chunk);
        for node in self.retire_nodes(chunk) {
            self.shape.release(tree, node).expect("a chunk in the global pool is retired");
        }
        TreeShape::reset_summaries(self.summaries(chunk));
        self.lines[chunk].space.refresh();
        self.stretch_classes.mark_unsure(chunk);
        self.cores[owner].maps.open(&self.lines[chunk].space, chunk);
        self.know_stretch_of_opened(chunk);
    }

    /// Hide level 0 (the whole chunk) in the maps of `owner`, its owner, when chunk `chunk` is
    /// not empty. A grant sets every level of the chunk's bits, and few allocations search
    /// level 0, so the bit would otherwise stay set, and every failing allocation's reclaim
    /// (`Arena::reclaim_empty_mapped`) would read the chunk to hide it. The hide is a miss's
    /// (`LevelMaps::hide`): a free since the look undoes it.
    pub(crate) fn hide_whole_chunk(&self, chunk: usize, owner: usize) {
        let space = &self.lines[chunk].space;
        let (free, probe) = space.look();
        if free != self.geometry.usable_units(chunk) {
            self.cores[owner].maps.hide(space, chunk, 0, probe);
        }
    }

    /// Count `units` of core chunk `chunk` as allocated, after their tree nodes were claimed
    /// (every allocation path counts them so); returns what [`ChunkSpace::take`] returns.
    /// When no unit is left free, every level of the chunk is hidden from its owner's searches
    /// at once ([`Arena::hide_full`]).
    ///
    /// [`ChunkSpace::take`]: super::chunk_space::ChunkSpace::take
    #[inline]
    pub(crate) fn take_units(&self, chunk: usize, units: u64) -> (u64, Probe) {
        let after = self.lines[chunk].space.take(units);
        if after.0 == 0 {
            self.hide_full(chunk, after.1);
        }
        after
    }

    /// Hide every level of core chunk `chunk`, which an allocation has just left without a
    /// free unit at epoch `probe`, in its owner's maps: a miss of the smallest level
    /// (`LevelMaps::hide`), which a free since `probe` undoes and any later free re-announces.
    /// Allocations never clear a bit themselves (only a search that finds nothing does), so
    /// after a fill with large blocks every full chunk still looked as if it held small
    /// blocks: the first small request read each one's line to hide it, with the GIL held
    /// through the quick attempt of the Python binding (1.6 ms on a full 16 GiB pool, 8 ms at
    /// 64 GiB). Nothing happens when the levels are hidden already.
    #[cold]
    #[inline(never)]
    fn hide_full(&self, chunk: usize, probe: Probe) {
        let depth = self.geometry.depth;
        let space = &self.lines[chunk].space;
        if space.hidden() > depth {
            return;
        }
        if let ChunkState::Core(owner) = self.global.state(chunk) {
            self.cores[owner].maps.hide(space, chunk, depth, probe);
        }
    }

    /// Give an empty chunk of `owner` back to the global pool; `false` if it is not empty (or
    /// someone else is retiring it).
    pub(crate) fn retire(&self, chunk: usize, owner: usize) -> bool {
        let tree = self.tree(chunk);
        // Coalescing is lazy: clear the marks of emptied bunches so the cover nodes fit.
        self.shape.sweep(tree);
        let nodes = self.retire_nodes(chunk);
        // The nodes were held for a moment: a search may have hidden their levels meanwhile.
        let give_back = |taken: &[Node]| {
            for &n in taken {
                let _ = self.shape.release(tree, n);
            }
            let hidden = self.lines[chunk].space.refresh();
            self.announce_free(chunk, hidden, taken.iter().copied());
        };
        for (i, &node) in nodes.iter().enumerate() {
            if self.shape.try_alloc(tree, node).is_err() {
                give_back(&nodes[..i]);
                return false;
            }
        }
        // A caller read `owner` before it called: meanwhile another caller may have retired the
        // chunk and a grant given it to a core again. That grant set the chunk's state before it
        // released the nodes just taken, so the state read now names the chunk's owner; a chunk
        // that is another core's now stays with it (retiring it would leave it in that core's
        // bitmap while the global pool counts it free).
        if self.global.state(chunk) != ChunkState::Core(owner) {
            give_back(&nodes);
            return false;
        }
        self.cores[owner].disown(chunk);
        self.cores[owner].maps.close(chunk);
        self.global.set_state(chunk, ChunkState::Free);
        self.global.release(chunk, 1);
        true
    }

    /// [`Arena::retire`] after a thorough sweep (`TreeShape::sweep_all`: orphan marks would
    /// make it fail). For a paused pool.
    pub(crate) fn retire_swept(&self, chunk: usize, owner: usize) -> bool {
        self.shape.sweep_all(self.tree(chunk));
        self.retire(chunk, owner)
    }

    /// A chunk of a core became empty: it stays as the core's reserve, or goes back.
    pub(crate) fn chunk_became_empty(&self, chunk: usize) {
        if let ChunkState::Core(owner) = self.global.state(chunk) {
            let still_reserve = |c: usize| self.global.state(c) == ChunkState::Core(owner) && self.chunk_is_empty(c);
            if !self.cores[owner].keep_in_reserve(chunk, still_reserve) {
                self.retire(chunk, owner);
            }
        }
    }

    /// Retire every empty chunk that cores hold (reserves included); `swept`: after a thorough
    /// sweep each (a paused pool, where a compaction wants whole free runs). Returns how many
    /// went back.
    pub(crate) fn reclaim_empty_chunks(&self, swept: bool) -> usize {
        let mut reclaimed = 0;
        for owner in 0..self.cores.len() {
            let owned: Vec<usize> = self.cores[owner].owned().collect();
            for chunk in owned {
                let retired = match swept {
                    true => self.chunk_is_empty(chunk) && self.retire_swept(chunk, owner),
                    false => self.chunk_is_empty(chunk) && self.retire(chunk, owner),
                };
                if retired {
                    reclaimed += 1;
                }
            }
        }
        reclaimed
    }

    /// Every empty chunk that cores hold, after a thorough sweep (see `reclaim_empty_chunks`).
    pub(crate) fn retire_empty_chunks(&self) -> usize {
        self.reclaim_empty_chunks(true)
    }

    /// What an allocation does before it fails, and a compaction after its batches, on a paused
    /// pool: all-free slabs and empty chunks go back. Returns how many chunks went.
    pub(crate) fn reclaim_all(&self) -> usize {
        self.slabs.reclaim(self as &dyn SlabBlocks);
        self.retire_empty_chunks()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::arena::global::ChunkState;
    use crate::config::{Backing, PoolConfig};
    use crate::pool::pool::Pool;

    /// A caller that read a chunk's owner, then found it empty after another caller retired it
    /// and a grant gave it to another core, leaves it with that core: the state and the owner's
    /// bitmap keep agreeing, and the new owner retires it later.
    #[test]
    fn a_retirer_that_read_an_earlier_owner_leaves_the_chunk_to_its_new_one() {
        let p = Pool::new(PoolConfig::new(8 << 20).cores(2).core_reserve(0).backing(Backing::None)).unwrap();
        let a = p.arena();
        assert!(a.grant_exact(1, 1));
        assert!(a.retire(1, 1), "an empty chunk goes back");
        assert!(a.grant_exact(1, 0));
        assert!(!a.retire(1, 1), "core 1 owns it no longer");
        assert_eq!(a.global.state(1), ChunkState::Core(0));
        assert!(a.cores[0].owned().any(|c| c == 1) && !a.cores[1].owned().any(|c| c == 1));
        assert_eq!(p.check().unwrap(), 0);
        assert!(a.retire(1, 0), "its owner gives it back");
        assert_eq!(a.global.state(1), ChunkState::Free);
        assert_eq!(p.check().unwrap(), 0);
    }

    /// A chunk that allocations leave without a free unit is hidden at every level of its
    /// owner's maps, so that no search reads it, until a free there shows it again.
    #[test]
    fn a_chunk_left_full_is_hidden_from_every_search_until_a_free() {
        let p = Pool::new(PoolConfig::new(64 << 20).cores(2).backing(Backing::None)).unwrap();
        let a = p.arena();
        let depth = a.geometry.depth;
        let blocks = p.alloc_many(&[1 << 20; 64], None, 0).unwrap();
        let shown = |level: u32| -> Vec<usize> {
            a.cores.iter().flat_map(|pool| pool.owned().filter(move |&c| pool.maps.may_serve(level, c))).collect()
        };
        for level in 0..=depth {
            assert_eq!(shown(level), Vec::<usize>::new(), "full chunks a search of level {level} would read");
        }
        let freed = blocks[10];
        let chunk = p.block(freed).unwrap().offset / a.geometry.chunk_size;
        p.free(freed).unwrap();
        assert!(shown(depth).contains(&chunk), "the free showed its chunk again");
        let again = p.alloc_raw(4096, None).unwrap();
        assert_eq!(again / a.geometry.chunk_size, chunk, "a small block goes where the free made room");
        p.free_raw(again, 4096).unwrap();
        assert_eq!(p.check().unwrap(), 63);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! The chunk life cycle on an arena of four chunks of 16 units each: retires against a
    //! retire and a regrant and against a claim through a stale hint, two frees that empty a
    //! chunk, and a free against a claim of its own nodes. After every interleaving a chunk's
    //! state, its owners' bitmaps, the global pool's bitmap and its tree agree; a chunk is
    //! retired once, never under a block, and never from a core it was regranted from.
    use crate::arena::arena::Arena;
    use crate::arena::buddy::Node;
    use crate::arena::global::ChunkState;
    use crate::arena::release::Vouched;
    use crate::arena::slab::caches::SlabClasses;
    use crate::config::{Backing, PoolConfig};
    use loom::sync::Arc;
    use loom::thread;

    fn tiny_arena() -> Arc<Arena> {
        let config = PoolConfig::new(4 * 4096)
            .chunk_size(4096)
            .min_block(256)
            .bank_size(1024)
            .slab_sizes(vec![])
            .cores(2)
            .core_reserve(0)
            .run_tails(false)
            .backing(Backing::None);
        let classes = SlabClasses::of(&config);
        Arc::new(Arena::new(&config, classes).unwrap())
    }

    /// Allocate `node` of chunk `chunk` as the allocation path does: claim it in the tree, then
    /// count its units taken. `false` when it is not free.
    fn claim(a: &Arena, chunk: usize, node: Node) -> bool {
        let claimed = a.shape.try_alloc(a.tree(chunk), node).is_ok();
        if claimed {
            a.lines[chunk].space.take(node.units(a.geometry.depth));
        }
        claimed
    }

    /// The offset and size of `node` of chunk `chunk`, as a block.
    fn block(a: &Arena, chunk: usize, node: Node) -> (usize, usize) {
        let depth = a.geometry.depth;
        (a.geometry.offset_of(chunk, node.start(depth)), node.units(depth) as usize * a.geometry.min_block)
    }

    /// The two halves of chunk `chunk`.
    fn halves(a: &Arena, chunk: usize) -> [Node; 2] {
        let whole = a.retire_nodes(chunk)[0];
        [0, 1].map(|i| Node { level: whole.level + 1, index: whole.index * 2 + i })
    }

    /// The chunk's state, its owners' bitmaps, the global bitmap and its tree say the same: a
    /// core chunk is in its owner's bitmap alone and its tree is open and empty; a free chunk is
    /// in no bitmap, free in the global one, and its tree retired (its cover nodes allocated).
    fn agree(a: &Arena, chunk: usize) {
        let owners: Vec<usize> = (0..2).filter(|&c| a.cores[c].owned().any(|o| o == chunk)).collect();
        let whole = a.retire_nodes(chunk)[0];
        let open = a.shape.try_alloc(a.tree(chunk), whole).is_ok();
        if open {
            a.shape.release(a.tree(chunk), whole).unwrap();
        }
        match a.global.state(chunk) {
            ChunkState::Core(o) => {
                assert_eq!(owners, vec![o], "a core chunk is in its owner's bitmap alone");
                assert!(a.global.is_taken(chunk), "a core chunk is taken in the global bitmap");
                assert!(open, "a core chunk's tree is open");
                assert!(a.chunk_is_empty(chunk), "its free-space word counts every unit free");
            }
            ChunkState::Free => {
                assert!(owners.is_empty(), "a free chunk is in no owner's bitmap: {owners:?}");
                assert!(!a.global.is_taken(chunk), "a free chunk is free in the global bitmap");
                assert!(!open, "a free chunk's tree is retired");
            }
            other => panic!("unexpected state {other:?}"),
        }
    }

    /// A caller that read owner 1 retires the chunk while another retires it and grants it to
    /// core 0: whatever the order, one of them retires it, and the chunk ends with one owner or
    /// none, every record agreeing.
    #[test]
    fn a_retire_with_a_stale_owner_against_a_retire_and_a_regrant() {
        loom::model(|| {
            let a = tiny_arena();
            assert!(a.grant_exact(1, 1));
            let other = {
                let a = a.clone();
                thread::spawn(move || {
                    let retired = a.retire(1, 1);
                    let regranted = retired && a.grant_exact(1, 0);
                    (retired, regranted)
                })
            };
            let stale = a.retire(1, 1);
            let (retired, regranted) = other.join().unwrap();
            assert!(!(stale && retired), "one chunk retired twice");
            assert!(stale || retired, "an empty chunk with two retirers stays out");
            if regranted {
                assert!(!stale, "the stale retire took a regranted chunk");
                assert_eq!(a.global.state(1), ChunkState::Core(0));
            }
            agree(&a, 1);
        });
    }

    /// A thread whose hint still names the chunk claims a node in it while its owner retires
    /// it: never both, and a claim that won keeps the chunk with its owner.
    #[test]
    fn a_claim_through_a_stale_hint_against_a_retire() {
        loom::model(|| {
            let a = tiny_arena();
            assert!(a.grant_exact(1, 1));
            let node = halves(&a, 1)[0];
            let claimer = {
                let a = a.clone();
                thread::spawn(move || a.shape.try_alloc(a.tree(1), node).is_ok())
            };
            let retired = a.retire(1, 1);
            let claimed = claimer.join().unwrap();
            assert!(!(retired && claimed), "a block placed in a retired chunk");
            assert!(retired || claimed);
            if claimed {
                assert_eq!(a.global.state(1), ChunkState::Core(1));
                a.shape.release(a.tree(1), node).unwrap();
            }
            agree(&a, 1);
        });
    }

    /// Two threads free the last two blocks of a chunk at once: the one whose free empties it
    /// retires it (no reserve), once.
    #[test]
    fn two_frees_that_empty_a_chunk_retire_it_once() {
        loom::model(|| {
            let a = tiny_arena();
            assert!(a.grant_exact(1, 1));
            let [x, y] = halves(&a, 1).map(|n| Node { level: n.level + 1, index: n.index * 2 });
            assert!(claim(&a, 1, x) && claim(&a, 1, y));
            let other = {
                let a = a.clone();
                let (offset, size) = block(&a, 1, y);
                thread::spawn(move || a.release_buddy(offset, size, false, Vouched::Yes).is_ok())
            };
            let (offset, size) = block(&a, 1, x);
            assert!(a.release_buddy(offset, size, false, Vouched::Yes).is_ok());
            assert!(other.join().unwrap());
            assert_eq!(a.global.state(1), ChunkState::Free, "the emptied chunk went back");
            agree(&a, 1);
        });
    }

    /// A chunk is full; one thread frees a half of it while another, through a stale hint,
    /// claims that half again. The claim may count its units taken before the free counts them
    /// given: the count dips below zero for a moment and must neither corrupt the fields beside
    /// it nor make the free see an empty chunk.
    #[test]
    fn a_free_against_a_claim_of_its_nodes_on_a_full_chunk() {
        loom::model(|| {
            let a = tiny_arena();
            assert!(a.grant_exact(1, 1));
            let [x, y] = halves(&a, 1);
            assert!(claim(&a, 1, x) && claim(&a, 1, y));
            let claimer = {
                let a = a.clone();
                thread::spawn(move || {
                    let claimed = claim(&a, 1, x);
                    // What a search reads of the chunk meanwhile: never more than its units.
                    assert!(a.lines[1].space.free_units() <= a.geometry.usable_units(1), "a count past the chunk");
                    a.lines[1].space.refresh();
                    claimed
                })
            };
            let (offset, size) = block(&a, 1, x);
            assert!(a.release_buddy(offset, size, false, Vouched::Yes).is_ok());
            let claimed = claimer.join().unwrap();
            assert_eq!(a.global.state(1), ChunkState::Core(1), "a chunk with a block stays");
            let units = x.units(a.geometry.depth);
            assert_eq!(a.lines[1].space.free_units(), if claimed { 0 } else { units });
            assert_eq!(a.lines[1].space.refresh(), a.lines[1].space.refresh(), "the hidden levels settle");
            for node in if claimed { vec![x, y] } else { vec![y] } {
                let (offset, size) = block(&a, 1, node);
                assert!(a.release_buddy(offset, size, false, Vouched::Yes).is_ok());
            }
            agree(&a, 1);
        });
    }
}

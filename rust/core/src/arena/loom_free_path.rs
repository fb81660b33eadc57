//! Loom models of the free path as it ships: a buddy block goes back through
//! [`Arena::release_buddy`] (the call the pool's free makes for a block in a core chunk: its
//! tree release with the raise of the stretch memo, the epoch step, the announcement to the
//! level maps and the bunch summaries, the hint and the record of the free node; no search
//! writes an ends record here, so the free carries none), racing the
//! per-core allocation ([`Arena::alloc_in_core`]: hint, records of free nodes, level maps,
//! summarized search, the count of the units taken) or another such free.
//!
//! The arena has one core and one chunk of 64 units (depth 6: a root band and one leaf band of
//! two bunches, so the leaf bunches keep summaries), filled by the allocation path with blocks
//! of 32, 16, 8, 4 and 2 units and two leaves, so that the only room a request finds is what a
//! free gives back. After every interleaving, with the threads joined: the tree is well formed
//! and its allocated units and the chunk's free-space word add up to the chunk; every level
//! that has a free node is shown in the core's level maps (as is every level from the chunk's
//! hidden threshold on) and found by a search through the bunch summaries; the stretch memo
//! rules out no free stretch (from a bank boundary); and a block of the freed size is
//! allocated again.

use crate::arena::arena::Arena;
use crate::arena::buddy::Summary;
use crate::arena::layout::{BuddyLayout, Layout};
use crate::arena::release::Vouched;
use crate::arena::slab::caches::SlabClasses;
use crate::arena::stretches::best_fit;
use crate::config::{Backing, PoolConfig};
use loom::sync::Arc;
use loom::thread;

/// The only chunk.
const CHUNK: usize = 0;
/// The only core.
const CORE: usize = 0;

/// Run loom model `f` with at most `bound` preemptions, or fewer where `LOOM_MAX_PREEMPTIONS`
/// asks for fewer. The set-up (a grant and seven allocations) and the checks afterwards run the
/// shipping code too, each atomic operation a branch of loom's: more than its default of 1,000
/// branches per execution.
fn model<F: Fn() + Sync + Send + 'static>(bound: usize, f: F) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.map_or(bound, |b| b.min(bound)));
    builder.max_branches = 20_000;
    builder.check(f);
}

/// An arena of one core and one chunk of 64 units of 64 bytes, no slabs, no reserve; the chunk
/// granted to the core.
fn tiny_arena() -> Arc<Arena> {
    let config = PoolConfig::new(4096)
        .chunk_size(4096)
        .min_block(64)
        .bank_size(1024)
        .slab_sizes(vec![])
        .cores(1)
        .core_reserve(0)
        .run_tails(false)
        .backing(Backing::None);
    let arena = Arena::new(&config, SlabClasses::of(&config)).unwrap();
    assert!(arena.grant_exact(CHUNK, CORE));
    Arc::new(arena)
}

/// The buddy layout of a block of `units` units, as the free path reads it.
fn layout(a: &Arena, units: u64) -> BuddyLayout {
    let Layout::Buddy(b) = a.geometry.layout(units as usize * a.geometry.min_block, 1) else {
        panic!("a block of {units} units is a buddy block");
    };
    b
}

/// A block of `units` units through the per-core allocation: its offset, if it found room.
fn alloc(a: &Arena, units: u64) -> Option<usize> {
    a.alloc_in_core(&layout(a, units), CORE)
}

/// Free the block of `units` units at `offset` as the pool's free does for a block in a core
/// chunk (none of these blocks is of a cache class).
fn free(a: &Arena, offset: usize, units: u64) {
    let bytes = units as usize * a.geometry.min_block;
    assert_eq!(a.release_buddy(offset, bytes, false, Vouched::Yes).unwrap(), bytes);
}

/// Fill the chunk with blocks of 32, 16, 8, 4 and 2 units and two leaves, in that order: no
/// unit is left free. Returns the offsets of the block of 2 units and of the two leaves (the
/// leaves are buddies).
fn fill(a: &Arena) -> (usize, [usize; 2]) {
    for units in [32, 16, 8, 4] {
        alloc(a, units).expect("room for the filling");
    }
    let pair = alloc(a, 2).expect("room for the pair");
    let leaves = [alloc(a, 1).expect("room for a leaf"), alloc(a, 1).expect("room for a leaf")];
    assert_eq!(leaves[0] ^ leaves[1], a.geometry.min_block, "the two leaves are buddies");
    assert_eq!(a.lines[CHUNK].space.free_units(), 0);
    (pair, leaves)
}

/// The chunk's allocated units, one bit each, read from the tree.
fn allocated_units(a: &Arena) -> u64 {
    let mut bits = [0u64; 1];
    a.shape.allocated_granules(a.tree(CHUNK), 0, &mut bits);
    bits[0]
}

/// Whether the tree has a free node of `level` (an aligned run of free units of its size).
fn has_free_node(a: &Arena, level: u32) -> bool {
    let depth = a.geometry.depth;
    let size = 1u64 << (depth - level);
    let mask = if size == 64 { u64::MAX } else { (1u64 << size) - 1 };
    let taken = allocated_units(a);
    (0..1u64 << level).any(|i| taken & (mask << (i * size)) == 0)
}

/// The chunk's records agree with its tree, with no thread running: see the module
/// documentation.
fn assert_consistent(a: &Arena) {
    let depth = a.geometry.depth;
    let usable = a.geometry.usable_units(CHUNK);
    let tree = a.tree(CHUNK);
    let space = &a.lines[CHUNK].space;
    let mut findings = Vec::new();
    a.shape.check(tree, &mut |f| findings.push(f));
    assert!(findings.is_empty(), "{findings:?}");
    let mut used = 0;
    a.shape.for_each_allocated(tree, &mut |n| used += n.units(depth));
    assert_eq!(used, u64::from(allocated_units(a).count_ones()), "allocated nodes overlap");
    assert_eq!(used + space.free_units(), usable, "the free-space word disagrees with the tree");
    let maps = &a.cores[CORE].maps;
    for level in space.hidden()..=depth {
        assert!(maps.may_serve(level, CHUNK), "level {level} at or past the threshold is hidden");
    }
    for level in (0..=depth).filter(|&l| has_free_node(a, l)) {
        assert!(maps.may_serve(level, CHUNK), "a free node of level {level} is hidden in the level maps");
        let probe = space.probe(0).expect("a core chunk");
        let moved = || space.moved_since(probe);
        let summary = Summary::new(a.summaries(CHUNK), &moved);
        let found = a.shape.search_summarized(tree, &summary, level, 1, None, &mut |_| Ok(()));
        assert!(found.is_some(), "the bunch summaries hide a free node of level {level}");
    }
    // The memo bounds the free stretches from a bank boundary (where a block it serves starts).
    let longest = best_fit(&[allocated_units(a)], usable, 1, a.geometry.bank_units).longest;
    let (_, now) = space.look();
    assert!(!a.lines[CHUNK].stretch.rules_out(now.epoch(), longest), "the stretch memo hides a stretch of {longest}");
}

/// A block of 2 units is freed in a full chunk while the same core allocates a block of 2
/// units: the allocation finds nothing (it came first, or missed the free) or takes the freed
/// block's place, never another one. Afterwards the chunk's records agree with its tree, and
/// a block of 2 units is allocated again (after the racing allocation's block is freed, when
/// it got one).
#[test]
fn a_free_racing_an_allocation_of_its_size_in_a_full_chunk() {
    model(3, || {
        let a = tiny_arena();
        let (pair, _) = fill(&a);
        let freer = {
            let a = a.clone();
            thread::spawn(move || free(&a, pair, 2))
        };
        let placed = alloc(&a, 2);
        freer.join().unwrap();
        if let Some(offset) = placed {
            assert_eq!(offset, pair, "a block placed where no unit was free");
            assert_eq!(a.lines[CHUNK].space.free_units(), 0);
            assert_eq!(allocated_units(&a), u64::MAX, "a unit both allocated and free");
            assert_consistent(&a);
            free(&a, offset, 2);
        } else {
            assert_eq!(a.lines[CHUNK].space.free_units(), 2);
        }
        assert_consistent(&a);
        assert_eq!(alloc(&a, 2), Some(pair), "the freed block's room is not found again");
        assert_consistent(&a);
    });
}

/// Two threads free the two leaves of a full chunk, which are buddies, at once: their nodes
/// join into the pair above them. Afterwards the chunk's records agree with its tree, and a
/// block of 2 units is allocated at the pair. At most two preemptions: both threads run the
/// whole free (the release, the memo's raise, the announcement to the level maps and the
/// summaries, the hint and the record), and with three the model takes 285,000 executions,
/// about two minutes; with two, 31,500.
#[test]
fn two_frees_of_buddy_leaves_join_into_an_allocatable_pair() {
    model(2, || {
        let a = tiny_arena();
        let (_, [first, second]) = fill(&a);
        let other = {
            let a = a.clone();
            thread::spawn(move || free(&a, second, 1))
        };
        free(&a, first, 1);
        other.join().unwrap();
        assert_eq!(a.lines[CHUNK].space.free_units(), 2);
        assert!(has_free_node(&a, a.geometry.depth - 1), "the leaves did not join into a free pair");
        assert_consistent(&a);
        assert_eq!(alloc(&a, 2), Some(first.min(second)), "the joined pair is not found");
        assert_eq!(a.lines[CHUNK].space.free_units(), 0);
        assert_consistent(&a);
    });
}

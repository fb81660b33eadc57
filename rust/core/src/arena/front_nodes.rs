//! The node claims of a block with a front (`front.rs`): its front's nodes in the free end of
//! one chunk's tree and its tail's nodes at the start of another's, taken all or none, and
//! given back so that of two racing frees exactly one wins.
//!
//! Taking: the front's nodes first, in address order, each with `try_alloc_cleaning` (a node
//! and its ancestor, or a cleaning claim and a leaf, never both win: `buddy.rs`); then the
//! tail's nodes the same way. A node already taken (by a buddy block, another block's front or
//! tail, or a retire that closed the chunk's tree) fails the claim: everything taken so far is
//! released and the caller tries another place. No claim waits for another, and a claim that
//! fails leaves the trees as they were.
//!
//! Giving back: every node of the front and the tail is checked allocated first; then the
//! front's chunk's *front word*, which names the block in that chunk's end (its first unit
//! and its units, stored once the block is whole), is cleared by one compare-and-swap: that
//! decides which of two racing frees wins, and a free of another size or from another unit
//! finds another word and changes nothing. Only the winner releases the nodes.

use super::buddy::{Node, TreeShape};
use crate::util::sync::{AtomicU64, Ordering};

/// Claim every node of `nodes` in `tree`, in order; `false` (and the tree as it was) when one
/// of them is taken.
pub(crate) fn take_nodes(shape: &TreeShape, tree: &[AtomicU64], nodes: impl Iterator<Item = Node> + Clone) -> bool {
    for (i, node) in nodes.clone().enumerate() {
        if shape.try_alloc_cleaning(tree, node).is_err() {
            give_nodes(shape, tree, nodes.take(i));
            return false;
        }
    }
    true
}

/// Release every node of `nodes` in `tree` (all allocated by the caller's claim).
pub(crate) fn give_nodes(shape: &TreeShape, tree: &[AtomicU64], nodes: impl Iterator<Item = Node>) {
    for node in nodes {
        let _ = shape.release(tree, node);
    }
}

/// Which part of a block with a front could not be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// A node of the front was taken: nothing was claimed.
    Front,
    /// A node of the tail was taken: the front's nodes were claimed and released again.
    Tail,
}

/// Claim a front's nodes in `front_tree`, then a tail's in `tail_tree` (none when `tail` is
/// empty): all or none.
pub(crate) fn take_front_and_tail(
    shape: &TreeShape,
    front_tree: &[AtomicU64],
    front: impl Iterator<Item = Node> + Clone,
    tail_tree: &[AtomicU64],
    tail: impl Iterator<Item = Node> + Clone,
) -> Result<(), Taken> {
    if !take_nodes(shape, front_tree, front.clone()) {
        return Err(Taken::Front);
    }
    if !take_nodes(shape, tail_tree, tail) {
        give_nodes(shape, front_tree, front);
        return Err(Taken::Tail);
    }
    Ok(())
}

/// Release a block with a front whose front word `word` says `name`: `false` (and nothing
/// changes) unless every node of `front` (in `front_tree`) and `tail` (in `tail_tree`) is
/// allocated and this caller clears the word (which decides a race of two callers); then the
/// nodes.
pub(crate) fn give_front_and_tail(
    shape: &TreeShape,
    word: &AtomicU64,
    name: u64,
    front_tree: &[AtomicU64],
    front: impl Iterator<Item = Node> + Clone,
    tail_tree: &[AtomicU64],
    tail: impl Iterator<Item = Node> + Clone,
) -> bool {
    if !front.clone().all(|n| shape.is_allocated(front_tree, n))
        || !tail.clone().all(|n| shape.is_allocated(tail_tree, n))
    {
        return false;
    }
    if word.compare_exchange(name, 0, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return false;
    }
    give_nodes(shape, front_tree, front);
    give_nodes(shape, tail_tree, tail);
    true
}

#[cfg(all(test, loom))]
mod loom_models {
    //! A block with a front claimed across two chunks' trees while other blocks claim nodes
    //! there (other fronts, buddy blocks, a block taken at the frontier): no unit is ever held
    //! twice, a claim that fails leaves nothing taken, and of two
    //! frees of one block exactly one wins.
    use super::*;
    use crate::arena::layout::BuddyLayout;
    use loom::sync::Arc;
    use loom::thread;

    /// The front word of the block the models free.
    const NAME: u64 = 7;

    /// Two trees of four units (depth 2, bands of height 1).
    fn two_trees() -> (Arc<TreeShape>, Arc<Vec<AtomicU64>>, Arc<Vec<AtomicU64>>) {
        let shape = Arc::new(TreeShape::with_heights(2, 1, 1));
        let a = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
        let b = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
        (shape, a, b)
    }

    fn layout(units: u64) -> BuddyLayout {
        BuddyLayout { level: 0, enclosing: 4, units, step: 1 }
    }

    fn units_held(shape: &TreeShape, tree: &[AtomicU64]) -> Vec<bool> {
        let mut held = vec![false; 4];
        shape.for_each_allocated(tree, &mut |n| {
            for u in n.start(2)..n.start(2) + n.units(2) {
                assert!(!held[u as usize], "unit {u} held twice");
                held[u as usize] = true;
            }
        });
        held
    }

    /// A front of units 1..4 of tree A and a tail of units 0..2 of tree B, against another
    /// block's front of units 2..4 of A and tail of unit 0 of B (claimed in the same order),
    /// and a buddy block of units 0..2 of B: whoever wins, no unit is held twice, and what
    /// each winner holds is exactly its block.
    #[test]
    fn racing_front_claims_never_share_a_unit() {
        loom::model(|| {
            let (shape, a, b) = two_trees();
            let (s2, a2, b2) = (shape.clone(), a.clone(), b.clone());
            let other = thread::spawn(move || {
                take_front_and_tail(&s2, &a2, layout(2).pieces_at(2, 2), &b2, layout(1).pieces_at(2, 0)).is_ok()
            });
            let (s3, b3) = (shape.clone(), b.clone());
            let buddy = thread::spawn(move || s3.try_alloc(&b3, Node { level: 1, index: 0 }).is_ok());
            let mine =
                take_front_and_tail(&shape, &a, layout(3).pieces_at(2, 1), &b, layout(2).pieces_at(2, 0)).is_ok();
            let theirs = other.join().unwrap();
            let pair = buddy.join().unwrap();
            assert!(!(mine && theirs), "both fronts hold units 2..4 of A");
            assert!(!pair || !(mine || theirs), "a tail and the buddy block share B's start");
            let held_a = units_held(&shape, &a);
            let held_b = units_held(&shape, &b);
            let want_a = [false, mine, mine || theirs, mine || theirs];
            let want_b = [mine || theirs || pair, mine || pair, false, false];
            assert_eq!(held_a, want_a, "tree A after mine={mine} theirs={theirs}");
            assert_eq!(held_b, want_b, "tree B after mine={mine} theirs={theirs} pair={pair}");
        });
    }

    /// A block of at most half a chunk with a front across the boundary of two chunks (units
    /// 1..4 of A and unit 0 of B) against a buddy block taken at the frontier, the free end of
    /// A (units 2..4, as `Arena::claim_at_frontier` takes one, `take_nodes`), and one taken at
    /// B's start (units 0..2): at most one of the first two wins, and what each winner holds
    /// is exactly its block.
    #[test]
    fn a_front_and_a_block_at_the_frontier_never_share_a_unit() {
        loom::model(|| {
            let (shape, a, b) = two_trees();
            let (s2, a2) = (shape.clone(), a.clone());
            let packed = thread::spawn(move || take_nodes(&s2, &a2, layout(2).pieces_at(2, 2)));
            let (s3, b3) = (shape.clone(), b.clone());
            let pair = thread::spawn(move || take_nodes(&s3, &b3, layout(2).pieces_at(2, 0)));
            let mine =
                take_front_and_tail(&shape, &a, layout(3).pieces_at(2, 1), &b, layout(1).pieces_at(2, 0)).is_ok();
            let at_frontier = packed.join().unwrap();
            let at_start = pair.join().unwrap();
            assert!(!(mine && at_frontier), "the front and the block at the frontier share units 2..4 of A");
            assert!(!(mine && at_start), "the tail and the block at B's start share unit 0 of B");
            let want_a = [false, mine, mine || at_frontier, mine || at_frontier];
            let want_b = [mine || at_start, at_start, false, false];
            assert_eq!(units_held(&shape, &a), want_a, "tree A after mine={mine} frontier={at_frontier}");
            assert_eq!(units_held(&shape, &b), want_b, "tree B after mine={mine} start={at_start}");
        });
    }

    /// Two frees of one block with a front (units 1..4 of A) and a tail (units 0..2 of B):
    /// exactly one wins (the one that clears the front word), and every unit is free afterwards.
    #[test]
    fn of_two_frees_of_a_front_and_tail_exactly_one_wins() {
        loom::model(|| {
            let (shape, a, b) = two_trees();
            assert!(take_front_and_tail(&shape, &a, layout(3).pieces_at(2, 1), &b, layout(2).pieces_at(2, 0)).is_ok());
            let word = Arc::new(AtomicU64::new(NAME));
            let (s2, a2, b2, w2) = (shape.clone(), a.clone(), b.clone(), word.clone());
            let other = thread::spawn(move || {
                give_front_and_tail(&s2, &w2, NAME, &a2, layout(3).pieces_at(2, 1), &b2, layout(2).pieces_at(2, 0))
            });
            let mine =
                give_front_and_tail(&shape, &word, NAME, &a, layout(3).pieces_at(2, 1), &b, layout(2).pieces_at(2, 0));
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "mine={mine} theirs={theirs}");
            assert_eq!(word.load(Ordering::Acquire), 0);
            assert_eq!(units_held(&shape, &a), vec![false; 4]);
            assert_eq!(units_held(&shape, &b), vec![false; 4]);
        });
    }
}

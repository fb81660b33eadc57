//! A thorough sweep for compaction (issue 5). `sweep` follows occupied marks down from the
//! root, so a mark whose parent bunch is unmarked stays: an allocation that failed its climb
//! at an allocated ancestor (a stale hint into a retired chunk) leaves one under that ancestor,
//! and once the ancestor is released nothing leads to it. Searches clean such marks as they
//! meet them; a compaction that takes a block at an exact place, on a paused pool, instead
//! cleans every empty child bunch of every bunch, bottom band first.

use super::TreeShape;
use crate::sync::{AtomicU64, Ordering};

impl TreeShape {
    /// Clear every mark over an empty bunch. Meant for a paused pool (the same seal protocol as
    /// `sweep`, so it is also safe, though not complete, under concurrent allocations).
    pub(crate) fn sweep_all(&self, tree: &[AtomicU64]) {
        for band in (0..self.bands.len().saturating_sub(1)).rev() {
            for bunch in 0..(1u64 << self.bands[band].top) {
                let word = self.word(tree, band, bunch).load(Ordering::Acquire);
                let mut marked = self.occupied_children(band, word);
                while marked != 0 {
                    let child = (bunch << self.bands[band].height) | marked.trailing_zeros() as u64;
                    self.clean_child(tree, band, bunch, child);
                    marked &= marked - 1;
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::buddy::Node;

    #[test]
    fn an_orphan_mark_under_a_released_ancestor_is_cleaned() {
        let shape = TreeShape::new(13);
        let tree: Vec<AtomicU64> = (0..shape.words()).map(|_| AtomicU64::new(0)).collect();
        let root = Node { level: 0, index: 0 };
        shape.try_alloc(&tree, root).unwrap();
        // A leaf allocation that fails at the allocated root leaves its marks below it.
        assert!(shape.try_alloc(&tree, Node { level: 13, index: 3100 }).is_err());
        shape.release(&tree, root).unwrap();
        let big = Node { level: 4, index: 6 }; // covers leaf 3100
        shape.sweep(&tree);
        assert!(shape.try_alloc(&tree, big).is_err(), "sweep does not reach the orphan mark");
        shape.sweep_all(&tree);
        shape.try_alloc(&tree, big).expect("sweep_all cleaned it");
        shape.release(&tree, big).unwrap();
        shape.sweep_all(&tree);
        shape.try_alloc(&tree, root).expect("nothing left behind");
    }
}

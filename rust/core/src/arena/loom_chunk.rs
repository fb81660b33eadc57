//! The chunk the loom models of a chunk's records (stretch memos, ends records) run on: a tree
//! of `depth` levels below the root, in bands of height 1, and its free-space word, with some
//! nodes allocated.

use crate::arena::buddy::{Node, TreeShape};
use crate::arena::chunk_space::ChunkSpace;
use crate::util::sync::AtomicU64;
use loom::sync::Arc;

/// A tree of `1 << depth` units with the nodes of `taken` allocated, and its free-space word.
pub(crate) fn tree_with(depth: u32, taken: &[Node]) -> (Arc<TreeShape>, Arc<Vec<AtomicU64>>, Arc<ChunkSpace>) {
    let shape = Arc::new(TreeShape::with_heights(depth, 1, 1));
    let tree: Arc<Vec<AtomicU64>> = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
    let space = Arc::new(ChunkSpace::new(1 << depth));
    for &node in taken {
        shape.try_alloc(&tree, node).unwrap();
        space.take(node.units(depth));
    }
    (shape, tree, space)
}

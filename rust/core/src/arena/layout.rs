//! The route and shape of one block: buddy nodes inside a chunk, a run of whole chunks, or a
//! run of whole chunks followed by a tail of buddy nodes (`Geometry::layout` chooses).

use super::buddy::Node;

/// Where a block lives and what it is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Inside one chunk's buddy tree.
    Buddy(BuddyLayout),
    /// A run of whole chunks from the global pool, starting at a multiple of `align_chunks`.
    Run { chunks: usize, align_chunks: usize },
    /// A run of `chunks` whole chunks followed by `tail`: the nodes at the start of the next
    /// chunk (a core chunk, whose other nodes serve other blocks), cut like a trimmed buddy
    /// block. With `PoolConfig::run_tails` (the default), a request past a multiple of the
    /// chunk takes this instead of one more whole chunk when that chunk would waste more than
    /// 1/32 of it (see `arena/tail.rs`).
    RunTail { chunks: usize, align_chunks: usize, tail: BuddyLayout },
}

/// A buddy block: the nodes that make up `units` units at the left of an *enclosing* node of
/// `enclosing` units. When `units == enclosing` the block is that one node; otherwise it is
/// trimmed into at most four nodes of decreasing size (the binary digits of `units`), each
/// naturally aligned, and the rest of the enclosing node stays free for others.
///
/// The allocation path starts a block at its enclosing node, or, for a block larger than a
/// bank that no enclosing node can take, in a free stretch (`stretches.rs`); a compaction may
/// also *pack* a block at any other start that the bank rule allows
/// (`Geometry::packed_alignment`):
/// the block is then the maximal aligned nodes covering its units ([`BuddyLayout::pieces_at`]),
/// so the free tail of the enclosing node is no longer lost between packed blocks. Both kinds
/// are released the same way, from the block's start and size alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BuddyLayout {
    /// Level of the enclosing node.
    pub(crate) level: u32,
    /// Units of the enclosing node (a power of two).
    pub(crate) enclosing: u64,
    /// Units the block occupies (a multiple of `enclosing >> TRIM_SHIFT` (see `geometry.rs`)).
    pub(crate) units: u64,
    /// The enclosing node's index must be a multiple of this (per-call alignment).
    pub(crate) step: u64,
}

impl BuddyLayout {
    /// Whether the block is the enclosing node itself.
    pub(crate) fn is_whole(&self) -> bool {
        self.units == self.enclosing
    }

    /// The nodes of the block inside `enclosing_node`, in address order.
    pub(crate) fn pieces(&self, depth: u32, enclosing_node: Node) -> Pieces {
        self.pieces_at(depth, enclosing_node.start(depth))
    }

    /// The nodes of the block starting at unit `start` of its chunk, in address order: the
    /// maximal naturally aligned nodes that cover `[start, start + units)`. At the start of an
    /// enclosing node these are [`BuddyLayout::pieces`]; elsewhere (a packed block) there may
    /// be more of them (at most two per level).
    pub(crate) fn pieces_at(&self, depth: u32, start: u64) -> Pieces {
        Pieces { depth, next: start, remaining: self.units }
    }

    /// Whether the block starting at unit `start` is one node (then releasing that node is the
    /// check that it was allocated; otherwise every piece is checked first).
    pub(crate) fn is_one_node_at(&self, start: u64) -> bool {
        self.is_whole() && start & (self.enclosing - 1) == 0
    }
}

/// The nodes of a buddy block, in address order: each the largest naturally aligned node that
/// starts where the previous one ended and fits in what remains.
#[derive(Debug, Clone)]
pub(crate) struct Pieces {
    depth: u32,
    next: u64,
    remaining: u64,
}

impl Iterator for Pieces {
    type Item = Node;

    fn next(&mut self) -> Option<Node> {
        if self.remaining == 0 {
            return None;
        }
        let fits = 1u64 << (63 - self.remaining.leading_zeros());
        let aligned = if self.next == 0 { u64::MAX } else { 1u64 << self.next.trailing_zeros() };
        let units = fits.min(aligned);
        let node = Node::covering(self.depth, self.next, units);
        self.next += units;
        self.remaining -= units;
        Some(node)
    }
}

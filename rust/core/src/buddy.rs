//! A lock-free buddy tree over one chunk, its metadata outside the managed memory.
//!
//! # Shape
//!
//! The tree has `depth + 1` levels: level 0 is the whole chunk, level `depth` holds the leaves
//! (one `min_block` each). Node `(level, index)` covers units `[index << (depth - level),
//! (index + 1) << (depth - level))`.
//!
//! Levels are grouped into *bands*; each band is cut into *bunches* (subtrees of the band's
//! height), and each bunch is one `AtomicU64`, so a climb from a leaf to the root costs one CAS per
//! band instead of one per level (the level packing of NBBS, Marotta et al.):
//!
//! * a **leaf bunch** (bottom band, height <= 6) holds one *allocated* bit per node in heap order:
//!   up to 63 bits;
//! * an **inner bunch** (height <= 4) holds the allocated bits of its nodes (bits 0..15), one
//!   *occupied* bit per child bunch (bits 16..31: something below is allocated) and a *version*
//!   (bits 32..63) that every successful CAS on the word increments.
//!
//! # Protocol
//!
//! *Allocate* node `n`: CAS its bunch to set `n`'s bit, provided `n`, its ancestors in the bunch
//! and its descendants in the bunch are clear and no child bunch below `n` is occupied. Then climb:
//! in each ancestor bunch CAS in the occupied bit of the child bunch we come from (bumping the
//! version), provided no node on the path to it is allocated. Meeting an allocated ancestor means
//! someone allocated a node covering ours first: roll back (release `n`).
//!
//! *Release* node `n`: CAS its bit off. If that empties the bunch, *propagate*: in the parent
//! bunch `P` of an empty bunch `B`: read `P` (value `v`), then read `B`; if `B` is still empty,
//! CAS `P` from `v` to `v` without `B`'s occupied bit (and a bumped version), and go on upwards if
//! that emptied `P`. Any allocation that committed in `B` after the read of `B` must have CASed
//! `P` after its CAS in `B`, hence after our read of `P`: the version has changed, our CAS fails
//! and we re-read. So an occupied bit is cleared only when its bunch was truly empty at a moment
//! when no later allocation had yet reached `P`; such an allocation sets the bit again, and if an
//! ancestor was allocated in the meantime it sees that ancestor and rolls back. This replaces the
//! per-node coalescing bits of NBBS by one version per inner word, which keeps a whole bunch in
//! one CAS.
//!
//! The loom models in this module check the protocol exhaustively on small trees.

use crate::bits::{every_nth, low_bits, siblings, to_children, to_parents};
use crate::sync::{AtomicU64, Ordering};

/// Height of the bottom band (leaf bunches): 63 allocated bits fit one word.
pub(crate) const LEAF_BAND_HEIGHT: u32 = 6;
/// Height of the other bands: 15 allocated bits and 16 occupied bits, plus a 32-bit version.
pub(crate) const INNER_BAND_HEIGHT: u32 = 4;

const OCC_SHIFT: u32 = 16;
const VERSION_ONE: u64 = 1 << 32;
const INNER_STATE_MASK: u64 = 0xFFFF_FFFF;

/// A node of a chunk's tree: `index` counts from the left within its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Node {
    pub(crate) level: u32,
    pub(crate) index: u64,
}

impl Node {
    /// The node of `units` units (a power of two) starting at unit `start` in a tree of `depth`.
    pub(crate) fn covering(depth: u32, start: u64, units: u64) -> Node {
        debug_assert!(units.is_power_of_two() && start % units == 0);
        let level = depth - units.trailing_zeros();
        Node {
            level,
            index: start / units,
        }
    }

    /// The first unit the node covers.
    pub(crate) fn start(self, depth: u32) -> u64 {
        self.index << (depth - self.level)
    }

    /// The number of units the node covers.
    pub(crate) fn units(self, depth: u32) -> u64 {
        1 << (depth - self.level)
    }
}

/// Why an allocation attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Conflict {
    /// The node, or something inside it or above it in its bunch, is taken.
    Taken,
    /// An ancestor in a higher band is allocated: the whole region around the node is taken.
    Ancestor,
}

#[derive(Debug, Clone, Copy)]
struct Band {
    /// The band's first (highest) level.
    top: u32,
    /// The number of levels in the band.
    height: u32,
    /// Index of the band's first word in the tree's metadata.
    base: usize,
    /// The bottom band has no child bunches (and no version).
    leaf: bool,
}

/// Where a node's bit lives.
#[derive(Debug, Clone, Copy)]
struct Loc {
    band: usize,
    bunch: u64,
    row: u32,
    pos: u64,
    word: usize,
    bit: u64,
}

/// The geometry of every chunk's tree; the metadata itself is a `[AtomicU64]` of
/// [`TreeShape::words`] words per chunk, owned by the caller.
#[derive(Debug, Clone)]
pub(crate) struct TreeShape {
    depth: u32,
    bands: Vec<Band>,
    band_of_level: Vec<usize>,
    words: usize,
}

#[inline]
fn row_of(word: u64, r: u32) -> u64 {
    (word >> ((1u32 << r) - 1)) & low_bits(1 << r)
}

/// The allocated bits of every node on the path from a bunch's root to child bunch `j`.
#[inline]
fn path_mask(height: u32, j: u64) -> u64 {
    let mut mask = 0;
    for r in 0..height {
        mask |= 1u64 << ((1u64 << r) - 1 + (j >> (height - r)));
    }
    mask
}

impl TreeShape {
    /// The shape of a tree of `depth + 1` levels with the standard band heights.
    pub(crate) fn new(depth: u32) -> TreeShape {
        TreeShape::with_heights(depth, LEAF_BAND_HEIGHT, INNER_BAND_HEIGHT)
    }

    /// The shape with explicit band heights (the loom models use tiny bands).
    pub(crate) fn with_heights(depth: u32, leaf_height: u32, inner_height: u32) -> TreeShape {
        assert!((1..=LEAF_BAND_HEIGHT).contains(&leaf_height));
        assert!((1..=INNER_BAND_HEIGHT).contains(&inner_height));
        let levels = depth + 1;
        let leaf = leaf_height.min(levels);
        let mut heights = Vec::new();
        let mut rest = levels - leaf;
        while rest > 0 {
            let h = rest.min(inner_height);
            heights.push(h);
            rest -= h;
        }
        heights.reverse(); // top band first; the partial band (if any) is the top one
        heights.push(leaf);
        let mut bands = Vec::with_capacity(heights.len());
        let mut top = 0;
        let mut base = 0;
        for (i, &height) in heights.iter().enumerate() {
            bands.push(Band {
                top,
                height,
                base,
                leaf: i + 1 == heights.len(),
            });
            base += 1usize << top;
            top += height;
        }
        let mut band_of_level = vec![0; levels as usize];
        for (b, band) in bands.iter().enumerate() {
            for level in band.top..band.top + band.height {
                band_of_level[level as usize] = b;
            }
        }
        // Pad each tree to whole 128-byte lines so trees of different chunks share no line.
        let words = base.div_ceil(16) * 16;
        TreeShape {
            depth,
            bands,
            band_of_level,
            words,
        }
    }

    /// Metadata words per tree.
    pub(crate) fn words(&self) -> usize {
        self.words
    }

    /// The number of CAS steps of a climb from a leaf (one per band).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn bands(&self) -> usize {
        self.bands.len()
    }

    fn locate(&self, node: Node) -> Loc {
        let band = self.band_of_level[node.level as usize];
        let b = &self.bands[band];
        let row = node.level - b.top;
        let bunch = node.index >> row;
        let pos = node.index & low_bits(row);
        Loc {
            band,
            bunch,
            row,
            pos,
            word: b.base + bunch as usize,
            bit: 1u64 << ((1u64 << row) - 1 + pos),
        }
    }

    fn version_step(&self, band: usize) -> u64 {
        if self.bands[band].leaf {
            0
        } else {
            VERSION_ONE
        }
    }

    /// The occupied bits of a word's child bunches (0 for leaf bunches).
    fn occupied_children(&self, band: usize, word: u64) -> u64 {
        let b = &self.bands[band];
        if b.leaf {
            0
        } else {
            (word >> OCC_SHIFT) & low_bits(1 << b.height)
        }
    }

    fn is_empty(&self, band: usize, word: u64) -> bool {
        if self.bands[band].leaf {
            word == 0
        } else {
            word & INNER_STATE_MASK == 0
        }
    }

    /// Nodes of row `r` of a bunch that are free with nothing allocated above them in the bunch
    /// and nothing allocated or occupied below them.
    fn available_row(&self, band: usize, word: u64, r: u32) -> u64 {
        let height = self.bands[band].height;
        let mut down = 0;
        for i in 0..=r {
            down = to_children(down) | row_of(word, i);
        }
        let mut up = self.occupied_children(band, word);
        for i in (r..height).rev() {
            up = to_parents(up) | row_of(word, i);
        }
        !(down | up) & low_bits(1 << r)
    }

    /// Child bunches with no allocated node on the path to them.
    fn enterable_children(&self, band: usize, word: u64) -> u64 {
        let height = self.bands[band].height;
        let mut down = 0;
        for i in 0..height {
            down = to_children(down) | row_of(word, i);
        }
        !to_children(down) & low_bits(1 << height)
    }

    /// Claim `node` and climb to the root. On `Err`, nothing is left claimed.
    pub(crate) fn try_alloc(&self, tree: &[AtomicU64], node: Node) -> Result<(), Conflict> {
        let loc = self.locate(node);
        let word = &tree[loc.word];
        let step = self.version_step(loc.band);
        let mut current = word.load(Ordering::Acquire);
        loop {
            if self.available_row(loc.band, current, loc.row) & (1 << loc.pos) == 0 {
                return Err(Conflict::Taken);
            }
            let new = (current | loc.bit).wrapping_add(step);
            match word.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        let mut band = loc.band;
        let mut bunch = loc.bunch;
        while band > 0 {
            let parent = &self.bands[band - 1];
            let j = bunch & low_bits(parent.height);
            let parent_bunch = bunch >> parent.height;
            let parent_word = &tree[parent.base + parent_bunch as usize];
            let path = path_mask(parent.height, j);
            let occupied = 1u64 << (OCC_SHIFT as u64 + j);
            let mut current = parent_word.load(Ordering::Acquire);
            loop {
                if current & path != 0 {
                    self.release_at(tree, loc);
                    return Err(Conflict::Ancestor);
                }
                let new = (current | occupied).wrapping_add(VERSION_ONE);
                match parent_word.compare_exchange_weak(
                    current,
                    new,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
            band -= 1;
            bunch = parent_bunch;
        }
        Ok(())
    }

    /// Whether `node`'s own bit is set (it is allocated as a whole).
    pub(crate) fn is_allocated(&self, tree: &[AtomicU64], node: Node) -> bool {
        let loc = self.locate(node);
        tree[loc.word].load(Ordering::Acquire) & loc.bit != 0
    }

    /// Release an allocated node. `Err(())` when its bit was not set (nothing changes then).
    pub(crate) fn release(&self, tree: &[AtomicU64], node: Node) -> Result<(), ()> {
        let loc = self.locate(node);
        if tree[loc.word].load(Ordering::Acquire) & loc.bit == 0 {
            return Err(());
        }
        if self.release_at(tree, loc) {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Clear the bit at `loc`; `false` when it was already clear. Propagates emptiness upwards.
    fn release_at(&self, tree: &[AtomicU64], loc: Loc) -> bool {
        let word = &tree[loc.word];
        let step = self.version_step(loc.band);
        let mut current = word.load(Ordering::Acquire);
        let new = loop {
            if current & loc.bit == 0 {
                return false;
            }
            let new = (current & !loc.bit).wrapping_add(step);
            match word.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break new,
                Err(seen) => current = seen,
            }
        };
        if self.is_empty(loc.band, new) {
            self.propagate_empty(tree, loc.band, loc.bunch);
        }
        true
    }

    /// Bunch `bunch` of `band` was seen empty: clear its occupied bit in its parent, and go on
    /// while that empties the parent (see the module documentation for why this is safe).
    fn propagate_empty(&self, tree: &[AtomicU64], mut band: usize, mut bunch: u64) {
        while band > 0 {
            let parent = &self.bands[band - 1];
            let j = bunch & low_bits(parent.height);
            let parent_bunch = bunch >> parent.height;
            let parent_word = &tree[parent.base + parent_bunch as usize];
            let child_word = &tree[self.bands[band].base + bunch as usize];
            let occupied = 1u64 << (OCC_SHIFT as u64 + j);
            let mut current = parent_word.load(Ordering::Acquire);
            let new = loop {
                if current & occupied == 0 {
                    return; // someone else cleared it, and carries on upwards
                }
                if !self.is_empty(band, child_word.load(Ordering::Acquire)) {
                    return;
                }
                let new = (current & !occupied).wrapping_add(VERSION_ONE);
                match parent_word.compare_exchange(
                    current,
                    new,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break new,
                    Err(seen) => current = seen,
                }
            };
            if !self.is_empty(band - 1, new) {
                return;
            }
            band -= 1;
            bunch = parent_bunch;
        }
    }

    /// Find a free node at `level` whose index is a multiple of `step` and call `claim` on it
    /// until one claim succeeds. Partly used subtrees are tried before empty ones (so empty
    /// ones stay whole for large requests), and within a row nodes whose buddy is taken come
    /// first.
    pub(crate) fn search(
        &self,
        tree: &[AtomicU64],
        level: u32,
        step: u64,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        self.search_bunch(tree, 0, 0, level, step, claim)
    }

    /// Try only the bunch of `band_bunch` (a hint from an earlier success) for a node at `level`.
    pub(crate) fn search_in_bunch(
        &self,
        tree: &[AtomicU64],
        level: u32,
        bunch: u64,
        step: u64,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        let band = self.band_of_level[level as usize];
        if bunch >> self.bands[band].top != 0 {
            return None;
        }
        self.claim_in_row(tree, band, bunch, level, step, claim)
    }

    /// The bunch (within its band) that holds `node`: the hint to give `search_in_bunch`.
    pub(crate) fn bunch_of(&self, node: Node) -> u64 {
        self.locate(node).bunch
    }

    fn align_mask(bunch: u64, r: u32, step: u64) -> u64 {
        let width = 1u64 << r;
        if step <= 1 {
            low_bits(width as u32)
        } else if step <= width {
            every_nth(step) & low_bits(width as u32)
        } else if (bunch << r) % step == 0 {
            1
        } else {
            0
        }
    }

    fn claim_in_row(
        &self,
        tree: &[AtomicU64],
        band: usize,
        bunch: u64,
        level: u32,
        step: u64,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        let b = &self.bands[band];
        let r = level - b.top;
        let word = tree[b.base + bunch as usize].load(Ordering::Acquire);
        let mut avail = self.available_row(band, word, r) & Self::align_mask(bunch, r, step);
        while avail != 0 {
            let preferred = avail & !siblings(avail);
            let pick = if preferred != 0 { preferred } else { avail }.trailing_zeros() as u64;
            let node = Node {
                level,
                index: (bunch << r) | pick,
            };
            match claim(node) {
                Ok(()) => return Some(node),
                Err(Conflict::Ancestor) => return None,
                Err(Conflict::Taken) => avail &= !(1 << pick),
            }
        }
        None
    }

    fn search_bunch(
        &self,
        tree: &[AtomicU64],
        band: usize,
        bunch: u64,
        level: u32,
        step: u64,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        let b = self.bands[band];
        if level < b.top + b.height {
            return self.claim_in_row(tree, band, bunch, level, step, claim);
        }
        let word = tree[b.base + bunch as usize].load(Ordering::Acquire);
        let enterable = self.enterable_children(band, word);
        let occupied = self.occupied_children(band, word);
        let mut partial = enterable & occupied;
        while partial != 0 {
            let child = (bunch << b.height) | partial.trailing_zeros() as u64;
            if let Some(node) = self.search_bunch(tree, band + 1, child, level, step, claim) {
                return Some(node);
            }
            partial &= partial - 1;
        }
        let mut empty = enterable & !occupied;
        while empty != 0 {
            let child = (bunch << b.height) | empty.trailing_zeros() as u64;
            // An empty child bunch: its leftmost aligned node at `level` is free unless someone
            // just took it; fall back to a normal search of the child then.
            let child_top = self.bands[band + 1].top;
            let first = child << (level - child_top);
            let count = 1u64 << (level - child_top);
            let aligned = first.div_ceil(step) * step;
            if aligned < first + count {
                let node = Node {
                    level,
                    index: aligned,
                };
                match claim(node) {
                    Ok(()) => return Some(node),
                    Err(Conflict::Ancestor) => return None,
                    Err(Conflict::Taken) => {
                        if let Some(node) =
                            self.search_bunch(tree, band + 1, child, level, step, claim)
                        {
                            return Some(node);
                        }
                    }
                }
            }
            empty &= empty - 1;
        }
        None
    }

    /// The highest level (largest block) at which a node is free now, `None` when nothing is.
    /// Meant for a quiescent tree; under concurrent use it is a snapshot of a moving target.
    pub(crate) fn largest_free_level(&self, tree: &[AtomicU64]) -> Option<u32> {
        self.largest_free_in(tree, 0, 0)
    }

    fn largest_free_in(&self, tree: &[AtomicU64], band: usize, bunch: u64) -> Option<u32> {
        let b = self.bands[band];
        let word = tree[b.base + bunch as usize].load(Ordering::Acquire);
        for r in 0..b.height {
            if self.available_row(band, word, r) != 0 {
                return Some(b.top + r);
            }
        }
        if b.leaf {
            return None;
        }
        let enterable = self.enterable_children(band, word);
        let occupied = self.occupied_children(band, word);
        if enterable & !occupied != 0 {
            return Some(b.top + b.height);
        }
        let mut best: Option<u32> = None;
        let mut partial = enterable & occupied;
        while partial != 0 {
            let child = (bunch << b.height) | partial.trailing_zeros() as u64;
            if let Some(level) = self.largest_free_in(tree, band + 1, child) {
                best = Some(best.map_or(level, |l| l.min(level)));
                if level == b.top + b.height {
                    break;
                }
            }
            partial &= partial - 1;
        }
        best
    }

    /// Every allocated node, in address order. Meant for a quiescent tree.
    pub(crate) fn for_each_allocated(&self, tree: &[AtomicU64], f: &mut dyn FnMut(Node)) {
        self.allocated_in(tree, 0, 0, f);
    }

    fn allocated_in(&self, tree: &[AtomicU64], band: usize, bunch: u64, f: &mut dyn FnMut(Node)) {
        let b = self.bands[band];
        let word = tree[b.base + bunch as usize].load(Ordering::Acquire);
        if self.is_empty(band, word) {
            return;
        }
        // Nodes in address order: visit the bunch's rows, then the children, ordered by start.
        let mut found: Vec<Node> = Vec::new();
        for r in 0..b.height {
            let mut row = row_of(word, r);
            while row != 0 {
                let pos = row.trailing_zeros() as u64;
                found.push(Node {
                    level: b.top + r,
                    index: (bunch << r) | pos,
                });
                row &= row - 1;
            }
        }
        let mut children: Vec<u64> = Vec::new();
        let mut occupied = self.occupied_children(band, word);
        while occupied != 0 {
            children.push((bunch << b.height) | occupied.trailing_zeros() as u64);
            occupied &= occupied - 1;
        }
        found.sort_by_key(|n| n.start(self.depth));
        let child_top = b.top + b.height;
        let mut next_child = children.into_iter().peekable();
        for node in found {
            while let Some(&child) = next_child.peek() {
                let child_start = Node {
                    level: child_top,
                    index: child,
                }
                .start(self.depth);
                if child_start >= node.start(self.depth) {
                    break;
                }
                self.allocated_in(tree, band + 1, child, f);
                next_child.next();
            }
            f(node);
        }
        for child in next_child {
            self.allocated_in(tree, band + 1, child, f);
        }
    }

    /// Check the structural invariants of a quiescent tree; report each violation through
    /// `report` with the word index and what is wrong.
    pub(crate) fn check(&self, tree: &[AtomicU64], report: &mut dyn FnMut(String)) {
        for (band, b) in self.bands.iter().enumerate() {
            for bunch in 0..(1u64 << b.top) {
                let index = b.base + bunch as usize;
                let word = tree[index].load(Ordering::Acquire);
                let alloc_bits = low_bits((1u32 << b.height) - 1);
                let allowed = if b.leaf {
                    alloc_bits
                } else {
                    alloc_bits | (low_bits(1 << b.height) << OCC_SHIFT) | !INNER_STATE_MASK
                };
                if word & !allowed != 0 {
                    report(format!(
                        "tree word {index}: stray bits {:#x}",
                        word & !allowed
                    ));
                }
                let mut down = 0;
                for r in 0..b.height {
                    let row = row_of(word, r);
                    if to_children(down) & row != 0 {
                        report(format!(
                            "tree word {index}: nested allocation at level {} (an ancestor is allocated)",
                            b.top + r
                        ));
                    }
                    down = to_children(down) | row;
                }
                if !b.leaf {
                    let occupied = self.occupied_children(band, word);
                    if to_children(down) & occupied != 0 {
                        report(format!(
                            "tree word {index}: an allocated node covers an occupied child bunch"
                        ));
                    }
                    for j in 0..(1u64 << b.height) {
                        let child = (bunch << b.height) | j;
                        let child_word = tree[self.bands[band + 1].base + child as usize]
                            .load(Ordering::Acquire);
                        let child_empty = self.is_empty(band + 1, child_word);
                        let marked = occupied & (1 << j) != 0;
                        if marked == child_empty {
                            report(format!(
                                "tree word {index}: child bunch {child} is {} but marked {}",
                                if child_empty { "empty" } else { "occupied" },
                                if marked { "occupied" } else { "empty" }
                            ));
                        }
                    }
                }
            }
        }
    }

    /// The maximal aligned nodes that exactly cover units `[from, to)`, in address order.
    pub(crate) fn cover(&self, from: u64, to: u64) -> Vec<Node> {
        let total = 1u64 << self.depth;
        debug_assert!(from <= to && to <= total);
        let mut nodes = Vec::new();
        let mut start = from;
        while start < to {
            let mut units = if start == 0 {
                total
            } else {
                1u64 << start.trailing_zeros()
            };
            while start + units > to {
                units >>= 1;
            }
            nodes.push(Node::covering(self.depth, start, units));
            start += units;
        }
        nodes
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn tree(shape: &TreeShape) -> Vec<AtomicU64> {
        (0..shape.words()).map(|_| AtomicU64::new(0)).collect()
    }

    fn alloc(shape: &TreeShape, t: &[AtomicU64], level: u32) -> Option<Node> {
        shape.search(t, level, 1, &mut |n| shape.try_alloc(t, n))
    }

    fn check_clean(shape: &TreeShape, t: &[AtomicU64]) {
        let mut findings = Vec::new();
        shape.check(t, &mut |f| findings.push(f));
        assert!(findings.is_empty(), "{findings:?}");
    }

    #[test]
    fn bands_of_a_default_chunk() {
        // 2 MiB chunk of 256-byte leaves: 14 levels = 4 + 4 + 6.
        let shape = TreeShape::new(13);
        assert_eq!(shape.bands(), 3);
        assert_eq!(shape.bands[0].height, 4);
        assert_eq!(shape.bands[2].height, 6);
        assert_eq!(shape.bands[2].top, 8);
        // 1 + 16 + 256 words, padded to 16.
        assert_eq!(shape.words(), 288);
        // A tiny tree is a single leaf bunch.
        let tiny = TreeShape::new(3);
        assert_eq!(tiny.bands(), 1);
        assert!(tiny.bands[0].leaf);
    }

    #[test]
    fn fills_every_level_exactly() {
        for depth in [1u32, 3, 5, 6, 7, 9, 13] {
            let shape = TreeShape::new(depth);
            for level in 0..=depth {
                let t = tree(&shape);
                let mut seen = HashSet::new();
                for _ in 0..(1u64 << level) {
                    let node = alloc(&shape, &t, level).expect("room left");
                    assert_eq!(node.level, level);
                    assert!(seen.insert(node.index), "node handed out twice");
                }
                assert_eq!(
                    alloc(&shape, &t, level),
                    None,
                    "depth {depth} level {level}"
                );
                assert_eq!(alloc(&shape, &t, depth), None);
                check_clean(&shape, &t);
                for index in seen {
                    shape.release(&t, Node { level, index }).unwrap();
                }
                check_clean(&shape, &t);
                // Fully merged again: the root is allocatable.
                assert_eq!(alloc(&shape, &t, 0), Some(Node { level: 0, index: 0 }));
            }
        }
    }

    #[test]
    fn nested_allocations_are_refused() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        let big = Node { level: 5, index: 3 };
        shape.try_alloc(&t, big).unwrap();
        // A leaf inside it: same region, deeper band; the climb meets the ancestor.
        let leaf = Node {
            level: 13,
            index: 3 << 8,
        };
        assert_eq!(shape.try_alloc(&t, leaf), Err(Conflict::Ancestor));
        // The parent: its bunch sees the allocated child below it.
        assert_eq!(
            shape.try_alloc(&t, Node { level: 4, index: 1 }),
            Err(Conflict::Taken)
        );
        assert_eq!(shape.try_alloc(&t, big), Err(Conflict::Taken));
        check_clean(&shape, &t);
        shape.release(&t, big).unwrap();
        assert_eq!(shape.release(&t, big), Err(()));
        shape.try_alloc(&t, leaf).unwrap();
        assert_eq!(shape.try_alloc(&t, big), Err(Conflict::Taken));
        assert_eq!(
            shape.try_alloc(&t, Node { level: 0, index: 0 }),
            Err(Conflict::Taken)
        );
        check_clean(&shape, &t);
    }

    #[test]
    fn largest_free_level_tracks_splits() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        assert_eq!(shape.largest_free_level(&t), Some(0));
        let leaf = alloc(&shape, &t, 13).unwrap();
        assert_eq!(shape.largest_free_level(&t), Some(1));
        let half = alloc(&shape, &t, 1).unwrap();
        assert_eq!(half.index, 1, "the empty half is taken whole");
        assert_eq!(shape.largest_free_level(&t), Some(2));
        shape.release(&t, leaf).unwrap();
        assert_eq!(shape.largest_free_level(&t), Some(1));
        shape.release(&t, half).unwrap();
        assert_eq!(shape.largest_free_level(&t), Some(0));
    }

    #[test]
    fn alignment_steps_are_honoured() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        let first = alloc(&shape, &t, 13).unwrap();
        assert_eq!(first.index, 0);
        let aligned = shape
            .search(&t, 13, 16, &mut |n| shape.try_alloc(&t, n))
            .unwrap();
        assert_eq!(aligned.index % 16, 0);
        assert_ne!(aligned.index, 0);
    }

    #[test]
    fn enumerates_allocations_in_address_order() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        let mut expected = Vec::new();
        for level in [13u32, 3, 9, 13, 7, 12] {
            expected.push(alloc(&shape, &t, level).unwrap());
        }
        expected.sort_by_key(|n| n.start(13));
        let mut seen = Vec::new();
        shape.for_each_allocated(&t, &mut |n| seen.push(n));
        assert_eq!(seen, expected);
    }

    #[test]
    fn cover_is_exact_and_maximal() {
        let shape = TreeShape::new(13);
        let total = 1u64 << 13;
        for (from, to) in [(0, total), (0, 6144), (6144, total), (5, 77), (100, 101)] {
            let nodes = shape.cover(from, to);
            let mut at = from;
            for n in &nodes {
                assert_eq!(n.start(13), at);
                at += n.units(13);
            }
            assert_eq!(at, to);
        }
        assert_eq!(shape.cover(0, total), vec![Node { level: 0, index: 0 }]);
        assert_eq!(shape.cover(0, 6144).len(), 2);
    }

    #[test]
    fn concurrent_alloc_free_never_overlaps() {
        let shape = Arc::new(TreeShape::new(10));
        let t: Arc<Vec<AtomicU64>> = Arc::new(tree(&shape));
        let owners: Arc<Vec<AtomicU64>> = Arc::new((0..1024).map(|_| AtomicU64::new(0)).collect());
        let threads: Vec<_> = (0..4u64)
            .map(|id| {
                let (shape, t, owners) = (shape.clone(), t.clone(), owners.clone());
                std::thread::spawn(move || {
                    let mut rng = id * 7919 + 1;
                    let mut held: Vec<Node> = Vec::new();
                    for _ in 0..20_000 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        if held.len() < 8 && rng % 3 != 0 {
                            let level = 4 + (rng >> 8) as u32 % 7;
                            if let Some(n) =
                                shape.search(&t, level, 1, &mut |n| shape.try_alloc(&t, n))
                            {
                                for u in n.start(10)..n.start(10) + n.units(10) {
                                    let prev = owners[u as usize].swap(id + 1, Ordering::SeqCst);
                                    assert_eq!(prev, 0, "unit {u} handed out twice");
                                }
                                held.push(n);
                            }
                        } else if let Some(n) = held.pop() {
                            for u in n.start(10)..n.start(10) + n.units(10) {
                                assert_eq!(owners[u as usize].swap(0, Ordering::SeqCst), id + 1);
                            }
                            shape.release(&t, n).unwrap();
                        }
                    }
                    for n in held {
                        for u in n.start(10)..n.start(10) + n.units(10) {
                            owners[u as usize].store(0, Ordering::SeqCst);
                        }
                        shape.release(&t, n).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        check_clean(&shape, &t);
        assert_eq!(
            shape.largest_free_level(&t),
            Some(0),
            "everything merged back"
        );
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! Exhaustive interleavings of the claim/climb/release/propagate protocol on trees of three
    //! levels cut into three bands of height one, so that every step crosses a word boundary.
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn setup() -> (Arc<TreeShape>, Arc<Vec<AtomicU64>>) {
        let shape = TreeShape::with_heights(2, 1, 1);
        let t = (0..shape.words()).map(|_| AtomicU64::new(0)).collect();
        (Arc::new(shape), Arc::new(t))
    }

    fn overlaps(a: Node, b: Node) -> bool {
        let (a0, a1) = (a.start(2), a.start(2) + a.units(2));
        let (b0, b1) = (b.start(2), b.start(2) + b.units(2));
        a0 < b1 && b0 < a1
    }

    fn quiescent_ok(shape: &TreeShape, t: &[AtomicU64]) {
        let mut findings = Vec::new();
        shape.check(t, &mut |f| findings.push(f));
        assert!(findings.is_empty(), "{findings:?}");
    }

    #[test]
    fn leaf_and_ancestor_race_never_both_win() {
        loom::model(|| {
            let (shape, t) = setup();
            let (s2, t2) = (shape.clone(), t.clone());
            let leaf = Node { level: 2, index: 1 };
            let parent = Node { level: 1, index: 0 };
            let h = thread::spawn(move || s2.try_alloc(&t2, leaf).is_ok());
            let got_parent = shape.try_alloc(&t, parent).is_ok();
            let got_leaf = h.join().unwrap();
            assert!(
                !(got_leaf && got_parent),
                "overlapping blocks both allocated"
            );
            assert!(
                got_leaf || got_parent,
                "both failed although one always fits"
            );
            quiescent_ok(&shape, &t);
        });
    }

    #[test]
    fn concurrent_frees_merge_completely() {
        loom::model(|| {
            let (shape, t) = setup();
            let a = Node { level: 2, index: 0 };
            let b = Node { level: 2, index: 1 };
            shape.try_alloc(&t, a).unwrap();
            shape.try_alloc(&t, b).unwrap();
            let (s2, t2) = (shape.clone(), t.clone());
            let h = thread::spawn(move || s2.release(&t2, b).unwrap());
            shape.release(&t, a).unwrap();
            h.join().unwrap();
            quiescent_ok(&shape, &t);
            // No phantom occupancy left: the root is free again.
            assert!(shape.try_alloc(&t, Node { level: 0, index: 0 }).is_ok());
        });
    }

    #[test]
    fn free_racing_an_ancestor_allocation() {
        loom::model(|| {
            let (shape, t) = setup();
            let leaf = Node { level: 2, index: 2 };
            shape.try_alloc(&t, leaf).unwrap();
            let (s2, t2) = (shape.clone(), t.clone());
            let h = thread::spawn(move || s2.release(&t2, leaf).unwrap());
            let parent = Node { level: 1, index: 1 };
            let got = shape.try_alloc(&t, parent).is_ok();
            h.join().unwrap();
            quiescent_ok(&shape, &t);
            if got {
                assert!(shape.is_allocated(&t, parent));
                shape.release(&t, parent).unwrap();
            }
            assert!(shape.try_alloc(&t, Node { level: 0, index: 0 }).is_ok());
        });
    }

    #[test]
    fn three_threads_alloc_free_and_merge() {
        loom::model(|| {
            let (shape, t) = setup();
            let held = Node { level: 2, index: 3 };
            shape.try_alloc(&t, held).unwrap();
            let (s1, t1) = (shape.clone(), t.clone());
            let freer = thread::spawn(move || s1.release(&t1, held).unwrap());
            let (s2, t2) = (shape.clone(), t.clone());
            let leaf_taker =
                thread::spawn(move || s2.search(&t2, 2, 1, &mut |n| s2.try_alloc(&t2, n)));
            let half = shape.search(&t, 1, 1, &mut |n| shape.try_alloc(&t, n));
            freer.join().unwrap();
            let leaf = leaf_taker.join().unwrap();
            if let (Some(l), Some(h)) = (leaf, half) {
                assert!(!overlaps(l, h), "{l:?} overlaps {h:?}");
            }
            quiescent_ok(&shape, &t);
            for n in [leaf, half].into_iter().flatten() {
                shape.release(&t, n).unwrap();
            }
            quiescent_ok(&shape, &t);
            assert!(shape.try_alloc(&t, Node { level: 0, index: 0 }).is_ok());
        });
    }

    #[test]
    fn allocation_racing_the_last_free_of_its_bunch() {
        // The ABA case the versions exist for: T1 frees the last leaf of a bunch and starts
        // clearing the occupied bit above while T2 allocates in that bunch and climbs.
        loom::model(|| {
            let (shape, t) = setup();
            let a = Node { level: 2, index: 0 };
            shape.try_alloc(&t, a).unwrap();
            let (s1, t1) = (shape.clone(), t.clone());
            let freer = thread::spawn(move || s1.release(&t1, a).unwrap());
            let b = Node { level: 2, index: 1 };
            let got_b = shape.try_alloc(&t, b).is_ok();
            freer.join().unwrap();
            assert!(got_b, "the leaf was free all along");
            quiescent_ok(&shape, &t);
            // b is committed: its ancestors must not be allocatable.
            assert_eq!(
                shape.try_alloc(&t, Node { level: 1, index: 0 }),
                Err(Conflict::Taken)
            );
            assert_eq!(
                shape.try_alloc(&t, Node { level: 0, index: 0 }),
                Err(Conflict::Taken)
            );
        });
    }
}

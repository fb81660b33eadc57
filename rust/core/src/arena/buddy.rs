//! A lock-free buddy tree over one chunk, its metadata outside the managed memory.
//!
//! # Shape
//!
//! The tree has `depth + 1` levels: level 0 is the whole chunk, level `depth` holds the leaves
//! (one `min_block` each). Node `(level, index)` covers units `[index << (depth - level),
//! (index + 1) << (depth - level))`.
//!
//! Levels are grouped into *bands*; each band is cut into *bunches* (subtrees of the band's
//! height), and each bunch is one `AtomicU64`, so a climb from a leaf to the root touches one
//! word per band instead of one per level (the level packing of NBBS, Marotta et al.):
//!
//! * a **leaf bunch** (bottom band, height <= 6) holds one *allocated* bit per node in heap
//!   order (up to 63 bits) and a *seal* bit (bit 63);
//! * an **inner bunch** (height <= 4) holds the allocated bits of its nodes (bits 0..15), one
//!   *occupied* bit per child bunch (bits 16..31: something below may be allocated) and a seal
//!   bit (bit 32).
//!
//! # Protocol
//!
//! *Allocate* node `n`: CAS its bunch to set `n`'s bit, provided `n`, its ancestors and its
//! descendants in the bunch are clear, no child bunch below `n` is marked occupied and the bunch
//! is not sealed. Then climb: in each ancestor bunch, check that no node on the path is allocated
//! and that the occupied bit of the bunch we come from is set; set it with a CAS if it is not (a
//! plain load suffices when it is). Meeting an allocated ancestor means someone allocated a node
//! covering ours first: roll back (clear `n`'s bit) and report it.
//!
//! *Release* node `n`: CAS its bit off. Nothing else: coalescing is lazy. The occupied bits above
//! an emptied bunch stay set (a *phantom* mark) until someone needs the space: a search for a
//! large node that finds its candidates blocked only by marks, or the retirement of the chunk.
//!
//! *Clean* a marked child bunch `B` of `P`: if `B` is exactly zero, CAS it to *sealed* (so no
//! allocation can start in it), clear `B`'s occupied bit in `P`, then unseal `B`. An allocation
//! that committed in `B` keeps `B` non-zero, so the seal fails; one that starts after the seal
//! sees it and looks elsewhere; one that starts after the unseal finds the mark cleared and sets
//! it again (with a CAS that also checks the path). So a mark can only disappear under a bunch
//! that was empty at a moment when no allocation could enter it, and by induction every
//! committed block keeps every mark on its path to the root: no ancestor can be allocated over
//! it. This is also why a climber may pass an already set mark with a plain load.
//!
//! The loom models in this module check the protocol exhaustively on small trees.

use crate::util::bits::{every_nth, low_bits, siblings, to_children, to_parents};
use crate::util::sync::{AtomicU64, Ordering};
use std::cell::Cell;

/// Height of the bottom band (leaf bunches): 63 allocated bits and a seal fit one word.
pub(crate) const LEAF_BAND_HEIGHT: u32 = 6;
/// Height of the other bands: 15 allocated bits, 16 occupied bits and a seal.
pub(crate) const INNER_BAND_HEIGHT: u32 = 4;

const OCC_SHIFT: u32 = 16;
const INNER_SEAL: u64 = 1 << 32;
const LEAF_SEAL: u64 = 1 << 63;

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
        let shift = units.trailing_zeros();
        Node { level: depth - shift, index: start >> shift }
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
    /// The node, or something inside it or above it in its bunch, is taken (or being cleaned).
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
    /// The bottom band has no child bunches.
    leaf: bool,
}

impl Band {
    fn seal(&self) -> u64 {
        if self.leaf {
            LEAF_SEAL
        } else {
            INNER_SEAL
        }
    }

    /// The allocated bits of the bunch.
    fn alloc_mask(&self) -> u64 {
        low_bits((1 << self.height) - 1)
    }

    /// The occupied bits of the bunch (0 for leaf bunches).
    fn occ_mask(&self) -> u64 {
        if self.leaf {
            0
        } else {
            low_bits(1 << self.height) << OCC_SHIFT
        }
    }
}

/// Where a node's bit lives.
#[derive(Debug, Clone, Copy)]
struct Loc {
    band: usize,
    bunch: u64,
    word: usize,
    bit: u64,
}

/// Free units around a unit (see [`TreeShape::free_span_at`]).
struct FreeSpan {
    lo: u64,
    hi: u64,
    lo_bounded: bool,
    hi_bounded: bool,
}

/// Room for the levels of any tree (at most `MAX_TREE_DEPTH + 1`) in [`TreeShape`]'s tables
/// by level: a level masked to this many slots indexes them without a bounds check.
const LEVEL_SLOTS: usize = 32;
/// Room for the bands of any tree in [`TreeShape`]'s tables by band (as [`LEVEL_SLOTS`]).
const BAND_SLOTS: usize = 32;

/// Where the nodes of one level live: the band, its first level and its first word.
#[derive(Debug, Clone, Copy, Default)]
struct LevelLoc {
    band: usize,
    top: u32,
    base: usize,
}

/// Up to this many allocated nodes in a bunch, [`TreeShape::available_row`] rules out each
/// one's span of the row in turn instead of moving whole rows.
const FEW_NODES: u32 = 4;

/// The most nodes [`TreeShape::release_block`] releases at once.
pub(crate) const MAX_BLOCK_NODES: usize = 10;

/// Per height `h` of an inner band (1 to [`INNER_BAND_HEIGHT`]), per value of the allocated
/// bits of a bunch's rows but the last (`2^(h-1) - 1` bits, at most 7): the child bunches those
/// nodes cover (bit `j`: child `j`), what [`TreeShape::row_covered`] reads.
static UPPER_COVERS: [[u16; 128]; INNER_BAND_HEIGHT as usize + 1] = upper_covers();

/// Per value of the last row of an inner bunch (at most 8 nodes): the child bunches its
/// allocated nodes cover, two each (what [`TreeShape::row_covered`] reads).
static LAST_COVERS: [u16; 256] = last_covers();

const fn last_covers() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut row = 0;
    while row < 256 {
        let mut i = 0;
        while i < 8 {
            if row >> i & 1 != 0 {
                table[row] |= 3 << (2 * i);
            }
            i += 1;
        }
        row += 1;
    }
    table
}

const fn upper_covers() -> [[u16; 128]; INNER_BAND_HEIGHT as usize + 1] {
    let mut table = [[0u16; 128]; INNER_BAND_HEIGHT as usize + 1];
    let mut height = 1;
    while height <= INNER_BAND_HEIGHT {
        let width = 1u32 << height;
        let mut bits = 1u32;
        while bits < 1 << ((1 << (height - 1)) - 1) {
            let (mut rest, mut covered) = (bits, 0u32);
            while rest != 0 {
                let bit = rest.trailing_zeros();
                let r = 31 - (bit + 1).leading_zeros(); // heap row of the bit
                let span = width >> r;
                covered |= ((1 << span) - 1) << ((bit + 1 - (1 << r)) * span);
                rest &= rest - 1;
            }
            table[height as usize][bits as usize] = covered as u16;
            bits += 1;
        }
        height += 1;
    }
    table
}

/// Leaf bunches a [`LeafMap`] holds, at most: a tree of 8,192 units with leaf bunches of 32.
pub(crate) const MAX_LEAF_BUNCHES: usize = 256;

/// A chunk's leaf bunches as the inner bands see them, one bit per leaf bunch (bit `k % 64` of
/// word `k / 64`), from one read of the inner bands' marked words
/// ([`TreeShape::leaf_map`]): `covered`, an allocated node of an inner band covers the bunch
/// (all its units are taken); `marked`, it is not covered and the bunch above marks it
/// occupied (its own word says which of its units are allocated:
/// [`TreeShape::leaf_allocated`]); neither, none of its units is allocated.
pub(crate) struct LeafMap {
    pub(crate) covered: [u64; MAX_LEAF_BUNCHES / 64],
    pub(crate) marked: [u64; MAX_LEAF_BUNCHES / 64],
    /// The number of leaf bunches.
    pub(crate) bunches: u64,
    /// The units of one leaf bunch (at most 32).
    pub(crate) units: u64,
}

/// The geometry of every chunk's tree; the metadata itself is a `[AtomicU64]` of
/// [`TreeShape::words`] words per chunk, owned by the caller.
#[derive(Debug)]
pub(crate) struct TreeShape {
    depth: u32,
    bands: Vec<Band>,
    band_of_level: Vec<usize>,
    /// Per level, where its nodes live (what [`TreeShape::locate`] reads).
    level_locs: [LevelLoc; LEVEL_SLOTS],
    words: usize,
    /// Per band, per node (heap bit index): the bits that must all be clear for the node to be
    /// allocatable: itself, its ancestors and descendants in the bunch, the occupied bits of the
    /// child bunches below it, and the seal. Fixed-size rows, so that a lookup on the claim
    /// path needs no bounds check (boxed: a shape stays small on a stack).
    conflicts: Box<[[u64; 64]; BAND_SLOTS]>,
    /// Per band, per child bunch: the allocated bits of every node on the path from the
    /// bunch's root to that child (what a climb from the child must find clear).
    paths: Box<[[u64; 16]; BAND_SLOTS]>,
    /// Per band, per node: its own bit, its descendants' bits in the bunch and the occupied bits
    /// of the child bunches below it.
    subtrees: Box<[[u64; 64]; BAND_SLOTS]>,
    /// How often an allocation or a search of any tree of this shape met a sealed bunch: such
    /// a search may record a miss that no free undoes (`reveal.rs`), and meeting a seal is the
    /// only way one comes about. Counted before the search returns, so before its miss.
    seals: AtomicU64,
    /// The count of seals that the last complete reveal covered; `u64::MAX` before the first.
    revealed: AtomicU64,
}

/// What a search looks for: a node at `level` whose index is a multiple of `step`, visiting
/// bunch `from` of the level's band (a cursor) first if given.
#[derive(Clone, Copy)]
struct Goal<'s> {
    level: u32,
    step: u64,
    from: Option<u64>,
    summary: Option<&'s Summary<'s>>,
}

/// The per-bunch summaries of one chunk's tree, parallel to its words: the word of a bunch of
/// any band but the top one holds a level `v` such that no node of a level below `v` (a larger
/// node) is free in the bunch or in the bunches below it; 0 when nothing is known. A search for
/// a node at `level` skips a bunch whose summary is above `level`, and raises it after
/// searching the bunch (and what lies below it) in vain, so a search that fails in a crowded
/// tree skips whole subtrees of leaf bunches; a free lowers the summary of every bunch around
/// the node it released to the level of the largest free node around it, but never below the
/// bunch's top level ([`TreeShape::announce_in_bunches`]). A bunch whose contents were all
/// freed therefore has a summary at most its top level, which rules out nothing inside it: an
/// ancestor node allocated over it and freed again leaves no stale summary there. A search
/// whose claim met an allocated ancestor records no miss (its bunch may be free once that
/// ancestor goes).
///
/// The same handshake as the chunk's level maps (`level_maps.rs`): a search records a miss
/// (`fetch_max`) and then asks `moved` (a read-modify-write of the chunk's free-space word)
/// whether a free came since it began, undoing the record if so; a free reads the summaries
/// only after its own epoch step.
pub(crate) struct Summary<'a> {
    words: &'a [AtomicU64],
    moved: &'a dyn Fn() -> bool,
    /// Whether a claim of the search met an allocated ancestor (in the bunch being searched).
    blocked: Cell<bool>,
}

impl<'a> Summary<'a> {
    /// The summaries `words` of a chunk's tree, for a search that asks `moved` whether a free
    /// came since it began.
    #[inline]
    pub(crate) fn new(words: &'a [AtomicU64], moved: &'a dyn Fn() -> bool) -> Summary<'a> {
        Summary { words, moved, blocked: Cell::new(false) }
    }

    #[inline]
    fn skips(&self, word: usize, level: u32) -> bool {
        self.words[word].load(Ordering::Acquire) > u64::from(level)
    }

    fn record_miss(&self, word: usize, level: u32) {
        self.words[word].fetch_max(u64::from(level) + 1, Ordering::AcqRel);
        if (self.moved)() {
            self.words[word].store(0, Ordering::Release);
        }
    }
}

/// The set bits of `mask`, from bit `start` up, then those below it.
#[inline]
fn rotated(mask: u64, start: u32) -> impl Iterator<Item = u32> {
    let high = mask & !low_bits(start);
    let low = mask & low_bits(start);
    [high, low].into_iter().flat_map(|mut bits| {
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let j = bits.trailing_zeros();
                bits &= bits - 1;
                j
            })
        })
    })
}

/// Set bits `[from, to)` of a bitmap (bit `i % 64` of word `i / 64`).
fn set_bits(bits: &mut [u64], from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let w = (i / 64) as usize;
        let lo = i % 64;
        let n = (to - i).min(64 - lo);
        let mask = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << lo };
        bits[w] |= mask;
        i += n;
    }
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
            bands.push(Band { top, height, base, leaf: i + 1 == heights.len() });
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
        assert!(levels as usize <= LEVEL_SLOTS && bands.len() <= BAND_SLOTS);
        let mut level_locs = [LevelLoc::default(); LEVEL_SLOTS];
        for (level, &band) in band_of_level.iter().enumerate() {
            level_locs[level] = LevelLoc { band, top: bands[band].top, base: bands[band].base };
        }
        let mut conflicts: Box<[[u64; 64]; BAND_SLOTS]> =
            vec![[0u64; 64]; BAND_SLOTS].into_boxed_slice().try_into().expect("BAND_SLOTS rows");
        let mut paths: Box<[[u64; 16]; BAND_SLOTS]> =
            vec![[0u64; 16]; BAND_SLOTS].into_boxed_slice().try_into().expect("BAND_SLOTS rows");
        for (i, b) in bands.iter().enumerate() {
            for (slot, mask) in conflicts[i].iter_mut().zip(Self::conflict_masks(b)) {
                *slot = mask;
            }
            for (j, slot) in paths[i].iter_mut().enumerate().take(1 << b.height) {
                *slot = path_mask(b.height, j as u64);
            }
        }
        let mut subtrees: Box<[[u64; 64]; BAND_SLOTS]> =
            vec![[0u64; 64]; BAND_SLOTS].into_boxed_slice().try_into().expect("BAND_SLOTS rows");
        for (i, b) in bands.iter().enumerate() {
            for (slot, mask) in subtrees[i].iter_mut().zip(Self::subtree_masks(b)) {
                *slot = mask;
            }
        }
        TreeShape {
            depth,
            bands,
            band_of_level,
            level_locs,
            words,
            conflicts,
            paths,
            subtrees,
            seals: AtomicU64::new(0),
            revealed: AtomicU64::new(u64::MAX),
        }
    }

    fn subtree_masks(band: &Band) -> Vec<u64> {
        let h = band.height;
        let bit = |r: u32, pos: u64| 1u64 << ((1u64 << r) - 1 + pos);
        let mut masks = Vec::new();
        for r in 0..h {
            for pos in 0..(1u64 << r) {
                let mut mask = 0;
                for k in r..h {
                    let span = k - r;
                    for p in pos << span..(pos + 1) << span {
                        mask |= bit(k, p);
                    }
                }
                if !band.leaf {
                    let span = h - r;
                    for j in pos << span..(pos + 1) << span {
                        mask |= 1u64 << (OCC_SHIFT as u64 + j);
                    }
                }
                masks.push(mask);
            }
        }
        masks
    }

    fn conflict_masks(band: &Band) -> Vec<u64> {
        let h = band.height;
        let bit = |r: u32, pos: u64| 1u64 << ((1u64 << r) - 1 + pos);
        let mut masks = Vec::new();
        for r in 0..h {
            for pos in 0..(1u64 << r) {
                let mut mask = band.seal();
                for k in 0..=r {
                    mask |= bit(k, pos >> (r - k)); // itself and its ancestors
                }
                for k in r + 1..h {
                    let span = k - r;
                    for p in pos << span..(pos + 1) << span {
                        mask |= bit(k, p); // its descendants
                    }
                }
                if !band.leaf {
                    let span = h - r;
                    for j in pos << span..(pos + 1) << span {
                        mask |= 1u64 << (OCC_SHIFT as u64 + j); // child bunches below it
                    }
                }
                masks.push(mask);
            }
        }
        masks
    }

    /// Metadata words per tree.
    pub(crate) fn words(&self) -> usize {
        self.words
    }

    /// The first level that bunches with summaries hold (every band below the top one; past
    /// the deepest level when the tree is one band, which has none).
    #[inline]
    pub(crate) fn summarized_from(&self) -> u32 {
        match self.bands.len() {
            1 => self.depth + 1,
            _ => self.bands[1].top,
        }
    }

    /// The number of words a climb from a leaf touches (one per band).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn bands(&self) -> usize {
        self.bands.len()
    }

    #[inline]
    fn locate(&self, node: Node) -> Loc {
        let at = self.level_locs[node.level as usize % LEVEL_SLOTS];
        let row = node.level - at.top;
        let bunch = node.index >> row;
        let pos = node.index & low_bits(row);
        Loc { band: at.band, bunch, word: at.base + bunch as usize, bit: 1u64 << ((1u64 << row) - 1 + pos) }
    }

    /// The conflict mask of the node at `loc`.
    #[inline]
    fn conflicts_of(&self, loc: Loc) -> u64 {
        self.conflicts[loc.band % BAND_SLOTS][loc.bit.trailing_zeros() as usize % 64]
    }

    fn word<'t>(&self, tree: &'t [AtomicU64], band: usize, bunch: u64) -> &'t AtomicU64 {
        &tree[self.bands[band].base + bunch as usize]
    }

    /// The occupied bits of a word's child bunches, as a row (0 for leaf bunches).
    fn occupied_children(&self, band: usize, word: u64) -> u64 {
        (word & self.bands[band].occ_mask()) >> OCC_SHIFT
    }

    /// Nodes of row `r` of a bunch that are free with nothing allocated above them in the bunch
    /// and nothing allocated or marked below them (a sealed bunch has none).
    fn available_row(&self, band: usize, word: u64, r: u32) -> u64 {
        let b = &self.bands[band];
        if word & b.seal() != 0 {
            self.saw_seal();
            return 0;
        }
        let height = b.height;
        let occupied = self.occupied_children(band, word);
        // Most bunches hold a few nodes: each one rules out its span of the row (or the one
        // node of the row above it), which is cheaper than moving whole rows up and down.
        let mut allocated = word & b.alloc_mask();
        let mut taken = 0u64;
        for _ in 0..FEW_NODES {
            if allocated == 0 {
                if occupied != 0 {
                    let mut up = occupied;
                    for _ in r..height {
                        up = to_parents(up);
                    }
                    taken |= up;
                }
                return !taken & low_bits(1 << r);
            }
            let bit = allocated.trailing_zeros();
            allocated &= allocated - 1;
            let i = 31 - (bit + 1).leading_zeros(); // heap row of the bit
            let pos = u64::from(bit + 1 - (1 << i));
            taken |= if i <= r {
                let span = r - i;
                low_bits(1 << span) << (pos << span)
            } else {
                1u64 << (pos >> (i - r))
            };
        }
        let row = row_of(word, r);
        // Most bunches hold blocks of one size: skip the propagation when nothing is allocated
        // above the row, or below it.
        let above = word & low_bits((1 << r) - 1);
        let below_mask = low_bits((1 << height) - 1) & !low_bits((1 << (r + 1)) - 1);
        let down = if above == 0 {
            row
        } else {
            let mut down = 0;
            for i in 0..=r {
                down = to_children(down) | row_of(word, i);
            }
            down
        };
        let up = if word & below_mask == 0 && occupied == 0 {
            row
        } else {
            let mut up = occupied;
            for i in (r..height).rev() {
                up = to_parents(up) | row_of(word, i);
            }
            up
        };
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
    #[inline]
    pub(crate) fn try_alloc(&self, tree: &[AtomicU64], node: Node) -> Result<(), Conflict> {
        let loc = self.locate(node);
        self.try_alloc_bits(tree, loc, loc.bit, self.conflicts_of(loc))
    }

    /// Claim the nodes whose bits are `bits` in the bunch at `loc` at once (one compare-and-swap,
    /// provided no bit of `conflicts`, their conflict masks together, is set), then climb to the
    /// root once. On `Err`, nothing is left claimed.
    #[inline(always)]
    fn try_alloc_bits(&self, tree: &[AtomicU64], loc: Loc, bits: u64, conflicts: u64) -> Result<(), Conflict> {
        let word = &tree[loc.word];
        let mut current = word.load(Ordering::Acquire);
        loop {
            if current & conflicts != 0 {
                if current & self.bands[loc.band].seal() != 0 {
                    self.saw_seal();
                }
                return Err(Conflict::Taken);
            }
            match word.compare_exchange_weak(current, current | bits, Ordering::AcqRel, Ordering::Acquire) {
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
            let path = self.paths[(band - 1) % BAND_SLOTS][j as usize % 16];
            let occupied = 1u64 << (OCC_SHIFT as u64 + j);
            let mut current = parent_word.load(Ordering::Acquire);
            loop {
                if current & path != 0 {
                    self.clear_bits(tree, loc.word, bits);
                    return Err(Conflict::Ancestor);
                }
                if current & occupied != 0 {
                    break; // marked already: it stays so while our block lives
                }
                if current & INNER_SEAL != 0 {
                    self.saw_seal();
                    self.clear_bits(tree, loc.word, bits);
                    return Err(Conflict::Taken); // being cleaned: try elsewhere
                }
                match parent_word.compare_exchange_weak(
                    current,
                    current | occupied,
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

    /// [`TreeShape::try_alloc_bits`] that, when only phantom marks of child bunches are in the
    /// way, cleans them and tries once more (see [`TreeShape::try_alloc_cleaning`]).
    #[inline(always)]
    fn try_alloc_bits_cleaning(&self, tree: &[AtomicU64], loc: Loc, bits: u64, conflicts: u64) -> Result<(), Conflict> {
        match self.try_alloc_bits(tree, loc, bits, conflicts) {
            Err(Conflict::Taken) => {}
            other => return other,
        }
        self.clean_and_retry(tree, loc, bits, conflicts)
    }

    /// The rest of [`TreeShape::try_alloc_bits_cleaning`], after its first try met a conflict:
    /// clean the phantom marks in the way, if only those are, and try once more.
    #[inline(never)]
    fn clean_and_retry(&self, tree: &[AtomicU64], loc: Loc, bits: u64, conflicts: u64) -> Result<(), Conflict> {
        let b = self.bands[loc.band];
        if b.leaf {
            return Err(Conflict::Taken);
        }
        let word = tree[loc.word].load(Ordering::Acquire);
        if word & conflicts & !b.occ_mask() != 0 {
            return Err(Conflict::Taken);
        }
        let mut marked = (word & conflicts & b.occ_mask()) >> OCC_SHIFT;
        while marked != 0 {
            let child = (loc.bunch << b.height) | marked.trailing_zeros() as u64;
            if !self.clean_child(tree, loc.band, loc.bunch, child) {
                return Err(Conflict::Taken);
            }
            marked &= marked - 1;
        }
        self.try_alloc_bits(tree, loc, bits, conflicts)
    }

    /// The run of nodes at the start of `nodes` (disjoint, in address order) that share the
    /// bunch of `nodes[0]`: its length, the bunch's location, their bits and their conflict
    /// masks together.
    #[inline]
    fn run_in_bunch(&self, nodes: &[Node]) -> (usize, Loc, u64, u64) {
        let loc = self.locate(nodes[0]);
        let (mut bits, mut conflicts) = (loc.bit, self.conflicts_of(loc));
        let mut n = 1;
        while let Some(&node) = nodes.get(n) {
            let l = self.locate(node);
            if l.word != loc.word {
                break;
            }
            bits |= l.bit;
            conflicts |= self.conflicts_of(l);
            n += 1;
        }
        (n, loc, bits, conflicts)
    }

    /// Claim the disjoint nodes of one block (in address order) together: those that share a
    /// bunch with one compare-and-swap and one climb, as [`TreeShape::try_alloc`] claims one
    /// (`cleaning`: as [`TreeShape::try_alloc_cleaning`]). On `Err((conflict, n))` nothing is
    /// left claimed, and the first `n` nodes were claimed and released again: a caller announces
    /// their release as a free does (`n == 0`: nothing changed).
    pub(crate) fn try_alloc_block(
        &self,
        tree: &[AtomicU64],
        nodes: &[Node],
        cleaning: bool,
    ) -> Result<(), (Conflict, usize)> {
        let mut done = 0;
        while done < nodes.len() {
            let (n, loc, bits, conflicts) = self.run_in_bunch(&nodes[done..]);
            let claimed = match cleaning {
                true => self.try_alloc_bits_cleaning(tree, loc, bits, conflicts),
                false => self.try_alloc_bits(tree, loc, bits, conflicts),
            };
            if let Err(conflict) = claimed {
                for &node in &nodes[..done] {
                    self.clear_bit(tree, self.locate(node));
                }
                return Err((conflict, done));
            }
            done += n;
        }
        Ok(())
    }

    /// Release the disjoint nodes of one block (in address order, at most
    /// [`MAX_BLOCK_NODES`]): `Err(())`, and nothing changes, unless every one of them is
    /// allocated. The nodes that share a bunch with the first are released with one
    /// compare-and-swap that finds them all allocated, which decides a race of two callers; the
    /// others with one `fetch_and` per bunch.
    pub(crate) fn release_block(&self, tree: &[AtomicU64], nodes: &[Node]) -> Result<(), ()> {
        let mut runs = [(0usize, 0u64); MAX_BLOCK_NODES];
        let mut count = 0;
        let mut done = 0;
        while done < nodes.len() {
            let (n, loc, bits, _) = self.run_in_bunch(&nodes[done..]);
            if tree[loc.word].load(Ordering::Acquire) & bits != bits {
                return Err(());
            }
            runs[count] = (loc.word, bits);
            count += 1;
            done += n;
        }
        let (first, bits) = runs[0];
        let word = &tree[first];
        let mut current = word.load(Ordering::Acquire);
        loop {
            if current & bits != bits {
                return Err(());
            }
            match word.compare_exchange_weak(current, current & !bits, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        for &(word, bits) in &runs[1..count] {
            self.clear_bits(tree, word, bits);
        }
        Ok(())
    }

    /// The level of the largest node that holds `node` and is free now, for a `node` just
    /// released: climb while the sibling's subtree is free. A marked child bunch whose word holds
    /// no allocated node counts as free (a search cleans such a mark when it needs the room),
    /// so the answer may be a larger node than a search can claim, never a smaller one.
    pub(crate) fn coalesced_level(&self, tree: &[AtomicU64], node: Node) -> u32 {
        let mut node = node;
        loop {
            let loc = self.locate(node);
            let b = self.bands[loc.band];
            let word = tree[loc.word].load(Ordering::Acquire);
            let mut r = node.level - b.top;
            let mut pos = node.index & low_bits(r);
            while r > 0 {
                let sibling = (1u64 << r) - 1 + (pos ^ 1);
                if !self.subtree_free(tree, loc.band, loc.bunch, word, sibling) {
                    return b.top + r;
                }
                r -= 1;
                pos >>= 1;
                if word & (1u64 << ((1u64 << r) - 1 + pos)) != 0 {
                    return b.top + r + 1;
                }
            }
            if loc.band == 0 {
                return 0;
            }
            // The bunch's top node is free: climb into the band above, past the sibling bunch.
            let parent = self.bands[loc.band - 1];
            let j = loc.bunch & low_bits(parent.height);
            let parent_bunch = loc.bunch >> parent.height;
            let parent_word = tree[parent.base + parent_bunch as usize].load(Ordering::Acquire);
            if parent_word & (1u64 << (OCC_SHIFT as u64 + (j ^ 1))) != 0
                && !self.child_empty(tree, loc.band, loc.bunch ^ 1)
            {
                return b.top;
            }
            let r = parent.height - 1;
            let pos = j >> 1;
            if parent_word & (1u64 << ((1u64 << r) - 1 + pos)) != 0 {
                return b.top;
            }
            // The node over both bunches is free: the climb goes on from it.
            node = Node { level: parent.top + r, index: (parent_bunch << r) | pos };
        }
    }

    /// The level of the largest node that holds `node` and lies inside units `[start, stop)`:
    /// for a free run read around a release ([`TreeShape::free_run_around`]), what
    /// [`TreeShape::coalesced_level`] climbs the tree to find, without reading it again. Both
    /// count a marked child bunch that holds no allocated node as free.
    pub(crate) fn level_in_run(&self, node: Node, (start, stop): (u64, u64)) -> u32 {
        let mut level = node.level;
        let mut first = node.start(self.depth);
        while level > 0 {
            let units = 2u64 << (self.depth - level);
            let parent = first & !(units - 1);
            if parent < start || parent + units > stop {
                break;
            }
            first = parent;
            level -= 1;
        }
        level
    }

    /// The level of the largest free node that holds `node`, just released: from `run`, the
    /// free run around the release when it was read ([`TreeShape::level_in_run`]), else
    /// climbed in the tree ([`TreeShape::coalesced_level`]).
    #[inline]
    pub(crate) fn coalesced_level_in(&self, tree: &[AtomicU64], node: Node, run: Option<(u64, u64)>) -> u32 {
        match run {
            Some(run) => self.level_in_run(node, run),
            None => self.coalesced_level(tree, node),
        }
    }

    /// After `node` was released (and the chunk's epoch advanced): lower the summary of each
    /// bunch around it (one per band below the top one) to the level of the largest free node
    /// around `from` (`node` itself, or a node released with it whose largest free node is at
    /// least as large), or to the bunch's top level if that is lower in the tree (the level is
    /// computed only when a summary is above its bunch's top level, from `run` when the free
    /// run around the release was read: [`TreeShape::coalesced_level_in`]). `coalesced`
    /// caches it.
    #[inline]
    pub(crate) fn announce_in_bunches(
        &self,
        tree: &[AtomicU64],
        summaries: &[AtomicU64],
        (node, from): (Node, Node),
        run: Option<(u64, u64)>,
        coalesced: &mut Option<u32>,
    ) {
        let mut band = self.band_of_level[node.level as usize];
        while band > 0 {
            let b = self.bands[band];
            let word = &summaries[b.base + (node.index >> (node.level - b.top)) as usize];
            let known = word.load(Ordering::Acquire);
            if known > u64::from(b.top) {
                let level = *coalesced.get_or_insert_with(|| self.coalesced_level_in(tree, from, run));
                let target = u64::from(level.max(b.top));
                if known > target {
                    word.fetch_min(target, Ordering::AcqRel);
                }
            }
            band -= 1;
        }
    }

    /// Whether a free of `node` has no summary to lower: every summary around it is at most
    /// its bunch's top level, so [`TreeShape::announce_in_bunches`] would change nothing (read
    /// after the chunk's epoch step, as that does).
    #[inline]
    pub(crate) fn summaries_settled(&self, summaries: &[AtomicU64], node: Node) -> bool {
        let at = self.level_locs[node.level as usize % LEVEL_SLOTS];
        if at.band == 0 {
            return true;
        }
        let own = &summaries[at.base + (node.index >> (node.level - at.top)) as usize];
        if own.load(Ordering::Acquire) > u64::from(at.top) {
            return false;
        }
        (1..at.band).all(|band| {
            let b = &self.bands[band];
            summaries[b.base + (node.index >> (node.level - b.top)) as usize].load(Ordering::Acquire)
                <= u64::from(b.top)
        })
    }

    /// Forget every summary of a tree (a chunk granted anew).
    pub(crate) fn reset_summaries(summaries: &[AtomicU64]) {
        for word in summaries {
            if word.load(Ordering::Acquire) != 0 {
                word.store(0, Ordering::Release);
            }
        }
    }

    /// Whether the subtree of heap bit `bit` of bunch `bunch` (word `word`) holds no allocated
    /// node: its bits in the word, and the words of its marked child bunches.
    fn subtree_free(&self, tree: &[AtomicU64], band: usize, bunch: u64, word: u64, bit: u64) -> bool {
        let mask = self.subtrees[band % BAND_SLOTS][bit as usize % 64];
        if word & mask & self.bands[band].alloc_mask() != 0 {
            return false;
        }
        let mut marked = (word & mask & self.bands[band].occ_mask()) >> OCC_SHIFT;
        let height = self.bands[band].height;
        while marked != 0 {
            let child = (bunch << height) | marked.trailing_zeros() as u64;
            if !self.child_empty(tree, band + 1, child) {
                return false;
            }
            marked &= marked - 1;
        }
        true
    }

    /// Whether bunch `bunch` of `band` and the bunches below it hold no allocated node (marks
    /// over empty bunches do not count: see [`TreeShape::coalesced_level`]). Stops at the first
    /// allocated node it meets.
    #[inline(always)]
    fn child_empty(&self, tree: &[AtomicU64], band: usize, bunch: u64) -> bool {
        let b = self.bands[band];
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        if word & b.alloc_mask() != 0 {
            return false;
        }
        b.leaf || self.children_empty(tree, band, bunch, word)
    }

    /// The rest of [`TreeShape::child_empty`] for a bunch of an inner band whose own word
    /// `word` holds no allocated node: whether its marked children are empty.
    #[inline(never)]
    fn children_empty(&self, tree: &[AtomicU64], band: usize, bunch: u64, word: u64) -> bool {
        let b = self.bands[band];
        let mut marked = self.occupied_children(band, word);
        while marked != 0 {
            if !self.child_empty(tree, band + 1, (bunch << b.height) | marked.trailing_zeros() as u64) {
                return false;
            }
            marked &= marked - 1;
        }
        true
    }

    /// Whether `node`'s own bit is set (it is allocated as a whole).
    pub(crate) fn is_allocated(&self, tree: &[AtomicU64], node: Node) -> bool {
        let loc = self.locate(node);
        tree[loc.word].load(Ordering::Acquire) & loc.bit != 0
    }

    /// Release an allocated node. `Err(())` when its bit was not set (nothing changes then).
    pub(crate) fn release(&self, tree: &[AtomicU64], node: Node) -> Result<(), ()> {
        if self.clear_bit(tree, self.locate(node)) {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Clear the bit at `loc`; `false` when it was already clear. Marks above stay (lazily).
    fn clear_bit(&self, tree: &[AtomicU64], loc: Loc) -> bool {
        self.clear_bits(tree, loc.word, loc.bit) & loc.bit != 0
    }

    /// Clear `bits` of word `word`; returns the word before. Marks above stay (lazily).
    #[inline]
    fn clear_bits(&self, tree: &[AtomicU64], word: usize, bits: u64) -> u64 {
        tree[word].fetch_and(!bits, Ordering::AcqRel)
    }

    /// Clean marked child bunch `child` of bunch `bunch` in `band`: clean its own marked
    /// children first, then, if it is empty, seal it, clear its mark and unseal it. Returns
    /// whether the mark is gone.
    fn clean_child(&self, tree: &[AtomicU64], band: usize, bunch: u64, child: u64) -> bool {
        let child_band = band + 1;
        let cb = self.bands[child_band];
        let child_word = self.word(tree, child_band, child);
        let mut word = child_word.load(Ordering::Acquire);
        if word & (cb.alloc_mask() | cb.seal()) != 0 {
            if word & cb.seal() != 0 {
                self.saw_seal();
            }
            return false;
        }
        let mut marked = self.occupied_children(child_band, word);
        while marked != 0 {
            let grandchild = (child << cb.height) | marked.trailing_zeros() as u64;
            if !self.clean_child(tree, child_band, child, grandchild) {
                return false;
            }
            marked &= marked - 1;
        }
        word = child_word.load(Ordering::Acquire);
        if word != 0 || child_word.compare_exchange(0, cb.seal(), Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        let j = child & low_bits(self.bands[band].height);
        self.word(tree, band, bunch).fetch_and(!(1u64 << (OCC_SHIFT as u64 + j)), Ordering::AcqRel);
        child_word.store(0, Ordering::Release);
        true
    }

    /// [`TreeShape::try_alloc`] that, when only phantom marks of child bunches below `node`
    /// are in its way, cleans them (as a search does for a large node) and tries once more.
    /// For blocks placed at a position found by other means than a search of the tree (a free
    /// stretch: `stretches.rs`), whose pieces may lie over bunches emptied since.
    pub(crate) fn try_alloc_cleaning(&self, tree: &[AtomicU64], node: Node) -> Result<(), Conflict> {
        let loc = self.locate(node);
        self.try_alloc_bits_cleaning(tree, loc, loc.bit, self.conflicts_of(loc))
    }

    /// Set in `out` (bit `i % 64` of word `i / 64` is granule `i`, a granule `1 << shift`
    /// units) every granule that an allocated node covers, even in part; clear the others.
    /// Each word of the tree is read once, following the occupied marks down from the root
    /// (an unmarked child bunch is empty). On a tree in use it is a snapshot of a moving
    /// target: a node allocated or released meanwhile may or may not show.
    pub(crate) fn allocated_granules(&self, tree: &[AtomicU64], shift: u32, out: &mut [u64]) {
        out.fill(0);
        self.allocated_granules_in(tree, 0, 0, shift, out);
    }

    fn allocated_granules_in(&self, tree: &[AtomicU64], band: usize, bunch: u64, shift: u32, out: &mut [u64]) {
        let b = self.bands[band];
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        if b.leaf && shift == 0 {
            // A leaf bunch's units fit in one word of `out` (at most 32, aligned).
            let first = bunch << (b.height - 1);
            out[(first / 64) as usize] |= Self::row_covered(&b, word) << (first % 64);
            return;
        }
        let mut allocated = word & b.alloc_mask();
        while allocated != 0 {
            let bit = u64::from(allocated.trailing_zeros());
            let r = 63 - (bit + 1).leading_zeros(); // heap row of the bit
            let node = Node { level: b.top + r, index: (bunch << r) | (bit + 1 - (1 << r)) };
            let start = node.start(self.depth);
            let end = start + node.units(self.depth);
            set_bits(out, start >> shift, (end + (1 << shift) - 1) >> shift);
            allocated &= allocated - 1;
        }
        let mut marked = self.occupied_children(band, word);
        while marked != 0 {
            let child = (bunch << b.height) | marked.trailing_zeros() as u64;
            self.allocated_granules_in(tree, band + 1, child, shift, out);
            marked &= marked - 1;
        }
    }

    /// The tree's [`LeafMap`]: the words of the inner bands, read from the root down along the
    /// occupied marks (an unmarked child bunch is empty), not the leaf bunches' own words.
    /// `None` for a tree of one band, or of more than [`MAX_LEAF_BUNCHES`] leaf bunches (read
    /// it with [`TreeShape::allocated_granules`]). On a tree in use it is a snapshot, as
    /// [`TreeShape::allocated_granules`] is.
    pub(crate) fn leaf_map(&self, tree: &[AtomicU64]) -> Option<LeafMap> {
        let n = self.bands.len();
        let leaf = self.bands[n - 1];
        if n == 1 || 1usize << leaf.top > MAX_LEAF_BUNCHES {
            return None;
        }
        let mut map = LeafMap {
            covered: [0; MAX_LEAF_BUNCHES / 64],
            marked: [0; MAX_LEAF_BUNCHES / 64],
            bunches: 1 << leaf.top,
            units: 1 << (leaf.height - 1),
        };
        if n == 2 {
            self.map_leaf_parents(tree, 0, 1, &mut map);
        } else {
            self.leaf_map_in(tree, 0, 0, &mut map);
        }
        Some(map)
    }

    /// [`TreeShape::leaf_map`] under bunch `bunch` of `band`, whose children are inner bunches.
    fn leaf_map_in(&self, tree: &[AtomicU64], band: usize, bunch: u64, map: &mut LeafMap) {
        let b = self.bands[band];
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        let covered = Self::row_covered(&b, word);
        let marked = self.occupied_children(band, word) & !covered;
        let first = bunch << b.height;
        // Leaf bunches under each child bunch.
        let shift = self.bands[self.bands.len() - 1].top - (b.top + b.height);
        let mut taken = covered;
        while taken != 0 {
            let j = u64::from(taken.trailing_zeros());
            set_bits(&mut map.covered, (first + j) << shift, (first + j + 1) << shift);
            taken &= taken - 1;
        }
        if band + 3 == self.bands.len() {
            let mut below = marked;
            while below != 0 {
                let child = first | u64::from(below.trailing_zeros());
                self.map_leaf_parents(tree, child, child + 1, map);
                below &= below - 1;
            }
            return;
        }
        let mut below = marked;
        while below != 0 {
            self.leaf_map_in(tree, band + 1, first | u64::from(below.trailing_zeros()), map);
            below &= below - 1;
        }
    }

    /// [`TreeShape::leaf_map`] of bunches `[from, to)` of the band above the leaf band: their
    /// covered and marked children, straight into the map.
    #[inline]
    fn map_leaf_parents(&self, tree: &[AtomicU64], from: u64, to: u64, map: &mut LeafMap) {
        let band = self.bands.len() - 2;
        let b = self.bands[band];
        let covers = &UPPER_COVERS[b.height as usize % UPPER_COVERS.len()];
        let upper = low_bits((1u32 << (b.height - 1)) - 1);
        let occ = b.occ_mask();
        for bunch in from..to {
            let word = tree[b.base + bunch as usize].load(Ordering::Acquire);
            let covered = u64::from(
                covers[(word & upper) as usize % 128] | LAST_COVERS[row_of(word, b.height - 1) as usize % 256],
            );
            let marked = ((word & occ) >> OCC_SHIFT) & !covered;
            // At most 16 children, aligned: they share one word of the map.
            let first = bunch << b.height;
            let (w, at) = ((first / 64) as usize % (MAX_LEAF_BUNCHES / 64), first % 64);
            map.covered[w] |= covered << at;
            map.marked[w] |= marked << at;
        }
    }

    /// The allocated units of leaf bunch `bunch` (bit `i`: its unit `i`), from its own word
    /// (an allocated node of an inner band over it does not show: see [`LeafMap`]).
    #[inline]
    pub(crate) fn leaf_allocated(&self, tree: &[AtomicU64], bunch: u64) -> u64 {
        let band = self.bands.len() - 1;
        let b = self.bands[band];
        Self::row_covered(&b, self.word(tree, band, bunch).load(Ordering::Acquire))
    }

    /// What a bunch's allocated nodes cover of the row below the bunch: of the units of a leaf
    /// bunch (bit `i`: its unit `i`), of the child bunches of an inner one (bit `j`: child
    /// `j`); from the bunch's word. An inner bunch's rows above its last come from a table
    /// ([`UPPER_COVERS`]) and its last row from another ([`LAST_COVERS`]); a leaf bunch's nodes
    /// (mostly few) are spread one by one.
    #[inline]
    fn row_covered(b: &Band, word: u64) -> u64 {
        if !b.leaf {
            let upper = (1u32 << (b.height - 1)) - 1;
            let top = UPPER_COVERS[b.height as usize % UPPER_COVERS.len()][(word & low_bits(upper)) as usize % 128];
            return u64::from(top | LAST_COVERS[row_of(word, b.height - 1) as usize % 256]);
        }
        Self::row_covered_by_nodes(b, word)
    }

    /// [`TreeShape::row_covered`], node by node.
    #[inline]
    fn row_covered_by_nodes(b: &Band, word: u64) -> u64 {
        let width = 1u64 << if b.leaf { b.height - 1 } else { b.height };
        let mut allocated = word & b.alloc_mask();
        let mut covered = 0;
        while allocated != 0 {
            let bit = u64::from(allocated.trailing_zeros());
            let r = 63 - (bit + 1).leading_zeros(); // heap row of the bit
            let span = width >> r;
            covered |= low_bits(span as u32) << ((bit + 1 - (1 << r)) * span);
            allocated &= allocated - 1;
        }
        covered
    }

    /// The free units around unit `u`, looking from the root down to `u`: `None` when an
    /// allocated node covers it; else `[lo, hi)` (the spans of the unmarked child bunches that
    /// no allocated node covers around `u`'s, or the free units of `u`'s leaf bunch around
    /// it), and whether an allocated unit is known to bound it at `lo - 1` and at `hi`. When
    /// `u`'s leaf bunch is marked, the span goes on through the neighbouring leaf bunches of the
    /// same bunch above them on the side `up` says ([`TreeShape::free_leaves_from`]), and only
    /// that side is meaningful.
    fn free_span_at(&self, tree: &[AtomicU64], u: u64, up: bool) -> Option<FreeSpan> {
        let depth = self.depth;
        let bands = self.bands.len();
        for (i, band) in self.bands.iter().enumerate() {
            let bunch = u >> (depth - band.top);
            let word = self.word(tree, i, bunch).load(Ordering::Acquire);
            // The row below the bunch: its entries' size, and `u`'s entry.
            let shift = if band.leaf { depth - band.top - (band.height - 1) } else { depth - band.top - band.height };
            let width = if band.leaf { band.height - 1 } else { band.height };
            let first = bunch << width;
            let j = ((u >> shift) - first) as u32;
            let occupied = self.occupied_children(i, word);
            if !band.leaf {
                if word & self.paths[i % BAND_SLOTS][j as usize % 16] != 0 {
                    return None;
                }
                if occupied >> j & 1 != 0 {
                    if i + 2 == bands {
                        let covered = Self::row_covered(band, word);
                        return self.free_leaves_from(tree, u, up, first, 1 << width, covered, occupied);
                    }
                    continue;
                }
            }
            let covered = Self::row_covered(band, word);
            if covered >> j & 1 != 0 {
                return None;
            }
            // The entries around `j` that nothing covers or marks: free all through.
            let blocked = covered | occupied | !low_bits(1 << width);
            let below = blocked & low_bits(j);
            let above = blocked & !low_bits(j);
            let lo = if below == 0 { 0 } else { 64 - u64::from(below.leading_zeros()) };
            let hi = u64::from(above.trailing_zeros());
            return Some(FreeSpan {
                lo: (first + lo) << shift,
                hi: (first + hi) << shift,
                lo_bounded: below != 0 && covered >> (lo - 1) & 1 != 0,
                hi_bounded: hi < 1 << width && covered >> hi & 1 != 0,
            });
        }
        unreachable!("the last band holds the leaves")
    }

    /// [`TreeShape::free_span_at`] for a unit `u` of a marked leaf bunch under a bunch of the
    /// band above the leaf band whose children are leaf bunches `[first, first + children)`,
    /// which it covers as `covered` and marks as `occupied`: the free units of `u`'s leaf bunch
    /// from `u` on (`up`) or down to it, then of the leaf bunches next to it on that side, until
    /// an allocated unit (bounded) or the last of those children (not bounded).
    #[allow(clippy::too_many_arguments)]
    fn free_leaves_from(
        &self,
        tree: &[AtomicU64],
        u: u64,
        up: bool,
        first: u64,
        children: u64,
        covered: u64,
        occupied: u64,
    ) -> Option<FreeSpan> {
        let units = 1u64 << (self.bands[self.bands.len() - 1].height - 1);
        let mut k = u / units;
        let allocated = self.leaf_allocated(tree, k);
        let bit = u % units;
        if allocated >> bit & 1 != 0 {
            return None;
        }
        let span = |edge: u64, bounded: bool| {
            Some(if up {
                FreeSpan { lo: u, hi: edge, lo_bounded: false, hi_bounded: bounded }
            } else {
                FreeSpan { lo: edge, hi: u + 1, lo_bounded: bounded, hi_bounded: false }
            })
        };
        if up {
            let above = allocated & !low_bits(bit as u32);
            if above != 0 {
                return span(k * units + u64::from(above.trailing_zeros()), true);
            }
            loop {
                k += 1;
                let j = k - first;
                if j == children {
                    return span(k * units, false);
                }
                if covered >> j & 1 != 0 {
                    return span(k * units, true);
                }
                if occupied >> j & 1 != 0 {
                    let allocated = self.leaf_allocated(tree, k);
                    if allocated != 0 {
                        return span(k * units + u64::from(allocated.trailing_zeros()), true);
                    }
                }
            }
        }
        let below = allocated & low_bits(bit as u32);
        if below != 0 {
            return span(k * units + 64 - u64::from(below.leading_zeros()), true);
        }
        loop {
            if k == first {
                return span(k * units, false);
            }
            k -= 1;
            let j = k - first;
            if covered >> j & 1 != 0 {
                return span((k + 1) * units, true);
            }
            if occupied >> j & 1 != 0 {
                let allocated = self.leaf_allocated(tree, k);
                if allocated != 0 {
                    return span(k * units + 64 - u64::from(allocated.leading_zeros()), true);
                }
            }
        }
    }

    /// The free run around units `[from, to)` (which the caller just released): the last unit
    /// before `from` and the first from `to` on that an allocated node covers bound it (the
    /// tree's ends otherwise). Reads outwards from the block until each side meets an
    /// allocated unit, from the root down to each leaf bunch on the way (then sideways through
    /// the leaf bunches under the same bunch), or only to the unmarked child bunch above it (an
    /// unmarked child is empty: its whole span is skipped); not the whole tree. On a tree in use
    /// it is a snapshot, as [`TreeShape::allocated_granules`] is.
    pub(crate) fn free_run_around(&self, tree: &[AtomicU64], from: u64, to: u64) -> (u64, u64) {
        let mut start = from;
        while start > 0 {
            let Some(span) = self.free_span_at(tree, start - 1, false) else {
                break;
            };
            start = span.lo;
            if span.lo_bounded {
                break;
            }
        }
        let end = 1u64 << self.depth;
        let mut stop = to;
        while stop < end {
            let Some(span) = self.free_span_at(tree, stop, true) else {
                break;
            };
            stop = span.hi;
            if span.hi_bounded {
                break;
            }
        }
        (start, stop)
    }

    /// A search or an allocation met a sealed bunch (see `seals`).
    #[cold]
    #[inline(never)]
    fn saw_seal(&self) {
        self.seals.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether a sealed bunch was met since the last complete reveal (or none happened yet): then
    /// a reveal may find room that a miss hid by mistake, and the answer is the ticket to hand
    /// to [`TreeShape::revealed`] when it is done. Without a seal, the misses recorded since
    /// were all true, and so a reveal would find nothing.
    pub(crate) fn reveal_ticket(&self) -> Option<u64> {
        let seals = self.seals.load(Ordering::Acquire);
        (self.revealed.load(Ordering::Acquire) != seals).then_some(seals)
    }

    /// A reveal that began with `ticket` is done: the seals counted up to it are covered.
    pub(crate) fn revealed(&self, ticket: u64) {
        let _ = self
            .revealed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| (r == u64::MAX || r < ticket).then_some(ticket));
    }

    /// Clean every phantom mark in the tree (before retiring a chunk, which needs its root).
    pub(crate) fn sweep(&self, tree: &[AtomicU64]) {
        self.sweep_bunch(tree, 0, 0);
    }

    /// Clear every mark over an empty bunch, bottom band first. `sweep` follows occupied marks
    /// down from the root, so a mark whose parent bunch is unmarked stays: an allocation that
    /// failed its climb at an allocated ancestor (a stale hint into a retired chunk) leaves one
    /// under that ancestor, and once the ancestor is released nothing leads to it. Searches clean
    /// such marks as they meet them; taking a block at an exact place on a paused pool needs
    /// every one of them gone, which this does.
    ///
    /// Meant for a paused pool (the same seal protocol as
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

    fn sweep_bunch(&self, tree: &[AtomicU64], band: usize, bunch: u64) {
        let b = self.bands[band];
        if b.leaf {
            return;
        }
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        let mut marked = self.occupied_children(band, word);
        while marked != 0 {
            let child = (bunch << b.height) | marked.trailing_zeros() as u64;
            if !self.clean_child(tree, band, bunch, child) {
                self.sweep_bunch(tree, band + 1, child);
            }
            marked &= marked - 1;
        }
    }

    /// Find a free node at `level` whose index is a multiple of `step` and call `claim` on it
    /// until one claim succeeds. Partly used subtrees are tried before empty ones (so empty
    /// ones stay whole for large requests), and within a row nodes whose buddy is taken come
    /// first. Phantom marks in the way of a large node are cleaned.
    pub(crate) fn search(
        &self,
        tree: &[AtomicU64],
        level: u32,
        step: u64,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        self.search_bunch(tree, 0, 0, Goal { level, step, from: None, summary: None }, claim)
    }

    /// [`TreeShape::search_from`] (`from`: `None` for a plain search) that skips the bunches
    /// `summary` rules out and records where it found nothing.
    pub(crate) fn search_summarized(
        &self,
        tree: &[AtomicU64],
        summary: &Summary,
        level: u32,
        step: u64,
        from: Option<u64>,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        let band = self.band_of_level[level as usize];
        let from = from.filter(|f| f >> self.bands[band].top == 0);
        let mut claim = |node: Node| {
            let claimed = claim(node);
            if claimed == Err(Conflict::Ancestor) {
                summary.blocked.set(true);
            }
            claimed
        };
        self.search_bunch(tree, 0, 0, Goal { level, step, from, summary: Some(summary) }, &mut claim)
    }

    /// [`TreeShape::search`] that visits bunch `from` (of the band of `level`, as
    /// [`TreeShape::bunch_of`] gives it) and what follows it first, then wraps around: a cursor,
    /// so that searches in a crowded tree resume where the last one succeeded instead of
    /// walking the same full bunches again.
    #[cfg(test)]
    pub(crate) fn search_from(
        &self,
        tree: &[AtomicU64],
        level: u32,
        step: u64,
        from: u64,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        let band = self.band_of_level[level as usize];
        let from = (from >> self.bands[band].top == 0).then_some(from);
        self.search_bunch(tree, 0, 0, Goal { level, step, from, summary: None }, claim)
    }

    /// The child of `bunch` (of `band`) on the path to bunch `from` of the band of `level`, if
    /// `bunch` is on that path.
    fn child_towards(&self, band: usize, bunch: u64, level: u32, from: Option<u64>) -> Option<u32> {
        let target = self.band_of_level[level as usize];
        let mut f = from?;
        for k in band + 1..target {
            f >>= self.bands[k].height;
        }
        let height = self.bands[band].height;
        (f >> height == bunch).then(|| (f & low_bits(height)) as u32)
    }

    /// Try only bunch `bunch` of the band of `level` (a hint from an earlier success).
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
        let b = self.bands[band];
        let r = level - b.top;
        let align = Self::align_mask(bunch, r, step);
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        let mut avail = self.available_row(band, word, r) & align;
        while avail != 0 {
            let preferred = avail & !siblings(avail);
            let pick = if preferred != 0 { preferred } else { avail }.trailing_zeros() as u64;
            let node = Node { level, index: (bunch << r) | pick };
            match claim(node) {
                Ok(()) => return Some(node),
                Err(Conflict::Ancestor) => return None,
                Err(Conflict::Taken) => avail &= !(1 << pick),
            }
        }
        if b.leaf || word & b.occ_mask() == 0 {
            return None;
        }
        // Nodes kept only by marks: clean the marked children below one, then claim it.
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        let mut candidates = self.available_row(band, word & !b.occ_mask(), r) & align;
        while candidates != 0 {
            let pos = candidates.trailing_zeros() as u64;
            candidates &= candidates - 1;
            let span = b.height - r;
            let below = self.occupied_children(band, word) & (low_bits(1 << span) << (pos << span));
            let mut marked = below;
            let mut cleaned = true;
            while marked != 0 && cleaned {
                let child = (bunch << b.height) | marked.trailing_zeros() as u64;
                cleaned = self.clean_child(tree, band, bunch, child);
                marked &= marked - 1;
            }
            if !cleaned {
                continue;
            }
            let node = Node { level, index: (bunch << r) | pos };
            match claim(node) {
                Ok(()) => return Some(node),
                Err(Conflict::Ancestor) => return None,
                Err(Conflict::Taken) => {}
            }
        }
        None
    }

    fn search_bunch(
        &self,
        tree: &[AtomicU64],
        band: usize,
        bunch: u64,
        goal: Goal,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        let Some(summary) = goal.summary.filter(|_| band > 0) else {
            return self.search_bunch_unsummarized(tree, band, bunch, goal, claim);
        };
        let word = self.bands[band].base + bunch as usize;
        if summary.skips(word, goal.level) {
            return None;
        }
        let blocked_before = summary.blocked.replace(false);
        let found = self.search_bunch_unsummarized(tree, band, bunch, goal, claim);
        let blocked = summary.blocked.get();
        if found.is_none() && goal.step <= 1 && !blocked {
            summary.record_miss(word, goal.level);
        }
        summary.blocked.set(blocked_before | blocked);
        found
    }

    fn search_bunch_unsummarized(
        &self,
        tree: &[AtomicU64],
        band: usize,
        bunch: u64,
        goal: Goal,
        claim: &mut dyn FnMut(Node) -> Result<(), Conflict>,
    ) -> Option<Node> {
        let Goal { level, step, from, .. } = goal;
        let b = self.bands[band];
        if level < b.top + b.height {
            return self.claim_in_row(tree, band, bunch, level, step, claim);
        }
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        if word & b.seal() != 0 {
            self.saw_seal();
            return None;
        }
        let enterable = self.enterable_children(band, word);
        let occupied = self.occupied_children(band, word);
        let start = self.child_towards(band, bunch, level, from);
        for j in rotated(enterable & occupied, start.unwrap_or(0)) {
            let child = (bunch << b.height) | u64::from(j);
            let from = if Some(j) == start { from } else { None };
            if let Some(node) = self.search_bunch(tree, band + 1, child, Goal { from, ..goal }, claim) {
                return Some(node);
            }
        }
        for j in rotated(enterable & !occupied, start.unwrap_or(0)) {
            let child = (bunch << b.height) | u64::from(j);
            // An unmarked child bunch is empty: its leftmost aligned node at `level` is free
            // unless someone just took it; fall back to a normal search of the child then.
            let child_top = self.bands[band + 1].top;
            let first = child << (level - child_top);
            let count = 1u64 << (level - child_top);
            let aligned = first.div_ceil(step) * step;
            if aligned < first + count {
                let node = Node { level, index: aligned };
                match claim(node) {
                    Ok(()) => return Some(node),
                    Err(Conflict::Ancestor) => return None,
                    Err(Conflict::Taken) => {
                        if let Some(node) = self.search_bunch(tree, band + 1, child, Goal { from: None, ..goal }, claim)
                        {
                            return Some(node);
                        }
                    }
                }
            }
        }
        None
    }

    /// Whether bunch `bunch` of `band` and everything below it hold no allocation (marks of
    /// empty children and allocated nodes that `reclaimable` accepts do not count).
    fn effectively_empty(
        &self,
        tree: &[AtomicU64],
        band: usize,
        bunch: u64,
        reclaimable: &dyn Fn(Node) -> bool,
    ) -> bool {
        let b = self.bands[band];
        let word = self.effective_word(tree, band, bunch, reclaimable);
        word & (b.alloc_mask() | b.occ_mask() | b.seal()) == 0
    }

    /// A bunch's word with the allocated bits of `reclaimable` nodes cleared and the marks of
    /// effectively empty children removed.
    fn effective_word(&self, tree: &[AtomicU64], band: usize, bunch: u64, reclaimable: &dyn Fn(Node) -> bool) -> u64 {
        let b = self.bands[band];
        let mut word = self.word(tree, band, bunch).load(Ordering::Acquire);
        let mut allocated = word & b.alloc_mask();
        while allocated != 0 {
            let bit = allocated.trailing_zeros();
            let r = 63 - (bit as u64 + 1).leading_zeros(); // heap row of the bit
            let node = Node { level: b.top + r, index: (bunch << r) | (bit as u64 + 1 - (1 << r)) };
            if reclaimable(node) {
                word &= !(1u64 << bit);
            }
            allocated &= allocated - 1;
        }
        let mut marked = self.occupied_children(band, word);
        while marked != 0 {
            let j = marked.trailing_zeros() as u64;
            if self.effectively_empty(tree, band + 1, (bunch << b.height) | j, reclaimable) {
                word &= !(1u64 << (OCC_SHIFT as u64 + j));
            }
            marked &= marked - 1;
        }
        word
    }

    /// The highest level (largest block) at which a node is free now, `None` when nothing is.
    /// Phantom marks do not count. Meant for a quiescent tree; under concurrent use it is a
    /// snapshot of a moving target.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn largest_free_level(&self, tree: &[AtomicU64]) -> Option<u32> {
        self.largest_free_level_with(tree, &|_| false)
    }

    /// [`TreeShape::largest_free_level`], counting the allocated nodes `reclaimable` accepts as
    /// free (blocks that an allocation would take back before it fails).
    pub(crate) fn largest_free_level_with(
        &self,
        tree: &[AtomicU64],
        reclaimable: &dyn Fn(Node) -> bool,
    ) -> Option<u32> {
        self.largest_free_in(tree, 0, 0, reclaimable)
    }

    fn largest_free_in(
        &self,
        tree: &[AtomicU64],
        band: usize,
        bunch: u64,
        reclaimable: &dyn Fn(Node) -> bool,
    ) -> Option<u32> {
        let b = self.bands[band];
        let word = self.effective_word(tree, band, bunch, reclaimable);
        for r in 0..b.height {
            if self.available_row(band, word, r) != 0 {
                return Some(b.top + r);
            }
        }
        if word & b.seal() != 0 {
            self.saw_seal();
            return None;
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
            if let Some(level) = self.largest_free_in(tree, band + 1, child, reclaimable) {
                best = Some(best.map_or(level, |l| l.min(level)));
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
        let word = self.word(tree, band, bunch).load(Ordering::Acquire);
        if word == 0 {
            return;
        }
        // Nodes in address order: visit the bunch's rows, then the children, ordered by start.
        let mut found: Vec<Node> = Vec::new();
        for r in 0..b.height {
            let mut row = row_of(word, r);
            while row != 0 {
                let pos = row.trailing_zeros() as u64;
                found.push(Node { level: b.top + r, index: (bunch << r) | pos });
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
                let child_start = Node { level: child_top, index: child }.start(self.depth);
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
    /// `report` with the word index and what is wrong. Marks over empty bunches are allowed
    /// (coalescing is lazy); a non-empty bunch without its mark is not.
    pub(crate) fn check(&self, tree: &[AtomicU64], report: &mut dyn FnMut(String)) {
        for (band, b) in self.bands.iter().enumerate() {
            for bunch in 0..(1u64 << b.top) {
                let index = b.base + bunch as usize;
                let word = tree[index].load(Ordering::Acquire);
                let allowed = b.alloc_mask() | b.occ_mask();
                if word & !allowed != 0 {
                    report(format!("tree word {index}: stray or seal bits {:#x}", word & !allowed));
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
                    for j in 0..(1u64 << b.height) {
                        let child = (bunch << b.height) | j;
                        let child_empty = self.effectively_empty(tree, band + 1, child, &|_| false);
                        let marked = occupied & (1 << j) != 0;
                        if !marked && !child_empty {
                            report(format!(
                                "tree word {index}: child bunch {child} holds allocations but is not marked occupied"
                            ));
                        }
                        if !child_empty && to_children(down) & (1 << j) != 0 {
                            report(format!(
                                "tree word {index}: an allocated node covers child bunch {child}, which holds allocations"
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
            let mut units = if start == 0 { total } else { 1u64 << start.trailing_zeros() };
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
    fn allocated_granules_match_the_allocated_nodes() {
        // Random nodes of every level, some released again (leaving phantom marks), in trees
        // of several shapes; every granule size: the granules some allocated node covers.
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for depth in [0u32, 3, 6, 7, 10, 13] {
            let shape = TreeShape::new(depth);
            for round in 0..30 {
                let t = tree(&shape);
                let mut live: Vec<Node> = Vec::new();
                for _ in 0..(next() % 200) {
                    let level = (next() % u64::from(depth + 1)) as u32;
                    let index = next() % (1 << level);
                    let n = Node { level, index };
                    if shape.try_alloc(&t, n).is_ok() {
                        live.push(n);
                    }
                    if !live.is_empty() && next() % 3 == 0 {
                        let n = live.swap_remove((next() % live.len() as u64) as usize);
                        shape.release(&t, n).unwrap();
                    }
                }
                for shift in 0..=depth.min(8) {
                    let granules = (1u64 << depth) >> shift;
                    let mut got = vec![u64::MAX; granules.div_ceil(64) as usize];
                    shape.allocated_granules(&t, shift, &mut got);
                    let mut want = vec![0u64; got.len()];
                    for n in &live {
                        let (from, to) = (n.start(depth), n.start(depth) + n.units(depth));
                        for g in from >> shift..(to + (1 << shift) - 1) >> shift {
                            want[(g / 64) as usize] |= 1 << (g % 64);
                        }
                    }
                    assert_eq!(got, want, "depth {depth}, round {round}, shift {shift}");
                }
            }
        }
    }

    #[test]
    fn free_runs_match_the_allocated_nodes() {
        // Random nodes, some released again (phantom marks), in trees of several shapes: the
        // run around any free unit is the maximal range of units no live node covers.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for depth in [0u32, 3, 5, 6, 7, 10, 13] {
            let shape = TreeShape::new(depth);
            let units = 1u64 << depth;
            for round in 0..30 {
                let t = tree(&shape);
                let mut live: Vec<Node> = Vec::new();
                for _ in 0..(next() % 300) {
                    let level = (next() % u64::from(depth + 1)) as u32;
                    let n = Node { level, index: next() % (1 << level) };
                    if shape.try_alloc(&t, n).is_ok() {
                        live.push(n);
                    }
                    if !live.is_empty() && next() % 3 == 0 {
                        let n = live.swap_remove((next() % live.len() as u64) as usize);
                        shape.release(&t, n).unwrap();
                    }
                }
                let mut covered = vec![false; units as usize];
                for n in &live {
                    for u in n.start(depth)..n.start(depth) + n.units(depth) {
                        covered[u as usize] = true;
                    }
                }
                for u in 0..units {
                    if covered[u as usize] {
                        continue;
                    }
                    let mut start = u;
                    while start > 0 && !covered[start as usize - 1] {
                        start -= 1;
                    }
                    let mut stop = u + 1;
                    while stop < units && !covered[stop as usize] {
                        stop += 1;
                    }
                    assert_eq!(shape.free_run_around(&t, u, u + 1), (start, stop), "depth {depth}, round {round}");
                    assert_eq!(shape.free_run_around(&t, start, stop), (start, stop));
                }
            }
        }
    }

    #[test]
    fn covered_rows_from_the_tables_match_node_by_node() {
        // Every inner band height, every value of the upper rows, with random last rows.
        let mut seed = 0x51_7CC1_B727_220Au64;
        for height in 1..=INNER_BAND_HEIGHT {
            let band = Band { top: 0, height, base: 0, leaf: false };
            for upper in 0..1u64 << ((1 << (height - 1)) - 1) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let word = (upper | seed << ((1 << (height - 1)) - 1)) & band.alloc_mask() | seed & band.occ_mask();
                assert_eq!(
                    UPPER_COVERS[height as usize][upper as usize] as u64,
                    TreeShape::row_covered_by_nodes(&band, upper)
                );
                assert_eq!(
                    TreeShape::row_covered(&band, word),
                    TreeShape::row_covered_by_nodes(&band, word),
                    "height {height}"
                );
            }
        }
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
                assert_eq!(alloc(&shape, &t, level), None, "depth {depth} level {level}");
                assert_eq!(alloc(&shape, &t, depth), None);
                check_clean(&shape, &t);
                for index in seen {
                    shape.release(&t, Node { level, index }).unwrap();
                }
                check_clean(&shape, &t);
                // Fully merged again (the search cleans the phantom marks): the root is free.
                assert_eq!(shape.largest_free_level(&t), Some(0));
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
        let leaf = Node { level: 13, index: 3 << 8 };
        assert_eq!(shape.try_alloc(&t, leaf), Err(Conflict::Ancestor));
        // The parent: its bunch sees the allocated child below it.
        assert_eq!(shape.try_alloc(&t, Node { level: 4, index: 1 }), Err(Conflict::Taken));
        assert_eq!(shape.try_alloc(&t, big), Err(Conflict::Taken));
        check_clean(&shape, &t);
        shape.release(&t, big).unwrap();
        assert_eq!(shape.release(&t, big), Err(()));
        shape.try_alloc(&t, leaf).unwrap();
        assert_eq!(shape.try_alloc(&t, big), Err(Conflict::Taken));
        assert_eq!(shape.try_alloc(&t, Node { level: 0, index: 0 }), Err(Conflict::Taken));
        check_clean(&shape, &t);
    }

    #[test]
    fn conflict_masks_agree_with_row_availability() {
        let shape = TreeShape::new(13);
        let mut rng = 0x1234_5678_9ABC_DEF1u64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // About 8 and about 1 node in 63: both ways of `available_row`.
            let sparse = rng & (rng >> 3) & (rng >> 7);
            let sparser = sparse & (rng >> 11) & (rng >> 19) & (rng >> 23);
            for ((band, b), sparse) in shape.bands.iter().enumerate().flat_map(|b| [(b, sparse), (b, sparser)]) {
                let word = if b.leaf { sparse & low_bits(63) } else { sparse & 0xFFFF_7FFF };
                for r in 0..b.height {
                    let row = shape.available_row(band, word, r);
                    for pos in 0..(1u64 << r) {
                        let k = ((1u64 << r) - 1 + pos) as usize;
                        let free = word & shape.conflicts[band][k] == 0;
                        assert_eq!(free, row & (1 << pos) != 0, "band {band} row {r} pos {pos} word {word:#x}");
                    }
                }
            }
        }
    }

    #[test]
    fn coalescing_is_lazy_and_cleaning_restores_large_nodes() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        let leaf = alloc(&shape, &t, 13).unwrap();
        shape.release(&t, leaf).unwrap();
        // The marks above the emptied leaf bunch stay: the root is not allocatable as is...
        assert_eq!(shape.try_alloc(&t, Node { level: 0, index: 0 }), Err(Conflict::Taken));
        // ...but nothing is lost: stats see the whole chunk free, a search cleans the marks.
        assert_eq!(shape.largest_free_level(&t), Some(0));
        check_clean(&shape, &t);
        let untouched = alloc(&shape, &t, 1).unwrap();
        assert_eq!(untouched.index, 1, "an unmarked half is taken before cleaning");
        let cleaned = alloc(&shape, &t, 1).expect("the marked half is cleaned and taken");
        assert_eq!(cleaned.index, 0);
        check_clean(&shape, &t);
        shape.release(&t, untouched).unwrap();
        shape.release(&t, cleaned).unwrap();
        shape.sweep(&t);
        assert!(t.iter().all(|w| w.load(Ordering::Relaxed) == 0), "a sweep leaves no marks");
        shape.try_alloc(&t, Node { level: 0, index: 0 }).unwrap();
    }

    /// The reference: the level of the largest free node holding `node`, by brute force over
    /// the allocated nodes.
    fn reference_coalesced(held: &[Node], depth: u32, node: Node) -> u32 {
        let overlaps = |a: Node, b: Node| {
            a.start(depth) < b.start(depth) + b.units(depth) && b.start(depth) < a.start(depth) + a.units(depth)
        };
        let mut level = node.level;
        while level > 0 {
            let up = Node { level: level - 1, index: node.index >> (node.level - level + 1) };
            if held.iter().any(|&h| overlaps(h, up)) {
                break;
            }
            level -= 1;
        }
        level
    }

    #[test]
    fn coalesced_level_matches_a_reference_model() {
        let depth = 13;
        let shape = TreeShape::new(depth);
        let t = tree(&shape);
        let mut held: Vec<Node> = Vec::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for step in 0..20_000 {
            if held.len() < 60 && next() % 2 == 0 {
                let level = 1 + next() as u32 % depth;
                if let Some(n) = alloc(&shape, &t, level) {
                    held.push(n);
                }
            } else if !held.is_empty() {
                let n = held.swap_remove(next() as usize % held.len());
                shape.release(&t, n).unwrap();
                let want = reference_coalesced(&held, depth, n);
                let got = shape.coalesced_level(&t, n);
                assert!(got <= want, "step {step}: {n:?} coalesces to {got}, above the truth {want}");
                assert_eq!(got, want, "step {step}: {n:?}");
            }
        }
    }

    #[test]
    fn the_level_in_the_free_run_is_the_coalesced_level() {
        // Random nodes of every level released in random order, leaving phantom marks: the
        // free run read around each release gives the level the climb finds, for the node
        // and for each node inside it.
        for depth in [9, 13, 15] {
            let shape = TreeShape::new(depth);
            let t = tree(&shape);
            let mut held: Vec<Node> = Vec::new();
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(depth);
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut checked = 0;
            for step in 0..20_000 {
                if held.len() < 80 && next() % 2 == 0 {
                    let level = next() as u32 % (depth + 1);
                    if let Some(n) = alloc(&shape, &t, level) {
                        held.push(n);
                    }
                } else if !held.is_empty() {
                    let n = held.swap_remove(next() as usize % held.len());
                    shape.release(&t, n).unwrap();
                    let first = n.start(depth);
                    let run = shape.free_run_around(&t, first, first + (1 << (depth - n.level)));
                    assert_eq!(shape.level_in_run(n, run), shape.coalesced_level(&t, n), "step {step}: {n:?}");
                    if n.level < depth {
                        let inner = Node { level: depth, index: first + next() % (1 << (depth - n.level)) };
                        assert_eq!(shape.level_in_run(inner, run), shape.coalesced_level(&t, inner), "step {step}");
                    }
                    checked += 1;
                }
            }
            assert!(checked > 5_000, "{checked} releases checked");
        }
    }

    #[test]
    fn climbs_through_marked_bunches_write_nothing_above() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        let a = alloc(&shape, &t, 13).unwrap();
        let root_word = t[0].load(Ordering::Relaxed);
        let b = alloc(&shape, &t, 13).unwrap();
        assert_eq!(t[0].load(Ordering::Relaxed), root_word, "the second climb only read the root");
        shape.release(&t, a).unwrap();
        shape.release(&t, b).unwrap();
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
    fn a_cursor_search_starts_at_its_bunch_and_wraps_around() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        let per_bunch = 1u64 << (13 - shape.bands[shape.band_of_level[13]].top); // leaves per bunch
                                                                                 // Partly fill leaf bunches 3 and 200 (under inner bunches 0 and 12 of 16): a plain search
                                                                                 // takes the lowest partial bunch; a cursor takes the first one at or after it, wrapping
                                                                                 // around inside its inner bunch first, then across inner bunches.
        for bunch in [3u64, 200] {
            shape.try_alloc(&t, Node { level: 13, index: bunch * per_bunch }).unwrap();
        }
        let plain = alloc(&shape, &t, 13).unwrap();
        assert_eq!(plain.index / per_bunch, 3);
        let from = |bunch: u64| shape.search_from(&t, 13, 1, bunch, &mut |n| shape.try_alloc(&t, n)).unwrap();
        assert_eq!(from(100).index / per_bunch, 200);
        assert_eq!(from(201).index / per_bunch, 200, "wraps around inside inner bunch 12 first");
        assert_eq!(from(208).index / per_bunch, 3, "past inner bunch 12 it wraps around to 0");
        // A cursor outside the band is ignored (a hint from another geometry): a plain search.
        assert_eq!(from(1 << 40).index / per_bunch, 3);
        check_clean(&shape, &t);
    }

    #[test]
    fn alignment_steps_are_honoured() {
        let shape = TreeShape::new(13);
        let t = tree(&shape);
        let first = alloc(&shape, &t, 13).unwrap();
        assert_eq!(first.index, 0);
        let aligned = shape.search(&t, 13, 16, &mut |n| shape.try_alloc(&t, n)).unwrap();
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
                            if let Some(n) = shape.search(&t, level, 1, &mut |n| shape.try_alloc(&t, n)) {
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
        assert_eq!(shape.largest_free_level(&t), Some(0), "everything merged back");
    }

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

#[cfg(all(test, loom))]
mod loom_models {
    //! Exhaustive interleavings of the claim/climb/release/clean protocol on trees of three
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

    fn search(shape: &TreeShape, t: &[AtomicU64], level: u32) -> Option<Node> {
        shape.search(t, level, 1, &mut |n| shape.try_alloc(t, n))
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
            assert!(!(got_leaf && got_parent), "overlapping blocks both allocated");
            assert!(got_leaf || got_parent, "both failed although one always fits");
            quiescent_ok(&shape, &t);
        });
    }

    #[test]
    fn concurrent_frees_then_merge() {
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
            // Nothing is lost: the lazy marks clean up and the root is free again.
            assert_eq!(search(&shape, &t, 0), Some(Node { level: 0, index: 0 }));
        });
    }

    #[test]
    fn cleaning_races_a_leaf_allocation_and_an_ancestor_allocation() {
        // A phantom mark over an empty leaf bunch; one thread cleans it (searching for the
        // parent node), another allocates a leaf in that bunch, passing the mark with a load.
        loom::model(|| {
            let (shape, t) = setup();
            let old = Node { level: 2, index: 0 };
            shape.try_alloc(&t, old).unwrap();
            shape.release(&t, old).unwrap();
            let (s2, t2) = (shape.clone(), t.clone());
            let leaf = thread::spawn(move || s2.try_alloc(&t2, Node { level: 2, index: 1 }).ok());
            let parent = search(&shape, &t, 1);
            let leaf = leaf.join().unwrap().map(|_| Node { level: 2, index: 1 });
            if let (Some(l), Some(p)) = (leaf, parent) {
                assert!(!overlaps(l, p), "{l:?} overlaps {p:?}");
            }
            quiescent_ok(&shape, &t);
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
            let parent = search(&shape, &t, 1);
            h.join().unwrap();
            quiescent_ok(&shape, &t);
            if let Some(n) = parent {
                shape.release(&t, n).unwrap();
            }
            assert_eq!(search(&shape, &t, 0), Some(Node { level: 0, index: 0 }));
        });
    }

    #[test]
    fn three_threads_alloc_free_and_clean() {
        loom::model(|| {
            let (shape, t) = setup();
            let held = Node { level: 2, index: 3 };
            shape.try_alloc(&t, held).unwrap();
            let (s1, t1) = (shape.clone(), t.clone());
            let freer = thread::spawn(move || s1.release(&t1, held).unwrap());
            let (s2, t2) = (shape.clone(), t.clone());
            let leaf_taker = thread::spawn(move || search(&s2, &t2, 2));
            let half = search(&shape, &t, 1);
            freer.join().unwrap();
            let leaf = leaf_taker.join().unwrap();
            if let (Some(l), Some(h)) = (leaf, half) {
                assert!(!overlaps(l, h), "{l:?} overlaps {h:?}");
            }
            quiescent_ok(&shape, &t);
            for n in [leaf, half].into_iter().flatten() {
                shape.release(&t, n).unwrap();
            }
            shape.sweep(&t);
            quiescent_ok(&shape, &t);
            assert!(shape.try_alloc(&t, Node { level: 0, index: 0 }).is_ok());
        });
    }

    /// A tree of four levels: the root alone in the top band, levels 1 to 3 in two leaf
    /// bunches, so that the nodes of a three-unit block (a half of a leaf bunch's top node and
    /// a unit) share one bunch.
    fn setup_deep_leaves() -> (Arc<TreeShape>, Arc<Vec<AtomicU64>>) {
        let shape = TreeShape::with_heights(3, 3, 1);
        let t = (0..shape.words()).map(|_| AtomicU64::new(0)).collect();
        (Arc::new(shape), Arc::new(t))
    }

    /// The nodes of the three-unit block at unit 0: two units and one, in one leaf bunch.
    const BLOCK: [Node; 2] = [Node { level: 2, index: 0 }, Node { level: 3, index: 2 }];

    #[test]
    fn a_block_claimed_in_one_step_races_a_unit_inside_it_and_the_root() {
        loom::model(|| {
            let (shape, t) = setup_deep_leaves();
            let (s1, t1) = (shape.clone(), t.clone());
            let unit = thread::spawn(move || s1.try_alloc(&t1, Node { level: 3, index: 2 }).is_ok());
            let (s2, t2) = (shape.clone(), t.clone());
            let root = thread::spawn(move || s2.try_alloc(&t2, Node { level: 0, index: 0 }).is_ok());
            let block = shape.try_alloc_block(&t, &BLOCK, false).is_ok();
            let (unit, root) = (unit.join().unwrap(), root.join().unwrap());
            assert!([block, unit, root].iter().filter(|&&won| won).count() <= 1, "{block} {unit} {root}");
            assert!(block || unit || root, "one of them always fits");
            quiescent_ok(&shape, &t);
            if block {
                assert!(shape.is_allocated(&t, BLOCK[0]) && shape.is_allocated(&t, BLOCK[1]));
                assert_eq!(shape.release_block(&t, &BLOCK), Ok(()));
            }
        });
    }

    #[test]
    fn a_block_claimed_across_bunches_rolls_back_whole_when_its_last_bunch_is_taken() {
        // Four units and one: the first bunch's top node and a unit of the second bunch. A
        // unit allocated in the second bunch meanwhile makes the claim undo its first part.
        loom::model(|| {
            let (shape, t) = setup_deep_leaves();
            let block = [Node { level: 1, index: 0 }, Node { level: 3, index: 4 }];
            let (s1, t1) = (shape.clone(), t.clone());
            let unit = thread::spawn(move || s1.try_alloc(&t1, Node { level: 3, index: 4 }).is_ok());
            let got = shape.try_alloc_block(&t, &block, true);
            let unit = unit.join().unwrap();
            assert!(unit != got.is_ok(), "exactly one of them gets unit 4: {unit} {got:?}");
            if let Err((_, undone)) = got {
                assert!(undone <= 1 && !shape.is_allocated(&t, block[0]), "the first part was undone");
            }
            quiescent_ok(&shape, &t);
        });
    }

    #[test]
    fn two_releases_of_one_block_one_wins_and_a_claim_after_keeps_its_nodes() {
        loom::model(|| {
            let (shape, t) = setup_deep_leaves();
            shape.try_alloc_block(&t, &BLOCK, false).unwrap();
            let (s1, t1) = (shape.clone(), t.clone());
            let other = thread::spawn(move || {
                let released = s1.release_block(&t1, &BLOCK).is_ok();
                // Reuse one of the units at once, as an allocation racing a double free would.
                let unit = released && s1.try_alloc(&t1, Node { level: 3, index: 2 }).is_ok();
                (released, unit)
            });
            let mine = shape.release_block(&t, &BLOCK).is_ok();
            let (theirs, unit) = other.join().unwrap();
            assert!(mine ^ theirs, "exactly one release wins: {mine} {theirs}");
            assert_eq!(shape.is_allocated(&t, Node { level: 3, index: 2 }), unit, "a losing release took nothing");
            quiescent_ok(&shape, &t);
        });
    }

    #[test]
    fn two_leaves_of_one_bunch_race_an_ancestor_two_bands_up() {
        // Leaf bunches of two leaves, so two allocations can share one: the second may pass
        // the mark the first just set, but must still check every band above it.
        loom::model(|| {
            let shape = Arc::new(TreeShape::with_heights(3, 2, 1));
            let t: Arc<Vec<AtomicU64>> = Arc::new((0..shape.words()).map(|_| AtomicU64::new(0)).collect());
            let spawn_alloc = |node: Node| {
                let (s, t) = (shape.clone(), t.clone());
                thread::spawn(move || s.try_alloc(&t, node).is_ok().then_some(node))
            };
            let first = spawn_alloc(Node { level: 3, index: 0 });
            let second = spawn_alloc(Node { level: 3, index: 1 });
            let root = Node { level: 0, index: 0 };
            let got_root = shape.try_alloc(&t, root).is_ok();
            let leaves: Vec<Node> = [first, second].into_iter().filter_map(|h| h.join().unwrap()).collect();
            assert!(!got_root || leaves.is_empty(), "the root and {leaves:?} were both allocated");
            let mut findings = Vec::new();
            shape.check(&t, &mut |f| findings.push(f));
            assert!(findings.is_empty(), "{findings:?}");
        });
    }

    #[test]
    fn a_bunch_summary_miss_racing_a_free_never_hides_the_freed_node() {
        // Leaf bunches of two leaves under a root band of height 1: leaves 0 and 2 taken, the
        // search for a pair (level 1, in the leaf band) fails in both leaf bunches unless it
        // sees leaf 0 come back; the free lowers the summary after its epoch step.
        summary_race((2, 1), &[0, 2], 0, 1, Node { level: 1, index: 0 });
    }

    /// A tree of depth 2 with bands of `(leaf_height, inner_height)` (with (1, 1): root, one
    /// inner band with summaries, leaves) and `taken` leaves allocated; one thread frees
    /// `freed` (release, epoch step, announcement) while a search for a node of `level` that
    /// takes nothing may record misses in the bunches it visits. Afterwards a search of
    /// `level` finds `expected`.
    fn summary_race(heights: (u32, u32), taken: &'static [u64], freed: u64, level: u32, expected: Node) {
        use crate::arena::chunk_space::ChunkSpace;
        loom::model(move || {
            let shape = Arc::new(TreeShape::with_heights(2, heights.0, heights.1));
            let words = shape.words();
            let t: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
            let summaries: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
            let space = Arc::new(ChunkSpace::new(4));
            for &index in taken {
                shape.try_alloc(&t, Node { level: 2, index }).unwrap();
                space.take(1);
            }
            let (s2, t2, sm2, sp2) = (shape.clone(), t.clone(), summaries.clone(), space.clone());
            let freer = thread::spawn(move || {
                let leaf = Node { level: 2, index: freed };
                s2.release(&t2, leaf).unwrap();
                sp2.give(1);
                s2.announce_in_bunches(&t2, &sm2, (leaf, leaf), None, &mut None);
            });
            let probe = space.probe(0).unwrap();
            let moved = || space.moved_since(probe);
            let summary = Summary::new(&summaries, &moved);
            let _ = shape.search_summarized(&t, &summary, level, 1, None, &mut |_| Ok(()));
            freer.join().unwrap();
            let probe = space.probe(0).unwrap();
            let moved = || space.moved_since(probe);
            let summary = Summary::new(&summaries, &moved);
            let found = shape.search_summarized(&t, &summary, level, 1, None, &mut |n| shape.try_alloc(&t, n));
            assert_eq!(found, Some(expected), "the summaries hide the freed room");
        });
    }

    #[test]
    fn an_inner_bunch_miss_racing_a_free_below_never_hides_the_freed_pair() {
        // The pair over leaves 0 and 1 is an inner bunch's node: a search for it misses in both
        // inner bunches (their leaf bunches are taken) unless it sees leaf 0 come back.
        summary_race((1, 1), &[0, 2], 0, 1, Node { level: 1, index: 0 });
    }

    #[test]
    fn a_miss_recorded_over_leaf_bunches_racing_a_free_never_hides_the_freed_leaf() {
        // Every leaf taken: a leaf search records misses in the leaf bunches and in the inner
        // bunches over them, racing the free of leaf 1.
        summary_race((1, 1), &[0, 1, 2, 3], 1, 2, Node { level: 2, index: 1 });
    }

    #[test]
    fn sweep_racing_an_allocation_keeps_its_marks() {
        // The retirement sweep against an allocation climbing through the same bunches: the
        // committed block must keep every mark on its path, so the root stays refused.
        loom::model(|| {
            let (shape, t) = setup();
            let old = Node { level: 2, index: 1 };
            shape.try_alloc(&t, old).unwrap();
            shape.release(&t, old).unwrap();
            let (s2, t2) = (shape.clone(), t.clone());
            let taker = thread::spawn(move || s2.try_alloc(&t2, Node { level: 2, index: 0 }).is_ok());
            shape.sweep(&t);
            let got = taker.join().unwrap();
            quiescent_ok(&shape, &t);
            if got {
                assert_eq!(shape.try_alloc(&t, Node { level: 0, index: 0 }), Err(Conflict::Taken));
                assert_eq!(shape.try_alloc(&t, Node { level: 1, index: 0 }), Err(Conflict::Taken));
            }
        });
    }

    #[test]
    fn a_cleaning_claim_racing_a_leaf_allocation_never_overlaps() {
        // A phantom mark over an empty leaf bunch: one thread claims the node over the bunch
        // as a block placed in a free stretch does (cleaning the mark), another allocates a
        // leaf in that bunch. At most one wins, the tree stays consistent, and a claim that
        // failed because it met the seal is counted for the next reveal.
        loom::model(|| {
            let (shape, t) = setup();
            let old = Node { level: 2, index: 0 };
            shape.try_alloc(&t, old).unwrap();
            shape.release(&t, old).unwrap();
            let ticket = shape.reveal_ticket().expect("no reveal yet");
            shape.revealed(ticket);
            let (s2, t2) = (shape.clone(), t.clone());
            let leaf = Node { level: 2, index: 1 };
            let taker = thread::spawn(move || s2.try_alloc(&t2, leaf).is_ok());
            let parent = Node { level: 1, index: 0 };
            let got_parent = shape.try_alloc_cleaning(&t, parent).is_ok();
            let got_leaf = taker.join().unwrap();
            assert!(!(got_leaf && got_parent), "overlapping blocks both allocated");
            quiescent_ok(&shape, &t);
            if !got_leaf && !got_parent {
                // Neither won: only a seal met by the leaf's claim can explain it.
                assert!(shape.reveal_ticket().is_some(), "a claim refused by a seal went uncounted");
            }
        });
    }
}

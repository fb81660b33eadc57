//! The arena cut into chunks of `chunk_size`, each chunk into units of `min_block` (a chunk's
//! buddy tree has a leaf per unit), and the numbers of the bank rule. `Geometry::layout` maps a
//! request onto a [`Layout`].

use super::layout::{BuddyLayout, Layout};
use crate::config::PoolConfig;

/// A trimmed buddy block is cut at `enclosing >> TRIM_SHIFT` granularity: less than 1/32 of the
/// enclosing node, so less than 1/16 of a request of 4 KiB or more, is lost to rounding (a 400 KB
/// request takes 400 KiB, 1 MiB + 1 B takes 1 MiB + 64 KiB, instead of a power of two).
pub(crate) const TRIM_SHIFT: u32 = 5;

/// The arena cut into chunks, and each chunk's buddy tree.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    pub(crate) chunk_size: usize,
    pub(crate) min_block: usize,
    /// `log2(chunk_size)`.
    pub(crate) chunk_shift: u32,
    /// `log2(min_block)`.
    pub(crate) unit_shift: u32,
    /// Levels below a chunk's root: a chunk has `1 << depth` units of `min_block`.
    pub(crate) depth: u32,
    /// Chunks that hold at least one unit (the last may be partial).
    pub(crate) chunks: usize,
    /// Usable units of the last chunk (all of them when the capacity is a multiple of the chunk).
    pub(crate) last_units: u64,
    /// Usable bytes of the last chunk (`last_units * min_block`).
    pub(crate) last_bytes: usize,
    /// Blocks past a chunk take a tail (`PoolConfig::run_tails`), or start in the free end of
    /// a core chunk (a front, `front.rs`).
    pub(crate) tails: bool,
    /// Units in a bank (at least one): a block larger than a bank starts on a multiple of it.
    pub(crate) bank_units: u64,
    /// Units of the pool's default alignment (at least one): a request that names none starts
    /// on a multiple of it. The places that the statistics count hold such requests.
    pub(crate) align_units: u64,
}

impl Geometry {
    pub(crate) fn new(config: &PoolConfig) -> Geometry {
        let chunk_size = config.chunk_size;
        let min_block = config.min_block;
        let depth = (chunk_size / min_block).trailing_zeros();
        let mut chunks = config.capacity.div_ceil(chunk_size);
        let tail = config.capacity - (chunks.saturating_sub(1)) * chunk_size;
        let mut last_units = (tail / min_block) as u64;
        if last_units == 0 {
            // A tail too short for even one unit is not worth a chunk.
            chunks -= 1;
            last_units = 1 << depth;
        }
        // Runs and buddy blocks alike stop at the last whole unit.
        let last_bytes = last_units as usize * min_block;
        Geometry {
            chunk_size,
            min_block,
            chunk_shift: chunk_size.trailing_zeros(),
            unit_shift: min_block.trailing_zeros(),
            depth,
            chunks,
            last_units,
            last_bytes,
            tails: config.run_tails,
            bank_units: ((config.bank_size / min_block) as u64).max(1),
            align_units: ((config.alignment / min_block) as u64).max(1),
        }
    }

    pub(crate) fn units_per_chunk(&self) -> u64 {
        1 << self.depth
    }

    /// Where a block larger than a bank at the pool's default alignment may start: a multiple
    /// of this many units (a bank, or the alignment where that is larger).
    pub(crate) fn banked_start_units(&self) -> u64 {
        self.bank_units.max(self.align_units)
    }

    /// Units of chunk `i` that lie inside the arena.
    pub(crate) fn usable_units(&self, chunk: usize) -> u64 {
        if chunk + 1 == self.chunks {
            self.last_units
        } else {
            self.units_per_chunk()
        }
    }

    /// Bytes of chunk `i` that blocks may use.
    pub(crate) fn usable_bytes(&self, chunk: usize) -> usize {
        self.usable_units(chunk) as usize * self.min_block
    }

    /// Usable bytes of chunk `i` (a run may use all of them).
    pub(crate) fn chunk_bytes(&self, chunk: usize) -> usize {
        if chunk + 1 == self.chunks {
            self.last_bytes
        } else {
            self.chunk_size
        }
    }

    /// Bytes of the run of `len` chunks from chunk `start`, inside the arena (only its last
    /// chunk may be partial).
    #[inline]
    pub(crate) fn run_bytes(&self, start: usize, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        (len - 1) * self.chunk_size + self.chunk_bytes(start + len - 1)
    }

    /// Every byte a block could ever use.
    pub(crate) fn usable_capacity(&self) -> usize {
        if self.chunks == 0 {
            0
        } else {
            (self.chunks - 1) * self.chunk_size + self.last_bytes
        }
    }

    /// The route and shape of a request of `size` bytes aligned to `align` (both validated).
    pub(crate) fn layout(&self, size: usize, align: usize) -> Layout {
        // Powers of two throughout: shifts and masks, no divisions on the hot path.
        let units = ((size + self.min_block - 1) >> self.unit_shift) as u64;
        if align > self.chunk_size || (size > self.chunk_size >> 1 && units > self.largest_trimmed()) {
            // Larger than what a chunk's tree can hold trimmed: whole chunks, and a tail.
            return self.run_layout(size, align);
        }
        Layout::Buddy(self.buddy_of(units, align))
    }

    /// The most units a buddy block in a chunk's tree may have: a chunk less one granule.
    #[inline]
    pub(crate) fn largest_trimmed(&self) -> u64 {
        self.units_per_chunk() - (self.units_per_chunk() >> TRIM_SHIFT).max(1)
    }

    /// The buddy block of `units` units (at most [`Geometry::largest_trimmed`]) aligned to
    /// `align` bytes: its enclosing power of two, trimmed to a granule of it.
    #[inline]
    fn buddy_of(&self, units: u64, align: usize) -> BuddyLayout {
        let enclosing = units.next_power_of_two();
        let log_enclosing = enclosing.trailing_zeros();
        let granule = (enclosing >> TRIM_SHIFT).max(1);
        let trimmed = (units + granule - 1) & !(granule - 1);
        let step = (((align >> self.unit_shift) as u64) >> log_enclosing).max(1);
        BuddyLayout { level: self.depth - log_enclosing, enclosing, units: trimmed, step }
    }

    /// The class of buddy block `b` in the caches of freed blocks (`block_cache.rs`): the rank
    /// of its unit count among the trimmed unit counts. `None` for a block those caches never
    /// hold: one of at most a bank (it need not start on a bank boundary) or of more than half a
    /// chunk.
    #[inline]
    pub(crate) fn cache_class(&self, b: &BuddyLayout) -> Option<usize> {
        (b.units > self.bank_units && b.level >= 1).then(|| trimmed_rank(b.units))
    }

    /// The number of classes of [`Geometry::cache_class`] (0 when the tree is too shallow for
    /// any).
    pub(crate) fn cache_classes(&self) -> usize {
        match self.depth {
            0 => 0,
            _ => trimmed_rank(self.units_per_chunk() >> 1) + 1,
        }
    }

    /// The layout of the blocks of cache class `class` (aligned to a bank at most).
    #[inline]
    pub(crate) fn cached_layout(&self, class: usize) -> BuddyLayout {
        self.buddy_of(trimmed_units(class), 1)
    }

    /// A request too large for a chunk's tree (or aligned to more than a chunk): the whole
    /// chunks it fills, and (with `run_tails`) what is left over as a tail of buddy nodes at
    /// the start of the next chunk when such a tail holds it (a chunk less one granule at
    /// most); otherwise one more whole chunk.
    #[inline(never)]
    fn run_layout(&self, size: usize, align: usize) -> Layout {
        let align_chunks = (align >> self.chunk_shift).max(1);
        let whole = size >> self.chunk_shift;
        let rest = size & (self.chunk_size - 1);
        let rest_units = ((rest + self.min_block - 1) >> self.unit_shift) as u64;
        // Whole chunks waste `chunk_size - rest`: a tail is taken only where that is more than
        // 1/32 of the request (at most 31 whole chunks), as a trimmed buddy block loses at most
        // 1/32 of its enclosing node.
        let rounding_waste = self.chunk_size - rest;
        if self.tails
            && whole > 0
            && rest > 0
            && rest_units <= self.largest_trimmed()
            && rounding_waste << TRIM_SHIFT > size
        {
            let tail = self.buddy_of(rest_units, 1);
            // A run of every chunk but the last has its tail in the last one, which may be
            // short: where it cannot hold the tail cut to its granule, the run takes that chunk
            // whole (it holds the request, and no more than a granule of the tail is left).
            if whole + 1 == self.chunks && tail.units > self.last_units {
                return Layout::Run { chunks: self.chunks, align_chunks };
            }
            return Layout::RunTail { chunks: whole, align_chunks, tail };
        }
        Layout::Run { chunks: whole + usize::from(rest > 0), align_chunks }
    }

    /// Bytes of the tail of a block of `size` bytes (0 for a block without one).
    pub(crate) fn tail_bytes(&self, size: usize) -> usize {
        match self.layout(size, 1) {
            Layout::RunTail { tail, .. } => tail.units as usize * self.min_block,
            _ => 0,
        }
    }

    /// The buddy layout of a block of `size` bytes (its shape does not depend on alignment);
    /// `None` for a block of this size that is a chunk run.
    pub(crate) fn buddy_layout(&self, size: usize) -> Option<BuddyLayout> {
        match self.layout(size, 1) {
            Layout::Buddy(b) => Some(b),
            Layout::Run { .. } | Layout::RunTail { .. } => None,
        }
    }

    /// The alignment (in units) a buddy block of `units` units with the caller's alignment
    /// `align` (bytes) needs where a compaction packs it: a block of at most one bank keeps its
    /// natural alignment (so it never straddles a bank); a larger one starts on a bank
    /// boundary, or on the caller's alignment if that is coarser.
    pub(crate) fn packed_alignment(&self, units: u64, align: usize, bank_size: usize) -> u64 {
        let bytes = units as usize * self.min_block;
        let user = ((align >> self.unit_shift) as u64).max(1);
        if bytes <= bank_size {
            return units.next_power_of_two().max(user);
        }
        self.bank_units(bank_size).max(user)
    }

    /// Units in a bank (at least one): where a packed block larger than a bank may start.
    pub(crate) fn bank_units(&self, bank_size: usize) -> u64 {
        ((bank_size >> self.unit_shift) as u64).max(1)
    }

    /// The largest block (in units) that a buddy request can get from `units` free units at
    /// the start of an otherwise unusable stretch (the arena's short last chunk): a request
    /// rounds up to a granule of its enclosing power of two, so not every size up to `units`
    /// fits.
    pub(crate) fn largest_buddy_within(&self, units: u64) -> u64 {
        self.largest_buddy_in((0, units), self.units_per_chunk())
    }

    /// The largest block (in units) of at most a bank that free units `[from, to)` of a chunk
    /// hold: the buddy path places such a block at its enclosing node's start, and a trimmed
    /// one needs only its pieces from there free (`Arena::search_pieces`).
    pub(crate) fn largest_banked_buddy_in(&self, from: u64, to: u64) -> u64 {
        self.largest_buddy_in((from, to), self.bank_units.min(self.units_per_chunk()))
    }

    /// The largest block (in units) whose enclosing node is at most `max_enclosing` units that
    /// starts at such a node's start in free units `[from, to)`: its units rounded up to a
    /// granule of its enclosing power of two must fit.
    fn largest_buddy_in(&self, (from, to): (u64, u64), max_enclosing: u64) -> u64 {
        let mut best = 0;
        let mut enclosing = 1u64;
        while enclosing <= max_enclosing {
            // At the default alignment, a block of a smaller node starts on a multiple of it.
            let at = from.next_multiple_of(enclosing.max(self.align_units));
            let granule = (enclosing >> TRIM_SHIFT).max(1);
            let fits = to.saturating_sub(at).min(enclosing) & !(granule - 1);
            if fits * 2 > enclosing || enclosing == 1 {
                best = best.max(fits);
            }
            enclosing <<= 1;
        }
        best
    }

    /// The largest request (bytes) whose block a free stretch of `units` units from a bank
    /// boundary holds, where a block larger than a bank may start: its layout's units are at
    /// most `units` ([`Geometry::largest_buddy_within`]). 0 when that block is no larger than a
    /// bank: such a block needs its enclosing node free, which the stretch need not hold (the
    /// free nodes count those).
    pub(crate) fn largest_request_in_stretch(&self, units: u64) -> usize {
        match self.largest_buddy_within(units) {
            fits if fits > self.bank_units => fits as usize * self.min_block,
            _ => 0,
        }
    }

    /// The chunk that holds `offset`.
    #[inline]
    pub(crate) fn chunk_of(&self, offset: usize) -> usize {
        offset >> self.chunk_shift
    }

    /// `offset` within its chunk, in units.
    #[inline]
    pub(crate) fn unit_in_chunk(&self, offset: usize) -> u64 {
        ((offset & (self.chunk_size - 1)) >> self.unit_shift) as u64
    }

    /// The offset of unit `unit` of chunk `chunk`.
    #[inline]
    pub(crate) fn offset_of(&self, chunk: usize, unit: u64) -> usize {
        (chunk << self.chunk_shift) + ((unit as usize) << self.unit_shift)
    }
}

/// Unit counts that the trimming leaves, below one granule: every count up to `1 << TRIM_SHIFT`.
const EXACT_COUNTS: u64 = 1 << TRIM_SHIFT;
/// Trimmed unit counts per doubling above [`EXACT_COUNTS`]: the granules past the half.
const COUNTS_PER_DOUBLING: u64 = 1 << (TRIM_SHIFT - 1);

/// The rank of a trimmed unit count (`Geometry::buddy_of`) among all of them: the count itself
/// up to [`EXACT_COUNTS`], then [`COUNTS_PER_DOUBLING`] per doubling.
#[inline]
pub(crate) fn trimmed_rank(units: u64) -> usize {
    if units <= EXACT_COUNTS {
        return units as usize;
    }
    let log = units.next_power_of_two().trailing_zeros();
    let granules = units >> (log - TRIM_SHIFT);
    (EXACT_COUNTS + 1 + u64::from(log - TRIM_SHIFT - 1) * COUNTS_PER_DOUBLING + (granules - COUNTS_PER_DOUBLING - 1))
        as usize
}

/// The trimmed unit count of rank `rank` (the inverse of [`trimmed_rank`]).
pub(crate) fn trimmed_units(rank: usize) -> u64 {
    let rank = rank as u64;
    if rank <= EXACT_COUNTS {
        return rank;
    }
    let past = rank - EXACT_COUNTS - 1;
    let log = TRIM_SHIFT + 1 + (past / COUNTS_PER_DOUBLING) as u32;
    (COUNTS_PER_DOUBLING + 1 + past % COUNTS_PER_DOUBLING) << (log - TRIM_SHIFT)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::arena::buddy::Node;

    fn geometry(capacity: usize) -> Geometry {
        Geometry::new(&PoolConfig::new(capacity))
    }

    #[test]
    fn cache_classes_rank_every_trimmed_unit_count_once_in_order() {
        let g = geometry(64 << 20);
        let mut previous = None;
        let mut classes = 0;
        for units in 1..=g.units_per_chunk() >> 1 {
            let b = g.buddy_of(units, 1);
            let rank = trimmed_rank(b.units);
            assert_eq!(trimmed_units(rank), b.units, "units {units}");
            match previous {
                Some((p_units, p_rank)) if p_units == b.units => assert_eq!(p_rank, rank),
                Some((_, p_rank)) => assert_eq!(rank, p_rank + 1, "units {units}: ranks are dense"),
                None => assert_eq!(rank, 1),
            }
            if b.units > g.bank_units {
                assert_eq!(g.cache_class(&b), Some(rank));
                assert_eq!(g.cached_layout(rank).units, b.units);
            } else {
                assert_eq!(g.cache_class(&b), None, "a block of a bank or less is never cached");
            }
            previous = Some((b.units, rank));
            classes = rank + 1;
        }
        assert_eq!(g.cache_classes(), classes);
        let Layout::Buddy(large) = g.layout(g.chunk_size / 2 + 4096, 64) else { panic!("a buddy block") };
        assert_eq!(large.level, 0);
        assert_eq!(g.cache_class(&large), None, "more than half a chunk");
    }

    #[test]
    fn chunks_and_tail() {
        let g = geometry(800 << 20);
        assert_eq!((g.chunks, g.depth), (400, 13));
        assert_eq!(g.usable_capacity(), 800 << 20);
        let g = geometry((5 << 20) + 1000);
        assert_eq!(g.chunks, 3);
        assert_eq!(g.last_units, 1000 / 256 + 4096);
        assert_eq!(g.usable_bytes(2), ((1 << 20) + 768));
        let g = geometry((4 << 20) + 100);
        assert_eq!(g.chunks, 2, "a tail below one unit is dropped");
        assert_eq!(geometry(100).chunks, 0);
    }

    #[test]
    fn routes() {
        let g = Geometry::new(&PoolConfig::new(64 << 20).run_tails(false));
        assert_eq!(g.layout(3 << 20, 64), Layout::Run { chunks: 2, align_chunks: 1 });
        // Whole-chunk runs, over-aligned runs and buddy blocks route alike with tails or not.
        for tails in [false, true] {
            let g = Geometry::new(&PoolConfig::new(64 << 20).run_tails(tails));
            assert_eq!(g.layout((300 << 20) / 2, 64), Layout::Run { chunks: 75, align_chunks: 1 });
            assert_eq!(g.layout(64, 8 << 20), Layout::Run { chunks: 1, align_chunks: 4 });
            match g.layout(1 << 20, 64) {
                Layout::Buddy(b) => assert_eq!((b.level, b.enclosing, b.units), (1, 4096, 4096)),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A tail where one more whole chunk would waste more than 1/32 of the request: never past
    /// 31 whole chunks, and for fewer only when the rest is short enough.
    #[test]
    fn tails_only_where_whole_chunks_waste_over_a_32nd() {
        let g = geometry(256 << 20);
        let chunk = 2 << 20;
        let tailed = |size: usize| matches!(g.layout(size, 64), Layout::RunTail { .. });
        assert!(tailed(chunk + 1) && tailed(31 * chunk + 1), "a chunk would waste nearly all of itself");
        assert!(!tailed(32 * chunk + 1), "32 chunks + 1 B lose under 1/32 as 33 chunks");
        assert_eq!(g.layout(32 * chunk + 1, 64), Layout::Run { chunks: 33, align_chunks: 1 });
        // 16 chunks + 1 MiB: one more chunk wastes 1 MiB, under 1/32 of 33 MiB.
        assert!(!tailed(16 * chunk + (1 << 20)));
        assert!(tailed(16 * chunk + (1 << 20) - (64 << 10)));
        for size in [chunk + 1, 5 * chunk + 12345, 16 * chunk + (1 << 20), 40 * chunk + 1] {
            let reserved = match g.layout(size, 64) {
                Layout::RunTail { chunks, tail, .. } => chunks * chunk + tail.units as usize * g.min_block,
                Layout::Run { chunks, .. } => chunks * chunk,
                Layout::Buddy(_) => unreachable!(),
            };
            assert!(reserved <= size + size / 16, "{size} reserves {reserved}");
        }
    }

    #[test]
    fn routes_with_tails() {
        let g = Geometry::new(&PoolConfig::new(64 << 20).run_tails(true));
        // 3 MiB: a whole chunk and a 1 MiB tail (a node of half a chunk), not two chunks.
        let half = BuddyLayout { level: 1, enclosing: 4096, units: 4096, step: 1 };
        assert_eq!(g.layout(3 << 20, 64), Layout::RunTail { chunks: 1, align_chunks: 1, tail: half });
        assert_eq!(g.layout(4 << 20, 64), Layout::Run { chunks: 2, align_chunks: 1 });
        // A tail too long for a chunk's tree trimmed: one more whole chunk (less than 1/32 lost).
        assert_eq!(g.layout((4 << 20) - 1, 64), Layout::Run { chunks: 2, align_chunks: 1 });
        let Layout::RunTail { chunks: 1, tail, .. } = g.layout((2 << 20) + 1, 64) else { panic!() };
        assert_eq!((tail.units, tail.enclosing), (1, 1), "2 MiB + 1 B takes a chunk and a unit");
    }

    #[test]
    fn a_packed_block_is_the_aligned_nodes_that_cover_it() {
        let g = geometry(64 << 20);
        for size in [300, 5000, 9000, 40_000, 400_000, 1 << 20] {
            let Layout::Buddy(b) = g.layout(size, 64) else { panic!() };
            // At its enclosing node's start: the usual pieces.
            let e = Node { level: b.level, index: 1 };
            let usual: Vec<Node> = b.pieces(g.depth, e).collect();
            assert_eq!(b.pieces_at(g.depth, e.start(g.depth)).collect::<Vec<_>>(), usual);
            // Anywhere else: naturally aligned, back to back, exactly the block's units.
            for start in [1u64, 16, 48, 100, 4096 - b.units] {
                let mut at = start;
                let pieces: Vec<Node> = b.pieces_at(g.depth, start).collect();
                for p in &pieces {
                    assert_eq!(p.start(g.depth), at, "size {size} at {start}");
                    assert_eq!(p.start(g.depth) % p.units(g.depth), 0, "naturally aligned");
                    at += p.units(g.depth);
                }
                assert_eq!(at - start, b.units);
                assert!(pieces.len() <= 2 * (g.depth as usize + 1));
            }
        }
    }

    #[test]
    fn packed_alignment_keeps_the_bank_rule() {
        let g = geometry(64 << 20);
        // Up to a bank: natural alignment (never straddles); above: a bank, or the caller's.
        assert_eq!(g.packed_alignment(4, 64, 4096), 4);
        assert_eq!(g.packed_alignment(12, 64, 4096), 16);
        assert_eq!(g.packed_alignment(20, 64, 4096), 16);
        assert_eq!(g.packed_alignment(20, 65_536, 4096), 256);
        assert_eq!(g.packed_alignment(20, 64, 65_536), 32);
    }

    #[test]
    fn trimming_bounds_waste() {
        let g = geometry(64 << 20);
        let Layout::Buddy(b) = g.layout(400_000, 64) else { panic!() };
        let bytes = b.units as usize * 256;
        assert!(bytes >= 400_000);
        assert!((bytes - 400_000) as f64 / 400_000.0 < 0.07, "waste {bytes}");
        let enclosing = Node { level: b.level, index: 3 };
        let pieces: Vec<Node> = b.pieces(g.depth, enclosing).collect();
        assert!(pieces.len() <= 4);
        let mut at = enclosing.start(g.depth);
        for p in &pieces {
            assert_eq!(p.start(g.depth), at);
            assert_eq!(p.start(g.depth) % p.units(g.depth), 0, "naturally aligned");
            at += p.units(g.depth);
        }
        assert_eq!(at - enclosing.start(g.depth), b.units);
        let Layout::Buddy(small) = g.layout(200, 64) else { panic!() };
        assert!(small.is_whole());
    }

    #[test]
    fn the_largest_buddy_block_in_a_short_stretch_is_what_a_request_gets() {
        let g = Geometry::new(&PoolConfig::new(95_536).chunk_size(64 << 10).min_block(64));
        // 30,000 bytes past the last whole chunk: 468 units; a request rounds up to 1/32 of
        // 512 units (16 units), so 464 units (29,696 bytes) is the most one can get there.
        assert_eq!(g.last_units, 468);
        assert_eq!(g.largest_buddy_within(468), 464);
        for units in [1u64, 2, 3, 17, 100, 255, 256, 257, 448, 468, 512] {
            let best = g.largest_buddy_within(units);
            let Layout::Buddy(b) = g.layout(best as usize * 64, 1) else { panic!("a buddy block") };
            assert!(b.units <= units, "{best} units does not fit in {units}");
            let Layout::Buddy(next) = g.layout((best as usize + 1) * 64, 1) else { continue };
            assert!(next.units > units, "{} units would fit in {units} too", best + 1);
        }
    }

    /// A block of at most a bank starts at its enclosing node's start: 31 free units from a
    /// bank boundary hold a trimmed block of 31 (banks of 32 units), from one unit past it only
    /// the aligned node of 16 after; a block of more than a bank is not counted here.
    #[test]
    fn a_block_of_at_most_a_bank_starts_at_its_enclosing_node() {
        let g = Geometry::new(&PoolConfig::new(4 << 20).bank_size(8192));
        assert_eq!(g.bank_units, 32);
        assert_eq!(g.largest_banked_buddy_in(0, 31), 31);
        assert_eq!(g.largest_banked_buddy_in(64, 95), 31);
        assert_eq!(g.largest_banked_buddy_in(1, 32), 16);
        assert_eq!(g.largest_banked_buddy_in(33, 64), 16);
        assert_eq!(g.largest_banked_buddy_in(3, 12), 4);
        assert_eq!(g.largest_banked_buddy_in(0, 1000), 32);
        for (from, to) in [(0u64, 31u64), (1, 32), (5, 27), (0, 64), (17, 90)] {
            let best = g.largest_banked_buddy_in(from, to);
            let Layout::Buddy(b) = g.layout(best as usize * 256, 1) else { panic!() };
            let start = from.next_multiple_of(b.enclosing);
            assert!(b.units == best && start + best <= to, "{from}..{to}: {best} units");
        }
    }

    #[test]
    fn alignment_becomes_a_node_step() {
        let g = geometry(64 << 20);
        let Layout::Buddy(b) = g.layout(256, 64 << 10) else { panic!() };
        assert_eq!(b.step, 256);
        let Layout::Buddy(b) = g.layout(256, 64) else { panic!() };
        assert_eq!(b.step, 1);
    }
}

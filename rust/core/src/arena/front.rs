//! Blocks with a front (with `PoolConfig::run_tails`, on by default): a block larger than a
//! bank may start in the free end of a core chunk. Its *front* is that chunk's units from a
//! bank boundary to the chunk's end (the aligned nodes that cover them, as a tail's cover a
//! prefix); then come zero or more whole chunks from the global pool, then maybe a tail at the
//! start of the chunk after them (a core chunk, as for a run with a tail, `tail.rs`). A block
//! of at most half a chunk has no whole chunks: it straddles the boundary of two chunks.
//! Consecutive blocks so tile the arena: each one's front fills the end of the chunk the
//! previous one's tail began, where otherwise only smaller blocks could go.
//!
//! The shape follows from the block's offset and size alone ([`FrontLayout::of`]): a block whose
//! requested bytes cross the end of the core chunk it starts in has a front (a buddy block never
//! does); what its front does not hold is laid out as whole chunks and, for the rest, a tail of
//! exactly its units (a whole chunk instead when that rest needs every unit of one). It reserves
//! at most one unit more than it asks for.
//!
//! Where one goes ([`Arena::claim_large`]): best fit over the free runs of chunks and the
//! boundaries between two core chunks (the free end of one and the free start of the next, the
//! tightest first), the smallest run that can hold the block (first fit: the first), and in
//! it, first a block with a front in the core chunk before the run whose tail takes the free
//! start of the core chunk after it (or a buddy block in that free end, when it holds the
//! block), then one with a front and no tail or a run of exactly the block's chunks, then one
//! with a front and a fresh tail chunk or a run whose tail takes the free start of the chunk
//! after it, then a run at the run's start. So a tight spot is taken before fresh chunks are
//! cut, and consecutive blocks tile the arena. A block aligned to more than a chunk has no
//! front. A buddy block of more than half a chunk takes such a spot only where one fits it
//! (`Pool::place_large`); otherwise the buddy path places it.
//!
//! A smaller buddy block (larger than a bank, `Pool::place_straddling`), once 27% of the
//! capacity is in use and the arena is not tight, when the core's own chunks cannot hold it
//! and before a fresh chunk is cut: first the *frontier* ([`Arena::claim_at_frontier`]), the
//! free end of the chunk where the last block placed here or by a best fit left room (a hint
//! of a chunk and a unit: no tree is read, the claim decides); then the best fit among the
//! free ends before the shortest free runs (at most [`FREE_END_READS`] read): a buddy block in
//! that end, or a front there and a tail in a fresh chunk after it. When no chunk of the
//! buddy path has room either (and in a tight arena, after its free stretches): the best fit
//! over the free end of every core chunk and every boundary of two core chunks. So the holes
//! at chunk ends that no single chunk could give a large request join.
//!
//! While the global pool holds at least an eighth of the arena's chunks free, a best fit looks
//! at the boundaries of at most [`PAIR_WINDOW`] chunks whose ends may hold the block, from
//! where the last one stopped (`Arena::pair_cursor`, a hint), and at every boundary only when
//! no place was found that way: so its cost does not grow with the arena (every core chunk may
//! start such a pair, and reading each one's ends took most of a placement on large arenas),
//! the windows take turns over the whole arena, and a block fails only where every boundary
//! was looked at. A tighter place outside the window then costs a free run where free runs are
//! plenty; with fewer free chunks, every boundary is looked at, as the choice matters more.
//!
//! Taking one: its whole chunks (and a fresh tail chunk) are claimed from the global pool at
//! once; a fresh tail chunk is granted to the allocating core with its levels hidden (as for a
//! run with a tail); then the front's nodes and the tail's nodes are claimed, all or none
//! (`front_nodes.rs`); only then are the whole chunks marked, the first one last
//! (`ChunkState::FrontedRun`). A claim that fails gives back what it took and the placement
//! starts again without the chunk it met taken. The claimed front keeps its chunk from being
//! retired (a retire needs the whole tree free), and so does the tail.
//!
//! The front's chunk keeps a *front word* (`Arena::fronts`): the first unit and the units of
//! the block in its free end, stored last, once the block is whole. Giving one back: every part
//! is checked first (the front word, the front's and the tail's nodes allocated, the first whole
//! chunk's state, which also records the tail's units); then clearing the front word decides
//! which of two racing frees wins (`front_nodes.rs`), and a free of another size or from inside
//! the block finds another word and changes nothing. The winner gives back the chunks, the
//! front and the tail; a front's or a tail's chunk that this empties goes back to the global
//! pool with them, not into its core's reserve.
//!
//! Compaction moves a block with a front, of any size, only to another place with a front,
//! where it holds as many bytes (`compaction/planners/movable.rs`, `pack.rs`), so its
//! `block_bytes` and the pool's bytes in use stay as they are: a full compaction tiles such
//! blocks as allocation does; an evacuation does not move it, and the chunks its front and its
//! tail touch are not emptied (their other blocks may leave).
//!
//! A chunk granted to a core for small blocks comes from the far end of a free run when the
//! chunk before the run was granted for a tail, its rest still hidden, and has a quarter of a
//! chunk or more free at its end ([`Arena::keeps_front_room`]), so that free end stays next to
//! free chunks for the next block with a front instead of being cut off by a chunk of small
//! blocks.

use std::cell::Cell;

use super::arena::Arena;
use super::chunk_space::Probe;
use super::exact::Swept;
use super::front_nodes::{give_front_and_tail, take_front_and_tail, take_nodes, Taken};
use super::geometry::Geometry;
use super::global::{ChunkState, FreeRun, TailSpot};
use super::layout::{BuddyLayout, Layout, Pieces};
use super::stretch_classes;
use super::stretches::granule_shift;
use crate::config::Placement;
use crate::error::{Error, Result};
use crate::util::sync::Ordering;

/// Bits of a front word that hold the front's first unit (the units above): a chunk of more
/// units has no fronts.
const START_BITS: u32 = 24;

/// Free ends before free runs that a block with a front of at most half a chunk reads to find
/// its place while free chunks are left ([`Arena::claim_large_in`]), at most.
const FREE_END_READS: usize = 4;

/// The shape of a block with a front (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrontLayout {
    /// The core chunk whose end holds the front.
    pub(crate) chunk: usize,
    /// The front's first unit in that chunk (not 0).
    pub(crate) start: u64,
    /// Whole chunks after the front's chunk.
    pub(crate) chunks: usize,
    /// Units of the tail at the start of the chunk after them (0: no tail).
    pub(crate) tail_units: u64,
}

impl FrontLayout {
    /// The block with a front of `size` requested bytes at `offset`, if a block there has one:
    /// with `run_tails`, a start on a unit past a whole core chunk's first, and requested bytes
    /// that cross that chunk's end (and fit in the arena).
    pub(crate) fn of(g: &Geometry, offset: usize, size: usize) -> Option<FrontLayout> {
        if !g.tails || offset & (g.min_block - 1) != 0 || g.chunk_of(offset) >= g.chunks {
            return None;
        }
        Self::at(g, g.chunk_of(offset), g.unit_in_chunk(offset), size)
    }

    /// The block with a front of `size` bytes from unit `start` of chunk `chunk` (see
    /// [`FrontLayout::of`]).
    pub(crate) fn at(g: &Geometry, chunk: usize, start: u64, size: usize) -> Option<FrontLayout> {
        let upc = g.units_per_chunk();
        if start == 0 || start >= upc || upc > 1 << START_BITS || chunk + 1 >= g.chunks || g.usable_units(chunk) != upc
        {
            return None;
        }
        let front_bytes = ((upc - start) as usize) << g.unit_shift;
        let rest = size.checked_sub(front_bytes).filter(|&r| r > 0)?;
        let mut chunks = rest >> g.chunk_shift;
        let mut tail_units = ((rest & (g.chunk_size - 1)).div_ceil(g.min_block)) as u64;
        if tail_units == upc {
            chunks += 1;
            tail_units = 0;
        }
        let f = FrontLayout { chunk, start, chunks, tail_units };
        let whole_fit = chunks == 0 || g.usable_units(chunk + chunks) == upc;
        let tail_fits = tail_units == 0 || (f.tail_chunk() < g.chunks && tail_units <= g.usable_units(f.tail_chunk()));
        (chunk + chunks < g.chunks && whole_fit && tail_fits).then_some(f)
    }

    /// The block with a front of `size` bytes in chunk `chunk` from the first start at a
    /// multiple of `align` units from which its bytes pass the chunk's end, with `at` the
    /// first start the free end allows (`None` when no such start is left in the chunk). Its
    /// bytes may end inside the chunk from `at` while its buddy block, rounded to its class,
    /// does not fit there (1 MiB + 1 B takes 1,088 KiB: a free end of 1,028 KiB holds the
    /// bytes, not the block): the block then starts later, so that it ends past the chunk,
    /// and the units between stay free. Without that, blocks of such a size found no front
    /// once the free ends shrank below their class, and each took a fresh chunk's start.
    pub(crate) fn crossing(g: &Geometry, chunk: usize, at: u64, size: usize, align: u64) -> Option<FrontLayout> {
        FrontLayout::at(g, chunk, at, size).or_else(|| {
            let units = size.div_ceil(g.min_block) as u64;
            let later = (g.units_per_chunk() + 1).saturating_sub(units).next_multiple_of(align).max(at);
            FrontLayout::at(g, chunk, later, size)
        })
    }

    /// Units of the front.
    pub(crate) fn front_units(&self, g: &Geometry) -> u64 {
        g.units_per_chunk() - self.start
    }

    /// The first whole chunk (if it has any).
    pub(crate) fn first_whole(&self) -> usize {
        self.chunk + 1
    }

    /// The chunk that holds the tail (if it has one).
    pub(crate) fn tail_chunk(&self) -> usize {
        self.chunk + 1 + self.chunks
    }

    /// The front as a buddy block at its start (its enclosing node is the whole chunk).
    pub(crate) fn front(&self, g: &Geometry) -> BuddyLayout {
        BuddyLayout { level: 0, enclosing: g.units_per_chunk(), units: self.front_units(g), step: 1 }
    }

    /// The tail as a buddy block at its chunk's start: exactly its units.
    pub(crate) fn tail(&self, g: &Geometry) -> BuddyLayout {
        let enclosing = self.tail_units.next_power_of_two();
        BuddyLayout { level: g.depth - enclosing.trailing_zeros(), enclosing, units: self.tail_units, step: 1 }
    }

    /// The front's nodes, in address order.
    pub(crate) fn front_nodes(&self, g: &Geometry) -> Pieces {
        self.front(g).pieces_at(g.depth, self.start)
    }

    /// The tail's nodes, in address order (none without a tail).
    pub(crate) fn tail_nodes(&self, g: &Geometry) -> Pieces {
        self.tail(g).pieces_at(g.depth, 0)
    }

    /// The bytes the block holds.
    pub(crate) fn bytes(&self, g: &Geometry) -> usize {
        (((self.front_units(g) + self.tail_units) as usize) << g.unit_shift) + (self.chunks << g.chunk_shift)
    }

    /// What the front word of its front's chunk holds while it lives: its first unit and its
    /// units (`front_nodes.rs`).
    pub(crate) fn name(&self, g: &Geometry) -> u64 {
        self.start | (((self.bytes(g) >> g.unit_shift) as u64) << START_BITS)
    }

    /// The block that front word `word` of chunk `chunk` names ([`FrontLayout::name`]), if it
    /// names one this geometry can hold.
    pub(crate) fn named(g: &Geometry, chunk: usize, word: u64) -> Option<FrontLayout> {
        let start = word & ((1 << START_BITS) - 1);
        let bytes = usize::try_from(word >> START_BITS).ok()?.checked_mul(g.min_block)?;
        Self::at(g, chunk, start, bytes).filter(|f| f.name(g) == word)
    }

    /// The block's first byte.
    pub(crate) fn offset(&self, g: &Geometry) -> usize {
        g.offset_of(self.chunk, self.start)
    }

    /// Where its tail goes when its front is the free end before a free run of `len` chunks
    /// (`chunk_after`: a chunk follows the run): none, a chunk of the run granted for it, or
    /// the free start of the core chunk after the run (which must hold it). `None` when the run
    /// cannot take its whole chunks and its tail.
    pub(crate) fn tail_in_run(&self, len: usize, chunk_after: bool) -> Option<FrontTail> {
        match self.tail_units {
            0 if self.chunks <= len => Some(FrontTail::None),
            0 => None,
            _ if self.chunks < len => Some(FrontTail::Fresh),
            _ if self.chunks == len && chunk_after => Some(FrontTail::Shared),
            _ => None,
        }
    }
}

/// Where the tail of a block with a front goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrontTail {
    /// It has none.
    None,
    /// A free chunk, granted for it.
    Fresh,
    /// The free start of a core chunk.
    Shared,
}

/// The chunks whose ends may hold a block that one window of a best fit looks at (see the
/// module documentation).
pub(crate) const PAIR_WINDOW: usize = 64;

/// The share of the arena's chunks, one in this many, that the global pool must hold free for
/// a best fit to look at the chunk boundaries in windows ([`Arena::pairs_in_windows`]).
const WINDOWS_FROM_FREE: usize = 8;

/// The room of core chunks that a claim of [`Arena::claim_large`] found taken: free ends
/// (where a front or a packed block starts) and free starts (where a tail goes). The next round
/// of candidates leaves that room out, and only that: a chunk whose end was taken may still
/// hold the tail of a block from the chunk before it.
#[derive(Debug, Default)]
struct Refused {
    ends: Vec<usize>,
    starts: Vec<usize>,
}

/// A place a large block may take (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spot {
    /// Whole chunks from this one (a plain run); whether they hold the block exactly.
    Plain(usize, bool),
    /// A run with a tail (`tail.rs`).
    Tailed(TailSpot),
    /// A block with a front.
    Front(FrontLayout, FrontTail),
    /// A buddy block from this unit of this core chunk, in its free end before a free run.
    Packed(usize, u64),
}

/// The key of best fit among the places of [`Arena::claim_large`]: the length of the free run
/// (0 for the boundary of two chunks), the free room around the place, the place's rank in its
/// run, its first chunk.
fn best_fit_key(&(len, hole, spot): &(usize, u64, Spot)) -> (usize, u64, u8, usize) {
    (len, hole, spot.rank(), spot.first_chunk())
}

/// Whether the choice takes `spot` without checking it again: all but the places whose tail
/// goes into the free start of a core chunk.
fn always_accepted(spot: &Spot) -> bool {
    !matches!(spot, Spot::Tailed(TailSpot::Shared(_)) | Spot::Front(_, FrontTail::Shared))
}

/// The candidate with the least key of best fit that `accepts` takes, asking it in the order
/// of the keys (the least first) until it takes one.
fn best_accepted(mut candidates: Vec<(usize, u64, Spot)>, accepts: &dyn Fn(&Spot) -> bool) -> Option<Spot> {
    while !candidates.is_empty() {
        let (i, _) = candidates.iter().enumerate().min_by_key(|(_, c)| best_fit_key(c))?;
        let (_, _, spot) = candidates.swap_remove(i);
        if accepts(&spot) {
            return Some(spot);
        }
    }
    None
}

impl Spot {
    /// The order among the places of one free run: the tightest first.
    fn rank(&self) -> u8 {
        match self {
            Spot::Front(_, FrontTail::Shared) | Spot::Packed(..) => 0,
            Spot::Front(_, FrontTail::None) | Spot::Plain(_, true) => 1,
            Spot::Front(_, FrontTail::Fresh) | Spot::Tailed(TailSpot::Shared(_)) => 2,
            Spot::Plain(_, false) | Spot::Tailed(TailSpot::Fresh(_)) => 3,
        }
    }

    fn first_chunk(&self) -> usize {
        match *self {
            Spot::Plain(start, _) | Spot::Tailed(TailSpot::Fresh(start) | TailSpot::Shared(start)) => start,
            Spot::Front(f, _) => f.chunk,
            Spot::Packed(chunk, _) => chunk,
        }
    }
}

impl Arena {
    /// The units at the end of core chunk `chunk` that no allocated node covers, in whole
    /// granules of its tree's bitmap: read from the chunk's end inwards to the last allocated
    /// unit, as [`Arena::free_units_at_start`] reads the start.
    pub(crate) fn free_units_at_end(&self, chunk: usize) -> u64 {
        let g = &self.geometry;
        let usable = g.usable_units(chunk);
        let upc = g.units_per_chunk();
        let (past_last_allocated, _) = self.shape.free_run_around(self.tree(chunk), upc, upc);
        let granule = 1u64 << granule_shift(g.depth);
        usable - past_last_allocated.next_multiple_of(granule).min(usable)
    }

    /// The first unit, a multiple of `align` units, from which core chunk `chunk` looks free to
    /// its end now (its tree read once; a claim decides); `None` when it is not a whole core
    /// chunk, or is empty (a front would take all of it), or nothing is free there.
    pub(crate) fn front_start(&self, chunk: usize, align: u64) -> Option<u64> {
        if chunk + 1 >= self.geometry.chunks {
            return None;
        }
        self.free_end_start(chunk, align)
    }

    /// [`Arena::front_start`], also for the arena's last chunk (a buddy block in its free end).
    fn free_end_start(&self, chunk: usize, align: u64) -> Option<u64> {
        let g = &self.geometry;
        let upc = g.units_per_chunk();
        if g.usable_units(chunk) != upc
            || !matches!(self.global.state(chunk), ChunkState::Core(_))
            || self.lines[chunk].space.free_units() == 0
        {
            return None;
        }
        let free = self.free_units_at_end(chunk);
        let start = (upc - free).next_multiple_of(align);
        (start > 0 && start < upc).then_some(start)
    }

    /// Whether a chunk granted to a core should not go right after chunk `chunk`: with
    /// `run_tails`, a chunk granted for a tail whose rest its core's searches do not see yet
    /// (every level hidden, `tail.rs`) and whose free end (at least a quarter of it) a block
    /// with a front could take (`GlobalPool::claim_grant`).
    pub(crate) fn keeps_front_room(&self, chunk: usize) -> bool {
        let g = &self.geometry;
        g.tails
            && self.lines[chunk].space.hidden() > g.depth
            && self.front_start(chunk, g.bank_units).is_some_and(|start| start <= g.units_per_chunk() * 3 / 4)
    }

    /// The bytes of the free end of the core chunk before free run `run` that a block with a
    /// front at the pool's default alignment could take (0 without `run_tails`), a run that
    /// ends at the arena's end too.
    pub(crate) fn front_room_before(&self, run: FreeRun) -> usize {
        let g = &self.geometry;
        if !g.tails || run.start == 0 {
            return 0;
        }
        self.front_start(run.start - 1, g.banked_start_units())
            .map_or(0, |start| ((g.units_per_chunk() - start) as usize) << g.unit_shift)
    }

    /// Take a place for a block of `size` bytes whose layout is `layout` (a run, with or
    /// without a tail, aligned to one chunk), its start a multiple of `align` units: the best
    /// fit among the free runs, with or without a front (see the module documentation).
    /// Returns its offset and bytes.
    pub(crate) fn claim_large(&self, size: usize, layout: Layout, align: u64, core: usize) -> Option<(usize, usize)> {
        self.claim_large_in(size, layout, align, core, true)
    }

    /// [`Arena::claim_large`]; without `pairs`, only the places next to free runs (no scan of
    /// every chunk).
    pub(crate) fn claim_large_in(
        &self,
        size: usize,
        layout: Layout,
        align: u64,
        core: usize,
        pairs: bool,
    ) -> Option<(usize, usize)> {
        let g = &self.geometry;
        let mut refused = Refused::default();
        let cursor = Cell::new(self.pair_cursor.load(Ordering::Relaxed));
        let window = (pairs && self.pairs_in_windows()).then_some(&cursor);
        let taken = loop {
            let epoch = self.global.epoch();
            let chosen = self.choose_large(size, layout, align, &refused, pairs, true, window);
            let Some(spot) = chosen else {
                if self.global.epoch() == epoch {
                    return None;
                }
                continue;
            };
            let taken = match (spot, layout) {
                (Spot::Plain(start, _), Layout::Run { chunks, .. }) => self.global.try_take(start, chunks).then(|| {
                    self.mark_run(start, chunks);
                    (start << g.chunk_shift, g.run_bytes(start, chunks))
                }),
                (Spot::Tailed(at), Layout::RunTail { chunks, tail, .. }) => self
                    .try_tailed_at(at, chunks, &tail, core, &mut refused.starts)
                    .map(|start| (start << g.chunk_shift, self.tailed_run_bytes(start, chunks, &tail))),
                (Spot::Front(f, tail), _) => {
                    self.try_front_at(&f, tail, core, &mut refused).then(|| (f.offset(g), f.bytes(g)))
                }
                (Spot::Packed(chunk, at), Layout::Buddy(b)) => {
                    let before = self.lines[chunk].space.look();
                    let taken =
                        before.0 >= b.units && take_nodes(&self.shape, self.tree(chunk), b.pieces_at(g.depth, at));
                    if taken {
                        self.take_units(chunk, b.units);
                        self.keep_memo_after_claim(chunk, before, at, b.units);
                        self.set_frontier(chunk, at + b.units);
                    } else {
                        refused.ends.push(chunk);
                    }
                    taken.then(|| (g.offset_of(chunk, at), (b.units as usize) << g.unit_shift))
                }
                _ => None,
            };
            if taken.is_some() {
                break taken;
            }
        };
        self.pair_cursor.store(cursor.get(), Ordering::Relaxed);
        taken
    }

    /// Whether a best fit looks at the chunk boundaries in windows (see the module
    /// documentation): while the global pool holds at least [`WINDOWS_FROM_FREE`] of the
    /// arena's chunks. A place missed outside the window then costs a free run, of which there
    /// are plenty; once they are scarce, every boundary is looked at (in windows, a churn of
    /// large blocks at 95% failed 25-50% more allocations on 2-4 GiB).
    fn pairs_in_windows(&self) -> bool {
        self.global.free_chunks() * WINDOWS_FROM_FREE >= self.global.end()
    }

    /// The place [`Arena::claim_large_in`] tries next for the block (`refused`: the room its
    /// claims found taken), reading the free runs now: with best fit, the place of least key
    /// ([`best_fit_key`]) that passes the checks of a shared tail; with first fit, the first
    /// place in address order that does. `lazy` reads only the free ends that can still win
    /// ([`Arena::read_fronts_below`]; off, every one is read: the same choice, for the tests).
    /// With `window`, a best fit looks at the boundaries of core chunks in a window from there
    /// (moved on past it), and at all of them when that found no place (see the module
    /// documentation).
    #[allow(clippy::too_many_arguments)]
    fn choose_large(
        &self,
        size: usize,
        layout: Layout,
        align: u64,
        refused: &Refused,
        pairs: bool,
        lazy: bool,
        window: Option<&Cell<usize>>,
    ) -> Option<Spot> {
        let runs = self.global.free_runs_now();
        let best_fit = matches!(self.global.placement(), Placement::BestFit);
        let mut unread = Vec::new();
        let mut candidates = match (pairs, best_fit) {
            (true, true) => self.large_candidates(&runs, size, layout, align, refused, lazy.then_some(&mut unread)),
            (true, false) | (false, false) => self.large_candidates(&runs, size, layout, align, refused, None),
            (false, true) => self.shortest_run_candidates(runs, size, layout, align, refused),
        };
        let window = window.filter(|_| best_fit);
        if pairs {
            self.pair_candidates(size, layout, align, refused, &mut candidates, window);
        }
        let accepts = |spot: &Spot| match *spot {
            Spot::Tailed(TailSpot::Shared(start)) => {
                let Layout::RunTail { chunks, tail, .. } = layout else { return false };
                !refused.starts.contains(&(start + chunks)) && self.tail_fits_at_start(start + chunks, tail.units)
            }
            Spot::Front(f, FrontTail::Shared) => {
                !refused.starts.contains(&f.tail_chunk()) && self.tail_fits_at_start(f.tail_chunk(), f.tail_units)
            }
            _ => true,
        };
        if best_fit {
            self.read_fronts_below(unread, size, layout, align, &mut candidates);
            let chosen = best_accepted(candidates, &accepts);
            if chosen.is_none() && pairs && window.is_some() {
                return self.choose_large(size, layout, align, refused, pairs, lazy, None);
            }
            return chosen;
        }
        // Keys computed once: with the match of `Spot` inlined in the sort's comparator,
        // valgrind's memcheck reports a branch on uninitialised bytes in the optimized build
        // (bytes of a variant that lacks the field; not in a debug build).
        candidates.sort_by_cached_key(|&(_, _, spot)| (spot.first_chunk(), spot.rank()));
        candidates.into_iter().map(|(_, _, spot)| spot).find(accepts)
    }

    /// Every place for the block in `runs` (the free runs now), each with its run's length (the
    /// key of best fit) and 0. With `unread`, the places in the free end of the core chunk
    /// before a run (which take a read of its tree) are left out and the run goes there
    /// instead, for [`Arena::read_fronts_below`].
    fn large_candidates(
        &self,
        runs: &[FreeRun],
        size: usize,
        layout: Layout,
        align: u64,
        refused: &Refused,
        mut unread: Option<&mut Vec<FreeRun>>,
    ) -> Vec<(usize, u64, Spot)> {
        let g = &self.geometry;
        let end = self.global.end();
        let mut out = Vec::new();
        for &run in runs {
            let after = run.start + run.len;
            match layout {
                Layout::Run { chunks, .. } => {
                    if run.len >= chunks && g.run_bytes(run.start, chunks) >= size {
                        let exact = size & (g.chunk_size - 1) == 0;
                        out.push((run.len, 0, Spot::Plain(run.start, exact)));
                    }
                }
                Layout::RunTail { chunks, tail, .. } => {
                    if run.len >= chunks && after < end {
                        out.push((run.len, 0, Spot::Tailed(TailSpot::Shared(after - chunks))));
                    }
                    let fresh_bytes = (chunks << g.chunk_shift) + tail.units as usize * g.min_block;
                    if run.len > chunks && g.run_bytes(run.start, chunks + 1) >= fresh_bytes {
                        out.push((run.len, 0, Spot::Tailed(TailSpot::Fresh(run.start))));
                    }
                }
                Layout::Buddy(_) => {}
            }
            if run.start == 0 || refused.ends.contains(&(run.start - 1)) {
                continue;
            }
            match unread.as_deref_mut() {
                Some(unread) => unread.push(run),
                None => out.extend(self.front_candidate(run, size, layout, align)),
            }
        }
        out
    }

    /// The place for the block in the free end of the core chunk before free run `run` (its
    /// tree read once), if it has one: a buddy block there when the block fits in it, else a
    /// block with a front there and its chunks, and its tail, in the run.
    fn front_candidate(&self, run: FreeRun, size: usize, layout: Layout, align: u64) -> Option<(usize, u64, Spot)> {
        let g = &self.geometry;
        let at = self.front_start(run.start - 1, align)?;
        // The block fits in the free end: a buddy block there keeps the rest of it next to
        // the free run.
        if let Layout::Buddy(b) = layout {
            if FrontLayout::at(g, run.start - 1, at, size).is_none() && at + b.units <= g.units_per_chunk() {
                return Some((run.len, 0, Spot::Packed(run.start - 1, at)));
            }
        }
        let f = FrontLayout::crossing(g, run.start - 1, at, size, align)?;
        let tail = f.tail_in_run(run.len, run.start + run.len < self.global.end())?;
        Some((run.len, 0, Spot::Front(f, tail)))
    }

    /// Add to `candidates` the places in the free ends before the runs of `unread`
    /// ([`Arena::front_candidate`]), shortest run first, as long as one could still come first
    /// in best fit: its key is at least `(run.len, 0, 0, run.start - 1)`, and a place that the
    /// choice always accepts (all but those whose tail shares a core chunk, which it checks
    /// again) bounds what the rest can win. So the trees read are those of the free ends
    /// before runs no longer than the best place found, not one per free run.
    fn read_fronts_below(
        &self,
        mut unread: Vec<FreeRun>,
        size: usize,
        layout: Layout,
        align: u64,
        candidates: &mut Vec<(usize, u64, Spot)>,
    ) {
        if unread.is_empty() {
            return;
        }
        let mut bound = candidates.iter().filter(|c| always_accepted(&c.2)).map(best_fit_key).min();
        unread.sort_unstable_by_key(|run| (run.len, run.start));
        for run in unread {
            if bound.is_some_and(|b| (run.len, 0, 0, run.start - 1) >= b) {
                break;
            }
            if let Some(c) = self.front_candidate(run, size, layout, align) {
                if always_accepted(&c.2) {
                    let key = best_fit_key(&c);
                    bound = Some(bound.map_or(key, |b| b.min(key)));
                }
                candidates.push(c);
            }
        }
    }

    /// [`Arena::large_candidates`] of the shortest free runs that offer a place (best fit
    /// picks among them), so that only the free ends before those runs are read, at most
    /// [`FREE_END_READS`] of them.
    fn shortest_run_candidates(
        &self,
        mut runs: Vec<FreeRun>,
        size: usize,
        layout: Layout,
        align: u64,
        refused: &Refused,
    ) -> Vec<(usize, u64, Spot)> {
        runs.sort_unstable_by_key(|run| (run.len, run.start));
        let mut out: Vec<(usize, u64, Spot)> = Vec::new();
        for (read, run) in runs.iter().enumerate() {
            if read == FREE_END_READS || out.first().is_some_and(|&(len, ..)| len != run.len) {
                break;
            }
            out.extend(self.large_candidates(std::slice::from_ref(run), size, layout, align, refused, None));
        }
        out
    }

    /// The places for a block of `size` bytes (less than two chunks) across the boundary of two
    /// core chunks: its front in the free end of one, its tail in the free start of the next;
    /// each with run length 0 and the units of the free room there (the key of best fit: the
    /// tightest spot first). Only the pairs around the chunks whose stretch memo may hold half
    /// the block are looked at ([`Arena::pair_starts`]); a few loads per chunk rule most of
    /// them out: the bounds of each chunk's ends ([`Arena::ends_bound`]: the ends records that
    /// searches write and frees keep, else the stretch memos). The trees of the rest are read
    /// once each ([`Arena::read_ends`]), which records their ends for the next search. With
    /// `window`, only the first [`PAIR_WINDOW`] chunks that may start a pair from there, in
    /// address order round the arena, and `window` is left where the next look goes on.
    fn pair_candidates(
        &self,
        size: usize,
        layout: Layout,
        align: u64,
        refused: &Refused,
        out: &mut Vec<(usize, u64, Spot)>,
        window: Option<&Cell<usize>>,
    ) {
        let g = &self.geometry;
        let upc = g.units_per_chunk();
        if size >= 2 * g.chunk_size {
            return;
        }
        let units = size.div_ceil(g.min_block) as u64;
        let end = self.global.end();
        // A chunk whose free end a claim found taken offers no front or packed block there any
        // more, one whose free start it found taken no tail; each keeps its other side.
        let core_chunk = |c: usize| matches!(self.global.state(c), ChunkState::Core(_));
        let front_chunk = |c: usize| core_chunk(c) && !refused.ends.contains(&c);
        let tail_chunk = |c: usize| core_chunk(c) && !refused.starts.contains(&c);
        // Consecutive pairs share a chunk: its tree is read at most once, and its bounds too.
        let mut ends = keep_last(|c| self.read_ends(c));
        let mut bound_of = keep_last(|c| self.ends_bound(c));
        let mut looked = 0;
        for chunk in self.pair_starts(units, end, window.map_or(0, Cell::get)) {
            if let Some(window) = window {
                if looked == PAIR_WINDOW {
                    window.set(chunk);
                    break;
                }
                looked += 1;
            }
            let next = chunk + 1;
            let bound = bound_of(chunk);
            if next == end {
                // The last chunk: only a buddy block in its free end.
                if let Layout::Buddy(b) = layout {
                    if bound.end & !(align - 1) >= units && front_chunk(chunk) {
                        if let Some(at) = self.free_end_start(chunk, align).filter(|&at| at + b.units <= upc) {
                            out.push((0, upc - at, Spot::Packed(chunk, at)));
                        }
                    }
                }
                continue;
            }
            // A front starts at a multiple of `align` units: it holds at most that end rounded
            // down to one.
            let front_bound = bound.end & !(align - 1);
            let next_bound = bound_of(next);
            if front_bound.saturating_add(next_bound.start) < units || !front_chunk(chunk) || !tail_chunk(next) {
                continue;
            }
            if g.usable_units(chunk) != upc || self.lines[chunk].space.free_units() == 0 {
                continue;
            }
            let (_, end_room) = ends(chunk);
            let at = (upc - end_room).next_multiple_of(align);
            if at == 0 || at >= upc {
                continue;
            }
            let Some(f) = FrontLayout::at(g, chunk, at, size) else {
                // The block's bytes fit in the free end: a buddy block there, ranked by that
                // end. When its layout does not fit there (a buddy block whose class rounds it
                // past the chunk's end, or a block of nearly a chunk, which is a run of one
                // chunk), a later start that makes it end past the chunk: a block with a front
                // whose tail takes the free start of the next chunk.
                if let Layout::Buddy(b) = layout {
                    if at + b.units <= upc {
                        out.push((0, upc - at, Spot::Packed(chunk, at)));
                        continue;
                    }
                }
                let later = (upc + 1).saturating_sub(units).next_multiple_of(align);
                if let Some(f) = FrontLayout::at(g, chunk, later, size).filter(|f| f.chunks == 0 && later < upc) {
                    let (start_room, _) = ends(next);
                    if start_room >= f.tail_units {
                        out.push((0, f.front_units(g) + start_room, Spot::Front(f, FrontTail::Shared)));
                    }
                }
                continue;
            };
            if f.chunks > 0 || f.tail_units == 0 {
                continue;
            }
            let (start_room, _) = ends(next);
            if start_room >= f.tail_units {
                out.push((0, f.front_units(g) + start_room, Spot::Front(f, FrontTail::Shared)));
            }
        }
    }

    /// The chunks of `0..end`, in address order, whose free end may hold a part of a block of
    /// `units` units with the free start of the chunk after them holding the rest (or, for the
    /// last chunk, its free end all of it). One of the two ends holds half the block or more,
    /// and a chunk's stretch memo bounds both its ends from above, so such a pair has a chunk
    /// that the stretch index (`stretch_classes.rs`, exact) counts among those that may hold
    /// half the block: the pairs around those chunks are the only ones to look at, not one per
    /// chunk (on an arena of 16,384 chunks a failing allocation spent about 30 us on that).
    /// Both chunks of a pair are core chunks, so only the chunks that cores own count (a hint,
    /// as the pair's claim checks the states again): a chunk never searched is unsure, and
    /// the whole chunks of runs would otherwise make most of the arena's chunks pair starts
    /// (after a fill of 1-8 MiB blocks, 498 of 512, and every one read for nothing).
    fn pair_starts(&self, units: u64, end: usize, from: usize) -> impl Iterator<Item = usize> + '_ {
        let words = end.div_ceil(64);
        let class = stretch_classes::class_of(units / 2);
        // The chunks of word `w` that cores own (none past the end): the cores' bitmaps are a
        // word per core.
        let owned = move |w: usize| -> u64 {
            if w >= words {
                return 0;
            }
            let word = self.cores.iter().fold(0, |word, pool| word | pool.owned_word(w));
            if w == words - 1 && end % 64 != 0 {
                return word & ((1 << (end % 64)) - 1);
            }
            word
        };
        // Those whose memo may hold half the block (of its class or a longer one, or unsure).
        let may = move |w: usize| -> u64 {
            self.stretch_classes.unsure_word(w) | self.stretch_classes.may_hold_word(w, class)
        };
        // A pair starts at each such chunk and at the chunk before it, both owned. The last
        // chunk needs no chunk after it. Word by word, as the search asks for them: a window
        // reads the words it looks at only, and a word no core owns a chunk of takes no more
        // than its owners' loads.
        let last = end.saturating_sub(1);
        let starts = move |w: usize| -> u64 {
            let here = owned(w);
            if here == 0 {
                return 0;
            }
            let next = owned(w + 1);
            let next_may = if next & 1 != 0 { may(w + 1) } else { 0 };
            let at = may(w) & here;
            let last_bit = if last / 64 == w { 1 << (last % 64) } else { 0 };
            (at | at >> 1 | (next_may & next) << 63) & here & (here >> 1 | next << 63 | last_bit)
        };
        let first = (from / 64).min(words);
        (first..words).chain(0..first).flat_map(move |w| {
            let mut word = starts(w);
            std::iter::from_fn(move || {
                let bit = (word != 0).then(|| word.trailing_zeros() as usize)?;
                word &= word - 1;
                Some(w * 64 + bit)
            })
        })
    }

    /// Take buddy block `b` of `size` bytes at the *frontier*: the free end of the core chunk
    /// where the last block placed by [`Arena::claim_large`] or here left room, as that
    /// placement recorded it ([`Arena::set_frontier`]; a hint: the claim decides, and a claim
    /// that fails clears it). There, a buddy block when the free end holds it, else a block
    /// with a front there and its tail at the start of the next chunk (a free chunk, granted
    /// for it with its rest hidden, or a core chunk whose start is free); the frontier then
    /// moves past the block. No tree is read but a shared tail's chunk. Returns the block's
    /// offset and bytes.
    pub(crate) fn claim_at_frontier(
        &self,
        size: usize,
        b: &BuddyLayout,
        align: u64,
        core: usize,
    ) -> Option<(usize, usize)> {
        let g = &self.geometry;
        let upc = g.units_per_chunk();
        let word = self.frontier.load(Ordering::Relaxed);
        let chunk = ((word >> START_BITS) as usize).checked_sub(1)?;
        let at = (word & ((1 << START_BITS) - 1)).next_multiple_of(align);
        if chunk >= g.chunks || at == 0 || at >= upc || !matches!(self.global.state(chunk), ChunkState::Core(_)) {
            return None;
        }
        if at + b.units <= upc {
            let before = self.lines[chunk].space.look();
            let taken = before.0 >= b.units && take_nodes(&self.shape, self.tree(chunk), b.pieces_at(g.depth, at));
            if !taken {
                self.frontier.store(0, Ordering::Relaxed);
                return None;
            }
            self.take_units(chunk, b.units);
            self.keep_memo_after_claim(chunk, before, at, b.units);
            self.set_frontier(chunk, at + b.units);
            return Some((g.offset_of(chunk, at), (b.units as usize) << g.unit_shift));
        }
        let f = FrontLayout::crossing(g, chunk, at, size, align).filter(|f| f.chunks == 0 && f.tail_units > 0)?;
        let next = f.tail_chunk();
        let tail = match self.global.state(next) {
            ChunkState::Free => FrontTail::Fresh,
            ChunkState::Core(_) if self.tail_fits_at_start(next, f.tail_units) => FrontTail::Shared,
            _ => return None,
        };
        if !self.try_front_at(&f, tail, core, &mut Refused::default()) {
            self.frontier.store(0, Ordering::Relaxed);
            return None;
        }
        Some((f.offset(g), f.bytes(g)))
    }

    /// Make unit `start` of core chunk `chunk` the frontier: the start of the room a block
    /// placed there left at the chunk's end ([`Arena::claim_at_frontier`]).
    #[inline]
    fn set_frontier(&self, chunk: usize, start: u64) {
        self.frontier.store(((chunk as u64 + 1) << START_BITS) | start, Ordering::Relaxed);
    }

    /// Try to take the block with front `f` and its tail `tail`; `false` when a claim failed
    /// (the front's chunk, or a shared tail's, goes into `refused` when a block took its room
    /// first).
    fn try_front_at(&self, f: &FrontLayout, tail: FrontTail, core: usize, refused: &mut Refused) -> bool {
        let g = &self.geometry;
        let fresh = tail == FrontTail::Fresh;
        // Nodes are claimed only where the chunk counts them free: a free releases its nodes
        // before it counts them, and a claim of nodes not counted yet would take the count
        // below zero for a moment (as every claim of the allocation path checks).
        let counted = |chunk: usize, units: u64| self.lines[chunk].space.free_units() >= units;
        if !counted(f.chunk, f.front_units(g)) {
            refused.ends.push(f.chunk);
            return false;
        }
        if tail == FrontTail::Shared && !counted(f.tail_chunk(), f.tail_units) {
            refused.starts.push(f.tail_chunk());
            return false;
        }
        let take = f.chunks + usize::from(fresh);
        if take > 0 && !self.global.try_take(f.first_whole(), take) {
            return false;
        }
        let last = f.tail_chunk();
        if fresh {
            self.open(last, core);
            self.hide_rest_of(last, core);
        }
        let tail_tree = self.tree(if f.tail_units > 0 { last } else { f.chunk });
        let before = self.before_front(f);
        let claim =
            || take_front_and_tail(&self.shape, self.tree(f.chunk), f.front_nodes(g), tail_tree, f.tail_nodes(g));
        let mut claimed = claim();
        if claimed == Err(Taken::Tail) && fresh {
            // A chunk retired once may keep marks under its closed root (see `tail.rs`).
            self.shape.sweep_all(self.tree(last));
            claimed = claim();
        }
        match claimed {
            Ok(()) => {
                self.complete_front(f, before);
                if f.tail_units > 0 {
                    self.set_frontier(last, f.tail_units);
                }
                true
            }
            Err(which) => {
                if which == Taken::Tail {
                    // The front's nodes were held for a moment: a search may have hidden them.
                    let hidden = self.lines[f.chunk].space.refresh();
                    self.announce_free(f.chunk, hidden, f.front_nodes(g));
                }
                if f.chunks > 0 {
                    self.global.release(f.first_whole(), f.chunks);
                }
                if fresh && !self.retire(last, core) {
                    self.lines[last].space.refresh();
                    self.stretch_classes.mark_unsure(last);
                }
                match which {
                    Taken::Front => refused.ends.push(f.chunk),
                    Taken::Tail if !fresh => refused.starts.push(last),
                    Taken::Tail => {}
                }
                false
            }
        }
    }

    /// Mark chunks `[start, start + len)`, just taken from the global pool, as the whole chunks
    /// of a block with a front and a tail of `tail` units.
    fn mark_fronted_run(&self, start: usize, len: usize, tail: u64) {
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::RunBody);
        }
        self.global.set_state(start, ChunkState::FrontedRun { len, tail });
    }

    /// Whether every part of the block with front `f` is allocated (its whole chunks marked as
    /// its own); `Err` says which is not.
    fn check_front(&self, f: &FrontLayout) -> std::result::Result<(), &'static str> {
        let g = &self.geometry;
        if !matches!(self.global.state(f.chunk), ChunkState::Core(_)) {
            return Err("its front's chunk is not a core chunk");
        }
        if self.fronts[f.chunk].load(Ordering::Acquire) != f.name(g)
            || !f.front_nodes(g).all(|n| self.shape.is_allocated(self.tree(f.chunk), n))
        {
            return Err(self.not_allocated_there(f.chunk, f.start));
        }
        if f.chunks > 0
            && self.global.state(f.first_whole()) != (ChunkState::FrontedRun { len: f.chunks, tail: f.tail_units })
        {
            return Err("the chunks after its front are not its own");
        }
        if f.tail_units > 0 {
            let last = f.tail_chunk();
            if !matches!(self.global.state(last), ChunkState::Core(_))
                || !f.tail_nodes(g).all(|n| self.shape.is_allocated(self.tree(last), n))
            {
                return Err("no tail of this size follows it");
            }
        }
        Ok(())
    }

    /// Release the block with a front of `size` requested bytes at `offset` (in a core chunk);
    /// returns its bytes.
    pub(crate) fn release_fronted(&self, offset: usize, size: usize) -> Result<usize> {
        let invalid = |reason| Err(Error::InvalidBlock { offset, size, reason });
        let g = &self.geometry;
        let Some(f) = FrontLayout::of(g, offset, size) else {
            return invalid("not the start of a block of this size");
        };
        if let Err(reason) = self.check_front(&f) {
            return invalid(reason);
        }
        if let Err(reason) = self.give_back_front(&f) {
            return invalid(reason);
        }
        for chunk in [f.chunk, f.tail_chunk()] {
            if chunk == f.chunk || f.tail_units > 0 {
                self.retire_if_empty(chunk);
            }
        }
        Ok(f.bytes(g))
    }

    /// Give back the block with front `f`, checked before: clearing its front word decides a
    /// race of two callers (the loser gets `Err` and nothing changes); then its nodes, whole
    /// chunks and the units of its chunks.
    fn give_back_front(&self, f: &FrontLayout) -> std::result::Result<(), &'static str> {
        let g = &self.geometry;
        let last = f.tail_chunk();
        let tail_tree = self.tree(if f.tail_units > 0 { last } else { f.chunk });
        let word = &self.fronts[f.chunk];
        let front_tree = self.tree(f.chunk);
        // The chunks' ends records are carried over the release (`chunk_ends.rs`).
        let front_ends = self.lines[f.chunk].ends.before_free(&self.lines[f.chunk].space);
        let tail_ends =
            (f.tail_units > 0).then(|| self.lines[last].ends.before_free(&self.lines[last].space)).flatten();
        if !give_front_and_tail(&self.shape, word, f.name(g), front_tree, f.front_nodes(g), tail_tree, f.tail_nodes(g))
        {
            return Err("the block was freed already");
        }
        if f.chunks > 0 {
            let head = ChunkState::FrontedRun { len: f.chunks, tail: f.tail_units };
            let freed = self.free_run_headed(f.first_whole(), f.chunks, head);
            debug_assert!(freed, "the chunks of a block with a front whose word this free cleared");
        }
        let (_, hidden) = self.lines[f.chunk].space.give(f.front_units(g));
        if let Some(before) = front_ends {
            self.keep_ends_around(f.chunk, before, f.start, g.units_per_chunk());
        }
        self.announce_free(f.chunk, hidden, f.front_nodes(g));
        if f.tail_units > 0 {
            let (_, hidden) = self.lines[last].space.give(f.tail_units);
            if let Some(before) = tail_ends {
                self.keep_ends_around(last, before, 0, f.tail_units);
            }
            self.announce_free(last, hidden, f.tail_nodes(g));
        }
        Ok(())
    }

    /// Give back the block with a front of `size` bytes at `offset` (the exact-position API:
    /// nothing else happens, an emptied chunk stays with its core).
    pub(crate) fn fronted_release_raw(&self, offset: usize, size: usize) -> std::result::Result<(), String> {
        let f = FrontLayout::of(&self.geometry, offset, size)
            .ok_or_else(|| format!("no block with a front of {size} bytes can start at offset {offset}"))?;
        self.check_front(&f).map_err(|why| format!("the block with a front at offset {offset}: {why}"))?;
        self.give_back_front(&f).map_err(|why| format!("the block with a front at offset {offset}: {why}"))
    }

    /// Take the block with a front of `size` bytes at `offset` again (the exact-position API,
    /// on a paused pool: a compaction that undoes its moves): its front's chunk (and its
    /// tail's) must be core chunks, swept first (once per batch), its whole chunks free.
    pub(crate) fn fronted_reserve_at(
        &self,
        offset: usize,
        size: usize,
        swept: &mut Swept,
    ) -> std::result::Result<(), String> {
        let g = &self.geometry;
        let f = FrontLayout::of(g, offset, size)
            .ok_or_else(|| format!("no block with a front of {size} bytes can start at offset {offset}"))?;
        let last = f.tail_chunk();
        let core = |c: usize| matches!(self.global.state(c), ChunkState::Core(_));
        if !core(f.chunk) || (f.tail_units > 0 && !core(last)) {
            return Err(format!("the chunks of the block with a front at offset {offset} are not core chunks"));
        }
        for c in [f.chunk, last] {
            if (c == f.chunk || f.tail_units > 0) && swept.insert(c) {
                self.shape.sweep_all(self.tree(c));
            }
        }
        if f.chunks > 0 && !self.global.try_take(f.first_whole(), f.chunks) {
            return Err(format!("the chunks after the front at offset {offset} are not free"));
        }
        let tail_tree = self.tree(if f.tail_units > 0 { last } else { f.chunk });
        let before = self.before_front(&f);
        if take_front_and_tail(&self.shape, self.tree(f.chunk), f.front_nodes(g), tail_tree, f.tail_nodes(g)).is_err() {
            if f.chunks > 0 {
                self.global.release(f.first_whole(), f.chunks);
            }
            return Err(format!("the bytes of the block with a front at offset {offset} are not free"));
        }
        self.complete_front(&f, before);
        Ok(())
    }

    /// The free units and epochs of the chunks of block `f`'s front and tail (the front's
    /// twice when it has no tail), read before its nodes are claimed, for their memos after
    /// ([`Arena::keep_memo_after_claim`]).
    fn before_front(&self, f: &FrontLayout) -> [(u64, Probe); 2] {
        let tail = if f.tail_units > 0 { f.tail_chunk() } else { f.chunk };
        [self.lines[f.chunk].space.look(), self.lines[tail].space.look()]
    }

    /// After the nodes of block `f` were claimed (`before`: [`Arena::before_front`]): count its
    /// units taken, mark its whole chunks (if any) as its run, and last publish its front word.
    /// The block is whole from then on, and a free may find it.
    fn complete_front(&self, f: &FrontLayout, [front, tail]: [(u64, Probe); 2]) {
        let g = &self.geometry;
        self.take_units(f.chunk, f.front_units(g));
        self.keep_memo_after_claim(f.chunk, front, f.start, f.front_units(g));
        if f.tail_units > 0 {
            self.take_units(f.tail_chunk(), f.tail_units);
            self.keep_memo_after_claim(f.tail_chunk(), tail, 0, f.tail_units);
        }
        if f.chunks > 0 {
            self.mark_fronted_run(f.first_whole(), f.chunks, f.tail_units);
        }
        self.fronts[f.chunk].store(f.name(g), Ordering::Release);
    }

    /// A core chunk that a front or a tail alone held goes back to the global pool (not into
    /// its core's reserve), so that the free chunks around it join again.
    fn retire_if_empty(&self, chunk: usize) {
        if let ChunkState::Core(owner) = self.global.state(chunk) {
            if self.chunk_is_empty(chunk) && !self.retire(chunk, owner) {
                self.chunk_became_empty(chunk);
            }
        }
    }
}

/// `f` of a chunk, kept for the next call while it asks for the same chunk.
fn keep_last<T: Copy>(f: impl Fn(usize) -> T) -> impl FnMut(usize) -> T {
    let mut last: Option<(usize, T)> = None;
    move |chunk| match last {
        Some((read, value)) if read == chunk => value,
        _ => {
            let value = f(chunk);
            last = Some((chunk, value));
            value
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::arena::slab::caches::SlabClasses;
    use crate::config::PoolConfig;

    const MIB: usize = 1 << 20;

    fn arena() -> Arena {
        arena_of(32 * MIB)
    }

    fn arena_of(capacity: usize) -> Arena {
        let config = PoolConfig::new(capacity).cores(2);
        config.validate().unwrap();
        let classes = SlabClasses::of(&config);
        Arena::new(&config, classes).unwrap()
    }

    /// The pairs a search looks at are those around the chunks whose stretch memo may hold
    /// half the block (the chunks of its class and above, and the unsure ones), of two chunks
    /// that cores own.
    #[test]
    fn only_the_pairs_around_chunks_that_may_hold_half_the_block_are_looked_at() {
        let a = arena();
        let chunks = a.geometry.chunks;
        let record = |chunk: usize, longest: u64| {
            let (_, probe) = a.lines[chunk].space.look();
            let before = a.lines[chunk].stretch.record(probe.epoch(), longest);
            a.stretch_classes.moved(chunk, before, longest, || a.lines[chunk].stretch.recorded());
            a.stretch_classes.settle(chunk, || false);
        };
        assert_eq!(a.pair_starts(4000, chunks, 0).count(), 0, "no chunk owned: no pair");
        for chunk in 0..chunks {
            a.cores[chunk % 2].own(chunk);
        }
        assert_eq!(a.pair_starts(4000, chunks, 0).count(), chunks, "every chunk unsure: every pair");
        a.cores[1].disown(3);
        let starts: Vec<usize> = a.pair_starts(4000, chunks, 0).collect();
        assert!(!starts.contains(&2) && !starts.contains(&3), "a pair needs both chunks owned: {starts:?}");
        assert_eq!(starts.len(), chunks - 2);
        a.cores[1].own(3);
        for chunk in 0..chunks {
            record(chunk, 100);
        }
        assert_eq!(a.pair_starts(4000, chunks, 0).count(), 0, "no memo holds half");
        record(5, 2000);
        record(chunks - 1, 3000);
        a.stretch_classes.mark_unsure(9);
        let starts: Vec<usize> = a.pair_starts(4000, chunks, 0).collect();
        assert_eq!(starts, [4, 5, 8, 9, chunks - 2, chunks - 1]);
        // With the last chunk past the end, the chunk before it is the last: alone.
        assert_eq!(a.pair_starts(4000, chunks - 1, 0).collect::<Vec<_>>(), [4, 5, 8, 9]);
        assert_eq!(a.pair_starts(200, chunks, 0).count(), chunks, "every memo holds half of 200 units");
        assert_eq!(a.pair_starts(200, 0, 0).count(), 0, "no chunk published yet: no pair");
    }

    /// Pairs across the words of the chunk bitmaps: the last chunk of a word pairs with the
    /// first of the next.
    #[test]
    fn pairs_cross_the_words_of_the_chunk_bitmaps() {
        let a = arena_of(300 * MIB); // 150 chunks: three words
        let chunks = a.geometry.chunks;
        for chunk in 0..chunks {
            a.cores[chunk % 2].own(chunk);
            let (_, probe) = a.lines[chunk].space.look();
            let longest = if chunk == 64 || chunk == 127 { 2000 } else { 100 };
            let before = a.lines[chunk].stretch.record(probe.epoch(), longest);
            a.stretch_classes.moved(chunk, before, longest, || a.lines[chunk].stretch.recorded());
            a.stretch_classes.settle(chunk, || false);
        }
        assert_eq!(a.pair_starts(4000, chunks, 0).collect::<Vec<_>>(), [63, 64, 126, 127]);
        a.cores[1].disown(63);
        assert_eq!(a.pair_starts(4000, chunks, 0).collect::<Vec<_>>(), [64, 126, 127], "63 not owned");
        a.cores[0].disown(128);
        assert_eq!(a.pair_starts(4000, chunks, 0).collect::<Vec<_>>(), [64, 126], "128 not owned: 127 pairs with none");
        assert_eq!(a.pair_starts(4000, 128, 0).collect::<Vec<_>>(), [64, 126, 127], "127 the last chunk: alone");
    }

    #[test]
    fn the_shape_follows_from_offset_and_size() {
        let a = arena();
        let g = &a.geometry;
        let upc = g.units_per_chunk();
        // A block of 5 MiB + 100 B from 1.5 MiB before the end of chunk 2: one whole chunk and
        // a tail of 1.5 MiB + 1 unit.
        let at = 2 * g.chunk_size + MIB / 2;
        let f = FrontLayout::of(g, at, 5 * MIB + 100).unwrap();
        assert_eq!((f.chunk, f.start, f.chunks), (2, upc / 4, 1));
        assert_eq!(f.tail_units, (3 * MIB / 2) as u64 / 256 + 1);
        assert_eq!(f.tail_chunk(), 4);
        assert_eq!(f.bytes(g), 5 * MIB + 256);
        assert!(FrontLayout::of(g, at, 3 * MIB / 2).is_none(), "it fits the chunk's end: a buddy block");
        assert!(FrontLayout::of(g, 2 * g.chunk_size, 3 * MIB).is_none(), "at a chunk's start: a run");
        assert!(FrontLayout::of(g, 15 * g.chunk_size + MIB, 2 * MIB).is_none(), "past the arena");
        // A rest that needs every unit of a chunk takes it whole.
        let f = FrontLayout::of(g, at, 3 * MIB / 2 + 2 * MIB - 1).unwrap();
        assert_eq!((f.chunks, f.tail_units), (1, 0));
    }

    /// A best fit looks at the boundaries of [`PAIR_WINDOW`] chunks from its cursor, then, when
    /// none of them and no free run had room, at every boundary: the one pair that holds the
    /// block lies far past the window, and the block goes there; the cursor moved on past
    /// the window. The pairs from a cursor are those from 0, from the cursor's word on. With
    /// fewer than an eighth of the chunks free, no window.
    #[test]
    fn a_best_fit_looks_past_its_window_before_it_fails() {
        let a = arena_of(512 * MIB);
        let g = &a.geometry;
        let chunks = g.chunks;
        let far = 200;
        let mut swept = crate::arena::exact::Swept::default();
        // An eighth of the chunks stays free (the search then looks in windows), at the end,
        // where no chunk before them has a free end.
        let granted = chunks - chunks / WINDOWS_FROM_FREE;
        for chunk in 0..granted {
            assert!(a.grant_exact(chunk, 0));
            let base = chunk * g.chunk_size;
            // Every chunk keeps 512 KiB free in its middle, so that it may start a pair (its
            // longest stretch holds half the block), but no free end or start; but `far`,
            // whose free end is 512 KiB, and the chunk after it, whose free start is 512 KiB.
            let taken: &[(usize, usize)] = match chunk {
                c if c == far => &[(0, MIB), (MIB, MIB / 2)],
                c if c == far + 1 => &[(MIB / 2, MIB / 2), (MIB, MIB)],
                _ => &[(0, MIB), (3 * MIB / 2, MIB / 2)],
            };
            for &(at, size) in taken {
                a.buddy_reserve_at(base + at, size, &mut swept).unwrap();
            }
        }
        let all: Vec<usize> = a.pair_starts(3600, chunks, 0).collect();
        assert!(all.len() > 2 * PAIR_WINDOW, "{} pair starts", all.len());
        let from_130: Vec<usize> = a.pair_starts(3600, chunks, 130).collect();
        let first = all.iter().position(|&c| c >= 128).unwrap();
        assert_eq!(from_130, [&all[first..], &all[..first]].concat(), "rotated by whole words");
        let size = 900 << 10;
        let (offset, _) = a.claim_large(size, g.layout(size, 1), g.bank_units, 0).expect("the far pair holds it");
        assert_eq!(offset, far * g.chunk_size + 3 * MIB / 2, "in the free end of the far chunk");
        assert!(a.pair_cursor.load(Ordering::Relaxed) >= PAIR_WINDOW, "the next window starts past this one");
        assert!(a.pairs_in_windows());
        assert!(a.grant_exact(granted, 1));
        assert!(!a.pairs_in_windows(), "fewer free chunks than an eighth: every pair is looked at");
    }

    #[test]
    fn a_block_with_a_front_is_taken_and_freed_once() {
        let a = arena();
        let g = &a.geometry;
        // Chunk 0 to core 0, its first half taken by a buddy block.
        assert!(a.grant_exact(0, 0));
        let mut swept = crate::arena::exact::Swept::default();
        a.buddy_reserve_at(0, MIB, &mut swept).unwrap();
        let size = 9 * MIB / 2;
        let (offset, bytes) = a.claim_large(size, g.layout(size, 1), g.bank_units, 1).unwrap();
        assert_eq!(offset, MIB, "the front fills the end of chunk 0");
        assert_eq!(bytes, size);
        let tail = (3 * MIB / 2 / 256) as u64;
        assert_eq!(a.global.state(1), ChunkState::FrontedRun { len: 1, tail });
        assert_eq!(a.global.state(2), ChunkState::Core(1), "a fresh chunk for the tail");
        assert!(a.release_fronted(offset, 4 * MIB).is_err(), "a wrong size");
        assert!(a.release_fronted(offset + 4096, size).is_err(), "a wrong offset");
        assert_eq!(a.release_fronted(offset, size), Ok(size));
        assert!(a.release_fronted(offset, size).is_err(), "a double free");
        assert_eq!(a.global.state(2), ChunkState::Free, "the emptied tail chunk went back");
        assert_eq!(a.global.state(1), ChunkState::Free);
        assert_eq!(a.lines[0].space.free_units(), g.units_per_chunk() / 2);
    }

    /// A claim that found a chunk's free end taken refuses that end, not the chunk: its free
    /// start still takes the tail of a block whose front is in the chunk before it (a refusal
    /// of the whole chunk made requests fail with that room free), and a refused start or a
    /// refused end of the chunk before rules the pair out.
    #[test]
    fn a_refused_free_end_leaves_the_chunk_s_free_start_to_a_tail() {
        let a = arena();
        let g = &a.geometry;
        let mut swept = crate::arena::exact::Swept::default();
        for chunk in 0..3 {
            assert!(a.grant_exact(chunk, 0));
        }
        // Chunk 0 free from 1 MiB on; chunk 1 free up to 1 MiB; chunk 2 empty.
        a.buddy_reserve_at(0, MIB, &mut swept).unwrap();
        a.buddy_reserve_at(g.chunk_size + MIB, MIB, &mut swept).unwrap();
        let size = 3 * MIB / 2;
        let fronts_in_chunk_0 = |refused: &Refused| {
            let mut out = Vec::new();
            a.pair_candidates(size, g.layout(size, 1), g.bank_units, refused, &mut out, None);
            out.iter().filter(|(_, _, spot)| matches!(spot, Spot::Front(f, FrontTail::Shared) if f.chunk == 0)).count()
        };
        assert_eq!(fronts_in_chunk_0(&Refused::default()), 1);
        assert_eq!(fronts_in_chunk_0(&Refused { ends: vec![1], starts: Vec::new() }), 1, "chunk 1's end refused");
        assert_eq!(fronts_in_chunk_0(&Refused { ends: Vec::new(), starts: vec![1] }), 0, "chunk 1's start refused");
        assert_eq!(fronts_in_chunk_0(&Refused { ends: vec![0], starts: Vec::new() }), 0, "chunk 0's end refused");
    }

    /// The lazy choice of a large block's place reads fewer free ends, never another place: on
    /// pools churned with blocks of every size from a bank to several chunks, it picks a place
    /// of the same key of best fit as the choice that reads every free end, for every size
    /// and alignment tried, with and without refused room.
    #[test]
    fn reading_free_ends_lazily_chooses_as_reading_them_all() {
        use crate::arena::stretches::tests::Rng;
        use crate::config::Backing;
        use crate::pool::pool::Pool;
        let (mut compared, mut some, mut fronts) = (0, 0, 0);
        for (capacity, seed) in [(64 * MIB, 1), (96 * MIB, 2), (160 * MIB, 3)] {
            let pool = Pool::new(PoolConfig::new(capacity).cores(2).backing(Backing::None)).unwrap();
            let a = pool.arena();
            let g = &a.geometry;
            let mut rng = Rng::new(seed);
            let mut blocks: Vec<(usize, usize)> = Vec::new();
            for step in 0..1_500 {
                if !blocks.is_empty() && rng.next() % 2 == 0 {
                    let (offset, size) = blocks.swap_remove((rng.next() % blocks.len() as u64) as usize);
                    pool.free_raw(offset, size).unwrap();
                }
                let size = (64 + (rng.next() % (5 * g.chunk_size as u64 / 2)) as usize) >> (rng.next() % 6);
                if let Ok(offset) = pool.alloc_raw(size, None) {
                    blocks.push((offset, size));
                }
                if step % 10 != 0 {
                    continue;
                }
                let size = 2 * g.bank_units as usize * g.min_block + (rng.next() % (3 * g.chunk_size as u64)) as usize;
                let layout = g.layout(size, 1);
                if matches!(layout, Layout::Buddy(b) if b.level > 0 && !g.tails) {
                    continue;
                }
                let refused = match rng.next() % 3 {
                    0 => Refused::default(),
                    _ => Refused {
                        ends: vec![(rng.next() % g.chunks as u64) as usize],
                        starts: vec![(rng.next() % g.chunks as u64) as usize],
                    },
                };
                for align in [g.bank_units, g.bank_units * 4] {
                    let eager = a.choose_large(size, layout, align, &refused, true, false, None);
                    let lazy = a.choose_large(size, layout, align, &refused, true, true, None);
                    // The key of each choice among every place.
                    let full = |spot: Option<Spot>| {
                        let mut all = Vec::new();
                        let runs = a.global.free_runs_now();
                        all.extend(a.large_candidates(&runs, size, layout, align, &refused, None));
                        a.pair_candidates(size, layout, align, &refused, &mut all, None);
                        spot.map(|spot| all.iter().find(|c| c.2 == spot).map(best_fit_key))
                    };
                    assert_eq!(full(lazy), full(eager), "capacity {capacity} step {step} size {size} align {align}");
                    compared += 1;
                    some += usize::from(eager.is_some());
                    fronts += usize::from(matches!(eager, Some(Spot::Front(..) | Spot::Packed(..))));
                }
            }
        }
        assert!(
            compared > 300 && some > compared / 4 && fronts > 20,
            "compared {compared}, placed {some}, fronts {fronts}"
        );
    }
}

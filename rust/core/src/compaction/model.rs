//! The compaction planners' picture of the arena: its geometry, bank size and slab classes, what
//! each chunk is, and for core chunks one bit per unit (`min_block` bytes) that some block
//! covers. Built from the buddy trees (so blocks without a handle, slabs and the arena's tail
//! count as taken), then changed by the planner as it vacates and fills places; the pool itself
//! is untouched until the executor runs the moves.
//!
//! Without lazy-coalescing marks (the executor sweeps a tree before it takes blocks in it), a
//! buddy node can be taken exactly when none of its units is covered, so these bits decide
//! placements the way the trees will.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::census::{Census, Place};
use super::piece::{Piece, PieceKind};
use crate::arena::front::FrontLayout;
use crate::arena::geometry::Geometry;
use crate::arena::global::ChunkState;
use crate::arena::largest::FreeStretches;
use crate::arena::slab::caches::{SlabClass, SlabView};
use crate::arena::stretches::granule_shift;
use crate::pool::pool::Pool;

/// What a chunk is, in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// In the global pool.
    Free,
    /// A core chunk (buddy blocks and slabs).
    Core,
    /// Part of a chunk run.
    Run,
}

#[derive(Clone)]
pub(crate) struct ChunkModel {
    pub(crate) role: Role,
    /// The core that owns it (for core chunks; the owner a free chunk gets when filled).
    pub(crate) owner: usize,
    /// Units covered (of a core chunk).
    pub(crate) used: u64,
    /// Units blocks may use.
    pub(crate) usable: u64,
    bits: Vec<u64>,
}

#[derive(Clone)]
pub(crate) struct Model<'a> {
    /// The arena's geometry.
    pub(crate) geometry: &'a Geometry,
    /// The bank size (bytes): a block of at most a bank lies in one bank, a larger one starts
    /// on a bank boundary.
    pub(crate) bank_size: usize,
    /// The slab size classes.
    pub(crate) classes: &'a [SlabClass],
    pub(crate) chunks: Vec<ChunkModel>,
    units_per_chunk: u64,
    pub(crate) min_block: usize,
    /// Per chunk, for a model drawn while the pool ran ([`Model::of_census`]): the stamp of its
    /// free-space word read before the chunk's units were (`ChunkSpace::stamp`); empty
    /// otherwise.
    pub(crate) stamps: Vec<u64>,
}

/// Whether bits `[lo, hi)` of `bits` are all clear; otherwise the last set bit among them.
fn last_set(bits: &[u64], lo: u64, hi: u64) -> Option<u64> {
    let mut w = ((hi - 1) / 64) as usize;
    let first = (lo / 64) as usize;
    loop {
        let mut word = bits[w];
        let base = w as u64 * 64;
        if hi < base + 64 {
            word &= (1u64 << (hi - base)) - 1;
        }
        if lo > base {
            word &= !((1u64 << (lo - base)) - 1);
        }
        if word != 0 {
            return Some(base + 63 - word.leading_zeros() as u64);
        }
        if w == first {
            return None;
        }
        w -= 1;
    }
}

/// Set (`on`) or clear units `[lo, hi)` of `bits`; how many changed (a chunk's `used` stays its
/// count of set bits, also where a range was covered or free in part already).
pub(crate) fn set_range(bits: &mut [u64], lo: u64, hi: u64, on: bool) -> u64 {
    let (mut at, mut changed) = (lo, 0);
    while at < hi {
        let w = (at / 64) as usize;
        let base = w as u64 * 64;
        let end = hi.min(base + 64);
        let width = end - at;
        let mask = if width == 64 { u64::MAX } else { ((1u64 << width) - 1) << (at - base) };
        let before = bits[w];
        if on {
            bits[w] |= mask;
        } else {
            bits[w] &= !mask;
        }
        changed += u64::from((before ^ bits[w]).count_ones());
        at = end;
    }
    changed
}

/// The first covered unit in `[at, end)`, or `end`.
fn next_covered(bits: &[u64], mut at: u64, end: u64) -> u64 {
    while at < end {
        let word = bits[(at / 64) as usize] >> (at % 64);
        if word != 0 {
            return (at + u64::from(word.trailing_zeros())).min(end);
        }
        at = (at / 64 + 1) * 64;
    }
    end
}

/// The first uncovered unit in `[at, end)`, or `end`.
fn next_uncovered(bits: &[u64], mut at: u64, end: u64) -> u64 {
    while at < end {
        let word = !bits[(at / 64) as usize] >> (at % 64);
        if word != 0 {
            return (at + u64::from(word.trailing_zeros())).min(end);
        }
        at = (at / 64 + 1) * 64;
    }
    end
}

/// Set in `bits` (zeroed, one bit per unit of a chunk) the units of core chunk `chunk` that
/// its buddy tree counts as taken; returns how many.
pub(crate) fn covered_bits(pool: &Pool, chunk: usize, bits: &mut [u64]) -> u64 {
    let g = &pool.arena().geometry;
    let usable = g.usable_units(chunk);
    let mut used = 0;
    pool.arena().shape.for_each_allocated(pool.arena().tree(chunk), &mut |node| {
        let start = node.start(g.depth);
        let end = (start + node.units(g.depth)).min(usable);
        if start < end {
            used += set_range(bits, start, end, true);
        }
    });
    used
}

/// Whether units `[lo, hi)` of `bits` are all clear.
pub(crate) fn all_clear(bits: &[u64], lo: u64, hi: u64) -> bool {
    lo >= hi || last_set(bits, lo, hi).is_none()
}

/// Clear units `[lo, hi)` of `bits`.
pub(crate) fn clear_range(bits: &mut [u64], lo: u64, hi: u64) {
    set_range(bits, lo, hi, false);
}

/// Free stretches of a model, by length: best fit for blocks placed largest first. Taking a
/// place splits its stretch; the model itself is changed by the caller ([`Model::occupy`]).
///
/// Stretches are ordered by their length from the first multiple of `granule` in them (the
/// alignment nearly every packed block needs: a bank), so the first long enough is the place
/// for a block so aligned, found without trying stretches that start badly.
pub(crate) struct Gaps {
    granule: u64,
    /// (length from the first multiple of `granule`, chunk, start, end), in units.
    by_len: BTreeSet<(u64, usize, u64, u64)>,
}

impl Gaps {
    fn insert(&mut self, chunk: usize, start: u64, end: u64) {
        let aligned = start.next_multiple_of(self.granule);
        if start < end {
            self.by_len.insert((end.saturating_sub(aligned), chunk, start, end));
        }
    }

    /// The shortest stretch that holds `units` units starting on a multiple of `align`: take
    /// that place (chunk, start); what is left of the stretch on either side stays.
    pub(crate) fn take(&mut self, units: u64, align: u64) -> Option<(usize, u64)> {
        // A coarser alignment than the granule may need a later stretch; a finer one may fit
        // where the granule's length is too short (not tried: such blocks are few).
        let key = self
            .by_len
            .range((units, 0, 0, 0)..)
            .find(|&&(_, _, start, end)| start.next_multiple_of(align) + units <= end);
        let (len, chunk, start, end) = *key?;
        self.by_len.remove(&(len, chunk, start, end));
        let at = start.next_multiple_of(align);
        self.insert(chunk, start, at);
        self.insert(chunk, at + units, end);
        Some((chunk, at))
    }
}

impl<'a> Model<'a> {
    /// An arena of free chunks (a pool with nothing allocated).
    #[cfg(test)]
    pub(crate) fn empty(geometry: &'a Geometry, bank_size: usize, classes: &'a [SlabClass]) -> Model<'a> {
        let chunks = (0..geometry.chunks)
            .map(|c| ChunkModel {
                role: Role::Free,
                owner: 0,
                used: 0,
                usable: geometry.usable_units(c),
                bits: Vec::new(),
            })
            .collect();
        Model {
            geometry,
            bank_size,
            classes,
            chunks,
            units_per_chunk: geometry.units_per_chunk(),
            min_block: geometry.min_block,
            stamps: Vec::new(),
        }
    }

    /// The arena as the pool has it now (call while paused).
    pub(crate) fn of(pool: &'a Pool) -> Model<'a> {
        let g = &pool.arena().geometry;
        let upc = g.units_per_chunk();
        let words = upc.div_ceil(64) as usize;
        let chunks = (0..g.chunks)
            .map(|chunk| {
                let usable = g.usable_units(chunk);
                match pool.arena().global.state(chunk) {
                    ChunkState::Free => ChunkModel { role: Role::Free, owner: 0, used: 0, usable, bits: Vec::new() },
                    // An absent chunk is neither free nor a place to move into: a full run.
                    ChunkState::RunHead(_)
                    | ChunkState::TailedRunHead(_)
                    | ChunkState::FrontedRun { .. }
                    | ChunkState::RunBody
                    | ChunkState::Absent => {
                        ChunkModel { role: Role::Run, owner: 0, used: usable, usable, bits: Vec::new() }
                    }
                    ChunkState::Core(owner) => {
                        let mut bits = vec![0u64; words];
                        let used = covered_bits(pool, chunk, &mut bits);
                        ChunkModel { role: Role::Core, owner, used, usable, bits }
                    }
                }
            })
            .collect();
        Model {
            geometry: g,
            bank_size: pool.config().bank_size,
            classes: &pool.arena().slabs.classes.classes,
            chunks,
            units_per_chunk: upc,
            min_block: g.min_block,
            stamps: Vec::new(),
        }
    }

    /// The arena as the pool has it, drawn from `census` (taken just before on the same pool):
    /// a core chunk's units are those its census blocks and slabs cover when they add up to
    /// what the chunk counts as covered (so it holds no block without a handle); otherwise
    /// they are read from its buddy tree, as [`Model::of`] reads every chunk's.
    pub(crate) fn of_census(pool: &'a Pool, census: &Census) -> Model<'a> {
        let g = &pool.arena().geometry;
        let upc = g.units_per_chunk();
        let words = upc.div_ceil(64) as usize;
        let mut chunks: Vec<ChunkModel> = (0..g.chunks)
            .map(|chunk| {
                let usable = g.usable_units(chunk);
                match pool.arena().global.state(chunk) {
                    ChunkState::Free => ChunkModel { role: Role::Free, owner: 0, used: 0, usable, bits: Vec::new() },
                    // An absent chunk is neither free nor a place to move into: a full run.
                    ChunkState::RunHead(_)
                    | ChunkState::TailedRunHead(_)
                    | ChunkState::FrontedRun { .. }
                    | ChunkState::RunBody
                    | ChunkState::Absent => {
                        ChunkModel { role: Role::Run, owner: 0, used: usable, usable, bits: Vec::new() }
                    }
                    ChunkState::Core(owner) => {
                        ChunkModel { role: Role::Core, owner, used: 0, usable, bits: vec![0u64; words] }
                    }
                }
            })
            .collect();
        let mut cover = |offset: usize, units: u64| {
            if let Some(c) = chunks.get_mut(g.chunk_of(offset)).filter(|c| c.role == Role::Core) {
                let start = g.unit_in_chunk(offset);
                let end = (start + units).min(c.usable);
                if start < end {
                    c.used += set_range(&mut c.bits, start, end, true);
                }
            }
        };
        for item in census.buddy.iter().filter(|i| i.place == Place::Buddy) {
            if let Some(b) = g.buddy_layout(item.size) {
                cover(item.offset, b.units);
            }
        }
        for view in &census.slabs {
            cover(view.base, (view.bytes >> g.unit_shift) as u64);
        }
        let mut stamps = census.stamps.clone();
        for (chunk, c) in chunks.iter_mut().enumerate() {
            if c.role == Role::Core && census.covered.get(chunk) != Some(&c.used) {
                if let Some(stamp) = stamps.get_mut(chunk) {
                    *stamp = pool.arena().lines[chunk].space.stamp();
                }
                c.bits.fill(0);
                c.used = covered_bits(pool, chunk, &mut c.bits);
            }
        }
        Model {
            geometry: g,
            bank_size: pool.config().bank_size,
            classes: &pool.arena().slabs.classes.classes,
            chunks,
            units_per_chunk: upc,
            min_block: g.min_block,
            stamps,
        }
    }

    /// Make chunk `chunk` (free) a core chunk of `owner` with nothing in it.
    #[cfg(test)]
    pub(crate) fn make_core(&mut self, chunk: usize, owner: usize) {
        let c = self.bits_of(chunk);
        c.role = Role::Core;
        c.owner = owner;
    }

    /// The covered units of core chunk `chunk`, one bit each (`None` for other chunks).
    pub(crate) fn core_bits(&self, chunk: usize) -> Option<&[u64]> {
        self.chunks.get(chunk).filter(|c| c.role == Role::Core && !c.bits.is_empty()).map(|c| c.bits.as_slice())
    }

    /// Bytes of chunk `c` (all of it; the last chunk may be partial).
    pub(crate) fn chunk_bytes(&self, c: usize) -> usize {
        self.geometry.chunk_bytes(c)
    }

    fn bits_of(&mut self, chunk: usize) -> &mut ChunkModel {
        let words = self.units_per_chunk.div_ceil(64) as usize;
        let c = &mut self.chunks[chunk];
        if c.bits.is_empty() {
            c.bits = vec![0u64; words];
        }
        c
    }

    /// Units `[start, start + units)` of `chunk` are no longer covered.
    pub(crate) fn vacate(&mut self, chunk: usize, start: u64, units: u64) {
        let c = self.bits_of(chunk);
        c.used -= set_range(&mut c.bits, start, start + units, false);
    }

    /// Units `[start, start + units)` of `chunk` are covered now (a free chunk becomes a core
    /// chunk of `owner`).
    pub(crate) fn occupy(&mut self, chunk: usize, start: u64, units: u64, owner: usize) {
        let c = self.bits_of(chunk);
        if c.role == Role::Free {
            c.role = Role::Core;
            c.owner = owner;
        }
        c.used += set_range(&mut c.bits, start, start + units, true);
    }

    /// The first unit of the free end of chunk `chunk` (a whole chunk, free or a core chunk):
    /// every unit from it to the chunk's end is free; the chunk's length when its last unit is
    /// covered. `None` for a run's chunk or a short one.
    pub(crate) fn free_suffix_start(&self, chunk: usize) -> Option<u64> {
        let c = &self.chunks[chunk];
        if c.role == Role::Run || c.usable != self.units_per_chunk {
            return None;
        }
        if c.bits.is_empty() || c.used == 0 {
            return Some(0);
        }
        Some(last_set(&c.bits, 0, c.usable).map_or(0, |last| last + 1))
    }

    /// Put the block with front `f` in (`on`, for core `owner`) or take it out: its front, whole
    /// chunks and tail.
    pub(crate) fn set_fronted(&mut self, f: &FrontLayout, on: bool, owner: usize) {
        let g = self.geometry;
        let set = |model: &mut Model, chunk: usize, start: u64, units: u64| match on {
            true => model.occupy(chunk, start, units, owner),
            false => model.vacate(chunk, start, units),
        };
        set(self, f.chunk, f.start, f.front_units(g));
        if f.chunks > 0 {
            self.set_run(f.first_whole(), f.chunks, on);
        }
        if f.tail_units > 0 {
            set(self, f.tail_chunk(), 0, f.tail_units);
        }
    }

    /// Whether a chunk holds nothing (free, or a core chunk with nothing in it).
    pub(crate) fn is_empty(&self, chunk: usize) -> bool {
        let c = &self.chunks[chunk];
        c.role == Role::Free || (c.role == Role::Core && c.used == 0)
    }

    /// Make chunks `[start, start + len)` a run (they must be empty) or free them.
    pub(crate) fn set_run(&mut self, start: usize, len: usize, run: bool) {
        for c in &mut self.chunks[start..start + len] {
            c.role = if run { Role::Run } else { Role::Free };
            c.used = if run { c.usable } else { 0 };
            c.bits.clear();
        }
    }

    /// The lowest position `p >= from` of `chunk`, a multiple of `align` units, where `units`
    /// free units start and end by `limit`; the chunk must be a core chunk or free.
    pub(crate) fn find(&self, chunk: usize, from: u64, units: u64, align: u64, limit: u64) -> Option<u64> {
        let c = &self.chunks[chunk];
        let limit = limit.min(c.usable);
        if c.role == Role::Run || c.usable - c.used < units || units > limit {
            return None;
        }
        let mut p = from.next_multiple_of(align);
        if c.bits.is_empty() {
            return (p + units <= limit).then_some(p);
        }
        while p + units <= limit {
            match last_set(&c.bits, p, p + units) {
                None => return Some(p),
                Some(q) => p = (q + 1).next_multiple_of(align),
            }
        }
        None
    }

    /// Free units of chunk `i`: all of a free chunk, the uncovered units of a core chunk.
    pub(crate) fn free_units(&self, i: usize) -> u64 {
        let c = &self.chunks[i];
        match c.role {
            Role::Free => c.usable,
            Role::Core => c.usable - c.used,
            Role::Run => 0,
        }
    }

    /// The free stretches of chunks `0..=last` (free chunks whole), to place blocks into;
    /// `granule` is the alignment (units) most of them need.
    pub(crate) fn gaps(&self, last: usize, granule: u64) -> Gaps {
        let mut gaps = Gaps { granule: granule.max(1), by_len: BTreeSet::new() };
        for (i, c) in self.chunks.iter().enumerate().take(last + 1) {
            match c.role {
                Role::Run => {}
                _ if c.bits.is_empty() => {
                    if c.used == 0 {
                        gaps.insert(i, 0, c.usable);
                    }
                }
                _ => {
                    let mut at = 0;
                    while at < c.usable {
                        let free = next_covered(&c.bits, at, c.usable) - at;
                        gaps.insert(i, at, at + free);
                        at += free;
                        at = next_uncovered(&c.bits, at, c.usable);
                    }
                }
            }
        }
        gaps
    }

    /// Free bytes of chunk `i`: all of an empty chunk, the free units of a core chunk.
    fn free_bytes_of(&self, i: usize) -> usize {
        let c = &self.chunks[i];
        match c.role {
            Role::Free => self.chunk_bytes(i),
            Role::Core => (c.usable - c.used) as usize * self.min_block,
            Role::Run => 0,
        }
    }

    /// Free bytes: empty chunks whole, the free units of core chunks.
    pub(crate) fn free_bytes(&self) -> usize {
        (0..self.chunks.len()).map(|i| self.free_bytes_of(i)).sum()
    }

    /// The model as `stats()` reads the pool after `moves`: with the slabs of `census` that
    /// hold no object after them vacated (those the moves leave in place: not moved whole).
    /// The model keeps such slabs covered, as the moves may not use them, but a step gives
    /// them back after its last batch, and with them the chunks they alone kept (an allocation
    /// also gives them back before it fails, so `stats()` counts their room free). A slab's
    /// objects after the moves are its census objects, less those that move out of it, plus
    /// those that move into it. Borrowed when no slab is left without objects.
    pub(crate) fn settled(&self, census: &Census, moves: &[&Piece]) -> Cow<'_, Model<'a>> {
        let g = self.geometry;
        // The slabs moved whole, and each object move's two ends by offset (the move's
        // place in `moves`, its source before its destination), so that each slab reads the
        // moves inside it only.
        let mut whole = Vec::new();
        let mut ends: Vec<(usize, usize, bool)> = Vec::new();
        for (i, p) in moves.iter().enumerate() {
            match p.kind {
                PieceKind::Slab { .. } => whole.push(p.from),
                PieceKind::SlabObject { .. } => ends.extend([(p.from, 2 * i, false), (p.to, 2 * i + 1, true)]),
                _ => {}
            }
        }
        whole.sort_unstable();
        ends.sort_unstable();
        let free_after = |v: &SlabView| -> Option<u64> {
            if whole.binary_search(&v.base).is_ok() {
                return None;
            }
            let class = &self.classes[v.class];
            let first = ends.partition_point(|e| e.0 < v.base);
            let last = ends.partition_point(|e| e.0 < v.base + v.bytes);
            let mut inside = ends[first..last].to_vec();
            inside.sort_unstable_by_key(|&(_, order, _)| order);
            let mut free = v.free;
            for (offset, _, arrives) in inside {
                let bit = class.index_of(offset - v.base).map_or(0, |j| 1 << j);
                if arrives {
                    free &= !bit;
                } else {
                    free |= bit;
                }
            }
            Some(free)
        };
        let empty: Vec<&SlabView> =
            census.slabs.iter().filter(|v| free_after(v) == Some(self.classes[v.class].objects_mask())).collect();
        if empty.is_empty() {
            return Cow::Borrowed(self);
        }
        let mut settled = self.clone();
        for view in empty {
            let chunk = g.chunk_of(view.base);
            if settled.chunks[chunk].role == Role::Core {
                settled.vacate(chunk, g.unit_in_chunk(view.base), (view.bytes >> g.unit_shift) as u64);
            }
        }
        Cow::Owned(settled)
    }

    /// The largest request an allocation could get after the moves, as `stats()` counts it
    /// on the pool (`Pool::largest_free_block`): the largest request a run of empty chunks
    /// holds (with the tail the free start of the core chunk after it could hold,
    /// `arena/tail.rs`, and the front the free end of the one before it could:
    /// `Geometry::largest_request_in_run`), and in each core chunk its largest free
    /// power-of-two node and what its free stretches hold ([`Model::largest_in_holes`]).
    pub(crate) fn largest_free(&self) -> usize {
        // The longest stretch first: a chunk's nodes are then only searched when one could
        // beat it.
        let mut best = 0usize;
        let mut run = 0usize;
        let chunks = self.chunks.len();
        for i in 0..=chunks {
            if i < chunks && self.is_empty(i) {
                run += 1;
                continue;
            }
            if run > 0 {
                let start = i - run;
                let front = start.checked_sub(1).map_or(0, |c| self.front_room_of(c));
                let tail_room = if i < chunks { self.tail_room_at(i) } else { 0 };
                best = best.max(self.geometry.largest_request_in_run((start, run), front, tail_room));
            }
            run = 0;
        }
        best = best.max(self.largest_in_holes());
        for (i, c) in self.chunks.iter().enumerate() {
            if self.is_empty(i) || c.role != Role::Core {
                continue;
            }
            // The largest aligned free node of this chunk.
            let mut size = self.units_per_chunk >> 1;
            while size >= 1 && (size * self.min_block as u64) as usize > best {
                if (0..c.usable / size).any(|k| last_set(&c.bits, k * size, (k + 1) * size).is_none()) {
                    best = best.max((size as usize) * self.min_block);
                    break;
                }
                size >>= 1;
            }
        }
        best
    }
}

impl Model<'_> {
    /// The largest request the free stretches of the core chunks that are not empty hold, as
    /// `Pool::largest_free_block` reads them from the trees: a block larger than a bank from a
    /// bank boundary (`Geometry::largest_request_in_stretch`), a block of at most a bank at its
    /// enclosing node's start (`Geometry::largest_banked_buddy_in`), and, with `run_tails`, a
    /// block with a front across the boundary of two such chunks: the free end of one joined
    /// to the free start of the next (`Geometry::largest_request_across`). Without these a
    /// plan could predict less room than its moves make, and a compaction that would have
    /// served a request moved nothing.
    fn largest_in_holes(&self) -> usize {
        let g = self.geometry;
        let mut best = 0usize;
        // What the chunk before holds, when it is a core chunk that is not empty.
        let mut before: Option<FreeStretches> = None;
        for (i, c) in self.chunks.iter().enumerate() {
            if self.is_empty(i) || c.role != Role::Core {
                before = None;
                continue;
            }
            // The free holes, `[from, to)`, in address order.
            let hole_at = |from: u64| (from < c.usable).then(|| (from, next_covered(&c.bits, from, c.usable)));
            let holes = std::iter::successors(hole_at(next_uncovered(&c.bits, 0, c.usable)), |&(_, to)| {
                hole_at(next_uncovered(&c.bits, to, c.usable))
            });
            let free = g.free_stretches(holes, c.usable);
            best = best.max(free.largest_request(g));
            if let Some(end) = before.map(|b| b.at_end).filter(|&end| end > 0) {
                best = best.max(g.largest_request_across(i - 1, self.units_per_chunk - end, free.at_start));
            }
            before = Some(free);
        }
        best
    }

    /// The bytes of the free end of core chunk `c` (from a bank boundary past whole granules
    /// of its tree's bitmap, as the allocator reads it) that a block with a front could take
    /// before a run of empty chunks after it, up to the arena's end or not (0 without
    /// `run_tails`).
    fn front_room_of(&self, c: usize) -> usize {
        let upc = self.units_per_chunk;
        if !self.geometry.tails || self.is_empty(c) || self.chunks[c].role != Role::Core || c + 1 >= self.chunks.len() {
            return 0;
        }
        let bank = self.geometry.bank_units(self.bank_size);
        let granule = 1u64 << granule_shift(self.geometry.depth);
        match self.free_suffix_start(c).map(|start| start.next_multiple_of(granule).next_multiple_of(bank)) {
            Some(start) if start < upc => (upc - start) as usize * self.min_block,
            _ => 0,
        }
    }

    /// The free units at the start of chunk `i` (whole granules of its tree's bitmap, as the
    /// allocator reads them), where a tail could go after a run of empty chunks (0 without
    /// `run_tails`, or when `i` is not a core chunk).
    fn tail_room_at(&self, i: usize) -> u64 {
        let c = &self.chunks[i];
        if !self.geometry.tails || c.role != Role::Core {
            return 0;
        }
        let granule = 1u64 << granule_shift(self.geometry.depth);
        next_covered(&c.bits, 0, c.usable) & !(granule - 1)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A fragmented pool's model drawn from its census is the model read from its trees.
    #[test]
    fn the_census_draws_the_model_the_trees_hold() {
        let pool = Pool::new(crate::config::PoolConfig::new(64 << 20).cores(2)).unwrap();
        let _raw = pool.alloc_raw(3000, None).unwrap();
        let mut live = Vec::new();
        let mut seed = 7u64;
        for i in 0..6000usize {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let size = 64 + (seed >> 33) as usize % (40 << 10);
            let align = if i % 7 == 0 { Some(4096) } else { None };
            if let Ok(h) = pool.alloc(size, align, 0) {
                live.push(h);
            }
        }
        for (i, h) in live.into_iter().enumerate() {
            if i % 3 != 0 {
                pool.free(h).unwrap();
            }
        }
        let _paused = pool.pause_for_maintenance().unwrap();
        let census = pool.census(false);
        let (drawn, read) = (Model::of_census(&pool, &census), Model::of(&pool));
        assert_eq!(drawn.chunks.len(), read.chunks.len());
        for (a, b) in drawn.chunks.iter().zip(&read.chunks) {
            assert_eq!((a.role, a.owner, a.used, a.usable), (b.role, b.owner, b.used, b.usable));
            assert_eq!(a.bits, b.bits);
        }
    }

    #[test]
    fn bit_ranges() {
        let mut bits = vec![0u64; 4];
        set_range(&mut bits, 3, 130, true);
        assert_eq!(last_set(&bits, 0, 3), None);
        assert_eq!(last_set(&bits, 0, 4), Some(3));
        assert_eq!(last_set(&bits, 100, 200), Some(129));
        assert_eq!(last_set(&bits, 130, 256), None);
        set_range(&mut bits, 64, 128, false);
        assert_eq!(last_set(&bits, 60, 128), Some(63));
        assert_eq!(bits[1], 0);
        assert_eq!(bits[2], 0b11);
    }
}

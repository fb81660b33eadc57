//! The compaction planners: which blocks move where.
//!
//! * **Slab packing**: per size class, the objects of the sparsest slabs move into the free
//!   objects of the others, as long as they fit; the emptied slabs go back.
//! * **Packing below a boundary** (full compaction): every block above a boundary chunk moves
//!   into the holes at or below it, largest first, packed (not at the start of its enclosing
//!   buddy node, so trimmed tails fill too); the boundary is as low as the free units allow. Only
//!   the blocks above it move (in a pool half full of scattered holes, about half of them).
//! * **Repack / slide** (full compaction, when the packing leaves much more behind than any
//!   packing would): every block re-placed largest first (host memory), or slid down in address
//!   order (a device).
//! * **Evacuation**: named chunks emptied into the others (`Evacuate`); or an incremental step:
//!   the chunks above the boundary, sparsest first, their blocks into the lowest places below
//!   their own chunks, at most `max_bytes` of moves (a chunk may take several steps); then runs
//!   slide down into the room that makes.
//!
//! Planners work on a [`Model`] of the arena and on a census of the live blocks; nothing in the
//! pool changes until the executor runs the plan.

use std::collections::{HashMap, HashSet};

use super::execute::{Kind, Unit};
use super::model::{Model, Role};
use crate::arena::layout::Layout;
use crate::arena::slab::caches::{SlabRef, SlabView};
use crate::handle::id::Handle;
use crate::handle::table::SlotInfo;
use crate::pool::pool::Pool;

/// A live block found by the census.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) handle: Handle,
    pub(crate) info: SlotInfo,
    /// Not pinned (and, for a census that claims, marked moving by it).
    pub(crate) movable: bool,
}

/// Every live block, by where it lives.
#[derive(Default)]
pub(crate) struct Census {
    /// Buddy blocks of core chunks.
    pub(crate) buddy: Vec<Item>,
    /// Chunk runs.
    pub(crate) runs: Vec<Item>,
    /// Slab objects, by slab id (an index: slab ids are dense).
    pub(crate) objects: Vec<Vec<Item>>,
    /// Every live slab.
    pub(crate) slabs: Vec<SlabView>,
}

impl Census {
    /// The objects of slab `id`.
    pub(crate) fn items(&self, id: u32) -> &[Item] {
        self.objects.get(id as usize).map_or(&[][..], Vec::as_slice)
    }

    fn add_object(&mut self, id: u32, item: Item) {
        let i = id as usize;
        if self.objects.len() <= i {
            self.objects.resize_with(i + 1, Vec::new);
        }
        self.objects[i].push(item);
    }

    /// Every handle the census marked moving.
    pub(crate) fn claimed(&self) -> impl Iterator<Item = Handle> + '_ {
        self.buddy
            .iter()
            .chain(self.runs.iter())
            .chain(self.objects.iter().flatten())
            .filter(|i| i.movable)
            .map(|i| i.handle)
    }
}

/// A slab worth moving as a whole: it holds objects, every one has a handle and none is
/// pinned. (An all-free slab goes back to the buddy pool after the batch instead.)
fn slab_worth_moving(census: &Census, view: &SlabView, objects_per_slab: u32) -> bool {
    let all = (1u64 << objects_per_slab) - 1;
    view.free & all != all && slab_movable(census, view, objects_per_slab)
}

/// A slab that can move as a whole: every object has a handle and none is pinned.
fn slab_movable(census: &Census, view: &SlabView, objects_per_slab: u32) -> bool {
    let live = objects_per_slab - (view.free & ((1u64 << objects_per_slab) - 1)).count_ones();
    let items = census.items(view.id);
    items.len() as u32 == live && items.iter().all(|i| i.movable)
}

impl Pool {
    /// Every live block. With `claim`, every unpinned block is marked moving as it is found
    /// (the caller must clear each mark, moved or not); pinned ones stay put.
    pub(crate) fn census(&self, claim: bool) -> Census {
        let mut census = Census { slabs: self.arena().slabs.views(), ..Census::default() };
        let mut add = |handle: Handle, info: SlotInfo, movable: bool| {
            let item = Item { handle, info, movable };
            if let Some(slab) = self.arena().slabs.lookup(info.offset) {
                census.add_object(slab.id, item);
                return;
            }
            match self.arena().global.state(self.arena().geometry.chunk_of(info.offset)) {
                crate::arena::global::ChunkState::RunHead(_) => census.runs.push(item),
                _ => census.buddy.push(item),
            }
        };
        if claim {
            self.handles().claim_live(&mut add);
        } else {
            self.handles().for_each_live(&mut |handle, info| add(handle, info, info.pins == 0));
        }
        census
    }

    /// The census after a slab packing ran (`emptied` slabs, in the order of
    /// [`Pool::plan_slab_packing`], their objects moved by `moved`, whose marks the batch
    /// cleared) and emptied slabs went back: the moved objects are marked moving again (unless
    /// pinned meanwhile), with their new offsets and slabs; the slab list is read again.
    pub(crate) fn advance(&self, mut census: Census, emptied: &[u32], moved: &[Unit]) -> Census {
        let mut units = moved.iter();
        for &id in emptied {
            let items = census.objects.get_mut(id as usize).map(std::mem::take).unwrap_or_default();
            for mut item in items {
                let unit = units.next().expect("one move per object of an emptied slab");
                debug_assert_eq!(unit.handle, Some(item.handle));
                item.info.offset = unit.to;
                item.movable = self.handles().begin_move(item.handle).is_ok();
                match self.arena().slabs.lookup(unit.to) {
                    Some(slab) => census.add_object(slab.id, item),
                    None => census.buddy.push(item), // cannot happen: an object lands in a slab
                }
            }
        }
        census.slabs = self.arena().slabs.views();
        census
    }

    /// The alignment (units) a buddy block of `units` units aligned to `align` bytes needs at a
    /// place a planner picks: it is packed there (see [`crate::arena::layout::BuddyLayout`]), not put
    /// at the start of its enclosing node, so no trimmed tail is left behind it.
    fn packed_alignment(&self, units: u64, align: usize) -> u64 {
        self.arena().geometry.packed_alignment(units, align, self.config().bank_size)
    }

    /// Bytes a repack would copy: every movable buddy block, chunk run and whole slab.
    pub(crate) fn movable_bytes(&self, census: &Census) -> usize {
        let blocks: usize =
            census.buddy.iter().chain(census.runs.iter()).filter(|i| i.movable).map(|i| i.info.size).sum();
        let slabs: usize = census
            .slabs
            .iter()
            .filter(|v| slab_worth_moving(census, v, self.arena().slabs.classes.classes[v.class].objects))
            .map(|v| v.bytes)
            .sum();
        blocks + slabs
    }

    /// Free bytes the bank rule leaves however tightly blocks are packed: a buddy block larger
    /// than a bank starts on a bank boundary, so the rest of its last bank stays free (only a
    /// block of at most a bank fits there, and those live in slabs).
    pub(crate) fn bank_slack(&self, census: &Census) -> usize {
        let g = &self.arena().geometry;
        let bank = g.bank_units(self.config().bank_size);
        census
            .buddy
            .iter()
            .filter_map(|i| self.arena().buddy_layout(i.info.size))
            .filter(|b| b.units > bank)
            .map(|b| (b.units.next_multiple_of(bank) - b.units) as usize * g.min_block)
            .sum()
    }

    fn block_unit(&self, item: &Item) -> Option<Unit> {
        self.unit_of(item.handle, &item.info).ok()
    }

    /// Slab packing: moves of objects of the sparsest slabs into free objects of the others,
    /// and the slabs emptied (every object of each, in order, is one move). Emptied slabs are
    /// given back by the executor's tidying.
    pub(crate) fn plan_slab_packing(&self, census: &Census) -> (Vec<Unit>, Vec<u32>) {
        let classes = &self.arena().slabs.classes.classes;
        let mut units = Vec::new();
        let mut emptied_ids = Vec::new();
        for (k, class) in classes.iter().enumerate() {
            let all_free = class.all_free();
            let views: Vec<&SlabView> = census.slabs.iter().filter(|v| v.class == k).collect();
            if views.len() < 2 {
                continue;
            }
            // (view, live objects, can empty)
            let mut slabs: Vec<(&SlabView, u32, bool)> = views
                .iter()
                .map(|v| {
                    let live = class.objects - (v.free & all_free).count_ones();
                    (*v, live, slab_movable(census, v, class.objects) && live > 0)
                })
                .collect();
            // Sparsest movable slabs first; they empty as long as their objects fit elsewhere.
            slabs.sort_by_key(|&(v, live, movable)| (!movable, live, std::cmp::Reverse(v.base)));
            let total_free: u64 = slabs.iter().map(|&(v, _, _)| u64::from((v.free & all_free).count_ones())).sum();
            let (mut emptied, mut moving, mut lost_room) = (0usize, 0u64, 0u64);
            for &(v, live, movable) in &slabs {
                let room = u64::from((v.free & all_free).count_ones());
                if !movable || moving + u64::from(live) > total_free - lost_room - room {
                    break;
                }
                moving += u64::from(live);
                lost_room += room;
                emptied += 1;
            }
            if emptied == 0 {
                continue;
            }
            // Targets: free objects of the kept slabs, densest slabs first.
            let mut kept: Vec<(&SlabView, u32)> = slabs[emptied..].iter().map(|&(v, live, _)| (v, live)).collect();
            kept.sort_by_key(|&(v, live)| (std::cmp::Reverse(live), v.base));
            let mut targets = kept.iter().flat_map(|&(v, _)| {
                (0..class.objects).filter(move |j| v.free & (1 << j) != 0).map(move |j| v.base + class.offset_of(j))
            });
            for &(v, _, _) in &slabs[..emptied] {
                emptied_ids.push(v.id);
                for item in census.items(v.id) {
                    let mut unit = self.block_unit(item).expect("a census block is where its handle says");
                    unit.to = targets.next().expect("the kept slabs have room for every moved object");
                    units.push(unit);
                }
            }
        }
        (units, emptied_ids)
    }

    /// The plan of a full compaction over `model` (changed to the arena after it): the moves
    /// of every movable run, buddy block and whole slab that goes elsewhere.
    ///
    /// * **Slide** (`downward`): every block, slab and run, in address order, goes to the lowest
    ///   place at or below its own that fits, counting the places the blocks before it left.
    ///   Every destination starts at or below its source, so copying in ascending source order
    ///   is safe: a destination `[d, d + n)` with `d <= s` can only overlap sources that start
    ///   below `s` (they are disjoint from `[s, s + n)`), which are copied first; the executor
    ///   finds exactly that order. No cycle can arise: a mover on a device can do it.
    /// * **Repack** (otherwise): every movable block leaves first; runs come back in address
    ///   order to the lowest free stretch of chunks, then buddy blocks and slabs largest first
    ///   (first fit decreasing: small blocks fill the tails trimmed blocks leave in their buddy
    ///   nodes, wherever those are). The tightest packing; the executor orders the copies and
    ///   breaks cycles through a bounce buffer (host memory only). `None` if some block finds
    ///   no place (then the caller slides instead).
    pub(crate) fn plan_slide(&self, census: &Census, model: &mut Model, downward: bool) -> Option<Vec<Unit>> {
        let g = &self.arena().geometry;
        // (unit, units, alignment in units); runs have 0 units.
        let mut candidates: Vec<(Unit, u64, u64)> = Vec::new();
        for item in census.buddy.iter().chain(census.runs.iter()).filter(|i| i.movable) {
            let Some(unit) = self.block_unit(item) else { continue };
            match unit.kind {
                Kind::Buddy => {
                    let Layout::Buddy(b) = g.layout(unit.size, unit.align) else { continue };
                    let align = self.packed_alignment(b.units, unit.align);
                    candidates.push((unit, b.units, align));
                }
                Kind::Run { .. } => candidates.push((unit, 0, 0)),
                _ => {}
            }
        }
        for view in &census.slabs {
            let class = &self.arena().slabs.classes.classes[view.class];
            if slab_worth_moving(census, view, class.objects) {
                candidates.push(self.slab_unit(census, view));
            }
        }
        if downward {
            candidates.sort_by_key(|(u, _, _)| u.from);
        } else {
            // Runs first (by address), then the rest largest first (by address within a size).
            candidates.sort_by_key(|(u, units, align)| {
                (*units != 0, std::cmp::Reverse(*units), std::cmp::Reverse(*align), u.from)
            });
            for (u, units, _) in &candidates {
                match u.kind {
                    Kind::Run { chunks } => model.set_run(g.chunk_of(u.from), chunks, false),
                    _ => model.vacate(g.chunk_of(u.from), g.unit_in_chunk(u.from), *units),
                }
            }
        }
        let mut cursors: HashMap<(u64, u64), (usize, u64)> = HashMap::new();
        let mut moves = Vec::new();
        for (mut unit, units, align) in candidates {
            let from_chunk = g.chunk_of(unit.from);
            if let Kind::Run { chunks } = unit.kind {
                let Layout::Run { align_chunks, .. } = g.layout(unit.size, unit.align) else { continue };
                if downward {
                    model.set_run(from_chunk, chunks, false);
                }
                let last = if downward { from_chunk } else { model.chunks.len() - chunks };
                let fits = |d: usize| {
                    (d..d + chunks).all(|c| model.is_empty(c)) && self.arena().run_bytes(d, chunks) == unit.extent
                };
                let to = (0..=last).step_by(align_chunks).find(|&d| fits(d))?;
                model.set_run(to, chunks, true);
                unit.to = to * g.chunk_size;
            } else {
                let pos = g.unit_in_chunk(unit.from);
                if downward {
                    model.vacate(from_chunk, pos, units);
                }
                // Downward, places left behind are above every cursor (cursors stay below the
                // sources seen so far); in a repack, every place was left before the first.
                let last = if downward { from_chunk } else { model.chunks.len() - 1 };
                let cursor = cursors.entry((units, align)).or_insert((0, 0));
                let mut placed = None;
                while cursor.0 <= last {
                    let c = cursor.0;
                    let limit = if downward && c == from_chunk { pos + units } else { u64::MAX };
                    if let Some(p) = model.find(c, cursor.1, units, align, limit) {
                        placed = Some((c, p));
                        break;
                    }
                    *cursor = (c + 1, 0);
                }
                let (c, p) = placed?;
                *cursor = (c, p);
                model.occupy(c, p, units, unit.core);
                unit.to = g.offset_of(c, p);
            }
            if unit.to != unit.from {
                moves.push(unit);
            }
        }
        Some(moves)
    }

    /// Packing below a boundary (full compaction): the arena is cut at a *boundary chunk*, the
    /// lowest for which the free units at or below it cover the movable units above it. Every
    /// movable block and slab above it moves into the holes at or below it, largest first, each
    /// into the shortest hole that holds it (packed: see [`Pool::packed_alignment`]), so the
    /// holes below fill up. What finds no hole there (a slab needs a hole of its own alignment;
    /// the bank rule leaves gaps no large block can use) is packed the same way, lowest place
    /// first, into the room just above the boundary. Blocks at or below the boundary stay: in a pool half full
    /// of scattered holes about half the blocks move (a repack moves nearly all). Chunk runs go
    /// first (each into the lowest stretch of empty chunks below it) and, if they found none,
    /// again at the end, into the room the packing made.
    ///
    /// No cycle can arise, so a mover on a device can do it: a destination at or below the
    /// boundary was free before the batch; one above it overlaps at most sources of blocks that
    /// went below the boundary (copied out first).
    pub(crate) fn plan_pack(&self, census: &Census, model: &mut Model) -> Vec<Unit> {
        let mut moves = Vec::new();
        let mut runs: Vec<Unit> = census.runs.iter().filter(|i| i.movable).filter_map(|i| self.block_unit(i)).collect();
        runs.sort_by_key(|u| u.from);
        let mut stuck = Vec::new();
        for run in runs {
            match self.plan_run_move(model, &run) {
                Some(unit) => moves.push(unit),
                None => stuck.push(run),
            }
        }
        let n = model.chunks.len();
        let pieces = self.movable_pieces(census, n);
        // What `movable_units` counts, from the pieces at hand.
        let units: Vec<u64> =
            pieces.iter().map(|chunk| chunk.iter().map(|(_, n, align)| n.next_multiple_of(*align)).sum()).collect();
        let boundary = self.boundary(model, &units);
        if boundary + 1 < n {
            let (packed, left) = self.pack_below(model, &pieces[boundary + 1..], boundary);
            moves.extend(packed);
            moves.extend(self.pack_above(model, left, boundary + 1));
        }
        // Runs that found no room go again, lowest first, into what the packing emptied.
        for run in stuck {
            if let Some(unit) = self.plan_run_move(model, &run) {
                moves.push(unit);
            }
        }
        moves
    }

    /// The boundary chunk of a compaction: the lowest chunk for which the free units at or
    /// below it cover the `movable` units above it (per chunk, see [`Pool::movable_units`]).
    pub(crate) fn boundary(&self, model: &Model, movable: &[u64]) -> usize {
        let n = model.chunks.len();
        let mut above: Vec<u64> = vec![0; n + 1];
        for c in (0..n).rev() {
            above[c] = above[c + 1] + movable[c];
        }
        let mut free_below = 0u64;
        (0..n)
            .find(|&c| {
                free_below += model.free_units(c);
                free_below >= above[c + 1]
            })
            .unwrap_or(n.saturating_sub(1))
    }

    /// The units the movable blocks and whole slabs of each chunk take wherever they are packed:
    /// a block larger than a bank takes whole banks (the next one starts on a bank boundary).
    pub(crate) fn movable_units(&self, census: &Census, chunks: usize) -> Vec<u64> {
        let g = &self.arena().geometry;
        let mut units = vec![0u64; chunks];
        for item in census.buddy.iter().filter(|i| i.movable) {
            if let Some(b) = self.arena().buddy_layout(item.info.size) {
                let align = self.packed_alignment(b.units, 1 << item.info.align_log2);
                units[g.chunk_of(item.info.offset)] += b.units.next_multiple_of(align);
            }
        }
        for view in &census.slabs {
            if slab_worth_moving(census, view, self.arena().slabs.classes.classes[view.class].objects) {
                units[g.chunk_of(view.base)] += (view.bytes >> g.unit_shift) as u64;
            }
        }
        units
    }

    /// The chunks an incremental step evacuates, in order: the chunks above the boundary (see
    /// [`Pool::plan_pack`]) whose blocks can all move, sparsest first (the fewest bytes to
    /// move, then the highest). Each step empties as many chunks as its budget allows; their
    /// blocks go into the lowest holes (below the boundary while there are any), so every
    /// chunk above the boundary empties in the end and the free chunks join into one run.
    pub(crate) fn evacuation_order(&self, census: &Census, model: &Model, contents: &[Option<Contents>]) -> Vec<usize> {
        let boundary = self.boundary(model, &self.movable_units(census, model.chunks.len()));
        let mut chunks: Vec<(usize, usize)> = contents
            .iter()
            .enumerate()
            .skip(boundary + 1)
            .filter_map(|(chunk, c)| c.as_ref().filter(|c| c.movable && c.bytes > 0).map(|c| (chunk, c.bytes)))
            .collect();
        chunks.sort_by_key(|&(chunk, bytes)| (bytes, std::cmp::Reverse(chunk)));
        chunks.into_iter().map(|(chunk, _)| chunk).collect()
    }

    /// The movable buddy blocks and whole slabs of every core chunk: (unit, units, alignment
    /// in units), by chunk.
    fn movable_pieces(&self, census: &Census, chunks: usize) -> Vec<Vec<(Unit, u64, u64)>> {
        let g = &self.arena().geometry;
        let mut pieces: Vec<Vec<(Unit, u64, u64)>> = vec![Vec::new(); chunks];
        for item in census.buddy.iter().filter(|i| i.movable) {
            let Some(unit) = self.block_unit(item) else { continue };
            let Layout::Buddy(b) = g.layout(unit.size, unit.align) else { continue };
            let align = self.packed_alignment(b.units, unit.align);
            pieces[g.chunk_of(unit.from)].push((unit, b.units, align));
        }
        for view in &census.slabs {
            let class = &self.arena().slabs.classes.classes[view.class];
            if slab_worth_moving(census, view, class.objects) {
                let piece = self.slab_unit(census, view);
                pieces[g.chunk_of(view.base)].push(piece);
            }
        }
        pieces
    }

    /// Move the `pieces` (of chunks above `boundary`) into the free stretches of chunks up to
    /// it, largest first, each into the shortest stretch that holds it (best fit: what is left
    /// of a stretch stays for smaller pieces), in `model`: the moves, and the pieces that
    /// found no place (still where they are).
    fn pack_below<'p>(
        &self,
        model: &mut Model,
        pieces: &'p [Vec<(Unit, u64, u64)>],
        boundary: usize,
    ) -> (Vec<Unit>, Vec<&'p (Unit, u64, u64)>) {
        let g = &self.arena().geometry;
        let mut moving: Vec<&(Unit, u64, u64)> = pieces.iter().flatten().collect();
        moving.sort_by_key(|(u, units, align)| (std::cmp::Reverse(*units), std::cmp::Reverse(*align), u.from));
        let mut gaps = model.gaps(boundary, self.arena().geometry.bank_units(self.config().bank_size));
        let mut moves = Vec::with_capacity(moving.len());
        let mut left = Vec::new();
        for piece in moving {
            let (unit, units, align) = piece;
            let Some((c, p)) = gaps.take(*units, *align) else {
                left.push(piece);
                continue;
            };
            model.occupy(c, p, *units, unit.core);
            model.vacate(g.chunk_of(unit.from), g.unit_in_chunk(unit.from), *units);
            moves.push(Unit { to: g.offset_of(c, p), ..unit.clone() });
        }
        (moves, left)
    }

    /// Move `pieces` (that found no hole at or below the boundary) into the room just above
    /// it: largest first, each to the lowest place from chunk `floor` up that ends before its
    /// own start (else it stays), in `model`. Their own places stay covered while they are
    /// placed, so no destination overlaps another of them: a destination overlaps at most
    /// sources of blocks that went below the boundary, copied out first.
    fn pack_above(&self, model: &mut Model, mut pieces: Vec<&(Unit, u64, u64)>, floor: usize) -> Vec<Unit> {
        let g = &self.arena().geometry;
        pieces.sort_by_key(|(u, units, align)| (std::cmp::Reverse(*units), std::cmp::Reverse(*align), u.from));
        // Per shape, the lowest place worth trying (places only fill up here).
        let mut cursors: HashMap<(u64, u64), (usize, u64)> = HashMap::new();
        let mut placed = Vec::new();
        for (unit, units, align) in pieces {
            let (own_chunk, own) = (g.chunk_of(unit.from), g.unit_in_chunk(unit.from));
            let cursor = cursors.entry((*units, *align)).or_insert((floor, 0));
            let mut found = None;
            while cursor.0 <= own_chunk {
                let limit = if cursor.0 == own_chunk { own } else { u64::MAX };
                if let Some(p) = model.find(cursor.0, cursor.1, *units, *align, limit) {
                    found = Some((cursor.0, p));
                    *cursor = (cursor.0, p);
                    break;
                }
                if cursor.0 == own_chunk {
                    break; // searched below its own start only: later pieces may fit further up
                }
                *cursor = (cursor.0 + 1, 0);
            }
            if let Some((c, p)) = found {
                model.occupy(c, p, *units, unit.core);
                placed.push((unit, *units, g.offset_of(c, p)));
            }
        }
        // Their old places are free once all are placed.
        placed
            .into_iter()
            .map(|(unit, units, to)| {
                model.vacate(g.chunk_of(unit.from), g.unit_in_chunk(unit.from), units);
                Unit { to, ..unit.clone() }
            })
            .collect()
    }

    /// Move `run` (in the model) to the lowest stretch of empty chunks that starts below it
    /// (it may overlap its own chunks); `None` (and the model as it was) when there is none.
    fn plan_run_move(&self, model: &mut Model, run: &Unit) -> Option<Unit> {
        let g = &self.arena().geometry;
        let Kind::Run { chunks } = run.kind else { return None };
        let Layout::Run { align_chunks, .. } = g.layout(run.size, run.align) else { return None };
        let first = g.chunk_of(run.from);
        model.set_run(first, chunks, false);
        let fits =
            |d: usize| (d..d + chunks).all(|c| model.is_empty(c)) && self.arena().run_bytes(d, chunks) == run.extent;
        match (0..first).step_by(align_chunks).find(|&d| fits(d)) {
            Some(d) => {
                model.set_run(d, chunks, true);
                Some(Unit { to: d * g.chunk_size, ..run.clone() })
            }
            None => {
                model.set_run(first, chunks, true);
                None
            }
        }
    }

    /// A whole slab as one move (to be placed): (unit, units, alignment in units).
    fn slab_unit(&self, census: &Census, view: &SlabView) -> (Unit, u64, u64) {
        let objects = census.items(view.id).iter().map(|i| (i.handle, i.info.offset)).collect();
        let units = (view.bytes >> self.arena().geometry.unit_shift) as u64;
        let unit = Unit {
            kind: Kind::Slab { id: view.id, objects },
            handle: None,
            size: view.bytes,
            align: view.bytes,
            core: view.owner,
            from: view.base,
            to: view.base,
            extent: view.bytes,
        };
        (unit, units, units)
    }

    /// Run slides for an incremental step: runs (in address order) with empty chunks right
    /// below them move down into those chunks, while their bytes fit `budget`; what a run
    /// leaves at its top joins the free chunks above it. `emptied` chunks (evacuated by the same
    /// step) count as empty.
    pub(crate) fn plan_run_slides(
        &self,
        census: &Census,
        model: &mut Model,
        emptied: &[usize],
        budget: usize,
    ) -> Vec<Unit> {
        let g = &self.arena().geometry;
        for &c in emptied {
            model.set_run(c, 1, false);
        }
        let mut runs: Vec<Unit> = census.runs.iter().filter(|i| i.movable).filter_map(|i| self.block_unit(i)).collect();
        runs.sort_by_key(|u| u.from);
        let mut spent = 0;
        let mut moves = Vec::new();
        for mut unit in runs {
            let Kind::Run { chunks } = unit.kind else { continue };
            let Layout::Run { align_chunks, .. } = g.layout(unit.size, unit.align) else { continue };
            let from = g.chunk_of(unit.from);
            if from == 0 || !model.is_empty(from - 1) || spent + unit.size > budget {
                continue;
            }
            let mut low = from - 1;
            while low > 0 && model.is_empty(low - 1) {
                low -= 1;
            }
            model.set_run(from, chunks, false);
            let fits = |d: usize| {
                (d..d + chunks).all(|c| model.is_empty(c)) && self.arena().run_bytes(d, chunks) == unit.extent
            };
            let to = (low.next_multiple_of(align_chunks)..from).step_by(align_chunks).find(|&d| fits(d));
            let to = to.unwrap_or(from);
            model.set_run(to, chunks, true);
            if to != from {
                unit.to = to * g.chunk_size;
                spent += unit.size;
                moves.push(unit);
            }
        }
        moves
    }

    /// An evacuation over `model`: the moves that empty the chosen chunks, and the chunks they
    /// empty. `chosen` lists chunks in the order to try.
    ///
    /// * `strict` (chunks the caller names): every chunk must be emptied into the other chunks
    ///   or fresh ones (`Err` names the first that cannot).
    /// * Otherwise (a compaction: chunks from the end of the arena down): blocks of the chunks,
    ///   in that order, move into the lowest holes *below their own chunk* while the moves add
    ///   up to at most `budget` bytes; a chunk may empty only partly (the next step goes on),
    ///   and chunks not yet evacuated may receive blocks. Every move lowers a block, so repeated
    ///   steps run out, and free space gathers at the end of the arena.
    pub(crate) fn plan_evacuation(
        &self,
        census: &Census,
        contents: &[Option<Contents>],
        model: &mut Model,
        chosen: &[usize],
        budget: Option<usize>,
        strict: bool,
    ) -> std::result::Result<(Vec<Unit>, Vec<usize>), String> {
        let g = &self.arena().geometry;
        let excluded: HashSet<usize> = if strict { chosen.iter().copied().collect() } else { HashSet::new() };
        // Free objects of each class in slabs outside the excluded chunks: (slab, offset).
        let classes = &self.arena().slabs.classes.classes;
        let mut slots: Vec<Vec<(SlabRef, usize)>> = vec![Vec::new(); classes.len()];
        for v in &census.slabs {
            if excluded.contains(&g.chunk_of(v.base)) {
                continue;
            }
            let class = &classes[v.class];
            let slab = SlabRef { id: v.id, class: v.class, owner: v.owner };
            for j in (0..class.objects).rev() {
                if v.free & (1 << j) != 0 {
                    slots[v.class].push((slab, v.base + class.offset_of(j)));
                }
            }
        }
        // Holes, lowest first. Named chunks (strict) go into the holes of busy core chunks, then
        // into fresh chunks. In a step, a block only goes to a chunk below its own, busy or
        // empty (blocks that fit no hole below the boundary pack just above it): every move
        // lowers a block, so steps run out (no block can go back and forth), and free space
        // gathers at the end of the arena.
        let busy = |c: usize| model.chunks[c].role == Role::Core && model.chunks[c].used > 0;
        let empty = |c: usize| model.is_empty(c);
        let mut holes: Vec<usize> =
            (0..model.chunks.len()).filter(|&c| !excluded.contains(&c) && (busy(c) || (!strict && empty(c)))).collect();
        if strict {
            holes.extend((0..model.chunks.len()).filter(|&c| !excluded.contains(&c) && empty(c)));
        }
        // Per size, the first hole worth trying (holes only fill up while planning, so a hole
        // too full for a size stays so).
        let mut dead = vec![false; model.chunks.len()];
        let mut cursors: HashMap<(u64, u64), usize> = HashMap::new();
        // Chunks that received blocks in this plan cannot be emptied by it.
        let mut received: HashSet<usize> = HashSet::new();
        let mut units = Vec::new();
        let mut emptied = Vec::new();
        let mut spent = 0usize;
        let mut failures = 0;
        for &chunk in chosen {
            if !strict && failures >= 32 {
                break; // 32 chunks in a row did not fit: the holes are full enough
            }
            let refuse = |why: String| if strict { Err(why) } else { Ok(()) };
            let Some(content) = contents.get(chunk).and_then(Option::as_ref) else {
                if model.chunks.get(chunk).is_none_or(|c| c.role != Role::Core || c.used > 0) {
                    refuse(format!("chunk {chunk} is not a core chunk whose blocks the compactor can move"))?;
                }
                continue;
            };
            if !content.movable {
                refuse(format!("chunk {chunk} holds pinned blocks or blocks without a handle"))?;
                continue;
            }
            if received.contains(&chunk) {
                continue;
            }
            // What may still move this step (strict: everything).
            let room = budget.map_or(usize::MAX, |limit| limit.saturating_sub(spent));
            if room == 0 {
                break;
            }
            let first_unit = units.len();
            let slots_before: Vec<usize> = slots.iter().map(Vec::len).collect();
            let mut taken_slots: Vec<Vec<(SlabRef, usize)>> = vec![Vec::new(); classes.len()];
            let mut placements: Vec<(usize, u64, u64)> = Vec::new();
            let mut bytes = 0usize;
            // Everything of the chunk found a place (else, in a step, what moved still helps:
            // the chunk is emptier for the next step).
            let mut all = true;
            // Slabs: the objects go into other slabs when they all fit, else the whole slab moves.
            let mut pieces: Vec<(Unit, u64, u64)> = Vec::new();
            for view in content.slabs.iter().map(|&i| &census.slabs[i]) {
                let items = census.items(view.id);
                let usable = |at: usize| if strict { g.chunk_of(at) != chunk } else { g.chunk_of(at) < chunk };
                let elsewhere = slots[view.class].iter().filter(|(_, at)| usable(*at)).count();
                let object_bytes: usize = items.iter().map(|i| i.info.size).sum();
                if elsewhere >= items.len() && bytes + object_bytes <= room {
                    // Slots that are no use here (this chunk's, or above it): set them aside.
                    let (here, others): (Vec<_>, Vec<_>) =
                        slots[view.class].drain(..).partition(|(_, at)| !usable(*at));
                    slots[view.class] = others;
                    for item in items {
                        let Some(mut unit) = self.block_unit(item) else { continue };
                        let slot = slots[view.class].pop().expect("counted");
                        taken_slots[view.class].push(slot);
                        unit.to = slot.1;
                        bytes += unit.copy_len();
                        units.push(unit);
                    }
                    slots[view.class].extend(here);
                } else {
                    pieces.push(self.slab_unit(census, view));
                }
            }
            for item in content.buddy.iter().map(|&i| &census.buddy[i]) {
                let Some(unit) = self.block_unit(item) else { continue };
                let Layout::Buddy(b) = g.layout(unit.size, unit.align) else { continue };
                let align = self.packed_alignment(b.units, unit.align);
                pieces.push((unit, b.units, align));
            }
            pieces.sort_by_key(|(u, n, _)| (std::cmp::Reverse(*n), u.from));
            for (mut unit, n, align) in pieces {
                if bytes + unit.copy_len() > room {
                    all = false;
                    continue; // over this step's budget: maybe a smaller one fits
                }
                let cursor = cursors.entry((n, align)).or_insert(0);
                let (mut i, mut skipped, mut found) = (*cursor, None, None);
                while i < holes.len() {
                    let c = holes[i];
                    if !strict && c >= chunk {
                        skipped.get_or_insert(i);
                        break;
                    }
                    if c == chunk {
                        skipped.get_or_insert(i);
                    } else if !dead[c] {
                        if let Some(p) = model.find(c, 0, n, align, u64::MAX) {
                            found = Some((c, p));
                            break;
                        }
                    }
                    i += 1;
                }
                *cursor = skipped.map_or(i, |k| k.min(i));
                let Some((c, p)) = found else {
                    all = false;
                    if strict {
                        break;
                    }
                    continue;
                };
                model.occupy(c, p, n, unit.core);
                placements.push((c, p, n));
                unit.to = g.offset_of(c, p);
                bytes += unit.copy_len();
                units.push(unit);
            }
            if strict && !all {
                for (c, p, n) in placements {
                    model.vacate(c, p, n);
                }
                units.truncate(first_unit);
                for (k, taken) in taken_slots.into_iter().enumerate() {
                    slots[k].extend(taken.into_iter().rev());
                    debug_assert_eq!(slots[k].len(), slots_before[k]);
                }
                return Err(format!("the blocks of chunk {chunk} do not fit in the holes of the other chunks"));
            }
            if units.len() == first_unit {
                failures += 1;
                continue;
            }
            failures = 0;
            for (c, _, _) in &placements {
                received.insert(*c);
            }
            for taken in &taken_slots {
                received.extend(taken.iter().map(|(_, at)| g.chunk_of(*at)));
            }
            spent += bytes;
            if all {
                emptied.push(chunk);
            }
            // A chunk being emptied is no longer a hole, nor are its slabs' free objects slots.
            dead[chunk] = true;
            for list in &mut slots {
                list.retain(|(_, at)| g.chunk_of(*at) != chunk);
            }
        }
        Ok((units, emptied))
    }
}

/// What one core chunk holds, for an evacuation: indices into the census.
pub(crate) struct Contents {
    /// Its buddy blocks (`census.buddy[i]`).
    pub(crate) buddy: Vec<usize>,
    /// Its slabs (`census.slabs[i]`).
    pub(crate) slabs: Vec<usize>,
    /// Bytes to move to empty it.
    pub(crate) bytes: usize,
    /// Everything in it can move (no pinned blocks, no blocks without handles).
    pub(crate) movable: bool,
    units: u64,
}

impl Pool {
    /// The contents of every core chunk (`None` for chunks without blocks or slabs).
    pub(crate) fn chunk_contents(&self, census: &Census) -> Vec<Option<Contents>> {
        let g = &self.arena().geometry;
        let mut out: Vec<Option<Contents>> = (0..g.chunks).map(|_| None).collect();
        fn entry(out: &mut [Option<Contents>], c: usize) -> &mut Contents {
            out[c].get_or_insert_with(|| Contents {
                buddy: Vec::new(),
                slabs: Vec::new(),
                bytes: 0,
                movable: true,
                units: 0,
            })
        }
        for (i, item) in census.buddy.iter().enumerate() {
            let e = entry(&mut out, g.chunk_of(item.info.offset));
            e.movable &= item.movable;
            e.bytes += item.info.size;
            e.units += self.arena().buddy_layout(item.info.size).map_or(0, |b| b.units);
            e.buddy.push(i);
        }
        for (i, view) in census.slabs.iter().enumerate() {
            let class = &self.arena().slabs.classes.classes[view.class];
            let e = entry(&mut out, g.chunk_of(view.base));
            e.movable &= slab_movable(census, view, class.objects);
            e.bytes += census.items(view.id).iter().map(|i| i.info.size).sum::<usize>();
            e.units += (view.bytes >> g.unit_shift) as u64;
            e.slabs.push(i);
        }
        // Blocks without a handle show as covered units nobody accounts for.
        for (c, e) in out.iter_mut().enumerate() {
            if let Some(e) = e {
                let covered = g.usable_units(c) - self.arena().space[c].free_units();
                if e.units != covered {
                    e.movable = false;
                }
            }
        }
        out
    }
}

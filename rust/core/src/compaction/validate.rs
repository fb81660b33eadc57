//! Checking, on a paused pool, a batch of moves that was planned while the pool ran.
//!
//! A staged compaction (`staged.rs`) takes its census and its model of the arena without
//! stopping the pool, so by the time the pool is paused some of its moves may be stale: the
//! block was freed, pinned or moved, or its destination was taken. Only the moves of the batch
//! are checked, not the whole pool, so the check costs what the batch moves:
//!
//! * **sources**: each block is still live with the same generation, at the same offset, in the
//!   same kind of home (a whole slab: the same slab at the same place with exactly the listed
//!   objects live); it is marked moving as it is checked, so no pin or free slips in;
//! * **destinations**: each is still free, counting as free what the batch's kept sources give
//!   back (a buddy place: the units of its chunk's tree; a run: chunks that are free or will
//!   be empty; a slab object: a free object of a slab of its class), and taken by no earlier
//!   destination of the batch (a census read while the pool ran can make a plan send two
//!   blocks to one place);
//!
//! A move that fails either check is dropped (its marks cleared). Its block then stays where
//! it is, which may take a place another move of the batch was to fill, so the destinations are
//! checked again until no move is dropped.
//!
//! The units of every core chunk a destination falls in are needed once per batch. Planning
//! kept them for those chunks ([`Planned`]), with the stamp of each chunk's free-space word read
//! before they were drawn; a chunk whose word still has that stamp under the pause had no
//! allocation, free or refresh since (`ChunkSpace::stamp`), so its units are the planned ones.
//! Only the trees of the other chunks are read: those that changed while the pool ran, or that
//! an earlier batch of the same compaction moved blocks into or out of. Sources are checked one
//! by one all the same: a block pinned since planning changes no word, but its move is dropped,
//! and the place it keeps is no longer free for another move.

use std::collections::{HashMap, HashSet};

use super::model::{all_clear, clear_range, covered_bits, set_range, Model};
use super::piece::{Home, Piece, PieceKind};
use crate::arena::front::FrontLayout;
use crate::arena::geometry::Geometry;
use crate::arena::global::ChunkState;
use crate::arena::layout::BuddyLayout;
use crate::arena::slab::caches::SlabView;
use crate::handle::id::Handle;
use crate::pool::pool::Pool;

/// The units of core chunks as planning saw them, each with the stamp of the chunk's
/// free-space word read before them: kept for the chunks the plan's destinations fall in.
#[derive(Debug, Default)]
pub(crate) struct Planned {
    chunks: HashMap<usize, (u64, Vec<u64>)>,
}

impl Planned {
    /// Every core chunk of `model` (drawn by [`Model::of_census`]) with its stamp.
    pub(crate) fn of(model: &Model) -> Planned {
        let chunks = (0..model.chunks.len())
            .filter_map(|c| {
                let stamp = model.stamps.get(c).copied().filter(|&s| s != 0)?;
                Some((c, (stamp, model.core_bits(c)?.to_vec())))
            })
            .collect();
        Planned { chunks }
    }

    /// Keep only the chunks of `keep`.
    pub(crate) fn retain(&mut self, keep: impl Fn(usize) -> bool) {
        self.chunks.retain(|&c, _| keep(c));
    }

    /// The pool gave back the buddy blocks `released` (base, bytes) between two batches (on a
    /// paused pool). A kept chunk whose word advanced by exactly their frees (one epoch step
    /// and their units each) and whose tree has each of them free had those frees and nothing
    /// else: its units lose them and its stamp follows. Any other chunk keeps its stamp, which
    /// no longer matches, so its tree is read.
    pub(crate) fn after_releases(&mut self, pool: &Pool, released: &[(usize, usize)]) {
        let a = pool.arena();
        let g = &a.geometry;
        let mut by_chunk: HashMap<usize, Vec<(u64, BuddyLayout)>> = HashMap::new();
        for &(base, bytes) in released {
            let chunk = g.chunk_of(base);
            match g.buddy_layout(bytes) {
                Some(b) if self.chunks.contains_key(&chunk) => {
                    by_chunk.entry(chunk).or_default().push((g.unit_in_chunk(base), b));
                }
                Some(_) => {}
                None => {
                    self.chunks.remove(&chunk);
                }
            }
        }
        for (chunk, blocks) in by_chunk {
            let Some((stamp, bits)) = self.chunks.get_mut(&chunk) else { continue };
            let units: u64 = blocks.iter().map(|(_, b)| b.units).sum();
            let expected = stamp.wrapping_add(((blocks.len() as u64) << 32) + units);
            let tree = a.tree(chunk);
            let all_free = blocks
                .iter()
                .all(|(within, b)| b.pieces_at(g.depth, *within).all(|node| !a.shape.is_allocated(tree, node)));
            if a.lines[chunk].space.stamp() == expected && all_free {
                for (within, b) in &blocks {
                    clear_range(bits, *within, (*within + b.units).min(g.usable_units(chunk)));
                }
                *stamp = expected;
            } else {
                self.chunks.remove(&chunk);
            }
        }
    }
}

/// Bits per chunk for the few chunks a batch's destinations fall in, found by chunk number.
#[derive(Clone)]
struct ChunkBits {
    /// Per chunk of the arena, its index in `bits` (`u32::MAX`: none).
    at: Vec<u32>,
    bits: Vec<Vec<u64>>,
}

impl ChunkBits {
    fn new(chunks: usize) -> ChunkBits {
        ChunkBits { at: vec![u32::MAX; chunks], bits: Vec::new() }
    }

    fn get(&self, chunk: usize) -> Option<&[u64]> {
        let i = *self.at.get(chunk)?;
        (i != u32::MAX).then(|| self.bits[i as usize].as_slice())
    }

    fn get_mut(&mut self, chunk: usize) -> Option<&mut Vec<u64>> {
        let i = *self.at.get(chunk)?;
        (i != u32::MAX).then(|| &mut self.bits[i as usize])
    }

    fn contains(&self, chunk: usize) -> bool {
        self.at.get(chunk).is_some_and(|&i| i != u32::MAX)
    }

    fn insert(&mut self, chunk: usize, bits: Vec<u64>) {
        self.at[chunk] = self.bits.len() as u32;
        self.bits.push(bits);
    }
}

impl Pool {
    /// The moves of `batch` that can still run (see the module documentation), every handle of
    /// them marked moving, and how many were dropped; `planned`: the units planning saw. Call
    /// while paused.
    pub(crate) fn revalidate(&self, batch: Vec<Piece>, planned: &Planned) -> (Vec<Piece>, usize) {
        let planned_moves = batch.len();
        let slabs_involved =
            batch.iter().any(|p| matches!(p.kind, PieceKind::Slab { .. } | PieceKind::SlabObject { .. }));
        let mut views = Views(Vec::new());
        if slabs_involved {
            for v in self.arena().slabs.views() {
                let i = v.id as usize;
                if views.0.len() <= i {
                    views.0.resize(i + 1, None);
                }
                views.0[i] = Some(v);
            }
        }
        let g = &self.arena().geometry;
        let mut kept: Vec<Piece> = batch.into_iter().filter(|p| self.claim_source(p, &views)).collect();
        let words = g.units_per_chunk().div_ceil(64) as usize;
        let mut taken = ChunkBits::new(g.chunks);
        loop {
            // The core chunks destinations fall in, as they are now: as planned where the word
            // kept its stamp, else as their trees have them.
            for p in &kept {
                let (first, n) = match p.kind {
                    PieceKind::SlabObject { .. } => continue,
                    // With a front: from its front's chunk to its tail's.
                    PieceKind::Run { .. } if p.front_at_destination(g).is_some() => {
                        let f = p.front_at_destination(g).expect("checked");
                        (f.chunk, f.tail_chunk() + usize::from(f.tail_units > 0) - f.chunk)
                    }
                    // A run with a tail: also the chunk after it, which holds the tail.
                    PieceKind::Run { chunks } => (g.chunk_of(p.to), chunks + usize::from(g.tail_bytes(p.size) > 0)),
                    _ => (g.chunk_of(p.to), 1),
                };
                for c in first..(first + n).min(g.chunks) {
                    if taken.contains(c) || !matches!(self.arena().global.state(c), ChunkState::Core(_)) {
                        continue;
                    }
                    let bits = match planned.chunks.get(&c) {
                        Some((stamp, bits)) if *stamp == self.arena().lines[c].space.stamp() => bits.clone(),
                        _ => {
                            let mut bits = vec![0u64; words];
                            covered_bits(self, c, &mut bits);
                            bits
                        }
                    };
                    taken.insert(c, bits);
                }
            }
            let room = self.room_after_sources(&kept, &taken);
            let before = kept.len();
            let mut claims = Claims::new(g.chunks);
            kept.retain(|p| {
                let free = self.destination_free(p, &room, &views) && claims.take(p, g);
                if !free {
                    p.each_handle().for_each(|h| self.handles().end_move(h));
                }
                free
            });
            if kept.len() == before {
                break;
            }
        }
        let dropped = planned_moves - kept.len();
        (kept, dropped)
    }

    /// Mark the blocks of `p` moving if they are still where the plan found them; otherwise
    /// leave nothing marked and say no. (A block with the same generation at the same offset is
    /// the block the plan saw, so its home is too; a slab object's slab is checked, since a
    /// slab may be given back and another made at its place.)
    fn claim_source(&self, p: &Piece, views: &Views) -> bool {
        match &p.kind {
            PieceKind::Slab { id, objects } => {
                let Some(view) = views.get(*id) else { return false };
                let class = &self.arena().slabs.classes.classes[view.class];
                let live = class.objects - (view.free & class.objects_mask()).count_ones();
                if view.base != p.from || view.bytes != p.extent || live as usize != objects.len() {
                    return false;
                }
                let handles: Vec<Handle> = objects.iter().map(|&(h, _)| h).collect();
                self.handles().begin_moves(&handles, |k, offset| offset == objects[k].1 && offset - p.from < p.extent)
            }
            PieceKind::SlabObject { from_slab, .. } => {
                let Some(h) = p.handle else { return false };
                self.handles().begin_moves(&[h], |_, offset| {
                    offset == p.from && self.home_of(offset, p.size) == Home::Object(*from_slab)
                })
            }
            PieceKind::Buddy | PieceKind::Run { .. } => {
                let Some(h) = p.handle else { return false };
                self.handles().begin_moves(&[h], |_, offset| offset == p.from)
            }
        }
    }

    /// The destination chunks' units once the sources of `kept` are given back, and the chunks
    /// of kept runs (free once they leave).
    fn room_after_sources(&self, kept: &[Piece], taken: &ChunkBits) -> Room {
        let g = &self.arena().geometry;
        let mut room = Room { bits: taken.clone(), run_chunks: Vec::new() };
        for p in kept {
            let chunk = g.chunk_of(p.from);
            if let (Some(f), PieceKind::Buddy | PieceKind::Run { .. }) = (FrontLayout::of(g, p.from, p.size), &p.kind) {
                // A block with a front leaves its front, whole chunks and tail.
                if let Some(bits) = room.bits.get_mut(f.chunk) {
                    clear_range(bits, f.start, g.units_per_chunk());
                }
                room.run_chunks.extend(f.first_whole()..f.first_whole() + f.chunks);
                if let Some(bits) = room.bits.get_mut(f.tail_chunk()).filter(|_| f.tail_units > 0) {
                    clear_range(bits, 0, f.tail_units);
                }
                continue;
            }
            match p.kind {
                PieceKind::Buddy | PieceKind::Slab { .. } => {
                    if let Some(bits) = room.bits.get_mut(chunk) {
                        let start = g.unit_in_chunk(p.from);
                        clear_range(bits, start, start + (p.extent / g.min_block) as u64);
                    }
                }
                PieceKind::Run { chunks } => {
                    room.run_chunks.extend(chunk..chunk + chunks);
                    if let Some(bits) = room.bits.get_mut(chunk + chunks) {
                        clear_range(bits, 0, (g.tail_bytes(p.size) / g.min_block) as u64);
                    }
                }
                PieceKind::SlabObject { .. } => {}
            }
        }
        room.run_chunks.sort_unstable();
        room
    }

    /// Whether `p`'s destination is free in `room`.
    fn destination_free(&self, p: &Piece, room: &Room, views: &Views) -> bool {
        let g = &self.arena().geometry;
        let chunk = g.chunk_of(p.to);
        let leaving = |c: usize| room.run_chunks.binary_search(&c).is_ok();
        match p.kind {
            PieceKind::SlabObject { class, .. } => {
                let slabs = &self.arena().slabs;
                match slabs.lookup(p.to) {
                    Some(s) if s.class == class => match (slabs.object_at(s, p.to), views.get(s.id)) {
                        (Some(j), Some(view)) => {
                            view.base + slabs.classes.classes[class].offset_of(j) == p.to
                                && view.free & (1u64 << j) != 0
                        }
                        _ => false,
                    },
                    _ => false,
                }
            }
            PieceKind::Buddy | PieceKind::Slab { .. } => {
                if chunk >= g.chunks {
                    return false;
                }
                match self.arena().global.state(chunk) {
                    ChunkState::Free => true,
                    ChunkState::Core(_) => room.bits.get(chunk).is_some_and(|bits| {
                        let start = g.unit_in_chunk(p.to);
                        all_clear(bits, start, start + (p.extent / g.min_block) as u64)
                    }),
                    _ => leaving(chunk),
                }
            }
            PieceKind::Run { chunks } => {
                // Its whole chunks free, and the start of the chunk after them for a tail (and,
                // for a block with a front, the end of the chunk before them).
                let free_from_start = |c: usize, units: u64| {
                    c < g.chunks
                        && (match self.arena().global.state(c) {
                            ChunkState::Free => true,
                            ChunkState::Core(_) => room.bits.get(c).is_some_and(|bits| all_clear(bits, 0, units)),
                            _ => leaving(c),
                        })
                };
                if let Some(f) = p.front_at_destination(g) {
                    let front_free = match self.arena().global.state(f.chunk) {
                        ChunkState::Free => true,
                        ChunkState::Core(_) => {
                            room.bits.get(f.chunk).is_some_and(|bits| all_clear(bits, f.start, g.units_per_chunk()))
                        }
                        _ => leaving(f.chunk),
                    };
                    let first = f.first_whole();
                    return front_free
                        && (first..first + f.chunks).all(|c| free_from_start(c, g.usable_units(c)))
                        && (f.tail_units == 0 || free_from_start(f.tail_chunk(), f.tail_units));
                }
                let tail = (g.tail_bytes(p.size) / g.min_block) as u64;
                (chunk..chunk + chunks).all(|c| free_from_start(c, g.usable_units(c)))
                    && (tail == 0 || free_from_start(chunk + chunks, tail))
            }
        }
    }
}

/// What the destinations kept so far in a pass take. A plan made on a census read while the
/// pool ran can give two moves overlapping destinations (the census saw a block that was freed
/// and another one placed there since): each is free on the pool, but only the first may run.
struct Claims {
    /// Per chunk, the units destinations take (whole chunks included).
    units: ChunkBits,
    /// Slab objects destinations take, by offset.
    objects: HashSet<usize>,
}

impl Claims {
    fn new(chunks: usize) -> Claims {
        Claims { units: ChunkBits::new(chunks), objects: HashSet::new() }
    }

    /// Take `p`'s destination; `false` (and nothing taken) when it overlaps one taken before.
    fn take(&mut self, p: &Piece, g: &Geometry) -> bool {
        let upc = g.units_per_chunk();
        let mut ranges: Vec<(usize, u64, u64)> = Vec::new();
        match p.kind {
            PieceKind::SlabObject { .. } => return self.objects.insert(p.to),
            PieceKind::Buddy | PieceKind::Slab { .. } => {
                let start = g.unit_in_chunk(p.to);
                ranges.push((g.chunk_of(p.to), start, start + (p.extent / g.min_block) as u64));
            }
            PieceKind::Run { chunks } => match p.front_at_destination(g) {
                Some(f) => {
                    ranges.push((f.chunk, f.start, upc));
                    ranges.extend((f.first_whole()..f.first_whole() + f.chunks).map(|c| (c, 0, upc)));
                    ranges.push((f.tail_chunk(), 0, f.tail_units));
                }
                None => {
                    let first = g.chunk_of(p.to);
                    ranges.extend((first..first + chunks).map(|c| (c, 0, upc)));
                    ranges.push((first + chunks, 0, (g.tail_bytes(p.size) / g.min_block) as u64));
                }
            },
        }
        ranges.retain(|&(c, start, end)| start < end && c < g.chunks);
        let words = upc.div_ceil(64) as usize;
        for &(c, start, end) in &ranges {
            if !self.units.contains(c) {
                self.units.insert(c, vec![0u64; words]);
            }
            if !all_clear(self.units.get(c).unwrap_or(&[]), start, end.min(upc)) {
                return false;
            }
        }
        for &(c, start, end) in &ranges {
            if let Some(bits) = self.units.get_mut(c) {
                set_range(bits, start, end.min(upc), true);
            }
        }
        true
    }
}

/// The live slabs by id (ids are dense), as they are on the paused pool.
struct Views(Vec<Option<SlabView>>);

impl Views {
    fn get(&self, id: u32) -> Option<&SlabView> {
        self.0.get(id as usize).and_then(Option::as_ref)
    }
}

/// Free room for a batch's destinations.
struct Room {
    /// Per core chunk that a destination falls in: its taken units, less the batch's sources.
    bits: ChunkBits,
    /// Chunks of runs the batch moves away (sorted).
    run_chunks: Vec<usize>,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::config::PoolConfig;

    const MIB: usize = 1 << 20;
    const SIZE: usize = 200_000;

    /// A pool with blocks `x`, `y`, `z` in one chunk, and that chunk kept as planning saw it.
    fn setup() -> (Pool, [Handle; 3], usize, Planned) {
        let p = Pool::new(PoolConfig::new(64 * MIB).cores(1)).unwrap();
        let hs = [0; 3].map(|_| p.alloc(SIZE, None, 0).unwrap());
        let chunk = p.arena().geometry.chunk_of(p.block(hs[0]).unwrap().offset);
        assert!(hs.iter().all(|&h| p.arena().geometry.chunk_of(p.block(h).unwrap().offset) == chunk));
        let stamp = p.arena().lines[chunk].space.stamp();
        let mut bits = vec![0u64; p.arena().geometry.units_per_chunk().div_ceil(64) as usize];
        covered_bits(&p, chunk, &mut bits);
        let planned = Planned { chunks: HashMap::from([(chunk, (stamp, bits))]) };
        (p, hs, chunk, planned)
    }

    fn tree_of(p: &Pool, chunk: usize) -> Vec<u64> {
        let mut bits = vec![0u64; p.arena().geometry.units_per_chunk().div_ceil(64) as usize];
        covered_bits(p, chunk, &mut bits);
        bits
    }

    #[test]
    fn the_releases_planned_between_batches_keep_a_chunk_known() {
        let (p, [x, _, _], chunk, mut planned) = setup();
        let at = p.block(x).unwrap().offset;
        p.free(x).unwrap();
        p.arena().drain_block_caches(); // the release as the tree sees it
        planned.after_releases(&p, &[(at, SIZE)]);
        let (stamp, bits) = planned.chunks.get(&chunk).expect("still known");
        assert_eq!(*stamp, p.arena().lines[chunk].space.stamp());
        assert_eq!(*bits, tree_of(&p, chunk));
    }

    #[test]
    fn another_release_in_place_of_a_planned_one_makes_the_chunk_unknown() {
        let (p, [x, y, _], chunk, mut planned) = setup();
        let at = p.block(x).unwrap().offset;
        p.free(y).unwrap(); // the same units, the same epoch step, another place
        p.arena().drain_block_caches();
        planned.after_releases(&p, &[(at, SIZE)]);
        assert!(!planned.chunks.contains_key(&chunk));
    }

    #[test]
    fn a_release_beyond_the_planned_ones_makes_the_chunk_unknown() {
        let (p, [x, _, z], chunk, mut planned) = setup();
        let at = p.block(x).unwrap().offset;
        p.free(x).unwrap();
        p.free(z).unwrap();
        p.arena().drain_block_caches();
        planned.after_releases(&p, &[(at, SIZE)]);
        assert!(!planned.chunks.contains_key(&chunk));
    }
}

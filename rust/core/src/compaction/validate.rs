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
//!   be empty; a slab object: a free object of a slab of its class).
//!
//! A move that fails either check is dropped (its marks cleared). Its block then stays where
//! it is, which may take a place another move of the batch was to fill, so the destinations are
//! checked again until no move is dropped.
//!
//! A chunk that nobody touched since the plan was made needs no reading at all: each chunk's
//! free-space word changes with every allocation and free in it, so a chunk whose word and
//! state are what they were before the census was taken ([`Snapshot`]) is as the plan saw it,
//! and the plan's destinations in it are free (unless a dropped move's block stays in it). Only
//! the other destination chunks have their trees read. A chunk where a dropped move's block
//! stays is forgotten by the snapshot ([`Snapshot::forget`]), so the later batches of the same
//! compaction, planned as if that block had gone, read its tree too: a dropped move changes its
//! chunk without changing the chunk's word (a pinned block, a block whose destination was taken).

use std::collections::HashMap;

use super::model::{all_clear, clear_range, covered_bits};
use super::piece::{Home, Piece, PieceKind};
use crate::arena::global::ChunkState;
use crate::arena::slab::caches::SlabView;
use crate::handle::id::Handle;
use crate::pool::pool::Pool;

/// Each chunk's free-space word and state, read before a staged compaction's census (`None`:
/// a chunk forgotten since, whose tree is read whenever a destination falls in it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot(Vec<Option<(u64, ChunkState)>>);

impl Snapshot {
    /// The pool's chunks now.
    pub(crate) fn of(pool: &Pool) -> Snapshot {
        let a = pool.arena();
        Snapshot((0..a.geometry.chunks).map(|c| Some((a.space[c].word(), a.global.state(c)))).collect())
    }

    /// Whether `chunk` is what it was when the snapshot was taken (no allocation or free in it
    /// since, same state).
    fn unchanged(&self, pool: &Pool, chunk: usize) -> bool {
        let a = pool.arena();
        self.0
            .get(chunk)
            .copied()
            .flatten()
            .is_some_and(|(word, state)| a.space[chunk].word() == word && a.global.state(chunk) == state)
    }

    /// Count `chunk` as changed from now on: the plan's view of it no longer holds, though its
    /// word may not show it.
    fn forget(&mut self, chunk: usize) {
        if let Some(entry) = self.0.get_mut(chunk) {
            *entry = None;
        }
    }
}

impl Pool {
    /// The moves of `batch` that can still run (see the module documentation), every handle of
    /// them marked moving, and how many were dropped. `snapshot`: the chunks as they were before
    /// the plan's census (`None`: every destination chunk is read); the chunks where dropped moves'
    /// blocks stay are forgotten by it. Call while paused.
    pub(crate) fn revalidate(&self, batch: Vec<Piece>, mut snapshot: Option<&mut Snapshot>) -> (Vec<Piece>, usize) {
        let planned = batch.len();
        let slabs_involved =
            batch.iter().any(|p| matches!(p.kind, PieceKind::Slab { .. } | PieceKind::SlabObject { .. }));
        let views: HashMap<u32, SlabView> = if slabs_involved {
            self.arena().slabs.views().into_iter().map(|v| (v.id, v)).collect()
        } else {
            HashMap::new()
        };
        let g = &self.arena().geometry;
        let mut dirty: Vec<bool> =
            (0..g.chunks).map(|c| snapshot.as_ref().is_none_or(|snap| !snap.unchanged(self, c))).collect();
        let (mut kept, stale): (Vec<Piece>, Vec<Piece>) = batch.into_iter().partition(|p| self.claim_source(p, &views));
        // The block of a dropped move stays: the plan's view of its chunk no longer holds, for
        // this batch and the later ones.
        let mut mark_dirty = |dropped: &[Piece], dirty: &mut Vec<bool>| {
            for p in dropped {
                let (first, n) = match p.kind {
                    PieceKind::Run { chunks } => (g.chunk_of(p.from), chunks),
                    _ => (g.chunk_of(p.from), 1),
                };
                for c in first..(first + n).min(g.chunks) {
                    dirty[c] = true;
                    if let Some(snap) = snapshot.as_deref_mut() {
                        snap.forget(c);
                    }
                }
            }
        };
        mark_dirty(&stale, &mut dirty);
        let words = g.units_per_chunk().div_ceil(64) as usize;
        let mut trees: HashMap<usize, Vec<u64>> = HashMap::new();
        loop {
            // The dirty core chunks destinations fall in, as their trees have them now.
            for p in &kept {
                let (first, n) = match p.kind {
                    PieceKind::SlabObject { .. } => continue,
                    PieceKind::Run { chunks } => (g.chunk_of(p.to), chunks),
                    _ => (g.chunk_of(p.to), 1),
                };
                for c in (first..(first + n).min(g.chunks)).filter(|&c| dirty[c]) {
                    if matches!(self.arena().global.state(c), ChunkState::Core(_)) {
                        trees.entry(c).or_insert_with(|| {
                            let mut bits = vec![0u64; words];
                            covered_bits(self, c, &mut bits);
                            bits
                        });
                    }
                }
            }
            let room = self.room_after_sources(&kept, &trees);
            let (fit, stale): (Vec<Piece>, Vec<Piece>) =
                kept.into_iter().partition(|p| self.destination_free(p, &room, &views, &dirty));
            kept = fit;
            if stale.is_empty() {
                break;
            }
            for p in &stale {
                p.handles().into_iter().for_each(|h| self.handles().end_move(h));
            }
            mark_dirty(&stale, &mut dirty);
        }
        let dropped = planned - kept.len();
        (kept, dropped)
    }

    /// Mark the blocks of `p` moving if they are still where the plan found them; otherwise
    /// leave nothing marked and say no. (A block with the same generation at the same offset is
    /// the block the plan saw, so its home is too; a slab object's slab is checked, since a
    /// slab may be given back and another made at its place.)
    fn claim_source(&self, p: &Piece, views: &HashMap<u32, SlabView>) -> bool {
        match &p.kind {
            PieceKind::Slab { id, objects } => {
                let Some(view) = views.get(id) else { return false };
                let class = &self.arena().slabs.classes.classes[view.class];
                let live = class.objects - (view.free & class.all_free()).count_ones();
                if view.base != p.from || view.bytes != p.extent || live as usize != objects.len() {
                    return false;
                }
                let handles: Vec<Handle> = objects.iter().map(|&(h, _)| h).collect();
                self.handles().begin_moves(&handles, |k, offset| offset == objects[k].1 && offset - p.from < p.extent)
            }
            PieceKind::SlabObject { from_slab, .. } => {
                let Some(h) = p.handle else { return false };
                self.handles()
                    .begin_moves(&[h], |_, offset| offset == p.from && self.home_of(offset) == Home::Object(*from_slab))
            }
            PieceKind::Buddy | PieceKind::Run { .. } => {
                let Some(h) = p.handle else { return false };
                self.handles().begin_moves(&[h], |_, offset| offset == p.from)
            }
        }
    }

    /// The destination chunks' units once the sources of `kept` are given back, and the chunks
    /// of kept runs (free once they leave).
    fn room_after_sources(&self, kept: &[Piece], trees: &HashMap<usize, Vec<u64>>) -> Room {
        let g = &self.arena().geometry;
        let mut room = Room { bits: trees.clone(), run_chunks: Vec::new() };
        for p in kept {
            let chunk = g.chunk_of(p.from);
            match p.kind {
                PieceKind::Buddy | PieceKind::Slab { .. } => {
                    if let Some(bits) = room.bits.get_mut(&chunk) {
                        let start = g.unit_in_chunk(p.from);
                        clear_range(bits, start, start + (p.extent / g.min_block) as u64);
                    }
                }
                PieceKind::Run { chunks } => room.run_chunks.extend(chunk..chunk + chunks),
                PieceKind::SlabObject { .. } => {}
            }
        }
        room.run_chunks.sort_unstable();
        room
    }

    /// Whether `p`'s destination is free in `room`; a destination in a chunk not `dirty` is
    /// free as planned.
    fn destination_free(&self, p: &Piece, room: &Room, views: &HashMap<u32, SlabView>, dirty: &[bool]) -> bool {
        let g = &self.arena().geometry;
        let chunk = g.chunk_of(p.to);
        let leaving = |c: usize| room.run_chunks.binary_search(&c).is_ok();
        match p.kind {
            PieceKind::SlabObject { class, .. } => {
                let slabs = &self.arena().slabs;
                match slabs.lookup(p.to) {
                    Some(s) if s.class == class => match (slabs.object_at(s, p.to), views.get(&s.id)) {
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
                if !dirty[chunk] {
                    return true;
                }
                match self.arena().global.state(chunk) {
                    ChunkState::Free => true,
                    ChunkState::Core(_) => room.bits.get(&chunk).is_some_and(|bits| {
                        let start = g.unit_in_chunk(p.to);
                        all_clear(bits, start, start + (p.extent / g.min_block) as u64)
                    }),
                    _ => leaving(chunk),
                }
            }
            PieceKind::Run { chunks } => (chunk..chunk + chunks).all(|c| {
                c < g.chunks
                    && (!dirty[c]
                        || match self.arena().global.state(c) {
                            ChunkState::Free => true,
                            ChunkState::Core(_) => {
                                room.bits.get(&c).is_some_and(|bits| all_clear(bits, 0, g.usable_units(c)))
                            }
                            _ => leaving(c),
                        })
            }),
        }
    }
}

/// Free room for a batch's destinations.
struct Room {
    /// Per core chunk that a destination falls in: its taken units, less the batch's sources.
    bits: HashMap<usize, Vec<u64>>,
    /// Chunks of runs the batch moves away (sorted).
    run_chunks: Vec<usize>,
}

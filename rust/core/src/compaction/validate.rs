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
//! Every core chunk a destination falls in has its tree read (once per batch): the chunk's
//! free-space word and the census taken while the pool ran do not tell, between them, where
//! the chunk's blocks are once the pool is paused (a block pinned since keeps its move from
//! running without any change to the word).

use std::collections::HashMap;

use super::model::{all_clear, clear_range, covered_bits};
use super::piece::{Home, Piece, PieceKind};
use crate::arena::global::ChunkState;
use crate::arena::slab::caches::SlabView;
use crate::handle::id::Handle;
use crate::pool::pool::Pool;

impl Pool {
    /// The moves of `batch` that can still run (see the module documentation), every handle of
    /// them marked moving, and how many were dropped. Call while paused.
    pub(crate) fn revalidate(&self, batch: Vec<Piece>) -> (Vec<Piece>, usize) {
        let planned = batch.len();
        let slabs_involved =
            batch.iter().any(|p| matches!(p.kind, PieceKind::Slab { .. } | PieceKind::SlabObject { .. }));
        let views: HashMap<u32, SlabView> = if slabs_involved {
            self.arena().slabs.views().into_iter().map(|v| (v.id, v)).collect()
        } else {
            HashMap::new()
        };
        let g = &self.arena().geometry;
        let mut kept: Vec<Piece> = batch.into_iter().filter(|p| self.claim_source(p, &views)).collect();
        let words = g.units_per_chunk().div_ceil(64) as usize;
        let mut trees: HashMap<usize, Vec<u64>> = HashMap::new();
        loop {
            // The core chunks destinations fall in, as their trees have them now.
            for p in &kept {
                let (first, n) = match p.kind {
                    PieceKind::SlabObject { .. } => continue,
                    // A run with a tail: also the chunk after it, which holds the tail.
                    PieceKind::Run { chunks } => (g.chunk_of(p.to), chunks + usize::from(g.tail_bytes(p.size) > 0)),
                    _ => (g.chunk_of(p.to), 1),
                };
                for c in first..(first + n).min(g.chunks) {
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
                kept.into_iter().partition(|p| self.destination_free(p, &room, &views));
            kept = fit;
            if stale.is_empty() {
                break;
            }
            for p in &stale {
                p.handles().into_iter().for_each(|h| self.handles().end_move(h));
            }
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
                PieceKind::Run { chunks } => {
                    room.run_chunks.extend(chunk..chunk + chunks);
                    if let Some(bits) = room.bits.get_mut(&(chunk + chunks)) {
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
    fn destination_free(&self, p: &Piece, room: &Room, views: &HashMap<u32, SlabView>) -> bool {
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
                match self.arena().global.state(chunk) {
                    ChunkState::Free => true,
                    ChunkState::Core(_) => room.bits.get(&chunk).is_some_and(|bits| {
                        let start = g.unit_in_chunk(p.to);
                        all_clear(bits, start, start + (p.extent / g.min_block) as u64)
                    }),
                    _ => leaving(chunk),
                }
            }
            PieceKind::Run { chunks } => {
                // Its whole chunks free, and the start of the chunk after them for a tail.
                let free_from_start = |c: usize, units: u64| {
                    c < g.chunks
                        && (match self.arena().global.state(c) {
                            ChunkState::Free => true,
                            ChunkState::Core(_) => room.bits.get(&c).is_some_and(|bits| all_clear(bits, 0, units)),
                            _ => leaving(c),
                        })
                };
                let tail = (g.tail_bytes(p.size) / g.min_block) as u64;
                (chunk..chunk + chunks).all(|c| free_from_start(c, g.usable_units(c)))
                    && (tail == 0 || free_from_start(chunk + chunks, tail))
            }
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

//! The full compaction's planners.
//!
//! * **Packing below a boundary**: every block above a boundary chunk moves into the holes at
//!   or below it, largest first, packed (not at the start of its enclosing buddy node, so
//!   trimmed tails fill too); the boundary is as low as the free units allow. Only the blocks
//!   above it move (in a pool half full of scattered holes, about half of them).
//! * **Repack / slide** (when the packing leaves much more behind than any packing would):
//!   every block re-placed largest first (host memory), or slid down in address order (a
//!   device).
//!
//! [`plan_full`] plans both and picks one.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::super::census::Census;
use super::super::model::Model;
use super::super::piece::{Piece, PieceKind};
use super::movable::{
    bank_slack, block_piece, boundary, front_fits, has_front, movable_bytes, movable_pieces, movable_runs,
    move_run_down, packed_alignment, run_alignment, run_fits, set_run_piece, set_source, slab_piece, slab_worth_moving,
    Shaped,
};
use crate::arena::front::FrontLayout;
use crate::arena::layout::Layout;

/// How many bytes more than the packing below a boundary a full compaction's repack may move
/// when it packs tighter: 32 MiB, about 3 ms of copying on the machines measured.
pub(crate) const REPACK_ALLOWANCE: usize = 32 << 20;

/// The moves of a full compaction (after any slab consolidation): packing below a boundary
/// (about half the blocks move). It leaves holes below the boundary that no block above it
/// fits, which a repack (every block re-placed; `downward`, a slide) would fill, at the price
/// of moving nearly every block. The repack is planned too, and taken when it makes the
/// largest free block larger, if
///
/// * it moves at most [`REPACK_ALLOWANCE`] bytes more than the packing (a few milliseconds of
///   copying: small pools always get the tightest packing), or
/// * the packing leaves more than a sixteenth of the free bytes beyond what any packing leaves
///   (the bank rule's slack and one partly filled chunk) and the repack gains more than that
///   sixteenth (on 100k blocks it pauses 2.9x a memmove of the live bytes, the packing 1.7x).
///
/// Returns the moves and the model after them (and after the all-free slabs go back).
pub(crate) fn plan_full<'a>(census: &Census, model: Model<'a>, downward: bool) -> (Vec<Piece>, Model<'a>) {
    let mut packed = model.clone();
    let few = plan_pack(census, &mut packed);
    let after = reclaimed(census, &packed, downward);
    let (largest, free) = (after.largest_free(), after.free_bytes());
    let outside = free.saturating_sub(largest);
    let slack = bank_slack(census, &packed);
    let moved: usize = few.iter().map(Piece::copy_len).sum();
    let cheap = movable_bytes(census, &packed).saturating_sub(moved) <= REPACK_ALLOWANCE;
    let gain = if cheap { 1 } else { free / 16 + 1 };
    if outside <= slack + if cheap { 0 } else { model.geometry.chunk_size + free / 16 } {
        return (few, after); // nothing a repack could gain, or not enough for its cost
    }
    let mut tight = model;
    match plan_repack(census, &mut tight, downward) {
        Some(all) => match reclaimed(census, &tight, downward) {
            tighter if tighter.largest_free() >= largest + gain => (all, tighter),
            _ => (few, after),
        },
        None => (few, after),
    }
}

/// `model` once the pool gives back the all-free slabs of `census` after the batch (they stay
/// where they are during it, but their room is free space afterwards, like any hole the moves
/// leave): the free space a plan leaves is measured on it. Only where the caller copies
/// (`single_batch`: no slab consolidation ran first, whose batch already gave them back).
fn reclaimed<'a>(census: &Census, model: &Model<'a>, single_batch: bool) -> Model<'a> {
    let g = model.geometry;
    let mut after = model.clone();
    if !single_batch {
        return after;
    }
    for view in &census.slabs {
        let all_free = model.classes[view.class].objects_mask();
        if view.free & all_free == all_free {
            after.vacate(g.chunk_of(view.base), g.unit_in_chunk(view.base), (view.bytes >> g.unit_shift) as u64);
        }
    }
    after
}

/// Every movable run, buddy block and whole slab re-placed, over `model` (changed to the arena
/// after the moves): the moves of those that go elsewhere.
///
/// * **Slide** (`downward`): every block, slab and run, in address order, goes to the lowest
///   place at or below its own that fits, counting the places the blocks before it left.
///   Every destination starts at or below its source, so copying in ascending source order is
///   safe: a destination `[d, d + n)` with `d <= s` can only overlap sources that start below
///   `s` (they are disjoint from `[s, s + n)`), which are copied first; the executor finds
///   exactly that order. No cycle can arise: a mover on a device can do it.
/// * **Repack** (otherwise): every movable block leaves first; runs come back in address order
///   to the lowest free stretch of chunks, then buddy blocks and slabs largest first (first fit
///   decreasing: small blocks fill the tails trimmed blocks leave in their buddy nodes,
///   wherever those are). The tightest packing; the executor orders the copies and breaks
///   cycles through a bounce buffer (host memory only). `None` if some block finds no place
///   (then the caller keeps the packing below a boundary).
pub(crate) fn plan_repack(census: &Census, model: &mut Model, downward: bool) -> Option<Vec<Piece>> {
    let g = model.geometry;
    let mut candidates: Vec<Shaped> = Vec::new();
    for item in census.buddy.iter().chain(census.runs.iter()).filter(|i| i.movable) {
        let Some(piece) = block_piece(census, model, item) else { continue };
        match piece.kind {
            PieceKind::Buddy => {
                let Layout::Buddy(b) = g.layout(piece.size, piece.align) else { continue };
                let align = packed_alignment(model, b.units, piece.align);
                candidates.push((piece, b.units, align));
            }
            PieceKind::Run { .. } => candidates.push((piece, 0, 0)),
            _ => {}
        }
    }
    for view in &census.slabs {
        if slab_worth_moving(census, view, model.classes[view.class].objects) {
            candidates.push(slab_piece(census, model, view));
        }
    }
    if downward {
        candidates.sort_by_key(|(p, _, _)| p.from);
    } else {
        // Runs first (by address), then the rest largest first (by address within a size).
        candidates.sort_by_key(|(p, units, align)| (*units != 0, Reverse(*units), Reverse(*align), p.from));
        for (p, units, _) in &candidates {
            set_source(model, p, *units, false);
        }
    }
    let mut cursors: HashMap<(u64, u64), (usize, u64)> = HashMap::new();
    let mut moves = Vec::new();
    for (mut piece, units, align) in candidates {
        let from_chunk = g.chunk_of(piece.from);
        if let PieceKind::Run { chunks } = piece.kind {
            if downward {
                set_source(model, &piece, 0, false);
            }
            if has_front(model, &piece) {
                // A block with a front goes to the lowest place with a front (below its own in
                // a slide, else it stays), where it holds as many bytes (`arena/front.rs`).
                let below = |f: &FrontLayout| !downward || f.offset(g) < piece.from;
                let stay = FrontLayout::of(g, piece.from, piece.size)?;
                let f =
                    (0..model.chunks.len()).find_map(|c| front_fits(model, &piece, c).filter(below)).unwrap_or(stay);
                model.set_fronted(&f, true, piece.core);
                piece.to = f.offset(g);
                if piece.to != piece.from {
                    moves.push(piece);
                }
                continue;
            }
            let Some(align_chunks) = run_alignment(model, &piece) else { continue };
            let last = if downward { from_chunk } else { model.chunks.len() - chunks };
            let to = (0..=last).step_by(align_chunks).find(|&d| run_fits(model, &piece, chunks, d))?;
            set_run_piece(model, &piece, chunks, to, true);
            piece.to = to * g.chunk_size;
        } else {
            let pos = g.unit_in_chunk(piece.from);
            if downward {
                set_source(model, &piece, units, false);
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
            model.occupy(c, p, units, piece.core);
            piece.to = g.offset_of(c, p);
        }
        if piece.to != piece.from {
            moves.push(piece);
        }
    }
    Some(moves)
}

/// Packing below a boundary: the arena is cut at a *boundary chunk*, the lowest for which the
/// free units at or below it cover the movable units above it. Every movable block and slab
/// above it moves into the holes at or below it, largest first, each into the shortest hole
/// that holds it (packed: see [`packed_alignment`]), so the holes below fill up. What finds no
/// hole there (a slab needs a hole of its own alignment; the bank rule leaves gaps no large
/// block can use) is packed the same way, lowest place first, into the room just above the
/// boundary. Blocks at or below the boundary stay: in a pool half full of scattered holes
/// about half the blocks move (a repack moves nearly all). Chunk runs go first (each into the
/// lowest stretch of empty chunks below it) and, if they found none, again at the end, into
/// the room the packing made.
///
/// No cycle can arise, so a mover on a device can do it: a destination at or below the
/// boundary was free before the batch; one above it overlaps at most sources of blocks that
/// went below the boundary (copied out first).
pub(crate) fn plan_pack(census: &Census, model: &mut Model) -> Vec<Piece> {
    let mut moves = Vec::new();
    let mut stuck = Vec::new();
    for run in movable_runs(census, model) {
        match move_run_down(model, &run) {
            Some(piece) => moves.push(piece),
            None => stuck.push(run),
        }
    }
    let n = model.chunks.len();
    let pieces = movable_pieces(census, model);
    // What `movable_units` counts, from the pieces at hand.
    let units: Vec<u64> =
        pieces.iter().map(|chunk| chunk.iter().map(|(_, n, align)| n.next_multiple_of(*align)).sum()).collect();
    let boundary = boundary(model, &units);
    if boundary + 1 < n {
        let (packed, left) = pack_below(model, &pieces[boundary + 1..], boundary);
        moves.extend(packed);
        moves.extend(pack_above(model, left, boundary + 1));
    }
    // Runs that found no room go again, lowest first, into what the packing emptied.
    for run in stuck {
        if let Some(piece) = move_run_down(model, &run) {
            moves.push(piece);
        }
    }
    moves
}

/// Move the `pieces` (of chunks above `boundary`) into the free stretches of chunks up to it,
/// largest first, each into the shortest stretch that holds it (best fit: what is left of a
/// stretch stays for smaller pieces), in `model`: the moves, and the pieces that found no place
/// (still where they are).
fn pack_below<'p>(model: &mut Model, pieces: &'p [Vec<Shaped>], boundary: usize) -> (Vec<Piece>, Vec<&'p Shaped>) {
    let g = model.geometry;
    let mut moving: Vec<&Shaped> = pieces.iter().flatten().collect();
    moving.sort_by_key(|(p, units, align)| (Reverse(*units), Reverse(*align), p.from));
    let mut gaps = model.gaps(boundary, g.bank_units(model.bank_size));
    let mut moves = Vec::with_capacity(moving.len());
    let mut left = Vec::new();
    for shaped in moving {
        let (piece, units, align) = shaped;
        let Some((c, p)) = gaps.take(*units, *align) else {
            left.push(shaped);
            continue;
        };
        model.occupy(c, p, *units, piece.core);
        set_source(model, piece, *units, false);
        moves.push(Piece { to: g.offset_of(c, p), ..piece.clone() });
    }
    (moves, left)
}

/// Move `pieces` (that found no hole at or below the boundary) into the room just above it:
/// largest first, each to the lowest place from chunk `floor` up that ends before its own
/// start (else it stays), in `model`. Their own places stay covered while they are placed, so
/// no destination overlaps another of them: a destination overlaps at most sources of blocks
/// that went below the boundary, copied out first.
fn pack_above(model: &mut Model, mut pieces: Vec<&Shaped>, floor: usize) -> Vec<Piece> {
    let g = model.geometry;
    pieces.sort_by_key(|(p, units, align)| (Reverse(*units), Reverse(*align), p.from));
    // Per shape, the lowest place worth trying (places only fill up here).
    let mut cursors: HashMap<(u64, u64), (usize, u64)> = HashMap::new();
    let mut placed = Vec::new();
    for (piece, units, align) in pieces {
        let (own_chunk, own) = (g.chunk_of(piece.from), g.unit_in_chunk(piece.from));
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
            model.occupy(c, p, *units, piece.core);
            placed.push((piece, *units, g.offset_of(c, p)));
        }
    }
    // Their old places are free once all are placed.
    placed
        .into_iter()
        .map(|(piece, units, to)| {
            set_source(model, piece, units, false);
            Piece { to, ..piece.clone() }
        })
        .collect()
}

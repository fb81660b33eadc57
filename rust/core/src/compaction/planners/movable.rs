//! What can move and what room it needs: the pieces of a census as the planners place them,
//! and the measures the planners decide by (the boundary chunk, the bank rule's slack, the
//! bytes a repack would copy).

use super::super::census::{Census, Item};
use super::super::model::Model;
use super::super::piece::{Piece, PieceKind};
use crate::arena::front::FrontLayout;
use crate::arena::layout::Layout;
use crate::arena::slab::caches::SlabView;

/// A piece to place: (piece, units it covers, alignment in units); a run has 0 units (it
/// takes whole chunks).
pub(crate) type Shaped = (Piece, u64, u64);

/// A slab worth moving as a whole: it holds objects, every one has a handle and none is
/// pinned. (An all-free slab goes back to the buddy pool after the batch instead.)
pub(crate) fn slab_worth_moving(census: &Census, view: &SlabView, objects_per_slab: u32) -> bool {
    let all = (1u64 << objects_per_slab) - 1;
    view.free & all != all && slab_movable(census, view, objects_per_slab)
}

/// A slab that can move as a whole: every object has a handle and none is pinned.
pub(crate) fn slab_movable(census: &Census, view: &SlabView, objects_per_slab: u32) -> bool {
    let live = objects_per_slab - (view.free & ((1u64 << objects_per_slab) - 1)).count_ones();
    let items = census.items(view.id);
    items.len() as u32 == live && items.iter().all(|i| i.movable)
}

/// The alignment (units) a buddy block of `units` units aligned to `align` bytes needs at a
/// place a planner picks: it is packed there (see [`crate::arena::layout::BuddyLayout`]), not put at
/// the start of its enclosing node, so no trimmed tail is left behind it.
pub(crate) fn packed_alignment(model: &Model, units: u64, align: usize) -> u64 {
    model.geometry.packed_alignment(units, align, model.bank_size)
}

/// The units a buddy block of `size` bytes covers (`None` for a run-sized block).
pub(crate) fn buddy_units(model: &Model, size: usize) -> Option<u64> {
    model.geometry.buddy_layout(size).map(|b| b.units)
}

/// The move of a census block, going nowhere yet (`None` for one its home cannot hold).
pub(crate) fn block_piece(census: &Census, model: &Model, item: &Item) -> Option<Piece> {
    census.piece(item, model.geometry, model.classes)
}

/// A buddy block of a census as a piece to place.
pub(crate) fn shaped_block(census: &Census, model: &Model, item: &Item) -> Option<Shaped> {
    let piece = block_piece(census, model, item)?;
    let Layout::Buddy(b) = model.geometry.layout(piece.size, piece.align) else { return None };
    let align = packed_alignment(model, b.units, piece.align);
    Some((piece, b.units, align))
}

/// A whole slab as one piece to place.
pub(crate) fn slab_piece(census: &Census, model: &Model, view: &SlabView) -> Shaped {
    let objects = census.items(view.id).iter().map(|i| (i.handle, i.offset)).collect();
    let units = (view.bytes >> model.geometry.unit_shift) as u64;
    let piece = Piece {
        kind: PieceKind::Slab { id: view.id, objects },
        handle: None,
        size: view.bytes,
        align: view.bytes,
        core: view.owner,
        from: view.base,
        to: view.base,
        extent: view.bytes,
    };
    (piece, units, units)
}

/// Bytes a repack would copy: every movable buddy block, chunk run and whole slab.
pub(crate) fn movable_bytes(census: &Census, model: &Model) -> usize {
    let blocks: usize = census.buddy.iter().chain(census.runs.iter()).filter(|i| i.movable).map(|i| i.size).sum();
    let slabs: usize = census
        .slabs
        .iter()
        .filter(|v| slab_worth_moving(census, v, model.classes[v.class].objects))
        .map(|v| v.bytes)
        .sum();
    blocks + slabs
}

/// Free bytes the bank rule leaves however tightly blocks are packed: a buddy block larger
/// than a bank starts on a bank boundary, so the rest of its last bank stays free (only a
/// block of at most a bank fits there, and those live in slabs).
pub(crate) fn bank_slack(census: &Census, model: &Model) -> usize {
    let g = model.geometry;
    let bank = g.bank_units(model.bank_size);
    census
        .buddy
        .iter()
        .filter_map(|i| buddy_units(model, i.size))
        .filter(|&units| units > bank)
        .map(|units| (units.next_multiple_of(bank) - units) as usize * g.min_block)
        .sum()
}

/// The units the movable blocks and whole slabs of each chunk take wherever they are packed:
/// a block larger than a bank takes whole banks (the next one starts on a bank boundary).
pub(crate) fn movable_units(census: &Census, model: &Model) -> Vec<u64> {
    let g = model.geometry;
    let mut units = vec![0u64; model.chunks.len()];
    for item in census.buddy.iter().filter(|i| i.movable) {
        if let Some(n) = buddy_units(model, item.size) {
            let align = packed_alignment(model, n, 1 << item.align_log2);
            units[g.chunk_of(item.offset)] += n.next_multiple_of(align);
        }
    }
    for view in &census.slabs {
        if slab_worth_moving(census, view, model.classes[view.class].objects) {
            units[g.chunk_of(view.base)] += (view.bytes >> g.unit_shift) as u64;
        }
    }
    units
}

/// The movable buddy blocks and whole slabs of every core chunk, by chunk.
pub(crate) fn movable_pieces(census: &Census, model: &Model) -> Vec<Vec<Shaped>> {
    let g = model.geometry;
    let mut pieces: Vec<Vec<Shaped>> = vec![Vec::new(); model.chunks.len()];
    for item in census.buddy.iter().filter(|i| i.movable) {
        if let Some(shaped) = shaped_block(census, model, item) {
            pieces[g.chunk_of(shaped.0.from)].push(shaped);
        }
    }
    for view in &census.slabs {
        if slab_worth_moving(census, view, model.classes[view.class].objects) {
            pieces[g.chunk_of(view.base)].push(slab_piece(census, model, view));
        }
    }
    pieces
}

/// The boundary chunk of a compaction: the lowest chunk for which the free units at or below
/// it cover the `movable` units above it (per chunk, see [`movable_units`]).
pub(crate) fn boundary(model: &Model, movable: &[u64]) -> usize {
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

/// Units of the tail of a block of `size` bytes (0 for a block without one): a run with a tail
/// (`arena/tail.rs`) also covers that many units at the start of the chunk after its chunks.
pub(crate) fn tail_units(model: &Model, size: usize) -> u64 {
    (model.geometry.tail_bytes(size) >> model.geometry.unit_shift) as u64
}

/// Whether the run `run` of `chunks` whole chunks fits at chunk `d` of `model`: its chunks
/// empty and as long, and the start of the chunk after them free for its tail, if it has one.
pub(crate) fn run_fits(model: &Model, run: &Piece, chunks: usize, d: usize) -> bool {
    let g = model.geometry;
    let tail = tail_units(model, run.size);
    let whole = (d..d + chunks).all(|c| c < model.chunks.len() && model.is_empty(c));
    whole
        && g.run_bytes(d, chunks) + tail as usize * g.min_block == run.extent
        && (tail == 0 || (d + chunks < model.chunks.len() && model.find(d + chunks, 0, tail, 1, tail) == Some(0)))
}

/// Put the run `run` of `chunks` whole chunks at chunk `d` of `model` (`on`), or take it away,
/// with its tail.
pub(crate) fn set_run_piece(model: &mut Model, run: &Piece, chunks: usize, d: usize, on: bool) {
    model.set_run(d, chunks, on);
    let tail = tail_units(model, run.size);
    if tail > 0 {
        match on {
            true => model.occupy(d + chunks, 0, tail, run.core),
            false => model.vacate(d + chunks, 0, tail),
        }
    }
}

/// The movable runs of a census, in address order.
pub(crate) fn movable_runs(census: &Census, model: &Model) -> Vec<Piece> {
    let mut runs: Vec<Piece> =
        census.runs.iter().filter(|i| i.movable).filter_map(|i| block_piece(census, model, i)).collect();
    runs.sort_by_key(|p| p.from);
    runs
}

/// The alignment (in chunks) of a run piece's first chunk; `None` for a block that is no run.
pub(crate) fn run_alignment(model: &Model, run: &Piece) -> Option<usize> {
    match model.geometry.layout(run.size, run.align) {
        Layout::Run { align_chunks, .. } | Layout::RunTail { align_chunks, .. } => Some(align_chunks),
        Layout::Buddy(_) => None,
    }
}

/// Take the place that `piece` holds at its source out of `model` (`on`: put it back), `units`
/// its units when it is a buddy block or slab: a run's chunks and tail, a buddy block's units,
/// or a block with a front's front, whole chunks and tail (`arena/front.rs`).
pub(crate) fn set_source(model: &mut Model, piece: &Piece, units: u64, on: bool) {
    let g = model.geometry;
    let set = |model: &mut Model, chunk: usize, start: u64, units: u64| match on {
        true => model.occupy(chunk, start, units, piece.core),
        false => model.vacate(chunk, start, units),
    };
    if let (Some(f), PieceKind::Buddy | PieceKind::Run { .. }) =
        (FrontLayout::of(g, piece.from, piece.size), &piece.kind)
    {
        model.set_fronted(&f, on, piece.core);
        return;
    }
    match piece.kind {
        PieceKind::Run { chunks } => set_run_piece(model, piece, chunks, g.chunk_of(piece.from), on),
        _ => set(model, g.chunk_of(piece.from), g.unit_in_chunk(piece.from), units),
    }
}

/// Whether `piece`'s source is a block with a front (its offset and size say so).
pub(crate) fn has_front(model: &Model, piece: &Piece) -> bool {
    FrontLayout::of(model.geometry, piece.from, piece.size).is_some()
        && matches!(piece.kind, PieceKind::Buddy | PieceKind::Run { .. })
}

/// The block with a front that run piece `run` would be with its front in the free end of
/// chunk `c` of `model` (`arena/front.rs`), if one fits there: the front starts on the lowest
/// unit of that free end (on a bank, or the block's coarser alignment) where it holds less than
/// the block, so the tail after it is the shortest, and the rest of the free end before it stays
/// for other blocks; its whole chunks empty and the start of its tail's chunk free. The chunk
/// may be empty (a free chunk is granted for the front, as for the tail).
pub(crate) fn front_fits(model: &Model, run: &Piece, c: usize) -> Option<FrontLayout> {
    let g = model.geometry;
    if !g.tails || run.align > g.chunk_size {
        return None;
    }
    let align = g.bank_units(model.bank_size).max((run.align >> g.unit_shift) as u64);
    let upc = g.units_per_chunk();
    // The lowest start whose front holds less than the block: `(upc - s) * unit < size`.
    let shortest_tail = upc.saturating_sub(((run.size - 1) >> g.unit_shift) as u64);
    let start = model.free_suffix_start(c)?.max(shortest_tail).max(1).next_multiple_of(align);
    let f = FrontLayout::at(g, c, start, run.size)?;
    let whole = (f.first_whole()..f.first_whole() + f.chunks).all(|x| model.is_empty(x));
    let tail = f.tail_units == 0 || model.find(f.tail_chunk(), 0, f.tail_units, 1, f.tail_units) == Some(0);
    (whole && tail).then_some(f)
}

/// Move `run` (in the model) to the lowest stretch of empty chunks that starts below it (it may
/// overlap its own chunks), with room for its tail after them, or a block with a front to the
/// lowest place with a front below it; `None` (and the model as it was) when there is none.
pub(crate) fn move_run_down(model: &mut Model, run: &Piece) -> Option<Piece> {
    let g = model.geometry;
    let PieceKind::Run { chunks } = run.kind else { return None };
    if has_front(model, run) {
        // To the lowest place with a front below it (where it holds as many bytes).
        set_source(model, run, 0, false);
        let lower = |f: &FrontLayout| f.offset(g) < run.from;
        return match (0..=g.chunk_of(run.from)).find_map(|c| front_fits(model, run, c).filter(lower)) {
            Some(f) => {
                model.set_fronted(&f, true, run.core);
                Some(Piece { to: f.offset(g), ..run.clone() })
            }
            None => {
                set_source(model, run, 0, true);
                None
            }
        };
    }
    let align_chunks = run_alignment(model, run)?;
    let first = g.chunk_of(run.from);
    set_source(model, run, 0, false);
    match (0..first).step_by(align_chunks).find(|&d| run_fits(model, run, chunks, d)) {
        Some(d) => {
            set_run_piece(model, run, chunks, d, true);
            Some(Piece { to: d * g.chunk_size, ..run.clone() })
        }
        None => {
            set_source(model, run, 0, true);
            None
        }
    }
}

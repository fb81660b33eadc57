//! Evacuation: named chunks emptied into the others (`Evacuate`); or an incremental step: the
//! chunks above the boundary, sparsest first, their blocks into the lowest places below their
//! own chunks, at most `max_bytes` of moves (a chunk may take several steps); then runs slide
//! down into the room that makes.

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

use super::super::census::{Census, Place};
use super::super::model::{Model, Role};
use super::super::piece::{Piece, PieceKind};
use super::movable::{
    block_piece, boundary, buddy_units, has_front, movable_runs, movable_units, run_alignment, run_fits, set_run_piece,
    set_source, shaped_block, slab_movable, slab_piece, tail_units, Shaped,
};
use crate::arena::front::FrontLayout;
use crate::arena::slab::caches::SlabRef;

/// What one core chunk holds, for an evacuation: indices into the census.
#[derive(Debug, Default)]
pub(crate) struct Contents {
    /// Its buddy blocks (`census.buddy[i]`).
    pub(crate) buddy: Vec<usize>,
    /// Its slabs (`census.slabs[i]`).
    pub(crate) slabs: Vec<usize>,
    /// Bytes to move to empty it.
    pub(crate) bytes: usize,
    /// Everything in it can move (no pinned blocks, no blocks without handles), but for the
    /// tail of a run, which moves with its run.
    pub(crate) movable: bool,
    /// It holds the tail of a run (`arena/tail.rs`), or the tail or the front of a block with a
    /// front that stays (`arena/front.rs`): it cannot be emptied by moving its blocks.
    pub(crate) tail: bool,
    units: u64,
}

/// The contents of every core chunk (`None` for chunks without blocks or slabs).
pub(crate) fn chunk_contents(census: &Census, model: &Model) -> Vec<Option<Contents>> {
    let g = model.geometry;
    let mut out: Vec<Option<Contents>> = (0..model.chunks.len()).map(|_| None).collect();
    fn entry(out: &mut [Option<Contents>], c: usize) -> &mut Contents {
        out[c].get_or_insert_with(|| Contents { movable: true, ..Contents::default() })
    }
    // A block with a front covers its front in its chunk and its tail in the chunk its tail
    // begins: an evacuation does not move it, so neither chunk is emptied by moving its blocks
    // (they may leave).
    for item in census.buddy.iter().chain(census.runs.iter()).filter(|i| i.place == Place::Fronted) {
        let Some(f) = FrontLayout::of(g, item.offset, item.size) else { continue };
        let e = entry(&mut out, f.chunk);
        e.units += f.front_units(g);
        e.tail = true;
        if f.tail_units > 0 && f.tail_chunk() < out.len() {
            let e = entry(&mut out, f.tail_chunk());
            e.units += f.tail_units;
            e.tail = true;
        }
    }
    for (i, item) in census.buddy.iter().enumerate() {
        let e = entry(&mut out, g.chunk_of(item.offset));
        e.movable &= item.movable;
        e.bytes += item.size;
        e.units += buddy_units(model, item.size).unwrap_or(0);
        e.buddy.push(i);
    }
    for (i, view) in census.slabs.iter().enumerate() {
        let e = entry(&mut out, g.chunk_of(view.base));
        e.movable &= slab_movable(census, view, model.classes[view.class].objects);
        e.bytes += census.items(view.id).iter().map(|i| i.size).sum::<usize>();
        e.units += (view.bytes >> g.unit_shift) as u64;
        e.slabs.push(i);
    }
    for item in &census.runs {
        let tail = tail_units(model, item.size);
        let Place::Run(chunks) = item.place else { continue };
        let after = g.chunk_of(item.offset) + chunks as usize;
        if tail > 0 && after < out.len() {
            let e = entry(&mut out, after);
            e.units += tail;
            e.tail = true;
        }
    }
    // Blocks without a handle show as covered units nobody accounts for.
    for (c, e) in out.iter_mut().enumerate() {
        if let Some(e) = e {
            if census.covered.get(c).is_some_and(|&covered| e.units != covered) {
                e.movable = false;
            }
        }
    }
    out
}

/// The chunks an incremental step evacuates, in order: the chunks above the boundary (see
/// [`super::pack::plan_pack`]) whose blocks can all move, sparsest first (the fewest bytes to
/// move, then the highest). Each step empties as many chunks as its budget allows; their
/// blocks go into the lowest holes (below the boundary while there are any), so every chunk
/// above the boundary empties in the end and the free chunks join into one run.
pub(crate) fn evacuation_order(census: &Census, model: &Model, contents: &[Option<Contents>]) -> Vec<usize> {
    let boundary = boundary(model, &movable_units(census, model));
    let mut chunks: Vec<(usize, usize)> = contents
        .iter()
        .enumerate()
        .skip(boundary + 1)
        .filter_map(|(chunk, c)| c.as_ref().filter(|c| c.movable && c.bytes > 0).map(|c| (chunk, c.bytes)))
        .collect();
    chunks.sort_by_key(|&(chunk, bytes)| (bytes, Reverse(chunk)));
    chunks.into_iter().map(|(chunk, _)| chunk).collect()
}

/// The chunks of `emptied` that are empty during the batch already: a slab stays where it is
/// until the batch tidies it afterwards (one whose objects move out, and one all free already,
/// which the planners count as room), unless the batch moves it whole.
pub(crate) fn clean_chunks(census: &Census, model: &Model, moves: &[Piece], emptied: &[usize]) -> Vec<usize> {
    let moved_whole: HashSet<usize> =
        moves.iter().filter(|p| matches!(p.kind, PieceKind::Slab { .. })).map(|p| p.from).collect();
    let dirty: HashSet<usize> = census
        .slabs
        .iter()
        .filter(|view| !moved_whole.contains(&view.base))
        .map(|view| model.geometry.chunk_of(view.base))
        .collect();
    emptied.iter().copied().filter(|c| !dirty.contains(c)).collect()
}

/// Run slides for an incremental step: runs (in address order) with empty chunks right below
/// them move down into those chunks, while their bytes fit `budget`; what a run leaves at its
/// top joins the free chunks above it. `emptied` chunks (evacuated by the same step) count as
/// empty.
pub(crate) fn plan_run_slides(census: &Census, model: &mut Model, emptied: &[usize], budget: usize) -> Vec<Piece> {
    let g = model.geometry;
    for &c in emptied {
        model.set_run(c, 1, false);
    }
    let mut spent = 0;
    let mut moves = Vec::new();
    for mut piece in movable_runs(census, model) {
        let PieceKind::Run { chunks } = piece.kind else { continue };
        let Some(align_chunks) = run_alignment(model, &piece) else { continue };
        let from = g.chunk_of(piece.from);
        if has_front(model, &piece) {
            continue; // it moves only to a place with a front (`plan_pack`)
        }
        if from == 0 || !model.is_empty(from - 1) || spent + piece.size > budget {
            continue;
        }
        let mut low = from - 1;
        while low > 0 && model.is_empty(low - 1) {
            low -= 1;
        }
        set_source(model, &piece, 0, false);
        let fits = |d: usize| run_fits(model, &piece, chunks, d);
        let to = (low.next_multiple_of(align_chunks)..from).step_by(align_chunks).find(|&d| fits(d));
        match to {
            Some(to) => set_run_piece(model, &piece, chunks, to, true),
            None => set_source(model, &piece, 0, true),
        }
        if let Some(to) = to {
            piece.to = to * g.chunk_size;
            spent += piece.size;
            moves.push(piece);
        }
    }
    moves
}

/// An evacuation over `model`: the moves that empty the chosen chunks, and the chunks they
/// empty. `chosen` lists chunks in the order to try.
///
/// * `strict` (chunks the caller names): every chunk must be emptied into the other chunks or
///   fresh ones (`Err` names the first that cannot).
/// * Otherwise (a compaction: chunks from the end of the arena down): blocks of the chunks, in
///   that order, move into the lowest holes *below their own chunk* while the moves add up to
///   at most `budget` bytes; a chunk may empty only partly (the next step goes on), and chunks
///   not yet evacuated may receive blocks. Every move lowers a block, so repeated steps run
///   out, and free space gathers at the end of the arena.
pub(crate) fn plan_evacuation(
    census: &Census,
    contents: &[Option<Contents>],
    model: &mut Model,
    chosen: &[usize],
    budget: Option<usize>,
    strict: bool,
) -> std::result::Result<(Vec<Piece>, Vec<usize>), String> {
    let g = model.geometry;
    let classes = model.classes;
    let excluded: HashSet<usize> = if strict { chosen.iter().copied().collect() } else { HashSet::new() };
    // Free objects of each class in slabs outside the excluded chunks: (slab, offset).
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
    // into fresh chunks. In a step, a block only goes to a chunk below its own, busy or empty
    // (blocks that fit no hole below the boundary pack just above it): every move lowers a
    // block, so steps run out (no block can go back and forth), and free space gathers at the
    // end of the arena.
    let busy = |c: usize| model.chunks[c].role == Role::Core && model.chunks[c].used > 0;
    let empty = |c: usize| model.is_empty(c);
    let mut holes: Vec<usize> =
        (0..model.chunks.len()).filter(|&c| !excluded.contains(&c) && (busy(c) || (!strict && empty(c)))).collect();
    if strict {
        holes.extend((0..model.chunks.len()).filter(|&c| !excluded.contains(&c) && empty(c)));
    }
    // Per size, the first hole worth trying (holes only fill up while planning, so a hole too
    // full for a size stays so).
    let mut dead = vec![false; model.chunks.len()];
    let mut cursors: HashMap<(u64, u64), usize> = HashMap::new();
    // Chunks that received blocks in this evacuation cannot be emptied by it.
    let mut received: HashSet<usize> = HashSet::new();
    let mut moves = Vec::new();
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
        if content.tail && strict {
            refuse(format!("chunk {chunk} holds the tail of a chunk run"))?;
        }
        if received.contains(&chunk) {
            continue;
        }
        // What may still move this step (strict: everything).
        let room = budget.map_or(usize::MAX, |limit| limit.saturating_sub(spent));
        if room == 0 {
            break;
        }
        let first_move = moves.len();
        let slots_before: Vec<usize> = slots.iter().map(Vec::len).collect();
        let mut taken_slots: Vec<Vec<(SlabRef, usize)>> = vec![Vec::new(); classes.len()];
        let mut placements: Vec<(usize, u64, u64)> = Vec::new();
        // Where the pieces that move leave this chunk: first unit and units.
        let mut sources: Vec<(u64, u64)> = Vec::new();
        let mut bytes = 0usize;
        // Everything of the chunk found a place (else, in a step, what moved still helps: the
        // chunk is emptier for the next step).
        let mut all = true;
        // Slabs: the objects go into other slabs when they all fit, else the whole slab moves.
        let mut pieces: Vec<Shaped> = Vec::new();
        for view in content.slabs.iter().map(|&i| &census.slabs[i]) {
            let items = census.items(view.id);
            let usable = |at: usize| if strict { g.chunk_of(at) != chunk } else { g.chunk_of(at) < chunk };
            let elsewhere = slots[view.class].iter().filter(|(_, at)| usable(*at)).count();
            let object_bytes: usize = items.iter().map(|i| i.size).sum();
            if elsewhere >= items.len() && bytes + object_bytes <= room {
                // Slots that are no use here (this chunk's, or above it): set them aside.
                let (here, others): (Vec<_>, Vec<_>) = slots[view.class].drain(..).partition(|(_, at)| !usable(*at));
                slots[view.class] = others;
                for item in items {
                    let Some(mut piece) = block_piece(census, model, item) else { continue };
                    let slot = slots[view.class].pop().expect("counted");
                    taken_slots[view.class].push(slot);
                    piece.to = slot.1;
                    bytes += piece.copy_len();
                    moves.push(piece);
                }
                slots[view.class].extend(here);
            } else {
                pieces.push(slab_piece(census, model, view));
            }
        }
        pieces.extend(content.buddy.iter().filter_map(|&i| shaped_block(census, model, &census.buddy[i])));
        pieces.sort_by_key(|(p, n, _)| (Reverse(*n), p.from));
        for (mut piece, n, align) in pieces {
            if bytes + piece.copy_len() > room {
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
            model.occupy(c, p, n, piece.core);
            placements.push((c, p, n));
            sources.push((g.unit_in_chunk(piece.from), n));
            piece.to = g.offset_of(c, p);
            bytes += piece.copy_len();
            moves.push(piece);
        }
        if strict && !all {
            for (c, p, n) in placements {
                model.vacate(c, p, n);
            }
            moves.truncate(first_move);
            for (k, taken) in taken_slots.into_iter().enumerate() {
                slots[k].extend(taken.into_iter().rev());
                debug_assert_eq!(slots[k].len(), slots_before[k]);
            }
            return Err(format!("the blocks of chunk {chunk} do not fit in the holes of the other chunks"));
        }
        if moves.len() == first_move {
            failures += 1;
            continue;
        }
        failures = 0;
        // The model after the step: what moved left its units here (a chunk that keeps some
        // blocks is not emptied below, so nothing else frees them; its all-free slabs stay
        // covered until the batch is over).
        for (start, units) in sources {
            model.vacate(chunk, start, units);
        }
        for (c, _, _) in &placements {
            received.insert(*c);
        }
        for taken in &taken_slots {
            received.extend(taken.iter().map(|(_, at)| g.chunk_of(*at)));
        }
        spent += bytes;
        if all && !content.tail {
            emptied.push(chunk);
        }
        // A chunk being emptied is no longer a hole, nor are its slabs' free objects slots.
        dead[chunk] = true;
        for list in &mut slots {
            list.retain(|(_, at)| g.chunk_of(*at) != chunk);
        }
    }
    Ok((moves, emptied))
}

//! The one planning path of a compaction: the batches of moves a [`CompactionMode`] makes, and
//! the arena after them. `Pool::compact_step` runs these batches; `Pool::plan_compaction`
//! summarizes them.

use super::super::census::Census;
use super::super::model::{Model, Role};
use super::super::piece::Piece;
use super::super::types::CompactionMode;
use super::consolidate::{apply_consolidation, consolidate_slabs};
use super::evacuate::{chunk_contents, clean_chunks, evacuation_order, plan_evacuation, plan_run_slides};
use super::pack::plan_full;

/// What a compaction moves.
pub(crate) struct Schedule<'a> {
    /// The batches, in the order they run (each moves its pieces at once; a later batch was
    /// planned on the arena the earlier ones leave).
    pub(crate) batches: Vec<Vec<Piece>>,
    /// Per batch, the buddy blocks (base, bytes) the pool is expected to give back before it
    /// runs, after the batches before it (slabs a consolidation emptied).
    pub(crate) released: Vec<Vec<(usize, usize)>>,
    /// The arena after every batch (and the chunks they empty given back).
    pub(crate) model: Model<'a>,
}

/// Plan a compaction of `census` over `model`. `caller_copies`: the caller copies the bytes (a
/// mover, or a pool without host memory), so a full compaction is one batch that never needs a
/// bounce (no slab consolidation, a slide rather than a repack).
///
/// * `Full`: a slab consolidation (host memory only; `census` is brought to the arena after
///   it and after the all-free slabs go back, see [`apply_consolidation`]), then [`plan_full`].
/// * `Incremental`: chunks above the boundary evacuated sparsest first within `max_bytes`, then
///   runs slid down into the room that makes, within what is left of it.
/// * `Evacuate`: the named chunks emptied; `Err` when one does not exist or cannot be.
pub(crate) fn plan_compaction_moves<'a>(
    census: &mut Census,
    mut model: Model<'a>,
    mode: &CompactionMode,
    caller_copies: bool,
) -> Result<Schedule<'a>, String> {
    let mut batches = Vec::new();
    // Slabs given back before the first batch (all-free slabs, when no object consolidates) and
    // before the second (those a consolidation batch empties, with the all-free ones).
    let mut before_first = Vec::new();
    let mut released = Vec::new();
    match mode {
        CompactionMode::Full => {
            if !caller_copies {
                // The all-free slabs go back before the moves (a batch of their own when objects
                // consolidate, else before the first batch), so the model loses them either way.
                let consolidation = consolidate_slabs(census, &model);
                let gone = apply_consolidation(census, &mut model, &consolidation);
                if consolidation.moves.is_empty() {
                    before_first = gone;
                } else {
                    released = gone;
                    batches.push(consolidation.moves);
                }
            }
            let (moves, after) = plan_full(census, model, caller_copies);
            model = after;
            batches.push(moves);
        }
        CompactionMode::Incremental { max_bytes } => {
            let start = model.clone();
            let contents = chunk_contents(census, &model);
            let candidates = evacuation_order(census, &model, &contents);
            let (mut moves, emptied) =
                plan_evacuation(census, &contents, &mut model, &candidates, Some(*max_bytes), false)?;
            let spent: usize = moves.iter().map(Piece::copy_len).sum();
            let clean = clean_chunks(census, &model, &moves, &emptied);
            moves.extend(plan_run_slides(census, &mut model, &clean, max_bytes.saturating_sub(spent)));
            // The emptied chunks go back, but those a run slid into.
            for &c in &emptied {
                if model.chunks[c].role != Role::Run {
                    model.set_run(c, 1, false);
                }
            }
            // A step whose moves would leave a smaller largest free block than there is moves
            // nothing: the chunks it would empty first are not worth what the step takes from
            // the free space below them (a block moved into the middle of the largest free
            // stretch), and a compaction never leaves less room than it found.
            let pieces: Vec<&Piece> = moves.iter().collect();
            if model.settled(census, &pieces).largest_free() < start.settled(census, &[]).largest_free() {
                moves.clear();
                model = start;
            }
            batches.push(moves);
        }
        CompactionMode::Evacuate { chunks } => {
            let arena = model.chunks.len();
            if let Some(&bad) = chunks.iter().find(|&&c| c >= arena) {
                return Err(format!("chunk {bad} does not exist (the arena has {arena} chunks)"));
            }
            let mut sorted = chunks.clone();
            sorted.sort_unstable();
            if let Some(twice) = sorted.windows(2).find(|w| w[0] == w[1]) {
                return Err(format!("chunk {} is named twice", twice[0]));
            }
            let contents = chunk_contents(census, &model);
            let (moves, emptied) = plan_evacuation(census, &contents, &mut model, chunks, None, true)?;
            for &c in &emptied {
                model.set_run(c, 1, false);
            }
            batches.push(moves);
        }
    }
    // What is given back after the first batch comes before the second.
    let mut released: Vec<Vec<(usize, usize)>> = vec![before_first, released];
    released.resize_with(batches.len(), Vec::new);
    let (batches, released) = batches.into_iter().zip(released).filter(|(b, _)| !b.is_empty()).unzip();
    Ok(Schedule { batches, released, model })
}

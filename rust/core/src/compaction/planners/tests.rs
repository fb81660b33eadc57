//! Unit tests of the planners on censuses and models built by hand (no pool): an arena of
//! 64 KiB chunks of 256 units (256-byte `min_block`), 4 KiB banks (16 units) and one slab
//! class of 512-byte objects (8 KiB slabs of 16 objects, 32 units).

use super::super::census::{Census, Item, Place};
use super::super::model::{Model, Role};
use super::super::piece::{Piece, PieceKind};
use super::super::types::CompactionMode;
use super::consolidate::{apply_consolidation, consolidate_slabs};
use super::movable::front_fits;
use super::pack::{plan_full, plan_pack};
use super::schedule::plan_compaction_moves;
use crate::arena::front::FrontLayout;
use crate::arena::geometry::Geometry;
use crate::arena::layout::Layout;
use crate::arena::slab::caches::{SlabClasses, SlabRef, SlabView};
use crate::config::PoolConfig;
use crate::handle::id::Handle;

const CHUNK: usize = 64 << 10;
const UNIT: usize = 256;
const BANK: usize = 4096;

/// The arena's fixed parts.
struct Arena {
    geometry: Geometry,
    classes: SlabClasses,
}

fn arena(chunks: usize) -> Arena {
    let mut config = PoolConfig::new(chunks * CHUNK);
    config.chunk_size = CHUNK;
    config.min_block = UNIT;
    config.bank_size = BANK;
    Arena { geometry: Geometry::new(&config), classes: SlabClasses::new(&[512], BANK, UNIT, CHUNK) }
}

/// A census and a model being built.
struct World<'a> {
    census: Census,
    model: Model<'a>,
    next_slot: u32,
}

impl<'a> World<'a> {
    fn new(arena: &'a Arena) -> World<'a> {
        World {
            census: Census::default(),
            model: Model::empty(&arena.geometry, BANK, &arena.classes.classes),
            next_slot: 1,
        }
    }

    fn handle(&mut self) -> Handle {
        self.next_slot += 1;
        Handle::from_bits(u128::from(self.next_slot) << 32 | 1)
    }

    /// Units `[start, start + units)` of `chunk` are taken by something without a handle.
    fn cover(&mut self, chunk: usize, start: u64, units: u64) {
        self.core(chunk);
        self.model.occupy(chunk, start, units, 0);
    }

    /// Everything of `chunk` but these stretches (start, units) is taken without a handle.
    fn cover_all_but(&mut self, chunk: usize, holes: &[(u64, u64)]) {
        let mut at = 0;
        let mut holes = holes.to_vec();
        holes.push((256, 0));
        for (start, units) in holes {
            if start > at {
                self.cover(chunk, at, start - at);
            }
            at = start + units;
        }
    }

    fn core(&mut self, chunk: usize) {
        if self.model.chunks[chunk].role == Role::Free {
            self.model.make_core(chunk, 0);
        }
    }

    /// A live buddy block of `units` units at unit `start` of `chunk`.
    fn block(&mut self, chunk: usize, start: u64, units: u64, movable: bool) -> Handle {
        let handle = self.handle();
        let offset = chunk * CHUNK + start as usize * UNIT;
        let item = item(handle, offset, units as usize * UNIT, 8, Place::Buddy);
        self.census.buddy.push(Item { movable, ..item });
        self.cover(chunk, start, units);
        handle
    }

    /// A live slab at unit `start` of `chunk` with objects `live` (indices) taken.
    fn slab(&mut self, id: u32, chunk: usize, start: u64, live: &[u32]) -> Vec<Handle> {
        let class = &self.model.classes[0];
        let (bytes, objects, size) = (class.slab_bytes, class.objects, class.size);
        let base = chunk * CHUNK + start as usize * UNIT;
        let mut free = (1u64 << objects) - 1;
        let slab = SlabRef { id, class: 0, owner: 0 };
        let mut handles = Vec::new();
        for &j in live {
            free &= !(1 << j);
            let handle = self.handle();
            let offset = base + self.model.classes[0].offset_of(j);
            self.census.add_object(slab, item(handle, offset, size, 9, Place::Object(id)));
            handles.push(handle);
        }
        self.census.slabs.push(SlabView { id, class: 0, base, bytes, owner: 0, free });
        self.cover(chunk, start, (bytes / UNIT) as u64);
        handles
    }
}

/// A movable census item of core 0.
fn item(handle: Handle, offset: usize, size: usize, align_log2: u8, place: Place) -> Item {
    Item { handle, place, offset, size, core: 0, align_log2, movable: true }
}

fn at(chunk: usize, unit: u64) -> usize {
    chunk * CHUNK + unit as usize * UNIT
}

fn to_of(moves: &[Piece], handle: Handle) -> Option<usize> {
    moves.iter().find(|p| p.handles().contains(&handle)).map(|p| p.to)
}

/// Every destination keeps the bank rule, lies where its kind can start, and no two
/// destinations overlap; no unmovable block moves.
fn check_moves(census: &Census, moves: &[Piece]) {
    let pinned: Vec<Handle> = census
        .buddy
        .iter()
        .chain(census.runs.iter())
        .chain(census.objects.iter().flatten())
        .filter(|i| !i.movable)
        .map(|i| i.handle)
        .collect();
    for p in moves {
        assert!(p.handles().iter().all(|h| !pinned.contains(h)), "a pinned block moves: {p:?}");
        for i in census.buddy.iter().filter(|i| !i.movable) {
            let (start, end) = (i.offset, i.offset + i.size);
            assert!(p.to + p.extent <= start || end <= p.to, "{p:?} lands on a pinned block");
        }
        assert_eq!(p.to % p.align.min(BANK), 0, "misaligned: {p:?}");
        match p.kind {
            PieceKind::Buddy | PieceKind::SlabObject { .. } if p.size <= BANK => {
                assert_eq!(p.to / BANK, (p.to + p.size - 1) / BANK, "straddles a bank: {p:?}")
            }
            PieceKind::Run { .. } => assert_eq!(p.to % CHUNK, 0),
            _ => assert_eq!(p.to % BANK, 0, "a block larger than a bank starts off a bank: {p:?}"),
        }
        if !matches!(p.kind, PieceKind::Run { .. }) {
            assert_eq!(p.to / CHUNK, (p.to + p.extent - 1) / CHUNK, "crosses a chunk: {p:?}");
        }
    }
    let mut spans: Vec<(usize, usize)> = moves.iter().map(|p| (p.to, p.to + p.extent)).collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "destinations overlap: {w:?}");
    }
}

#[test]
fn packing_puts_the_largest_block_into_the_shortest_hole_that_holds_it() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    // Chunk 0: a hole of 64 units at 0 and one of 40 units at 120 (32 from its first bank
    // boundary on).
    w.cover_all_but(0, &[(0, 64), (120, 40)]);
    // Chunk 3: an 8 KiB block (32 units, larger than a bank) and a 2 KiB one (8 units).
    let large = w.block(3, 0, 32, true);
    let small = w.block(3, 32, 8, true);
    let moves = plan_pack(&w.census, &mut w.model);
    check_moves(&w.census, &moves);
    assert_eq!(moves.len(), 2);
    // Best fit: the shorter hole, not the first (64-unit) one, from a bank boundary (the block
    // is larger than a bank); the small block then takes the start of the 64-unit hole.
    assert_eq!(to_of(&moves, large), Some(at(0, 128)));
    assert_eq!(to_of(&moves, small), Some(at(0, 0)));
    assert!(w.model.is_empty(3));
}

#[test]
fn a_block_that_finds_no_hole_below_the_boundary_packs_just_above_it() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    // Chunk 0: five 8-unit holes, each at the start of a bank (40 units, none of 32).
    w.cover_all_but(0, &[(0, 8), (32, 8), (64, 8), (96, 8), (128, 8)]);
    // Chunk 1: units 0..64 free, a 32-unit block at 64, an 8-unit one at 96, the rest taken.
    let large = w.block(1, 64, 32, true);
    let small = w.block(1, 96, 8, true);
    w.cover(1, 104, 152);
    let moves = plan_pack(&w.census, &mut w.model);
    check_moves(&w.census, &moves);
    // The boundary is chunk 0 (its 40 free units cover the 40 movable units above it).
    assert_eq!(to_of(&moves, small), Some(at(0, 0)));
    // The large block fits no hole of chunk 0: it goes to the lowest place above the boundary
    // that ends before its own start.
    assert_eq!(to_of(&moves, large), Some(at(1, 0)));
}

/// Chunk 0: two small blocks at units 0 and 128 (no 128-unit stretch left); chunk 1: a
/// 128-unit block at 0; chunks 2 and 3 free. The packing moves nothing (the large block fits
/// no hole of chunk 0); re-placing every block empties chunk 1.
fn fragmented(w: &mut World) -> (Handle, Handle, Handle) {
    let s1 = w.block(0, 0, 8, true);
    let s2 = w.block(0, 128, 8, true);
    let large = w.block(1, 0, 128, true);
    (s1, s2, large)
}

#[test]
fn a_full_compaction_repacks_when_the_packing_leaves_a_chunk_behind() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    let (s1, s2, large) = fragmented(&mut w);
    let mut packed = w.model.clone();
    assert!(plan_pack(&w.census, &mut packed).is_empty());
    let (moves, after) = plan_full(&w.census, w.model.clone(), false);
    check_moves(&w.census, &moves);
    // Largest first, each to the lowest place: the large block at 0, the small ones after it.
    assert_eq!(to_of(&moves, large), Some(at(0, 0)));
    assert_eq!(to_of(&moves, s1), Some(at(0, 128)));
    assert_eq!(to_of(&moves, s2), Some(at(0, 136)));
    assert!((1..4).all(|c| after.is_empty(c)));
    // The free chunks and, as a block's front, chunk 0's free end from its bank boundary.
    assert_eq!(after.largest_free(), 3 * CHUNK + (256 - 144) * UNIT);
}

#[test]
fn a_full_compaction_for_a_device_slides_every_block_down() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    let (s1, s2, large) = fragmented(&mut w);
    let (moves, after) = plan_full(&w.census, w.model.clone(), true);
    check_moves(&w.census, &moves);
    // In address order, each to the lowest place at or below its own.
    assert_eq!(to_of(&moves, s1), None);
    assert_eq!(to_of(&moves, s2), Some(at(0, 8)));
    assert_eq!(to_of(&moves, large), Some(at(0, 16)));
    assert!(moves.iter().all(|p| p.to <= p.from));
    assert!(after.is_empty(1));
}

#[test]
fn a_full_compaction_keeps_the_packing_when_a_repack_gains_nothing() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    // Chunk 0: a block at 0; chunk 1: a block at 64. Packing moves the second into chunk 0
    // and frees chunks 1 to 3; a repack could do no better.
    let a = w.block(0, 0, 8, true);
    let b = w.block(1, 64, 8, true);
    let (moves, after) = plan_full(&w.census, w.model.clone(), false);
    check_moves(&w.census, &moves);
    assert_eq!(moves.len(), 1);
    assert_eq!(to_of(&moves, a), None);
    assert_eq!(to_of(&moves, b), Some(at(0, 8)));
    // The free chunks and, as a block's front, chunk 0's free end from its bank boundary.
    assert_eq!(after.largest_free(), 3 * CHUNK + (256 - 16) * UNIT);
}

#[test]
fn pinned_blocks_never_move() {
    let arena = arena(4);
    for downward in [false, true] {
        let mut w = World::new(&arena);
        w.block(0, 0, 8, true);
        w.block(0, 120, 8, false);
        w.block(0, 188, 8, false);
        let large = w.block(1, 0, 128, true);
        w.block(2, 0, 8, true);
        let (moves, _) = plan_full(&w.census, w.model.clone(), downward);
        check_moves(&w.census, &moves);
        // The pinned blocks leave no 128-unit stretch in chunk 0: the large block stays.
        assert_eq!(to_of(&moves, large), None);
        // Nor is a chunk with a pinned block evacuated.
        let mut census = w.census.clone();
        let named =
            plan_compaction_moves(&mut census, w.model.clone(), &CompactionMode::Evacuate { chunks: vec![0] }, false);
        assert!(named.err().is_some_and(|e| e.contains("pinned")));
    }
}

#[test]
fn an_incremental_step_evacuates_the_sparsest_chunks_first_within_its_budget() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    // Chunk 0: 64 free units at its start, the rest taken.
    w.cover_all_but(0, &[(0, 64)]);
    // Chunk 1: three 8-unit blocks (6 KiB), chunk 2: one (2 KiB), chunk 3: two (4 KiB).
    let dense: Vec<Handle> = (0..3).map(|k| w.block(1, 8 * k, 8, true)).collect();
    let sparse = w.block(2, 64, 8, true);
    let middle: Vec<Handle> = (0..2).map(|k| w.block(3, 16 * k, 8, true)).collect();
    let mode = CompactionMode::Incremental { max_bytes: 6 << 10 };
    let schedule = plan_compaction_moves(&mut w.census, w.model.clone(), &mode, false).unwrap();
    assert_eq!(schedule.batches.len(), 1);
    let moves = &schedule.batches[0];
    check_moves(&w.census, moves);
    // Chunk 2 first (2 KiB), then chunk 3 (4 KiB): 6 KiB, the budget; chunk 1 waits.
    assert_eq!(to_of(moves, sparse), Some(at(0, 0)));
    assert_eq!(to_of(moves, middle[0]), Some(at(0, 8)));
    assert_eq!(to_of(moves, middle[1]), Some(at(0, 16)));
    assert!(dense.iter().all(|&h| to_of(moves, h).is_none()));
    assert!(moves.iter().map(Piece::copy_len).sum::<usize>() <= 6 << 10);
    assert!(schedule.model.is_empty(2) && schedule.model.is_empty(3));
    assert!(!schedule.model.is_empty(1));
    // A smaller budget moves only what fits: chunk 2's block.
    let mut census = w.census.clone();
    let mode = CompactionMode::Incremental { max_bytes: 3 << 10 };
    let schedule = plan_compaction_moves(&mut census, w.model.clone(), &mode, false).unwrap();
    let moved: Vec<Handle> = schedule.batches.iter().flatten().flat_map(Piece::handles).collect();
    assert_eq!(moved, vec![sparse]);
}

#[test]
fn named_chunks_are_emptied_into_busy_chunks_then_fresh_ones() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    // Chunk 0: 16 free units at 32; chunk 2: a 32-unit block and an 8-unit one.
    w.cover_all_but(0, &[(32, 16)]);
    let large = w.block(2, 0, 32, true);
    let small = w.block(2, 32, 8, true);
    let mode = CompactionMode::Evacuate { chunks: vec![2] };
    let schedule = plan_compaction_moves(&mut w.census, w.model.clone(), &mode, false).unwrap();
    let moves: Vec<Piece> = schedule.batches.concat();
    check_moves(&w.census, &moves);
    // The small block takes the hole of busy chunk 0; the large one fits only a fresh chunk.
    assert_eq!(to_of(&moves, small), Some(at(0, 32)));
    assert_eq!(to_of(&moves, large), Some(at(1, 0)));
    assert!(schedule.model.is_empty(2));
    assert_eq!(schedule.model.chunks[2].role, Role::Free);
    // A chunk that does not exist, or one nothing can empty, is refused.
    let mut census = w.census.clone();
    let bad = CompactionMode::Evacuate { chunks: vec![4] };
    let err = plan_compaction_moves(&mut census, w.model.clone(), &bad, false).err().unwrap();
    assert!(err.contains("does not exist"), "{err}");
    let twice = CompactionMode::Evacuate { chunks: vec![2, 0, 2] };
    let err = plan_compaction_moves(&mut census, w.model.clone(), &twice, false).err().unwrap();
    assert!(err.contains("chunk 2 is named twice"), "{err}");
    let mut full = World::new(&arena);
    for c in 0..3 {
        full.cover(c, 0, 255);
    }
    full.cover(3, 0, 254);
    full.block(3, 254, 2, true);
    let err = plan_compaction_moves(
        &mut full.census,
        full.model.clone(),
        &CompactionMode::Evacuate { chunks: vec![3] },
        false,
    )
    .err()
    .unwrap();
    assert!(err.contains("do not fit"), "{err}");
}

#[test]
fn slab_consolidation_empties_the_sparsest_slab_into_the_densest() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    let objects = w.model.classes[0].objects;
    // Three slabs of chunk 0: one object, two objects, all but two objects taken.
    let sparse = w.slab(0, 0, 0, &[5]);
    w.slab(1, 0, 32, &[0, 1]);
    let dense_live: Vec<u32> = (0..objects).filter(|&j| j != 3 && j != 9).collect();
    w.slab(2, 0, 64, &dense_live);
    let done = consolidate_slabs(&w.census, &w.model);
    assert_eq!(done.emptied, vec![0]);
    assert_eq!(done.moves.len(), 1);
    let piece = &done.moves[0];
    assert!(matches!(piece.kind, PieceKind::SlabObject { .. }));
    assert_eq!(piece.handle, Some(sparse[0]));
    // The densest kept slab's first free object.
    assert_eq!(piece.to, at(0, 64) + w.model.classes[0].offset_of(3));
    check_moves(&w.census, &done.moves);
    // After the batch: the object sits in slab 2, whose object 3 is taken; slab 0 is gone.
    apply_consolidation(&mut w.census, &mut w.model, &done);
    assert_eq!(w.census.slabs.iter().map(|v| v.id).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(w.census.slabs[1].free, 1 << 9);
    assert_eq!(w.census.items(2).last().map(|i| (i.handle, i.offset)), Some((sparse[0], piece.to)));
    assert!(w.census.items(0).is_empty());
    assert_eq!(w.model.find(0, 0, 32, 32, u64::MAX), Some(0));
}

#[test]
fn slab_consolidation_never_moves_into_an_all_free_slab() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    let objects = w.model.classes[0].objects;
    // Slab 0 all free (it goes back before the first batch), slab 1 with one object, slab 2
    // with all but one object taken: only slab 2's free object is room, so slab 1 empties
    // into it and nothing lands in slab 0.
    w.slab(0, 0, 0, &[]);
    let sparse = w.slab(1, 0, 32, &[4]);
    let dense_live: Vec<u32> = (0..objects).filter(|&j| j != 7).collect();
    w.slab(2, 0, 64, &dense_live);
    let done = consolidate_slabs(&w.census, &w.model);
    assert_eq!(done.emptied, vec![1]);
    assert_eq!(done.moves.len(), 1);
    assert_eq!(done.moves[0].handle, Some(sparse[0]));
    assert_eq!(done.moves[0].to, at(0, 64) + w.model.classes[0].offset_of(7));
    // Two objects in two slabs with room only in the all-free one: nothing moves.
    let mut w = World::new(&arena);
    w.slab(0, 0, 0, &[]);
    w.slab(1, 0, 32, &[4]);
    w.slab(2, 0, 64, &(0..objects).collect::<Vec<u32>>());
    let done = consolidate_slabs(&w.census, &w.model);
    assert!(done.moves.is_empty(), "moved into a slab that goes back: {:?}", done.moves);
}

#[test]
fn a_full_compaction_on_host_memory_consolidates_slabs_first_and_plans_on_what_that_leaves() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    // Chunk 0: slab 0 (one object) and slab 1 (all but one taken); chunk 1: slab 2 (two
    // objects, movable as a whole).
    let objects = w.model.classes[0].objects;
    w.slab(0, 0, 0, &[1]);
    w.slab(1, 0, 32, &(1..objects).collect::<Vec<_>>());
    w.slab(2, 1, 0, &[0, 1]);
    let host = plan_compaction_moves(&mut w.census.clone(), w.model.clone(), &CompactionMode::Full, false).unwrap();
    assert_eq!(host.batches.len(), 2);
    assert!(host.batches[0].iter().all(|p| matches!(p.kind, PieceKind::SlabObject { .. })));
    // Slab 0's object fills slab 1; then slab 2 moves whole into the room slab 0 left.
    assert_eq!(host.batches[0].len(), 1);
    assert_eq!(host.batches[0][0].to, at(0, 32));
    let slab_moves: Vec<&Piece> = host.batches[1].iter().filter(|p| matches!(p.kind, PieceKind::Slab { .. })).collect();
    assert_eq!(slab_moves.len(), 1);
    assert_eq!((slab_moves[0].from, slab_moves[0].to), (at(1, 0), at(0, 0)));
    assert!((1..4).all(|c| host.model.is_empty(c)));
    // For a mover (a device): one batch, no consolidation.
    let device = plan_compaction_moves(&mut w.census.clone(), w.model.clone(), &CompactionMode::Full, true).unwrap();
    assert_eq!(device.batches.len(), 1);
    assert!(device.batches[0].iter().all(|p| !matches!(p.kind, PieceKind::SlabObject { .. })));
    for batch in host.batches.iter().chain(&device.batches) {
        check_moves(&w.census, batch);
    }
}

/// An incremental step that empties a chunk of its blocks leaves an all-free slab there until
/// the batch is over: a run does not slide down into that chunk in the same batch.
#[test]
fn a_run_does_not_slide_into_a_chunk_that_keeps_an_all_free_slab_during_the_batch() {
    let arena = arena(6);
    let mut w = World::new(&arena);
    // Chunk 0 full but for 8 units; chunk 1: an all-free slab and an 8-unit block (the sparsest
    // chunk, emptied into chunk 0); chunk 2 free; a run of two chunks at chunks 3 and 4.
    w.cover_all_but(0, &[(128, 8)]);
    w.slab(0, 1, 0, &[]);
    let small = w.block(1, 64, 8, true);
    let run = w.handle();
    w.census.runs.push(item(run, 3 * CHUNK, 2 * CHUNK, 8, Place::Run(2)));
    w.model.set_run(3, 2, true);
    let mode = CompactionMode::Incremental { max_bytes: 8 * CHUNK };
    let schedule = plan_compaction_moves(&mut w.census, w.model.clone(), &mode, false).unwrap();
    assert_eq!(schedule.batches.len(), 1);
    let moves = &schedule.batches[0];
    check_moves(&w.census, moves);
    assert_eq!(to_of(moves, small), Some(at(0, 128)), "the block leaves chunk 1");
    // The run slides only onto chunks that are free during the batch: chunk 2 and its own.
    assert_eq!(to_of(moves, run), Some(2 * CHUNK));
}

/// A run that an incremental step slides down into a chunk the same step emptied keeps that
/// chunk in the step's model: the model after the step (what the plan predicts from) has the
/// run where it goes and the chunk it left free.
#[test]
fn a_run_slid_into_a_chunk_the_step_emptied_keeps_it_in_the_model() {
    let arena = arena(6);
    let mut w = World::new(&arena);
    // Chunk 0 full but for 8 units; chunk 1: one 8-unit block (the sparsest chunk, emptied
    // into chunk 0); a run of two chunks at chunks 2 and 3.
    w.cover_all_but(0, &[(128, 8)]);
    let small = w.block(1, 64, 8, true);
    let run = w.handle();
    w.census.runs.push(item(run, 2 * CHUNK, 2 * CHUNK, 8, Place::Run(2)));
    w.model.set_run(2, 2, true);
    let mode = CompactionMode::Incremental { max_bytes: 8 * CHUNK };
    let schedule = plan_compaction_moves(&mut w.census, w.model.clone(), &mode, false).unwrap();
    let moves = &schedule.batches[0];
    check_moves(&w.census, moves);
    assert_eq!(to_of(moves, small), Some(at(0, 128)), "the block leaves chunk 1");
    assert_eq!(to_of(moves, run), Some(CHUNK), "the run slides into chunk 1");
    let roles: Vec<Role> = (0..4).map(|c| schedule.model.chunks[c].role).collect();
    assert_eq!(roles, [Role::Core, Role::Run, Role::Run, Role::Free]);
}

#[test]
fn runs_move_down_into_empty_chunks() {
    let arena = arena(6);
    let mut w = World::new(&arena);
    w.cover(0, 0, 256);
    // A run of two chunks at chunks 3 and 4, chunks 1, 2 and 5 free.
    let handle = w.handle();
    w.census.runs.push(item(handle, 3 * CHUNK, 2 * CHUNK, 8, Place::Run(2)));
    w.model.set_run(3, 2, true);
    assert!(matches!(arena.geometry.layout(2 * CHUNK, 1), Layout::Run { chunks: 2, .. }));
    let moves = plan_pack(&w.census, &mut w.model);
    check_moves(&w.census, &moves);
    assert_eq!(to_of(&moves, handle), Some(CHUNK));
    assert!(w.model.is_empty(3) && w.model.is_empty(4));
}

/// A block with a front takes the longest front the free end of a chunk allows below the
/// block's size (on a bank), so its tail is the shortest and the rest of that free end stays for
/// other blocks; a free chunk may hold the front too. A front that must start later makes a
/// longer tail, and a tail needs the free start of the next chunk.
#[test]
fn a_block_with_a_front_takes_the_longest_front_below_its_size() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    w.cover(0, 0, 100);
    let size = 40 * UNIT + 10;
    let piece = Piece {
        kind: PieceKind::Run { chunks: 0 },
        handle: None,
        size,
        align: 64,
        core: 0,
        from: at(3, 0),
        to: at(3, 0),
        extent: size.next_multiple_of(UNIT),
    };
    let g = &arena.geometry;
    // 224 is the first bank from which 32 units (8 KiB) hold less than the block: 9 units of
    // tail in chunk 1.
    assert_eq!(front_fits(&w.model, &piece, 0), Some(FrontLayout { chunk: 0, start: 224, chunks: 0, tail_units: 9 }));
    assert_eq!(front_fits(&w.model, &piece, 1).map(|f| (f.start, f.tail_units)), Some((224, 9)), "a free chunk");
    w.cover(0, 100, 140);
    let f = front_fits(&w.model, &piece, 0).unwrap();
    assert_eq!((f.start, f.tail_units), (240, 25));
    assert_eq!(f.bytes(g), size.next_multiple_of(UNIT), "it holds as many bytes wherever it goes");
    w.cover(1, 0, 1);
    assert_eq!(front_fits(&w.model, &piece, 0), None, "the tail's place is taken");
}

/// A census read while the pool ran can hold a slab record read while its slab was given back
/// and another made there: a view overlapping a live slab and off the class's alignment, and
/// an object found through the directory that is no object of its slab's view. Settled, such
/// slabs and objects are gone, and the consolidation of a full compaction plans on the rest.
/// (Unsettled, the object of slab 0 goes to a free object of slab 1 past the torn view's base;
/// looked up in the torn view, that destination is no object, and the planner panicked.)
#[test]
fn a_census_read_while_slabs_changed_settles_before_planning() {
    let arena = arena(4);
    let mut w = World::new(&arena);
    let class = w.model.classes[0].clone();
    let sparse = w.slab(0, 0, 0, &[5]);
    w.slab(1, 0, 32, &(0..9).collect::<Vec<u32>>());
    w.census.slabs.push(SlabView { id: 2, class: 0, base: at(0, 49), bytes: class.slab_bytes, owner: 0, free: 0 });
    w.slab(3, 1, 0, &(0..class.objects).collect::<Vec<u32>>());
    let stray = w.handle();
    let slab = SlabRef { id: 3, class: 0, owner: 0 };
    w.census.add_object(slab, item(stray, at(1, 0) + class.size / 2, class.size, 9, Place::Object(3)));
    w.census.slabs.sort_by_key(|v| v.base);
    w.census.settle_slabs(&arena.geometry, &arena.classes.classes);
    assert_eq!(w.census.slabs.iter().map(|v| v.id).collect::<Vec<_>>(), vec![0, 3]);
    assert!(w.census.items(1).is_empty() && w.census.items(2).is_empty());
    assert_eq!(w.census.items(0).iter().map(|i| i.handle).collect::<Vec<_>>(), sparse);
    assert!(w.census.items(3).iter().all(|i| i.handle != stray), "the stray object is left out");
    assert_eq!(w.census.items(3).len(), class.objects as usize);
    plan_compaction_moves(&mut w.census, w.model.clone(), &CompactionMode::Full, false).unwrap();
}

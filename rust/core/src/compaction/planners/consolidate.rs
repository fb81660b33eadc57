//! Slab consolidation: per size class, the objects of the sparsest slabs move into the free
//! objects of the others, as long as they fit; the emptied slabs go back to the buddy pool.
//! Then what the census and the model are after that batch, for the moves planned after it.

use std::cmp::Reverse;
use std::collections::HashSet;

use super::super::census::Census;
use super::super::model::{Model, Role};
use super::super::piece::Piece;
use super::movable::{block_piece, slab_movable};
use crate::arena::slab::caches::{SlabRef, SlabView};

/// A slab consolidation: the moves, and the slabs they empty (every object of each, in order,
/// is one move, slab after slab).
#[derive(Debug, Default)]
pub(crate) struct Consolidation {
    pub(crate) moves: Vec<Piece>,
    pub(crate) emptied: Vec<u32>,
}

/// Plan a slab consolidation of the census.
pub(crate) fn consolidate_slabs(census: &Census, model: &Model) -> Consolidation {
    let mut out = Consolidation::default();
    for (k, class) in model.classes.iter().enumerate() {
        let all_free = class.objects_mask();
        // All-free slabs go back to the buddy pool before the first batch: they hold nothing to
        // move and are no room to move into.
        let views: Vec<&SlabView> =
            census.slabs.iter().filter(|v| v.class == k && v.free & all_free != all_free).collect();
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
        slabs.sort_by_key(|&(v, live, movable)| (!movable, live, Reverse(v.base)));
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
        kept.sort_by_key(|&(v, live)| (Reverse(live), v.base));
        let mut targets = kept.iter().flat_map(|&(v, _)| {
            (0..class.objects).filter(move |j| v.free & (1 << j) != 0).map(move |j| v.base + class.offset_of(j))
        });
        for &(v, _, _) in &slabs[..emptied] {
            out.emptied.push(v.id);
            for item in census.items(v.id) {
                let mut piece = block_piece(census, model, item).expect("a census block is where its handle says");
                piece.to = targets.next().expect("the kept slabs have room for every moved object");
                out.moves.push(piece);
            }
        }
    }
    out
}

/// Bring `census` and `model` to the arena after `done` ran and the pool reclaimed what it
/// could (every all-free slab goes back to the buddy pool, every empty core chunk to the global
/// pool): the moved objects sit in their new slabs, those slabs' free objects are taken, and
/// the emptied and all-free slabs are gone. Returns the buddy blocks (base, bytes) of those
/// slabs, which the pool gives back before the next batch.
pub(crate) fn apply_consolidation(census: &mut Census, model: &mut Model, done: &Consolidation) -> Vec<(usize, usize)> {
    let g = model.geometry;
    // The live slabs by base, to find the slab a destination lies in.
    let mut by_base: Vec<usize> = (0..census.slabs.len()).collect();
    by_base.sort_unstable_by_key(|&i| census.slabs[i].base);
    let mut moves = done.moves.iter();
    for &id in &done.emptied {
        let items = census.objects.get_mut(id as usize).map(std::mem::take).unwrap_or_default();
        for mut item in items {
            let piece = moves.next().expect("one move per object of an emptied slab");
            debug_assert_eq!(piece.handle, Some(item.handle));
            let at = by_base.partition_point(|&i| census.slabs[i].base <= piece.to) - 1;
            let view = &mut census.slabs[by_base[at]];
            let class = &model.classes[view.class];
            let j = class.index_of(piece.to - view.base).expect("a destination is an object of a slab");
            view.free &= !(1u64 << j);
            item.offset = piece.to;
            let slab = SlabRef { id: view.id, class: view.class, owner: view.owner };
            census.add_object(slab, item);
        }
    }
    let classes = model.classes;
    let emptied: HashSet<u32> = done.emptied.iter().copied().collect();
    let mut gone = Vec::new();
    census.slabs.retain(|v| {
        let all_free = classes[v.class].objects_mask();
        let stays = v.free & all_free != all_free && !emptied.contains(&v.id);
        if !stays {
            gone.push((v.base, v.bytes));
        }
        stays
    });
    for &(base, bytes) in &gone {
        let (chunk, units) = (g.chunk_of(base), (bytes >> g.unit_shift) as u64);
        model.vacate(chunk, g.unit_in_chunk(base), units);
        if let Some(covered) = census.covered.get_mut(chunk) {
            *covered = covered.saturating_sub(units);
        }
    }
    for c in 0..model.chunks.len() {
        if model.chunks[c].role == Role::Core && model.chunks[c].used == 0 {
            model.set_run(c, 1, false);
        }
    }
    gone
}

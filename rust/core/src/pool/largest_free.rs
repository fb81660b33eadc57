//! The statistics' largest free block: the largest request one allocation could get now
//! (`PoolStats::largest_free_block`, see [`Pool::largest_free_block`]).
//!
//! Each free place counts as the largest request the allocator lays out there, so the figure
//! is exact, but a core chunk's places are known only from a read of its whole tree. Most
//! chunks cannot matter: no place inside a chunk holds more than its free units, nor one
//! across two chunks more than their free units together. So the free chunk runs come first
//! (their ends read from the core chunks around them, inwards to the first allocated unit),
//! then the core chunks with the most free units, and a chunk's tree is read whole only while
//! its free units could pass the largest request found so far.

use std::collections::HashMap;

use crate::arena::buddy::Node;
use crate::arena::global::ChunkState;
use crate::arena::largest::FreeStretches;
use crate::arena::stretches::granule_shift;
use crate::pool::pool::Pool;

/// How much of the arena a computation of the largest free block reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// A core chunk's tree whole only where its free units could pass the largest request
    /// found so far.
    Pruned,
    /// Every core chunk's tree whole (the tests compare the two).
    #[cfg(all(test, not(loom)))]
    Every,
}

/// The largest aligned power of two of units inside one of `holes` (`[from, to)` in units)
/// that starts on a multiple of `align` units: the largest free node of a tree whose free units
/// they are that a request at that alignment can take.
fn largest_node_in(holes: &[(u64, u64)], align: u64) -> u64 {
    let mut best = 0u64;
    for &(from, to) in holes {
        let len = to - from;
        if len <= best {
            continue;
        }
        // An aligned node of half the largest power of two within the length always fits.
        let mut units = 1u64 << (63 - len.leading_zeros());
        while units > best {
            if from.next_multiple_of(units.max(align)) + units <= to {
                best = units;
                break;
            }
            units >>= 1;
        }
    }
    best
}

/// What one computation knows of the arena's core chunks. Only those: an arena of millions of
/// chunks, most of them free, costs no memory per chunk.
struct Places<'a> {
    pool: &'a Pool,
    /// The nodes that an allocation takes back before it fails, by chunk.
    reclaimable: HashMap<usize, Vec<Node>>,
    /// The core chunks that are not effectively empty, in address order, with their free units
    /// (the reclaimable nodes counted free).
    room: Vec<(usize, u64)>,
    /// The core chunks that hold only what an allocation reclaims before it fails, in address
    /// order: they count as free chunks.
    emptied: Vec<usize>,
    /// The free stretches of the core chunks whose trees were read whole.
    read: HashMap<usize, FreeStretches>,
    /// The largest request a place inside one of those chunks holds.
    inside: usize,
}

impl<'a> Places<'a> {
    fn new(pool: &'a Pool) -> Places<'a> {
        let arena = &pool.arena;
        let g = &arena.geometry;
        let reclaimable = pool.reclaimable_nodes();
        let (mut room, mut emptied) = (Vec::new(), Vec::new());
        for (core, owner) in arena.cores.iter().enumerate() {
            for chunk in owner.owned() {
                if arena.global.state(chunk) != ChunkState::Core(core) {
                    continue;
                }
                let extra: u64 =
                    reclaimable.get(&chunk).map_or(0, |nodes| nodes.iter().map(|n| n.units(g.depth)).sum());
                match arena.lines[chunk].space.free_units() + extra {
                    units if units == g.usable_units(chunk) => emptied.push(chunk),
                    units => room.push((chunk, units)),
                }
            }
        }
        room.sort_unstable();
        emptied.sort_unstable();
        Places { pool, reclaimable, room, emptied, read: HashMap::new(), inside: 0 }
    }

    /// Whether `chunk` is a core chunk that is not effectively empty.
    fn has_room(&self, chunk: usize) -> bool {
        self.room.binary_search_by_key(&chunk, |&(c, _)| c).is_ok()
    }

    /// Read core chunk `chunk`'s tree whole: the largest request a place inside it holds (its
    /// largest free node, its free stretches) counts in [`Places::inside`], its stretches are
    /// kept for [`Places::ends`].
    fn read_whole(&mut self, chunk: usize) {
        let pool = self.pool;
        let g = &pool.arena.geometry;
        let nodes = self.reclaimable.get(&chunk);
        let inside_reclaimable = |n: Node| {
            let (start, units) = (n.start(g.depth), n.units(g.depth));
            nodes.is_some_and(|ns| {
                ns.iter().any(|r| start >= r.start(g.depth) && start + units <= r.start(g.depth) + r.units(g.depth))
            })
        };
        let holes = pool.free_holes(chunk, &inside_reclaimable);
        let usable = g.usable_units(chunk);
        // The tree's own search where reclaimable nodes count free or the chunk is the
        // arena's short last one; elsewhere the holes say it.
        let node_units = match nodes.is_some() || usable != g.units_per_chunk() {
            true => {
                let is_reclaimable = |n: Node| nodes.is_some_and(|ns| ns.contains(&n));
                let level = pool.arena.shape.largest_free_level_with(pool.arena.tree(chunk), &is_reclaimable);
                // A node smaller than the default alignment serves only where it starts on it.
                match level.map_or(0, |level| 1u64 << (g.depth - level)) {
                    units if units < g.align_units => largest_node_in(&holes, g.align_units),
                    units => units,
                }
            }
            false => largest_node_in(&holes, g.align_units),
        };
        let free = g.free_stretches(holes.into_iter(), usable);
        self.read.insert(chunk, free);
        self.inside = self.inside.max(node_units as usize * g.min_block).max(free.largest_request(g));
    }

    /// The free units at the start and at the end of core chunk `chunk` (not effectively
    /// empty), as a read of its whole tree counts them (`Geometry::free_stretches`): from that
    /// read if made, else read inwards from each end to the first allocated unit where no
    /// reclaimable node can count free and the chunk is whole.
    fn ends(&mut self, chunk: usize) -> (u64, u64) {
        if let Some(s) = self.read.get(&chunk) {
            return (s.at_start, s.at_end);
        }
        let arena = &self.pool.arena;
        let g = &arena.geometry;
        let upc = g.units_per_chunk();
        if self.reclaimable.contains_key(&chunk) || g.usable_units(chunk) != upc {
            self.read_whole(chunk);
            let s = self.read[&chunk];
            return (s.at_start, s.at_end);
        }
        let granule = 1u64 << granule_shift(g.depth);
        let tree = arena.tree(chunk);
        let (_, first_allocated) = arena.shape.free_run_around(tree, 0, 0);
        let (past_last_allocated, _) = arena.shape.free_run_around(tree, upc, upc);
        let at_start = first_allocated.min(upc) & !(granule - 1);
        let front_start = past_last_allocated.next_multiple_of(granule).next_multiple_of(g.banked_start_units());
        (at_start, upc.saturating_sub(front_start))
    }
}

impl Pool {
    /// The largest request one allocation could get now, counting what an allocation would
    /// reclaim before failing (all-free slabs and chunks that cores hold empty): the largest
    /// free chunk run (with the front and tail the core chunks around it could add, the run
    /// at the arena's end too), and in the core chunks the largest free node, the largest
    /// block of at most a bank at its enclosing node's start, and the longest free stretch from
    /// a bank boundary (where a block larger than a bank may start), and, with `run_tails`, the
    /// free end of a core chunk joined to the free start of the next one (a block with a
    /// front), and the free end of a core chunk that the reclaim would empty before the free
    /// chunks or the core chunk after it (the allocator's first try, before it reclaims).
    /// Each place counts as the largest request whose layout the allocator places there
    /// (`Geometry::largest_request_in_stretch`, `Geometry::largest_banked_buddy_in`,
    /// `Geometry::largest_request_in_run`, `Geometry::largest_request_across`; a block with a
    /// front is its request rounded up to a unit), so that a request of that size succeeds
    /// while nothing changes, and a larger one fails except where a free object of a slab of the
    /// calling thread's core holds it (slab space is no free bytes, and only that core's
    /// threads take from its slabs). Trees are read as `reads` says (see the module
    /// documentation).
    pub(crate) fn largest_free_block(&self, reads: Reads) -> usize {
        self.largest_free_block_and_reads(reads).0
    }

    /// [`Pool::largest_free_block`] and the number of trees it read whole.
    fn largest_free_block_and_reads(&self, reads: Reads) -> (usize, usize) {
        let g = &self.arena.geometry;
        let upc = g.units_per_chunk();
        let mut places = Places::new(self);
        let end = self.arena.global.end();
        #[cfg(all(test, not(loom)))]
        if reads == Reads::Every {
            for i in 0..places.room.len() {
                places.read_whole(places.room[i].0);
            }
        }
        let mut largest = 0;
        // The free chunk runs, with the tail and the front the core chunks around could add.
        let runs = self.arena.global.free_runs(&places.emptied);
        for run in runs {
            let (before, after) = (run.start.checked_sub(1), run.start + run.len);
            let tail_room = match g.tails && places.has_room(after) {
                true => places.ends(after).0,
                false => 0,
            };
            let front = match before.filter(|&c| g.tails && g.usable_units(c) == upc && places.has_room(c)) {
                Some(c) => places.ends(c).1,
                None => 0,
            };
            largest =
                largest.max(g.largest_request_in_run((run.start, run.len), front as usize * g.min_block, tail_room));
        }
        // A core chunk that holds only what an allocation reclaims before it fails counts as
        // a free chunk above, as that reclaim leaves it. Until then its tree is as it is, and
        // a block with a front may start in its free end (`Arena::front_start`): before the
        // free chunks after it or in the free start of the core chunk after it, as the
        // allocator reads them now. That may hold more than the free chunks it would join: a
        // block with a front holds its request rounded up to a unit, a run of whole chunks or
        // a tail only some sizes.
        let reclaimed = places.emptied.iter().copied().filter(|c| g.tails && places.reclaimable.contains_key(c));
        for chunk in reclaimed {
            let Some(start) = self.arena.front_start(chunk, g.banked_start_units()) else { continue };
            let next = chunk + 1;
            let held = match self.arena.global.state(next) {
                ChunkState::Free => {
                    let len = (next..end).take_while(|&c| self.arena.global.state(c) == ChunkState::Free).count();
                    let front = (upc - start) as usize * g.min_block;
                    g.largest_request_in_run((next, len), front, self.arena.tail_room_at(next + len))
                }
                ChunkState::Core(_) => g.largest_request_across(chunk, start, self.arena.tail_room_at(next)),
                _ => 0,
            };
            largest = largest.max(held);
        }
        // Inside the core chunks, those with the most free units first: none holds more than
        // its free units.
        let mut by_room: Vec<(u64, usize)> = places.room.iter().map(|&(chunk, units)| (units, chunk)).collect();
        by_room.sort_unstable_by(|a, b| b.cmp(a));
        for (units, chunk) in by_room {
            if reads == Reads::Pruned && units as usize * g.min_block <= largest.max(places.inside) {
                break;
            }
            if !places.read.contains_key(&chunk) {
                places.read_whole(chunk);
            }
        }
        largest = largest.max(places.inside);
        // With `run_tails`, the free end of a core chunk joined to the free start of the next:
        // a block larger than a bank that crosses their boundary, with a front, reserves its
        // request rounded up to a unit, no more than the two chunks' free units.
        for i in 1..places.room.len() {
            let ((before, first), (chunk, second)) = (places.room[i - 1], places.room[i]);
            if before + 1 != chunk || (reads == Reads::Pruned && (first + second) as usize * g.min_block <= largest) {
                continue;
            }
            let at_end = places.ends(before).1;
            if at_end > 0 {
                let at_start = places.ends(chunk).0;
                largest = largest.max(g.largest_request_across(before, upc - at_end, at_start));
            }
        }
        // A chunk read for its ends in the loop above.
        (largest.max(places.inside), places.read.len())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{largest_node_in, Places, Reads};
    use crate::arena::stretches::tests::Rng;
    use crate::config::{Backing, PoolConfig};
    use crate::pool::pool::Pool;

    #[test]
    fn the_largest_node_in_holes_is_the_largest_aligned_power_of_two() {
        assert_eq!(largest_node_in(&[], 1), 0);
        assert_eq!(largest_node_in(&[(0, 1)], 1), 1);
        assert_eq!(largest_node_in(&[(1, 4)], 1), 2);
        assert_eq!(largest_node_in(&[(3, 11)], 1), 4);
        assert_eq!(largest_node_in(&[(3, 11), (16, 32)], 1), 16);
        assert_eq!(largest_node_in(&[(5, 13), (17, 23)], 1), 4);
        // At an alignment of 4 and of 8 units, nodes start on multiples of it.
        assert_eq!(largest_node_in(&[(1, 4)], 4), 0);
        assert_eq!(largest_node_in(&[(1, 5)], 4), 1);
        assert_eq!(largest_node_in(&[(3, 11)], 8), 2);
        assert_eq!(largest_node_in(&[(3, 11), (16, 32)], 8), 16);
        // Against a brute force over every hole of a small range.
        for from in 0..64u64 {
            for to in from + 1..=64 {
                let brute = (0..7).rev().map(|k| 1u64 << k).find(|&n| (from..to).any(|s| s % n == 0 && s + n <= to));
                assert_eq!(largest_node_in(&[(from, to)], 1), brute.unwrap(), "[{from}, {to})");
            }
        }
    }

    /// On random pools of many chunks (small and large blocks, frees, cached blocks and
    /// all-free slabs), the pruned computation gives the figure of the one that reads every
    /// tree, and each core chunk's ends read inwards agree with its whole tree's.
    #[test]
    fn pruned_reads_give_the_figure_of_reading_every_tree() {
        let (mut pruned_reads, mut every_reads) = (0, 0);
        for seed in 0..24u64 {
            let mut rng = Rng::new(0x5EED_0000 + seed);
            let chunk = [64 << 10, 256 << 10, 2 << 20][(rng.next() % 3) as usize];
            let chunks = 16 + (rng.next() % 48) as usize;
            let short = if rng.next() % 3 == 0 { chunk / 2 } else { 0 };
            let config = PoolConfig::new(chunks * chunk + short)
                .cores(1 + (rng.next() % 3) as usize)
                .chunk_size(chunk)
                .run_tails(rng.next() % 4 != 0)
                .min_block([64, 256][(rng.next() % 2) as usize])
                .backing(Backing::None);
            let p = Pool::new(config).unwrap();
            let mut held = Vec::new();
            let full = rng.next() % 2 == 0;
            for step in 0..3000 {
                if !held.is_empty() && rng.next() % 100 < if full { 10 } else { 45 } {
                    let i = (rng.next() as usize) % held.len();
                    p.free(held.swap_remove(i)).unwrap();
                } else {
                    let size = match rng.next() % 4 {
                        0 => 64 + (rng.next() % 4096) as usize,
                        1 => 4096 + (rng.next() % (64 << 10)) as usize,
                        2 => 64 + (rng.next() % chunk as u64) as usize,
                        _ => chunk / 2 + (rng.next() % (3 * chunk as u64)) as usize,
                    };
                    if let Ok(h) = p.alloc(size, None, 0) {
                        held.push(h);
                    }
                }
                if step % 150 == 149 {
                    let what = format!("seed {seed}, step {step}, {chunks} chunks of {chunk} B");
                    let (pruned, read) = p.largest_free_block_and_reads(Reads::Pruned);
                    let (every, all) = p.largest_free_block_and_reads(Reads::Every);
                    assert_eq!(pruned, every, "{what}");
                    (pruned_reads, every_reads) = (pruned_reads + read, every_reads + all);
                    let mut places = Places::new(&p);
                    for i in 0..places.room.len() {
                        let c = places.room[i].0;
                        {
                            let inwards = places.ends(c);
                            places.read_whole(c);
                            assert_eq!(inwards, places.ends(c), "{what}: chunk {c}");
                            // The largest free node from the holes, as the tree's own search
                            // finds it where nothing reclaimable counts free.
                            if !places.reclaimable.contains_key(&c) {
                                let a = p.arena();
                                let level = a.shape.largest_free_level(a.tree(c));
                                let from_tree = level.map_or(0, |l| 1u64 << (a.geometry.depth - l));
                                assert_eq!(
                                    largest_node_in(&p.free_holes(c, &|_| false), 1),
                                    from_tree,
                                    "{what}: chunk {c}"
                                );
                            }
                        }
                    }
                }
            }
            for h in held {
                p.free(h).unwrap();
            }
        }
        // The pools were full enough for most trees to go unread.
        assert!(pruned_reads * 4 < every_reads, "{pruned_reads} trees read of {every_reads}");
    }
}

//! The raw API's marks on the pool's paths: `Pool::alloc_raw` marks the block it placed, and
//! `Pool::free_raw` checks the block against its marks, takes them, then releases it (the
//! marks themselves: `arena/raw_marks.rs`). Blocks with a handle never come here.

use crate::arena::front::FrontLayout;
use crate::arena::global::ChunkState;
use crate::arena::layout::Layout;
use crate::arena::raw_marks::{later_pieces, NOT_A_RAW_START};
use crate::error::{Error, Result};
use crate::pool::alloc::Placed;
use crate::pool::free::Released;
use crate::pool::pool::Pool;
use std::iter::empty;

/// The error for a raw free the marks or the release refused (out of line).
#[cold]
fn refused(offset: usize, size: usize, reason: &'static str) -> Error {
    Error::InvalidBlock { offset, size, reason }
}

impl Pool {
    /// Mark the block `placed` of the raw API: its object bit (a slab object) or its bounds.
    #[inline(always)]
    pub(crate) fn mark_raw(&self, placed: &Placed) {
        let a = &self.arena;
        if placed.class.is_some() {
            let slab = a.slabs.lookup(placed.offset).expect("a slab object just placed has its slab");
            let class = &a.slabs.classes.classes[slab.class];
            let j = class.index_of(placed.offset & (class.slab_bytes - 1)).expect("an object just placed");
            a.raw.mark_object(slab.id, j);
            return;
        }
        let shift = a.geometry.unit_shift;
        let first = (placed.offset >> shift) as u64;
        a.raw.mark_block(first, first + (placed.block_bytes >> shift) as u64 - 1);
    }

    /// Release the raw block at `offset` of `size` requested bytes: checked against its marks,
    /// which are taken before anything is released and put back when the release refuses.
    #[inline(always)]
    pub(crate) fn release_raw(&self, offset: usize, size: usize) -> Result<Released> {
        let a = &self.arena;
        if let Some(slab) = a.slabs.lookup(offset) {
            let class = &a.slabs.classes.classes[slab.class];
            if size > class.size {
                return Err(refused(offset, size, "a slab object is smaller than this"));
            }
            let Some(j) = class.index_of(offset & (class.slab_bytes - 1)) else {
                return Err(refused(offset, size, "not the start of a slab object"));
            };
            if !a.raw.take_object(slab.id, j) {
                return Err(refused(offset, size, NOT_A_RAW_START));
            }
            return match a.slabs.free(slab, offset, a) {
                Ok(freed) => Ok(Released::Slab(freed.class)),
                Err(reason) => {
                    a.raw.restore_object(slab.id, j);
                    Err(refused(offset, size, reason))
                }
            };
        }
        self.release_raw_block(offset, size)
    }

    /// [`Pool::release_raw`] of a buddy block, a run, or a block with a tail or a front.
    #[inline(never)]
    fn release_raw_block(&self, offset: usize, size: usize) -> Result<Released> {
        let a = &self.arena;
        let g = &a.geometry;
        let chunk = g.chunk_of(offset);
        if chunk >= g.chunks || offset & (g.min_block - 1) != 0 {
            return Err(refused(offset, size, "not the start of a block"));
        }
        let first = (offset >> g.unit_shift) as u64;
        let state = a.global.state(chunk);
        // The last unit the size implies, and the check of the shape's later pieces.
        let taken = match state {
            ChunkState::Core(owner) => {
                let within = g.unit_in_chunk(offset);
                match g.layout(size, 1) {
                    Layout::Buddy(b) if within + b.units <= g.units_per_chunk() => {
                        // The buddy block: `Arena::release_buddy` with its checks done here.
                        let last = first + b.units - 1;
                        if let Err(reason) = a.raw.take_block(first, last, later_pieces(first, b.units)) {
                            return Err(refused(offset, size, reason));
                        }
                        return match a.give_back_buddy(chunk, owner, &b, within) {
                            Ok(()) => Ok(Released::Block((b.units as usize) << g.unit_shift)),
                            Err(reason) => {
                                a.raw.restore_block(first, last);
                                Err(refused(offset, size, reason))
                            }
                        };
                    }
                    _ => match FrontLayout::of(g, offset, size) {
                        Some(f) => a.raw.take_block(first, first + (f.bytes(g) >> g.unit_shift) as u64 - 1, empty()),
                        None => Err("not the start of a block of this size"),
                    },
                }
            }
            ChunkState::RunHead(len) => {
                a.raw.take_block(first, first + (g.run_bytes(chunk, len) >> g.unit_shift) as u64 - 1, empty())
            }
            ChunkState::TailedRunHead(len) => match g.layout(size, 1) {
                Layout::RunTail { tail, .. } => {
                    let base = ((chunk + len) as u64) << g.depth;
                    a.raw.take_block(first, base + tail.units - 1, later_pieces(base, tail.units))
                }
                _ => Err("a chunk run with a tail starts there, but a block of this size has none"),
            },
            ChunkState::Free | ChunkState::RunBody | ChunkState::FrontedRun { .. } | ChunkState::Absent => {
                Err("no block starts in this chunk")
            }
        };
        if let Err(reason) = taken {
            return Err(refused(offset, size, reason));
        }
        self.release_raw_large(offset, size, state)
    }

    /// Release a run, a run with a tail or a block with a front whose marks were taken; put
    /// them back when the release refuses.
    #[cold]
    fn release_raw_large(&self, offset: usize, size: usize, state: ChunkState) -> Result<Released> {
        let a = &self.arena;
        let g = &a.geometry;
        let chunk = g.chunk_of(offset);
        let first = (offset >> g.unit_shift) as u64;
        let released = match state {
            ChunkState::RunHead(len) => a.release_run(offset, size, chunk, len),
            ChunkState::TailedRunHead(len) => a.release_tailed_run(offset, size, chunk, len),
            _ => a.release_buddy(offset, size),
        };
        match released {
            Ok(bytes) => Ok(Released::Block(bytes)),
            Err(err) => {
                let bytes = match (state, g.layout(size, 1)) {
                    (ChunkState::RunHead(len), _) => g.run_bytes(chunk, len),
                    (ChunkState::TailedRunHead(len), Layout::RunTail { tail, .. }) => {
                        a.tailed_run_bytes(chunk, len, &tail)
                    }
                    _ => FrontLayout::of(g, offset, size).map_or(0, |f| f.bytes(g)),
                };
                a.raw.restore_block(first, first + (bytes >> g.unit_shift) as u64 - 1);
                Err(err)
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::config::PoolConfig;
    use crate::error::Error;
    use crate::pool::pool::Pool;

    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;

    fn pool() -> Pool {
        Pool::new(PoolConfig::new(64 * MIB).cores(1)).unwrap()
    }

    /// `free_raw(offset, size)` is refused with `InvalidBlock`, and the pool is as it was.
    fn refused(pool: &Pool, offset: usize, size: usize) {
        let (free, live) = (pool.bytes_free(), pool.check().unwrap());
        match pool.free_raw(offset, size) {
            Err(Error::InvalidBlock { .. }) => {}
            other => panic!("free_raw({offset}, {size}) gave {other:?}"),
        }
        assert_eq!(pool.bytes_free(), free, "free_raw({offset}, {size}) changed the free bytes");
        assert_eq!(pool.check().unwrap(), live);
    }

    /// Every block can be freed with its own size, and then the pool is empty.
    fn free_all(pool: &Pool, blocks: &[(usize, usize)]) {
        for &(offset, size) in blocks {
            pool.free_raw(offset, size).unwrap();
        }
        pool.check().unwrap();
        assert!(pool.arena.raw.starts().is_empty(), "no raw mark stays behind");
    }

    #[test]
    fn a_size_too_small_is_refused() {
        let pool = pool();
        // 300 KiB takes 304 KiB: the nodes of 256 KiB, 32 KiB and 16 KiB (the first two match
        // smaller sizes).
        let a = pool.alloc_raw(300 * KIB, None).unwrap();
        for wrong in [256 * KIB, 288 * KIB, 257 * KIB, 16 * KIB, 320 * KIB] {
            refused(&pool, a, wrong);
        }
        free_all(&pool, &[(a, 300 * KIB)]);
    }

    #[test]
    fn a_size_that_reaches_into_the_next_block_is_refused() {
        let pool = pool();
        let a = pool.alloc_raw(256 * KIB, None).unwrap();
        let mut blocks = vec![(a, 256 * KIB)];
        // A neighbour of 32 KiB right after it: 288 KiB at `a` names both blocks' nodes.
        let next = loop {
            let b = pool.alloc_raw(32 * KIB, None).unwrap();
            blocks.push((b, 32 * KIB));
            if b == a + 256 * KIB {
                break b;
            }
        };
        refused(&pool, a, 288 * KIB); // too large by one piece
        refused(&pool, a, 32 * KIB); // the size of the neighbour
        refused(&pool, next, 256 * KIB);
        refused(&pool, a + 128 * KIB, 128 * KIB); // an offset inside the block
                                                  // The neighbour with a handle: the same size reaches into a block with no marks.
        pool.free_raw(next, 32 * KIB).unwrap();
        blocks.retain(|&(o, _)| o != next);
        let (h, at) = pool.alloc_with_offset(32 * KIB, None, 0).unwrap();
        assert_eq!(at, next, "the freed neighbour's place is taken again");
        refused(&pool, a, 288 * KIB);
        refused(&pool, at, 32 * KIB); // a block with a handle
        pool.free(h).unwrap();
        free_all(&pool, &blocks);
    }

    #[test]
    fn an_offset_inside_a_block_is_refused_where_its_pieces_match() {
        let pool = pool();
        let a = pool.alloc_raw(300 * KIB, None).unwrap();
        // The last two nodes of the block make a block of 48 KiB at their start.
        refused(&pool, a + 256 * KIB, 48 * KIB);
        refused(&pool, a + 288 * KIB, 16 * KIB);
        free_all(&pool, &[(a, 300 * KIB)]);
    }

    #[test]
    fn a_block_with_a_handle_is_refused() {
        let pool = pool();
        for size in [100, 3000, 300 * KIB, 3 * MIB, 5 * MIB / 2] {
            let (h, offset) = pool.alloc_with_offset(size, None, 0).unwrap();
            refused(&pool, offset, size);
            pool.free(h).unwrap();
        }
        pool.check().unwrap();
    }

    #[test]
    fn runs_and_tails_of_another_size_are_refused() {
        let pool = pool();
        let run = pool.alloc_raw(5 * MIB, None).unwrap();
        let tailed = pool.alloc_raw(2 * MIB + 300 * KIB, None).unwrap();
        refused(&pool, run, 3 * MIB);
        refused(&pool, run, 7 * MIB);
        refused(&pool, tailed, 2 * MIB + 256 * KIB);
        refused(&pool, tailed, 2 * MIB + 288 * KIB);
        refused(&pool, tailed, 300 * KIB);
        free_all(&pool, &[(run, 5 * MIB), (tailed, 2 * MIB + 300 * KIB)]);
    }

    #[test]
    fn blocks_with_a_front_of_another_size_are_refused() {
        let pool = pool();
        let g = &pool.arena.geometry;
        let size = 1_300_000;
        let blocks: Vec<(usize, usize)> = (0..24).map(|_| (pool.alloc_raw(size, None).unwrap(), size)).collect();
        let fronted: Vec<usize> = blocks
            .iter()
            .map(|&(o, _)| o)
            .filter(|&o| crate::arena::front::FrontLayout::of(g, o, size).is_some())
            .collect();
        assert!(!fronted.is_empty(), "consecutive large blocks take fronts");
        for &o in &fronted {
            for wrong in [size - 64 * KIB, size + 64 * KIB, size + MIB, 1000 * KIB] {
                refused(&pool, o, wrong);
            }
        }
        free_all(&pool, &blocks);
    }

    #[test]
    fn slab_objects_are_freed_once_and_only_raw() {
        let pool = pool();
        let a = pool.alloc_raw(100, None).unwrap();
        let (h, b) = pool.alloc_with_offset(100, None, 0).unwrap();
        refused(&pool, a, 5000);
        refused(&pool, b, 100);
        pool.free_raw(a, 100).unwrap();
        refused(&pool, a, 100);
        pool.free(h).unwrap();
        pool.check().unwrap();
    }

    /// Random raw blocks of every shape, each freed first with wrong sizes (parts, neighbours'
    /// sizes, its size and a neighbour's, other layouts): a free that is not refused gives back
    /// exactly the block's bytes (a size of the same shape, or a slab object of the same
    /// class); then every block left is freed with its own size.
    #[test]
    fn wrong_sizes_never_free_what_they_should_not() {
        let pool = Pool::new(PoolConfig::new(96 * MIB).cores(2)).unwrap();
        let mut seed = 11u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        let mut blocks = Vec::new();
        for _ in 0..600 {
            let size = match next() % 4 {
                0 => 1 + next() % 4096,
                1 => 4096 + next() % (256 * KIB),
                2 => 256 * KIB + next() % (2 * MIB),
                _ => 2 * MIB + next() % (4 * MIB),
            };
            let before = pool.bytes_free();
            if let Ok(offset) = pool.alloc_raw(size, None) {
                blocks.push((offset, size, before - pool.bytes_free()));
            }
        }
        blocks.sort_unstable();
        let mut live = vec![true; blocks.len()];
        let mut refusals = 0;
        for i in 0..blocks.len() {
            let (offset, size, bytes) = blocks[i];
            let mut wrong = vec![size / 2, size - size / 8, size + size / 8, size * 2, size + 256, size + 4096];
            for j in [i.wrapping_sub(1), i + 1, i + 2] {
                if let Some(&(o, s, _)) = blocks.get(j) {
                    wrong.push(s);
                    if o > offset {
                        wrong.push(o - offset + s);
                    }
                }
            }
            let object = pool.arena.slabs.lookup(offset).is_some();
            for w in wrong.into_iter().filter(|&w| w > 0 && w != size) {
                let free = pool.bytes_free();
                match pool.free_raw(offset, w) {
                    Err(Error::InvalidBlock { .. }) => {
                        assert_eq!(pool.bytes_free(), free);
                        refusals += 1;
                    }
                    Ok(()) => {
                        if !object {
                            assert_eq!(pool.bytes_free() - free, bytes, "{w} B freed the block of {size} B");
                        }
                        live[i] = false;
                        break;
                    }
                    Err(e) => panic!("free_raw({offset}, {w}): {e:?}"),
                }
            }
        }
        pool.check().unwrap();
        let left: Vec<(usize, usize)> =
            blocks.iter().zip(&live).filter(|(_, &l)| l).map(|(&(o, s, _), _)| (o, s)).collect();
        assert!(
            refusals > blocks.len() * 2,
            "most wrong sizes have another shape: {refusals} refused of {} blocks",
            blocks.len()
        );
        free_all(&pool, &left);
    }

    #[test]
    fn two_threads_freeing_one_block_free_it_once() {
        let pool = pool();
        for size in [100, 300 * KIB, 3 * MIB] {
            for _ in 0..50 {
                let offset = pool.alloc_raw(size, None).unwrap();
                let wins: usize = std::thread::scope(|s| {
                    let t: Vec<_> = (0..2).map(|_| s.spawn(|| pool.free_raw(offset, size).is_ok() as usize)).collect();
                    t.into_iter().map(|t| t.join().unwrap()).sum()
                });
                assert_eq!(wins, 1);
            }
        }
        pool.check().unwrap();
        assert_eq!(pool.bytes_free(), self::pool().bytes_free());
    }
}

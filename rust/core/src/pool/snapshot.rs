//! `Pool::snapshot()`: the whole arena at one moment, for pictures, reports and what-if
//! analysis: every live block, every maximal free run, and the stats.
//!
//! The pool is paused (the stop gate) while the snapshot is taken, so the blocks, the free runs
//! and the counters describe the same moment. Free space has three sources, merged into maximal
//! runs of contiguous bytes: chunks free in the global pool, empty chunks that cores hold, and
//! the holes inside core chunks, read from the buddy trees (allocated nodes only: the lazy
//! coalescing marks of emptied subtrees are not allocations). Slabs hold small objects: the
//! bytes of a slab that no live object uses (free objects, slack) are `slab_cached`, reserved
//! for the slab's size class until the slab empties. Allocated space that belongs to no handle
//! (blocks of the raw offset API) is listed separately as `untracked`, so blocks, free runs,
//! slab caches and untracked extents always tile the usable arena exactly.

use super::check::CHECK_STEP;
use super::pool::{BlockInfo, Pool};
use crate::arena::buddy::Node;
use crate::arena::global::ChunkState;
use crate::error::Result;
use crate::stats::summary::PoolStats;
use crate::stats::tags::TagFigures;
use crate::util::grow::{try_collect, try_push};

/// A range of bytes `[offset, offset + len)` of the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    /// Its first byte.
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
}

impl Extent {
    /// One past its last byte.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// The arena at one moment (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// When it was taken: nanoseconds since the pool was made (the trace's clock).
    pub time_ns: u64,
    /// Every live block (through a handle), in offset order; a block covers
    /// `[offset, offset + block_bytes)`.
    pub blocks: Vec<BlockInfo>,
    /// Every maximal run of free bytes, in offset order: what `stats.bytes_free` counts (blocks
    /// in the caches of freed blocks and all-free slabs included: an allocation takes them
    /// back before it fails).
    pub free_runs: Vec<Extent>,
    /// Bytes inside slabs that hold objects that no live object uses (free objects, slack),
    /// in offset order: what `stats.slab_cached_bytes` counts.
    pub slab_cached: Vec<Extent>,
    /// Allocated bytes that belong to no handle (raw-API blocks), in offset order.
    pub untracked: Vec<Extent>,
    /// The stats at the same moment.
    pub stats: PoolStats,
    /// The figures by tag at the same moment ([`Pool::tag_figures`]): they add up to the
    /// stats' blocks and requested bytes.
    pub by_tag: Vec<TagFigures>,
    /// The regions with memory behind them, in offset order (one unless the pool grew). Bytes
    /// outside them are absent: neither free nor allocated, and in no list above.
    pub regions: Vec<Extent>,
}

impl Pool {
    /// Pause the pool and record every live block, every maximal free run and the stats.
    /// [`Error::Busy`](crate::error::Error::Busy) if calls in flight do not finish in time, and
    /// [`Error::HostMemory`](crate::error::Error::HostMemory) if the host has no memory for the
    /// lists (nothing changes then).
    pub fn snapshot(&self) -> Result<Snapshot> {
        Ok(self.snapshot_until(&mut || true)?.expect("a snapshot that is never stopped finishes"))
    }

    /// [`Pool::snapshot`], asking `go_on` every `CHECK_STEP` (65,536) chunks of the walk of the free
    /// space whether to go on (an arena of many chunks takes seconds: a caller lets its user
    /// interrupt it). `Ok(None)` when `go_on` said no: the pool is resumed, as it was.
    pub fn snapshot_until(&self, go_on: &mut dyn FnMut() -> bool) -> Result<Option<Snapshot>> {
        let _paused = self.pause_for_maintenance()?;
        let time_ns = self.trace.now_ns();
        let stats = self.stats();
        let by_tag = self.tag_figures();
        let blocks = self.blocks_while_paused()?;
        let Some(pieces) = self.free_pieces(go_on)? else {
            return Ok(None);
        };
        let free_runs = merge(pieces);
        let slab_cached = merge(self.slab_cached()?);
        let regions: Vec<Extent> =
            self.regions().into_iter().map(|r| Extent { offset: r.offset, len: r.bytes }).collect();
        let untracked = self.untracked(&blocks, &free_runs, &slab_cached, &regions)?;
        Ok(Some(Snapshot { time_ns, blocks, free_runs, slab_cached, untracked, stats, by_tag, regions }))
    }

    /// The bytes of every slab that holds objects that no allocated object uses, in offset
    /// order (an all-free slab is free space, as the statistics count it).
    fn slab_cached(&self) -> Result<Vec<Extent>> {
        const WHAT: &str = "the snapshot's slab caches";
        let mut pieces = Vec::new();
        for view in self.arena.slabs.views() {
            let class = &self.arena.slabs.classes.classes[view.class];
            if view.free == class.objects_mask() {
                continue;
            }
            let mut at = view.base;
            for j in 0..class.objects {
                if view.free & (1 << j) == 0 {
                    let start = view.base + class.offset_of(j);
                    if start > at {
                        try_push(&mut pieces, Extent { offset: at, len: start - at }, WHAT)?;
                    }
                    at = start + class.size;
                }
            }
            if view.base + view.bytes > at {
                try_push(&mut pieces, Extent { offset: at, len: view.base + view.bytes - at }, WHAT)?;
            }
        }
        Ok(pieces)
    }

    /// Free byte ranges chunk by chunk, in offset order (free chunks side by side joined, other
    /// adjacent pieces not merged yet); `None` when `go_on`, asked every [`CHECK_STEP`]
    /// chunks, said no.
    fn free_pieces(&self, go_on: &mut dyn FnMut() -> bool) -> Result<Option<Vec<Extent>>> {
        const WHAT: &str = "the snapshot's free runs";
        let g = &self.arena.geometry;
        // Cached freed blocks and all-free slabs are free, though allocated in their trees.
        let cached = self.reclaimable_nodes();
        let mut pieces: Vec<Extent> = Vec::new();
        for chunk in 0..self.arena.global.end() {
            if chunk % CHECK_STEP == CHECK_STEP - 1 && !go_on() {
                return Ok(None);
            }
            let base = chunk * g.chunk_size;
            match self.arena.global.state(chunk) {
                // One piece per run of free chunks, not one per chunk: a large empty arena has
                // millions of them.
                ChunkState::Free => match pieces.last_mut() {
                    Some(last) if last.end() == base => last.len += g.chunk_bytes(chunk),
                    _ => try_push(&mut pieces, Extent { offset: base, len: g.chunk_bytes(chunk) }, WHAT)?,
                },
                ChunkState::Core(_) => {
                    let cached = cached.get(&chunk);
                    // An all-free slab's node covers the nodes of its block.
                    let is_cached = |n: Node| {
                        let (start, units) = (n.start(g.depth), n.units(g.depth));
                        cached.is_some_and(|ns| {
                            ns.iter().any(|r| {
                                start >= r.start(g.depth) && start + units <= r.start(g.depth) + r.units(g.depth)
                            })
                        })
                    };
                    for (from, to) in self.free_holes(chunk, &is_cached) {
                        let hole =
                            Extent { offset: g.offset_of(chunk, from), len: ((to - from) as usize) << g.unit_shift };
                        try_push(&mut pieces, hole, WHAT)?;
                    }
                }
                ChunkState::RunHead(_)
                | ChunkState::TailedRunHead(_)
                | ChunkState::FrontedRun { .. }
                | ChunkState::RunBody
                | ChunkState::Absent => {}
            }
        }
        Ok(Some(pieces))
    }

    /// The allocated ranges that no live block covers.
    fn untracked(
        &self,
        blocks: &[BlockInfo],
        free_runs: &[Extent],
        slab_cached: &[Extent],
        regions: &[Extent],
    ) -> Result<Vec<Extent>> {
        let end = self.arena.geometry.usable_capacity();
        let absent = gaps(regions, end, "the snapshot's absent extents")?;
        let mut covered = try_collect(
            blocks
                .iter()
                .map(|b| Extent { offset: b.offset, len: b.block_bytes })
                .chain(free_runs.iter().copied())
                .chain(slab_cached.iter().copied())
                .chain(absent),
            "the snapshot's covered extents",
        )?;
        // In place (a stable sort allocates); equal extents are alike.
        covered.sort_unstable();
        gaps(&covered, end, "the snapshot's untracked extents")
    }
}

/// The bytes of `[0, end)` outside `extents` (sorted by offset, maybe overlapping).
fn gaps(extents: &[Extent], end: usize, what: &'static str) -> Result<Vec<Extent>> {
    let mut gaps = Vec::new();
    let mut at = 0;
    for e in extents {
        if e.offset > at {
            try_push(&mut gaps, Extent { offset: at, len: e.offset - at }, what)?;
        }
        at = at.max(e.end());
    }
    if at < end {
        try_push(&mut gaps, Extent { offset: at, len: end - at }, what)?;
    }
    Ok(gaps)
}

/// Sorted pieces merged into maximal runs (touching pieces join), in place.
fn merge(mut pieces: Vec<Extent>) -> Vec<Extent> {
    let mut runs = 0usize;
    for i in 0..pieces.len() {
        let p = pieces[i];
        match runs.checked_sub(1).map(|last| &mut pieces[last]) {
            Some(last) if last.end() == p.offset => last.len += p.len,
            _ => {
                pieces[runs] = p;
                runs += 1;
            }
        }
    }
    pieces.truncate(runs);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Backing, PoolConfig};
    use crate::handle::id::Handle;

    const MIB: usize = 1 << 20;

    /// Blocks, free runs, slab caches and untracked extents tile `[0, usable)` exactly, free
    /// runs are maximal, and the free bytes agree with the stats.
    fn assert_tiles(p: &Pool, s: &Snapshot) {
        let mut all: Vec<(Extent, &str)> = s
            .blocks
            .iter()
            .map(|b| (Extent { offset: b.offset, len: b.block_bytes }, "block"))
            .chain(s.free_runs.iter().map(|&e| (e, "free")))
            .chain(s.slab_cached.iter().map(|&e| (e, "slab cache")))
            .chain(s.untracked.iter().map(|&e| (e, "untracked")))
            .collect();
        all.sort();
        let mut at = 0;
        for (e, what) in &all {
            assert!(e.len > 0, "empty {what} extent at {}", e.offset);
            assert_eq!(e.offset, at, "{what} at {} leaves a gap or overlaps", e.offset);
            at = e.end();
        }
        assert_eq!(at, p.arena.geometry.usable_capacity(), "the tiling ends early");
        for pair in s.free_runs.windows(2) {
            assert!(pair[0].end() < pair[1].offset, "free runs {pair:?} are not maximal");
        }
        let free: usize = s.free_runs.iter().map(|e| e.len).sum();
        let cached: usize = s.slab_cached.iter().map(|e| e.len).sum();
        if s.untracked.is_empty() {
            // All-free slabs are free (an allocation reclaims them), in the stats and in the
            // free runs; the unused bytes of other slabs are slab cache.
            assert_eq!(free, s.stats.bytes_free, "free runs against the stats");
            assert_eq!(cached, s.stats.slab_cached_bytes, "slab cache against the stats");
            assert_eq!(s.blocks.len() as u64, s.stats.blocks_in_use);
        }
        let largest = s.free_runs.iter().map(|e| e.len).max().unwrap_or(0);
        assert!(largest >= s.stats.largest_free_block);
    }

    fn pool(config: PoolConfig) -> Pool {
        Pool::new(config).unwrap()
    }

    #[test]
    fn empty_pool_is_one_free_run() {
        let p = pool(PoolConfig::new(64 * MIB).cores(2));
        let s = p.snapshot().unwrap();
        assert_eq!(s.free_runs, vec![Extent { offset: 0, len: 64 * MIB }]);
        assert!(s.blocks.is_empty() && s.untracked.is_empty());
        assert_tiles(&p, &s);
    }

    #[test]
    fn mixed_blocks_runs_and_holes_tile_the_arena() {
        // A capacity that is not a multiple of the chunk: the last chunk is partial.
        let p = pool(PoolConfig::new(37 * MIB + 3 * 4096 + 100).cores(3).core_reserve(0));
        let sizes = [
            100usize,
            4096,
            5000,
            300 << 10, // trimmed buddy block
            700 << 10,
            3 * MIB, // a run of two chunks
            9 * MIB + 1,
            64,
            1 << 20,
        ];
        let mut handles: Vec<Handle> = Vec::new();
        for round in 0..6 {
            for (i, &size) in sizes.iter().enumerate() {
                if let Ok(h) = p.alloc(size + round * 64, None, (i + 1) as u32) {
                    handles.push(h);
                }
            }
        }
        // Free every third block: holes inside chunks and between runs.
        let mut kept = Vec::new();
        for (i, h) in handles.into_iter().enumerate() {
            if i % 3 == 1 {
                p.free(h).unwrap();
            } else {
                kept.push(h);
            }
        }
        let s = p.snapshot().unwrap();
        assert!(s.untracked.is_empty());
        assert!(s.free_runs.len() > 2);
        assert_tiles(&p, &s);
        for b in &s.blocks {
            assert_eq!(p.block(b.handle).unwrap(), *b);
        }
        // The tail of a partial last chunk is usable: a small block can live there.
        for h in kept {
            p.free(h).unwrap();
        }
        let s = p.snapshot().unwrap();
        assert_tiles(&p, &s);
        assert!(!p.arena.slabs.views().is_empty(), "each class keeps its current slab");
        assert!(s.slab_cached.is_empty(), "all-free slabs are free space");
        assert_eq!(s.free_runs.len(), 1, "all-free slabs and cached blocks are free space");
        assert!(p.trim().unwrap() > 0);
        let s = p.snapshot().unwrap();
        assert_tiles(&p, &s);
        assert!(s.slab_cached.is_empty());
        assert_eq!(s.free_runs.len(), 1);
        p.check().unwrap();
    }

    #[test]
    fn raw_blocks_are_untracked() {
        let p = pool(PoolConfig::new(16 * MIB).cores(1));
        let h = p.alloc(1000, None, 0).unwrap();
        let raw = p.alloc_raw(5000, None).unwrap();
        let s = p.snapshot().unwrap();
        assert_tiles(&p, &s);
        assert_eq!(s.untracked.len(), 1);
        assert_eq!(s.untracked[0].offset, raw);
        assert!(s.untracked[0].len >= 5000);
        assert_eq!(s.blocks.len(), 1);
        assert_eq!(s.blocks[0].handle, h);
    }

    #[test]
    fn snapshot_waits_for_no_one_and_changes_nothing() {
        let p = pool(PoolConfig::new(32 * MIB).cores(2));
        let hs: Vec<Handle> = (0..50).map(|i| p.alloc(256 + i * 1000, None, 1).unwrap()).collect();
        let before = p.stats();
        let a = p.snapshot().unwrap();
        let b = p.snapshot().unwrap();
        assert_eq!(a.blocks, b.blocks);
        assert_eq!(a.free_runs, b.free_runs);
        assert!(b.time_ns >= a.time_ns);
        assert_eq!(p.stats(), before);
        for h in hs {
            p.free(h).unwrap();
        }
    }

    #[test]
    fn a_stopped_snapshot_leaves_the_pool_running_and_as_it_was() {
        // 4 x CHECK_STEP chunks: the walk of the free space asks its caller four times.
        let chunk = 8192;
        let p = pool(PoolConfig::new(4 * CHECK_STEP * chunk).chunk_size(chunk).cores(2).backing(Backing::None));
        let kept = p.alloc(1000, None, 1).unwrap();
        let before = p.stats();
        let mut asked = 0;
        assert_eq!(
            p.snapshot_until(&mut || {
                asked += 1;
                asked < 2
            })
            .unwrap(),
            None
        );
        assert_eq!(asked, 2, "asked every CHECK_STEP chunks until told to stop");
        assert_eq!(p.stats(), before);
        let mut asked = 0;
        let whole = p
            .snapshot_until(&mut || {
                asked += 1;
                true
            })
            .unwrap()
            .unwrap();
        assert_eq!(asked, 4);
        let plain = p.snapshot().unwrap();
        assert_eq!((&whole.blocks, &whole.free_runs), (&plain.blocks, &plain.free_runs));
        assert_tiles(&p, &whole);
        p.free(kept).unwrap(); // not left paused
        p.check().unwrap();
    }

    #[test]
    fn snapshots_under_concurrent_load_always_tile() {
        let p = std::sync::Arc::new(pool(PoolConfig::new(64 * MIB).cores(2)));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        std::thread::scope(|s| {
            for t in 0..2usize {
                let (p, stop) = (p.clone(), stop.clone());
                s.spawn(move || {
                    let mut held = Vec::new();
                    let mut i = t;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let size = 64 + (i >> 33) % (3 * MIB);
                        if let Ok(h) = p.alloc(size, None, t as u32) {
                            held.push(h);
                        }
                        if held.len() > 20 {
                            let h = held.swap_remove((i >> 40) % held.len());
                            p.free(h).unwrap();
                        }
                    }
                    for h in held {
                        p.free(h).unwrap();
                    }
                });
            }
            for _ in 0..50 {
                let snap = p.snapshot().unwrap();
                assert_tiles(&p, &snap);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

//! Where a block goes: validating a request, then the slab, buddy and run paths of the
//! allocation (see `pool.rs` for the order), chunk grants and retirements, and reclaiming what
//! cores hold empty before giving up.
//!
//! Chunks in the global pool have their buddy tree *retired*: the nodes covering the chunk are
//! marked allocated, so a thread that still holds a stale hint to the chunk fails its climb and
//! never places a block in a chunk that is now part of a run. Granting a chunk releases those
//! nodes; retiring one allocates them, which succeeds only while the chunk is empty.

use crate::arena::buddy::{Conflict, Node};
use crate::arena::global::ChunkState;
use crate::arena::layout::{BuddyLayout, Layout};
use crate::arena::slab::caches::SlabBlocks;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::pool::pool::Pool;
use crate::stats::counters::Route;

/// A validated request. (The buddy or run layout is derived only when the request leaves the
/// slab path: the slab path pays for nothing it does not use.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) size: usize,
    pub(crate) align: usize,
    /// The slab class that serves it, if any.
    pub(crate) class: Option<usize>,
}

/// What an allocation got before it became a handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) offset: usize,
    pub(crate) block_bytes: usize,
    pub(crate) route: Route,
    pub(crate) overflow: bool,
    /// The slab class, for slab objects.
    pub(crate) class: Option<usize>,
}

/// How far an allocation may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// The caller's slab cache and core pool and a fresh chunk: quick, for callers that hold a
    /// lock (the GIL).
    Fast,
    /// Everything: other cores' chunks, reclaiming empty slabs and chunks.
    Full,
}

/// Whether a chunk search skips the chunks that a recorded miss says cannot serve the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Memo {
    Trust,
    /// The last resort before out-of-memory: a miss may be spurious under contention.
    Ignore,
}

/// Carves slabs from the buddy pool of one core (uncounted: slab objects are counted instead).
struct SlabCarver<'a> {
    pool: &'a Pool,
    core: usize,
    reach: Reach,
}

impl SlabBlocks for SlabCarver<'_> {
    fn carve(&self, bytes: usize) -> Option<usize> {
        let Layout::Buddy(b) = self.pool.geometry.layout(bytes, bytes) else {
            return None;
        };
        self.pool.place_buddy(&b, self.core, self.reach).map(|p| p.offset)
    }

    fn release(&self, base: usize, bytes: usize) {
        self.pool.release_buddy(base, bytes).expect("a retired slab's block is allocated");
    }
}

impl Pool {
    #[inline(always)]
    pub(crate) fn request(&self, size: usize, align: Option<usize>) -> Result<Request> {
        let align = align.unwrap_or(self.config.alignment);
        let capacity = self.config.capacity;
        if size != 0 && size <= capacity && align.is_power_of_two() && align <= capacity {
            return Ok(Request { size, align, class: self.slabs.classes.class_for(size, align) });
        }
        Err(self.refusal(size, align))
    }

    /// Why `request` refused: the error for a size or alignment it cannot take.
    #[cold]
    fn refusal(&self, size: usize, align: usize) -> Error {
        let capacity = self.config.capacity;
        if size == 0 {
            Error::InvalidSize { size: 0, reason: "a block must have at least 1 byte" }
        } else if size > capacity {
            Error::TooLarge { size, capacity }
        } else if !align.is_power_of_two() {
            Error::InvalidAlignment {
                align: align as u128,
                reason: "must be a power of two (1, 2, 4, ... bytes)".into(),
            }
        } else {
            Error::InvalidAlignment {
                align: align as u128,
                reason: format!("must not be larger than the arena ({capacity} bytes)"),
            }
        }
    }

    pub(crate) fn finish(&self, placed: Placed, request: &Request, core: usize, tag: u32) -> Result<Handle> {
        match self.handles.insert(core, placed.offset, request.size, request.align.trailing_zeros() as u8, tag) {
            Ok(handle) => {
                self.account_alloc(&placed, core, request.size);
                self.trace.on_alloc(core, handle, placed.offset, request.size, request.align, tag);
                Ok(handle)
            }
            Err(err) => {
                self.release_block(placed.offset, request.size).expect("a block just placed can be freed");
                Err(err)
            }
        }
    }

    /// Count an allocation: per thread for slab objects, per core otherwise.
    #[inline(always)]
    pub(crate) fn account_alloc(&self, placed: &Placed, core: usize, size: usize) {
        match placed.class {
            Some(k) => self.slab_counters.on_alloc(k, size),
            None => self.counters.on_alloc(core, placed.route, placed.overflow, placed.block_bytes, size),
        }
    }

    /// The error (and the trace event) for a request nothing could place.
    #[cold]
    pub(crate) fn out_of_memory(&self, request: &Request, core: usize, tag: u32) -> Error {
        self.counters.on_failed(core);
        self.trace.on_failed(core, request.size, request.align, tag);
        let stats = self.stats();
        Error::OutOfMemory {
            requested: request.size,
            bytes_free: stats.bytes_free,
            largest_free_block: stats.largest_free_block,
        }
    }

    /// Find a place for `request`: first the fast path (an object of the core's current slab),
    /// then everything else; with [`Reach::Full`], empty slabs and chunks are reclaimed and the
    /// request tried once more before giving up.
    #[inline(always)]
    pub(crate) fn place(&self, request: &Request, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(k) = request.class {
            if let Some(offset) = self.slabs.take_current(k, core) {
                return Some(Placed {
                    offset,
                    block_bytes: self.slabs.classes.classes[k].size,
                    route: Route::Slab,
                    overflow: false,
                    class: Some(k),
                });
            }
        }
        self.place_slow(request, core, reach)
    }

    #[inline(never)]
    fn place_slow(&self, request: &Request, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(placed) = self.place_once(request, core, reach) {
            return Some(placed);
        }
        if reach == Reach::Fast {
            return None;
        }
        let carver = SlabCarver { pool: self, core, reach };
        let slabs = self.slabs.reclaim(&carver);
        let chunks = self.reclaim_empty_chunks();
        if slabs + chunks == 0 {
            return None;
        }
        self.place_once(request, core, reach)
    }

    fn place_once(&self, request: &Request, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(k) = request.class {
            let carver = SlabCarver { pool: self, core, reach };
            if let Some((offset, carved)) = self.slabs.alloc(k, core, &carver) {
                if carved {
                    self.sample_peak();
                }
                return Some(Placed {
                    offset,
                    block_bytes: self.slabs.classes.classes[k].size,
                    route: Route::Slab,
                    overflow: false,
                    class: Some(k),
                });
            }
            // No slab could be carved: the buddy path may still fit the object on its own.
        }
        match self.geometry.layout(request.size, request.align) {
            Layout::Buddy(b) => self.place_buddy(&b, core, reach),
            Layout::Run { chunks, align_chunks } => self.place_run(chunks, align_chunks, request.size),
        }
    }

    pub(crate) fn place_buddy(&self, b: &BuddyLayout, core: usize, reach: Reach) -> Option<Placed> {
        if let Some(placed) = self.alloc_in_core(b, core, Memo::Trust) {
            return Some(placed);
        }
        // A chunk that holds the trimmed block will do (the arena's last chunk may be short).
        let bytes = b.units as usize * self.geometry.min_block;
        if let Some(chunk) = self.grant(core, bytes) {
            if let Some(placed) = self.alloc_in_chunk(chunk, b, core, false) {
                return Some(placed);
            }
        }
        if reach == Reach::Fast {
            return None;
        }
        // Overflow: room in other cores' chunks (including the ones they keep in reserve).
        let cores = self.cores.len();
        for i in 1..cores {
            if let Some(mut placed) = self.alloc_in_core(b, (core + i) % cores, Memo::Trust) {
                placed.overflow = true;
                return Some(placed);
            }
        }
        // A chunk may have come free meanwhile.
        if let Some(chunk) = self.grant(core, bytes) {
            if let Some(placed) = self.alloc_in_chunk(chunk, b, core, false) {
                return Some(placed);
            }
        }
        // Before giving up: search every chunk, including those a (possibly spurious) miss hid.
        (0..cores).find_map(|i| {
            let owner = (core + i) % cores;
            let mut placed = self.alloc_in_core(b, owner, Memo::Ignore)?;
            placed.overflow = owner != core;
            Some(placed)
        })
    }

    /// Try the chunks owned by `owner`: its hint first, then every owned chunk in address order
    /// (first fit: small blocks gather low, the high chunks stay whole for large blocks), skipping
    /// chunks where a search for a block this large failed since their last free.
    fn alloc_in_core(&self, b: &BuddyLayout, owner: usize, memo: Memo) -> Option<Placed> {
        let pool = &self.cores[owner];
        let hint = pool.hint(b.level);
        if let Some((chunk, bunch)) = hint {
            if chunk < self.geometry.chunks {
                let tree = self.tree(chunk);
                let node = self.shape.search_in_bunch(tree, b.level, bunch, b.step, &mut |e| self.claim(chunk, b, e));
                if let Some(node) = node {
                    return Some(self.commit(chunk, b, node));
                }
            }
        }
        for chunk in pool.owned() {
            let space = &self.space[chunk];
            let Some(probe) = space.probe(b.level, b.units, memo == Memo::Ignore) else {
                continue;
            };
            if let Some(placed) = self.alloc_in_chunk(chunk, b, owner, memo == Memo::Ignore) {
                return Some(placed);
            }
            if b.step <= 1 {
                space.missed(probe, b.level);
            }
        }
        None
    }

    /// Search chunk `chunk` for block `b`. `thorough` also looks for a trimmed block's pieces
    /// where no whole enclosing node is free: twice the search, so only for the last resort
    /// (and always where the enclosing node cannot fit, in the arena's short last chunk).
    fn alloc_in_chunk(&self, chunk: usize, b: &BuddyLayout, hint_owner: usize, thorough: bool) -> Option<Placed> {
        let tree = self.tree(chunk);
        let cursor = self.cores[hint_owner].hint(b.level).and_then(|(c, bunch)| (c == chunk).then_some(bunch));
        let node = match cursor {
            Some(from) => self.shape.search_from(tree, b.level, b.step, from, &mut |e| self.claim(chunk, b, e)),
            None => self.shape.search(tree, b.level, b.step, &mut |e| self.claim(chunk, b, e)),
        };
        let node = match node {
            Some(node) => {
                self.cores[hint_owner].set_hint(b.level, chunk, self.shape.bunch_of(node));
                node
            }
            None if !b.is_whole() && (thorough || self.geometry.usable_units(chunk) < b.enclosing) => {
                self.search_pieces(chunk, b)?
            }
            None => return None,
        };
        Some(self.commit(chunk, b, node))
    }

    /// A trimmed block needs only its pieces free, not its whole enclosing node: find a free
    /// left half (the first piece) and claim the rest after it. This places blocks where the
    /// enclosing node's tail is in use, and in the arena's last chunk when the enclosing node
    /// reaches past the arena's end. Returns the enclosing node.
    fn search_pieces(&self, chunk: usize, b: &BuddyLayout) -> Option<Node> {
        let tree = self.tree(chunk);
        let parent = |half: Node| Node { level: b.level, index: half.index / 2 };
        let half = self.shape.search(tree, b.level + 1, b.step * 2, &mut |n| self.claim(chunk, b, parent(n)))?;
        Some(parent(half))
    }

    /// Claim the block with enclosing node `e`: the node itself, or its trimmed pieces (rolled
    /// back if one of them is taken).
    fn claim(&self, chunk: usize, b: &BuddyLayout, e: Node) -> std::result::Result<(), Conflict> {
        let tree = self.tree(chunk);
        if b.is_whole() {
            return self.shape.try_alloc(tree, e);
        }
        let mut taken: Vec<Node> = Vec::with_capacity(4);
        for piece in b.pieces(self.geometry.depth, e) {
            if let Err(conflict) = self.shape.try_alloc(tree, piece) {
                for &p in &taken {
                    let _ = self.shape.release(tree, p);
                }
                if !taken.is_empty() {
                    self.space[chunk].refresh();
                }
                return Err(if taken.is_empty() { conflict } else { Conflict::Taken });
            }
            taken.push(piece);
        }
        Ok(())
    }

    fn commit(&self, chunk: usize, b: &BuddyLayout, e: Node) -> Placed {
        self.space[chunk].take(b.units);
        Placed {
            offset: self.geometry.offset_of(chunk, e.start(self.geometry.depth)),
            block_bytes: b.units as usize * self.geometry.min_block,
            route: Route::Core,
            overflow: false,
            class: None,
        }
    }

    /// Take a free chunk from the global pool for core `core` (one that can hold a node of
    /// `bytes` bytes).
    fn grant(&self, core: usize, bytes: usize) -> Option<usize> {
        let chunk = self.global.claim(&self.geometry, 1, bytes, 1)?;
        self.global.set_state(chunk, ChunkState::Core(core));
        self.cores[core].own(chunk);
        let tree = self.tree(chunk);
        for node in self.retire_nodes(chunk) {
            self.shape.release(tree, node).expect("a chunk in the global pool is retired");
        }
        self.space[chunk].refresh();
        Some(chunk)
    }

    /// Give an empty chunk of `owner` back to the global pool; `false` if it is not empty (or
    /// someone else is retiring it).
    pub(crate) fn retire(&self, chunk: usize, owner: usize) -> bool {
        let tree = self.tree(chunk);
        // Coalescing is lazy: clear the marks of emptied bunches so the cover nodes fit.
        self.shape.sweep(tree);
        let nodes = self.retire_nodes(chunk);
        for (i, &node) in nodes.iter().enumerate() {
            if self.shape.try_alloc(tree, node).is_err() {
                for &n in &nodes[..i] {
                    let _ = self.shape.release(tree, n);
                }
                self.space[chunk].refresh();
                return false;
            }
        }
        self.cores[owner].disown(chunk);
        self.global.set_state(chunk, ChunkState::Free);
        self.global.release(chunk, 1);
        true
    }

    /// Give back what cores keep cached: every all-free slab and every empty chunk (an
    /// allocation does this by itself before it fails; a caller may want it earlier, e.g.
    /// before a snapshot or when the pool goes idle). Returns the slabs and chunks given back.
    pub fn trim(&self) -> usize {
        let core = crate::util::cpu::current_core(self.cores.len());
        let Ok(_entered) = self.enter() else {
            return 0; // the calling thread is moving blocks (inside a mover): nothing to trim now
        };
        let carver = SlabCarver { pool: self, core, reach: Reach::Full };
        self.slabs.reclaim(&carver) + self.reclaim_empty_chunks()
    }

    /// Retire every empty chunk that cores hold; returns how many went back.
    fn reclaim_empty_chunks(&self) -> usize {
        let mut reclaimed = 0;
        for owner in 0..self.cores.len() {
            let owned: Vec<usize> = self.cores[owner].owned().collect();
            for chunk in owned {
                if self.chunk_is_empty(chunk) && self.retire(chunk, owner) {
                    reclaimed += 1;
                }
            }
        }
        reclaimed
    }

    pub(crate) fn chunk_is_empty(&self, chunk: usize) -> bool {
        self.space[chunk].free_units() == self.geometry.usable_units(chunk)
    }

    fn place_run(&self, chunks: usize, align_chunks: usize, size: usize) -> Option<Placed> {
        let start = self.global.claim(&self.geometry, chunks, size, align_chunks)?;
        for chunk in start + 1..start + chunks {
            self.global.set_state(chunk, ChunkState::RunBody);
        }
        self.global.set_state(start, ChunkState::RunHead(chunks));
        Some(Placed {
            offset: start * self.geometry.chunk_size,
            block_bytes: self.run_bytes(start, chunks),
            route: Route::Global,
            overflow: false,
            class: None,
        })
    }

    pub(crate) fn run_bytes(&self, start: usize, chunks: usize) -> usize {
        (start..start + chunks).map(|c| self.geometry.chunk_bytes(c)).sum()
    }
}

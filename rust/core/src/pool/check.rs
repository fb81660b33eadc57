//! The consistency proof of a pool: `Pool::check()` pauses the pool and walks every piece of
//! metadata (chunk states, bitmaps, owners, trees, slabs, handles, counters) and reports every
//! disagreement it finds.

use std::collections::HashSet;

use smallvec::SmallVec;

use crate::arena::buddy::Node;
use crate::arena::front::FrontLayout;
use crate::arena::global::ChunkState;
use crate::arena::layout::Layout;
use crate::arena::regions::Regions;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::pool::pool::Pool;
use crate::util::grow::{reserve, try_insert, try_push};
use crate::util::sync::Ordering;

impl Pool {
    /// Pause the pool (waiting for calls in flight) and prove its metadata consistent: every
    /// chunk's state, bitmap bit and owner agree; every tree is well formed; every slab is an
    /// allocated block with its directory entries; every live handle names an allocated block
    /// or slab object inside the arena, aligned and bank-safe; no two blocks overlap; the
    /// counters equal what the walk finds. Returns the number of live blocks checked.
    /// [`Error::HostMemory`] if the host has no memory for the walk's tables (nothing changes).
    pub fn check(&self) -> Result<usize> {
        Ok(self.check_until(&mut || true)?.expect("a check that is never stopped finishes"))
    }

    /// [`Pool::check`], asking `go_on` every `CHECK_STEP` (65,536) chunks of the walk whether to go on
    /// (an arena of a billion chunks takes seconds: a caller lets its user interrupt it).
    /// `Ok(None)` when `go_on` said no: the pool is resumed, and nothing was proved.
    pub fn check_until(&self, go_on: &mut dyn FnMut() -> bool) -> Result<Option<usize>> {
        let _paused = self.pause_for_maintenance()?;
        let mut findings: Vec<String> = Vec::new();
        let g = &self.arena.geometry;
        let depth = g.depth;
        // Chunks: state, bitmap, ownership, trees.
        let mut allocated: HashSet<(usize, Node)> = HashSet::new();
        let mut block_bytes_walked = 0usize;
        let mut owed: Vec<Owed> = Vec::new();
        let mut chunk = 0;
        let regions = self.arena.regions.lock().clone();
        let end = self.arena.global.end();
        // Chunks from here on were never granted: their lines and trees are not read.
        let opened_to = self.arena.opened_to.load(Ordering::Acquire);
        // No core owns a chunk never granted: read 64 chunks' owner bits at a time there (a
        // chunk at a time, for every core, costs cores x chunks reads in a large arena).
        for (core, pool) in self.arena.cores.iter().enumerate() {
            for w in opened_to / 64..end.div_ceil(64) {
                let mut word = pool.owned_word(w);
                while word != 0 {
                    let chunk = w * 64 + word.trailing_zeros() as usize;
                    word &= word - 1;
                    if chunk >= opened_to && chunk < end {
                        findings.push(format!("chunk {chunk}: never granted, but owned by core {core}"));
                    }
                }
            }
        }
        while chunk < end {
            let state = self.arena.global.state(chunk);
            if let Some(finding) = region_finding(&regions, chunk, state, self.arena.global.is_taken(chunk)) {
                findings.push(finding);
            }
            // Past the chunks ever granted, every core's owner bits were checked word by word
            // (below): a chunk there is nobody's unless that found it.
            let owners: SmallVec<[usize; 8]> = if chunk < opened_to {
                (0..self.arena.cores.len()).filter(|&c| self.arena.cores[c].owns(chunk)).collect()
            } else {
                SmallVec::new()
            };
            let taken = self.arena.global.is_taken(chunk);
            let tree = self.arena.tree(chunk);
            let never_written = self.arena.never_written(chunk, opened_to);
            if never_written && matches!(state, ChunkState::Core(_)) {
                findings.push(format!("chunk {chunk} ({state:?}): granted, but never opened"));
            }
            let pristine =
                if never_written { !matches!(state, ChunkState::Core(_)) } else { self.arena.is_pristine(chunk) };
            let mut nodes: HashSet<Node> = HashSet::new();
            let mut listed = Ok(());
            if pristine {
                // Never granted: nobody's, whole, every word of its tree zero (a tree past every
                // opened chunk was never written: not read).
                if g.usable_units(chunk) != g.units_per_chunk()
                    || (!never_written && tree.iter().any(|w| w.load(Ordering::Relaxed) != 0))
                {
                    findings.push(format!("chunk {chunk} ({state:?}): pristine, but its tree or state disagrees"));
                }
            } else {
                self.arena.shape.check(tree, &mut |f| findings.push(format!("chunk {chunk}: {f}")));
                self.arena.shape.for_each_allocated(tree, &mut |n| {
                    if listed.is_ok() {
                        listed = try_insert(&mut nodes, n, "check()'s nodes of a chunk").map(drop);
                    }
                });
                listed?;
                for n in self.arena.reserved_nodes(chunk) {
                    if !nodes.remove(&n) {
                        findings.push(format!("chunk {chunk}: reserved tail node {n:?} is not allocated"));
                    }
                }
            }
            let free_units = if pristine { g.usable_units(chunk) } else { self.arena.free_units(chunk) };
            let front_word = self.arena.fronts[chunk].load(Ordering::Acquire);
            if !matches!(state, ChunkState::Core(_)) && front_word != 0 {
                findings.push(format!("chunk {chunk} ({state:?}): its front word names a block"));
            } else if front_word != 0 {
                try_push(&mut owed, Owed::Front { chunk, word: front_word }, "check()'s list of fronts")?;
            }
            match state {
                ChunkState::Absent => {
                    if !owners.is_empty() {
                        findings.push(format!("chunk {chunk} (absent): owned by core(s) {owners:?}"));
                    }
                }
                ChunkState::Free
                | ChunkState::RunHead(_)
                | ChunkState::TailedRunHead(_)
                | ChunkState::FrontedRun { .. }
                | ChunkState::RunBody => {
                    // A pristine chunk was never retired: no nodes to find (and no list to make
                    // for each of the millions of chunks of a large arena).
                    let retired = if pristine { Vec::new() } else { self.arena.retire_nodes(chunk) };
                    for n in retired {
                        if !nodes.remove(&n) {
                            findings.push(format!("chunk {chunk} ({state:?}): not retired, node {n:?} is free"));
                        }
                    }
                    if !nodes.is_empty() {
                        findings.push(format!("chunk {chunk} ({state:?}): {} stray allocated node(s)", nodes.len()));
                    }
                    if free_units != g.usable_units(chunk) {
                        findings.push(format!(
                            "chunk {chunk} ({state:?}): free-unit count {free_units} but it holds no buddy block"
                        ));
                    }
                    if !owners.is_empty() {
                        findings.push(format!("chunk {chunk} ({state:?}): owned by core(s) {owners:?}"));
                    }
                    if (state == ChunkState::Free) == taken {
                        findings.push(format!("chunk {chunk} ({state:?}): bitmap says taken={taken}"));
                    }
                }
                ChunkState::Core(core) => {
                    if owners.as_slice() != [core] {
                        findings.push(format!("chunk {chunk}: state says core {core}, owner bitmaps say {owners:?}"));
                    }
                    if !taken {
                        findings.push(format!("chunk {chunk}: granted to core {core} but free in the bitmap"));
                    }
                    let used: u64 = nodes.iter().map(|n| n.units(depth)).sum();
                    if used + free_units != g.usable_units(chunk) {
                        findings.push(format!(
                            "chunk {chunk}: walk finds {used} units in use, counter says {} free of {}",
                            free_units,
                            g.usable_units(chunk)
                        ));
                    }
                    block_bytes_walked += used as usize * g.min_block;
                    reserve(&mut allocated, nodes.len(), "check()'s allocated nodes")?;
                    allocated.extend(nodes.into_iter().map(|n| (chunk, n)));
                }
            }
            if let ChunkState::RunHead(len) | ChunkState::TailedRunHead(len) = state {
                if chunk + len > g.chunks {
                    findings.push(format!("chunk {chunk}: run of {len} chunks runs past the arena"));
                    break;
                }
                let tailed = matches!(state, ChunkState::TailedRunHead(_));
                if tailed
                    && (chunk + len >= g.chunks || !matches!(self.arena.global.state(chunk + len), ChunkState::Core(_)))
                {
                    findings.push(format!("chunk {chunk}: the run of {len} chunks has no core chunk for its tail"));
                } else if tailed {
                    try_push(&mut owed, Owed::TailStart { head: chunk, len }, "check()'s list of tails")?;
                }
                for c in chunk + 1..chunk + len {
                    if self.arena.global.state(c) != ChunkState::RunBody || !self.arena.global.is_taken(c) {
                        findings.push(format!(
                            "chunk {c}: inside the run at chunk {chunk} but {:?}",
                            self.arena.global.state(c)
                        ));
                    }
                }
                block_bytes_walked += self.arena.geometry.run_bytes(chunk, len);
            } else if let ChunkState::FrontedRun { len, tail } = state {
                if chunk == 0 || !matches!(self.arena.global.state(chunk - 1), ChunkState::Core(_)) {
                    findings
                        .push(format!("chunk {chunk}: whole chunks of a block with a front, but no core chunk before"));
                } else if self.arena.fronts[chunk - 1].load(Ordering::Acquire) == 0 {
                    findings.push(format!(
                        "chunk {chunk}: whole chunks of a block with a front, but chunk {}'s front word names none",
                        chunk - 1
                    ));
                }
                if chunk + len > g.chunks
                    || (tail > 0
                        && (chunk + len >= g.chunks
                            || !matches!(self.arena.global.state(chunk + len), ChunkState::Core(_))))
                {
                    findings.push(format!("chunk {chunk}: {len} whole chunks and a tail of {tail} units do not fit"));
                    break;
                }
                for c in chunk + 1..chunk + len {
                    if self.arena.global.state(c) != ChunkState::RunBody || !self.arena.global.is_taken(c) {
                        findings.push(format!(
                            "chunk {c}: inside the chunks at chunk {chunk} but {:?}",
                            self.arena.global.state(c)
                        ));
                    }
                }
                block_bytes_walked += self.arena.geometry.run_bytes(chunk, len);
            } else if state == ChunkState::RunBody
                && (chunk == 0
                    || !matches!(
                        self.arena.global.state(chunk - 1),
                        ChunkState::RunHead(_)
                            | ChunkState::TailedRunHead(_)
                            | ChunkState::FrontedRun { .. }
                            | ChunkState::RunBody
                    ))
            {
                findings.push(format!("chunk {chunk}: run body without a head"));
            }
            chunk += 1;
            if chunk % CHECK_STEP == 0 && !go_on() {
                return Ok(None);
            }
        }
        // Slabs: each is an allocated buddy block of a core chunk, found by the directory.
        let classes = &self.arena.slabs.classes.classes;
        let mut slab_objects = vec![0u64; classes.len()];
        for view in self.arena.slabs.views() {
            let chunk = g.chunk_of(view.base);
            let units = (view.bytes >> g.unit_shift) as u64;
            let node = Node::covering(depth, g.unit_in_chunk(view.base), units);
            if !allocated.remove(&(chunk, node)) {
                findings
                    .push(format!("slab at {} ({} bytes): its block is not an allocated node", view.base, view.bytes));
            }
            block_bytes_walked = block_bytes_walked.saturating_sub(view.bytes);
            for at in (view.base..view.base + view.bytes).step_by(1 << self.arena.slabs.classes.granule_shift) {
                if self.arena.slabs.lookup(at).map(|r| r.id) != Some(view.id) {
                    findings.push(format!(
                        "slab at {}: directory entry for {at} is {:?}",
                        view.base,
                        self.arena.slabs.lookup(at)
                    ));
                }
            }
            let all_free = classes[view.class].objects_mask();
            slab_objects[view.class] += u64::from((!view.free & all_free).count_ones());
        }
        // Cached freed blocks (`arena/block_cache.rs`): allocated in their trees, counted free.
        let bytes_of = |class: usize| g.cached_layout(class).units * g.min_block as u64;
        let opened_bytes = opened_to.saturating_mul(g.chunk_size);
        findings.extend(self.arena.block_caches.findings(bytes_of, opened_bytes));
        for (offset, class) in self.arena.block_caches.cached() {
            let (chunk, within) = (g.chunk_of(offset), g.unit_in_chunk(offset));
            if !matches!(self.arena.global.state(chunk), ChunkState::Core(_)) || offset % self.config.bank_size != 0 {
                findings.push(format!("cached block at {offset}: not on a bank of a core chunk"));
                continue;
            }
            for p in g.cached_layout(class).pieces_at(depth, within) {
                if !allocated.remove(&(chunk, p)) {
                    findings.push(format!("cached block at {offset}: node {p:?} is not allocated (or shared)"));
                }
            }
            block_bytes_walked = block_bytes_walked.saturating_sub(bytes_of(class) as usize);
        }
        // What chunk states and front words say blocks hold in core chunks (a block of the raw
        // API has no handle to vouch for it below), now that the slabs' and the cached freed
        // blocks' nodes are out of `allocated`.
        for debt in owed {
            findings.extend(debt.unpaid(self, &allocated));
        }
        let mut slab_handles = vec![0u64; classes.len()];

        // Handles: each names an allocated block, inside the arena, aligned, bank-safe.
        let mut extents: Vec<(usize, usize, Handle)> = Vec::new();
        let mut listed = Ok(());
        let mut live = 0usize;
        let bank = self.config.bank_size;
        self.handles.for_each_live(&mut |h, info| {
            if listed.is_err() {
                return;
            }
            live += 1;
            let align = 1usize << info.align_log2;
            let bytes = self.block_bytes_at(info.offset, info.size, align);
            if info.offset + info.size > g.usable_capacity() {
                findings.push(format!("block {h:?}: [{}, +{}) ends past the arena", info.offset, info.size));
                return;
            }
            if info.offset % align != 0 {
                findings.push(format!("block {h:?}: offset {} not aligned to {align}", info.offset));
            }
            let bank_ok = if info.size <= bank {
                info.offset / bank == (info.offset + info.size - 1) / bank
            } else {
                info.offset % bank == 0
            };
            if !bank_ok {
                findings
                    .push(format!("block {h:?}: [{}, +{}) breaks the bank rule (bank {bank})", info.offset, info.size));
            }
            if let Some(slab) = self.arena.slabs.lookup(info.offset) {
                let class = slab.class;
                if !self.arena.slabs.is_allocated(slab, info.offset) {
                    findings.push(format!("block {h:?}: slab object at {} is not allocated", info.offset));
                }
                if info.size > classes[class].size {
                    findings.push(format!(
                        "block {h:?}: {} bytes in a {}-byte slab object",
                        info.size, classes[class].size
                    ));
                }
                slab_handles[class] += 1;
                listed = try_push(&mut extents, (info.offset, bytes, h), "check()'s block extents");
                return;
            }
            let chunk = info.offset / g.chunk_size;
            match self.arena.global.state(chunk) {
                ChunkState::RunHead(len) => {
                    if info.offset % g.chunk_size != 0 || info.size.div_ceil(g.chunk_size) != len {
                        findings.push(format!("block {h:?}: does not match the run at chunk {chunk}"));
                    }
                }
                ChunkState::Core(_)
                    if g.unit_in_chunk(info.offset) as usize * g.min_block + info.size > g.chunk_size =>
                {
                    // Requested bytes past the chunk's end: a block with a front.
                    let Some(f) = FrontLayout::of(g, info.offset, info.size) else {
                        findings.push(format!("block {h:?}: crosses the end of chunk {chunk} but has no front"));
                        return;
                    };
                    let mut parts: Vec<(usize, Node)> = f.front_nodes(g).map(|n| (chunk, n)).collect();
                    parts.extend(f.tail_nodes(g).map(|n| (f.tail_chunk(), n)));
                    for (c, p) in parts {
                        if !allocated.remove(&(c, p)) {
                            findings.push(format!("block {h:?}: node {p:?} of chunk {c} is not allocated (or shared)"));
                        }
                    }
                    if self.arena.fronts[chunk].load(Ordering::Acquire) != f.name(g) {
                        findings.push(format!("block {h:?}: the front word of chunk {chunk} does not name it"));
                    }
                    let whole = ChunkState::FrontedRun { len: f.chunks, tail: f.tail_units };
                    if f.chunks > 0 && self.arena.global.state(f.first_whole()) != whole {
                        findings.push(format!(
                            "block {h:?}: chunk {} is {:?}, not its {whole:?}",
                            f.first_whole(),
                            self.arena.global.state(f.first_whole())
                        ));
                    }
                }
                ChunkState::Core(_) => match g.layout(info.size, 1) {
                    Layout::Buddy(b) => {
                        let within = ((info.offset % g.chunk_size) / g.min_block) as u64;
                        if info.offset % g.min_block != 0 || within + b.units > g.units_per_chunk() {
                            findings.push(format!("block {h:?}: offset {} is not a block start", info.offset));
                        } else {
                            // At its enclosing node's start, or packed anywhere by a compaction.
                            for p in b.pieces_at(depth, within) {
                                if !allocated.remove(&(chunk, p)) {
                                    findings.push(format!(
                                        "block {h:?}: node {p:?} of chunk {chunk} is not allocated (or shared)"
                                    ));
                                }
                            }
                        }
                    }
                    Layout::Run { .. } | Layout::RunTail { .. } => {
                        findings.push(format!("block {h:?}: run-sized block inside a core chunk"))
                    }
                },
                ChunkState::TailedRunHead(len) => match g.layout(info.size, 1) {
                    Layout::RunTail { chunks, tail, .. } if chunks == len && info.offset % g.chunk_size == 0 => {
                        // Its tail: the first nodes of the core chunk after the run.
                        let last = chunk + len;
                        for p in tail.pieces_at(depth, 0) {
                            if !allocated.remove(&(last, p)) {
                                findings.push(format!(
                                    "block {h:?}: node {p:?} of its tail in chunk {last} is not allocated (or shared)"
                                ));
                            }
                        }
                    }
                    _ => findings.push(format!("block {h:?}: does not match the run with a tail at chunk {chunk}")),
                },
                other => findings.push(format!("block {h:?}: its chunk {chunk} is {other:?}")),
            }
            listed = try_push(&mut extents, (info.offset, bytes, h), "check()'s block extents");
        });
        listed?;
        // In place (a stable sort allocates); the slot breaks ties, so the order is the same.
        extents.sort_unstable_by_key(|&(offset, len, h)| (offset, len, h.slot()));
        for pair in extents.windows(2) {
            let ((a_off, a_len, a), (b_off, _, b)) = (pair[0], pair[1]);
            if a_off + a_len > b_off {
                findings.push(format!("blocks {a:?} and {b:?} overlap at offset {b_off}"));
            }
        }
        // Counters. Blocks of the raw (offset) API have no handle: the counters say how many.
        let totals = self.counters.totals();
        let slab_totals = self.counters.class_totals();
        let slab_counted: u64 = slab_totals.iter().map(|t| t.allocs.saturating_sub(t.frees)).sum();
        let blocks_counted = totals.allocs() as i128 - totals.frees as i128 + slab_counted as i128;
        if blocks_counted < live as i128 {
            findings.push(format!("counters say {blocks_counted} live blocks, but {live} handles are live"));
        }
        let raw_live = (blocks_counted - live as i128).max(0) as usize;
        if raw_live == 0 && !allocated.is_empty() {
            findings.push(format!("{} allocated node(s) belong to no live block (leaked)", allocated.len()));
        }
        if totals.bytes.max(0) as usize != block_bytes_walked || totals.bytes < 0 {
            findings.push(format!("counters say {} bytes in use, the walk finds {block_bytes_walked}", totals.bytes));
        }
        for (k, t) in slab_totals.iter().enumerate() {
            let counted = t.allocs.saturating_sub(t.frees);
            if counted != slab_objects[k] {
                findings.push(format!(
                    "slab class {}: counters say {counted} objects in use, the slabs hold {}",
                    classes[k].size, slab_objects[k]
                ));
            }
            if raw_live == 0 && slab_handles[k] != slab_objects[k] {
                findings.push(format!(
                    "slab class {}: {} objects allocated but {} handles point at them",
                    classes[k].size, slab_objects[k], slab_handles[k]
                ));
            }
        }
        let mut cached = Vec::new();
        self.counters.for_each_slot_cache(|cache| cached.extend(cache.held()));
        cached.sort_unstable();
        if cached.windows(2).any(|w| w[0] == w[1]) {
            findings.push("handle table: a free slot is in two threads' caches (or twice in one)".to_string());
        }
        if let Some(&slot) = cached.iter().find(|&&slot| !self.handles.is_free_slot(slot)) {
            findings.push(format!("handle table: slot {slot} is in a thread's cache of free slots but not free"));
        }
        let listed = self.handles.count_free_listed() + cached.len();
        let retired = self.handles.slots_retired();
        if listed + live + retired != self.handles.slots_used() {
            findings.push(format!(
                "handle table: {live} live + {listed} free-listed + {retired} retired != {} slots used (a slot was lost)",
                self.handles.slots_used()
            ));
        }
        if findings.is_empty() {
            Ok(Some(live + raw_live))
        } else {
            Err(Error::Corruption(findings))
        }
    }
}

/// Nodes of core chunks that a chunk state or a front word says a block holds, looked up once
/// the walk has listed every core chunk's allocated nodes.
enum Owed {
    /// The first unit of the core chunk after the run of `len` chunks at `head`, which has a
    /// tail (no state records the tail's length: at least its first unit is allocated).
    TailStart { head: usize, len: usize },
    /// The front, the whole chunks and the tail of the block that core chunk `chunk`'s front
    /// word `word` names.
    Front { chunk: usize, word: u64 },
}

impl Owed {
    /// What is wrong, given `allocated` (every core chunk's allocated nodes).
    fn unpaid(self, pool: &Pool, allocated: &HashSet<(usize, Node)>) -> Vec<String> {
        let g = &pool.arena.geometry;
        let mut findings = Vec::new();
        match self {
            Owed::TailStart { head, len } => {
                let tail_chunk = head + len;
                let held = (0..=g.depth).any(|level| allocated.contains(&(tail_chunk, Node { level, index: 0 })));
                if !held {
                    findings.push(format!(
                        "chunk {head}: the run of {len} chunks has a tail, but chunk {tail_chunk}'s first unit is free"
                    ));
                }
            }
            Owed::Front { chunk, word } => {
                let Some(f) = FrontLayout::named(g, chunk, word) else {
                    findings.push(format!("chunk {chunk}: its front word {word:#x} names no block it could hold"));
                    return findings;
                };
                let parts = f.front_nodes(g).map(|n| (chunk, n)).chain(f.tail_nodes(g).map(|n| (f.tail_chunk(), n)));
                for (c, n) in parts {
                    if !allocated.contains(&(c, n)) {
                        findings.push(format!(
                            "chunk {chunk}: node {n:?} of chunk {c}, of the block its front word names, is not allocated"
                        ));
                    }
                }
                let whole = ChunkState::FrontedRun { len: f.chunks, tail: f.tail_units };
                let state = pool.arena.global.state(f.first_whole());
                if f.chunks > 0 && state != whole {
                    findings.push(format!(
                        "chunk {chunk}: its front word names {whole:?} at chunk {}, which is {state:?}",
                        f.first_whole()
                    ));
                }
            }
        }
        findings
    }
}

/// How many chunks [`Pool::check_until`] walks between two questions to its caller.
pub const CHECK_STEP: usize = 1 << 16;

/// What is wrong with `chunk` (in `state`, `taken` in the bitmap) as the regions see it: a chunk
/// outside every region must be absent and taken, one inside must not be absent.
fn region_finding(regions: &[(usize, usize)], chunk: usize, state: ChunkState, taken: bool) -> Option<String> {
    let inside = Regions::contains(regions, chunk);
    match (inside, state == ChunkState::Absent) {
        (true, true) => Some(format!("chunk {chunk}: inside a region but absent")),
        (false, false) => Some(format!("chunk {chunk} ({state:?}): outside every region")),
        (false, true) if !taken => Some(format!("chunk {chunk}: absent but free in the bitmap")),
        _ => None,
    }
}

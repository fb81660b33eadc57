//! Moving live blocks (compaction, issue 5): a held pause, validated batches of moves, and the
//! compaction planners that make such batches.
//!
//! * [`Pool::pause`] closes the stop gate and waits for calls in flight (with a timeout); the
//!   [`PauseToken`] it returns keeps the pool paused across as many calls as the caller needs
//!   (plan, move, check), until [`Pool::resume`]. The thread that paused may still allocate and
//!   free meanwhile (it is the only one); while it moves blocks, its own calls are refused.
//! * [`Pool::move_blocks`] moves a batch of blocks to the places the caller names: each source a
//!   live, unpinned block (marked *moving*, so no pin or free slips in), each destination inside
//!   the arena, aligned, bank-safe, where a block of its kind can start (a slab object: a free
//!   object of a slab of its size class; a buddy block: a buddy node in a core chunk, granted from
//!   the global pool if need be; a run: whole free chunks), overlapping no other destination and
//!   no block that stays. Destinations may overlap moving sources (slides). Everything is taken
//!   in the metadata before a byte moves; then the bytes are copied in an order that never
//!   overwrites bytes still to be read (`order.rs`; a cycle is broken through a bounce buffer on
//!   host memory, or through free space of the arena when the caller copies), or handed to the
//!   caller's *mover* (`backing="none"`: the bytes are on a device) before anything is re-pointed. If the mover fails, every reservation
//!   is undone: the pool and every handle are as before.
//! * [`Pool::compact_step`] plans and runs batches: a full compaction (slab packing, then packing
//!   below a boundary: every block above a boundary chunk packed into the holes at or below
//!   it; a repack when that promises much more), an incremental step (chunks above the
//!   boundary evacuated sparsest first, at most `max_bytes` of moves per step), or the
//!   evacuation of chunks the caller names.
//!   [`Pool::plan_compaction`] answers what a compaction would move, moving nothing.
//!
//! Pinned blocks (explicit pins, live buffer views) never move.

mod copy;
mod execute;
mod model;
mod order;
mod plan;

use std::collections::HashSet;
use std::time::{Duration, Instant};

pub use order::Transfer;

use crate::arena::global::ChunkState;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::pool::pause::PauseToken;
use crate::pool::pool::Pool;
use execute::{Kind, Unit};
use model::Model;

/// How many bytes more than the packing below a boundary a full compaction's repack may move
/// when it packs tighter: 32 MiB, about 3 ms of copying on the machines measured.
pub(crate) const REPACK_ALLOWANCE: usize = 32 << 20;

/// One move of a batch: the block behind `handle` goes to offset `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The block.
    pub handle: Handle,
    /// Where it goes.
    pub to: usize,
}

/// The caller's copy function for a batch (`backing="none"`: the bytes live on a device): it
/// gets every transfer, in the order to perform them (each one like `memmove`), before any
/// handle is re-pointed; `Err(why)` undoes the batch.
pub type Mover<'a> = &'a mut (dyn FnMut(&[Transfer]) -> std::result::Result<(), String> + 'a);

/// A mover borrowed for one batch (its own lifetime may be longer than the borrow).
pub(crate) type BatchMover<'r, 'o> = &'r mut (dyn FnMut(&[Transfer]) -> std::result::Result<(), String> + 'o);

/// What a batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MovedBlocks {
    /// Blocks re-pointed (a moved slab counts its objects).
    pub blocks: usize,
    /// Bytes copied.
    pub bytes: usize,
    /// The copies, in the order they were performed.
    pub transfers: Vec<Transfer>,
    /// Sources saved elsewhere to break cycles: to a host bounce buffer, or, when the caller
    /// copies the bytes (a mover, or a pool without host memory), to free space of the arena
    /// (then `transfers` holds the copy there and the copy back).
    pub bounced: usize,
    /// Chunks that went back to the global pool afterwards.
    pub chunks_freed: usize,
    /// How long the batch took.
    pub elapsed: Duration,
}

/// What a compaction does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompactionMode {
    /// Pack slab objects, then empty chunks from the end of the arena into the holes below.
    Full,
    /// One step: move at most `max_bytes` bytes of blocks from the chunks at the end of the
    /// arena into the holes below them (and runs down into the room that makes).
    Incremental { max_bytes: usize },
    /// Empty exactly these chunks (by index: offset / chunk size).
    Evacuate { chunks: Vec<usize> },
}

/// One move a plan would make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    /// Where the block (or slab) is.
    pub from: usize,
    /// Where it would go.
    pub to: usize,
    /// Bytes to copy.
    pub bytes: usize,
    /// Blocks it re-points (a slab: its objects).
    pub blocks: usize,
    /// `"block"`, `"slab object"`, `"run"` or `"slab"`.
    pub kind: &'static str,
    /// The block's handle (`None` for a whole slab).
    pub handle: Option<Handle>,
}

/// What a compaction would do (nothing moved).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// Every move, in the order the batches would run them.
    pub moves: Vec<PlannedMove>,
    /// Blocks it would move.
    pub blocks: usize,
    /// Bytes it would copy.
    pub bytes: usize,
    /// Chunks it would give back to the global pool.
    pub chunks_emptied: usize,
    /// The pool's `bytes_free` now.
    pub bytes_free: usize,
    /// The largest free block now.
    pub largest_free_before: usize,
    /// The largest free block expected afterwards.
    pub largest_free_after: usize,
}

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Blocks moved.
    pub blocks: usize,
    /// Bytes copied.
    pub bytes: usize,
    /// Batches run.
    pub batches: usize,
    /// Copies made (each a `memmove` or one mover transfer).
    pub transfers: usize,
    /// Chunks given back to the global pool.
    pub chunks_freed: usize,
    /// Time spent planning.
    pub planning: Duration,
    /// Time spent moving (metadata, bytes, handles).
    pub moving: Duration,
}

impl StepReport {
    fn add(&mut self, batch: MovedBlocks) {
        self.blocks += batch.blocks;
        self.bytes += batch.bytes;
        self.batches += 1;
        self.transfers += batch.transfers.len();
        self.chunks_freed += batch.chunks_freed;
        self.moving += batch.elapsed;
    }
}

impl Pool {
    /// Move a batch of blocks (see the module documentation) while `token` holds the pause.
    /// Nothing moves unless every move can: [`Error::Batch`] names the first refused move (a
    /// pinned or freed block, a destination outside the arena, misaligned, not free, ...);
    /// [`Error::MoveCycle`] when the moves overwrite each other in a cycle that needs free space
    /// of the arena to bounce through and there is not enough (only when the caller copies the
    /// bytes); [`Error::MoverFailed`] when the mover failed (undone).
    pub fn move_blocks(&self, token: &PauseToken, moves: &[Move], mover: Option<Mover<'_>>) -> Result<MovedBlocks> {
        let _busy = self.busy(token)?;
        let mut units: Vec<Unit> = Vec::with_capacity(moves.len());
        let release = |units: &[Unit]| {
            for u in units {
                for h in u.handles() {
                    self.handles().end_move(h);
                }
            }
        };
        for (i, m) in moves.iter().enumerate() {
            let info = match self.handles().begin_move(m.handle) {
                Ok(info) => info,
                Err(e) => {
                    release(&units);
                    return Err(Error::batch(i, e));
                }
            };
            let unit = self.unit_of(m.handle, &info).and_then(|mut u| {
                u.to = m.to;
                self.check_destination(&u).map_err(|reason| Error::InvalidMove { reason })?;
                Ok(u)
            });
            match unit {
                Ok(u) => units.push(u),
                Err(e) => {
                    self.handles().end_move(m.handle);
                    release(&units);
                    return Err(Error::batch(i, e));
                }
            }
        }
        let mut by_to: Vec<usize> = (0..units.len()).collect();
        by_to.sort_by_key(|&i| (units[i].to, i));
        for pair in by_to.windows(2) {
            let (a, b) = (&units[pair[0]], &units[pair[1]]);
            if a.to + a.extent > b.to {
                let reason = format!("its destination overlaps the destination of move {}", pair[0]);
                release(&units);
                return Err(Error::batch(pair[1], Error::InvalidMove { reason }));
            }
        }
        let index = (0..units.len()).collect();
        self.execute(units, index, Vec::new(), mover)
    }

    /// Run a compaction while `token` holds the pause (see [`CompactionMode`]); `mover` copies
    /// the bytes for `backing="none"` pools. Every compaction the caller copies for (a mover, or
    /// a pool without host memory) is one batch, so one mover call: if it fails, everything is
    /// undone and the pool is exactly as it was. (On host memory, without a mover, a full
    /// compaction first packs slab objects into fewer slabs, a batch of its own; on a device
    /// slabs move whole instead.)
    pub fn compact_step(
        &self,
        token: &PauseToken,
        mode: &CompactionMode,
        mut mover: Option<Mover<'_>>,
    ) -> Result<StepReport> {
        let _busy = self.busy(token)?;
        let mut out = StepReport::default();
        let started = Instant::now();
        match mode {
            CompactionMode::Full => {
                // No trim before the first batch: a failing mover must leave the pool exactly as
                // it was, caches included (empty chunks and all-free slabs go after a batch).
                // One census for both batches: every unpinned block is marked moving now.
                let mut census = self.census(true);
                let caller_copies = mover.is_some() || self.arena().backing.is_none();
                let (packing, emptied) =
                    if caller_copies { (Vec::new(), Vec::new()) } else { self.plan_slab_packing(&census) };
                out.planning += started.elapsed();
                if !packing.is_empty() {
                    let n = packing.len();
                    let moved = packing.clone();
                    match self.execute(packing, (0..n).collect(), Vec::new(), mover.as_deref_mut()) {
                        Ok(done) => out.add(done),
                        Err(e) => {
                            release_claimed(self, &census, &SlotSet::default(), &moved);
                            return Err(e);
                        }
                    }
                    self.arena().reclaim_all();
                    census = self.advance(census, &emptied, &moved);
                }
                let planned = Instant::now();
                let (slide, _) = self.plan_full(&census, Model::of(self), caller_copies);
                let moving: SlotSet = slide.iter().flat_map(Unit::handles).collect();
                release_claimed(self, &census, &moving, &[]);
                out.planning += planned.elapsed();
                if !slide.is_empty() {
                    let n = slide.len();
                    out.add(self.execute(slide, (0..n).collect(), Vec::new(), mover.as_deref_mut())?);
                }
                out.chunks_freed += self.arena().reclaim_all();
            }
            CompactionMode::Incremental { max_bytes } => {
                let census = self.census(false);
                let mut model = Model::of(self);
                let contents = self.chunk_contents(&census);
                let candidates = self.evacuation_order(&census, &model, &contents);
                let (mut units, emptied) = self
                    .plan_evacuation(&census, &contents, &mut model, &candidates, Some(*max_bytes), false)
                    .map_err(|reason| Error::InvalidMove { reason })?;
                let spent: usize = units.iter().map(Unit::copy_len).sum();
                let emptied = clean_chunks(self, &units, emptied);
                units.extend(self.plan_run_slides(&census, &mut model, &emptied, max_bytes.saturating_sub(spent)));
                let units = self.claim_units(units);
                out.planning += started.elapsed();
                if !units.is_empty() {
                    let n = units.len();
                    out.add(self.execute(units, (0..n).collect(), Vec::new(), mover.as_deref_mut())?);
                }
            }
            CompactionMode::Evacuate { chunks } => {
                if let Some(&bad) = chunks.iter().find(|&&c| c >= self.arena().geometry.chunks) {
                    return Err(Error::InvalidMove {
                        reason: format!(
                            "chunk {bad} does not exist (the arena has {} chunks)",
                            self.arena().geometry.chunks
                        ),
                    });
                }
                let census = self.census(false);
                let mut model = Model::of(self);
                let (units, _) = self
                    .plan_evacuation(&census, &self.chunk_contents(&census), &mut model, chunks, None, true)
                    .map_err(|reason| Error::InvalidMove { reason })?;
                let wanted = units.len();
                let units = self.claim_units(units);
                if units.len() != wanted {
                    release_units(self, &units);
                    return Err(Error::InvalidMove { reason: "a block of the chunks was pinned meanwhile".into() });
                }
                out.planning += started.elapsed();
                if !units.is_empty() {
                    let n = units.len();
                    out.add(self.execute(units, (0..n).collect(), Vec::new(), mover)?);
                }
            }
        }
        Ok(out)
    }

    /// What [`Pool::compact_step`] without a mover would move, moving nothing. Pauses the pool for
    /// the look unless `token` holds the pause already.
    pub fn plan_compaction(&self, token: Option<&PauseToken>, mode: &CompactionMode) -> Result<CompactionPlan> {
        self.plan_compaction_with(token, mode, false)
    }

    /// What [`Pool::compact_step`] would move, moving nothing; `with_mover`: as it would with a
    /// mover (no slab packing in a full compaction: one batch, see [`Pool::compact_step`]).
    pub fn plan_compaction_with(
        &self,
        token: Option<&PauseToken>,
        mode: &CompactionMode,
        with_mover: bool,
    ) -> Result<CompactionPlan> {
        let caller_copies = with_mover || self.arena().backing.is_none();
        let _paused = match token {
            Some(t) if self.holds(t) => None,
            Some(_) => return Err(Error::NotPaused),
            None => Some(self.pause_for_maintenance()?),
        };
        let stats = self.stats();
        let census = self.census(false);
        let mut model = Model::of(self);
        let mut units: Vec<Unit> = Vec::new();
        let mut emptied: Vec<usize> = Vec::new();
        match mode {
            CompactionMode::Full => {
                // All-free slabs go back first; the packed slabs' emptied blocks are free too.
                // (When the caller copies: no slab packing, see `compact_step`.)
                let (packing, _) =
                    if caller_copies { (Vec::new(), Vec::new()) } else { self.plan_slab_packing(&census) };
                let mut leaving: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
                for u in &packing {
                    if let Kind::SlabObject { from_slab, .. } = u.kind {
                        *leaving.entry(from_slab.id).or_default() += 1;
                    }
                }
                let g = &self.arena().geometry;
                let mut kept = census.slabs.clone();
                // Without the packing batch nothing is reclaimed before the moves (all-free
                // slabs stay where they are until after the batch).
                kept.retain(|v| {
                    if caller_copies {
                        return true;
                    }
                    let class = &self.arena().slabs.classes.classes[v.class];
                    let live = (class.objects - (v.free & class.all_free()).count_ones()) as usize;
                    let empties = live == leaving.get(&v.id).copied().unwrap_or(0);
                    if empties {
                        model.vacate(g.chunk_of(v.base), g.unit_in_chunk(v.base), (v.bytes >> g.unit_shift) as u64);
                    }
                    !empties
                });
                let after_packing = plan::Census { slabs: kept, ..census };
                let (slide, after) = self.plan_full(&after_packing, model, caller_copies);
                model = after;
                units.extend(packing);
                units.extend(slide);
            }
            CompactionMode::Incremental { max_bytes } => {
                let contents = self.chunk_contents(&census);
                let candidates = self.evacuation_order(&census, &model, &contents);
                let (u, e) = self
                    .plan_evacuation(&census, &contents, &mut model, &candidates, Some(*max_bytes), false)
                    .map_err(|reason| Error::InvalidMove { reason })?;
                units = u;
                let spent: usize = units.iter().map(Unit::copy_len).sum();
                let clean = clean_chunks(self, &units, e.clone());
                units.extend(self.plan_run_slides(&census, &mut model, &clean, max_bytes.saturating_sub(spent)));
                emptied = e;
            }
            CompactionMode::Evacuate { chunks } => {
                let (u, e) = self
                    .plan_evacuation(&census, &self.chunk_contents(&census), &mut model, chunks, None, true)
                    .map_err(|reason| Error::InvalidMove { reason })?;
                units = u;
                emptied = e;
            }
        }
        for &c in &emptied {
            model.set_run(c, 1, false);
        }
        let before_empty = (0..self.arena().geometry.chunks)
            .filter(|&c| {
                self.arena().global.state(c) == ChunkState::Free
                    || (matches!(self.arena().global.state(c), ChunkState::Core(_)) && self.arena().chunk_is_empty(c))
            })
            .count();
        let after_empty = (0..self.arena().geometry.chunks).filter(|&c| model.is_empty(c)).count();
        let largest_free_after = model
            .largest_free(&|c| self.arena().geometry.chunk_bytes(c))
            .max(if units.is_empty() { stats.largest_free_block } else { 0 });
        let moves: Vec<PlannedMove> = units
            .iter()
            .map(|u| PlannedMove {
                from: u.from,
                to: u.to,
                bytes: u.copy_len(),
                blocks: u.blocks(),
                kind: match u.kind {
                    Kind::SlabObject { .. } => "slab object",
                    Kind::Buddy => "block",
                    Kind::Run { .. } => "run",
                    Kind::Slab { .. } => "slab",
                },
                handle: u.handle,
            })
            .collect();
        Ok(CompactionPlan {
            blocks: moves.iter().map(|m| m.blocks).sum(),
            bytes: moves.iter().map(|m| m.bytes).sum(),
            moves,
            chunks_emptied: after_empty.saturating_sub(before_empty),
            bytes_free: stats.bytes_free,
            largest_free_before: stats.largest_free_block,
            largest_free_after,
        })
    }

    /// The second batch of a full compaction: packing below a boundary (about half the blocks
    /// move). It leaves holes below the boundary that no block above it fits, which a repack
    /// (every block re-placed; `downward`, a slide) would fill, at the price of moving nearly
    /// every block. The repack is planned too, and taken when it makes the largest free block
    /// larger, if
    ///
    /// * it moves at most [`REPACK_ALLOWANCE`] bytes more than the packing (a few milliseconds
    ///   of copying: small pools always get the tightest packing), or
    /// * the packing leaves more than a sixteenth of the free bytes beyond what any packing
    ///   leaves (the bank rule's slack and one partly filled chunk) and the repack gains more
    ///   than that sixteenth (on 100k blocks it pauses 2.9x a memmove of the live bytes, the
    ///   packing 1.7x).
    ///
    /// Returns the moves and the model after them.
    fn plan_full(&self, census: &plan::Census, model: Model, downward: bool) -> (Vec<Unit>, Model) {
        let bytes = |c: usize| self.arena().geometry.chunk_bytes(c);
        let mut packed = model.clone();
        let few = self.plan_pack(census, &mut packed);
        let largest = packed.largest_free(&bytes);
        let free = packed.free_bytes(&bytes);
        let outside = free.saturating_sub(largest);
        let slack = self.bank_slack(census);
        let moved: usize = few.iter().map(Unit::copy_len).sum();
        let cheap = self.movable_bytes(census).saturating_sub(moved) <= REPACK_ALLOWANCE;
        let gain = if cheap { 1 } else { free / 16 + 1 };
        if outside <= slack + if cheap { 0 } else { self.arena().geometry.chunk_size + free / 16 } {
            return (few, packed); // nothing a repack could gain, or not enough for its cost
        }
        let mut tight = model;
        match self.plan_slide(census, &mut tight, downward) {
            Some(all) if tight.largest_free(&bytes) >= largest + gain => (all, tight),
            _ => (few, packed),
        }
    }

    /// Mark every handle of `units` moving; units with a block that cannot be marked (pinned
    /// since the plan was made) are dropped.
    fn claim_units(&self, units: Vec<Unit>) -> Vec<Unit> {
        units
            .into_iter()
            .filter(|u| {
                let handles = u.handles();
                for (k, &h) in handles.iter().enumerate() {
                    if self.handles().begin_move(h).is_err() {
                        for &done in &handles[..k] {
                            self.handles().end_move(done);
                        }
                        return false;
                    }
                }
                true
            })
            .collect()
    }
}

/// The chunks of `emptied` that are empty during the batch already: a chunk whose slab objects
/// move out still holds the slab's block until the batch tidies it afterwards.
fn clean_chunks(pool: &Pool, units: &[Unit], emptied: Vec<usize>) -> Vec<usize> {
    let dirty: HashSet<usize> = units
        .iter()
        .filter(|u| matches!(u.kind, Kind::SlabObject { .. }))
        .map(|u| pool.arena().geometry.chunk_of(u.from))
        .collect();
    emptied.into_iter().filter(|c| !dirty.contains(c)).collect()
}

/// A set of handles by slot index (a bitmap: slot indices are dense), for the claims of a
/// census of every live block, where a hash set costs several milliseconds.
#[derive(Default)]
struct SlotSet(Vec<u64>);

impl SlotSet {
    fn insert(&mut self, h: Handle) {
        let i = h.slot() as usize;
        if self.0.len() <= i / 64 {
            self.0.resize(i / 64 + 1, 0);
        }
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn contains(&self, h: Handle) -> bool {
        let i = h.slot() as usize;
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
}

impl FromIterator<Handle> for SlotSet {
    fn from_iter<I: IntoIterator<Item = Handle>>(iter: I) -> SlotSet {
        let mut set = SlotSet::default();
        iter.into_iter().for_each(|h| set.insert(h));
        set
    }
}

/// Clear the marks of the census's claimed blocks, except `keep` and the blocks of `done` (whose
/// batch cleared them already). A slot holds one live block at a time, so slots name them.
fn release_claimed(pool: &Pool, census: &plan::Census, keep: &SlotSet, done: &[Unit]) {
    let done: SlotSet = done.iter().filter_map(|u| u.handle).collect();
    for h in census.claimed() {
        if !keep.contains(h) && !done.contains(h) {
            pool.handles().end_move(h);
        }
    }
}

fn release_units(pool: &Pool, units: &[Unit]) {
    for u in units {
        for h in u.handles() {
            pool.handles().end_move(h);
        }
    }
}

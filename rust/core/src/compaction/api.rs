//! The compaction's `Pool` methods: [`Pool::move_blocks`] (one batch the caller names),
//! [`Pool::compact_step`] (a compaction: planned, then run batch by batch) and
//! [`Pool::plan_compaction`] (the same compaction plan, summarized, nothing moved).

use std::time::Instant;

use super::census::Census;
use super::model::Model;
use super::piece::Piece;
use super::planners::plan_compaction_moves;
use super::types::{CompactionMode, CompactionPlan, Move, MovedBlocks, Mover, PlannedMove, StepReport};
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::pool::pause::PauseToken;
use crate::pool::pool::Pool;

impl Pool {
    /// Move a batch of blocks (see the module documentation) while `token` holds the pause.
    /// Nothing moves unless every move can: [`Error::Batch`] names the first refused move (a
    /// pinned or freed block, a destination outside the arena, misaligned, not free, ...);
    /// [`Error::MoveCycle`] when the moves overwrite each other in a cycle that needs free space
    /// of the arena to bounce through and there is not enough (only when the caller copies the
    /// bytes); [`Error::MoverFailed`] when the mover failed (undone).
    pub fn move_blocks(&self, token: &PauseToken, moves: &[Move], mover: Option<Mover<'_>>) -> Result<MovedBlocks> {
        let _busy = self.busy(token)?;
        // A destination may lie in a cached freed block: give those back first.
        self.arena().drain_block_caches();
        let mut pieces: Vec<Piece> = Vec::with_capacity(moves.len());
        let release = |pieces: &[Piece]| release_pieces(self, pieces);
        for (i, m) in moves.iter().enumerate() {
            let info = match self.handles().begin_move(m.handle) {
                Ok(info) => info,
                Err(e) => {
                    release(&pieces);
                    return Err(Error::batch(i, e));
                }
            };
            let piece = self.piece_of(m.handle, &info).and_then(|mut p| {
                p.to = m.to;
                self.check_destination(&p).map_err(|reason| Error::InvalidMove { reason })?;
                Ok(p)
            });
            match piece {
                Ok(p) => pieces.push(p),
                Err(e) => {
                    self.handles().end_move(m.handle);
                    release(&pieces);
                    return Err(Error::batch(i, e));
                }
            }
        }
        let mut by_to: Vec<usize> = (0..pieces.len()).collect();
        by_to.sort_by_key(|&i| (pieces[i].to, i));
        for pair in by_to.windows(2) {
            let (a, b) = (&pieces[pair[0]], &pieces[pair[1]]);
            if a.to + a.extent > b.to {
                let reason = format!("its destination overlaps the destination of move {}", pair[0]);
                release(&pieces);
                return Err(Error::batch(pair[1], Error::InvalidMove { reason }));
            }
        }
        let index = (0..pieces.len()).collect();
        self.execute(pieces, index, Vec::new(), mover)
    }

    /// Run a compaction while `token` holds the pause (see [`CompactionMode`]); `mover` copies
    /// the bytes for `backing="none"` pools. Such a pool compacted without a mover has its
    /// blocks re-pointed and no byte copied: right for a pool whose bytes nobody keeps (a
    /// model of a device, a plan), wrong wherever the device holds data (then give a mover, as
    /// `Compactor` in Python insists). Every compaction the caller copies for (a mover, or
    /// a pool without host memory) is one batch: if the mover fails, everything is undone and the
    /// pool (and every block's bytes) is exactly as it was. (On host memory, without a mover, a full
    /// compaction first consolidates slabs, a batch of its own; on a device slabs move whole
    /// instead.) The moves are those [`Pool::plan_compaction`] reports.
    pub fn compact_step(
        &self,
        token: &PauseToken,
        mode: &CompactionMode,
        mut mover: Option<Mover<'_>>,
    ) -> Result<StepReport> {
        let _busy = self.busy(token)?;
        self.check_compaction_headroom()?;
        let mut out = StepReport::default();
        let free_before = self.arena().global.free_chunks();
        let started = Instant::now();
        let full = matches!(mode, CompactionMode::Full);
        let caller_copies = mover.is_some() || self.arena().backing.is_none();
        // No trim before the first batch when the caller copies: a failing mover must leave
        // the pool exactly as it was, caches included (empty chunks and all-free slabs go after
        // a batch). On host memory a full compaction gives them back first, as its planners
        // expect, so that their room is not in the way of the moves. Every mode marks every
        // unpinned block moving as it takes the census, and clears the marks of those it does
        // not move once planned: a block pinned after the census and before its move would
        // leave a batch planned around its move with a destination that is not free.
        // Cached freed blocks would look like blocks nobody can move.
        self.arena().drain_block_caches();
        if full && !caller_copies {
            self.arena().reclaim_all();
        }
        let mut census = self.census(true);
        let model = Model::of_census(self, &census);
        let planned = plan_compaction_moves(&mut census, model, mode, caller_copies);
        let mut batches = match planned {
            Ok(schedule) => schedule.batches,
            Err(reason) => {
                release_claimed(self, &census, &SlotSet::default());
                return Err(Error::InvalidMove { reason });
            }
        };
        let moving: SlotSet = batches.iter().flatten().flat_map(Piece::handles).collect();
        release_claimed(self, &census, &moving);
        out.planning += started.elapsed();
        // Handles an earlier batch moved (its end cleared their marks).
        let mut moved = SlotSet::default();
        for k in 0..batches.len() {
            let mut batch = std::mem::take(&mut batches[k]);
            if k > 0 {
                let between = Instant::now();
                self.arena().reclaim_all();
                // The batch was planned on the arena the earlier ones leave: if the pool is not
                // what the planners expected (it cannot happen while the pause holds), stop here.
                if self.arena().slabs.views() != census.slabs {
                    for later in &batches[k..] {
                        release_unmoved(self, later, &moved);
                    }
                    release_unmoved(self, &batch, &moved);
                    out.planning += between.elapsed();
                    break;
                }
                let planned = batch.len();
                batch = self.reclaim_pieces(batch, &moved);
                out.planning += between.elapsed();
                if batch.len() != planned {
                    // A block was pinned between the batches: what is left was planned around
                    // its move, so the step ends here.
                    release_pieces(self, &batch);
                    batch.iter().flat_map(Piece::handles).for_each(|h| moved.insert(h));
                    for later in &batches[k + 1..] {
                        release_unmoved(self, later, &moved);
                    }
                    break;
                }
            }
            batch.iter().flat_map(Piece::handles).for_each(|h| moved.insert(h));
            let n = batch.len();
            match self.execute(batch, (0..n).collect(), Vec::new(), mover.as_deref_mut()) {
                Ok(done) => out.add(done),
                Err(e) => {
                    for later in &batches[k + 1..] {
                        release_unmoved(self, later, &moved);
                    }
                    return Err(e);
                }
            }
        }
        // The all-free slabs go back after the last batch too: the planners counted their room
        // free, and a chunk whose only content is one is empty for them.
        self.arena().reclaim_all();
        out.chunks_freed = self.arena().global.free_chunks().saturating_sub(free_before);
        Ok(out)
    }

    /// What [`Pool::compact_step`] without a mover would move, moving nothing. Pauses the pool for
    /// the look unless `token` holds the pause already.
    pub fn plan_compaction(&self, token: Option<&PauseToken>, mode: &CompactionMode) -> Result<CompactionPlan> {
        self.plan_compaction_with(token, mode, false)
    }

    /// What [`Pool::compact_step`] would move, moving nothing; `with_mover`: as it would with a
    /// mover (a full compaction is one batch without slab consolidation, see
    /// [`Pool::compact_step`]). The moves come from the planners `compact_step` runs.
    pub fn plan_compaction_with(
        &self,
        token: Option<&PauseToken>,
        mode: &CompactionMode,
        with_mover: bool,
    ) -> Result<CompactionPlan> {
        let caller_copies = with_mover || self.arena().backing.is_none();
        self.check_compaction_headroom()?;
        let _paused = match token {
            Some(t) if self.holds(t) => None,
            Some(_) => return Err(Error::NotPaused),
            None => Some(self.pause_for_maintenance()?),
        };
        // As `compact_step` plans: with the cached freed blocks given back to their trees.
        self.arena().drain_block_caches();
        let stats = self.stats();
        let mut census = self.census(false);
        let model = Model::of_census(self, &census);
        let schedule = plan_compaction_moves(&mut census, model, mode, caller_copies)
            .map_err(|reason| Error::InvalidMove { reason })?;
        let moves: Vec<PlannedMove> = schedule
            .batches
            .iter()
            .flatten()
            .map(|p| PlannedMove {
                from: p.from,
                to: p.to,
                bytes: p.copy_len(),
                blocks: p.blocks(),
                kind: p.kind_name(),
                handle: p.handle,
            })
            .collect();
        let moves_made = !moves.is_empty();
        let pieces: Vec<&Piece> = schedule.batches.iter().flatten().collect();
        let settled = schedule.model.settled(&census, &pieces);
        let largest_free_after = settled.largest_free().max(if moves_made { 0 } else { stats.largest_free_block });
        // A step gives back every chunk left empty, those the cores hold empty now included.
        let empty_after = (0..settled.chunks.len()).filter(|&c| settled.is_empty(c)).count();
        Ok(CompactionPlan {
            blocks: moves.iter().map(|m| m.blocks).sum(),
            bytes: moves.iter().map(|m| m.bytes).sum(),
            moves,
            chunks_emptied: empty_after.saturating_sub(self.arena().global.free_chunks()),
            bytes_free: stats.bytes_free,
            bytes_free_after: if moves_made { settled.free_bytes() } else { stats.bytes_free },
            largest_free_before: stats.largest_free_block,
            largest_free_after,
        })
    }

    /// Mark again the handles of `pieces` that an earlier batch moved (`moved`: its end cleared
    /// their marks; the others are still marked); pieces with a block that cannot be marked
    /// (pinned between the batches) are dropped, their marks cleared.
    fn reclaim_pieces(&self, pieces: Vec<Piece>, moved: &SlotSet) -> Vec<Piece> {
        pieces
            .into_iter()
            .filter(|p| {
                let handles = p.handles();
                for (k, &h) in handles.iter().enumerate() {
                    if moved.contains(h) && self.handles().begin_move(h).is_err() {
                        // Marked: those before it, and those no earlier batch moved.
                        for (j, &other) in handles.iter().enumerate() {
                            if j < k || (j > k && !moved.contains(other)) {
                                self.handles().end_move(other);
                            }
                        }
                        return false;
                    }
                }
                true
            })
            .collect()
    }
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

/// Clear the marks of the census's claimed blocks, except `keep`. A slot holds one live block at
/// a time, so slots name them.
fn release_claimed(pool: &Pool, census: &Census, keep: &SlotSet) {
    for h in census.claimed() {
        if !keep.contains(h) {
            pool.handles().end_move(h);
        }
    }
}

/// Clear the marks of every handle of `pieces`.
fn release_pieces(pool: &Pool, pieces: &[Piece]) {
    for p in pieces {
        for h in p.handles() {
            pool.handles().end_move(h);
        }
    }
}

/// Clear the marks of the handles of `pieces` that are still marked: those no earlier batch
/// moved (`moved`).
fn release_unmoved(pool: &Pool, pieces: &[Piece], moved: &SlotSet) {
    for h in pieces.iter().flat_map(Piece::handles) {
        if !moved.contains(h) {
            pool.handles().end_move(h);
        }
    }
}

//! Compactions planned while the pool runs, so that a pause costs what it moves.
//!
//! [`Pool::stage_compaction`] takes the census and the model of the arena without pausing the
//! pool and plans the compaction on them, as [`Pool::compact_step`] would; other threads go on
//! allocating and freeing meanwhile, so the plan may be stale by the time it runs.
//! [`Pool::run_staged`], on a paused pool, checks only the moves of each batch (`validate.rs`):
//! a move whose block or destination changed is dropped and counted in
//! [`StepReport::stale`], the others run. [`Pool::compact`] does both around one pause.

use std::time::{Duration, Instant};

use super::census::Census;
use super::model::Model;
use super::piece::Piece;
use super::piece::PieceKind;
use super::planners::plan_compaction_moves;
use super::types::{CompactionMode, Mover, StepReport};
use super::validate::Planned;
use crate::error::{Error, Result};
use crate::pool::pause::PauseToken;
use crate::pool::pool::Pool;

/// A compaction planned without pausing the pool (from [`Pool::stage_compaction`]), to run
/// with [`Pool::run_staged`] while the pool is paused.
#[derive(Debug)]
pub struct StagedCompaction {
    pool: u32,
    caller_copies: bool,
    full: bool,
    batches: Vec<Vec<Piece>>,
    /// Per batch, the buddy blocks the pool gives back before it (see `Schedule`).
    released: Vec<Vec<(usize, usize)>>,
    /// The units of the chunks destinations fall in, as planning saw them.
    planned: Planned,
    planning: Duration,
}

impl StagedCompaction {
    /// Moves it holds, all batches together.
    pub fn moves(&self) -> usize {
        self.batches.iter().map(Vec::len).sum()
    }

    /// Bytes its moves would copy.
    pub fn bytes(&self) -> usize {
        self.batches.iter().flatten().map(Piece::copy_len).sum()
    }

    /// How long planning took (the pool was not paused for it).
    pub fn planning(&self) -> Duration {
        self.planning
    }
}

impl Pool {
    /// Plan a compaction without pausing the pool; `with_mover`: for a run with a mover (see
    /// [`Pool::compact_step`]). The plan is the one `compact_step` would make on the arena as it
    /// was read; run it with [`Pool::run_staged`].
    pub fn stage_compaction(&self, mode: &CompactionMode, with_mover: bool) -> Result<StagedCompaction> {
        let started = Instant::now();
        let caller_copies = with_mover || self.arena().backing.is_none();
        self.check_compaction_headroom()?;
        // Cached freed blocks would look like blocks nobody can move. Giving them back changes
        // trees and counters as frees do, so it happens inside the pool as a free does: a
        // pauser (`check()`, a compaction) never finds it half done.
        {
            let _entered = self.enter()?;
            self.arena().drain_block_caches();
        }
        let mut census: Census = self.census(false);
        let model = Model::of_census(self, &census);
        let mut planned = Planned::of(&model);
        let schedule = plan_compaction_moves(&mut census, model, mode, caller_copies)
            .map_err(|reason| Error::InvalidMove { reason })?;
        let g = &self.arena().geometry;
        let mut destination = vec![false; g.chunks];
        for p in schedule.batches.iter().flatten() {
            let chunks = match p.kind {
                PieceKind::SlabObject { .. } => continue,
                PieceKind::Run { chunks } => chunks,
                PieceKind::Buddy | PieceKind::Slab { .. } => 1,
            };
            let first = g.chunk_of(p.to);
            destination.iter_mut().skip(first).take(chunks).for_each(|d| *d = true);
        }
        planned.retain(|c| destination[c]);
        Ok(StagedCompaction {
            pool: self.id(),
            caller_copies,
            full: matches!(mode, CompactionMode::Full),
            batches: schedule.batches,
            released: schedule.released,
            planned,
            planning: started.elapsed(),
        })
    }

    /// Run a staged compaction while `token` holds the pause: batch by batch, the moves whose
    /// blocks and destinations are still as planned (the others are counted in `stale`).
    /// `mover` as for [`Pool::compact_step`]; it must be given when the compaction was staged
    /// `with_mover` and not otherwise (on a pool with host memory), else
    /// [`Error::InvalidMove`]. On a pool without host memory either is accepted, and without
    /// a mover nothing copies the bytes (see [`Pool::compact_step`]).
    pub fn run_staged(
        &self,
        token: &PauseToken,
        staged: StagedCompaction,
        mut mover: Option<Mover<'_>>,
    ) -> Result<StepReport> {
        let _busy = self.busy(token)?;
        if staged.pool != self.id() {
            return Err(Error::InvalidMove { reason: "the compaction was staged for another pool".into() });
        }
        if staged.caller_copies != (mover.is_some() || self.arena().backing.is_none()) {
            return Err(Error::InvalidMove {
                reason: "a compaction staged with a mover runs with one, and one staged without runs without".into(),
            });
        }
        let mut out = StepReport { planning: staged.planning, ..StepReport::default() };
        let free_before = self.arena().global.free_chunks();
        let mut planned = staged.planned;
        for (k, (batch, released)) in staged.batches.into_iter().zip(staged.released).enumerate() {
            let checking = Instant::now();
            // A full compaction on host memory was planned with the all-free slabs given back.
            if k > 0 || (staged.full && !staged.caller_copies) {
                self.arena().reclaim_all();
                planned.after_releases(self, &released);
            }
            let (kept, dropped) = self.revalidate(batch, &planned);
            out.stale += dropped;
            out.checking += checking.elapsed();
            let n = kept.len();
            out.add(self.execute(kept, (0..n).collect(), Vec::new(), mover.as_deref_mut())?);
        }
        // As `compact_step`: the all-free slabs and the chunks they kept go back last.
        self.arena().reclaim_all();
        out.chunks_freed = self.arena().global.free_chunks().saturating_sub(free_before);
        Ok(out)
    }

    /// Stage a compaction, then pause the pool (waiting at most `timeout`), run it and resume:
    /// the pool is paused only while the moves are checked and made.
    pub fn compact(&self, mode: &CompactionMode, mover: Option<Mover<'_>>, timeout: Duration) -> Result<StepReport> {
        let staged = self.stage_compaction(mode, mover.is_some())?;
        let token = self.pause(timeout)?;
        let done = self.run_staged(&token, staged, mover);
        let resumed = self.resume(&token);
        let done = done?;
        resumed?;
        Ok(done)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::compaction::piece::{Home, PieceKind};
    use crate::config::PoolConfig;
    use crate::handle::id::Handle;

    const MIB: usize = 1 << 20;

    /// The move of `h` to `to`, as a planner would make it.
    fn move_to(p: &Pool, h: Handle, to: usize) -> Piece {
        let b = p.block(h).unwrap();
        let a = p.arena();
        let mut piece =
            Piece::of_block(h, (b.offset, b.size, 0), 0, Home::Buddy, &a.geometry, &a.slabs.classes.classes).unwrap();
        assert!(matches!(piece.kind, PieceKind::Buddy));
        piece.to = to;
        piece
    }

    /// Every core chunk as a staged compaction would keep it now.
    fn planned(p: &Pool) -> Planned {
        Planned::of(&Model::of_census(p, &p.census(false)))
    }

    fn bytes_of(p: &Pool, h: Handle) -> Vec<u8> {
        let mut out = vec![0u8; p.block(h).unwrap().size];
        p.read(h, 0, &mut out).unwrap();
        out
    }

    /// Between the census and the pause, a block of the planned destination's size is allocated
    /// there and another of the same size freed elsewhere in the chunk: the free units are as
    /// they were, but every free advances the chunk's epoch, so the stamp differs and the
    /// destination's tree is read, not the units planning kept: the move is dropped.
    #[test]
    fn an_allocation_and_a_free_that_keep_the_free_units_still_change_the_word() {
        let p = Pool::new(PoolConfig::new(64 * MIB).cores(1)).unwrap();
        let [_x, y, z, w] = [0u8, 1, 2, 3].map(|k| {
            let h = p.alloc(200_000, None, 0).unwrap();
            p.write(h, 0, &vec![k + 1; 200_000]).unwrap();
            h
        });
        let (y_at, to) = (p.block(y).unwrap().offset, p.block(z).unwrap().offset);
        let chunk = p.arena().geometry.chunk_of(to);
        assert_eq!(chunk, p.arena().geometry.chunk_of(p.block(w).unwrap().offset), "one chunk");
        p.free(z).unwrap();
        p.arena().drain_block_caches(); // z's units free in the tree, as planning reads them
        let staged = StagedCompaction {
            pool: p.id(),
            caller_copies: p.arena().backing.is_none(),
            full: false,
            batches: vec![vec![move_to(&p, y, to)]],
            released: vec![Vec::new()],
            planned: planned(&p),
            planning: Duration::ZERO,
        };
        let (word, free) = (p.arena().lines[chunk].space.word(), p.arena().lines[chunk].space.free_units());
        // Allocate until a block lands on the destination, then free as many others (`w` one
        // of them).
        let mut others = vec![w];
        loop {
            let h = p.alloc(200_000, None, 0).unwrap();
            if p.block(h).unwrap().offset == to {
                break;
            }
            others.push(h);
            assert!(others.len() < 200, "the destination is never reused");
        }
        others.into_iter().for_each(|h| p.free(h).unwrap());
        // The frees as the tree sees them (not kept in the caches of freed blocks).
        p.arena().drain_block_caches();
        assert_eq!(p.arena().lines[chunk].space.free_units(), free);
        assert_ne!(p.arena().lines[chunk].space.word(), word);
        let yb = bytes_of(&p, y);
        let token = p.pause(Duration::from_secs(5)).unwrap();
        let done = p.run_staged(&token, staged, None).unwrap();
        p.resume(&token).unwrap();
        assert_eq!((done.stale, done.blocks), (1, 0));
        assert_eq!((p.block(y).unwrap().offset, bytes_of(&p, y)), (y_at, yb));
        p.check().unwrap();
    }

    /// Batch 0 moves `x` away and batch 1 moves `y` into the place `x` leaves. When `x` is
    /// pinned before the pause, its move is dropped and `x` stays: that changes nothing in its
    /// chunk's free-space word (the units planning kept are used), yet batch 1's destination is
    /// taken. The later batch must see it and drop its move too, not fail.
    #[test]
    fn a_later_batch_does_not_move_into_the_place_of_a_dropped_move() {
        let p = Pool::new(PoolConfig::new(64 * MIB).cores(1)).unwrap();
        let [x, y, z, _w] = [0u8, 1, 2, 3].map(|k| {
            let h = p.alloc(200_000, None, 0).unwrap();
            p.write(h, 0, &vec![k + 1; 200_000]).unwrap();
            h
        });
        let (x_at, z_at) = (p.block(x).unwrap().offset, p.block(z).unwrap().offset);
        let chunk = p.arena().geometry.chunk_of(x_at);
        assert_eq!(chunk, p.arena().geometry.chunk_of(z_at), "one chunk");
        p.free(z).unwrap();
        let staged = StagedCompaction {
            pool: p.id(),
            caller_copies: p.arena().backing.is_none(),
            full: false,
            batches: vec![vec![move_to(&p, x, z_at)], vec![move_to(&p, y, x_at)]],
            released: vec![Vec::new(), Vec::new()],
            planned: planned(&p),
            planning: Duration::ZERO,
        };
        // Between the census and the pause: `x` is pinned (the chunk's word stays).
        let word = p.arena().lines[chunk].space.word();
        p.try_pin(x).unwrap();
        assert_eq!(p.arena().lines[chunk].space.word(), word);
        let (xb, yb) = (bytes_of(&p, x), bytes_of(&p, y));
        let token = p.pause(Duration::from_secs(5)).unwrap();
        let done = p.run_staged(&token, staged, None).unwrap();
        p.resume(&token).unwrap();
        assert_eq!((done.stale, done.blocks), (2, 0), "both moves dropped");
        assert_eq!(p.block(x).unwrap().offset, x_at);
        assert_eq!((bytes_of(&p, x), bytes_of(&p, y)), (xb, yb));
        p.unpin(x).unwrap();
        p.check().unwrap();
    }

    /// A census read while the pool ran can hold a block that was freed and another one placed
    /// since where it was: a plan on it can send two moves to overlapping places, each free on
    /// the paused pool. The first runs, the second is dropped as stale; before, the batch
    /// failed when the executor reserved the second destination.
    #[test]
    fn two_moves_into_one_free_place_run_the_first_and_drop_the_second() {
        let p = Pool::new(PoolConfig::new(64 * MIB).cores(1)).unwrap();
        let [x, y, z, _w] = [0u8, 1, 2, 3].map(|k| {
            let h = p.alloc(200_000, None, 0).unwrap();
            p.write(h, 0, &vec![k + 1; 200_000]).unwrap();
            h
        });
        let (x_at, y_at, z_at) = (p.block(x).unwrap().offset, p.block(y).unwrap().offset, p.block(z).unwrap().offset);
        p.free(z).unwrap();
        p.arena().drain_block_caches();
        let staged = StagedCompaction {
            pool: p.id(),
            caller_copies: p.arena().backing.is_none(),
            full: false,
            batches: vec![vec![move_to(&p, x, z_at), move_to(&p, y, z_at)]],
            released: vec![Vec::new()],
            planned: planned(&p),
            planning: Duration::ZERO,
        };
        let (xb, yb) = (bytes_of(&p, x), bytes_of(&p, y));
        let token = p.pause(Duration::from_secs(5)).unwrap();
        let done = p.run_staged(&token, staged, None).unwrap();
        p.resume(&token).unwrap();
        assert_eq!((done.stale, done.blocks), (1, 1));
        assert_eq!((p.block(x).unwrap().offset, bytes_of(&p, x)), (z_at, xb));
        assert_eq!((p.block(y).unwrap().offset, bytes_of(&p, y)), (y_at, yb));
        assert_ne!(x_at, z_at);
        p.check().unwrap();
    }
}

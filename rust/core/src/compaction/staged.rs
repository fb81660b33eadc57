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
use super::planners::plan_compaction_moves;
use super::types::{CompactionMode, Mover, StepReport};
use super::validate::Snapshot;
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
    /// The chunks as they were before the census.
    snapshot: Snapshot,
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
        let snapshot = Snapshot::of(self);
        let mut census: Census = self.census(false);
        let model = Model::of_census(self, &census);
        let schedule = plan_compaction_moves(&mut census, model, mode, caller_copies)
            .map_err(|reason| Error::InvalidMove { reason })?;
        Ok(StagedCompaction {
            pool: self.id(),
            caller_copies,
            full: matches!(mode, CompactionMode::Full),
            batches: schedule.batches,
            snapshot,
            planning: started.elapsed(),
        })
    }

    /// Run a staged compaction while `token` holds the pause: batch by batch, the moves whose
    /// blocks and destinations are still as planned (the others are counted in `stale`).
    /// `mover` as for [`Pool::compact_step`]; it must be given exactly when the compaction was
    /// staged `with_mover` (or the pool has no host memory), else [`Error::InvalidMove`].
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
        for (k, batch) in staged.batches.into_iter().enumerate() {
            let checking = Instant::now();
            if k > 0 {
                self.arena().reclaim_all();
            }
            let (kept, dropped) = self.revalidate(batch, Some(&staged.snapshot));
            out.stale += dropped;
            out.checking += checking.elapsed();
            let n = kept.len();
            out.add(self.execute(kept, (0..n).collect(), Vec::new(), mover.as_deref_mut())?);
        }
        if staged.full {
            out.chunks_freed += self.arena().reclaim_all();
        }
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

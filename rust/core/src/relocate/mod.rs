//! Moving live blocks (compaction): a held pause, validated batches of moves, and the
//! compaction planners that make such batches.
//!
//! * [`Pool::pause`] closes the stop gate and waits for calls in flight (with a timeout); the
//!   [`PauseToken`] it returns keeps the pool paused across as many calls as the caller needs
//!   (plan, move, check), until [`Pool::resume`]. The thread that paused may still allocate and
//!   free meanwhile (it is the only one); while it moves blocks, its own calls are refused.
//! * [`Pool::move_blocks`] moves a batch of blocks to the places the caller names: each source a
//!   live, unpinned block (marked *moving*, so no pin or free slips in), each destination inside
//!   the arena, aligned, bank-safe, where a block of its kind can start (a slab object: a free
//!   object of a slab of its size class; a buddy block: a buddy node in a core chunk, granted
//!   from the global pool if need be; a run: whole free chunks), overlapping no other
//!   destination and no block that stays. Destinations may overlap moving sources (slides).
//!   Everything is taken in the metadata before a byte moves; then the bytes are copied in an
//!   order that never overwrites bytes still to be read (`order.rs`; a cycle is broken through a
//!   bounce buffer on host memory, or through free space of the arena when the caller copies),
//!   or handed to the caller's *mover* (`backing="none"`: the bytes are on a device) before
//!   anything is re-pointed. If the mover fails, every reservation is undone: the pool and every
//!   handle are as before.
//! * [`Pool::compact_step`] plans and runs batches: a full compaction (slab consolidation, then
//!   packing below a boundary: every block above a boundary chunk packed into the holes at or
//!   below it; a repack when that promises much more), an incremental step (chunks above the
//!   boundary evacuated sparsest first, at most `max_bytes` of moves per step), or the
//!   evacuation of chunks the caller names. [`Pool::plan_compaction`] answers what a compaction
//!   would move, moving nothing: both take their moves from the same planners.
//!
//! Pinned blocks (explicit pins, live buffer views) never move.
//!
//! Files: `types.rs` (the public types), `api.rs` (the `Pool` methods that move and plan),
//! `census.rs` (the live blocks), `model.rs` (the arena as the planners see it), `planners/`
//! (pure functions of a census and a model), `piece.rs` (what moves as one), `execute.rs` (one
//! batch), `order.rs` (the copy order), `copy.rs` (host copies), `metadata.rs` (exact-position
//! takes and gives back).

mod api;
mod census;
mod copy;
mod execute;
mod metadata;
mod model;
mod order;
mod piece;
mod planners;
mod types;

use std::time::Duration;

pub use types::{CompactionMode, CompactionPlan, Move, MovedBlocks, Mover, PlannedMove, StepReport, Transfer};

use crate::error::{Error, Result};
use crate::gate::{Entered, PauseError, Refusal};
use crate::handle::Handle;
use crate::pool::Pool;

/// Proof that the caller holds a pool's pause (from [`Pool::pause`]); give it to
/// [`Pool::resume`] to let the pool run again.
#[derive(Debug, PartialEq, Eq)]
pub struct PauseToken {
    pool: u32,
    ticket: u64,
}

impl PauseToken {
    /// The id of the pool it pauses.
    pub fn pool_id(&self) -> u32 {
        self.pool
    }
}

/// The error for a pause that could not be taken.
pub(crate) fn pause_error(e: PauseError) -> Error {
    match e {
        PauseError::Timeout(waited) => Error::Busy { waited_ms: waited.as_millis() as u64 },
        PauseError::Relocating => Error::Relocating,
        PauseError::AlreadyHeld => Error::AlreadyPaused,
    }
}

#[cold]
fn refused(refusal: Refusal) -> Error {
    match refusal {
        Refusal::Relocating => Error::Relocating,
        Refusal::PausedTooLong(waited) => {
            Error::PausedTooLong { waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX) }
        }
    }
}

/// Clears the gate's busy mark when a move call ends.
struct Busy<'a>(&'a Pool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.gate.end_busy();
    }
}

impl Pool {
    /// Enter the pool for an alloc or free (see `gate.rs`).
    #[inline]
    pub(crate) fn enter(&self) -> Result<Entered<'static>> {
        self.gate.enter().map_err(refused)
    }

    /// Pause the pool: wait (at most `timeout`) for alloc and free calls in flight and for any
    /// other pauser, then hold every new call until [`Pool::resume`], each at most `timeout`
    /// (then it fails with [`Error::PausedTooLong`], having done nothing: a pause left open
    /// cannot hang the pool's users). The calling thread may still use the pool meanwhile.
    /// [`Error::Busy`] if the wait ran out (nothing changes).
    pub fn pause(&self, timeout: Duration) -> Result<PauseToken> {
        let ticket = self.gate.pause_held(timeout).map_err(pause_error)?;
        Ok(PauseToken { pool: self.id, ticket })
    }

    /// Let the pool run again. [`Error::NotPaused`] for a token that no longer holds it,
    /// [`Error::Relocating`] while blocks are being moved under it (from inside a mover).
    pub fn resume(&self, token: &PauseToken) -> Result<()> {
        if token.pool != self.id || !self.gate.is_held_by(token.ticket) {
            return Err(Error::NotPaused);
        }
        if self.gate.resume_held(token.ticket) {
            Ok(())
        } else {
            Err(Error::Relocating)
        }
    }

    /// Whether `token` holds this pool's pause now.
    pub fn holds(&self, token: &PauseToken) -> bool {
        token.pool == self.id && self.gate.is_held_by(token.ticket)
    }

    /// Whether the pool is paused (by anyone) now.
    pub fn is_paused(&self) -> bool {
        self.gate.is_closed()
    }

    fn busy(&self, token: &PauseToken) -> Result<Busy<'_>> {
        if token.pool != self.id || !self.gate.is_held_by(token.ticket) {
            return Err(Error::NotPaused);
        }
        if !self.gate.begin_busy(token.ticket) {
            return Err(Error::Relocating);
        }
        Ok(Busy(self))
    }

    /// An allocation that failed was retried and succeeded (after a compaction): it no longer
    /// counts in `failed_allocs` (which counts allocations that raised out-of-memory).
    pub fn forgive_failure(&self) {
        self.counters.on_rescued(crate::cpu::current_core(self.cores.len()));
    }

    /// Add a pin without waiting: [`Error::Moving`] while the block is being moved (callers
    /// holding a lock a mover may need, such as the GIL, wait without it).
    pub fn try_pin(&self, handle: Handle) -> Result<u32> {
        self.handles.try_pin(handle)
    }

    /// Add a pin, waiting while the block is being moved ([`Error::Relocating`] for the moving
    /// thread itself, which would wait forever).
    pub(crate) fn pin_waiting(&self, handle: Handle) -> Result<u32> {
        match self.handles.try_pin(handle) {
            Err(Error::Moving) if self.gate.moving_here() => Err(Error::Relocating),
            Err(Error::Moving) => self.handles.pin(handle),
            other => other,
        }
    }

    /// Pin `handle` for the duration of a read or write through the pool (unpinned on drop).
    pub(crate) fn pin_for_access(&self, handle: Handle) -> Result<Unpin<'_>> {
        if !self.has_backing() {
            return Err(Error::NoBacking);
        }
        self.pin_waiting(handle)?;
        Ok(Unpin(self, handle))
    }
}

/// Removes an access pin on drop.
pub(crate) struct Unpin<'a>(&'a Pool, Handle);

impl Drop for Unpin<'_> {
    fn drop(&mut self) {
        let _ = self.0.handles.unpin(self.1);
    }
}

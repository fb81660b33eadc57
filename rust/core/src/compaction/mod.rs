//! Moving live blocks (compaction): validated batches of moves, and the compaction planners
//! that make such batches. Everything here runs on a paused pool: the caller holds the
//! `PauseToken` of `Pool::pause` (`pool/pause.rs`), which holds every other alloc and free at
//! the stop gate until `Pool::resume`; while blocks move, the pause holder's own calls are
//! refused.
//!
//! * [`Pool::move_blocks`] moves a batch of blocks to the places the caller names: each source a
//!   live, unpinned block (marked *moving*, so no pin or free slips in), each destination inside
//!   the arena, aligned, bank-safe, where a block of its kind can start (a slab object: a free
//!   object of a slab of its size class; a buddy block: a buddy node in a core chunk, granted
//!   from the global pool if need be; a run: whole free chunks), overlapping no other
//!   destination and no block that stays. Destinations may overlap moving sources (slides).
//!   Everything is taken in the metadata before a byte moves; then the bytes are copied in an
//!   order that never overwrites bytes still to be read (`order.rs`; a cycle is broken through a
//!   bounce buffer on host memory, or through free space of the arena when the caller copies),
//!   or handed to the caller's *mover* (`backing="none"`: the bytes are on a device) wave by
//!   wave (`waves.rs`) before anything is re-pointed. If the mover fails, the waves it did are
//!   copied back through it and every reservation is undone: the pool, every handle and every
//!   byte are as before.
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
//! batch), `order.rs` (the copy order), `waves.rs` (the copy order cut into waves for a mover),
//! `copy.rs` (host copies), `staged.rs` (compactions planned while the pool runs) and
//! `validate.rs` (their moves checked on the paused pool). Blocks are taken and given
//! back at exact positions through the arena's exact-position API (`arena/exact.rs`).

mod api;
mod census;
mod copy;
mod execute;
#[cfg(all(test, not(loom)))]
mod fault_tests;
mod headroom;
mod model;
mod order;
mod piece;
mod planners;
mod staged;
mod types;
mod validate;
mod waves;

pub use staged::StagedCompaction;
pub use types::{CompactionMode, CompactionPlan, Move, MovedBlocks, Mover, PlannedMove, StepReport, Transfer};

//! The compaction planners: which blocks move where, as pure functions of a census of the
//! live blocks and a model of the arena (nothing in the pool changes until the executor runs
//! the moves).
//!
//! * `schedule.rs`: the one planning path, a compaction mode to batches of moves.
//! * `consolidate.rs`: slab consolidation.
//! * `pack.rs`: packing below a boundary, and the repack or slide of a full compaction.
//! * `evacuate.rs`: named chunks emptied, or an incremental step within a byte budget.
//! * `movable.rs`: what can move and what room it needs.

mod consolidate;
mod evacuate;
mod movable;
mod pack;
mod schedule;
#[cfg(all(test, not(loom)))]
mod tests;

pub(crate) use schedule::plan_compaction_moves;

//! Handles: the [`Handle`] callers hold (`id.rs`) and the table of slots behind them, with the
//! slot state machine (live, moving, pins) in one place (`table.rs`).

pub(crate) mod id;
pub(crate) mod table;

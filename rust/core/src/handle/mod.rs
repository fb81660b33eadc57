//! Handles: the [`Handle`] callers hold (`id.rs`), the table of slots behind them, with the
//! slot state machine (live, moving, pins) in one place (`table.rs`), and the state of one
//! owner of a handle, such as a Python `Block` (`owner.rs`).

pub(crate) mod id;
pub(crate) mod owner;
pub(crate) mod table;

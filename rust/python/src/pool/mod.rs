//! `npumem.Pool`: the arena, as Python sees it.
//!
//! `state.rs` holds what a pool object keeps (the classes that refer to a pool read it);
//! `methods.rs` is the class's Python API; `config.rs` turns the constructor's keyword
//! arguments into a `PoolConfig`.

mod config;
mod methods;
pub(crate) mod state;

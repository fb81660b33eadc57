//! `npumem.Pool`: the arena, as Python sees it.
//!
//! `state.rs` holds what a pool object keeps (the classes that refer to a pool read it);
//! `methods.rs` is the class's Python API; `config.rs` turns the constructor's keyword
//! arguments into a `PoolConfig`. The services around free: `pending.rs` (frees that wait for
//! a flush: deferred ones, and those of collected blocks the pool could not take at once),
//! `deferred.rs` (`with pool.deferred():` scopes, per thread) and `detached.rs` (blocks given
//! up by `Block.detach()` until `Pool.adopt()`).

mod config;
pub(crate) mod deferred;
pub(crate) mod detached;
mod methods;
pub(crate) mod pending;
pub(crate) mod state;

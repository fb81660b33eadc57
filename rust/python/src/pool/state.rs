//! What a Python pool object holds.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::detached::Detached;
use super::pending::PendingFrees;
use crate::growth::Hooks;
use crate::oom::OomHandler;
use crate::stacks::Stacks;
use crate::tags::Tags;

/// A pool over one arena: allocate blocks from any thread, read `stats()`, `check()` it.
#[pyclass(module = "npumem._core", frozen)]
pub struct Pool {
    /// The Rust pool (shared with pauses and pinning context managers).
    pub(crate) core: Arc<npumem_core::Pool>,
    /// The pool's name (labels its metrics).
    pub(crate) name: Py<PyString>,
    /// The tag strings of its blocks (the named ones; the core's table has all).
    pub(crate) tags: Tags,
    /// Called when an allocation fails for lack of memory.
    pub(crate) oom: OomHandler,
    /// Called when the pool grows or gives a region back.
    pub(crate) hooks: Hooks,
    /// Python call stacks of allocations, while a trace records them.
    pub(crate) stacks: Stacks,
    /// Deferred frees and frees that wait for the pool (shared with this pool's scopes).
    pub(crate) pending: Arc<PendingFrees>,
    /// Blocks detached from their `Block` objects, until adopted.
    pub(crate) detached: Detached,
}

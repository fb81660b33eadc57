//! Small primitives that know nothing of pools: the loom/std atomics shim, bit tricks, the
//! caller's core, zeroed tables that cost memory only where used, a tagged lock-free index
//! stack and a single owner's cache in front of it, segmented storage, a table of published pointers, tables that grow without aborting, a wait for the work that began before a point, and failpoints for fault-injection
//! tests.

pub(crate) mod bits;
pub(crate) mod cpu;
pub(crate) mod failpoint;
pub(crate) mod grace;
pub(crate) mod grow;
pub(crate) mod index_cache;
pub(crate) mod index_stack;
pub(crate) mod published;
pub(crate) mod segments;
pub(crate) mod sync;
pub(crate) mod zeroed;

//! Small primitives that know nothing of pools: the loom/std atomics shim, bit tricks, the
//! caller's core, zeroed tables, a tagged lock-free index stack, segmented storage.

pub(crate) mod bits;
pub(crate) mod cpu;
pub(crate) mod index_stack;
pub(crate) mod segments;
pub(crate) mod sync;
pub(crate) mod zeroed;

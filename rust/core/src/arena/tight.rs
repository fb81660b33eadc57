//! Whether the arena is *tight*: the global pool had no chunk to grant the last time a core
//! asked for one. The flag only steers placement (`pool/alloc.rs`); any value is safe.
//!
//! While chunks are to be had, a block larger than a bank goes to its naturally aligned
//! enclosing node, which costs one search of a tree. Once every chunk is granted, a large
//! block placed that way leaves the rest of its enclosing node to smaller blocks only, and
//! through churn the free space of every chunk breaks into stretches shorter than the large
//! requests: at 85% occupancy with random sizes from 256 B to 1 MiB, no chunk had a free
//! stretch of 600 KiB while 26% of the arena was free. In a tight arena a block of at least
//! 1/32 of a chunk therefore goes to the best-fitting free stretch of a chunk first, next to
//! the blocks around it (`stretches.rs`), which costs one read of the tree per chunk tried;
//! the flag clears again as soon as a grant succeeds. The pool also places large blocks that
//! way once its buddy blocks and runs hold 3/4 of the capacity (`Pool::packs_first`), though
//! chunks are still to be had: by the time the last chunk is granted the stretches are already
//! broken up. Measured on the churn at 85% of 1 GiB, that threshold took the failed allocations
//! from 31 to 0 of 200,000 steps and the fill of 64 KiB-1 MiB blocks from 0.843 to 0.884, and
//! left the churn at 50% as it was; at 3/5 the fill reached 0.914, but the churn at 50% crossed
//! it and slowed by a third.

use crate::util::sync::{AtomicU64, Ordering};

/// The tight flag, alone on its cache line (every large allocation reads it; it changes only
/// when the global pool runs out of chunks or has one again).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Tight(AtomicU64);

impl Tight {
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed) != 0
    }

    /// A grant found no free chunk.
    #[cold]
    pub(crate) fn enter(&self) {
        if !self.is_on() {
            self.0.store(1, Ordering::Relaxed);
        }
    }

    /// A grant succeeded.
    #[inline]
    pub(crate) fn leave(&self) {
        if self.is_on() {
            self.0.store(0, Ordering::Relaxed);
        }
    }
}

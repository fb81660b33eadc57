//! Whether the arena is *tight*: the global pool had no chunk to grant the last time a core
//! asked for one. The flag only steers placement (`pool/alloc.rs`); any value is safe.
//!
//! While chunks are to be had, a block larger than a bank that is a whole power of two goes to
//! its naturally aligned enclosing node, which costs one search of a tree (a trimmed block goes
//! to a free stretch of its core's chunks, first fit: `Pool::place_in_own`; the figures below
//! were measured with trimmed blocks at their enclosing nodes too, and in a tight arena every
//! trimmed block goes to the best-fitting stretch first). Once every chunk is granted, a large
//! block placed that way leaves the rest of its enclosing node to smaller blocks only, and through churn the free
//! space of every chunk breaks into stretches shorter than the large requests: at 85% occupancy
//! with random sizes from 256 B to 1 MiB, no chunk had a free stretch of 600 KiB while 26% of the
//! arena was free. In a tight arena a block of at least 1/64 of a chunk therefore goes to the
//! best-fitting free stretch of a chunk first, next to the blocks around it (`stretches.rs`), which
//! costs one read of the tree per chunk tried; the flag clears again as soon as a grant succeeds.
//! From 1/64 of a chunk, not 1/32: blocks in between, placed at their enclosing nodes, break up the
//! stretches too. Over forty random sequences of that churn, 107 allocations failed from 1/64 and
//! 357 from 1/32 (rlsf, which keeps no bank rule, 343), for about a quarter more time per step at
//! 85%; from 1/128, 67 failed of the first twenty sequences (80 from 1/64), for 60% more time. The
//! pool also places large blocks that way once its buddy blocks and runs hold 2/3 of the capacity
//! (`Pool::packs_first`), though chunks are still to be had: by the time the last chunk is granted
//! the stretches are already broken up, and blocks placed at their enclosing nodes strand the
//! nodes' tails. Measured on 1 GiB (random sizes, medians of runs alternated with the same build at
//! other thresholds): the first failure of a fill of 64 KiB-1 MiB blocks comes at 0.884 of the
//! arena with a threshold of 3/4, 0.899 with 2/3, 0.914 with 3/5 and 0.966 when large blocks always
//! go to a stretch first; the churn at 85% fails no allocation of 200,000 steps at 3/4 or 2/3 (31
//! with the flag alone); the churn at 50% runs at the same speed up to 2/3, a third slower at 3/5
//! (its buddy blocks and runs hold more than 3/5) and six times slower always.

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

//! [`Handle`]: a slot index plus a generation (and the id of its pool), the reference to a
//! block that callers hold. The handle table (`table.rs`) resolves it. Pool ids are handed out
//! here, so that the table can tell a handle of another pool from one that names no pool.

// A counter, in no lock-free protocol: `std`'s atomic, under loom too.
use std::sync::atomic::{AtomicU32, Ordering};

/// The id the next pool gets. Ids start at 1: a zeroed handle names no pool.
static NEXT_POOL_ID: AtomicU32 = AtomicU32::new(1);

/// A new pool's id.
pub(crate) fn new_pool_id() -> u32 {
    NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed)
}

/// Whether a pool of this process got id `id`. A handle made by a pool reaches another thread
/// after the pool was made, so that thread reads the counter past the pool's id.
pub(crate) fn pool_id_issued(id: u32) -> bool {
    id != 0 && id < NEXT_POOL_ID.load(Ordering::Relaxed)
}

/// A reference to a block that survives moves and detects reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    pub(super) pool: u32,
    pub(super) slot: u32,
    pub(super) generation: u32,
}

impl Handle {
    /// The id of the pool that made it.
    pub fn pool_id(self) -> u32 {
        self.pool
    }

    /// The slot index.
    pub fn slot(self) -> u32 {
        self.slot
    }

    /// The generation of the slot when the block was allocated.
    pub fn generation(self) -> u32 {
        self.generation
    }

    /// Pack into one integer (for foreign callers that store handles as numbers).
    pub fn to_bits(self) -> u128 {
        (self.pool as u128) << 64 | (self.slot as u128) << 32 | self.generation as u128
    }

    /// The places of the handle that `handles` holds twice (the pair whose later place comes
    /// first); `None` when every handle appears once. A batch that frees a block must name it
    /// once: [`Error::NamedTwice`](crate::Error::NamedTwice).
    pub fn named_twice(handles: &[Handle]) -> Option<(usize, usize)> {
        let mut named: Vec<(u128, usize)> = handles.iter().enumerate().map(|(i, h)| (h.to_bits(), i)).collect();
        named.sort_unstable();
        named.windows(2).filter(|w| w[0].0 == w[1].0).map(|w| (w[0].1, w[1].1)).min_by_key(|&(_, again)| again)
    }

    /// The inverse of [`Handle::to_bits`]. Any bits make a handle; the pool validates it.
    pub fn from_bits(bits: u128) -> Handle {
        Handle { pool: (bits >> 64) as u32, slot: (bits >> 32) as u32, generation: bits as u32 }
    }
}

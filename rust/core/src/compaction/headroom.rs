//! Host memory for a compaction: [`Pool::compaction_host_bytes`] bounds what a compaction's
//! census, arena model, planners and batch tables hold at once, and the calls that plan a
//! compaction ask the host for that much before they start (and give it back at once), so
//! that a host short of memory gets [`Error::HostMemory`] and a pool left as it was, not an
//! abort halfway through the planning.
//!
//! The bound is linear in what the planning walks. Per item (a live block or a live slab: census
//! items, pieces, moves) and per chunk of the arena (the model's records), a few hundred bytes.
//! Per chunk whose units the model maps (a core chunk, or a free chunk that a move may open:
//! at most one per item), its units' bitmap in each of the model's copies that the planners
//! keep at once: a byte per unit covers eight. The factors are measured ones with room to
//! spare: a test (`tests/compaction_host_memory.rs`) counts the bytes the planning allocates on
//! pools of many shapes and holds them below the bound. The check is a probe, not a
//! reservation: memory that another thread takes between the probe and the planning is not
//! covered.
//!
//! Bounce buffers (host memory copies of blocks that break a cycle of moves) are not in the
//! bound: a batch asks for them by their exact sizes before it changes anything
//! (`execute.rs`).

use crate::arena::global::ChunkState;
use crate::error::{Error, Result};
use crate::pool::pool::Pool;
use crate::util::failpoint;

/// Host bytes per live block and per live slab.
const PER_ITEM: usize = 256;
/// Host bytes per chunk of the arena.
const PER_CHUNK: usize = 256;
/// Host bytes per unit of a chunk whose units the model maps (eight copies of a bitmap).
const PER_MAPPED_UNIT: usize = 1;
/// Host bytes on top, whatever the pool holds.
const BASE: usize = 1 << 20;

impl Pool {
    /// An upper bound of the host memory, in bytes, that a compaction of the pool as it is now
    /// takes to plan and run (not counting bounce buffers for cycles of moves on host memory,
    /// which a batch asks for by their exact sizes). [`Pool::compact_step`],
    /// [`Pool::plan_compaction`] and [`Pool::stage_compaction`] ask the host for this much
    /// first and fail with [`Error::HostMemory`] if it is refused.
    pub fn compaction_host_bytes(&self) -> usize {
        let arena = self.arena();
        let g = &arena.geometry;
        let slabs = &arena.slabs;
        let live_slabs: u64 = (0..slabs.classes.classes.len()).map(|k| slabs.live_slabs(k)).sum();
        let items = usize::try_from(self.live_blocks().saturating_add(live_slabs)).unwrap_or(usize::MAX);
        let (mut core, mut free) = (0usize, 0usize);
        for chunk in 0..g.chunks {
            match arena.global.state(chunk) {
                ChunkState::Core(_) => core += 1,
                ChunkState::Free => free += 1,
                _ => {}
            }
        }
        let mapped = core.saturating_add(free.min(items));
        let per_mapped = usize::try_from(g.units_per_chunk()).unwrap_or(usize::MAX).saturating_mul(PER_MAPPED_UNIT);
        items
            .saturating_mul(PER_ITEM)
            .saturating_add(g.chunks.saturating_mul(PER_CHUNK))
            .saturating_add(mapped.saturating_mul(per_mapped))
            .saturating_add(BASE)
    }

    /// Ask the host for [`Pool::compaction_host_bytes`] and give it back: `Error::HostMemory`
    /// when it is refused (failpoint `host.headroom`).
    pub(crate) fn check_compaction_headroom(&self) -> Result<()> {
        let bytes = self.compaction_host_bytes();
        let mut probe: Vec<u8> = Vec::new();
        if failpoint::fire("host.headroom") || probe.try_reserve_exact(bytes).is_err() {
            return Err(Error::HostMemory { what: "planning a compaction", bytes });
        }
        // An allocation nothing reads may be left out by the optimizer: this one must happen.
        std::hint::black_box(probe.as_ptr());
        Ok(())
    }
}

//! The compaction's public types: a move, a mover, what a batch did, the compaction modes, a
//! compaction plan and what a compaction did.

use std::time::Duration;

pub use super::order::Transfer;
use crate::handle::id::Handle;

/// One move of a batch: the block behind `handle` goes to offset `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The block.
    pub handle: Handle,
    /// Where it goes.
    pub to: usize,
}

/// The caller's copy function for a batch (`backing="none"`: the bytes live on a device): it is
/// called once per wave, in order, with copies that touch disjoint bytes and may run in
/// parallel, before any handle is re-pointed. `Err(why)` (whatever part of the wave was done)
/// undoes the batch: the waves done are copied back through it, then the metadata is undone
/// (`docs/compaction.md`, the mover contract).
pub type Mover<'a> = &'a mut (dyn FnMut(&[Transfer]) -> std::result::Result<(), String> + 'a);

/// A mover borrowed for one batch (its own lifetime may be longer than the borrow).
pub(crate) type BatchMover<'r, 'o> = &'r mut (dyn FnMut(&[Transfer]) -> std::result::Result<(), String> + 'o);

/// What a batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MovedBlocks {
    /// Blocks re-pointed (a moved slab counts its objects).
    pub blocks: usize,
    /// Bytes copied.
    pub bytes: usize,
    /// The copies, in the order they were performed.
    pub transfers: Vec<Transfer>,
    /// Sources saved elsewhere to break cycles: to a host bounce buffer, or, when the caller
    /// copies the bytes (a mover, or a pool without host memory), to free space of the arena
    /// (then `transfers` holds the copy there and the copy back).
    pub bounced: usize,
    /// How many more chunks the global pool holds free after the batch than before it: the
    /// chunks it emptied, less any its runs took.
    pub chunks_freed: usize,
    /// How long the batch took.
    pub elapsed: Duration,
}

/// What a compaction does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompactionMode {
    /// Consolidate slabs, then empty chunks from the end of the arena into the holes below.
    Full,
    /// One step: move at most `max_bytes` bytes of blocks from the chunks at the end of the
    /// arena into the holes below them (and runs down into the room that makes).
    Incremental { max_bytes: usize },
    /// Empty exactly these chunks (by index: offset / chunk size).
    Evacuate { chunks: Vec<usize> },
}

/// One move a compaction plan would make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    /// Where the block (or slab) is.
    pub from: usize,
    /// Where it would go.
    pub to: usize,
    /// Bytes to copy.
    pub bytes: usize,
    /// Blocks it re-points (a slab: its objects).
    pub blocks: usize,
    /// `"block"`, `"slab object"`, `"run"` or `"slab"`.
    pub kind: &'static str,
    /// The block's handle (`None` for a whole slab).
    pub handle: Option<Handle>,
}

/// What a compaction would do (nothing moved).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// Every move, in the order the batches would run them.
    pub moves: Vec<PlannedMove>,
    /// Block moves it would make (a block moved twice counts twice, as in
    /// [`StepReport::blocks`]).
    pub blocks: usize,
    /// Bytes it would copy.
    pub bytes: usize,
    /// How many more chunks the global pool would hold free afterwards (what
    /// [`StepReport::chunks_freed`] reports): the chunks the moves empty, and the empty chunks
    /// the cores hold (a compaction gives those back too), less any its runs take.
    pub chunks_emptied: usize,
    /// The pool's `bytes_free` now.
    pub bytes_free: usize,
    /// The pool's `bytes_free` expected afterwards: more than now when the compaction packs
    /// slab objects and gives the slabs it empties back.
    pub bytes_free_after: usize,
    /// The largest free block now.
    pub largest_free_before: usize,
    /// The largest free block expected afterwards.
    pub largest_free_after: usize,
}

/// What a compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Block moves: a block moved twice counts twice (a slab object that a full compaction
    /// packs into another slab, which then moves whole), as its bytes count twice in `bytes`.
    pub blocks: usize,
    /// Bytes copied.
    pub bytes: usize,
    /// Batches run.
    pub batches: usize,
    /// Copies made (each a `memmove` or one mover transfer).
    pub transfers: usize,
    /// How many more chunks the global pool holds free after the step than before it: the
    /// chunks the moves emptied, and the empty chunks the cores held, less any its runs took.
    pub chunks_freed: usize,
    /// Time spent planning.
    pub planning: Duration,
    /// Time spent moving (metadata, bytes, handles).
    pub moving: Duration,
    /// Moves of a staged compaction dropped because the pool changed since it was planned
    /// (the block was freed, pinned or moved, or its destination taken).
    pub stale: usize,
    /// Time spent checking a staged compaction's moves on the paused pool.
    pub checking: Duration,
}

impl StepReport {
    pub(crate) fn add(&mut self, batch: MovedBlocks) {
        self.blocks += batch.blocks;
        self.bytes += batch.bytes;
        self.batches += 1;
        self.transfers += batch.transfers.len();
        self.moving += batch.elapsed;
    }
}

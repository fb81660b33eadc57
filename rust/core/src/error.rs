//! The one error type of npumem-core. Every variant says what was wrong and what was expected;
//! the Python binding maps each to a typed Python exception in one place.

use std::fmt;

/// Why a handle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleFault {
    /// The handle's block was freed (its generation no longer matches).
    Freed,
    /// The handle was made by another pool.
    Foreign,
    /// The handle names no block this pool handed out: a slot never used, a generation its
    /// slot never had, or a pool id that no pool got.
    Unknown,
}

/// A batch of allocations that did not fit as a whole: the bytes it asked for in all, and the
/// bytes that were free for it (free before it, with the regions it added in a pool that grows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortfall {
    pub asked: usize,
    pub free: usize,
}

/// Everything that can go wrong in npumem-core.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A configuration field broke a rule.
    Config { field: &'static str, reason: String },
    /// A size argument is unusable (zero, or not representable).
    InvalidSize { size: u128, reason: &'static str },
    /// The request is larger than any block the pool can ever hold (`usable`): larger than the
    /// whole arena (`capacity`, its `max_capacity` when it grows), than the part of it that
    /// blocks can use (the arena's end may be shorter than its smallest block), or, in a pool
    /// that grows (`first_region`: the bytes of its first region), than the largest region it
    /// can have. It can never succeed. `bytes_free` and `largest_free_block` are the pool's
    /// figures when it was refused, as in [`Error::OutOfMemory`].
    TooLarge {
        size: usize,
        capacity: usize,
        usable: usize,
        first_region: Option<usize>,
        bytes_free: usize,
        largest_free_block: usize,
    },
    /// An alignment argument is unusable.
    InvalidAlignment { align: u128, reason: String },
    /// No block of the requested size is free now (the request itself is valid).
    /// `largest_free_block` is the largest the failed allocation learnt of without walking
    /// every chunk, partly from the chunks' stretch memos, which bound a chunk's longest free
    /// stretch from above: an estimate, which may be more or less than the figure of
    /// `Pool::stats` (that one reads every tree). `largest_region`, in a pool made of several
    /// regions (one that grew), is the bytes of its largest region: no block spans two regions,
    /// so a request larger than that fails however the free bytes lie, and no compaction
    /// helps, until a region empties and the pool gives it back to grow a larger one.
    /// `unplaced_growth`, when the pool could still have grown by the request (the bytes it may
    /// still add under `max_capacity`) but its offset space held no place for the region: the
    /// regions that live blocks keep split it (`arena/regions.rs`).
    OutOfMemory {
        requested: usize,
        bytes_free: usize,
        largest_free_block: usize,
        largest_region: Option<usize>,
        unplaced_growth: Option<usize>,
    },
    /// A handle was refused.
    InvalidHandle(HandleFault),
    /// The handle's block was already freed.
    DoubleFree,
    /// The block is pinned (explicitly or by live buffer views) and cannot be freed or moved.
    Pinned { pins: u32 },
    /// The block holds as many pins of one kind (explicit pins, or buffer views) as it can:
    /// `most`.
    PinLimit { most: u32 },
    /// An offset/size pair given to the raw API does not name a live block.
    InvalidBlock { offset: usize, size: usize, reason: &'static str },
    /// The pool has no host memory behind it (`backing = none`).
    NoBacking,
    /// The host backing could not be mapped.
    Backing(String),
    /// The host (the machine the pool runs on) has no memory for `bytes` bytes of `what`: a
    /// table of the pool's metadata. Nothing was changed.
    HostMemory { what: &'static str, bytes: usize },
    /// The pool is paused by a compaction and the caller asked not to wait.
    Paused,
    /// The pool could not be paused in time: an in-flight call, or another pause, did not end.
    Busy { waited_ms: u64 },
    /// A call, or a maintenance call's pause (`check`, a snapshot, a trace switch), waited for
    /// another thread's pause longer than that pause's timeout (a pause that was not ended): it
    /// gave up, nothing was done.
    PausedTooLong { waited_ms: u64 },
    /// In a child process: the parent forked while another of its threads was inside a call
    /// of this pool or pausing it. That call never finishes here and the pool's metadata may be
    /// half updated, so every call that needs the pool is refused (nothing was done).
    ForkedMidCall,
    /// In a child process: another thread of the parent held a pause of this pool
    /// (`Pool::pause`) at the fork. That thread does not exist here, so the pause does not end
    /// (unless this process resumes it with its token); a call waited for it `waited_ms`, its
    /// timeout, and gave up, nothing done.
    PausedAtFork { waited_ms: u64 },
    /// A call waited `waited_ms` for another thread's pause, and the calling thread's interrupt
    /// check (`gate::interruptible`: the Python binding's signal handlers) ended the wait: the
    /// call gave up, nothing was done.
    Interrupted { waited_ms: u64 },
    /// A compaction's copies on host memory ran `after_ms` and the calling thread's interrupt
    /// check ended them: the batch was undone, every block is where it was.
    CopiesInterrupted { after_ms: u64 },
    /// `check()` found inconsistent metadata: one line per finding.
    Corruption(Vec<String>),
    /// Item `index` of a batch call failed (and the batch left the pool as it was). A batch of
    /// allocations that failed for lack of memory sets `shortfall` when the batch as a whole
    /// asked for more than was free for it.
    Batch { index: usize, error: Box<Error>, shortfall: Option<Shortfall> },
    /// A batch of frees names one block twice, at items `first` and `again` (and the batch
    /// left the pool as it was): a block is freed once.
    NamedTwice { first: usize, again: usize },
    // ----- compaction ---------------------------------------------------------------------------
    /// The block is being moved by a compaction right now (only the non-waiting calls say so).
    Moving,
    /// A move of a relocation batch is impossible as asked (the batch moved nothing).
    InvalidMove { reason: String },
    /// The moves of a batch overwrite each other's sources in a cycle that no order can
    /// avoid, and the arena has no free space to bounce through (the batch moved nothing).
    MoveCycle { blocks: usize },
    /// The mover (the caller's copy function) failed: the batch was undone.
    MoverFailed(String),
    /// The mover failed (`mover`: why), and so did each of its tries to copy back the blocks
    /// it had moved (`copy_back`: why, the last time). The pool's metadata was undone (every
    /// block is where it was), but blocks of the batch may have lost bytes on the device.
    CopyBackFailed { mover: String, copy_back: String, tries: usize },
    /// The pause token does not hold this pool's pause (resumed already, or of another pool).
    NotPaused,
    /// A call that needs the pool was made by the thread that holds its pause while blocks
    /// are being moved under that pause (from inside the mover, or by a compaction step that
    /// another thread runs with the pause): the call would wait for a move it may be part of.
    Relocating,
    /// The calling thread holds the pool's pause already.
    AlreadyPaused,
    /// A pause asked for from inside one of the pool's own calls on the same thread (a region
    /// hook): it would wait for itself.
    PauseInsideCall,
}

impl Error {
    /// Item `index` of a batch failed with `error`.
    pub fn batch(index: usize, error: Error) -> Error {
        Error::Batch { index, error: Box::new(error), shortfall: None }
    }

    /// The error itself, beneath any batch wrapping.
    pub fn root(&self) -> &Error {
        match self {
            Error::Batch { error, .. } => error.root(),
            other => other,
        }
    }

    /// [`Error::root`], to change.
    fn root_mut(&mut self) -> &mut Error {
        match self {
            Error::Batch { error, .. } => error.root_mut(),
            other => other,
        }
    }

    /// This error, from a last try of a request that could not grow the pool, with what an
    /// earlier try of it that could (`earlier`) learnt: that the limit had room for a region,
    /// and the offset space no place (`OutOfMemory::unplaced_growth`).
    #[must_use]
    pub fn with_unplaced_growth_of(mut self, earlier: &Error) -> Error {
        if let (Error::OutOfMemory { unplaced_growth: mine @ None, .. }, Error::OutOfMemory { unplaced_growth, .. }) =
            (self.root_mut(), earlier.root())
        {
            *mine = *unplaced_growth;
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config { field, reason } => write!(f, "invalid pool configuration: {field} {reason}"),
            Error::InvalidSize { size, reason } => write!(f, "invalid size {size}: {reason}"),
            Error::TooLarge { size, capacity, .. } if size > capacity => {
                write!(f, "request of {size} bytes can never succeed: the pool's capacity is {capacity} bytes")
            }
            Error::TooLarge { size, capacity, usable, first_region: Some(first), .. } => write!(
                f,
                "request of {size} bytes can never succeed: no block of this pool can be larger than {usable} \
                 bytes. A block lies inside one region; the first region ({first} bytes) is never given back, \
                 and regions lie at least one chunk apart, so a region added later holds at most max_capacity \
                 ({capacity} bytes) less the first region, in whole chunks"
            ),
            Error::TooLarge { size, capacity, usable, .. } => write!(
                f,
                "request of {size} bytes can never succeed: of the pool's {capacity} bytes, blocks can use {usable} (the rest is shorter than the smallest block)"
            ),
            Error::InvalidAlignment { align, reason } => write!(f, "invalid alignment {align}: {reason}"),
            Error::OutOfMemory { requested, bytes_free, largest_free_block, largest_region, unplaced_growth } => {
                write!(
                    f,
                    "out of memory: asked for {requested} bytes; {bytes_free} bytes are free, \
                     the largest free block found is {largest_free_block} bytes"
                )?;
                if let Some(left) = unplaced_growth {
                    return write!(
                        f,
                        "; the pool may still grow by {left} bytes, but its offset space has no place \
                         for a region of this size: the regions that hold live blocks split it"
                    );
                }
                match largest_region {
                    Some(region) if requested > region => write!(
                        f,
                        "; no region of the pool is that large (the largest holds {region} bytes, \
                         and no block spans two)"
                    ),
                    _ => Ok(()),
                }
            }
            Error::InvalidHandle(HandleFault::Freed) => write!(f, "the block was freed; its handle is no longer valid"),
            Error::InvalidHandle(HandleFault::Foreign) => write!(f, "the block belongs to another pool"),
            Error::InvalidHandle(HandleFault::Unknown) => write!(f, "the handle does not name a block of this pool"),
            Error::DoubleFree => write!(f, "double free: the block was already freed"),
            Error::Pinned { pins } => write!(
                f,
                "the block is pinned ({pins} pin(s): explicit pins or live buffer views); \
                 release the views or unpin it first"
            ),
            Error::PinLimit { most } => write!(
                f,
                "the block holds {most} pins of this kind (buffer views or explicit pins), the \
                 most it can; release some before taking another"
            ),
            Error::InvalidBlock { offset, size, reason } => {
                write!(f, "no live block of {size} bytes at offset {offset}: {reason}")
            }
            Error::NoBacking => {
                write!(f, "the pool has no host memory behind it (backing=\"none\"): its bytes live on the device")
            }
            Error::Backing(reason) => write!(f, "could not map the host backing: {reason}"),
            Error::HostMemory { what, bytes } if *bytes == usize::MAX => {
                write!(f, "out of host memory: {what} would need more bytes than the address space holds")
            }
            Error::HostMemory { what, bytes } => {
                write!(f, "out of host memory: could not allocate {bytes} bytes for {what}")
            }
            Error::Paused => write!(f, "the pool is paused by a compaction"),
            Error::Busy { waited_ms } => {
                write!(f, "could not pause the pool: in-flight calls or another pause did not end within {waited_ms} ms")
            }
            Error::PausedTooLong { waited_ms } => write!(
                f,
                "the pool stayed paused for {waited_ms} ms, longer than its pauser's timeout (a pause that \
                 was not resumed?); nothing was done"
            ),
            Error::ForkedMidCall => write!(
                f,
                "this process was forked while another thread was inside a call of this pool (or pausing \
                 it): that call never finishes in this child, so the pool cannot be used here; make a new \
                 pool in the child"
            ),
            Error::PausedAtFork { waited_ms } => write!(
                f,
                "this process was forked while another thread held a pause of this pool (pool.pause()); \
                 that thread does not exist in this child, so the pause does not end here: gave up after \
                 {waited_ms} ms (the pause's timeout), nothing was done; make a new pool in the child, or \
                 fork when no other thread holds a pause"
            ),
            Error::Interrupted { waited_ms } => write!(
                f,
                "the wait for another thread's pause of the pool was interrupted after {waited_ms} ms \
                 (a signal handler raised); nothing was done"
            ),
            Error::CopiesInterrupted { after_ms } => write!(
                f,
                "the compaction's copies were interrupted after {after_ms} ms (a signal handler raised); \
                 they were undone, every block is where it was"
            ),
            Error::Batch { index, error, shortfall: None } => write!(f, "item {index} of the batch failed: {error}"),
            Error::Batch { index, error, shortfall: Some(Shortfall { asked, free }) } => write!(
                f,
                "item {index} of the batch failed: {error}; the batch as a whole does not fit: it asks for \
                 {asked} bytes in all, and {free} bytes were free for it"
            ),
            Error::NamedTwice { first, again } => write!(
                f,
                "the batch names one block twice (items {first} and {again}); a block is freed once, \
                 and nothing was freed"
            ),
            Error::Moving => write!(f, "the block is being moved by a compaction; try again"),
            Error::InvalidMove { reason } => write!(f, "invalid move: {reason}; nothing was moved"),
            Error::MoveCycle { blocks } => write!(
                f,
                "the moves of {blocks} block(s) overwrite each other's bytes in a cycle that no order avoids, \
                 and the arena has no free space to bounce one of them through; nothing was moved"
            ),
            Error::MoverFailed(reason) => write!(f, "the mover failed ({reason}); every move of the batch was undone"),
            Error::CopyBackFailed { mover, copy_back, tries } => write!(
                f,
                "the mover failed ({mover}), then failed {tries} times copying back the blocks it had moved \
                 (last: {copy_back}): every block is where it was in the pool's metadata, but blocks of \
                 the batch may have lost bytes on the device"
            ),
            Error::NotPaused => {
                write!(f, "this pause no longer holds the pool (it was resumed, or belongs to another pool)")
            }
            Error::AlreadyPaused => write!(f, "this thread holds the pool's pause already; resume it first"),
            Error::PauseInsideCall => write!(
                f,
                "could not pause the pool: this thread is inside one of the pool's calls (a region hook), which \
                 the pause would wait for; pause after that call returns"
            ),
            Error::Relocating => write!(
                f,
                "this thread holds the pool's pause and blocks are being moved under it (by this thread's \
                 mover, or by a compaction step on another thread): the pool cannot be used until the move \
                 ends"
            ),
            Error::Corruption(findings) => {
                write!(f, "pool metadata is inconsistent ({} finding(s)):", findings.len())?;
                for line in findings.iter().take(20) {
                    write!(f, "\n  - {line}")?;
                }
                if findings.len() > 20 {
                    write!(f, "\n  ... and {} more", findings.len() - 20)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Error {}

/// The result type of npumem-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

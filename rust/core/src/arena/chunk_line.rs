//! What the allocations and frees in a chunk write about the chunk as a whole, on a pair of
//! cache lines of its own: its free-space word (`chunk_space.rs`), its stretch memo
//! (`stretches.rs`) and its ends record (`chunk_ends.rs`).
//!
//! Chunks of different cores sit side by side in the arena's tables, so a record that every
//! free rewrites (the free-space word always, the memo and the ends record whenever the free
//! keeps them valid) must not share a line, nor an adjacent-line prefetch pair, with another
//! chunk's: at eight and sixteen threads, dense tables of memos (four a line) and ends records
//! (eight a line) would make most frees miss on a line another core just wrote. Together, the
//! three records cost a free one line where they cost three, and a search that reads a chunk's
//! free units and its memo reads one line for both.

use super::chunk_ends::ChunkEnds;
use super::chunk_space::ChunkSpace;
use super::stretches::StretchMemo;

/// One chunk's free-space word, stretch memo and ends record (see the module documentation).
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub(crate) struct ChunkLine {
    pub(crate) space: ChunkSpace,
    pub(crate) stretch: StretchMemo,
    pub(crate) ends: ChunkEnds,
}

// SAFETY: atomics only, each of whose all-zero value is valid (a pristine chunk, nothing known).
unsafe impl crate::util::zeroed::Zeroable for ChunkLine {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::ChunkLine;

    #[test]
    fn each_chunk_has_a_pair_of_lines_to_itself() {
        assert_eq!(std::mem::align_of::<ChunkLine>(), 128);
        assert_eq!(std::mem::size_of::<ChunkLine>(), 128);
    }
}

//! What the page table refuses. Every refusal leaves the table exactly as it was.

use std::fmt;

/// The most pages one sequence can hold: page numbers are `u32`.
pub const MAX_SEQUENCE_PAGES: u64 = u32::MAX as u64;

/// A refusal of [`PageTable`](super::table::PageTable); `E` is the page source's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError<E> {
    /// No sequence has this id.
    UnknownSequence(i64),
    /// A sequence with this id exists already.
    SequenceExists(i64),
    /// The same sequence appears twice in one batch (`index` is the second place).
    Repeated { index: usize, seq: i64 },
    /// The sequence would hold `tokens` tokens (exact, beyond `u64` too): more than `max`, the
    /// tokens of the most pages a sequence can have ([`MAX_SEQUENCE_PAGES`]).
    TooManyTokens { seq: i64, tokens: u128, max: u64 },
    /// The page source could not deliver (no page left, or a copy failed).
    Source(E),
    /// The page source said it delivered `asked` pages but gave `delivered` (a fault of the
    /// source; what it gave went back to it, and the table is as it was).
    BrokenSource { asked: usize, delivered: usize },
    /// The page source delivered `page` while a sequence holds it, or twice in one delivery (a
    /// fault of the source; the other pages it gave went back to it, and the table is as it
    /// was).
    PageInUse { page: u32 },
}

impl<E: fmt::Display> fmt::Display for KvError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::UnknownSequence(seq) => write!(f, "no sequence {seq} in the KV cache"),
            KvError::SequenceExists(seq) => write!(f, "sequence {seq} is in the KV cache already"),
            KvError::Repeated { index, seq } => {
                write!(f, "sequence {seq} appears twice in the batch (again at index {index})")
            }
            KvError::TooManyTokens { seq, tokens, max } => write!(
                f,
                "sequence {seq} would hold {tokens} tokens; a sequence holds at most {max} \
                 ({MAX_SEQUENCE_PAGES} pages)"
            ),
            KvError::Source(err) => err.fmt(f),
            KvError::BrokenSource { asked, delivered } => {
                write!(f, "the page source delivered {delivered} page(s) when asked for {asked}")
            }
            KvError::PageInUse { page } => {
                write!(f, "the page source delivered page {page}, which is in use (a fault of the source)")
            }
        }
    }
}

/// A [`FreeList`](super::source::FreeList) has fewer free pages than a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfPages {
    /// Pages the call needed.
    pub needed: usize,
    /// Pages that were free.
    pub free: usize,
}

impl fmt::Display for OutOfPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the KV cache needs {} page(s) and {} are free", self.needed, self.free)
    }
}

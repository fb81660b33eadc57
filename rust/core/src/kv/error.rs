//! What the page table refuses. Every refusal leaves the table exactly as it was.

use std::fmt;

/// A refusal of [`PageTable`](super::table::PageTable); `E` is the page source's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvError<E> {
    /// No sequence has this id.
    UnknownSequence(i64),
    /// A sequence with this id exists already.
    SequenceExists(i64),
    /// The same sequence appears twice in one batch (`index` is the second place).
    Repeated { index: usize, seq: i64 },
    /// The sequence would hold more tokens than the table can count.
    TooManyTokens { seq: i64 },
    /// The page source could not deliver (no page left, or a copy failed).
    Source(E),
}

impl<E: fmt::Display> fmt::Display for KvError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::UnknownSequence(seq) => write!(f, "no sequence {seq} in the KV cache"),
            KvError::SequenceExists(seq) => write!(f, "sequence {seq} is in the KV cache already"),
            KvError::Repeated { index, seq } => {
                write!(f, "sequence {seq} appears twice in the batch (again at index {index})")
            }
            KvError::TooManyTokens { seq } => write!(f, "sequence {seq} would hold more tokens than can be counted"),
            KvError::Source(err) => err.fmt(f),
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
